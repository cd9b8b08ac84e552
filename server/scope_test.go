package server_test

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capledger/capledger/server"
)

const (
	gwAToken     = "gw-a-token-0123456789"
	gwBToken     = "gw-b-token-0123456789"
	viewerToken  = "viewer-b-token-0123456789"
	oldGwToken   = "gw-old-token-0123456789"
	scopedTokens = adminToken + " admin ops\n" +
		gwAToken + " gateway gw-a subjects=tenant-a/* routes=chat.*\n" +
		gwBToken + " gateway gw-b subjects=tenant-b/*\n" +
		viewerToken + " viewer dash-b subjects=tenant-b/*\n" +
		oldGwToken + " gateway gw-old\n"
)

// Issue 13: a gateway token for gw-b released tenant-a's hold. Tokens may
// be scoped to subjects and routes; every method checks the subject it
// touches (the stored reservation's for id-only calls), and a refusal is
// answered as not found, identical to an id that does not exist.
func TestTokenScopesIsolateTenants(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens})
	for _, route := range []string{"chat.generate", "embed"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	}
	reserve := func(id, subject, route string) string {
		return `{"reservationId":"` + id + `","subject":"` + subject + `","route":"` + route + `","units":{"tokens":10}}`
	}
	h.ok("Reserve", reserve("a1", "tenant-a/u1", "chat.generate"), gwAToken)
	h.ok("Reserve", reserve("a2", "tenant-a/u1", "chat.generate"), gwAToken)
	h.ok("Start", `{"reservationId":"a2","operationId":"op"}`, gwAToken)
	h.ok("Reserve", reserve("b1", "tenant-b/team/u9", "chat.generate"), gwBToken)

	// gw-b on tenant-a's reservations: the same answer as for an id that
	// does not exist, on every id-only method.
	for _, c := range []struct{ method, body string }{
		{"GetReservation", `{"reservationId":"%s"}`},
		{"Release", `{"reservationId":"%s"}`},
		{"Start", `{"reservationId":"%s","operationId":"op"}`},
		{"Settle", `{"reservationId":"%s","operationId":"op","actualUnits":{"tokens":1}}`},
		{"MarkUsageUnknown", `{"reservationId":"%s"}`},
	} {
		for _, id := range []string{"a1", "a2"} {
			foreign := h.call(c.method, strings.ReplaceAll(c.body, "%s", id), gwBToken)
			h.wantError(foreign, http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
			missing := h.call(c.method, strings.ReplaceAll(c.body, "%s", "zz"), gwBToken)
			if strings.ReplaceAll(string(foreign.raw), id, "zz") != string(missing.raw) {
				t.Errorf("%s: a foreign id answers\n  %s\nbut a missing one\n  %s", c.method, foreign.raw, missing.raw)
			}
		}
	}
	batch := h.ok("SettleBatch", `{"requests":[{"reservationId":"a2","operationId":"op","actualUnits":{"tokens":1}}]}`, gwBToken)
	if field(batch["outcomes"].([]any)[0].(map[string]any), "error", "code") != "not_found" {
		t.Errorf("settle batch of a foreign id: %v", batch)
	}
	// Nothing of tenant-a's changed.
	if got := h.ok("GetReservation", `{"reservationId":"a1"}`, gwAToken); field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("a1 after gw-b's attempts: %v", got)
	}
	if got := h.ok("GetReservation", `{"reservationId":"a2"}`, gwAToken); field(got, "reservation", "state") != "RESERVATION_STATE_STARTED" {
		t.Fatalf("a2 after gw-b's attempts: %v", got)
	}
	// Subject-named calls: reserve as a subject nothing admits for, an
	// account as one that never reserved.
	h.wantError(h.call("Reserve", reserve("b2", "tenant-a/u1", "chat.generate"), gwBToken), http.StatusNotFound, "not_found", server.ReasonNoPolicy)
	h.wantError(h.call("Reserve", reserve("a3", "tenant-a/u1", "embed"), gwAToken), http.StatusNotFound, "not_found", server.ReasonNoPolicy)
	rb := h.ok("ReserveBatch", `{"requests":[`+reserve("b3", "tenant-a/u1", "chat.generate")+`]}`, gwBToken)
	if field(rb["outcomes"].([]any)[0].(map[string]any), "error", "detail", "reason") != server.ReasonNoPolicy {
		t.Errorf("reserve batch for a foreign subject: %v", rb)
	}
	if acct := h.ok("GetAccount", `{"subject":"tenant-a/u1","route":"chat.generate"}`, gwBToken); len(acct) != 0 {
		t.Errorf("gw-b reads tenant-a's account: %v", acct)
	}
	if acct := h.ok("GetAccount", `{"subject":"tenant-a/u1","route":"chat.generate"}`, gwAToken); acct["accounts"] == nil {
		t.Errorf("gw-a cannot read its own account: %v", acct)
	}
	// Reusing tenant-a's id for tenant-b's subject: the id is taken,
	// nothing about its reservation is said.
	r := h.call("Reserve", reserve("a1", "tenant-b/u1", "chat.generate"), gwBToken)
	h.wantError(r, http.StatusConflict, "already_exists", server.ReasonDigestMismatch)
	if strings.Contains(string(r.raw), "tenant-a") {
		t.Errorf("digest mismatch reveals the other tenant's reservation: %s", r.raw)
	}
	// Policies: the wildcard ones are visible (route permitting).
	pols := h.ok("ListPolicies", `{}`, gwAToken)
	if n := len(pols["policies"].([]any)); n != 1 {
		t.Errorf("gw-a (routes=chat.*) sees %d policies, want 1: %v", n, pols)
	}
	h.wantError(h.call("GetPolicy", `{"generation":"2"}`, gwAToken), http.StatusNotFound, "not_found", server.ReasonPolicyNotFound)

	// An unscoped gateway token keeps today's meaning.
	h.ok("GetReservation", `{"reservationId":"a1"}`, oldGwToken)
	h.ok("Release", `{"reservationId":"a1"}`, oldGwToken)

	// The viewer reads within its scope and writes nothing.
	h.ok("GetReservation", `{"reservationId":"b1"}`, viewerToken)
	h.wantError(h.call("GetReservation", `{"reservationId":"a2"}`, viewerToken), http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
	h.ok("GetAccount", `{"subject":"tenant-b/team/u9","route":"chat.generate"}`, viewerToken)
	h.ok("ListPolicies", `{}`, viewerToken)
	h.ok("ListDebts", `{}`, viewerToken)
	h.ok("MarkUsageUnknown", `{"reservationId":"a2"}`, gwAToken)
	backlog := h.ok("ListUsageUnknown", `{}`, viewerToken)
	if backlog["reservations"] != nil || backlog["backlog"] != nil {
		t.Errorf("a tenant-b viewer sees tenant-a's backlog: %v", backlog)
	}
	if all := h.ok("ListUsageUnknown", `{}`, adminToken); len(all["reservations"].([]any)) != 1 {
		t.Errorf("admin backlog: %v", all)
	}
	for _, c := range []struct{ method, body string }{
		{"Reserve", reserve("v1", "tenant-b/u1", "chat.generate")},
		{"Release", `{"reservationId":"b1"}`},
		{"Start", `{"reservationId":"b1","operationId":"op"}`},
		{"PublishPolicy", tokensPolicy},
		{"Audit", `{}`},
	} {
		h.wantError(h.call(c.method, c.body, viewerToken), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	}
	h.wantError(h.call("ListUsageUnknown", `{}`, gwAToken), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
}

// logBuffer collects a server's log lines (written from its handlers'
// goroutines).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// take returns the lines written since the last take.
func (b *logBuffer) take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	b.buf.Reset()
	return s
}

// TestOutOfScopeRefusalsLogged: every call refused for touching another
// tenant's subject, reservation, shard or policy (answered as if it did
// not exist, or as an id taken) gets the answer API.md's table gives and
// is logged at INFO with the token's name, as API.md and OPERATIONS.md
// say; Settle, GetReservation, GetAccount, GetPolicy, a Reserve reusing
// another tenant's id, every ShardService refusal and the console's reads
// were refused silently, and RecordUsage reusing one until the scope
// check was one function (outOfScope). An id nobody used is not a refusal
// and is not logged.
func TestOutOfScopeRefusalsLogged(t *testing.T) {
	logs := &logBuffer{}
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, logs: logs, shards: true})
	for _, route := range []string{"chat.generate", "embed"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`","emergencyMode":true,
		  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	}
	h.ok("Reserve", `{"reservationId":"a1","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":10}}`, gwAToken)
	h.ok("Start", `{"reservationId":"a1","operationId":"op"}`, gwAToken)
	issue := func(shard, subject, gateway string) string {
		return `{"shardId":"` + shard + `","subject":"` + subject + `","route":"chat.generate","units":{"tokens":5},"gatewayId":"` + gateway + `","bootEpoch":"1","ttl":"60s"}`
	}
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard", strings.NewReader(issue("sh-a", "tenant-a/u1", "gw-a")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+gwAToken)
	if r := h.do(req); r.status != http.StatusOK {
		t.Fatalf("issue tenant-a's shard: %d %s", r.status, r.raw)
	}
	logs.take()

	names := map[string]string{gwAToken: "gw-a", gwBToken: "gw-b", viewerToken: "dash-b"}
	record := func(id, subject string) string {
		return `{"reservationId":"` + id + `","operationId":"op","subject":"` + subject + `","route":"chat.generate","actualUnits":{"tokens":1}}`
	}
	// Each refusal's answer (status and reason, as for something that
	// does not exist or an id taken) and its log line.
	for _, c := range []struct {
		service, method, body, token, call string
		status                             int
		reason                             string
	}{
		{"LedgerService", "GetReservation", `{"reservationId":"a1"}`, gwBToken, "get reservation", http.StatusNotFound, server.ReasonReservationNotFound},
		{"LedgerService", "Settle", `{"reservationId":"a1","operationId":"op","actualUnits":{"tokens":1}}`, gwBToken, "settle", http.StatusNotFound, server.ReasonReservationNotFound},
		{"LedgerService", "Start", `{"reservationId":"a1","operationId":"op"}`, gwBToken, "start", http.StatusNotFound, server.ReasonReservationNotFound},
		{"LedgerService", "Release", `{"reservationId":"a1"}`, gwBToken, "release", http.StatusNotFound, server.ReasonReservationNotFound},
		{"LedgerService", "MarkUsageUnknown", `{"reservationId":"a1"}`, gwBToken, "mark usage unknown", http.StatusNotFound, server.ReasonReservationNotFound},
		{"LedgerService", "Reserve", `{"reservationId":"b1","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":1}}`, gwBToken, "reserve", http.StatusNotFound, server.ReasonNoPolicy},
		{"LedgerService", "Reserve", `{"reservationId":"a1","subject":"tenant-b/u1","route":"chat.generate","units":{"tokens":1}}`, gwBToken, "reserve", http.StatusConflict, server.ReasonDigestMismatch},
		{"LedgerService", "RecordUsage", record("b2", "tenant-a/u1"), gwBToken, "record usage", http.StatusNotFound, server.ReasonNoPolicy},
		{"LedgerService", "RecordUsage", record("a1", "tenant-b/u1"), gwBToken, "record usage", http.StatusConflict, server.ReasonDigestMismatch},
		{"LedgerService", "GetAccount", `{"subject":"tenant-a/u1","route":"chat.generate"}`, gwBToken, "get account", http.StatusOK, ""},
		{"LedgerService", "GetPolicy", `{"generation":"2"}`, gwAToken, "get policy", http.StatusNotFound, server.ReasonPolicyNotFound},
		{"ShardService", "GetShard", `{"shardId":"sh-a"}`, gwBToken, "get shard", http.StatusNotFound, server.ReasonShardNotFound},
		{"ShardService", "ReconcileShard", `{"shardId":"sh-a","gatewayId":"gw-b"}`, gwBToken, "reconcile shard", http.StatusNotFound, server.ReasonShardNotFound},
		{"ShardService", "IssueShard", issue("sh-b", "tenant-a/u1", "gw-b"), gwBToken, "issue shard", http.StatusNotFound, server.ReasonNoPolicy},
		{"ShardService", "IssueShard", issue("sh-a", "tenant-b/u1", "gw-b"), gwBToken, "issue shard", http.StatusConflict, server.ReasonShardIDReused},
		{"ConsoleService", "ListSubjectReservations", `{"subject":"tenant-a/u1"}`, viewerToken, "list subject reservations", http.StatusOK, ""},
		{"ConsoleService", "ListStatements", `{"subject":"tenant-a/u1","route":"chat.generate","policyGeneration":"1"}`, viewerToken, "list statements", http.StatusOK, ""},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+c.service+"/"+c.method, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.token)
		r := h.do(req)
		if r.status != c.status || c.reason != "" && detailReason(t, r) != c.reason {
			t.Errorf("%s %s by %s: %d %s, want %d %s", c.method, c.body, names[c.token], r.status, r.raw, c.status, c.reason)
		}
		got, call := logs.take(), c.call
		if strings.Contains(call, " ") {
			call = strconv.Quote(call) // as slog's text handler writes it
		}
		if !strings.Contains(got, `level=INFO msg="out of the token's scope" call=`+call+" ") ||
			!strings.Contains(got, "token="+names[c.token]) {
			t.Errorf("%s %s by %s refused without the log line; logged:\n%s", c.method, c.body, names[c.token], got)
		}
	}
	// Not refusals: an in-scope read, an id nobody used.
	h.ok("GetReservation", `{"reservationId":"a1"}`, gwAToken)
	h.wantError(h.call("GetReservation", `{"reservationId":"nobody"}`, gwBToken), http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
	if got := logs.take(); strings.Contains(got, "out of the token's scope") {
		t.Errorf("logged as a refusal: %s", got)
	}
}

func TestTokenScopeParsingAndMatching(t *testing.T) {
	tokens, err := server.ParseTokens(strings.NewReader(scopedTokens))
	if err != nil {
		t.Fatal(err)
	}
	_ = tokens
	for _, bad := range []string{
		adminToken + " admin ops subjects=tenant-a/*\n",    // admin is never scoped
		gwAToken + " gateway gw-a subject=tenant-a/*\n",    // misspelt
		gwAToken + " gateway gw-a subjects=\n",             // empty
		gwAToken + " gateway gw-a subjects=a subjects=b\n", // twice
		gwAToken + " reader gw-a\n",                        // unknown role
		gwAToken + " gateway gw-a subjects=t-\xe9*\n",      // Latin-1, not UTF-8
		gwAToken + " gateway gw-a routes=chat.\xc3?\n",     // a cut rune
	} {
		if _, err := server.ParseTokens(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	sc := server.Scope{Subjects: []string{"tenant-b/*", "solo"}, Routes: []string{"chat.*"}}
	for _, c := range []struct {
		subject, route string
		want           bool
	}{
		{"tenant-b/u1", "chat.generate", true},
		{"tenant-b/team/u9", "chat.x", true},
		{"tenant-b", "chat.generate", false},
		{"tenant-a/u1", "chat.generate", false},
		{"solo", "chat.generate", true},
		{"solo2", "chat.generate", false},
		{"tenant-b/u1", "embed", false},
	} {
		if got := sc.Covers(c.subject, c.route); got != c.want {
			t.Errorf("%v covers %s %s: %v, want %v", sc, c.subject, c.route, got, c.want)
		}
	}
	if !(server.Scope{}).Covers("anyone", "any.route") {
		t.Error("an empty scope limits")
	}
}

// RFC 7235: the auth scheme is case-insensitive.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/ListPolicies", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", scheme+" "+gatewayToken)
		if r := h.do(req); r.status != http.StatusOK {
			t.Errorf("%s: %d %s", scheme, r.status, r.raw)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/ListPolicies", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Basic "+gatewayToken)
	h.wantError(h.do(req), http.StatusUnauthorized, "unauthenticated", server.ReasonUnauthenticated)
}

// A shard id another tenant's shard holds is answered as a reused id of
// one's own is, word for word (API.md: "as for any reused id"), not with
// a message of its own that tells the two apart.
func TestForeignShardIDAnswersAsAReusedOwnID(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, shards: true})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	issue := func(shard, subject, gateway, token string, units int) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard", strings.NewReader(`{"shardId":"`+shard+
			`","subject":"`+subject+`","route":"chat.generate","units":{"tokens":`+strconv.Itoa(units)+`},"gatewayId":"`+gateway+`","bootEpoch":"1","ttl":"60s"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		return h.do(req)
	}
	for _, c := range []struct{ shard, subject, gateway, token string }{
		{"sh-a", "tenant-a/u1", "gw-a", gwAToken}, {"sh-b", "tenant-b/u1", "gw-b", gwBToken},
	} {
		if r := issue(c.shard, c.subject, c.gateway, c.token, 5); r.status != http.StatusOK {
			t.Fatalf("issue %s: %d %s", c.shard, r.status, r.raw)
		}
	}
	own := issue("sh-b", "tenant-b/u1", "gw-b", gwBToken, 6)
	h.wantError(own, http.StatusConflict, "already_exists", server.ReasonShardIDReused)
	foreign := issue("sh-a", "tenant-b/u1", "gw-b", gwBToken, 6)
	h.wantError(foreign, http.StatusConflict, "already_exists", server.ReasonShardIDReused)
	if got := strings.ReplaceAll(string(foreign.raw), "sh-a", "sh-b"); got != string(own.raw) {
		t.Errorf("tenant-a's shard id answers\n  %s\nbut gw-b's own reused one\n  %s", foreign.raw, own.raw)
	}
}

// A pattern may start with `*` (docs/API.md: `*` matches any run of
// characters anywhere in a pattern): `*.generate` is every route ending
// `.generate`, and `*/team-1/*` needs a backtrack past the first slash.
func TestScopePatternsMayStartWithAStar(t *testing.T) {
	sc := server.Scope{Subjects: []string{"*/team-1/*"}, Routes: []string{"*.generate"}}
	for _, c := range []struct {
		subject, route string
		want           bool
	}{
		{"tenant-b/team-1/u9", "chat.generate", true},
		{"tenant-b/x/team-1/u9", "image.generate", true},
		{"tenant-b/team-2/u9", "chat.generate", false},
		{"tenant-b/team-1/u9", "chat.embed", false},
		{"team-1/u9", "chat.generate", false},
	} {
		if got := sc.Covers(c.subject, c.route); got != c.want {
			t.Errorf("%v covers %s %s: %v, want %v", sc, c.subject, c.route, got, c.want)
		}
	}
}

// `?` in a scope matches one character, as docs/API.md says, not one byte
// of its UTF-8: `t-?/*` covers the tenant `t-é/x` (é is two bytes), and
// `t-??/*`, a scope for two-character tenants, does not reach it. Checked
// through the server, a Reserve per token, as a gateway would meet it.
func TestScopeQuestionMarkMatchesOneCharacter(t *testing.T) {
	const (
		oneToken = "gw-one-char-token-0123456789"
		twoToken = "gw-two-char-token-0123456789"
	)
	h := newHarness(t, harnessOptions{auth: true, tokens: adminToken + " admin ops\n" +
		oneToken + " gateway gw-one subjects=t-?/*\n" +
		twoToken + " gateway gw-two subjects=t-??/*\n"})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"r",
	  "dimensions":[{"unit":"tokens","burst":"1000"}]}}`, adminToken)
	n := 0
	for _, c := range []struct {
		subject, token string
		want           bool
	}{
		{"t-a/x", oneToken, true},
		{"t-é/x", oneToken, true},
		{"t-日/x", oneToken, true},
		{"t-ab/x", oneToken, false},
		{"t-ab/x", twoToken, true},
		{"t-é/x", twoToken, false},
		{"t-日/x", twoToken, false},
		{"t-éa/x", twoToken, true},
	} {
		n++
		r := h.call("Reserve", `{"reservationId":"q`+strconv.Itoa(n)+`","subject":"`+c.subject+`","route":"r","units":{"tokens":1}}`, c.token)
		if got := r.status == http.StatusOK; got != c.want {
			t.Errorf("token %s reserving for %s: %d %s, want in scope %v", c.token[:6], c.subject, r.status, r.raw, c.want)
		}
	}
	sc := server.Scope{Subjects: []string{"*?b"}}
	if !sc.Covers("日b", "r") || !sc.Covers("xéb", "r") || sc.Covers("b", "r") {
		t.Errorf("%v: a star then ? backtracks by characters", sc)
	}
}
