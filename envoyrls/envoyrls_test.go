package envoyrls_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/envoyrls"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testMapping is the mapping file of docs/ENVOY.md (TestDocsEnvoyYAML
// checks that the two agree).
func testMapping(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile("testdata/mapping.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

const (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

// TestClassicCounter: without an id a check is a reserve-and-settle of
// its hits, answered with the remaining capacity, the IETF headers, and
// Retry-After once over the limit.
func TestClassicCounter(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "search", "requests", 10, 1, 2*time.Second, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4,
		Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", "search")}}

	for i, want := range []struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{{OK, 6}, {OK, 2}, {OVER, 2}} {
		resp := h.mustCheck(req)
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != want.code || st.GetCode() != want.code || st.GetLimitRemaining() != want.remaining {
			t.Fatalf("check %d: want %v remaining %d, got %v", i, want.code, want.remaining, resp)
		}
		if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 30 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("check %d: current limit %v, want 30 per minute (1 per 2s)", i, l)
		}
		if got := header(resp, "RateLimit-Policy"); got != `"search-requests";q=10;w=20` {
			t.Fatalf("check %d: RateLimit-Policy %q", i, got)
		}
		if got := header(resp, "RateLimit"); !strings.HasPrefix(got, `"search-requests";r=`) {
			t.Fatalf("check %d: RateLimit %q", i, got)
		}
	}
	// The third was refused: 2 short at 1 per 2 s is 4 s.
	resp := h.mustCheck(req)
	if got := header(resp, "Retry-After"); got != "4" {
		t.Fatalf("Retry-After %q, want 4: %v", got, resp)
	}
	if got := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != 4*time.Second {
		t.Fatalf("duration_until_reset %v, want 4s", got)
	}
	// Two checks of 4 were spent (durably, settled), nothing held.
	if b := h.balance("acme", "search"); b.Spent != 8 || b.Reserved != 0 || b.Available != 2 {
		t.Fatalf("balance %+v, want spent 8, reserved 0, available 2", b)
	}
	// The request-level hits_addend 0 means 1.
	h.clock.Advance(4 * time.Second)
	req.HitsAddend = 0
	if resp := h.mustCheck(req); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 3 {
		t.Fatalf("hits 1: %v", resp)
	}
}

// TestNewGenerationNewLimits: the limits a check reports (current_limit,
// RateLimit-Policy, RateLimit's name) follow the generation that decided
// it, also after a new one is published for the same subject and route.
func TestNewGenerationNewLimits(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	for _, tc := range []struct {
		burst, refill int64
		unit          string
		policy        string
		perUnit       uint32
	}{
		{10, 1, "requests", `"search-requests";q=10;w=10`, 1},
		{50, 5, "requests", `"search-requests";q=50;w=10`, 5},
		{7, 7, "calls", "", 0}, // the rule's unit is gone: unknown, no limits
		{20, 2, "requests", `"search-requests";q=20;w=10`, 2},
	} {
		h.publish("acme", "search", tc.unit, tc.burst, tc.refill, time.Second, false)
		resp, err := h.check(req)
		if err != nil {
			t.Fatalf("burst %d: %v", tc.burst, err)
		}
		st := resp.GetStatuses()[0]
		if got := header(resp, "RateLimit-Policy"); got != tc.policy {
			t.Fatalf("burst %d: RateLimit-Policy %q, want %q", tc.burst, got, tc.policy)
		}
		if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != tc.perUnit {
			t.Fatalf("burst %d: %d per unit, want %d: %v", tc.burst, got, tc.perUnit, resp)
		}
		if want := tc.policy != ""; (resp.GetOverallCode() == OK) != want {
			t.Fatalf("burst %d: admitted %v, want %v: %v", tc.burst, !want, want, resp)
		}
	}
}

// TestEnvoyFilterSequence replays what Envoy's HTTP ratelimit filter sends
// for a route with two rate_limits (docs/ENVOY.md): on the request headers
// a check carrying x-request-id, and after the stream (apply_on_stream_done)
// the same descriptor with the phase entry and the actual cost. The check
// reserves and starts, the second call settles; retries of either replay.
func TestEnvoyFilterSequence(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 100, time.Second, false)
	id := "6f1a7c2e-0d4b-4c55-9a51-2b1f7e0c9d10"
	checkReq := &rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "x-request-id", id)}}
	doneReq := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(120), "tenant", "acme", "x-request-id", id, "capledger-phase", "settle")}}
	rid := "envoy:" + id + "/acme/chat/global"

	for range 2 { // the second is Envoy retrying a check whose answer was lost
		if resp := h.mustCheck(checkReq); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 700 {
			t.Fatalf("check: %v", resp)
		}
		if r := h.reservation(rid); r.GetState() != v1.ReservationState_RESERVATION_STATE_STARTED || r.GetReservedUnits()["tokens"] != 300 {
			t.Fatalf("after check: %v", r)
		}
	}
	for range 2 {
		if resp := h.mustCheck(doneReq); resp.GetOverallCode() != OK {
			t.Fatalf("stream done: %v", resp)
		}
		r := h.reservation(rid)
		if r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != 120 {
			t.Fatalf("after stream done: %v", r)
		}
	}
	if b := h.balance("acme", "chat"); b.Spent != 120 || b.Reserved != 0 || b.Available != 880 {
		t.Fatalf("balance %+v, want spent 120 once, the other 180 of the estimate refunded", b)
	}
	// A stream-done call that contradicts the recorded settle is an error
	// of the call (Envoy ignores answers after the stream; the ledger
	// keeps the first settle).
	doneReq.Descriptors[0].HitsAddend.Value = 121
	if _, err := h.check(doneReq); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("contradicting settle: want FAILED_PRECONDITION, got %v", err)
	}
	// The same id with another estimate is another request: refused.
	checkReq.HitsAddend = 301
	if _, err := h.check(checkReq); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("reused id: want ALREADY_EXISTS, got %v", err)
	}
}

// TestAIGatewayTokenCost replays Envoy AI Gateway's token-cost pattern:
// the request-time check sends hits_addend 0 (a check that must not
// consume), and after the response the stream-done call sends the real
// token count from dynamic metadata. With an id, the check reserves the
// rule's estimate and the cost settles it; a cost above what was free is
// recorded as debt and freezes the tenant, so the next check is refused.
func TestAIGatewayTokenCost(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 2000, 10, time.Second, false)
	check := func(id string) *rlsv3.RateLimitResponse {
		return h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(0), "tenant", "acme", "x-request-id", id)}})
	}
	done := func(id string, tokens uint64) *rlsv3.RateLimitResponse {
		return h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(tokens), "tenant", "acme", "x-request-id", id, "capledger-phase", "settle")}})
	}
	if resp := check("req-1"); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 1500 {
		t.Fatalf("check 1 (estimate 500 of 2000): %v", resp)
	}
	if resp := check("req-2"); resp.GetOverallCode() != OK {
		t.Fatalf("check 2: %v", resp)
	}
	if resp := done("req-1", 380); resp.GetOverallCode() != OK {
		t.Fatalf("cost 1: %v", resp)
	}
	// req-2 used far more than estimated: its 500 held plus the 1120 free
	// (2000 - 380 - 500) cover 1620 of 2900; the other 1280 are debt.
	resp := done("req-2", 2900)
	if resp.GetOverallCode() != OVER {
		t.Fatalf("cost 2 beyond the free capacity: want OVER_LIMIT (debt), got %v", resp)
	}
	if r := h.reservation("envoy:req-2/acme/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT || r.GetActualUnits()["tokens"] != 2900 {
		t.Fatalf("req-2: %v", r)
	}
	b := h.balance("acme", "chat")
	if b.Spent != 380+2900 || b.Reserved != 0 || b.Debt() != 1280 || b.Available != 0 {
		t.Fatalf("balance %+v: want every token spent, the excess as debt", b)
	}
	// Frozen until refills repay the debt: the next check is refused with a
	// Retry-After from the refill rate.
	resp = check("req-3")
	if resp.GetOverallCode() != OVER || header(resp, "Retry-After") == "" {
		t.Fatalf("check while in debt: %v", resp)
	}
	// A request whose check failed open (no reservation) still has its
	// cost recorded, once, under its id.
	h.clock.Advance(10 * time.Minute)
	for range 2 {
		if resp := done("req-4", 50); resp.GetOverallCode() != OK {
			t.Fatalf("cost without a check: %v", resp)
		}
	}
	if r := h.reservation("envoy:req-4/acme/chat/global"); r.GetActualUnits()["tokens"] != 50 {
		t.Fatalf("req-4: %v", r)
	}
	if got := h.balance("acme", "chat").Spent; got != 380+2900+50 {
		t.Fatalf("spent %d after the uncovered cost, want %d", got, 380+2900+50)
	}
}

