package client

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// CLIENTS.md section 4, rule 3: an unavailable answer's Retry-After is
// waited for bounded by the backoff cap. A proxy's 503 asking for an
// hour does not hold the call for an hour: the repeat comes after the
// cap and the reserve is admitted well within the caller's deadline.
func TestUnavailableRetryAfterIsBoundedByTheCap(t *testing.T) {
	addr := startLedgerProcess(t, t.TempDir())
	direct, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	publishTenantPolicy(t, direct, false)
	in, inAddr := startIntermediary(t, addr)
	c, err := New(inAddr, noBreakerWatchdog, WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: 300 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	in.answerNext("3600", http.StatusServiceUnavailable)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil {
		t.Fatalf("reserve after a 503 with Retry-After: 3600: %v (the repeat must come after the 300ms cap)", err)
	}
	if res.Attempts != 2 {
		t.Errorf("attempts %d, want 2", res.Attempts)
	}
	// ResolveReservation with no digest skips the digest check (its
	// documented contract): it finds the reservation just admitted.
	got, err := c.ResolveReservation(ctx, res.ReservationID, "")
	if err != nil || got.GetReservationId() != res.ReservationID {
		t.Fatalf("ResolveReservation(%s, \"\"): %v, %v", res.ReservationID, got, err)
	}
}
