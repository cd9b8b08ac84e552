package envoyrls_test

import (
	"strings"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestRateLimitNamesOneLimitEach: in one answer a name stands for one
// limit (docs/ENVOY.md, "The answer"). Two tenants on the same route and
// unit are two limits, "search-requests" and "search-requests-2", in the
// statuses and in both headers; a third descriptor on the first tenant's
// limit takes its name, and the limit is listed once.
func TestRateLimitNamesOneLimitEach(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t)})
	h.publish("acme", "search", "requests", 10, 1, time.Second, false)
	h.publish("beta", "search", "requests", 20, 1, time.Second, false)
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search"),
		descriptor(nil, "tenant", "beta", "route", "search"),
		descriptor(nil, "tenant", "acme", "route", "search"),
	}})
	if resp.GetOverallCode() != OK {
		t.Fatalf("check: %v", resp)
	}
	var names []string
	for _, st := range resp.GetStatuses() {
		names = append(names, st.GetCurrentLimit().GetName())
	}
	if got := strings.Join(names, " "); got != "search-requests search-requests-2 search-requests" {
		t.Errorf("status names %q, want search-requests search-requests-2 search-requests", got)
	}
	if got, want := header(resp, "RateLimit-Policy"), `"search-requests";q=10;w=10, "search-requests-2";q=20;w=20`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	// acme's two checks took 2 of its 10; the member says what is left.
	if got, want := header(resp, "RateLimit"), `"search-requests";r=8;t=2, "search-requests-2";r=19;t=1`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}

	// Two descriptors on one limit, the first refused (7 of the 4 gamma
	// has left: 3 s until they fit), the second admitted and released
	// with it (4 left: 6 s until the burst): the one member says the
	// longer reset.
	h.publish("gamma", "search", "requests", 10, 1, time.Second, false)
	h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(6), "tenant", "gamma", "route", "search")}})
	resp = h.mustCheck(&rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(7), "tenant", "gamma", "route", "search"),
		descriptor(hits(1), "tenant", "gamma", "route", "search"),
	}})
	if resp.GetOverallCode() != OVER {
		t.Fatalf("check of 7 and 1 of 4: %v", resp)
	}
	if got, want := header(resp, "RateLimit"), `"search-requests";r=4;t=6`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}
