package server_test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

const rolloutViewerToken = "viewer-token-0123456789"

// rolloutScopedViewer is a viewer of one tenant's subjects.
const rolloutScopedViewer = "scoped-viewer-token-0123456789"

func rolloutTokens() string {
	return adminToken + " admin ops\n" + gatewayToken + " gateway gw-1\n" + rolloutViewerToken + " viewer watcher\n" +
		rolloutScopedViewer + " viewer tenant-7-watcher subjects=tenant-7\n"
}

// rollout calls a RolloutService method.
func (h *harness) rollout(method, body, token string) response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.RolloutService/"+method, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return h.do(req)
}

func (h *harness) rolloutOK(method, body, token string) map[string]any {
	h.t.Helper()
	r := h.rollout(method, body, token)
	if r.status != http.StatusOK {
		h.t.Fatalf("%s %s: status %d: %s", method, body, r.status, r.raw)
	}
	return r.body
}

// shadowPolicy is a shadow-mode "*" policy on route with a burst of 1000.
func shadowPolicy(route string) string {
	return fmt.Sprintf(`{"policy":{"subject":"*","route":%q,"rollout":"ROLLOUT_MODE_SHADOW",
  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"1s"}],"holdTtl":"30s"}}`, route)
}

func reserveOn(id, route string, tokens int, legacy string) string {
	return fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-7","route":%q,"units":{"tokens":%d},"legacyDecision":%q}`, id, route, tokens, legacy)
}

