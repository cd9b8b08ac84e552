package server_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

const (
	consoleViewer = "console-viewer-0123456789"
	consoleScoped = "console-scoped-0123456789"
	consoleTokens = adminToken + " admin ops\n" +
		gatewayToken + " gateway gw-1\n" +
		consoleViewer + " viewer oncall\n" +
		consoleScoped + " viewer team-b subjects=tenant-b/*\n"
)

// consoleCall POSTs a JSON body to a ConsoleService method.
func (h *harness) consoleCall(method, body, token string) response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ConsoleService/"+method, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return h.do(req)
}

func (h *harness) consoleOK(method, body, token string) map[string]any {
	h.t.Helper()
	r := h.consoleCall(method, body, token)
	if r.status != http.StatusOK {
		h.t.Fatalf("%s %s: status %d: %s", method, body, r.status, r.raw)
	}
	return r.body
}

// consoleTraffic: tenant-a/u1 owes 100 tokens, tenant-b/u1 spent 50 and got
// a 429, under one "*" policy (generation 1) refilling 10 tokens an hour.
func consoleTraffic(h *harness) {
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s","maxOverdraft":"1000"}]}}`, adminToken)
	h.ok("Reserve", reserveFor("a1", "tenant-a/u1", 50), adminToken)
	h.ok("Start", `{"reservationId":"a1","operationId":"op"}`, adminToken)
	h.ok("Settle", `{"reservationId":"a1","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	h.ok("Reserve", reserveFor("b1", "tenant-b/u1", 50), adminToken)
	h.ok("Start", `{"reservationId":"b1","operationId":"op"}`, adminToken)
	h.ok("Settle", `{"reservationId":"b1","operationId":"op","actualUnits":{"tokens":50}}`, adminToken)
	h.wantError(h.call("Reserve", reserveFor("b2", "tenant-b/u1", 60), adminToken), http.StatusTooManyRequests, "resource_exhausted", "INSUFFICIENT_CAPACITY")
}

func reserveFor(id, subject string, tokens int) string {
	return `{"reservationId":"` + id + `","subject":"` + subject + `","route":"chat.generate","units":{"tokens":` + strconv.Itoa(tokens) + `}}`
}

func TestConsoleAccountStandingsNearestLimitFirst(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h)
	got := h.consoleOK("ListAccountStandings", `{}`, consoleViewer)
	accounts := got["accounts"].([]any)
	if num(got["matched"]) != 2 || len(accounts) != 2 {
		t.Fatalf("standings: %v", got)
	}
	first, second := accounts[0].(map[string]any), accounts[1].(map[string]any)
	if field(first, "account", "subject") != "tenant-a/u1" || field(first, "account", "frozen") != true {
		t.Fatalf("first standing %v, want tenant-a/u1 frozen", first)
	}
	dim := first["dimensions"].([]any)[0].(map[string]any)
	// Debt 100 at an hourly refill of 10: ten hours after the refill cursor
	// (the harness clock stands still).
	if num(dim["debt"]) != 100 || num(dim["available"]) != 0 || first["usedFraction"].(float64) != 2 {
		t.Errorf("tenant-a's standing %v", first)
	}
	if at, _ := time.Parse(time.RFC3339, dim["repaidAt"].(string)); !at.Equal(h.clock.Now().Add(10 * time.Hour)) {
		t.Errorf("repaid at %v, want %v", dim["repaidAt"], h.clock.Now().Add(10*time.Hour))
	}
	if field(second, "account", "subject") != "tenant-b/u1" || second["usedFraction"].(float64) != 0.5 || second["active"] != true {
		t.Errorf("second standing %v, want tenant-b/u1 half used", second)
	}
	// Search by subject, and limit.
	if got := h.consoleOK("ListAccountStandings", `{"subjectContains":"b/u"}`, consoleViewer); num(got["matched"]) != 1 ||
		field(got["accounts"].([]any)[0].(map[string]any), "account", "subject") != "tenant-b/u1" {
		t.Errorf("search b/u: %v", got)
	}
	if got := h.consoleOK("ListAccountStandings", `{"limit":1}`, consoleViewer); num(got["matched"]) != 2 || len(got["accounts"].([]any)) != 1 {
		t.Errorf("limit 1: %v", got)
	}
	h.wantError(h.consoleCall("ListAccountStandings", `{"limit":1001}`, consoleViewer), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
}

func TestConsoleOverviewCountsDecisionsAndAudits(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h)
	ov := h.consoleOK("GetOverview", `{}`, consoleViewer)
	if ov["ready"] != true || ov["scoped"] == true || ov["audit"] != nil {
		t.Fatalf("overview %v", ov)
	}
	decisions := map[string]int64{}
	for _, d := range ov["decisions"].([]any) {
		d := d.(map[string]any)
		decisions[d["policyGeneration"].(string)+"/"+d["outcome"].(string)] = num(d["count"])
	}
	if decisions["1/admitted"] != 2 || decisions["1/rejected"] != 1 || len(decisions) != 2 {
		t.Errorf("decisions %v, want 2 admitted and 1 rejected under generation 1", decisions)
	}
	rej := ov["rejections"].([]any)
	if len(rej) != 1 || field(rej[0].(map[string]any), "dimension") != "tokens" || num(rej[0].(map[string]any)["count"]) != 1 {
		t.Errorf("rejections %v", rej)
	}
	var reserves int64
	for _, c := range ov["commands"].([]any) {
		if c := c.(map[string]any); c["kind"] == "reserve" {
			reserves += num(c["count"])
		}
	}
	if reserves != 3 {
		t.Errorf("reserve commands %d, want 3: %v", reserves, ov["commands"])
	}
	if num(field(ov, "commit", "batches")) == 0 || field(ov, "commit", "p99Seconds").(float64) <= 0 {
		t.Errorf("commit latency %v", ov["commit"])
	}
	// An audit through the API is what the overview reports.
	h.ok("Audit", `{}`, adminToken)
	ov = h.consoleOK("GetOverview", `{}`, consoleViewer)
	if field(ov, "audit", "lastCleanAuditAt") == nil || field(ov, "audit", "lastAuditAt") != field(ov, "audit", "lastCleanAuditAt") {
		t.Errorf("audit after a clean audit: %v", ov["audit"])
	}
}

func TestConsoleFairnessShares(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h)
	got := h.consoleOK("GetFairness", `{}`, consoleViewer)
	groups := got["groups"].([]any)
	if len(groups) != 1 {
		t.Fatalf("fairness %v", got)
	}
	g := groups[0].(map[string]any)
	if num(g["totalSpent"]) != 250 || g["unit"] != "tokens" {
		t.Fatalf("group %v", g)
	}
	for _, s := range g["subjects"].([]any) {
		s := s.(map[string]any)
		// Equal weights: fair 0.5 each; tenant-a spent 200 of 250.
		want := map[string]float64{"tenant-a/u1": 0.6, "tenant-b/u1": 0.6}[s["subject"].(string)]
		if s["fairShare"].(float64) != 0.5 || abs(s["error"].(float64)-want) > 1e-9 || s["withinBudget"] == true {
			t.Errorf("share %v, want error %v", s, want)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// A scoped token sees only its tenants' accounts and none of the
// process-wide figures; a gateway token may not call the ConsoleService.
func TestConsoleServiceRespectsScopes(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h)
	h.ok("Audit", `{}`, adminToken)
	for _, c := range []struct{ method, body string }{
		{"GetOverview", `{}`}, {"ListAccountStandings", `{}`}, {"ListAccountStandings", `{"subjectContains":"tenant-a"}`},
		{"GetFairness", `{}`},
	} {
		r := h.consoleCall(c.method, c.body, consoleScoped)
		if r.status != http.StatusOK {
			t.Fatalf("%s as the scoped viewer: %d %s", c.method, r.status, r.raw)
		}
		if strings.Contains(string(r.raw), "tenant-a") {
			t.Errorf("%s %s shows tenant-a to a token scoped to tenant-b/*: %s", c.method, c.body, r.raw)
		}
		h.wantError(h.consoleCall(c.method, c.body, gatewayToken), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	}
	ov := h.consoleOK("GetOverview", `{}`, consoleScoped)
	if ov["scoped"] != true || ov["commands"] != nil || ov["decisions"] != nil || ov["audit"] != nil || ov["usageUnknownBacklog"] != nil {
		t.Errorf("the scoped overview shows process-wide figures: %v", ov)
	}
	st := h.consoleOK("ListAccountStandings", `{}`, consoleScoped)
	if num(st["matched"]) != 1 || field(st["accounts"].([]any)[0].(map[string]any), "account", "subject") != "tenant-b/u1" {
		t.Errorf("scoped standings %v", st)
	}
	fair := h.consoleOK("GetFairness", `{}`, consoleScoped)
	g := fair["groups"].([]any)[0].(map[string]any)
	if num(g["totalSpent"]) != 50 || len(g["subjects"].([]any)) != 1 {
		t.Errorf("scoped fairness counts another tenant: %v", g)
	}
}

// The overview's readiness is /readyz's: not ready while commits fail,
// with the reason, and ready again after the next commit worked.
func TestConsoleOverviewReadinessIsReadyz(t *testing.T) {
	h := newHarness(t, harnessOptions{faults: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
	h.wantError(h.call("Reserve", reserveBody("lost", 10), ""), http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	ov := h.consoleOK("GetOverview", `{}`, "")
	if ov["ready"] == true || !strings.Contains(fmt.Sprint(ov["readyError"]), "disk gone") {
		t.Errorf("overview after a failed commit: %v", ov)
	}
	h.faults.FailCommits(nil)
	h.ok("Reserve", reserveBody("lost", 10), "")
	if ov := h.consoleOK("GetOverview", `{}`, ""); ov["ready"] != true || ov["readyError"] != nil {
		t.Errorf("overview after recovery: %v", ov)
	}
}

// ReserveBatch items count as decisions one by one; a refused call (over
// the item limit) decided nothing and is answered as without the console.
func TestConsoleOverviewCountsBatchDecisions(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	consoleTraffic(h) // 2 admitted, 1 rejected
	h.ok("ReserveBatch", `{"requests":[`+reserveFor("c1", "tenant-c/u1", 10)+`,`+reserveFor("c2", "tenant-c/u1", 95)+`,`+reserveFor("c1", "tenant-c/u1", 10)+`]}`, adminToken)
	many := make([]string, server.MaxBatchItems+1)
	for i := range many {
		many[i] = reserveFor(fmt.Sprint("m", i), "tenant-c/u1", 1)
	}
	h.wantError(h.call("ReserveBatch", `{"requests":[`+strings.Join(many, ",")+`]}`, adminToken), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(h.call("Reserve", reserveFor("x", "", 1), adminToken), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	decisions := map[string]int64{}
	for _, d := range h.consoleOK("GetOverview", `{}`, consoleViewer)["decisions"].([]any) {
		d := d.(map[string]any)
		decisions[d["outcome"].(string)] += num(d["count"])
	}
	if decisions["admitted"] != 3 || decisions["rejected"] != 2 || decisions["replayed"] != 1 || len(decisions) != 3 {
		t.Errorf("decisions %v, want 3 admitted, 2 rejected, 1 replayed", decisions)
	}
}

// The overview's decisions are kept for each policy key's active generation
// and its two newest, as the shadow comparisons (OPERATIONS.md, "What grows
// with what"): every publication of the "*" key forgets the decisions of the
// generation now two behind, while tenant-8's own key, older than both kept
// "*" generations, keeps its only one; a generation deciding again after a
// rollback is counted anew. So a month of publications leaves policy keys × 3
// generations, not one per publication.
func TestConsoleOverviewKeepsEachKeysActiveAndNewestGenerations(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	publish := func(subject string, burst int) {
		h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate",
  "dimensions":[{"unit":"tokens","burst":"%d"}],"holdTtl":"30s"}}`, subject, burst), adminToken)
	}
	n := 0
	reserve := func(subject string) {
		n++
		h.ok("Reserve", reserveFor(fmt.Sprint("r", n), subject, 1), gatewayToken)
	}
	want := func(step string, generations ...string) {
		t.Helper()
		var got []string
		for _, d := range h.consoleOK("GetOverview", `{}`, consoleViewer)["decisions"].([]any) {
			got = append(got, d.(map[string]any)["policyGeneration"].(string))
		}
		if !slices.Equal(got, generations) {
			t.Errorf("%s: decisions of generations %v, want %v", step, got, generations)
		}
	}
	publish("*", 1000) // generation 1
	reserve("tenant-7")
	publish("tenant-8", 1000) // generation 2, tenant-8's only
	reserve("tenant-8")
	publish("*", 1001) // generation 3
	reserve("tenant-7")
	want("the second \"*\" generation", "1", "2", "3")
	for burst := 1002; burst < 1012; burst++ { // generations 4 to 13
		publish("*", burst)
		reserve("tenant-7")
	}
	reserve("tenant-8")
	want("ten more \"*\" generations", "2", "12", "13")
	// Generations 12 and 13 rolled back: 11 decides again, and is counted
	// anew, two behind the newest.
	h.rolloutOK("RollbackGenerations", `{"generations":["12","13"]}`, adminToken)
	reserve("tenant-7")
	want("generations 12 and 13 rolled back", "2", "11", "12", "13")
	// Reading the overview forgets too, with no decision since: generation
	// 14 leaves 11 and 12 behind.
	publish("*", 1012)
	want("generation 14 before any decision", "2", "13")
}

