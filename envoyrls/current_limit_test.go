package envoyrls_test

import (
	"fmt"
	"math"
	"math/big"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestCurrentLimitNeverClaimsMore: a status's current_limit is the
// policy's refill over the shortest of Envoy's units that holds a refill
// interval, rounded down, so that a client pacing itself by it never sends
// more than the policy refills (docs/ENVOY.md, "The answer").
func TestCurrentLimitNeverClaimsMore(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	unitLength := map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
		rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
		rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
		rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
		rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
		rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
		rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
	}
	for i, tc := range []struct {
		refill   int64
		every    time.Duration
		wantUnit rlsv3.RateLimitResponse_RateLimit_Unit
		want     uint32
	}{
		{1, 2 * time.Second, rlsv3.RateLimitResponse_RateLimit_MINUTE, 30},
		{1, 7 * time.Second, rlsv3.RateLimitResponse_RateLimit_MINUTE, 8}, // 8.57 per minute
		{3, time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 3},
		// 1.5 per day, rounded down.
		{1, 16 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 1},
		{1, 48 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK, 3}, // not 0 per DAY
		{1, 400 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR, 0},
		// 999999998.999999999 per second, which floating point rounds up
		// to 999999999.
		{999_999_998, 999_999_999 * time.Nanosecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 999_999_998},
	} {
		tenant := fmt.Sprintf("tenant-%d", i)
		h.publish(tenant, "search", "requests", 1000, tc.refill, tc.every, false)
		resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(nil, "tenant", tenant, "route", "search")}})
		limit := resp.GetStatuses()[0].GetCurrentLimit()
		if limit.GetUnit() != tc.wantUnit || limit.GetRequestsPerUnit() != tc.want {
			t.Errorf("%d per %s: current_limit %d per %s, want %d per %s", tc.refill, tc.every,
				limit.GetRequestsPerUnit(), limit.GetUnit(), tc.want, tc.wantUnit)
		}
		// Whatever the unit: claimed/unit <= refill/every, exactly.
		claimed := new(big.Rat).SetFrac(big.NewInt(int64(limit.GetRequestsPerUnit())), big.NewInt(int64(unitLength[limit.GetUnit()])))
		if real := new(big.Rat).SetFrac(big.NewInt(tc.refill), big.NewInt(int64(tc.every))); claimed.Cmp(real) > 0 {
			t.Errorf("%d per %s: current_limit %d per %s claims more than the policy refills", tc.refill, tc.every,
				limit.GetRequestsPerUnit(), limit.GetUnit())
		}
	}
}

// TestCountsBeyond32Bits: Envoy's limit_remaining and requests_per_unit
// are 32-bit; a budget beyond 4294967295 (billions of tokens) reports
// 4294967295 there, never a wrapped-around small number, and the
// RateLimit header's r carries the exact remaining (docs/ENVOY.md, "The
// answer").
func TestCountsBeyond32Bits(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	const burst = 1<<40 + 10
	h.publish("huge", "search", "requests", burst, 10_000_000_000, time.Second, false)
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "huge", "route", "search")}})
	st := resp.GetStatuses()[0]
	if st.GetCode() != OK || st.GetLimitRemaining() != math.MaxUint32 {
		t.Fatalf("one hit of %d: %v, want OK with limit_remaining %d", burst, st, uint32(math.MaxUint32))
	}
	if limit := st.GetCurrentLimit(); limit.GetRequestsPerUnit() != math.MaxUint32 || limit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Fatalf("10^10 per second: current_limit %v, want %d per SECOND", limit, uint32(math.MaxUint32))
	}
	if got, want := header(resp, "RateLimit"), fmt.Sprintf(`"search-requests";r=%d;t=1`, burst-1); got != want {
		t.Fatalf("RateLimit header %q, want %q", got, want)
	}
}