// TestProbeHoldsNothing: hits 0 without an id (or an id and no estimate)
// asks whether one unit would be admitted, and keeps nothing.
func TestProbeHoldsNothing(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "search", "requests", 3, 1, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(0), "tenant", "acme", "route", "search")}}
	for range 3 {
		if resp := h.mustCheck(req); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 3 {
			t.Fatalf("probe: %v", resp)
		}
	}
	if b := h.balance("acme", "search"); b.Available != 3 || b.Spent != 0 || b.Reserved != 0 {
		t.Fatalf("after probes %+v", b)
	}
	req.Descriptors[0].HitsAddend.Value = 3
	h.mustCheck(req)
	req.Descriptors[0].HitsAddend.Value = 0
	if resp := h.mustCheck(req); resp.GetOverallCode() != OVER {
		t.Fatalf("probe of an empty account: %v", resp)
	}
}

// TestSeveralDescriptors: one request checked against two tenants'
// limits; when one refuses, the other keeps nothing (Envoy refuses the
// request as a whole), and statuses come in the descriptors' order.
func TestSeveralDescriptors(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	h.publish("global", "search", "requests", 2, 1, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search"),
		descriptor(nil, "tenant", "global", "route", "search")}}
	if resp := h.mustCheck(req); resp.GetOverallCode() != OK || len(resp.GetStatuses()) != 2 {
		t.Fatalf("first: %v", resp)
	}
	resp := h.mustCheck(req)
	if resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetCode() != OK || resp.GetStatuses()[1].GetCode() != OVER ||
		resp.GetStatuses()[0].GetLimitRemaining() != 8 {
		t.Fatalf("second: want acme OK, global OVER_LIMIT, overall OVER_LIMIT; got %v", resp)
	}
	if b := h.balance("acme", "search"); b.Spent != 2 || b.Reserved != 0 || b.Available != 8 {
		t.Fatalf("acme %+v: the refused request must not be charged to it", b)
	}
}

// TestUnknownDescriptor: a descriptor no rule maps, or that maps to no
// policy, answers per unknown_descriptor.
func TestUnknownDescriptor(t *testing.T) {
	for _, mode := range []string{"allow", "deny"} {
		t.Run(mode, func(t *testing.T) {
			cfg := strings.Replace(testMapping(t), "unknown_descriptor: deny", "unknown_descriptor: "+mode, 1)
			h := newHarness(t, options{config: cfg, auth: true})
			want := OVER
			if mode == "allow" {
				want = OK
			}
			for _, req := range []*rlsv3.RateLimitRequest{
				{Domain: "nowhere", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme")}},
				{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "user", "acme")}},
				{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "nobody", "route", "search")}},
			} {
				if resp := h.mustCheck(req); resp.GetOverallCode() != want {
					t.Fatalf("%v: want %v, got %v", req, want, resp)
				}
			}
		})
	}
}

// TestShadowPolicyAlwaysOK: a shadow policy's would-be refusal lets the
// request through and is counted in the rejection metrics.
func TestShadowPolicyAlwaysOK(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 1, 1, time.Hour, true)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	for range 3 {
		if resp := h.mustCheck(req); resp.GetOverallCode() != OK {
			t.Fatalf("shadow: %v", resp)
		}
	}
	resp, err := http.Get("http://" + h.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `capledger_rejections_total{dimension="requests",reason="INSUFFICIENT_CAPACITY",rollout="shadow"} 2`) {
		t.Fatalf("shadow rejections not counted:\n%s", grepLines(string(body), "rejections"))
	}
}

func grepLines(s, word string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestStoreUnavailable: while the store cannot commit, ShouldRateLimit
// fails with UNAVAILABLE, so Envoy applies its failure_mode_deny; nothing
// is charged, and the next call works.
func TestStoreUnavailable(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), faults: true})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	h.faults.FailNextCommit(store.ErrUnavailable)
	if _, err := h.check(req); status.Code(err) != codes.Unavailable {
		t.Fatalf("want UNAVAILABLE, got %v", err)
	}
	if resp := h.mustCheck(req); resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Fatalf("after recovery: %v", resp)
	}
}

// TestAuth: Envoy sends the bearer token as initial_metadata of its
// grpc_service; without it, or with an unknown one, the call is
// UNAUTHENTICATED.
func TestAuth(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	ctx := t.Context()
	if _, err := h.rls.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	// A viewer token reads; ShouldRateLimit writes (ENVOY.md's failure table).
	viewer := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+viewerToken)
	if _, err := h.rls.ShouldRateLimit(viewer, req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("viewer token: %v", err)
	}
	h.mustCheck(req)
}

