package envoyrls_test

import (
	"context"
	"strings"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/racingstore"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// A check whose policy key is published on (another replica) before each
// attempt reaches the ledger is refused as stale every time; after the
// last remapping (server.StaleRetries) it fails UNAVAILABLE, saying
// nothing was applied (Envoy applies failure_mode_deny, as for a store
// that cannot answer), its commands counted as unavailable; with another
// descriptor, that one's hold is released. It failed INVALID_ARGUMENT
// with the ledger's refusal, a malformed request. Once the publishes stop,
// the same check is answered.
func TestCheckStaleOnEveryAttemptIsUnavailable(t *testing.T) {
	var racing *racingstore.Store
	h := newHarness(t, options{config: testMapping(t), wrapStore: func(st store.Store) store.Store {
		racing = racingstore.New(st)
		return racing
	}})
	h.publish("acme", "search", "requests", 10, 1, time.Hour, false) // cached as generation 1
	h.publish("calm", "search", "requests", 10, 1, time.Hour, false)
	burst := int64(10)
	publish := func() {
		burst++
		p, err := server.PolicyFromProto(&v1.Policy{Subject: "acme", Route: "search", Dimensions: []*v1.Dimension{{
			Unit: "requests", Burst: burst, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour)}}})
		if err != nil {
			t.Error(err)
			return
		}
		if res, err := h.engine.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
			t.Errorf("publish: %+v %v", res, err)
		}
	}
	raced := descriptor(nil, "tenant", "acme", "route", "search")
	wantUnavailable := func(err error) {
		t.Helper()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("raced check: %v, want UNAVAILABLE", err)
		}
		for _, says := range []string{"not applied", "the deciding policy generation changed while the call ran", "retry with the same ids"} {
			if !strings.Contains(status.Convert(err).Message(), says) {
				t.Fatalf("raced check's message %q does not say %q", status.Convert(err).Message(), says)
			}
		}
	}

	racing.Arm(publish)
	before := h.commandCounts()
	_, err := h.check(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{raced}})
	if n := racing.Disarm(); n != server.StaleRetries {
		t.Fatalf("%d publishes raced the check's remappings, want %d (one per remapping)", n, server.StaleRetries)
	}
	wantUnavailable(err)
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 1})

	// Two descriptors: the raced one fails the check, the other's hold is
	// released.
	racing.Arm(publish)
	before = h.commandCounts()
	_, err = h.check(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		raced, descriptor(nil, "tenant", "calm", "route", "search")}})
	racing.Disarm()
	wantUnavailable(err)
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 2, "release/unavailable": 1})
	if b := h.balance("calm", "search"); b.Reserved != 0 || b.Spent != 0 || b.Available != 10 {
		t.Fatalf("the other descriptor's balance after the failed check: %+v, want its hold released", b)
	}

	// The same check once the publishes stopped: admitted under the
	// newest generation (its burst, less the hit).
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{raced}})
	if resp.GetOverallCode() != OK || int64(resp.GetStatuses()[0].GetLimitRemaining()) != burst-1 {
		t.Fatalf("check after the publishes stopped: %v, want OK with %d remaining", resp, burst-1)
	}
}
