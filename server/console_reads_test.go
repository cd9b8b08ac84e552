package server_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// subjectTraffic: tenant-b/u1 has one reservation in each of four states,
// tenant-a/u1 one settled with debt, under consoleTraffic's "*" policy.
func subjectTraffic(h *harness) {
	consoleTraffic(h) // a1 (tenant-a, with debt), b1 (tenant-b, settled)
	h.clock.Advance(time.Second)
	h.ok("Reserve", reserveFor("b3", "tenant-b/u1", 5), adminToken)
	h.clock.Advance(time.Second)
	h.ok("Reserve", reserveFor("b4", "tenant-b/u1", 5), adminToken)
	h.ok("Start", `{"reservationId":"b4","operationId":"op-b4"}`, adminToken)
	h.ok("MarkUsageUnknown", `{"reservationId":"b4"}`, adminToken)
	h.clock.Advance(time.Second)
	h.ok("Reserve", reserveFor("b5", "tenant-b/u1", 5), adminToken)
	h.ok("Release", `{"reservationId":"b5"}`, adminToken)
}

func reservationIDs(t *testing.T, page map[string]any) []string {
	t.Helper()
	var out []string
	list, _ := page["reservations"].([]any)
	for _, r := range list {
		out = append(out, r.(map[string]any)["reservationId"].(string))
	}
	return out
}

func TestConsoleSubjectReservationsByState(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	subjectTraffic(h)
	page := h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1"}`, consoleViewer)
	if got := strings.Join(reservationIDs(t, page), ","); got != "b5,b4,b3,b1" {
		t.Errorf("newest first: %s", got)
	}
	counts := map[string]int64{}
	for _, c := range page["counts"].([]any) {
		c := c.(map[string]any)
		counts[c["route"].(string)+"/"+c["state"].(string)] = num(c["count"])
	}
	want := map[string]int64{
		"chat.generate/RESERVATION_STATE_RESERVED": 1, "chat.generate/RESERVATION_STATE_SETTLED": 1,
		"chat.generate/RESERVATION_STATE_RELEASED": 1, "chat.generate/RESERVATION_STATE_USAGE_UNKNOWN": 1,
	}
	if len(counts) != len(want) {
		t.Errorf("counts %v, want %v", counts, want)
	}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("counts %v, want %v", counts, want)
		}
	}
	if page["retained"] != nil {
		t.Errorf("retained %v without retention", page["retained"])
	}

	// Filtered, and paged two at a time.
	page = h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","states":["RESERVATION_STATE_USAGE_UNKNOWN","RESERVATION_STATE_SETTLED"]}`, consoleViewer)
	if got := strings.Join(reservationIDs(t, page), ","); got != "b4,b1" {
		t.Errorf("USAGE_UNKNOWN and SETTLED: %s", got)
	}
	var pages []string
	token := ""
	for range 5 {
		page = h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":2,"pageToken":"`+token+`"}`, consoleViewer)
		pages = append(pages, strings.Join(reservationIDs(t, page), ","))
		token, _ = page["nextPageToken"].(string)
		if token == "" {
			break
		}
	}
	if got := strings.Join(pages, " | "); got != "b5,b4 | b3,b1" {
		t.Errorf("pages of two: %s", got)
	}

	for _, body := range []string{`{}`, `{"subject":"tenant-b/u1","pageToken":"nope"}`, `{"subject":"tenant-b/u1","pageSize":1001}`,
		`{"subject":"tenant-b/u1","states":["RESERVATION_STATE_RESERVATION_UNKNOWN"]}`} {
		h.wantError(h.consoleCall("ListSubjectReservations", body, consoleViewer), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	}
	// A state no reservation row is ever in (REQUESTED lives only inside
	// a reserve command, RESERVATION_UNKNOWN only at the caller) is a bad
	// request naming the field, not an empty page (API.md).
	for _, state := range []string{"RESERVATION_STATE_REQUESTED", "RESERVATION_STATE_RESERVATION_UNKNOWN"} {
		r := h.consoleCall("ListSubjectReservations", `{"subject":"tenant-b/u1","states":["RESERVATION_STATE_RESERVED","`+state+`"]}`, consoleViewer)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "states") {
			t.Errorf("%s: message %q does not name the field states", state, msg)
		}
	}
	h.wantError(h.consoleCall("ListSubjectReservations", `{"subject":"tenant-b/u1"}`, gatewayToken), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)

	// The token scoped to tenant-b/* sees tenant-b/u1's, and asking for
	// tenant-a/u1 answers exactly as for a subject that never reserved.
	if got := strings.Join(reservationIDs(t, h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1"}`, consoleScoped)), ","); got != "b5,b4,b3,b1" {
		t.Errorf("scoped, own subject: %s", got)
	}
	other := h.consoleCall("ListSubjectReservations", `{"subject":"tenant-a/u1"}`, consoleScoped)
	nobody := h.consoleCall("ListSubjectReservations", `{"subject":"tenant-z/u1"}`, consoleScoped)
	if other.status != http.StatusOK || string(other.raw) != string(nobody.raw) {
		t.Errorf("out of scope %d %s, unknown %d %s", other.status, other.raw, nobody.status, nobody.raw)
	}
	if got := reservationIDs(t, h.consoleOK("ListSubjectReservations", `{"subject":"tenant-a/u1"}`, consoleViewer)); len(got) != 1 {
		t.Errorf("the unscoped viewer sees tenant-a/u1's %v, want a1", got)
	}
}