// TestBadRequests: malformed requests are INVALID_ARGUMENT and charge
// nothing.
func TestBadRequests(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	d := descriptor(nil, "tenant", "acme", "route", "search")
	neg := descriptor(nil, "tenant", "acme", "route", "search")
	neg.IsNegativeHits = true
	many := make([]*rlscommon.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = d
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"none":     {Domain: "api"},
		"negative": {Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{neg}},
		"too many": {Domain: "api", Descriptors: many},
		"huge":     {Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(hits(1<<60), "tenant", "acme", "route", "search")}},
		// PostgreSQL cannot keep a NUL byte: refused (by the server's
		// command checks the adapter shares), not a retryable 503.
		"NUL subject": {Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "ac\x00me", "route", "search")}},
		"NUL id":      {Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "x-request-id", "r\x001")}},
		// Over the bound of a subject or route (API.md, "Limits"), with
		// and without a request id.
		"long subject":    {Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", strings.Repeat("s", ledger.MaxKeyBytes+1), "route", "search")}},
		"long route":      {Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", strings.Repeat("r", ledger.MaxKeyBytes+1))}},
		"long subject id": {Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", strings.Repeat("s", ledger.MaxKeyBytes+1), "x-request-id", "r1")}},
	} {
		if _, err := h.check(req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: want INVALID_ARGUMENT, got %v", name, err)
		}
	}
	if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{d}}); resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Fatalf("first valid check after bad requests: %v", resp)
	}
	// At most 64 descriptors (docs/ENVOY.md): 64 is a request like any other.
	if _, err := h.check(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: many[:64]}); err != nil {
		t.Fatalf("64 descriptors: %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for name, cfg := range map[string]string{
		"no domains":       `unknown_descriptor: deny`,
		"bad mode":         "unknown_descriptor: maybe\ndomains: [{name: a, rules: [{subject: {key: t}, unit: u}]}]",
		"unknown field":    "domains: [{name: a, rules: [{subject: {key: t}, unit: u, units: v}]}]",
		"no unit":          "domains: [{name: a, rules: [{subject: {key: t}}]}]",
		"no subject":       "domains: [{name: a, rules: [{unit: u}]}]",
		"key and value":    "domains: [{name: a, rules: [{subject: {key: t, value: v}, unit: u}]}]",
		"phase, no id":     "domains: [{name: a, rules: [{subject: {key: t}, unit: u, phase_key: p}]}]",
		"key twice":        "domains: [{name: a, rules: [{subject: {key: t}, route: {key: t}, unit: u}]}]",
		"domain twice":     "domains: [{name: a, rules: [{subject: {key: t}, unit: u}]}, {name: a, rules: [{subject: {key: t}, unit: u}]}]",
		"every subject":    "domains: [{name: a, rules: [{subject: {value: '*'}, unit: u}]}]",
		"negative estim.":  "domains: [{name: a, rules: [{subject: {key: t}, unit: u, estimate: -1}]}]",
		"estimate, no id":  "domains: [{name: a, rules: [{subject: {key: t}, unit: u, estimate: 500}]}]",
		"two settle marks": "domains: [{name: a, rules: [{subject: {key: t}, unit: u, id_key: i, phase_key: p, settle_on_hits: true}]}]",
		"unit too long":    "domains: [{name: a, rules: [{subject: {key: t}, unit: " + strings.Repeat("u", ledger.MaxUnitBytes+1) + "}]}]",
		// A second document was dropped without a word: its domains
		// answered unknown_descriptor.
		"two documents": "domains: [{name: a, rules: [{subject: {key: t}, unit: u}]}]\n---\ndomains: [{name: b, rules: [{subject: {key: t}, unit: u}]}]",
	} {
		if _, err := envoyrls.ParseConfig([]byte(cfg)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// encoding/json would read "Unit" as unit: refused, naming both.
	_, err := envoyrls.ParseConfig([]byte("domains: [{name: a, rules: [{subject: {key: t}, Unit: u}]}]"))
	if err == nil || !strings.Contains(err.Error(), `field "Unit"`) || !strings.Contains(err.Error(), `spelt "unit"`) {
		t.Errorf("a key in another case: %v, want an error naming \"Unit\" and \"unit\"", err)
	}
	if _, err := envoyrls.ParseConfig([]byte(testMapping(t))); err != nil {
		t.Fatal(err)
	}
}

func TestMapRules(t *testing.T) {
	c, err := envoyrls.ParseConfig([]byte(testMapping(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		domain  string
		entries []envoyrls.Entry
		ok      bool
		key     string
		id      string
		settle  bool
	}{
		{"api", mapEntries("tenant", "a", "route", "r"), true, "a/r@global", "", false},
		{"api", mapEntries("route", "r", "tenant", "a"), true, "a/r@global", "", false},
		{"api", mapEntries("tenant", "a"), false, "", "", false},                              // route key missing
		{"api", mapEntries("tenant", "a", "route", "r", "x", "y"), false, "", "", false},      // extra entry
		{"api", mapEntries("tenant", "a", "tenant", "b", "route", "r"), false, "", "", false}, // repeated key
		{"api", mapEntries("tenant", "a", "tenant", "b"), false, "", "", false},               // repeated key, as many entries as the rule wants
		{"llm", mapEntries("tenant", "a"), true, "a/chat@global", "", false},
		{"llm", mapEntries("tenant", "a", "x-request-id", "q"), true, "a/chat@global", "q", false},
		{"llm", mapEntries("tenant", "a", "x-request-id", "q", "capledger-phase", "settle"), true, "a/chat@global", "q", true},
		{"llm", mapEntries("tenant", "a", "x-request-id", "q", "capledger-phase", "other"), false, "", "", false},
		{"other", mapEntries("tenant", "a"), false, "", "", false},
	} {
		m, ok := c.Map(tc.domain, tc.entries)
		if ok != tc.ok || (ok && (m.Key.String() != tc.key || m.ID != tc.id || m.Settle != tc.settle)) {
			t.Errorf("%s %v: got %v %+v", tc.domain, tc.entries, ok, m)
		}
	}
}

// mapEntries makes a descriptor's entries from key, value pairs.
func mapEntries(kv ...string) []envoyrls.Entry {
	var out []envoyrls.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, envoyrls.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestMapRepeatedKeyInLongDescriptor: a descriptor with more entries than
// match compares one by one (smallEntries) is refused for a repeated key
// too, even when its count of entries is what the rule wants.
func TestMapRepeatedKeyInLongDescriptor(t *testing.T) {
	var match, entries []string
	for i := range 20 {
		match = append(match, fmt.Sprintf("k%d: v", i))
		entries = append(entries, fmt.Sprintf("k%d", i), "v")
	}
	c, err := envoyrls.ParseConfig([]byte("domains: [{name: d, rules: [{subject: {key: tenant}, route: {value: r}, unit: u, match: {" + strings.Join(match, ", ") + "}}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := c.Map("d", mapEntries(append([]string{"tenant", "a"}, entries...)...)); !ok || m.Key.Subject != "a" {
		t.Fatalf("every entry once: %v %+v", ok, m)
	}
	// k19 left out, tenant twice: as many entries as the rule wants.
	if m, ok := c.Map("d", mapEntries(append([]string{"tenant", "a", "tenant", "b"}, entries[:38]...)...)); ok {
		t.Fatalf("repeated tenant mapped: %+v", m)
	}
}

// TestConcurrentChecksAdmitExactlyTheBurst: 64 callers race for a burst
// of 100 without refill; exactly 100 checks are admitted, over gRPC, and
// the ledger holds exactly what they took.
func TestConcurrentChecksAdmitExactlyTheBurst(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "search", "requests", 100, 0, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	var mu sync.Mutex
	admitted, refused := 0, 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 3 {
				resp, err := h.check(req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if resp.GetOverallCode() == OK {
					admitted++
				} else {
					refused++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if admitted != 100 || refused != 92 {
		t.Fatalf("admitted %d, refused %d; want 100 and 92", admitted, refused)
	}
	if b := h.balance("acme", "search"); b.Spent != 100 || b.Available != 0 || b.Reserved != 0 {
		t.Fatalf("balance %+v", b)
	}
}

// TestSeveralDescriptorsRetried: a request with an id checked against two
// tenants. Refused by one, it holds nothing at the other; a retry of it
// stays refused even once the refusing tenant has room again (its
// reservation at the other was released, and a released id is final), and
// leaves nothing held. An admitted request's retry replays.
func TestSeveralDescriptorsRetried(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	h.publish("global", "chat", "tokens", 400, 100, time.Minute, false)
	req := func(id string, n uint64) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(n), "tenant", "acme", "x-request-id", id),
			descriptor(hits(n), "tenant", "global", "x-request-id", id)}}
	}
	// 200 spent at global by a check without an id.
	if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 200, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "global")}}); resp.GetOverallCode() != OK {
		t.Fatalf("q0: %v", resp)
	}
	resp := h.mustCheck(req("q1", 300))
	if resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetCode() != OK || resp.GetStatuses()[1].GetCode() != OVER {
		t.Fatalf("q1: %v", resp)
	}
	if r := h.reservation("envoy:q1/acme/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_RELEASED {
		t.Fatalf("q1 at acme: %v", r)
	}
	h.clock.Advance(2 * time.Minute) // global refilled to 400: room for q1
	if resp := h.mustCheck(req("q1", 300)); resp.GetOverallCode() != OVER {
		t.Fatalf("q1 retried: %v", resp)
	}
	for range 2 {
		if resp := h.mustCheck(req("q2", 50)); resp.GetOverallCode() != OK {
			t.Fatalf("q2: %v", resp)
		}
	}
	if b := h.balance("acme", "chat"); b.Reserved != 50 || b.Available != 950 {
		t.Fatalf("acme %+v: want only q2's 50 held", b)
	}
	if b := h.balance("global", "chat"); b.Reserved != 50 || b.Available != 350 {
		t.Fatalf("global %+v: want only q2's 50 held, 350 free", b)
	}
}

// TestDirectAndBridgedAnswerAlike: ShouldRateLimit registered directly on
// grpc-go (as serve runs it) and served through grpc-go's bridge to the
// connect handler (what every other method gets) answer the same calls
// identically: admissions, OVER_LIMIT with its headers, refusals without
// a token and of malformed requests.
func TestDirectAndBridgedAnswerAlike(t *testing.T) {
	direct := newHarness(t, options{config: testMapping(t), auth: true})
	bridged := newHarness(t, options{config: testMapping(t), auth: true, bridged: true})
	for _, h := range []*harness{direct, bridged} {
		h.publish("acme", "search", "requests", 10, 1, 2*time.Second, false)
	}
	check := func(h *harness, token string, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, *status.Status) {
		ctx := context.Background()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		resp, err := h.rls.ShouldRateLimit(ctx, req)
		return resp, status.Convert(err)
	}
	counter := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 4,
		Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", "search")}}
	for i, c := range []struct {
		token string
		req   *rlsv3.RateLimitRequest
		code  codes.Code
	}{
		{gatewayToken, counter, codes.OK},
		{gatewayToken, counter, codes.OK},
		{gatewayToken, counter, codes.OK}, // OVER_LIMIT, Retry-After 4
		{"", counter, codes.Unauthenticated},
		{adminToken + "x", counter, codes.Unauthenticated},
		{gatewayToken, &rlsv3.RateLimitRequest{Domain: "api"}, codes.InvalidArgument},
	} {
		wantResp, want := check(bridged, c.token, c.req)
		gotResp, got := check(direct, c.token, c.req)
		if want.Code() != c.code {
			t.Fatalf("call %d: bridged answered %v, want %v", i, want.Err(), c.code)
		}
		if !proto.Equal(want.Proto(), got.Proto()) || !proto.Equal(wantResp, gotResp) {
			t.Errorf("call %d: bridged answered %v %v, direct %v %v", i, wantResp, want.Proto(), gotResp, got.Proto())
		}
	}
	if resp, _ := check(direct, gatewayToken, counter); resp.GetOverallCode() != OVER || header(resp, "Retry-After") != "4" {
		t.Fatalf("direct: want OVER_LIMIT with Retry-After 4, got %v", resp)
	}
}

// TestUnmappedDescriptorsCounted: every descriptor answered per
// unknown_descriptor is counted as a refused reserve, as docs/ENVOY.md and
// OPERATIONS.md say: an unknown domain and a descriptor no rule matches as
// outcome="no_policy" like one whose key has no policy, so that a typo in
// Envoy's domain or descriptor keys shows on a dashboard instead of
// silently allowing (or denying) everything.
func TestUnmappedDescriptorsCounted(t *testing.T) {
	cfg := strings.Replace(testMapping(t), "unknown_descriptor: deny", "unknown_descriptor: allow", 1)
	h := newHarness(t, options{config: cfg})
	h.publish("*", "search", "widgets", 10, 1, time.Hour, false)
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "nowhere", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme")}},
		{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "user", "acme")}},
		{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "nobody", "route", "nopolicy")}},
		{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", "search")}},
	} {
		if resp := h.mustCheck(req); resp.GetOverallCode() != OK {
			t.Fatalf("%v: want OK (allow), got %v", req, resp)
		}
	}
	// A malformed request decided nothing: its unmapped descriptor is not
	// counted.
	negative := descriptor(nil, "tenant", "acme", "route", "search")
	negative.IsNegativeHits = true
	if _, err := h.check(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "user", "acme"), negative}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("negative hits: %v", err)
	}
	resp, err := http.Get("http://" + h.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`capledger_commands_total{kind="reserve",outcome="no_policy"} 3`,
		`capledger_commands_total{kind="reserve",outcome="unknown_unit"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("want %s in:\n%s", want, grepLines(string(body), "commands_total"))
		}
	}
}

// TestRefusedCheckCountsOnlyItsReserve: a check refused by capacity (or
// under a shadow policy) shows in capledger_commands_total as its refused
// reserve alone. Its start and settle, sent in the same transaction, find
// no reservation; counting them as start and settle outcomes
// "reservation_not_found" would tell an operator that gateways settle ids
// the ledger never admitted.
func TestRefusedCheckCountsOnlyItsReserve(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 1, 1, time.Hour, false)
	h.publish("shade", "search", "requests", 1, 1, time.Hour, true)
	for _, tenant := range []string{"acme", "shade"} {
		req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(nil, "tenant", tenant, "route", "search")}}
		h.mustCheck(req)
		h.mustCheck(req) // refused (acme) or shadow-refused (shade)
	}
	llm := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(5), "tenant", "acme", "x-request-id", "too-big")}}
	h.publish("acme", "chat", "tokens", 1, 1, time.Hour, false)
	if resp := h.mustCheck(llm); resp.GetOverallCode() != OVER {
		t.Fatalf("want OVER_LIMIT: %v", resp)
	}
	resp, err := http.Get("http://" + h.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if got := grepLines(string(body), `outcome="reservation_not_found"`); got != "" {
		t.Errorf("a refused check counted follow-ups that never ran:\n%s", got)
	}
	for _, want := range []string{
		`capledger_commands_total{kind="reserve",outcome="insufficient_capacity"} 1`,
		`capledger_commands_total{kind="reserve",outcome="shadow_rejected"} 1`,
		`capledger_commands_total{kind="reserve",outcome="reservation_too_large"} 1`,
		`capledger_commands_total{kind="start",outcome="ok"} 2`,
		`capledger_commands_total{kind="settle",outcome="ok"} 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("want %s in:\n%s", want, grepLines(string(body), "commands_total"))
		}
	}
}