// A standing's rollout mode is the one the account's reserves get now: on
// a route a staged rollout holds, the rollout's (docs/CONSOLE.md, Tenants:
// "generation state and rollout mode"), not the policy's own, which
// policyRollout keeps. ListPolicies's rolloutNow of the generation is the
// same mode, so the console's Policies and Tenants pages agree.
func TestConsoleStandingShowsTheRolloutsMode(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"1s"}],"holdTtl":"30s"}}`, adminToken)
	h.ok("Reserve", reserveOn("fill", "chat.generate", 900, ""), gatewayToken)
	mode := func(want string) {
		t.Helper()
		got := h.consoleOK("ListAccountStandings", `{}`, rolloutViewerToken)["accounts"].([]any)
		if len(got) != 1 || got[0].(map[string]any)["rollout"] != want || got[0].(map[string]any)["policyRollout"] != "ROLLOUT_MODE_ENFORCE" {
			t.Errorf("standings %v, want one with rollout %s and policyRollout ROLLOUT_MODE_ENFORCE", got, want)
		}
		policies := h.ok("ListPolicies", `{}`, rolloutViewerToken)["policies"].([]any)
		if len(policies) != 1 || policies[0].(map[string]any)["rolloutNow"] != want {
			t.Errorf("policies %v, want one with rolloutNow %s", policies, want)
		}
	}
	mode("ROLLOUT_MODE_ENFORCE")
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken)
	if r := h.call("Reserve", reserveOn("over", "chat.generate", 500, ""), gatewayToken); r.status != 200 || r.body["shadowRejected"] != true {
		t.Fatalf("the route at 0%% of its rollout: %d %s, want a shadow rejection", r.status, r.raw)
	}
	mode("ROLLOUT_MODE_SHADOW")
	h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":100}`, adminToken)
	mode("ROLLOUT_MODE_ENFORCE")
}