func TestConsoleStatementsNewestFirst(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","epochLength":"60s",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	// Three epochs with a reserve in each; the reserve of the next epoch
	// closes the one before.
	for i, id := range []string{"s1", "s2", "s3", "s4"} {
		if i > 0 {
			h.clock.Advance(61 * time.Second)
		}
		h.ok("Reserve", reserveFor(id, "tenant-b/u1", 10), adminToken)
	}
	list := func(body, token string) map[string]any {
		t.Helper()
		return h.consoleOK("ListStatements", body, token)
	}
	all := list(`{"subject":"tenant-b/u1","route":"chat.generate","policyGeneration":"1"}`, consoleViewer)
	sts, _ := all["statements"].([]any)
	if len(sts) != 3 {
		t.Fatalf("%d statements after three epochs closed: %v", len(sts), all)
	}
	var prev time.Time
	for i, s := range sts {
		s := s.(map[string]any)
		start, _ := time.Parse(time.RFC3339Nano, s["epochStart"].(string))
		if i > 0 && !start.Before(prev) {
			t.Errorf("statement %d starts %v, not before %v: want the latest first", i, start, prev)
		}
		prev = start
		closing := s["closing"].([]any)[0].(map[string]any)
		// Each epoch held one more 10-token reservation than the last.
		if got, want := num(closing["reserved"]), int64(10*(3-i)); got != want || closing["unit"] != "tokens" {
			t.Errorf("statement %d closing %v: reserved %d, want %d", i, closing, got, want)
		}
	}
	first := list(`{"subject":"tenant-b/u1","route":"chat.generate","policyGeneration":"1","pageSize":2}`, consoleViewer)
	token, _ := first["nextPageToken"].(string)
	second := list(`{"subject":"tenant-b/u1","route":"chat.generate","policyGeneration":"1","pageSize":2,"pageToken":"`+token+`"}`, consoleViewer)
	if len(first["statements"].([]any)) != 2 || token == "" || len(second["statements"].([]any)) != 1 || second["nextPageToken"] != nil {
		t.Errorf("pages of two: %v / %v", first, second)
	}
	if field(second["statements"].([]any)[0].(map[string]any), "epochStart") != field(sts[2].(map[string]any), "epochStart") {
		t.Errorf("the second page is not the oldest statement")
	}
	// The token belongs to its account: another's is refused, not a page
	// of that account's statements before a foreign epoch.
	for _, body := range []string{
		`{"subject":"tenant-a/u1","route":"chat.generate","policyGeneration":"1","pageSize":2,"pageToken":"` + token + `"}`,
		`{"subject":"tenant-b/u1","route":"chat.generate","region":"eu","policyGeneration":"1","pageSize":2,"pageToken":"` + token + `"}`,
		`{"subject":"tenant-b/u1","route":"chat.generate","policyGeneration":"2","pageSize":2,"pageToken":"` + token + `"}`,
	} {
		r := h.consoleCall("ListStatements", body, consoleViewer)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "another account") {
			t.Errorf("%s: message %q does not say the token is another account's", body, msg)
		}
	}
	for _, body := range []string{`{"route":"chat.generate"}`, `{"subject":"tenant-b/u1"}`,
		`{"subject":"tenant-b/u1","route":"chat.generate","pageToken":"x"}`,
		// Generations start at 1: without one the call names no account,
		// and an empty answer would read as "no statements".
		`{"subject":"tenant-b/u1","route":"chat.generate"}`} {
		h.wantError(h.consoleCall("ListStatements", body, consoleViewer), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	}
	// tenant-a/u1's statements, to a token scoped to tenant-b/*: exactly
	// the answer for an account without any.
	h.ok("Reserve", reserveFor("a-late", "tenant-a/u1", 10), adminToken)
	h.clock.Advance(61 * time.Second)
	h.ok("Reserve", reserveFor("a-later", "tenant-a/u1", 10), adminToken)
	body := `{"subject":"tenant-a/u1","route":"chat.generate","policyGeneration":"1"}`
	if n := len(list(body, consoleViewer)["statements"].([]any)); n != 1 {
		t.Fatalf("tenant-a/u1 has %d statements, want 1", n)
	}
	other := h.consoleCall("ListStatements", body, consoleScoped)
	nobody := h.consoleCall("ListStatements", `{"subject":"tenant-z/u1","route":"chat.generate","policyGeneration":"1"}`, consoleScoped)
	if other.status != http.StatusOK || string(other.raw) != string(nobody.raw) {
		t.Errorf("out of scope %d %s, unknown %d %s", other.status, other.raw, nobody.status, nobody.raw)
	}
}