// TestScopedTokenSeesNoPolicy: a gateway token scoped to some subjects
// sees the others as having no policy, so unknown_descriptor answers them
// (docs/ENVOY.md, "Auth"): with allow, they go through uncharged.
func TestScopedTokenSeesNoPolicy(t *testing.T) {
	cfg := strings.Replace(testMapping(t), "unknown_descriptor: deny", "unknown_descriptor: allow", 1)
	h := newHarness(t, options{config: cfg, auth: true})
	h.publish("*", "search", "requests", 1, 1, time.Hour, false)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+scopedToken)
	check := func(tenant string) rlsv3.RateLimitResponse_Code {
		resp, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(nil, "tenant", tenant, "route", "search")}})
		if err != nil {
			t.Fatalf("%s: %v", tenant, err)
		}
		return resp.GetOverallCode()
	}
	if a, b := check("tenant-a/1"), check("tenant-a/1"); a != OK || b != OVER {
		t.Fatalf("in scope: %v then %v, want OK then OVER_LIMIT", a, b)
	}
	for range 3 {
		if got := check("tenant-b/1"); got != OK {
			t.Fatalf("out of scope with allow: %v, want OK", got)
		}
	}
	accounts, err := h.engine.Accounts(t.Context(), ledger.PolicyKey{Subject: "tenant-b/1", Route: "search", Region: ledger.DefaultRegion})
	if err != nil || len(accounts) != 0 {
		t.Fatalf("out of scope charged: %v %v", accounts, err)
	}
}

// TestNoRefillHeadersNameNoReset: a dimension without refill never resets,
// so its RateLimit item has no t and its RateLimit-Policy item no w (both
// optional in the IETF fields). A "t=0" would tell a client the quota
// resets now, and one refused with r=0;t=0 would retry at once, forever.
func TestNoRefillHeadersNameNoReset(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 2, 0, 0, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}}
	for i, want := range []struct {
		code  rlsv3.RateLimitResponse_Code
		limit string
	}{{OK, `"search-requests";r=1`}, {OK, `"search-requests";r=0`}, {OVER, `"search-requests";r=0`}} {
		resp := h.mustCheck(req)
		if resp.GetOverallCode() != want.code {
			t.Fatalf("check %d: %v", i, resp)
		}
		if got := header(resp, "RateLimit-Policy"); got != `"search-requests";q=2` {
			t.Errorf("check %d: RateLimit-Policy %q, want no w", i, got)
		}
		if got := header(resp, "RateLimit"); got != want.limit {
			t.Errorf("check %d: RateLimit %q, want %q", i, got, want.limit)
		}
		if got := header(resp, "Retry-After"); got != "" {
			t.Errorf("check %d: Retry-After %q: no refill can help", i, got)
		}
		if resp.GetStatuses()[0].GetDurationUntilReset() != nil {
			t.Errorf("check %d: duration_until_reset %v without refill", i, resp.GetStatuses()[0].GetDurationUntilReset())
		}
	}
}