// A rollout's step decides which routes enforce, at once on the replica
// that took it; undo puts them back in shadow; every step is recorded
// with the token's name and the time; only the admin role changes a
// rollout, a viewer reads it, a gateway does neither.
func TestRolloutStepDecidesReserves(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	for _, route := range []string{"chat.generate", "embed.create"} {
		h.ok("PublishPolicy", shadowPolicy(route), adminToken)
	}
	created := h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"},{"route":"embed.create"}]}`, adminToken)
	if got := fmt.Sprint(created["rollout"].(map[string]any)["routes"]); strings.Contains(got, "enforce") {
		t.Fatalf("a new rollout enforces: %s", got)
	}
	// Fill both routes' 1000 with one admitted reserve each.
	for _, route := range []string{"chat.generate", "embed.create"} {
		h.ok("Reserve", reserveOn("fill-"+route, route, 900, ""), gatewayToken)
	}
	overflow := func(id, route string) response {
		return h.call("Reserve", reserveOn(id, route, 500, ""), gatewayToken)
	}
	for _, route := range []string{"chat.generate", "embed.create"} {
		if r := overflow("before-"+route, route); r.status != 200 || r.body["shadowRejected"] != true {
			t.Fatalf("%s at 0%%: %d %s", route, r.status, r.raw)
		}
	}

	h.wantError(h.rollout("SetRolloutShare", `{"name":"llm","percent":1}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(h.rollout("SetRolloutShare", `{"name":"llm","percent":1}`, rolloutViewerToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(h.rollout("SetRolloutShare", `{"name":"llm","percent":100.5}`, adminToken), 400, "invalid_argument", server.ReasonInvalidRollout)
	h.wantError(h.rollout("SetRolloutShare", `{"name":"llm","percent":0.001}`, adminToken), 400, "invalid_argument", server.ReasonInvalidRollout)
	h.wantError(h.rollout("SetRolloutShare", `{"name":"nope","percent":1}`, adminToken), 404, "not_found", server.ReasonRolloutNotFound)

	// 1% of two routes is one: embed.create, whose stable-hash bucket
	// (5097) is below chat.generate's (7309).
	step := h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":1}`, adminToken)
	if step["changed"] != true {
		t.Fatalf("step: %v", step)
	}
	if r := overflow("step1-embed", "embed.create"); r.status != http.StatusTooManyRequests {
		t.Fatalf("embed.create enforced at 1%%: %d %s", r.status, r.raw)
	}
	if r := overflow("step1-chat", "chat.generate"); r.status != 200 || r.body["shadowRejected"] != true {
		t.Fatalf("chat.generate still shadow at 1%%: %d %s", r.status, r.raw)
	}
	if again := h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":1}`, adminToken); again["changed"] == true {
		t.Errorf("a repeated step changed the rollout: %v", again)
	}

	h.clock.Advance(time.Minute)
	undone := h.rolloutOK("UndoRolloutStep", `{"name":"llm"}`, adminToken)
	if got := undone["undone"].(map[string]any); got["percent"] != 1.0 || got["who"] != "ops" {
		t.Errorf("undone step %v", got)
	}
	if r := overflow("undone-embed", "embed.create"); r.status != 200 || r.body["shadowRejected"] != true {
		t.Fatalf("embed.create after undo: %d %s", r.status, r.raw)
	}
	nothing := h.rollout("UndoRolloutStep", `{"name":"llm"}`, adminToken)
	h.wantError(nothing, 400, "failed_precondition", server.ReasonNothingToUndo)
	if msg, _ := nothing.body["message"].(string); strings.Count(msg, "llm") != 1 {
		t.Errorf("nothing to undo: message %q names the rollout other than once", msg)
	}

	// The viewer reads the history: create, set 1% at t0 by ops, undo a
	// minute later by ops.
	got := h.rolloutOK("GetRollout", `{"name":"llm"}`, rolloutViewerToken)["rollout"].(map[string]any)
	steps := got["steps"].([]any)
	if len(steps) != 3 {
		t.Fatalf("steps %v", steps)
	}
	set, undo := steps[1].(map[string]any), steps[2].(map[string]any)
	if set["action"] != "set" || set["who"] != "ops" || set["at"] != "2026-07-19T14:00:00Z" || set["undoneBy"] != 3.0 {
		t.Errorf("set step recorded as %v", set)
	}
	if undo["action"] != "undo" || undo["at"] != "2026-07-19T14:01:00Z" || undo["undoes"] != 2.0 || undo["priorPercent"] != 1.0 {
		t.Errorf("undo step recorded as %v", undo)
	}
	h.wantError(h.rollout("GetRollout", `{"name":"llm"}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(h.rollout("CreateRollout", `{"name":"other","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken),
		400, "failed_precondition", server.ReasonRouteInRollout)
	h.wantError(h.rollout("CreateRollout", `{"name":"x","hashBy":"tenant","routes":[{"route":"r"}]}`, adminToken),
		400, "invalid_argument", server.ReasonInvalidRollout)
}

// The legacy limiter's decisions are compared with capledger's, per
// route, generation and mode, in both directions; a replay counts
// nothing; a decision other than allow or deny is refused; the counts
// are in /metrics too.
func TestShadowComparison(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), adminToken)
	const gen = "1"                                                               // the store's first generation
	h.ok("Reserve", reserveOn("a1", "chat.generate", 600, "allow"), gatewayToken) // both allow
	h.ok("Reserve", reserveOn("a1", "chat.generate", 600, "allow"), gatewayToken) // replay: not counted
	h.ok("Reserve", reserveOn("a2", "chat.generate", 600, "allow"), gatewayToken) // legacy allow, capledger deny (shadow)
	h.ok("Reserve", reserveOn("a3", "chat.generate", 600, "deny"), gatewayToken)  // both deny
	h.ok("Reserve", reserveOn("a4", "chat.generate", 100, "deny"), gatewayToken)  // legacy deny, capledger allow
	h.ok("Reserve", reserveOn("a5", "chat.generate", 100, ""), gatewayToken)      // not reported
	h.wantError(h.call("Reserve", reserveOn("a6", "chat.generate", 1, "maybe"), gatewayToken), 400, "invalid_argument", server.ReasonInvalidCommand)
	batch := `{"requests":[` + reserveOn("b1", "chat.generate", 50, "deny") + `,` + reserveOn("b2", "chat.generate", 900, "deny") + `]}`
	h.ok("ReserveBatch", batch, gatewayToken) // legacy deny / capledger allow, both deny

	h.wantError(h.rollout("ShadowReport", `{}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	report := h.rolloutOK("ShadowReport", `{}`, rolloutViewerToken)
	rows := report["comparisons"].([]any)
	if len(rows) != 1 {
		t.Fatalf("report %v", report)
	}
	row := rows[0].(map[string]any)
	want := map[string]any{"route": "chat.generate", "region": "global", "generation": gen, "mode": "shadow",
		"bothAllowed": "1", "bothDenied": "2", "legacyAllowedCapledgerDenied": "1", "legacyDeniedCapledgerAllowed": "2"}
	for k, v := range want {
		if row[k] != v {
			t.Errorf("%s = %v, want %v (row %v)", k, row[k], v, row)
		}
	}
	if rate := row["disagreementRate"].(float64); rate != 0.5 {
		t.Errorf("disagreement rate %v, want 0.5", rate)
	}
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	line := fmt.Sprintf(`capledger_shadow_decisions_total{capledger="allow",generation="%s",legacy="deny",mode="shadow",region="global",route="chat.generate"} 2`, gen)
	if !strings.Contains(string(body), line) {
		t.Errorf("metrics lack %s", line)
	}
}

// The comparisons of a generation are kept while it is the active one or
// one of the two newest of its policy key (OPERATIONS.md, "What grows with
// what"): a third generation of the "*" key forgets the first's cells and
// series, while tenant-8's own key on the same route, older than both kept
// "*" generations, keeps its only one; a generation that decides again
// after two rollbacks is counted.
func TestShadowComparisonsKeepEachKeysActiveAndNewestGenerations(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	tenant8 := `{"reservationId":%q,"subject":"tenant-8","route":"chat.generate","units":{"tokens":1},"legacyDecision":"deny"}`
	publish := func(subject string, burst int) {
		h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate","rollout":"ROLLOUT_MODE_SHADOW",
  "dimensions":[{"unit":"tokens","burst":"%d"}],"holdTtl":"30s"}}`, subject, burst), adminToken)
	}
	// kept returns the generations of the /metrics series and of the
	// report's rows, read in that order (the report forgets too) unless
	// reportFirst.
	kept := func(reportFirst bool) (report, series []string) {
		readReport := func() {
			for _, row := range h.rolloutOK("ShadowReport", `{}`, rolloutViewerToken)["comparisons"].([]any) {
				report = append(report, row.(map[string]any)["generation"].(string))
			}
		}
		if reportFirst {
			readReport()
		}
		resp, err := http.Get(h.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, "capledger_shadow_decisions_total{"); ok {
				_, gen, _ := strings.Cut(rest, `generation="`)
				gen, _, _ = strings.Cut(gen, `"`)
				if !slices.Contains(series, gen) {
					series = append(series, gen)
				}
			}
		}
		slices.Sort(series)
		if !reportFirst {
			readReport()
		}
		return report, series
	}
	want := func(step string, reportFirst bool, generations ...string) {
		t.Helper()
		report, series := kept(reportFirst)
		if !slices.Equal(report, generations) || !slices.Equal(series, generations) {
			t.Errorf("%s: the report shows generations %v, /metrics %v; want %v", step, report, series, generations)
		}
	}
	publish("*", 1000) // generation 1
	h.ok("Reserve", reserveOn("a1", "chat.generate", 1, "allow"), gatewayToken)
	publish("tenant-8", 1000) // generation 2, tenant-8's only
	h.ok("Reserve", fmt.Sprintf(tenant8, "t1"), gatewayToken)
	publish("*", 1001) // generation 3
	h.ok("Reserve", reserveOn("a2", "chat.generate", 1, "allow"), gatewayToken)
	want("the second \"*\" generation", false, "1", "2", "3")
	publish("*", 1002) // generation 4: "*"'s first is two behind
	h.ok("Reserve", reserveOn("a3", "chat.generate", 1, "deny"), gatewayToken)
	h.ok("Reserve", fmt.Sprintf(tenant8, "t2"), gatewayToken)
	want("the third \"*\" generation's first comparison", false, "2", "3", "4")
	report := h.rolloutOK("ShadowReport", `{}`, rolloutViewerToken)["comparisons"].([]any)
	if row := report[0].(map[string]any); row["generation"] != "2" || row["legacyDeniedCapledgerAllowed"] != "2" {
		t.Errorf("tenant-8's comparisons %v, want its two reserves counted on generation 2", row)
	}
	publish("*", 1003) // generation 5, no comparison yet: the report forgets 3
	want("the fourth \"*\" generation, before any comparison", true, "2", "4")
	// Generations 4 and 5 rolled back: 3 decides again, and is counted
	// anew, two behind the newest.
	h.rolloutOK("RollbackGenerations", `{"generations":["4","5"]}`, adminToken)
	h.ok("Reserve", reserveOn("a4", "chat.generate", 1, "allow"), gatewayToken)
	want("generations 4 and 5 rolled back", false, "2", "3", "4")
}