// runningSource answers "running" for every operation.
type runningSource struct{}

func (runningSource) OperationStatus(context.Context, *ledger.Reservation) (engine.OperationStatus, error) {
	return engine.OperationStatus{State: engine.OperationRunning}, nil
}

func TestConsoleResolverAnswers(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, resolver: &engine.ResolverOptions{Source: runningSource{}}})
	consoleTraffic(h)
	for _, id := range []string{"ua", "ub"} {
		subject := "tenant-a/u2" // tenant-a/u1 is frozen by debt
		if id == "ub" {
			subject = "tenant-b/u1"
		}
		h.ok("Reserve", reserveFor(id, subject, 1), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op-`+id+`"}`, adminToken)
		h.ok("MarkUsageUnknown", `{"reservationId":"`+id+`"}`, adminToken)
	}
	asked := h.clock.Now()
	h.engine.RunResolver(context.Background())
	answers := func(body, token string) []map[string]any {
		t.Helper()
		var out []map[string]any
		list, _ := h.consoleOK("GetResolverAnswers", body, token)["answers"].([]any)
		for _, a := range list {
			out = append(out, a.(map[string]any))
		}
		return out
	}
	got := answers(`{"reservationIds":["ub","nope","ua","b1"]}`, consoleViewer)
	if len(got) != 2 || got[0]["reservationId"] != "ub" || got[1]["reservationId"] != "ua" {
		t.Fatalf("answers %v, want ub and ua in that order (b1 is settled, nope unknown)", got)
	}
	for _, a := range got {
		at, _ := time.Parse(time.RFC3339Nano, a["askedAt"].(string))
		next, _ := time.Parse(time.RFC3339Nano, a["nextAttemptAt"].(string))
		if a["answer"] != "running" || num(a["attempts"]) != 1 || !at.Equal(asked) || !next.After(asked) {
			t.Errorf("answer %v, want running, asked once at %v, next later", a, asked)
		}
	}
	// Each answer names the account of its reservation.
	if got[0]["subject"] != "tenant-b/u1" || got[1]["subject"] != "tenant-a/u2" {
		t.Errorf("answers %v, want ub's of tenant-b/u1 and ua's of tenant-a/u2", got)
	}
	for _, a := range got {
		if a["route"] != "chat.generate" || a["region"] != "global" {
			t.Errorf("answer %v, want route chat.generate, region global", a)
		}
	}
	// The token scoped to tenant-b/*: ub's answer only; ua answers as an
	// unknown id does.
	if got := answers(`{"reservationIds":["ua","ub"]}`, consoleScoped); len(got) != 1 || got[0]["reservationId"] != "ub" {
		t.Errorf("scoped answers %v, want ub's only", got)
	}
	other := h.consoleCall("GetResolverAnswers", `{"reservationIds":["ua"]}`, consoleScoped)
	nobody := h.consoleCall("GetResolverAnswers", `{"reservationIds":["nope"]}`, consoleScoped)
	if other.status != http.StatusOK || string(other.raw) != string(nobody.raw) {
		t.Errorf("out of scope %d %s, unknown %d %s", other.status, other.raw, nobody.status, nobody.raw)
	}
	h.wantError(h.consoleCall("GetResolverAnswers", `{"reservationIds":["ua"]}`, gatewayToken), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	// An empty id, an over-long one, or none at all is refused, naming
	// the field: not answered as ids nobody asked about.
	for body, want := range map[string]string{
		`{"reservationIds":["ua",""]}`:                            "reservationIds[1] is required",
		`{"reservationIds":["` + strings.Repeat("x", 257) + `"]}`: "reservationIds[0] is 257 bytes long",
		`{"reservationIds":[]}`:                                   "reservationIds: at least one id",
		`{}`:                                                      "reservationIds: at least one id",
	} {
		r := h.consoleCall("GetResolverAnswers", body, consoleViewer)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, want) {
			t.Errorf("%.40s: message %q, want it to say %q", body, msg, want)
		}
	}
	// Settled by its gateway: its answer is gone.
	h.ok("Settle", `{"reservationId":"ub","operationId":"op-ub","actualUnits":{"tokens":0}}`, adminToken)
	if got := answers(`{"reservationIds":["ub"]}`, consoleViewer); len(got) != 0 {
		t.Errorf("answer of a settled reservation: %v", got)
	}
}