// egMapping maps descriptors the way Envoy Gateway generates them for a
// rule with a request and a response cost: the same entries on the check
// before the request (cost 0) and on the call after the stream (the cost,
// e.g. Envoy AI Gateway's token count), with no phase entry.
const egMapping = `
domains:
  - name: eg
    rules:
      - subject: {key: tenant}
        route: {value: chat}
        unit: tokens
        settle_on_hits: true
  - name: egid
    rules:
      - subject: {key: tenant}
        route: {value: chat}
        unit: tokens
        id_key: x-request-id
        estimate: 300
        settle_on_hits: true
`

// TestSameDescriptorResponseCost: with settle_on_hits, the call after the
// stream that carries the same descriptor as the check is recorded as the
// response's cost, also beyond what is free (as debt, freezing the tenant),
// instead of being a classic check of its hits that a large cost fails and
// leaves unrecorded (docs/ENVOY.md, Envoy Gateway and Envoy AI Gateway).
func TestSameDescriptorResponseCost(t *testing.T) {
	h := newHarness(t, options{config: egMapping})
	h.publish("*", "chat", "tokens", 1000, 10, time.Second, false)
	call := func(domain string, n uint64, kv ...string) *rlsv3.RateLimitResponse {
		return h.mustCheck(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(n), kv...)}})
	}
	// Without an id: a probe, then the cost after the fact.
	if resp := call("eg", 0, "tenant", "acme"); resp.GetOverallCode() != OK {
		t.Fatalf("request-time check: %v", resp)
	}
	if resp := call("eg", 3000, "tenant", "acme"); resp.GetOverallCode() != OVER {
		t.Fatalf("response cost beyond the free capacity: want OVER_LIMIT (debt), got %v", resp)
	}
	if b := h.balance("acme", "chat"); b.Spent != 3000 || b.Debt() != 2000 || b.Reserved != 0 {
		t.Fatalf("after a response cost of 3000 on 1000: %+v, want all 3000 spent, 2000 as debt", b)
	}
	if resp := call("eg", 0, "tenant", "acme"); resp.GetOverallCode() != OVER {
		t.Fatalf("request-time check while in debt: %v", resp)
	}
	// With an id: the check reserves the estimate, the response settles it.
	if resp := call("egid", 0, "tenant", "beta", "x-request-id", "r-1"); resp.GetOverallCode() != OK {
		t.Fatalf("request-time check with an id: %v", resp)
	}
	if r := h.reservation("envoy:r-1/beta/chat/global"); r.GetReservedUnits()["tokens"] != 300 {
		t.Fatalf("check with an id reserved %v, want the estimate 300", r.GetReservedUnits())
	}
	for range 2 { // a retried response cost replays
		if resp := call("egid", 700, "tenant", "beta", "x-request-id", "r-1"); resp.GetOverallCode() != OK {
			t.Fatalf("response cost with an id: %v", resp)
		}
	}
	if r := h.reservation("envoy:r-1/beta/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != 700 {
		t.Fatalf("r-1 after its response cost: %v", r)
	}
	if b := h.balance("beta", "chat"); b.Spent != 700 || b.Reserved != 0 {
		t.Fatalf("beta: %+v", b)
	}
}

// TestCostAfterTheFactIntoDebtIsOverLimit: a call after the stream with no
// reservation to settle (the check failed open) records its cost after the
// fact; when that cost goes beyond what is free it is recorded as debt and
// the answer is OVER_LIMIT, as for the settle of a reservation
// (docs/ENVOY.md, "What a check does"), alone or beside another descriptor.
func TestCostAfterTheFactIntoDebtIsOverLimit(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("*", "chat", "tokens", 1000, 10, time.Second, false)
	after := func(tenant, id string, n uint64) *rlscommon.RateLimitDescriptor {
		return descriptor(hits(n), "tenant", tenant, "x-request-id", id, "capledger-phase", "settle")
	}
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{after("acme", "r-1", 3000)}})
	if resp.GetOverallCode() != OVER {
		t.Fatalf("cost of 3000 on 1000 free, alone: want OVER_LIMIT, got %v", resp)
	}
	resp = h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		after("beta", "r-2", 10), after("gamma", "r-2", 3000)}})
	if resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetCode() != OK || resp.GetStatuses()[1].GetCode() != OVER {
		t.Fatalf("costs of 10 and 3000 on 1000 free each: want OK then OVER_LIMIT, got %v", resp)
	}
	for _, c := range []struct {
		tenant      string
		spent, debt int64
	}{{"acme", 3000, 2000}, {"beta", 10, 0}, {"gamma", 3000, 2000}} {
		if b := h.balance(c.tenant, "chat"); b.Spent != c.spent || b.Debt() != c.debt {
			t.Fatalf("%s: %+v, want spent %d, debt %d", c.tenant, b, c.spent, c.debt)
		}
	}
}

// recordMapping is egMapping with a third domain whose rule has an id but
// no estimate: its request-time check is a probe, so the response's cost
// finds no reservation under the id.
const recordMapping = egMapping + `
  - name: egprobe
    rules:
      - subject: {key: tenant}
        route: {value: chat}
        unit: tokens
        id_key: x-request-id
        settle_on_hits: true
`