// The gates measured at audit: every check at 0 on a sound ledger, the
// debt outstanding by unit, the USAGE_UNKNOWN age p99; nothing measured
// before the first audit. The count of accounts in debt is read from the
// store at scrape time: right before any audit too.
func TestGateMetricsAtAudit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","executionLimit":"600s",
  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"3600s","maxOverdraft":"1000"}],"holdTtl":"30s"}}`, "")
	for _, id := range []string{"over", "lost"} {
		h.ok("Reserve", reserveOn(id, "chat.generate", 100, ""), "")
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id), "")
	}
	h.ok("Reserve", reserveOn("big", "chat.generate", 700, ""), "")
	// 900 against 100: 100 from available, 700 of debt.
	h.ok("Settle", `{"reservationId":"over","operationId":"op-over","actualUnits":{"tokens":900}}`, "")
	h.ok("MarkUsageUnknown", `{"reservationId":"lost"}`, "")
	h.clock.Advance(90 * time.Second)
	// Before the first audit here the audit's gauges measure nothing: the
	// time and the p99 are 0, and there is no series by check or unit
	// (docs/API.md, "Metrics": read the time before trusting a 0); the
	// account owing 700 is counted already.
	before := h.get("/metrics")
	for _, line := range []string{
		`capledger_audit_last_run_timestamp_seconds 0`,
		`capledger_debt_accounts 1`,
		`capledger_usage_unknown_age_p99_seconds 0`,
	} {
		if !strings.Contains(before, line+"\n") {
			t.Errorf("before any audit, metrics lack %q", line)
		}
	}
	for _, name := range []string{"capledger_audit_discrepancies{", "capledger_debt_outstanding_units{"} {
		if got := grep(before, name); got != "" {
			t.Errorf("before any audit, metrics show %q", got)
		}
	}
	h.ok("Audit", `{}`, "")
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	body := string(raw)
	for _, line := range []string{
		`capledger_audit_discrepancies{check="conservation"} 0`,
		`capledger_audit_discrepancies{check="unrecorded_debt"} 0`,
		`capledger_audit_discrepancies{check="shard_remint_once"} 0`,
		`capledger_debt_outstanding_units{unit="tokens"} 700`,
		`capledger_debt_accounts 1`,
		`capledger_usage_unknown_age_p99_seconds 90`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("metrics lack %q", line)
		}
	}
}

// Subject hashing over the API: tenant-7's bucket on chat.generate is
// 8287 (TestRolloutBucketFixedVectors), so it is enforced from 82.88% and
// in shadow at 82.87%.
func TestRolloutBySubjectOverTheAPI(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), "")
	h.rolloutOK("CreateRollout", `{"name":"chat","hashBy":"subject","routes":[{"route":"chat.generate"}]}`, "")
	h.ok("Reserve", reserveOn("fill", "chat.generate", 900, ""), "")
	for i, tc := range []struct {
		percent  string
		enforced bool
	}{{"82.88", true}, {"82.87", false}, {"100", true}, {"0", false}} {
		h.rolloutOK("SetRolloutShare", `{"name":"chat","percent":`+tc.percent+`}`, "")
		r := h.call("Reserve", reserveOn(fmt.Sprintf("r-%d", i), "chat.generate", 500, ""), "")
		if enforced := r.status == http.StatusTooManyRequests; enforced != tc.enforced || (!enforced && r.body["shadowRejected"] != true) {
			t.Errorf("at %s%%: %d %s, want enforced %v", tc.percent, r.status, r.raw, tc.enforced)
		}
	}
}

// The RolloutService's reads are figures over every tenant of a route or
// generation: a viewer scoped to some subjects gets 403 on each, while the
// unscoped viewer reads them.
func TestRolloutReadsRefuseScopedTokens(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), adminToken)
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken)
	reads := map[string]string{
		"GetRollout":    `{"name":"llm"}`,
		"ListRollouts":  `{}`,
		"ShadowReport":  `{}`,
		"DrainProgress": `{"generations":["1"]}`,
	}
	for method, body := range reads {
		h.wantError(h.rollout(method, body, rolloutScopedViewer), 403, "permission_denied", server.ReasonPermissionDenied)
		if r := h.rollout(method, body, rolloutViewerToken); r.status != 200 {
			t.Errorf("%s by the unscoped viewer: %d %s", method, r.status, r.raw)
		}
	}
}

// SetRolloutShare took a percent of 1e-9 (as 0) but refused 0.005: the
// check allowed 1e-6 basis points of slack. A rollout moves in basis
// points (0.01 %), so a percent is taken exactly when it is a decimal of
// at most two places, and every other is 400 INVALID_ROLLOUT, however
// close to a step it lies; the taken ones read back as sent.
func TestRolloutShareIsExactlyOnTheGrid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"subject","routes":[{"route":"chat.generate"}]}`, "")
	for _, percent := range []string{"1e-9", "0.005", "0.001", "12.345", "99.999", "12.3400001", "1e-300", "-0.01", "100.01"} {
		r := h.rollout("SetRolloutShare", `{"name":"llm","percent":`+percent+`}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidRollout)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "steps of 0.01") {
			t.Errorf("percent %s: message %q", percent, msg)
		}
	}
	if got := h.rolloutOK("GetRollout", `{"name":"llm"}`, ""); fmt.Sprint(got["rollout"].(map[string]any)["steps"]) != fmt.Sprint([]any{got["rollout"].(map[string]any)["steps"].([]any)[0]}) {
		t.Errorf("a refused percent took a step: %v", got)
	}
	for _, percent := range []string{"0.01", "0.07", "0.29", "12.34", "33.33", "99.99", "100", "0"} {
		step := h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":`+percent+`}`, "")
		if got := fmt.Sprint(step["rollout"].(map[string]any)["percent"]); got != strings.TrimSuffix(percent, ".0") && !(percent == "0" && got == "<nil>") {
			t.Errorf("percent %s reads back as %s", percent, got)
		}
	}
}

