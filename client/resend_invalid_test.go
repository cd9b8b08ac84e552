package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// docs/CLIENTS.md: a refusal of a resent settle that is not final
// (invalid_argument: a unit the policy does not have) ends the resends
// and leaves the receipt in PendingUnknown for the caller; nothing is
// reported refused, and ResolveUnknown with a usage the ledger takes
// then settles it. The receipt is read meanwhile (a check), never
// resent.
func TestResentSettleRefusedAsInvalidStaysForTheCaller(t *testing.T) {
	l, c, refused, receipt := resendRefusedAsInvalid(t)
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

// resendRefusedAsInvalid runs a reservation of tenant-7 through a client
// that could not send its settle (runWithSettleUnsent), with usage in a
// unit the policy lacks (pixels), then heals the proxy: the ledger
// refuses the resend as invalid_argument. It returns once the client
// reads the kept receipt instead (waitChecking), with the refusals the
// client reports.
func resendRefusedAsInvalid(t *testing.T) (*testLedger, *Client, *refusals, OperationReceipt) {
	t.Helper()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	refused := &refusals{}
	c := l.viaProxy(t, append(resendTestOptions, refused.option())...)
	receipt := runWithSettleUnsent(t, l, c, Units{"tokens": 40, "pixels": 1})
	l.proxy.SetFaults(faultsNone)
	waitChecking(t, c, receipt.ReservationID)
	return l, c, refused, receipt
}

// waitChecking waits until the loop reads the kept receipt of id rather
// than resending it (its resend was refused, not for good).
func waitChecking(t *testing.T, c *Client, id string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		c.lookups.mu.Lock()
		s := c.resends.due[id]
		checking := s != nil && s.check
		c.lookups.mu.Unlock()
		if checking {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("receipt %s: no check after its resend was refused", id)
		}
	}
}

// docs/CLIENTS.md: a receipt whose resent settle the ledger refused, not
// for good, is read from then on as one of unknown usage: once an
// operator settles its reservation, it leaves PendingUnknown on its own,
// reported once (ErrReceiptRefused, ErrAlreadySettled, the operator's
// usage), and the loop ends.
func TestResentSettleRefusedAsInvalidLeavesOnceTheLedgerEndsIt(t *testing.T) {
	l, c, refused, receipt := resendRefusedAsInvalid(t)
	if _, err := l.direct.Settle(context.Background(), receipt.ReservationID, receipt.OperationID, Units{"tokens": 55, "requests": 0}); err != nil {
		t.Fatal(err)
	}
	waitNotPending(t, c, receipt.ReservationID)
	waitResendsDone(c)
	got, errs := refused.get()
	if c.PendingRefused() != 1 || len(got) != 1 || got[0].ReservationID != receipt.ReservationID {
		t.Fatalf("refused %d %+v, want the receipt once", c.PendingRefused(), got)
	}
	le := mustErrAs[*LedgerError](t, errs[0])
	if !errors.Is(errs[0], ErrReceiptRefused) || !errors.Is(errs[0], ErrAlreadySettled) || le.Reservation.GetActualUnits()["tokens"] != 55 {
		t.Fatalf("reported %v (recorded %v), want ErrAlreadySettled and 55 tokens", errs[0], le.Reservation.GetActualUnits())
	}
}