// TestFrozenTenantResponseCostRecorded: Envoy Gateway's response-time
// cost (settle_on_hits) with nothing reserved for it is recorded even
// while the tenant is frozen by debt or empty: it becomes more debt and
// the answer is OVER_LIMIT with nothing remaining, in both columns of
// docs/ENVOY.md's table (without an id; with an id whose check failed
// open or was a probe). A retry with the same id and cost replays and
// charges nothing twice; with another cost it is FAILED_PRECONDITION.
// The audit stays clean.
func TestFrozenTenantResponseCostRecorded(t *testing.T) {
	h := newHarness(t, options{config: recordMapping})
	h.publish("*", "chat", "tokens", 1000, 10, time.Second, false)
	call := func(domain string, n uint64, kv ...string) (*rlsv3.RateLimitResponse, error) {
		return h.check(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(hits(n), kv...)}})
	}
	mustOver := func(what string, n uint64, wantSpent, wantDebt int64, domain string, kv ...string) {
		t.Helper()
		resp, err := call(domain, n, kv...)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Fatalf("%s: want OVER_LIMIT with nothing remaining, got %v", what, resp)
		}
		if b := h.balance(kv[1], "chat"); b.Spent != wantSpent || b.Debt() != wantDebt || b.Reserved != 0 || b.Available != 0 {
			t.Fatalf("%s: %+v, want spent %d, debt %d", what, b, wantSpent, wantDebt)
		}
	}

	// Without an id: the first cost empties the tenant into debt, and the
	// next, while it is frozen, is recorded as more debt (it used to be
	// refused and lost).
	mustOver("no id, cost 3000 on 1000", 3000, 3000, 2000, "eg", "tenant", "acme")
	mustOver("no id, cost 500 while frozen", 500, 3500, 2500, "eg", "tenant", "acme")
	if resp, _ := call("eg", 0, "tenant", "acme"); resp.GetOverallCode() != OVER {
		t.Fatalf("request-time check while frozen: %v", resp)
	}

	// With an id and no reservation (the check failed open): recorded
	// under the id; a retry replays.
	mustOver("id, cost 1500 on 1000", 1500, 1500, 500, "egid", "tenant", "beta", "x-request-id", "r-1")
	mustOver("id, cost 1500 retried", 1500, 1500, 500, "egid", "tenant", "beta", "x-request-id", "r-1")
	mustOver("id, cost 200 while frozen", 200, 1700, 700, "egid", "tenant", "beta", "x-request-id", "r-2")
	if _, err := call("egid", 201, "tenant", "beta", "x-request-id", "r-2"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("r-2 again with another cost: %v, want FAILED_PRECONDITION", err)
	}
	r := h.reservation("envoy:r-2/beta/chat/global")
	if r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT || r.GetActualUnits()["tokens"] != 200 ||
		r.GetReservedUnits()["tokens"] != 0 {
		t.Fatalf("r-2's receipt: %v, want SETTLED_WITH_DEBT of 200 holding nothing", r)
	}

	// With an id whose check was a probe (no estimate): the same.
	if resp, _ := call("egprobe", 0, "tenant", "gamma", "x-request-id", "p-1"); resp.GetOverallCode() != OK {
		t.Fatalf("probe: %v", resp)
	}
	mustOver("probe, then cost 1200", 1200, 1200, 200, "egprobe", "tenant", "gamma", "x-request-id", "p-1")
	mustOver("probe, then cost 50 while frozen", 50, 1250, 250, "egprobe", "tenant", "gamma", "x-request-id", "p-2")

	audit, err := h.ledger.Audit(context.Background(), connect.NewRequest(&v1.AuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if d := audit.Msg.GetDiscrepancies(); len(d) != 0 {
		t.Fatalf("audit: %v", d)
	}
}

// TestUnmappedResponseCostCounted: a response cost recorded after the
// fact (settle_on_hits, no reservation) whose descriptor maps to no policy
// or to a unit its policy lacks is answered per unknown_descriptor and
// counted as a refused record, outcome="no_policy" or "unknown_unit", as
// an unmapped check is counted as a refused reserve
// (TestUnmappedDescriptorsCounted): both through one refusal rule.
func TestUnmappedResponseCostCounted(t *testing.T) {
	h := newHarness(t, options{config: egMapping})
	h.publish("acme", "chat", "tokens", 1000, 10, time.Second, false)
	h.publish("units", "chat", "requests", 1000, 10, time.Second, false)
	for _, tenant := range []string{"nobody", "units"} {
		if _, err := h.check(&rlsv3.RateLimitRequest{Domain: "eg", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(40), "tenant", tenant)}}); err != nil {
			t.Fatalf("response cost of %s: %v, want an answer per unknown_descriptor", tenant, err)
		}
	}
	resp, err := http.Get("http://" + h.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`capledger_commands_total{kind="record",outcome="no_policy"} 1`,
		`capledger_commands_total{kind="record",outcome="unknown_unit"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("want %s in:\n%s", want, grepLines(string(body), "commands_total"))
		}
	}
}

// TestSeveralDescriptorsRefusedAndRetried: a request whose descriptors
// a1 and a2 charge one account (acme) and fit, and whose third (global)
// is refused. The answer: a1 and a2 OK, global OVER_LIMIT, and a1 and a2
// report acme's units after the release that follows the refusal (all
// of it), not what each reserve left. Retried with the same id once
// global has room, the answer's codes are the first answer's (not a1 and
// a2 OVER_LIMIT and global OK), global's new hold is released, and the
// remaining units are again those after the release.
func TestSeveralDescriptorsRefusedAndRetried(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	h.publish("global", "chat", "tokens", 400, 100, time.Minute, false)
	if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 200, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "global")}}); resp.GetOverallCode() != OK {
		t.Fatalf("global's 200: %v", resp)
	}
	req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme", "x-request-id", "q-a1"),
		descriptor(hits(200), "tenant", "acme", "x-request-id", "q-a2"),
		descriptor(hits(300), "tenant", "global", "x-request-id", "q-a1")}}
	answer := func(resp *rlsv3.RateLimitResponse) string {
		var b strings.Builder
		fmt.Fprintf(&b, "%v:", resp.GetOverallCode())
		for _, st := range resp.GetStatuses() {
			fmt.Fprintf(&b, " %v/%d", st.GetCode(), st.GetLimitRemaining())
		}
		return b.String()
	}
	if got, want := answer(h.mustCheck(req)), "OVER_LIMIT: OK/1000 OK/1000 OVER_LIMIT/200"; got != want {
		t.Fatalf("first answer %q, want %q", got, want)
	}
	h.clock.Advance(2 * time.Minute) // global refilled to 400: room for 300
	if got, want := answer(h.mustCheck(req)), "OVER_LIMIT: OK/1000 OK/1000 OVER_LIMIT/400"; got != want {
		t.Fatalf("retried answer %q, want %q", got, want)
	}
	if r := h.reservation("envoy:q-a1/global/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_RELEASED {
		t.Fatalf("the retry's hold at global: %v", r)
	}
	if b := h.balance("acme", "chat"); b.Reserved != 0 || b.Available != 1000 {
		t.Fatalf("acme %+v: the refused request keeps nothing", b)
	}
	if b := h.balance("global", "chat"); b.Reserved != 0 || b.Available != 400 {
		t.Fatalf("global %+v: the refused request keeps nothing", b)
	}
}

// A request whose descriptor is an error of the whole call (its id reused
// for another estimate: ALREADY_EXISTS) keeps no capacity of its other
// descriptors either: Envoy refuses it (failure_mode_deny) or lets it
// through without being told of those holds, so it would never settle
// them; they are released, as for a refusal, and a retry answers the same.
func TestSeveralDescriptorsErrorKeepsNothing(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme", "x-request-id", "q-1")}}); resp.GetOverallCode() != OK {
		t.Fatalf("q-1's 100: %v", resp)
	}
	req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(50), "tenant", "acme", "x-request-id", "q-2"),
		descriptor(hits(70), "tenant", "acme", "x-request-id", "q-1")}}
	for attempt := range 2 {
		if _, err := h.check(req); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("attempt %d: %v, want ALREADY_EXISTS (q-1 reused for another estimate)", attempt, err)
		}
		if r := h.reservation("envoy:q-2/acme/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_RELEASED {
			t.Fatalf("attempt %d: the other descriptor's hold: %v, want released", attempt, r)
		}
		if b := h.balance("acme", "chat"); b.Reserved != 100 || b.Available != 900 {
			t.Fatalf("attempt %d: acme %+v, want only q-1's 100 held", attempt, b)
		}
	}
}

// Two descriptors of one request with the same id on one subject, route
// and region but different units would name one reservation twice, with
// two estimates: the second is a reused id (ALREADY_EXISTS) at every
// retry. The request is refused as malformed before the ledger, and
// nothing is held.
func TestOneIDTwoUnitsRefused(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t) + `
      - subject: {key: tenant}
        route: {value: chat}
        unit: requests
        id_key: x-request-id
        match: {generic_key: requests}
`})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	_, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme", "x-request-id", "q-1"),
		descriptor(hits(1), "tenant", "acme", "x-request-id", "q-1", "generic_key", "requests")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "one reservation id") {
		t.Fatalf("tokens and requests under one id: %v, want INVALID_ARGUMENT naming the shared id", err)
	}
	_, err = h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: "envoy:q-1/acme/chat/global"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("the refused request's reservation: %v, want none", err)
	}
}

// TestEveryOverLimitDescriptorNamesItsReset: every OVER_LIMIT status of a
// refilling dimension carries duration_until_reset, never 0. A refusal
// no refill wait helps (an estimate above the policy's maximum, or the
// retry of a refused request, whose refusal is final) left it out when
// the bucket was full, which Envoy reads as 0 (x-ratelimit-reset: 0, "retry
// now"), while RateLimit said t=0: it is the dimension's window, the time
// refills take to fill the burst (RateLimit-Policy's w).
func TestEveryOverLimitDescriptorNamesItsReset(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	h.publish("global", "chat", "tokens", 400, 100, time.Minute, false)
	const window = 4 * time.Minute // 400 at 100 a minute
	check := func(name string, req *rlsv3.RateLimitRequest, wantOver int, want time.Duration) {
		t.Helper()
		resp := h.mustCheck(req)
		over := 0
		for i, st := range resp.GetStatuses() {
			if st.GetCode() != OVER {
				continue
			}
			over++
			got := st.GetDurationUntilReset()
			if got == nil || got.AsDuration() <= 0 {
				t.Errorf("%s: status %d is OVER_LIMIT without a duration_until_reset: %v", name, i, resp)
			} else if want > 0 && got.AsDuration() != want {
				t.Errorf("%s: status %d duration_until_reset %v, want %v", name, i, got.AsDuration(), want)
			}
		}
		if over != wantOver {
			t.Fatalf("%s: %d OVER_LIMIT statuses, want %d: %v", name, over, wantOver, resp)
		}
		// The global tenant's member ("chat-tokens", or "chat-tokens-2"
		// after acme's): the one with its 400 left.
		if got := header(resp, "RateLimit"); want > 0 && !strings.Contains(got, fmt.Sprintf(`";r=400;t=%d`, int(want.Seconds()))) {
			t.Errorf("%s: RateLimit %q, want the global member's t to be %v", name, got, want)
		}
	}
	// Above the maximum reservation (the burst), with the bucket full.
	check("too large", &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme"),
		descriptor(hits(500), "tenant", "global")}}, 1, window)
	check("too large, alone", &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(500), "tenant", "global")}}, 1, window)
	// A request refused, then retried once the refusing limit has room.
	check("global's 200", &rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 200, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "global")}}, 0, 0)
	req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme", "x-request-id", "q-r1"),
		descriptor(hits(300), "tenant", "global", "x-request-id", "q-r1")}}
	check("refused", req, 1, 0)
	h.clock.Advance(2 * time.Minute)
	check("refused, retried", req, 1, window)
}

