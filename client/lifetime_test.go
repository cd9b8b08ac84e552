package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// A reserve on an account whose lifetime spent reached the bound (32
// lifecycles of 2^53 tokens) is a *LedgerError matching
// ErrLifetimeExhausted, and not a capacity rejection.
func TestLifetimeExhaustedSentinel(t *testing.T) {
	tl := startLedger(t)
	ctx := context.Background()
	const max = 1 << 53
	if _, _, err := tl.direct.PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate",
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: max, RefillUnits: max, RefillInterval: durationpb.New(time.Millisecond)}},
		HoldTtl:    durationpb.New(time.Minute),
	}); err != nil {
		t.Fatal(err)
	}
	for range 32 {
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
	_, err := tl.direct.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}})
	var le *LedgerError
	var rej *RejectedError
	if !errors.Is(err, ErrLifetimeExhausted) || !errors.As(err, &le) || errors.As(err, &rej) {
		t.Fatalf("reserve on a full account: %v (%T)", err, err)
	}
}
