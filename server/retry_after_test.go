package server_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

// The issue 13 scenario: burst 100, maxReservation 80, refill 5/s and a
// hold of 70 outstanding. A reserve of 50 can fit only once the hold ends
// (burst caps available + reserved), so the 429 carries no Retry-After and
// says why; once the hold is settled, the Retry-After given is kept: the
// same request retried after it fits.
func TestRetryAfterOnlyWhenWaitingHelps(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"t","route":"chat","holdTtl":"3600s",
	  "dimensions":[{"unit":"tokens","burst":"100","maxReservation":"80","refillUnits":"5","refillInterval":"1s"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"h3","subject":"t","route":"chat","units":{"tokens":70}}`, "")
	probe := `{"reservationId":"p","subject":"t","route":"chat","units":{"tokens":50}}`
	for i := 0; i < 3; i++ {
		r := h.call("Reserve", probe, "")
		h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonInsufficientCapacity)
		if got := r.header.Get("Retry-After"); got != "" {
			t.Fatalf("Retry-After %q while only the hold ending can make room", got)
		}
		if !strings.Contains(r.body["message"].(string), "only outstanding holds ending can make room") {
			t.Fatalf("the rejection does not say why there is no Retry-After: %s", r.raw)
		}
		for _, d := range details(t, r) {
			if rej, ok := d.(*v1.RejectionDetail); ok && rej.GetRetryAfter() != nil {
				t.Fatalf("detail retryAfter %v without a header", rej.GetRetryAfter())
			}
		}
		h.clock.Advance(4300 * time.Millisecond)
	}
	h.ok("Start", `{"reservationId":"h3","operationId":"op"}`, "")
	h.ok("Settle", `{"reservationId":"h3","operationId":"op","actualUnits":{"tokens":70}}`, "")
	r := h.call("Reserve", probe, "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonInsufficientCapacity)
	seconds, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || seconds < 1 {
		t.Fatalf("Retry-After %q once refill can make room", r.header.Get("Retry-After"))
	}
	h.clock.Advance(time.Duration(seconds) * time.Second)
	h.ok("Reserve", probe, "")
}

// A frozen rejection names the dimension, never the owed amount (CLIENTS.md:
// capacity rejections never reveal balances; the debt is for GetAccount).
func TestFrozenRejectionRevealsNoBalance(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("a", 100), "")
	h.ok("Start", `{"reservationId":"a","operationId":"op"}`, "")
	h.ok("Settle", `{"reservationId":"a","operationId":"op","actualUnits":{"tokens":1180,"requests":1}}`, "") // 900 from available, 180 owed
	r := h.call("Reserve", reserveBody("b", 1), "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonAdmissionFrozen)
	for _, leak := range []string{"180", "owed", "1180"} {
		if strings.Contains(string(r.raw), leak) {
			t.Fatalf("frozen rejection reveals %q: %s", leak, r.raw)
		}
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	if num(acct["accounts"].([]any)[0].(map[string]any)["balances"].([]any)[0].(map[string]any)["debt"]) != 180 {
		t.Fatalf("GetAccount does not show the debt: %v", acct)
	}
}

// A debt refills would take centuries to repay (a cost recorded after the
// fact near ledger.MaxUnits, repaid one token an hour) makes the ledger
// answer its longest wait, ledger.MaxRetryAfter; the Retry-After header
// and the detail say that many seconds, not a negative number (rounding
// it up to whole seconds overflowed: Retry-After -9223372036).
func TestRetryAfterOfAnUnpayableDebtIsTheLongestWait(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"t","route":"chat",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"3600s"}]}}`, "")
	h.ok("RecordUsage", `{"reservationId":"huge","operationId":"op-huge","subject":"t","route":"chat","actualUnits":{"tokens":9007199254740992}}`, "")
	r := h.call("Reserve", `{"reservationId":"after","subject":"t","route":"chat","units":{"tokens":1}}`, "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonAdmissionFrozen)
	want := strconv.FormatInt(int64(ledger.MaxRetryAfter/time.Second), 10)
	if got := r.header.Get("Retry-After"); got != want {
		t.Fatalf("Retry-After %q, want %s (ledger.MaxRetryAfter)", got, want)
	}
	for _, d := range details(t, r) {
		if rej, ok := d.(*v1.RejectionDetail); ok && rej.GetRetryAfter().AsDuration() != ledger.MaxRetryAfter {
			t.Fatalf("detail retryAfter %v, want %v", rej.GetRetryAfter().AsDuration(), ledger.MaxRetryAfter)
		}
	}
}

// RetryAfterSeconds rounds up to whole seconds, and every wait in the
// last second below ledger.MaxRetryAfter rounds up to it: adding almost a
// second first overflowed there into a negative wait (Envoy's reset
// seconds and windows use it with waits not rounded by the ledger).
func TestRetryAfterSecondsJustBelowTheLongestWait(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{
		time.Nanosecond:                             time.Second,
		1500 * time.Millisecond:                     2 * time.Second,
		ledger.MaxRetryAfter - time.Second:          ledger.MaxRetryAfter - time.Second,
		ledger.MaxRetryAfter - time.Second + 1:      ledger.MaxRetryAfter,
		ledger.MaxRetryAfter - 100*time.Millisecond: ledger.MaxRetryAfter,
		ledger.MaxRetryAfter:                        ledger.MaxRetryAfter,
		time.Duration(1<<63 - 1):                    ledger.MaxRetryAfter,
	} {
		if got := server.RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %v, want %v", d, got, want)
		}
	}
}