// Weights published before fairnessWeight had its 2^20 bound are stored
// as they were, up to 2^63-1. The fairness page shares them out without
// overflowing: two subjects of weight 2^62 on one route have a fair share
// of 0.5 each (the int64 sum of their weights wrapped negative, and the
// shares read -0.5 with a negative error "within budget").
func TestConsoleFairnessOfWeightsStoredBeforeTheBound(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := context.Background()
	var policies []ledger.Policy
	var heads []ledger.PolicyHead
	for i, subject := range []string{"tenant-a", "tenant-b"} {
		p := ledger.Policy{
			Key: ledger.PolicyKey{Subject: subject, Route: "chat.generate", Region: ledger.DefaultRegion}, Generation: uint64(i + 1),
			Dimensions:     []ledger.Dimension{{Unit: "tokens", Burst: 1000}},
			FairnessWeight: 1 << 62,
			PublishedAt:    h.clock.Now(),
		}.WithDefaults()
		policies = append(policies, p)
		heads = append(heads, ledger.PolicyHead{Key: p.Key, Active: p.Generation, Latest: p.Generation})
	}
	tx, err := h.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Meta: map[string]int64{ledger.MetaGeneration: 2}, Policies: policies, Heads: heads}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"tenant-a", "tenant-b"} {
		id := "r-" + subject
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat.generate","units":{"tokens":100}}`, id, subject), "")
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op"}`, id), "")
		h.ok("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op","actualUnits":{"tokens":100}}`, id), "")
	}
	got := h.consoleOK("GetFairness", `{}`, "")
	groups, _ := got["groups"].([]any)
	if len(groups) != 1 {
		t.Fatalf("fairness %v", got)
	}
	for _, s := range groups[0].(map[string]any)["subjects"].([]any) {
		s := s.(map[string]any)
		if s["weight"] != "4611686018427387904" || s["fairShare"] != 0.5 || s["error"] != nil || s["withinBudget"] != true {
			t.Errorf("share of an equal weight 2^62 serving half: %v", s)
		}
	}
}

// A debt that refill repays only after more than ledger.MaxRetryAfter
// (about 292 years) has no repaidAt: intervals × interval overflowed a
// Duration and showed a date in the past. A debt repaid within it still
// has its date.
func TestRepaidAtOfADebtBeyondTheHorizonIsAbsent(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"3600s"}]}}`, "")
	owe := func(subject string, actual int) {
		h.ok("Reserve", reserveFor(subject+"-1", subject, 1000), "")
		h.ok("Start", `{"reservationId":"`+subject+`-1","operationId":"op"}`, "")
		h.ok("Settle", `{"reservationId":"`+subject+`-1","operationId":"op","actualUnits":{"tokens":`+strconv.Itoa(actual)+`}}`, "")
	}
	owe("far", 10_000_000) // 9,999,000 hours: beyond the horizon
	owe("near", 2_001_000) // 2,000,000 hours, about 228 years: within it
	standings := map[string]map[string]any{}
	for _, a := range h.consoleOK("ListAccountStandings", `{}`, "")["accounts"].([]any) {
		standing := a.(map[string]any)
		standings[field(standing, "account", "subject").(string)] = standing["dimensions"].([]any)[0].(map[string]any)
	}
	if far := standings["far"]; num(far["debt"]) != 9_999_000 || far["repaidAt"] != nil {
		t.Errorf("far debt: %v, want debt 9999000 without repaidAt", far)
	}
	near := standings["near"]
	want := h.clock.Now().Add(2_000_000 * time.Hour)
	if at, err := time.Parse(time.RFC3339, fmt.Sprint(near["repaidAt"])); err != nil || !at.Equal(want) || num(near["debt"]) != 2_000_000 {
		t.Errorf("near debt: %v, want repaidAt %v", near, want)
	}
}

