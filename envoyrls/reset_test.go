package envoyrls_test

import (
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestResetCountsWholeRefills: refills come in whole refill steps, so the
// time until the bucket is full again (duration_until_reset, RateLimit's
// t, RateLimit-Policy's w) counts a partly needed step whole: with 3
// units a minute, 1 missing takes one minute (not 0, "now") and a burst
// of 10 takes four (docs/ENVOY.md, "The answer").
func TestResetCountsWholeRefills(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 10, 3, time.Minute, false)
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search")}})
	st := resp.GetStatuses()[0]
	if st.GetCode() != OK || st.GetLimitRemaining() != 9 {
		t.Fatalf("check: %v", resp)
	}
	if got := st.GetDurationUntilReset().AsDuration(); got != time.Minute {
		t.Errorf("duration_until_reset %v, want 1m0s (one refill of 3 covers the 1 missing)", got)
	}
	if got := header(resp, "RateLimit"); got != `"search-requests";r=9;t=60` {
		t.Errorf("RateLimit %q, want t=60", got)
	}
	if got := header(resp, "RateLimit-Policy"); got != `"search-requests";q=10;w=240` {
		t.Errorf("RateLimit-Policy %q, want w=240 (four refills of 3 fill 10)", got)
	}
}
