package client

import (
	"context"
	"testing"
)

// docs/CLIENTS.md: a refusal of a resent settle that is not final
// (invalid_argument: a unit the policy does not have) ends the resends
// and leaves the receipt in PendingUnknown for the caller; nothing is
// reported refused, and ResolveUnknown with a usage the ledger takes
// then settles it.
func TestResentSettleRefusedAsInvalidStaysForTheCaller(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var refused refusals
	c := l.viaProxy(t, append(resendTestOptions, refused.option())...)
	receipt := runWithSettleUnsent(t, l, c, Units{"tokens": 40, "pixels": 1})
	l.proxy.SetFaults(faultsNone)
	waitResendsDone(c)
	// The resend was refused: the reservation is still STARTED.
	if got, err := l.direct.GetReservation(context.Background(), receipt.ReservationID); err != nil || isSettled(got.GetState()) {
		t.Fatalf("reservation %v %v, want it still started", got, err)
	}
	if p := c.PendingUnknown(); len(p) != 1 || p[0].ReservationID != receipt.ReservationID {
		t.Fatalf("pending after the ledger refused the usage: %+v, want the receipt kept", p)
	}
	if n, got := c.PendingRefused(), len(refused.errs); n != 0 || got != 0 {
		t.Fatalf("refused %d reported %d, want none: invalid_argument is not final", n, got)
	}
	if _, err := c.ResolveUnknown(context.Background(), receipt, Units{"tokens": 40, "requests": 0}); err != nil {
		t.Fatal(err)
	}
	if got := waitSettled(t, l.direct, receipt.ReservationID); got.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("reservation %v, want 40 tokens settled", got)
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after the settle: %+v", p)
	}
}