// accountListKeys records the subject keys the engine lists or views
// accounts of (AccountList, AccountsView).
type accountListKeys struct {
	store.Store
	mu   sync.Mutex
	keys []ledger.PolicyKey
}

func (s *accountListKeys) AccountList(ctx context.Context, key ledger.PolicyKey) ([]ledger.Account, error) {
	s.mu.Lock()
	s.keys = append(s.keys, key)
	s.mu.Unlock()
	return s.Store.AccountList(ctx, key)
}

func (s *accountListKeys) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	s.mu.Lock()
	s.keys = append(s.keys, subjects...)
	s.mu.Unlock()
	return s.Store.AccountsView(ctx, subjects)
}

// similarSubjects are the 1110 subjects of t10 .. t1999 that contain
// "t1": t10 .. t19, t100 .. t199, t1000 .. t1999.
func similarSubjects() []string {
	var out []string
	for i := 10; i < 2000; i++ {
		if subject := fmt.Sprintf("t%d", i); strings.HasPrefix(subject, "t1") {
			out = append(out, subject)
		}
	}
	return out
}

// reserveSimilarSubjects reserves 2 tokens for each of similarSubjects,
// 500 to a ReserveBatch.
func reserveSimilarSubjects(h *harness) {
	var items []string
	for _, subject := range similarSubjects() {
		items = append(items, reserveFor("r-"+subject, subject, 2))
		if len(items) == 500 {
			h.ok("ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`, adminToken)
			items = nil
		}
	}
	h.ok("ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`, adminToken)
}

// The console's tenant page asks for one subject's standing. With
// subjectContains and limit 1000, "t1" is not found when more than 1000
// other subjects contain it and stand nearer their limit (similarSubjects);
// the exact subject filter finds it, and only it, and with route and
// region reads that one subject key's accounts, not every account. A
// scoped token asking for a subject outside its scope gets what an
// unknown subject gets.
func TestConsoleStandingsOfOneSubjectExactly(t *testing.T) {
	lists := &accountListKeys{}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		lists.Store = st
		return lists
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	h.ok("Reserve", reserveFor("r-t1", "t1", 1), adminToken)
	reserveSimilarSubjects(h)
	h.ok("Reserve", reserveFor("r-other", "tenant-b/u1", 1), adminToken)

	subjects := func(got map[string]any) []string {
		var out []string
		for _, a := range got["accounts"].([]any) {
			out = append(out, field(a.(map[string]any), "account", "subject").(string))
		}
		return out
	}
	contains := h.consoleOK("ListAccountStandings", `{"subjectContains":"t1","limit":1000}`, consoleViewer)
	if num(contains["matched"]) != 1111 || slices.Contains(subjects(contains), "t1") {
		t.Fatalf("subjectContains t1: matched %v, t1 listed %v; want 1111 matched and t1 beyond the limit (the case the exact filter is for)",
			contains["matched"], slices.Contains(subjects(contains), "t1"))
	}

	lists.mu.Lock()
	lists.keys = nil
	lists.mu.Unlock()
	exact := h.consoleOK("ListAccountStandings", `{"subject":"t1","route":"chat.generate","region":"global","limit":1000}`, consoleViewer)
	if got := subjects(exact); num(exact["matched"]) != 1 || !slices.Equal(got, []string{"t1"}) {
		t.Fatalf("subject t1 on its route and region: matched %v, %v; want t1 alone", exact["matched"], got)
	}
	if acc := exact["accounts"].([]any)[0].(map[string]any); acc["usedFraction"].(float64) != 0.01 {
		t.Errorf("t1's standing %v, want usedFraction 0.01", acc)
	}
	lists.mu.Lock()
	read := slices.Clone(lists.keys)
	lists.mu.Unlock()
	if want := (ledger.PolicyKey{Subject: "t1", Route: "chat.generate", Region: "global"}); !slices.Equal(read, []ledger.PolicyKey{want}) {
		t.Errorf("accounts listed for the exact subject key: %v, want only %v", read, want)
	}

	if got := h.consoleOK("ListAccountStandings", `{"subject":"t1"}`, consoleViewer); num(got["matched"]) != 1 || !slices.Equal(subjects(got), []string{"t1"}) {
		t.Errorf("subject t1 on any route: %v", got)
	}
	if got := h.consoleOK("ListAccountStandings", `{"subject":"t1","subjectContains":"t10"}`, consoleViewer); num(got["matched"]) != 0 {
		t.Errorf("subject t1 and subjectContains t10 (both apply): %v", got)
	}
	unknown := h.consoleOK("ListAccountStandings", `{"subject":"nobody","route":"chat.generate","region":"global"}`, consoleScoped)
	outside := h.consoleOK("ListAccountStandings", `{"subject":"t1","route":"chat.generate","region":"global"}`, consoleScoped)
	if fmt.Sprint(unknown) != fmt.Sprint(outside) {
		t.Errorf("scoped token: a subject outside the scope answers %v, an unknown one %v", outside, unknown)
	}
	if got := h.consoleOK("ListAccountStandings", `{"subject":"tenant-b/u1","route":"chat.generate","region":"global"}`, consoleScoped); !slices.Equal(subjects(got), []string{"tenant-b/u1"}) {
		t.Errorf("scoped token, its own subject: %v", got)
	}
}

// callersDuringOneComputation makes three calls at once while the first
// computation they start is held: it waits until started() counts it,
// lets the other two arrive for settle (they wait for it, or come later
// and reuse it), moves the clock a minute on (an answer's time is its
// computation's start, not its end), lets it go by closing release and
// returns the three answers.
func callersDuringOneComputation(h *harness, started func() int, release chan struct{}, settle time.Duration, call func() map[string]any) []map[string]any {
	answers := make([]map[string]any, 3)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = call()
		}()
	}
	for started() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(settle)
	h.clock.Advance(time.Minute)
	close(release)
	wg.Wait()
	return answers
}