// TestUnknownDescriptorDenyKeepsNothing: with unknown_descriptor: deny, a
// descriptor that maps to no policy (no rule, or no policy for what it
// names) makes the answer OVER_LIMIT, so Envoy refuses the request; the
// request's other descriptors must then keep nothing (docs/ENVOY.md: a
// request Envoy refuses keeps no capacity), neither a classic check's hits
// nor a hold under a request id, and a retry answers the same. With
// allow the request goes through and its descriptors are charged.
func TestUnknownDescriptorDenyKeepsNothing(t *testing.T) {
	for _, mode := range []string{"deny", "allow"} {
		t.Run(mode, func(t *testing.T) {
			cfg := strings.Replace(testMapping(t), "unknown_descriptor: deny", "unknown_descriptor: "+mode, 1)
			h := newHarness(t, options{config: cfg, auth: true})
			h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
			h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
			want, spent, held := OVER, int64(0), int64(0)
			if mode == "allow" {
				want, spent, held = OK, 4, 300
			}
			classic := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*rlscommon.RateLimitDescriptor{
				descriptor(nil, "tenant", "acme", "route", "search"),
				descriptor(nil, "user", "acme"), // no rule has this key
			}}
			withID := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
				descriptor(hits(300), "tenant", "acme", "x-request-id", "q-u1"),
				descriptor(hits(300), "tenant", "nobody", "x-request-id", "q-u1"), // no policy
			}}
			for attempt := range 2 {
				resp := h.mustCheck(classic)
				if resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCode() != OK || resp.GetStatuses()[1].GetCode() != want {
					t.Fatalf("classic, attempt %d: want overall %v, acme OK; got %v", attempt, want, resp)
				}
				if mode == "deny" && resp.GetStatuses()[0].GetLimitRemaining() != 10 {
					t.Fatalf("classic, attempt %d: acme's limit_remaining %d, want 10 (nothing kept)", attempt, resp.GetStatuses()[0].GetLimitRemaining())
				}
				if resp := h.mustCheck(withID); resp.GetOverallCode() != want || resp.GetStatuses()[0].GetCode() != OK {
					t.Fatalf("with an id, attempt %d: want overall %v, acme OK; got %v", attempt, want, resp)
				}
			}
			if b := h.balance("acme", "search"); b.Spent != spent || b.Reserved != 0 || b.Available != 10-spent {
				t.Fatalf("acme/search %+v: want spent %d of 10, nothing held", b, spent)
			}
			if b := h.balance("acme", "chat"); b.Reserved != held || b.Available != 1000-held {
				t.Fatalf("acme/chat %+v: want %d held", b, held)
			}
		})
	}
}

// TestWaitsThatDoNotFitInADuration: a burst or a debt near ledger.MaxUnits
// refilled one unit an hour takes longer than a Duration holds. The answer
// names the longest wait (ledger.MaxRetryAfter, as the LedgerService's
// Retry-After) everywhere: duration_until_reset, RateLimit's t,
// RateLimit-Policy's w and Retry-After, never a negative or wrapped number
// (they were t=3600000 after the cost, Retry-After -9223372036 on the next
// check, and w=0 for the burst).
func TestWaitsThatDoNotFitInADuration(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	h.publish("big", "search", "requests", int64(ledger.MaxUnits), 1, time.Hour, false)
	longest := int64(ledger.MaxRetryAfter / time.Second)
	wantWait := func(what string, resp *rlsv3.RateLimitResponse, retryAfter bool) {
		t.Helper()
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != OVER || st.GetDurationUntilReset().GetSeconds() != longest {
			t.Fatalf("%s: want OVER_LIMIT with duration_until_reset %ds, got %v", what, longest, resp)
		}
		if got, want := header(resp, "RateLimit"), fmt.Sprintf(`"chat-tokens";r=0;t=%d`, longest); got != want {
			t.Fatalf("%s: RateLimit %q, want %q", what, got, want)
		}
		if got, want := header(resp, "Retry-After"), fmt.Sprint(longest); retryAfter && got != want {
			t.Fatalf("%s: Retry-After %q, want %q", what, got, want)
		}
	}
	// The cost after the stream of a request whose check failed open:
	// recorded in full, nearly all of it debt.
	wantWait("the cost", h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(uint64(ledger.MaxUnits)), "tenant", "acme", "x-request-id", "q-huge", "capledger-phase", "settle")}}), false)
	wantWait("the next check", h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(1), "tenant", "acme", "x-request-id", "q-next")}}), true)

	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "big", "route", "search")}})
	if got, want := header(resp, "RateLimit-Policy"), fmt.Sprintf(`"search-requests";q=%d;w=%d`, ledger.MaxUnits, longest); got != want {
		t.Fatalf("RateLimit-Policy %q, want %q", got, want)
	}
	if got := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); got != time.Hour {
		t.Fatalf("one unit short: duration_until_reset %v, want 1h", got)
	}
}

// TestRequestOverMaxBodyIsResourceExhausted: a request message over the
// server's body limit (serve --max-body, 1 MiB by default) is refused as
// ENVOY.md's failure table says, RESOURCE_EXHAUSTED, and charges nothing.
func TestRequestOverMaxBodyIsResourceExhausted(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("*", "search", "requests", 10, 1, time.Hour, false)
	long := strings.Repeat("t", 20_000) // over the subject bound too: refused either way
	req := &rlsv3.RateLimitRequest{Domain: "api"}
	for i := range 60 {
		req.Descriptors = append(req.Descriptors, descriptor(nil, "tenant", fmt.Sprint(i, long), "route", "search"))
	}
	if size := proto.Size(req); size <= 1<<20 {
		t.Fatalf("request of %d bytes: not over the limit", size)
	}
	if _, err := h.check(req); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("want RESOURCE_EXHAUSTED, got %v", err)
	}
	req.Descriptors = []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "route", "search")}
	if resp := h.mustCheck(req); resp.GetStatuses()[0].GetLimitRemaining() != 9 {
		t.Fatalf("first check after the refused one: %v", resp)
	}
}

