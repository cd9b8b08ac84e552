package client

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// However many receipts of unknown usage are kept, the background checks
// of all of them together send at most resendParallel reads per
// resendFirstWait (docs/CLIENTS.md, rule 5): 300 kept receipts whose
// reads all fail at once (503) are read about 80 times a second, not each
// on its own back-off (hundreds in the first second). An upper bound over
// the time measured: a slow machine reads less, never more.
func TestUnknownReceiptChecksAreBoundedTogether(t *testing.T) {
	var mu sync.Mutex
	var reads []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == getCall {
			mu.Lock()
			reads = append(reads, time.Now())
			mu.Unlock()
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, WithBreaker(BreakerPolicy{Disabled: true}), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	const kept = 300
	for i := range kept {
		c.keepPending(OperationReceipt{ReservationID: fmt.Sprintf("r-%03d", i), OperationID: fmt.Sprintf("op-%03d", i)})
	}
	for {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		n := len(reads)
		var first, last time.Time
		if n > 0 {
			first, last = reads[0], reads[n-1]
		}
		mu.Unlock()
		if n == 0 || last.Sub(first) < time.Second {
			continue
		}
		// A round begins at most resendFirstWait after the one before; one
		// round more for the first read coming after its round began.
		rounds := int(last.Sub(first)/resendFirstWait) + 2
		if limit := resendParallel * rounds; n > limit {
			t.Fatalf("%d reads of %d kept receipts in %v, want at most %d (%d per %v)", n, kept, last.Sub(first), limit, resendParallel, resendFirstWait)
		}
		return
	}
}