// gatedScans counts the scans of every account (AccountsPage from the
// first account) and holds each first page until release is closed.
type gatedScans struct {
	store.Store
	mu      sync.Mutex
	scans   int
	release chan struct{}
}

func (s *gatedScans) AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, error) {
	if f.After == (ledger.AccountKey{}) {
		s.mu.Lock()
		s.scans++
		release := s.release
		s.mu.Unlock()
		if release != nil {
			<-release
		}
	}
	return s.Store.AccountsPage(ctx, f)
}

func (s *gatedScans) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.scans
}

// Three tabs asking for the Tenants page's ranking while one scan of
// every account runs get that one scan's answer, saying when it was
// read; a scoped token gets a ranking of its own; once the scan's reuse
// is over (nine times as long as it took), a refresh shows what changed
// since, with its own time.
func TestConsoleStandingsShareOneScan(t *testing.T) {
	scans := &gatedScans{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		scans.Store = st
		return scans
	}})
	consoleTraffic(h)
	readAt := h.clock.Now()
	answers := callersDuringOneComputation(h, scans.count, scans.release, 200*time.Millisecond, func() map[string]any {
		return h.consoleOK("ListAccountStandings", `{"limit":20}`, consoleViewer)
	})
	if got := scans.count(); got != 1 {
		t.Fatalf("%d scans for three callers, want one", got)
	}
	for i, a := range answers {
		if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(a["asOf"])); err != nil || !at.Equal(readAt) || num(a["matched"]) != 2 {
			t.Errorf("caller %d: asOf %v, matched %v; want %v, 2", i, a["asOf"], a["matched"], readAt)
		}
	}
	scoped := h.consoleOK("ListAccountStandings", `{"limit":20}`, consoleScoped)
	if num(scoped["matched"]) != 1 || scans.count() != 2 {
		t.Errorf("scoped token: matched %v after %d scans; want its own scan of its one account", scoped["matched"], scans.count())
	}

	h.ok("Reserve", reserveFor("c1", "tenant-c/u1", 90), adminToken)
	changedAt := h.clock.Now()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := h.consoleOK("ListAccountStandings", `{"limit":20}`, consoleViewer)
		if num(got["matched"]) == 3 {
			if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got["asOf"])); err != nil || !at.Equal(changedAt) {
				t.Errorf("refreshed ranking asOf %v, want %v", got["asOf"], changedAt)
			}
			break
		}
		if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(got["asOf"])); err != nil || !at.Equal(readAt) {
			t.Fatalf("before the change shows: asOf %v, want the shared scan's %v", got["asOf"], readAt)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reservation of tenant-c never shows: %v", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A superseded generation emptied by a republish (its capacity moved to
// the new generation: available 0, used fraction 1) admits nothing and is
// near no limit: it ranks after every account whose generation decides,
// in the ranking of every account and in one subject key's.
func TestConsoleStandingsRankSupersededAfterActive(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens})
	policy := func(subject string, burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate",
		  "dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"1","refillInterval":"3600s"}],"holdTtl":"3600s"}}`, subject, burst)
	}
	reserve := func(id, subject string, tokens int) {
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat.generate","units":{"tokens":%d}}`, id, subject, tokens), gatewayToken)
	}
	h.ok("PublishPolicy", policy("tenant-x", 100), adminToken)
	h.ok("PublishPolicy", policy("tenant-y", 100), adminToken)
	reserve("y1", "tenant-y", 50)
	reserve("x1", "tenant-x", 10)
	h.ok("PublishPolicy", policy("tenant-x", 200), adminToken)
	reserve("x2", "tenant-x", 10) // the new generation's account takes the old one's capacity
	for _, body := range []string{`{}`, `{"subject":"tenant-x","route":"chat.generate","region":"global"}`} {
		accounts := h.consoleOK("ListAccountStandings", body, consoleViewer)["accounts"].([]any)
		last := accounts[len(accounts)-1].(map[string]any)
		if field(last, "account", "subject") != "tenant-x" || last["active"] == true || last["usedFraction"].(float64) != 1 {
			t.Fatalf("%s: last standing %v, want tenant-x's superseded generation, emptied (used 1)", body, last)
		}
		for _, a := range accounts[:len(accounts)-1] {
			if a.(map[string]any)["active"] != true {
				t.Errorf("%s: %v ranks before an active account", body, a)
			}
		}
	}
}

