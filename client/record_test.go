package client

import (
	"context"
	"errors"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// TestRecordUsageLostAnswerChargesOnce: a record whose answer is lost is
// retried with the same ids and replays: the usage is charged once, also
// when it goes beyond what is free (debt) and the account is frozen. The
// same id with other usage is ErrAlreadySettled.
func TestRecordUsageLostAnswerChargesOnce(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1000, maxOverdraft: 10_000})
	c := l.viaProxy(t, WithTimeout(2*time.Second))
	ctx := context.Background()
	req := RecordUsageRequest{Subject: "tenant-7", Route: "chat.generate", Actual: Units{"tokens": 1500}}
	l.proxy.DropNextResponses(1)
	res, err := c.RecordUsage(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Replayed || res.OperationID != res.ReservationID || res.Generation == 0 ||
		res.Reservation.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT ||
		res.Reservation.GetOverdraftUnits()["tokens"] != 500 {
		t.Fatalf("after a lost answer: %+v, want the retry to replay a SETTLED_WITH_DEBT record with 500 of debt", res)
	}
	if st := l.proxy.Stats(); st.DroppedResponses != 1 {
		t.Fatalf("proxy stats %+v: the fault did not happen", st)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetSpent() != 1500 || b.GetDebt() != 500 {
		t.Fatalf("balance %v, want 1500 spent once, 500 owed", b)
	}
	// Frozen: still recorded.
	frozen, err := c.RecordUsage(ctx, RecordUsageRequest{ReservationID: "late-1", Subject: "tenant-7", Route: "chat.generate", Actual: Units{"tokens": 20}})
	if err != nil || frozen.Replayed || frozen.Reservation.GetOverdraftUnits()["tokens"] != 20 {
		t.Fatalf("record while frozen: %+v, %v", frozen, err)
	}
	_, err = c.RecordUsage(ctx, RecordUsageRequest{ReservationID: "late-1", Subject: "tenant-7", Route: "chat.generate", Actual: Units{"tokens": 21}})
	if !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("same id, other usage: %v, want ErrAlreadySettled", err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetSpent() != 1520 || b.GetDebt() != 520 {
		t.Fatalf("balance %v, want 1520 spent, 520 owed", b)
	}
	l.audit(t)
}