// An ended rollout decides nothing: its routes follow their policies'
// own modes again at once, another rollout may take them, it takes no
// more steps, and it stays readable with its history. Ending it again
// records nothing; only the admin role ends one.
func TestEndedRolloutHandsItsRoutesBackToTheirPolicies(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: rolloutTokens()})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), adminToken)
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken)
	h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":100}`, adminToken)
	h.ok("Reserve", reserveOn("fill", "chat.generate", 900, ""), gatewayToken)
	if r := h.call("Reserve", reserveOn("enforced", "chat.generate", 500, ""), gatewayToken); r.status != http.StatusTooManyRequests {
		t.Fatalf("at 100%% the rollout enforces: %d %s", r.status, r.raw)
	}
	h.wantError(h.rollout("CreateRollout", `{"name":"again","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken),
		400, "failed_precondition", server.ReasonRouteInRollout)

	h.wantError(h.rollout("EndRollout", `{"name":"llm"}`, rolloutViewerToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(h.rollout("EndRollout", `{"name":"nope"}`, adminToken), 404, "not_found", server.ReasonRolloutNotFound)
	ended := h.rolloutOK("EndRollout", `{"name":"llm"}`, adminToken)
	r := ended["rollout"].(map[string]any)
	if ended["changed"] != true || r["ended"] != true || fmt.Sprint(r["routes"]) != "[map[mode:policy region:global route:chat.generate]]" {
		t.Fatalf("ended: %v", ended)
	}
	// The policy's own shadow mode decides again.
	if r := h.call("Reserve", reserveOn("after-end", "chat.generate", 500, ""), gatewayToken); r.status != 200 || r.body["shadowRejected"] != true {
		t.Fatalf("after the end the policy's shadow mode decides: %d %s", r.status, r.raw)
	}
	if again := h.rolloutOK("EndRollout", `{"name":"llm"}`, adminToken); again["changed"] == true {
		t.Errorf("ending an ended rollout changed it: %v", again)
	}
	h.wantError(h.rollout("SetRolloutShare", `{"name":"llm","percent":50}`, adminToken), 400, "failed_precondition", server.ReasonRolloutEnded)
	h.wantError(h.rollout("UndoRolloutStep", `{"name":"llm"}`, adminToken), 400, "failed_precondition", server.ReasonRolloutEnded)

	// Its route is free; its name and history stay.
	h.rolloutOK("CreateRollout", `{"name":"again","hashBy":"route","routes":[{"route":"chat.generate"}]}`, adminToken)
	h.wantError(h.rollout("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"embed.create"}]}`, adminToken),
		409, "already_exists", server.ReasonRolloutExists)
	got := h.rolloutOK("GetRollout", `{"name":"llm"}`, rolloutViewerToken)["rollout"].(map[string]any)
	steps := got["steps"].([]any)
	if last := steps[len(steps)-1].(map[string]any); len(steps) != 3 || last["action"] != "end" || last["who"] != "ops" {
		t.Fatalf("history after the end: %v", steps)
	}
}