// A caller whose deadline passes while it waits for a shared console
// read (here the scan of every account another caller began, held) is
// answered deadline_exceeded (504, STORE_UNAVAILABLE) as every other read
// is (docs/API.md, Errors), not canceled (499, the caller going away);
// the scan goes on and answers the caller that began it.
func TestSharedReadAnswersAPassedDeadlineDeadlineExceeded(t *testing.T) {
	scans := &gatedScans{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		scans.Store = st
		return scans
	}})
	consoleTraffic(h)
	first := make(chan map[string]any, 1)
	go func() { first <- h.consoleOK("ListAccountStandings", `{"limit":20}`, consoleViewer) }()
	for scans.count() == 0 {
		time.Sleep(time.Millisecond)
	}
	req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ConsoleService/ListAccountStandings", strings.NewReader(`{"limit":20}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+consoleViewer)
	// Long enough for the method to begin waiting (a deadline passed
	// before it runs is connect-go's bare 504), short for the held scan.
	req.Header.Set("Connect-Timeout-Ms", "500")
	waited := h.do(req)
	close(scans.release)
	h.wantError(waited, http.StatusGatewayTimeout, "deadline_exceeded", server.ReasonStoreUnavailable)
	if got := <-first; num(got["matched"]) != 2 || scans.count() != 1 {
		t.Errorf("the caller that began the scan: matched %v after %d scans; want 2 after one", got["matched"], scans.count())
	}
}
