package client

import (
	"context"
	"errors"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
)

// A Run repeated with the id of a request that already moved on from
// RESERVED, as docs/CLIENTS.md section 2 rule 2 has a gateway do after a
// crash ("Reuse it, unchanged, on every retry of that request"), does not
// run the work again and answers a *LedgerError a caller can branch on:
// the sentinel of the reservation's state, with the reservation as it is
// now (a settled one; a released one). Found by an outside-in hunt: it was
// a plain error string.
func TestRunRepeatedUnderAFinishedIDIsATypedAnswer(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-r", route: "chat.generate", burst: 1000})
	c := l.viaProxy(t)
	ctx := context.Background()
	used := func(context.Context) (Units, error) { return Units{"tokens": 40}, nil }

	settled := ReserveRequest{ReservationID: NewReservationID(), Subject: "tenant-r", Route: "chat.generate", Units: Units{"tokens": 100}}
	if _, err := c.Run(ctx, settled, used); err != nil {
		t.Fatal(err)
	}
	released := ReserveRequest{ReservationID: NewReservationID(), Subject: "tenant-r", Route: "chat.generate", Units: Units{"tokens": 100}}
	if _, err := c.Reserve(ctx, released); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, released.ReservationID); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		req      ReserveRequest
		sentinel error
		state    ledgerv1.ReservationState
	}{
		{settled, ErrAlreadySettled, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED},
		{released, ErrReleased, ledgerv1.ReservationState_RESERVATION_STATE_RELEASED},
	} {
		ran := false
		_, err := c.Run(ctx, tc.req, func(ctx context.Context) (Units, error) { ran = true; return used(ctx) })
		if ran {
			t.Fatalf("%s: the work ran again under a reservation that moved on", tc.state)
		}
		var le *LedgerError
		if !errors.As(err, &le) {
			t.Fatalf("%s: Run repeated returned %T %v; want a *LedgerError", tc.state, err, err)
		}
		if !errors.Is(err, tc.sentinel) || le.Reservation.GetState() != tc.state || le.Reservation.GetReservationId() != tc.req.ReservationID {
			t.Fatalf("Run repeated: %v (reservation %v); want %v carrying the %s reservation", err, le.Reservation, tc.sentinel, tc.state)
		}
	}
}

// The same for Emergency.Run of a request the shard store served while
// the ledger was cut off: repeated under its id, the work does not run
// again and the answer matches ErrAlreadySettled, carrying the local
// reservation's id and state.
func TestEmergencyRunRepeatedUnderAFinishedIDIsATypedAnswer(t *testing.T) {
	l := startShardLedger(t)
	_, em := emergencyGateway(t, l, WithTimeout(2*time.Second), WithBreaker(BreakerPolicy{DetectTimeout: 200 * time.Millisecond}))
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	ctx := context.Background()
	req := ReserveRequest{ReservationID: NewReservationID(), Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}
	if _, err := em.Run(ctx, req, func(context.Context) (Units, error) { return Units{"tokens": 7}, nil }); err != nil {
		t.Fatalf("run from the shard: %v", err)
	}
	if !em.store.Has(req.ReservationID) {
		t.Fatal("the shard store did not serve the request: the check below proves nothing")
	}
	ran := false
	_, err := em.Run(ctx, req, func(context.Context) (Units, error) { ran = true; return Units{"tokens": 7}, nil })
	if ran {
		t.Fatal("the work ran again under a local reservation that settled")
	}
	var le *LedgerError
	if !errors.As(err, &le) || !errors.Is(err, ErrAlreadySettled) ||
		le.Reservation.GetReservationId() != req.ReservationID || le.Reservation.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED {
		t.Fatalf("Emergency.Run repeated: %T %v; want a *LedgerError matching ErrAlreadySettled with the settled local reservation", err, err)
	}
}
