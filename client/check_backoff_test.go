package client

import (
	"context"
	"testing"
	"time"
)

// docs/CLIENTS.md, rule 5: a kept receipt of unknown usage whose
// reservation stays unresolved is read less and less often, at most once
// a minute once backed off (checkMaxWait, not the 5 s of a resend). Each
// check that finds it still open draws the next from [wait/2, wait], the
// wait doubling up to a minute.
func TestUnknownReceiptCheckBacksOffToAMinute(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c, err := New(l.addr, WithBreaker(BreakerPolicy{Disabled: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	// The loop's own check of the receipt runs beside this one, on its
	// own resend: this one is checked here, by hand.
	s := &resend{receipt: receipt, check: true, wait: resendFirstWait}
	for i := 0; i < 12; i++ {
		before := time.Now()
		c.checkOne(s)
		after := time.Now()
		if !c.pending.has(receipt.ReservationID) {
			t.Fatalf("check %d dropped the receipt of a reservation still open", i+1)
		}
		// The i-th check waited wait_i = min(100ms * 2^i, 1 min).
		wait := min(resendFirstWait<<i, checkMaxWait)
		if s.next.Before(before.Add(wait/2)) || s.next.After(after.Add(wait)) {
			t.Fatalf("check %d: next in %v, want within [%v, %v]", i+1, s.next.Sub(before), wait/2, wait)
		}
	}
	if s.wait != checkMaxWait || checkMaxWait != time.Minute {
		t.Fatalf("after 12 checks the wait is %v (cap %v), want a minute", s.wait, checkMaxWait)
	}
}