// The audit status comes from the store: who ran it and how, the same on
// another replica over the same store (and so after a restart).
func TestConsoleAuditStatusLastsInTheStore(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h)
	h.ok("Audit", `{}`, adminToken)
	ov := h.consoleOK("GetOverview", `{}`, consoleViewer)
	audit, _ := ov["audit"].(map[string]any)
	if audit == nil || audit["persisted"] != true || audit["lastBy"] != "ops" || audit["lastMode"] != "full" ||
		audit["lastCleanAuditAt"] == nil || audit["lastCleanAuditAt"] != audit["lastAuditAt"] || audit["lastChecks"] != nil {
		t.Fatalf("audit status %v", audit)
	}
	// A second replica (a new server: nothing in memory) over the store.
	tokens, err := server.ParseTokens(strings.NewReader(consoleTokens))
	if err != nil {
		t.Fatal(err)
	}
	replica := &harness{t: t, clock: h.clock, store: h.store, engine: h.engine, http: h.http}
	replica.url = serve(t, server.New(h.engine, server.Config{Tokens: tokens, Clock: h.clock.Now, Console: h.store.(store.ConsoleStore)}))
	again := replica.consoleOK("GetOverview", `{}`, consoleViewer)
	if got, want := field(again, "audit"), ov["audit"]; !sameJSON(got, want) {
		t.Errorf("the other replica shows %v, this one %v", got, want)
	}
}

