package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

// A fault of faultyCalls for one procedure.
type callFault int

const (
	// answerLost: the call is applied, its answer lost.
	answerLost callFault = iota + 1
	// requestLost: the call is not sent on, and fails as a lost answer.
	requestLost
	// refused: the connection is refused (a dial error): nothing was
	// sent, so no answer is lost; the call fails with UNAVAILABLE.
	refused
)

// faultyCalls forwards every call to next, except that faults[procedure]
// loses it (as a cut connection would) until healed (when set) is true,
// and after[procedure], when set, runs once the call was forwarded (or
// lost), and before[procedure] before it is forwarded.
type faultyCalls struct {
	next          http.RoundTripper
	faults        map[string]callFault
	healed        *atomic.Bool
	before, after map[string]func()
}

func (f faultyCalls) RoundTrip(r *http.Request) (*http.Response, error) {
	if hook := f.before[r.URL.Path]; hook != nil {
		hook()
	}
	if hook := f.after[r.URL.Path]; hook != nil {
		defer hook()
	}
	fault := f.faults[r.URL.Path]
	if f.healed != nil && f.healed.Load() {
		fault = 0
	}
	switch fault {
	case requestLost:
		return nil, errors.New("connection reset before the request was sent on")
	case refused:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	resp, err := f.next.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	switch fault {
	case answerLost:
		resp.Body.Close()
		return nil, errors.New("connection reset after the call was applied")
	}
	return resp, nil
}

const (
	startCall   = capledgerv1connect.LedgerServiceStartProcedure
	getCall     = capledgerv1connect.LedgerServiceGetReservationProcedure
	releaseCall = capledgerv1connect.LedgerServiceReleaseProcedure
	settleCall  = capledgerv1connect.LedgerServiceSettleProcedure
)

// newFaultyClient returns a Client to l through f, one attempt per call,
// whose breaker opens only when tripped (trip) and then stays open until
// an answer is recorded (c.breaker.answered).
func newFaultyClient(t *testing.T, l *testLedger, f faultyCalls) *Client {
	t.Helper()
	c, err := New(l.addr, WithHTTPClient(&http.Client{Transport: f}), WithTimeout(2*time.Second),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 1}),
		WithBreaker(BreakerPolicy{DetectTimeout: time.Minute, ProbeBase: time.Hour, ProbeMax: time.Hour}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// trip opens c's breaker: the ledger looks unreachable from here on.
func trip(c *Client) { c.breaker.tripIf(func() bool { return true }) }

// waitResends waits until c's resend loop is done with every kept receipt
// (resolved, or left to the caller because the ledger decided otherwise).
func waitResends(c *Client) {
	for {
		c.lookups.mu.Lock()
		n := len(c.resends.due)
		c.lookups.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Start whose answer was lost landed. When Run cannot undo it (the
// lookup and the release are not sent: the breaker opened), the
// reservation is STARTED with nobody else holding its operation id: Run
// keeps the receipt (zero usage: the work was never called) and settles
// it once the ledger is reachable again, instead of dropping it as if
// nothing were held.
func TestAbandonedStartIsKeptWhenItsUndoIsNotSent(t *testing.T) {
	for _, tc := range []struct {
		name string
		// faults, and after given c (to open its breaker at the right call).
		faults map[string]callFault
		after  func(c *Client) map[string]func()
	}{
		{
			name:   "release not sent",
			faults: map[string]callFault{startCall: answerLost},
			after:  func(c *Client) map[string]func() { return map[string]func(){startCall: func() { trip(c) }} },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := startLedger(t)
			l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
			f := faultyCalls{next: http.DefaultTransport, faults: tc.faults, after: map[string]func(){}}
			c := newFaultyClient(t, l, f)
			for path, hook := range tc.after(c) {
				f.after[path] = hook
			}
			ran := false
			_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
				func(context.Context) (Units, error) { ran = true; return nil, nil })
			if ran {
				t.Fatal("work ran although the Start answer was lost")
			}
			lost := mustErrAs[*LostError](t, err)
			if c.Breaker().State != BreakerClosed {
				// The resend waits for the breaker: the receipt is kept.
				got, gerr := l.direct.GetReservation(context.Background(), lost.ReservationID)
				if gerr != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_STARTED) {
					t.Fatalf("reservation %v (%v): want STARTED (the Start landed)", got.GetState(), gerr)
				}
				pending := c.PendingUnknown()
				if len(pending) != 1 || pending[0].ReservationID != lost.ReservationID || pending[0].Actual == nil || !usedNothing(pending[0].Actual) {
					t.Fatalf("pending %+v: want the abandoned start's receipt with zero usage", pending)
				}
				c.breaker.answered() // the ledger answers again: the receipt is resent
			}
			waitResends(c)
			if left := c.PendingUnknown(); len(left) != 0 {
				t.Fatalf("pending %+v after the resend", left)
			}
			got, gerr := l.direct.GetReservation(context.Background(), lost.ReservationID)
			if gerr != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 0 {
				t.Fatalf("reservation %v actual %v (%v): want SETTLED with zero usage", got.GetState(), got.GetActualUnits(), gerr)
			}
			if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 0 || b.GetSpent() != 0 {
				t.Fatalf("reserved %d spent %d, want 0 and 0", b.GetReserved(), b.GetSpent())
			}
			l.audit(t)
		})
	}
}

// A Start whose answer was lost landed, and the release answers "already
// started"; the zero settle that should end it fails without an answer
// lost: it is not sent (the connection is refused here; an open breaker
// refuses it the same way). Only an answer that the reservation ended
// lets the receipt go, so Run keeps it (zero usage) and settles it once
// the ledger is reachable, instead of leaving the reservation STARTED
// with nobody holding its operation id.
func TestAbandonedStartIsKeptWhenItsZeroSettleIsNotSent(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	f := faultyCalls{next: http.DefaultTransport, healed: &atomic.Bool{},
		faults: map[string]callFault{startCall: answerLost, getCall: requestLost, settleCall: refused}}
	c := newFaultyClient(t, l, f)
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { t.Error("work ran"); return nil, nil })
	lost := mustErrAs[*LostError](t, err)
	// The resends are refused too until healed: the receipt stays.
	got, err := l.direct.GetReservation(context.Background(), lost.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_STARTED) {
		t.Fatalf("reservation %v (%v): want STARTED (the Start landed)", got.GetState(), err)
	}
	pending := c.PendingUnknown()
	if len(pending) != 1 || pending[0].ReservationID != lost.ReservationID || pending[0].Actual == nil || !usedNothing(pending[0].Actual) {
		t.Fatalf("pending %+v: want the abandoned start's receipt with zero usage", pending)
	}
	f.healed.Store(true) // the ledger is reachable again: a resend lands
	waitResends(c)
	if left := c.PendingUnknown(); len(left) != 0 {
		t.Fatalf("pending %+v after the resend", left)
	}
	got, err = l.direct.GetReservation(context.Background(), lost.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 0 {
		t.Fatalf("reservation %v actual %v (%v): want SETTLED with zero usage", got.GetState(), got.GetActualUnits(), err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 0 || b.GetSpent() != 0 {
		t.Fatalf("reserved %d spent %d, want 0 and 0", b.GetReserved(), b.GetSpent())
	}
	l.audit(t)
}

// A kept abandoned start whose Start had not landed is resolved by a
// release; when the Start lands between the settle (answered "not
// started") and that release, ResolveUnknown settles zero usage after all
// rather than leaving it STARTED.
func TestResolveUnknownSettlesAStartThatLandsBeforeItsRelease(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: requestLost},
		before: map[string]func(){}, after: map[string]func(){}}
	c := newFaultyClient(t, l, f)
	f.after[startCall] = func() { trip(c) }
	f.before[releaseCall] = func() {
		for _, r := range c.PendingUnknown() { // the held Start lands now
			if _, err := l.direct.Start(context.Background(), r.ReservationID, r.OperationID); err != nil {
				t.Errorf("late start: %v", err)
			}
		}
	}
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { t.Error("work ran"); return nil, nil })
	lost := mustErrAs[*LostError](t, err)
	if got, _ := l.direct.GetReservation(context.Background(), lost.ReservationID); !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_RESERVED) {
		t.Fatalf("reservation %v, want RESERVED (the Start is held)", got.GetState())
	}
	if pending := c.PendingUnknown(); len(pending) != 1 {
		t.Fatalf("pending %+v: want the abandoned start's receipt", pending)
	}
	c.breaker.answered() // the resend (ResolveUnknown) goes out
	waitResends(c)
	if left := c.PendingUnknown(); len(left) != 0 {
		t.Fatalf("pending %+v after the resend", left)
	}
	got, err := l.direct.GetReservation(context.Background(), lost.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 0 {
		t.Fatalf("reservation %v actual %v (%v): want SETTLED with zero usage", got.GetState(), got.GetActualUnits(), err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 0 || b.GetSpent() != 0 {
		t.Fatalf("reserved %d spent %d, want 0 and 0", b.GetReserved(), b.GetSpent())
	}
	l.audit(t)
}

// A Start whose answer was lost landed; the release answers "already
// started" and the zero settle is answered: the ledger says the
// reservation ended, so Run lets the receipt go at once (nothing is left
// pending or resent) and the reservation is SETTLED with zero usage when
// Run returns. A resend after Run returned is held here, so a receipt
// kept by mistake stays in PendingUnknown.
func TestAbandonedStartIsNotKeptWhenItsZeroSettleIsAnswered(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var returned atomic.Bool
	hold := make(chan struct{})
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: answerLost, getCall: requestLost},
		before: map[string]func(){settleCall: func() {
			if returned.Load() {
				<-hold
			}
		}}}
	c := newFaultyClient(t, l, f)
	t.Cleanup(func() { close(hold) }) // before c.Close (cleanups run last first)
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { t.Error("work ran"); return nil, nil })
	returned.Store(true)
	lost := mustErrAs[*LostError](t, err)
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending %+v: the zero settle was answered, nothing is left to resolve", pending)
	}
	got, err := l.direct.GetReservation(context.Background(), lost.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 0 {
		t.Fatalf("reservation %v actual %v (%v): want SETTLED with zero usage when Run returns", got.GetState(), got.GetActualUnits(), err)
	}
	l.audit(t)
}
