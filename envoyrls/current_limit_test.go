package envoyrls_test

import (
	"fmt"
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