// Operators stepping one rollout at once lose no step: every step either
// lands or is refused with 409 ROLLOUT_CONFLICT (read again, step again),
// and the history holds exactly the steps that landed (docs/ROLLOUT.md,
// section 3).
func TestConcurrentRolloutStepsConflictAndLoseNothing(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"subject","routes":[{"route":"chat.generate"}]}`, "")
	type answer struct {
		status int
		body   string
	}
	const stepsEach, writers = 25, 6
	answers := make(chan answer, stepsEach*writers)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < stepsEach; i++ {
				body := fmt.Sprintf(`{"name":"llm","percent":%.1f}`, float64(1+w*stepsEach+i)/2) // every step a new share
				req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.RolloutService/SetRolloutShare", strings.NewReader(body))
				if err != nil {
					answers <- answer{0, err.Error()}
					continue
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+adminToken)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answers <- answer{0, err.Error()}
					continue
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers <- answer{resp.StatusCode, string(raw)}
			}
		}(w)
	}
	wg.Wait()
	close(answers)
	landed, conflicts := 0, 0
	for a := range answers {
		switch {
		case a.status == http.StatusOK:
			landed++
		case a.status == http.StatusConflict && strings.Contains(a.body, `"aborted"`) && strings.Contains(a.body, server.ReasonRolloutConflict):
			conflicts++
		default:
			t.Errorf("a concurrent step answered %d: %s", a.status, a.body)
		}
	}
	got := h.rolloutOK("GetRollout", `{"name":"llm"}`, "")
	steps := got["rollout"].(map[string]any)["steps"].([]any)
	if len(steps) != 1+landed {
		t.Errorf("history holds %d steps, want the create and the %d that landed", len(steps), landed)
	}
	t.Logf("%d steps landed, %d refused as conflicts", landed, conflicts)
}