func sameJSON(a, b any) bool {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if !aok || !bok || len(am) != len(bm) {
		return false
	}
	for k, v := range am {
		if bm[k] != v {
			return false
		}
	}
	return true
}

// A page token of ListSubjectReservations is a time and an id: it belongs
// to the subject and states filter it was issued for, and is refused (400
// INVALID_COMMAND, the message says why) for another, rather than paging
// another subject from a foreign position (API.md).
func TestConsoleSubjectPageTokenBoundToQuery(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	subjectTraffic(h)
	first := h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":1}`, consoleViewer)
	token, _ := first["nextPageToken"].(string)
	if token == "" {
		t.Fatalf("no next page: %v", first)
	}
	if got := strings.Join(reservationIDs(t, h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":1,"pageToken":"`+token+`"}`, consoleViewer)), ","); got != "b4" {
		t.Errorf("its own subject's second page: %s", got)
	}
	for _, body := range []string{
		`{"subject":"tenant-a/u1","pageSize":1,"pageToken":"` + token + `"}`,
		`{"subject":"tenant-b/u1","pageSize":1,"states":["RESERVATION_STATE_RESERVED"],"pageToken":"` + token + `"}`,
	} {
		r := h.consoleCall("ListSubjectReservations", body, consoleViewer)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "another subject or states filter") {
			t.Errorf("%s: message %q does not say the token is another query's", body, msg)
		}
	}

	// The filter is a set: its order and repeats make the same query.
	filtered := h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":1,"states":["RESERVATION_STATE_SETTLED","RESERVATION_STATE_USAGE_UNKNOWN"]}`, consoleViewer)
	token, _ = filtered["nextPageToken"].(string)
	again := h.consoleOK("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":1,"states":["RESERVATION_STATE_USAGE_UNKNOWN","RESERVATION_STATE_SETTLED","RESERVATION_STATE_SETTLED"],"pageToken":"`+token+`"}`, consoleViewer)
	if got := strings.Join(reservationIDs(t, filtered), ",") + " | " + strings.Join(reservationIDs(t, again), ","); got != "b4 | b1" {
		t.Errorf("filtered pages: %s", got)
	}
	r := h.consoleCall("ListSubjectReservations", `{"subject":"tenant-b/u1","pageSize":1,"pageToken":"`+token+`"}`, consoleViewer)
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
}

// A read of one subject's rows names a concrete subject: "*" is 400
// INVALID_COMMAND on ListSubjectReservations and ListStatements as on
// GetAccount (docs/API.md: "subject * where a concrete one is needed").
// The two console reads answered it 200 with no rows, which reads as "this
// subject has none" to an operator who meant every subject.
func TestOneSubjectReadsRefuseTheWildcard(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","epochLength":"60s",
	  "dimensions":[{"unit":"tokens","burst":"100"}]}}`, adminToken)
	h.ok("Reserve", reserveFor("w1", "tenant-b/u1", 10), adminToken)
	for _, r := range []response{
		h.consoleCall("ListSubjectReservations", `{"subject":"*"}`, consoleViewer),
		h.consoleCall("ListStatements", `{"subject":"*","route":"chat.generate","policyGeneration":"1"}`, consoleViewer),
		h.call("GetAccount", `{"subject":"*","route":"chat.generate"}`, consoleViewer),
	} {
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, `subject "*" names every subject`) {
			t.Errorf("message %q does not say why", msg)
		}
	}
	// A concrete subject still reads.
	if res := h.ok("GetAccount", `{"subject":"tenant-b/u1","route":"chat.generate"}`, consoleViewer); len(res["accounts"].([]any)) != 1 {
		t.Fatalf("GetAccount of a concrete subject: %v", res)
	}
}

