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
// fillLifetime publishes tenant-7's policy with a burst of 2^53 tokens
// (rollout "" or "shadow") and spends the account's lifetime bound:
// 32 × 2^53 = 2^58.
func (h *harness) fillLifetime(rollout string) {
	h.t.Helper()
	const max = 1 << 53
	mode := ""
	if rollout != "" {
		mode = fmt.Sprintf(`,"rollout":%q`, rollout)
	}
	h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"tenant-7","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"%d","refillInterval":"1s"}],"holdTtl":"30s"%s}}`, max, max, mode), "")
	for k := range 32 {
		id := fmt.Sprintf("full-%d", k)
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-7","route":"chat.generate","units":{"tokens":%d}}`, id, max), "")
		h.ok("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op"}`, id), "")
		h.ok("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op","actualUnits":{"tokens":%d}}`, id, max), "")
		h.clock.Advance(time.Second)
	}
}

func TestLifetimeExhaustedIsAFailedPrecondition(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.fillLifetime("")
	r := h.call("Reserve", `{"reservationId":"over","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "")
	h.wantError(r, http.StatusBadRequest, "failed_precondition", server.ReasonLifetimeExhausted)
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}

// In shadow mode the refusal is a 200 with shadowRejected, like a capacity
// rejection: shadow mode never stops a gateway.
func TestLifetimeExhaustedInShadowMode(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.fillLifetime("ROLLOUT_MODE_SHADOW")
	got := h.ok("Reserve", `{"reservationId":"over","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "")
	if got["shadowRejected"] != true || field(got, "shadowRejection", "reason") != server.ReasonLifetimeExhausted ||
		field(got, "shadowRejection", "limitingDimension") != "tokens" || got["reservation"] != nil {
		t.Fatalf("shadow reserve on a full account: %v", got)
	}
}
