package envoyrls_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// metricSamples scrapes the samples of one metric from the server's
// /metrics over its socket: each sample's labels (the text between the
// braces) and value.
func (h *harness) metricSamples(name string) map[string]float64 {
	h.t.Helper()
	resp, err := http.Get("http://" + h.addr + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	samples := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			h.t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[labels] = v
	}
	return samples
}

// commandCounts reads capledger_commands_total by "kind/outcome".
func (h *harness) commandCounts() map[string]float64 {
	h.t.Helper()
	counts := map[string]float64{}
	for labels, v := range h.metricSamples("capledger_commands_total") {
		kind, rest, _ := strings.Cut(strings.TrimPrefix(labels, `kind="`), `",outcome="`)
		counts[kind+"/"+strings.TrimSuffix(rest, `"`)] = v
	}
	return counts
}

// wantCounted fails unless capledger_commands_total grew from before by
// exactly want (kind/outcome -> delta), and by nothing else.
func (h *harness) wantCounted(before, want map[string]float64) {
	h.t.Helper()
	got := map[string]float64{}
	for key, v := range h.commandCounts() {
		if d := v - before[key]; d != 0 {
			got[key] = d
		}
	}
	if !maps.Equal(got, want) {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(got)) {
			parts = append(parts, fmt.Sprintf("%s +%g", k, got[k]))
		}
		h.t.Errorf("capledger_commands_total grew by [%s], want %v", strings.Join(parts, ", "), want)
	}
}

// A check that fails because the store cannot commit answers UNAVAILABLE,
// and each of its descriptors counts once as unavailable: the one that
// matches no rule too, which was counted no_policy before the call could
// fail (Envoy saw no descriptor's answer, and checks it again).
func TestFailedCheckCountsEachDescriptorUnavailable(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), faults: true})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search"), descriptor(nil, "user", "acme")}}

	h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
	before := h.commandCounts()
	if _, err := h.check(req); status.Code(err) != codes.Unavailable {
		t.Fatalf("check with the store failing: %v, want UNAVAILABLE", err)
	}
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 2})

	h.faults.FailCommits(nil)
	before = h.commandCounts()
	// Under unknown_descriptor: deny the descriptor without a policy
	// refuses the request, so the tenant's reserve is released.
	if resp := h.mustCheck(req); resp.GetOverallCode() != OVER {
		t.Fatalf("check with a descriptor of no policy under deny: %v, want OVER_LIMIT", resp)
	}
	h.wantCounted(before, map[string]float64{"reserve/ok": 1, "release/ok": 1, "reserve/no_policy": 1})
}

// A check mapped by a generation that no longer decides (another replica
// published a new one) is refused as stale by the ledger, mapped again
// and run again: Envoy sees the second answer only, and each command
// counts once. The stale reserve was counted too, as invalid_command.
func TestStaleCheckCountsOnce(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false) // cached as generation 1
	p, err := server.PolicyFromProto(&v1.Policy{Subject: "acme", Route: "search", Dimensions: []*v1.Dimension{{
		Unit: "requests", Burst: 20, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour)}}})
	if err != nil {
		t.Fatal(err)
	}
	// Published past this server, as by another replica.
	if res, err := h.engine.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil || res.Generation != 2 {
		t.Fatalf("publish generation 2: %+v %v", res, err)
	}
	before := h.commandCounts()
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}})
	if resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetLimitRemaining() != 19 {
		t.Fatalf("check after the switch: %v", resp)
	}
	h.wantCounted(before, map[string]float64{"reserve/ok": 1, "start/ok": 1, "settle/ok": 1})
}

// rejectionTotal sums capledger_rejections_total over every label.
func (h *harness) rejectionTotal() float64 {
	h.t.Helper()
	total := 0.0
	for _, v := range h.metricSamples("capledger_rejections_total") {
		total += v
	}
	return total
}

