package client

import (
	"context"
	"errors"
	"testing"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// docs/CLIENTS.md, rule 5: a Settle with the receipt answered
// RESERVATION_NOT_FOUND because the Client's token no longer has the
// subject in scope (the ledger answers it as for an unknown reservation)
// is final to the SDK (ErrReceiptRefused, ErrNotFound: the receipt leaves
// PendingUnknown) but, unlike the other final answers, it can change: the
// reservation still holds its capacity, USAGE_UNKNOWN, and once the
// tokens file gives the scope back the same receipt settles it.
func TestReceiptRefusedForATokenScopeSettlesOnceTheScopeIsBack(t *testing.T) {
	ctx := context.Background()
	p, op, restart := scopedLedger(t)
	c, err := New(p.addr, noBreakerWatchdog, WithBearerToken(scopeGatewayToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	restart("tenant-8")
	if _, err := c.ResolveUnknown(ctx, receipt, Units{"tokens": 30}); !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrNotFound) {
		t.Fatalf("resolve out of the token's scope: %v, want ErrReceiptRefused and ErrNotFound", err)
	}
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending after a final answer: %+v", pending)
	}
	got, err := op.GetReservation(ctx, receipt.ReservationID)
	if err != nil || got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Fatalf("reservation %v %v, want it still USAGE_UNKNOWN, holding its capacity", got, err)
	}

	restart("tenant-7")
	if _, err := c.ResolveUnknown(ctx, receipt, Units{"tokens": 30}); err != nil {
		t.Fatalf("resolve with the scope back: %v, want the settle", err)
	}
	got, err = op.GetReservation(ctx, receipt.ReservationID)
	if err != nil || got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || got.GetActualUnits()["tokens"] != 30 {
		t.Fatalf("reservation %v %v, want it settled with the receipt's 30 tokens", got, err)
	}
}