// A list's subject filter is no pattern: "*" is 400 INVALID_COMMAND on
// ListUsageUnknown and ListShards as on the one-subject reads (both
// matched it literally and answered 200 with no rows, which reads as
// "none" to an operator who meant every subject); no filter lists all.
func TestListSubjectFiltersRefuseTheWildcard(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.startWork("w1")
	h.markUnknown("w1")
	shards := func(body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/ListShards", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	for name, r := range map[string]response{
		"ListUsageUnknown": h.call("ListUsageUnknown", `{"subject":"*"}`, ""),
		"ListShards":       shards(`{"subject":"*"}`),
	} {
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, `subject "*" names every subject; leave subject out`) {
			t.Errorf("%s: message %q does not say why", name, msg)
		}
	}
	if got := ids(t, h.ok("ListUsageUnknown", `{}`, "")); len(got) != 1 || got[0] != "w1" {
		t.Errorf("ListUsageUnknown without a filter: %v", got)
	}
	if r := shards(`{"subject":"tenant-7"}`); r.status != http.StatusOK {
		t.Errorf("ListShards of a concrete subject: %d %s", r.status, r.raw)
	}
}

// swappingConsole hands x to another tenant right after the console store
// read its resolver answers, once armed: x's gateway settles it,
// retention forgets it, and tenant-b reserves, starts and leaves
// USAGE_UNKNOWN a reservation under the same id.
type swappingConsole struct {
	store.ConsoleStore
	ledger  *forgettingStore // its commit applies commands to the store
	mu      sync.Mutex
	armed   bool
	swapped bool
}

func (c *swappingConsole) ResolverAnswersGet(ctx context.Context, ids []string) ([]store.ResolverAnswer, error) {
	answers, err := c.ConsoleStore.ResolverAnswersGet(ctx, ids)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || !c.armed {
		return answers, err
	}
	c.armed = false
	for _, cmds := range [][]ledger.Command{
		{{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{1}}},
		{{Kind: ledger.KindRetire, ReservationID: "x", Before: c.ledger.at, ForgetBefore: c.ledger.at}},
		{{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:tenant-b-x", Subject: "tenant-b/u2",
			Route: "chat.generate", Region: "global", Units: ledger.Amounts{1}},
			{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"},
			{Kind: ledger.KindMarkUsageUnknown, ReservationID: "x"}},
	} {
		if err := c.ledger.commit(ctx, cmds); err != nil {
			return nil, err
		}
	}
	c.swapped = true
	return answers, err
}

// A resolver answer is shown by the scope of its own account. A token
// scoped to tenant-b/* asks about x while x is tenant-a's (the store's
// read finds tenant-a's answer), and x changes hands right after: the
// answer about tenant-a's x is not shown to tenant-b, which gets exactly
// what an unknown id gets, and tenant-b's x, never asked about, has no
// answer for anyone.
func TestConsoleResolverAnswerOfAReusedIDStaysItsTenants(t *testing.T) {
	var swapping *swappingConsole
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, resolver: &engine.ResolverOptions{Source: runningSource{}},
		wrapConsole: func(cs store.ConsoleStore) store.ConsoleStore {
			swapping = &swappingConsole{ConsoleStore: cs}
			return swapping
		}})
	swapping.ledger = &forgettingStore{Store: h.store}
	consoleTraffic(h)
	h.ok("Reserve", reserveFor("x", "tenant-a/u2", 1), adminToken)
	h.ok("Start", `{"reservationId":"x","operationId":"op-x"}`, adminToken)
	h.ok("MarkUsageUnknown", `{"reservationId":"x"}`, adminToken)
	h.engine.RunResolver(context.Background())
	if got, _ := h.consoleOK("GetResolverAnswers", `{"reservationIds":["x"]}`, consoleViewer)["answers"].([]any); len(got) != 1 {
		t.Fatalf("tenant-a's x: answers %v, want its running", got)
	}
	h.clock.Advance(time.Second)
	swapping.ledger.at = h.clock.Now()

	swapping.mu.Lock()
	swapping.armed = true
	swapping.mu.Unlock()
	got := h.consoleCall("GetResolverAnswers", `{"reservationIds":["x"]}`, consoleScoped)
	swapping.mu.Lock()
	swapped := swapping.swapped
	swapping.mu.Unlock()
	if !swapped {
		t.Fatal("x did not change hands after the store's read: the test proves nothing")
	}
	unknown := h.consoleCall("GetResolverAnswers", `{"reservationIds":["nope"]}`, consoleScoped)
	if got.status != http.StatusOK || string(got.raw) != string(unknown.raw) {
		t.Errorf("tenant-b asking about x as it changed hands: %d %s; an unknown id: %d %s", got.status, got.raw, unknown.status, unknown.raw)
	}
	for _, token := range []string{consoleScoped, consoleViewer} {
		if got, _ := h.consoleOK("GetResolverAnswers", `{"reservationIds":["x"]}`, token)["answers"].([]any); len(got) != 0 {
			t.Errorf("tenant-b's x, never asked about: answers %v", got)
		}
	}
}

