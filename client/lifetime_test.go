package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// fillLifetime publishes tenant-7's policy (burst and refill 2^53 per
// millisecond) and runs n lifecycles of the whole burst on it.
func fillLifetime(t *testing.T, tl *testLedger, n int) {
	t.Helper()
	ctx := context.Background()
	const max = 1 << 53
	if _, _, err := tl.direct.PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate",
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: max, RefillUnits: max, RefillInterval: durationpb.New(time.Millisecond)}},
		HoldTtl:    durationpb.New(time.Minute),
	}); err != nil {
		t.Fatal(err)
	}
	for range n {
		r, err := tl.direct.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": max}})
		if err != nil {
			t.Fatal(err)
		}
		op := NewOperationID()
		if _, err := tl.direct.Start(ctx, r.ReservationID, op); err != nil {
			t.Fatal(err)
		}
		if _, err := tl.direct.Settle(ctx, r.ReservationID, op, Units{"tokens": max}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond) // a refill interval: the burst is back
	}
}

// A reserve on an account whose lifetime spent reached the bound (32
// lifecycles of 2^53 tokens) is a *LedgerError matching
// ErrLifetimeExhausted, and not a capacity rejection.
func TestLifetimeExhaustedSentinel(t *testing.T) {
	tl := startLedger(t)
	fillLifetime(t, tl, 32)
	_, err := tl.direct.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}})
	var le *LedgerError
	var rej *RejectedError
	if !errors.Is(err, ErrLifetimeExhausted) || !errors.As(err, &le) || errors.As(err, &rej) {
		t.Fatalf("reserve on a full account: %v (%T)", err, err)
	}
}

// When the ledger refuses to record the usage Run reports (it would pass
// the account's lifetime bound), Run marks the work USAGE_UNKNOWN and
// keeps the receipt with the real usage, instead of leaving it started
// with nobody tracking it.
func TestRunMarksUnknownWhenUsageCannotBeRecorded(t *testing.T) {
	tl := startLedger(t)
	ctx := context.Background()
	fillLifetime(t, tl, 31) // spent = bound − 2^53
	if _, err := tl.direct.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}},
		func(context.Context) (Units, error) { return Units{"tokens": 1}, nil }); err != nil {
		t.Fatal(err) // spent = bound − 2^53 + 1: the next 2^53 cannot be recorded
	}
	_, err := tl.direct.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}},
		func(context.Context) (Units, error) { return Units{"tokens": 1 << 53}, nil })
	var unknown *UsageUnknownError
	if !errors.As(err, &unknown) || !unknown.Marked || !errors.Is(err, ErrLifetimeExhausted) || unknown.Receipt.Actual["tokens"] != 1<<53 {
		t.Fatalf("Run on a usage the ledger cannot record: %v (%T)", err, err)
	}
	got, err := tl.direct.GetReservation(ctx, unknown.Receipt.ReservationID)
	if err != nil || got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Fatalf("reservation after Run: %v %v", got.GetState(), err)
	}
	if pending := tl.direct.PendingUnknown(); len(pending) != 1 || pending[0].ReservationID != unknown.Receipt.ReservationID {
		t.Fatalf("pending receipts: %+v", pending)
	}
	// Its resend meets the same refusal, which is not final: the resends
	// end and the receipt stays, read from then on (docs/CLIENTS.md).
	waitChecking(t, tl.direct, unknown.Receipt.ReservationID)
	if pending := tl.direct.PendingUnknown(); len(pending) != 1 || tl.direct.PendingRefused() != 0 {
		t.Fatalf("pending receipts after the resend: %+v (%d refused)", pending, tl.direct.PendingRefused())
	}
}