// A descriptor refused for capacity in a check that then fails as a whole
// (another descriptor reuses an id with another estimate: ALREADY_EXISTS)
// is no rejection Envoy saw: capledger_rejections_total counts it only
// with an answer that carries it.
func TestRejectionOfAFailedCheckIsNotCounted(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "beta", "x-request-id", "r-9")}})

	before := h.rejectionTotal()
	_, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(5000), "tenant", "huge", "x-request-id", "r-9"), descriptor(hits(200), "tenant", "beta", "x-request-id", "r-9")}})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("check with a refused descriptor and a reused id: %v, want ALREADY_EXISTS", err)
	}
	if got := h.rejectionTotal(); got != before {
		t.Fatalf("capledger_rejections_total grew by %g for a check that answered an error, want 0", got-before)
	}

	// The same refusal answered as OVER_LIMIT counts once.
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(5000), "tenant", "huge", "x-request-id", "r-10")}})
	if resp.GetOverallCode() != OVER {
		t.Fatalf("check over the burst: %v, want OVER_LIMIT", resp)
	}
	if got := h.rejectionTotal(); got != before+1 {
		t.Fatalf("capledger_rejections_total grew by %g for an OVER_LIMIT answer, want 1", got-before)
	}
}

// A check of several descriptors whose caller's deadline (Envoy's
// timeout, sent as grpc-timeout) passes while its commands commit runs
// them to the end (TestSeveralDescriptorsPastTheDeadlineKeepNoHold), but
// the caller saw DEADLINE_EXCEEDED: its commands count as unavailable
// (docs/OPERATIONS.md, "Envoy's rate limit service"), not as the answer
// nobody read. They counted ok, so a dashboard showed no failed checks
// while Envoy failed every one of them open.
func TestCheckPastTheDeadlineCountsUnavailable(t *testing.T) {
	// Every commit outlasts the deadline many times over: the call fails
	// at its deadline, its reserves commit after it.
	h := slowHarness(t, 10, 300*time.Millisecond)
	before := h.commandCounts()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+gatewayToken), 50*time.Millisecond)
	defer cancel()
	_, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search"), descriptor(nil, "tenant", "global", "route", "search")}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("check slower than its deadline: %v, want DEADLINE_EXCEEDED", err)
	}
	// The server finishes the commands after the caller left: wait until
	// they are counted.
	for end := time.Now().Add(10 * time.Second); ; {
		counts := h.commandCounts()
		total := 0.0
		for key, v := range counts {
			total += v - before[key]
		}
		if total >= 6 || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 2, "start/unavailable": 2, "settle/unavailable": 2})
	if acme, global := h.balance("acme", "search"), h.balance("global", "search"); acme.Spent != 1 || global.Spent != 1 {
		t.Fatalf("after the late check: acme %+v, global %+v, want both charged 1 (the commands ran)", acme, global)
	}
}

// Every malformed check (docs/ENVOY.md, "Answers") is refused whole with
// INVALID_ARGUMENT and counted once, as a reserve refused
// invalid_command, whichever check refused it: the adapter's own (no
// descriptors, too many, negative or too many hits, an id the ledger
// refuses) or the server's command checks it shares (a NUL byte in a
// subject), and whatever else its descriptors held (one matching no rule
// here, not counted no_policy).
func TestMalformedCheckCountsOnceAsInvalidCommand(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false)
	d := descriptor(nil, "tenant", "acme", "route", "search")
	neg := descriptor(nil, "tenant", "acme", "route", "search")
	neg.IsNegativeHits = true
	unmapped := descriptor(nil, "user", "acme")
	many := make([]*rlscommon.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = d
	}
	for _, c := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}},
		{"65 descriptors", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}},
		{"negative hits", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{unmapped, neg}}},
		{"hits over 2^53", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{unmapped, descriptor(hits(1<<60), "tenant", "acme", "route", "search")}}},
		{"a NUL byte in a request id", &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "acme", "x-request-id", "r\x001")}}},
		{"a NUL byte in a subject", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{descriptor(nil, "tenant", "ac\x00me", "route", "search")}}},
	} {
		before := h.commandCounts()
		_, err := h.check(c.req)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: %v, want INVALID_ARGUMENT", c.name, err)
		}
		if reason := grpcReason(err); reason != server.ReasonInvalidCommand {
			t.Errorf("%s: reason %q, want %s", c.name, reason, server.ReasonInvalidCommand)
		}
		t.Run(c.name, func(t *testing.T) {
			h := *h
			h.t = t
			h.wantCounted(before, map[string]float64{"reserve/invalid_command": 1})
		})
	}
}

// grpcReason is the reason of err's capledger ErrorDetail, "" without one.
func grpcReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if detail, ok := d.(*v1.ErrorDetail); ok {
			return detail.GetReason()
		}
	}
	return ""
}