// TestCheckOfAClosedIDIsRefused: Envoy checks a request before it runs
// and settles it after its stream, never checks it again after that. A
// check whose id names a reservation already closed, so that it can
// neither replay nor start it, is OVER_LIMIT, charges nothing, has no
// Retry-After, and refuses its request as a whole (the request's other
// descriptors keep nothing) (docs/ENVOY.md, "With an id"):
//   - settled: another request reusing the id (a client sending the
//     x-request-id of an earlier request), which as a replay was admitted
//     and charged nothing, so a client could run any number of requests
//     for the price of one;
//   - expired unstarted (its first check's start never committed and the
//     hold TTL passed, or another request reusing the id): it answered
//     FAILED_PRECONDITION, which Envoy handles by failure_mode_deny. The
//     call after the stream still records the usage.
func TestCheckOfAClosedIDIsRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// close leaves acme's reservation under the request id closed.
		close func(h *harness, requestID string)
		// after runs once the id is refused: what else the request does.
		after func(h *harness, requestID string)
		// wantSpent is acme's spent at the end: nothing held, the rest
		// of 1000 available.
		wantSpent int64
	}{
		{
			name: "settled",
			close: func(h *harness, requestID string) {
				if resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
					descriptor(hits(0), "tenant", "acme", "x-request-id", requestID)}}); resp.GetOverallCode() != OK {
					h.t.Fatalf("check: %v", resp)
				}
				if resp, err := h.streamDone("acme", requestID, 120); err != nil || resp.GetOverallCode() != OK {
					h.t.Fatalf("settle: %v %v", resp, err)
				}
			},
			after:     func(*harness, string) {},
			wantSpent: 120,
		},
		{
			name: "expired",
			close: func(h *harness, requestID string) {
				rid := "envoy:" + requestID + "/acme/chat/global"
				if _, err := h.ledger.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{ReservationId: rid,
					Subject: "acme", Route: "chat", Units: map[string]int64{"tokens": 500}})); err != nil {
					h.t.Fatal(err)
				}
				h.clock.Advance(ledger.DefaultHoldTTL + time.Second)
				for _, kind := range []ledger.Kind{ledger.KindExpireClaim, ledger.KindExpire} {
					if res, err := h.engine.Do(ctx, ledger.Command{Kind: kind, ReservationID: rid, Cause: ledger.CauseHoldExpired}); err != nil || res.Err != nil {
						h.t.Fatalf("%s: %+v %v", kind, res, err)
					}
				}
			},
			after: func(h *harness, requestID string) {
				h.mustCharge("expired, checked again", "acme", requestID, 90, 90)
			},
			wantSpent: 90,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, options{config: testMapping(t), auth: true})
			h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
			h.publish("global", "chat", "tokens", 1000, 1, time.Hour, false)
			const requestID = "q-1"
			tc.close(h, requestID)
			for attempt := range 2 {
				resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
					descriptor(hits(0), "tenant", "acme", "x-request-id", requestID)}})
				if resp.GetOverallCode() != OVER || header(resp, "Retry-After") != "" {
					t.Fatalf("attempt %d: the %s reservation's id again: want OVER_LIMIT without Retry-After, got %v", attempt, tc.name, resp)
				}
			}
			both := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
				descriptor(hits(0), "tenant", "global", "x-request-id", requestID),
				descriptor(hits(0), "tenant", "acme", "x-request-id", requestID)}}
			if resp := h.mustCheck(both); resp.GetOverallCode() != OVER || resp.GetStatuses()[0].GetCode() != OK || resp.GetStatuses()[1].GetCode() != OVER {
				t.Fatalf("with a fresh descriptor: want OK, OVER_LIMIT; got %v", resp)
			}
			if b := h.balance("global", "chat"); b.Reserved != 0 || b.Available != 1000 {
				t.Fatalf("global %+v: the refused request keeps nothing", b)
			}
			tc.after(h, requestID)
			if b := h.balance("acme", "chat"); b.Spent != tc.wantSpent || b.Reserved != 0 || b.Available != 1000-tc.wantSpent {
				t.Fatalf("acme %+v: want only the %d charged spent, nothing held", b, tc.wantSpent)
			}
		})
	}
}

// TestConfigShadowedRule: a rule that an earlier rule of its domain
// matches every descriptor of never maps one (the first match wins); such
// a mapping served, sending every descriptor meant for the second rule
// to the first's unit, until it was refused at load.
func TestConfigShadowedRule(t *testing.T) {
	rules := func(rs ...string) string {
		return "domains: [{name: a, rules: [" + strings.Join(rs, ", ") + "]}]"
	}
	for name, cfg := range map[string]string{
		"the same keys, another unit": rules(
			"{subject: {key: t}, unit: requests}",
			"{subject: {key: t}, unit: tokens}"),
		"general before fixed value": rules(
			"{subject: {key: t}, route: {key: r}, unit: requests}",
			"{subject: {key: t}, match: {r: search}, unit: tokens}"),
		"the same match": rules(
			"{subject: {key: t}, match: {g: x}, unit: requests}",
			"{subject: {key: t}, match: {g: x}, unit: tokens}"),
		"id rule before one without": rules(
			"{subject: {key: t}, id_key: i, phase_key: p, unit: tokens}",
			"{subject: {key: t}, unit: requests}"),
		"later in the list": rules(
			"{subject: {key: t}, match: {g: x}, unit: requests}",
			"{subject: {key: t}, route: {value: chat}, unit: tokens}",
			"{subject: {key: t}, route: {value: other}, unit: requests}"),
	} {
		_, err := envoyrls.ParseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), "never matches") {
			t.Errorf("%s: %v, want the later rule refused as never matching", name, err)
		}
	}
	for name, cfg := range map[string]string{
		"told apart by match": rules(
			"{subject: {key: t}, match: {g: tokens}, unit: tokens}",
			"{subject: {key: t}, match: {g: requests}, unit: requests}"),
		"fixed value before general": rules(
			"{subject: {key: t}, match: {r: search}, unit: tokens}",
			"{subject: {key: t}, route: {key: r}, unit: requests}"),
		"later rule has an id": rules(
			"{subject: {key: t}, unit: requests}",
			"{subject: {key: t}, id_key: i, unit: tokens}"),
		"later rule has a phase": rules(
			"{subject: {key: t}, id_key: i, unit: tokens}",
			"{subject: {key: t}, id_key: i, phase_key: p, unit: tokens}"),
		"subject may be empty": rules(
			"{subject: {key: r}, route: {value: x}, region: {key: t}, unit: u}",
			"{subject: {key: t}, route: {key: r}, unit: u}"),
		"more keys": rules(
			"{subject: {key: t}, unit: requests}",
			"{subject: {key: t}, route: {key: r}, unit: requests}"),
	} {
		if _, err := envoyrls.ParseConfig([]byte(cfg)); err != nil {
			t.Errorf("%s: %v, want accepted (the later rule maps descriptors the earlier does not)", name, err)
		}
	}
}

// TestRefusedAloneRetriedAfresh: a refused reserve leaves nothing, so a
// request whose only descriptor with an id was refused has no released
// reservation to stay refused by: its retry is checked afresh, admitted
// once the limit has room, and settled as any check (docs/ENVOY.md,
// "With an id"). The table of the call after the stream finds such a
// refusal as "none".
func TestRefusedAloneRetriedAfresh(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("solo", "chat", "tokens", 1000, 100, time.Minute, false)
	check := func(id string, n uint64) *rlsv3.RateLimitResponse {
		return h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(n), "tenant", "solo", "x-request-id", id)}})
	}
	if resp := check("a-1", 995); resp.GetOverallCode() != OK {
		t.Fatalf("a-1: %v", resp)
	}
	if resp, err := h.streamDone("solo", "a-1", 995); err != nil || resp.GetOverallCode() != OK {
		t.Fatalf("a-1 stream done: %v %v", resp, err)
	}
	if resp := check("a-2", 10); resp.GetOverallCode() != OVER {
		t.Fatalf("a-2 with 5 free: %v, want OVER_LIMIT", resp)
	}
	if _, err := h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: "envoy:a-2/solo/chat/global"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a-2's reservation after its refusal: %v, want none (NOT_FOUND)", err)
	}
	h.clock.Advance(time.Minute) // 105 free
	for attempt := range 2 {
		if resp := check("a-2", 10); resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 95 {
			t.Fatalf("a-2 retried with room (attempt %d): %v, want OK with 95 remaining", attempt+1, resp)
		}
	}
	if r := h.reservation("envoy:a-2/solo/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_STARTED || r.GetReservedUnits()["tokens"] != 10 {
		t.Fatalf("a-2 after the retry: %v, want STARTED holding 10", r)
	}
	h.mustCharge("a-2", "solo", "a-2", 7, 1002)
}
