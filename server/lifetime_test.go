package server_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

// An account whose lifetime spent reached the bound refuses a reserve
// with FAILED_PRECONDITION and its own reason, which docs/API.md lists.
func TestLifetimeExhaustedIsAFailedPrecondition(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const max = 1 << 53
	h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"tenant-7","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"%d","refillInterval":"1s"}],"holdTtl":"30s"}}`, max, max), "")
	for k := range 32 { // 32 × 2^53 = 2^58, the bound
		id := fmt.Sprintf("full-%d", k)
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-7","route":"chat.generate","units":{"tokens":%d}}`, id, max), "")
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op"}`, id), "")
		h.ok("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op","actualUnits":{"tokens":%d}}`, id, max), "")
		h.clock.Advance(time.Second)
	}
	r := h.call("Reserve", `{"reservationId":"over","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "")
	h.wantError(r, http.StatusBadRequest, "failed_precondition", server.ReasonLifetimeExhausted)
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}