// ListStatements' page tokens are sealed as every list method's are
// (sealNext, with a tokens file): they were a plain base64 cursor, so a
// client could forge one (another epoch, another account's digest) or
// alter one and be answered a page. A forged, altered or borrowed token is
// 400 INVALID_COMMAND saying the server did not issue it for this method
// and token; the token issued pages on.
func TestStatementPageTokensAreSealed(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","epochLength":"60s",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	for i, id := range []string{"s1", "s2", "s3", "s4"} {
		if i > 0 {
			h.clock.Advance(61 * time.Second)
		}
		h.ok("Reserve", reserveFor(id, "tenant-b/u1", 10), adminToken)
	}
	const account = `"subject":"tenant-b/u1","route":"chat.generate","policyGeneration":"1","pageSize":2`
	first := h.consoleOK("ListStatements", `{`+account+`}`, consoleViewer)
	token, _ := first["nextPageToken"].(string)
	if !strings.HasPrefix(token, "p1.") {
		t.Fatalf("nextPageToken %q is not sealed", token)
	}
	// A cursor as the method wrote it before: "e", an epoch start in Unix
	// nanoseconds, "/", a digest; base64url.
	forged := base64.RawURLEncoding.EncodeToString([]byte("e1/" + strings.Repeat("0", 64)))
	altered := []byte(token) // one base64url character of the sealed body changed
	if altered[len(altered)/2] == 'A' {
		altered[len(altered)/2] = 'B'
	} else {
		altered[len(altered)/2] = 'A'
	}
	for name, c := range map[string]struct{ token, caller string }{
		"forged":               {forged, consoleViewer},
		"altered":              {string(altered), consoleViewer},
		"sealed-looking":       {"p1." + base64.RawURLEncoding.EncodeToString(make([]byte, 40)), consoleViewer},
		"another token's":      {token, consoleScoped},
		"another method's":     {h.policiesToken(t), consoleViewer},
		"truncated":            {token[:len(token)-4], consoleViewer},
		"another token's, too": {token, adminToken},
	} {
		r := h.consoleCall("ListStatements", `{`+account+`,"pageToken":"`+c.token+`"}`, c.caller)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, "pageToken: not a nextPageToken this server issued for this method and token") {
			t.Errorf("%s token: message %q", name, msg)
		}
	}
	second := h.consoleOK("ListStatements", `{`+account+`,"pageToken":"`+token+`"}`, consoleViewer)
	if len(second["statements"].([]any)) != 1 || second["nextPageToken"] != nil {
		t.Errorf("the issued token's page: %v", second)
	}
}

// policiesToken returns a ListPolicies nextPageToken issued to
// consoleViewer (two policies, pages of one).
func (h *harness) policiesToken(t *testing.T) string {
	t.Helper()
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"other.route","dimensions":[{"unit":"tokens","burst":"1"}]}}`, adminToken)
	page := h.ok("ListPolicies", `{"pageSize":1}`, consoleViewer)
	token, _ := page["nextPageToken"].(string)
	if token == "" {
		t.Fatalf("ListPolicies gave no token: %v", page)
	}
	return token
}
