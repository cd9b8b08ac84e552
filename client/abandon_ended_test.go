package client

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// heldAfterReturn holds every settle and release a Client sends once Run
// has returned (returned is set) until release is called, so the
// background resend cannot empty PendingUnknown before the test looks.
type heldAfterReturn struct {
	returned atomic.Bool
	hold     chan struct{}
	once     sync.Once
}

func (h *heldAfterReturn) wait() {
	if h.returned.Load() {
		<-h.hold
	}
}

func (h *heldAfterReturn) release() { h.once.Do(func() { close(h.hold) }) }

// runAbandonedStart runs a Run of 100 tokens of tenant-7/chat.generate
// under id through f, with h holding every settle and release sent after
// Run returns (until h.release, at the latest at cleanup), and wants Run
// to answer a *LostError without running the work.
func runAbandonedStart(t *testing.T, l *testLedger, h *heldAfterReturn, f faultyCalls, id string) *Client {
	t.Helper()
	c := newFaultyClient(t, l, f)
	t.Cleanup(h.release) // before c.Close (cleanups run last first)
	_, err := c.Run(context.Background(), ReserveRequest{ReservationID: id, Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { t.Error("work ran"); return nil, nil })
	h.returned.Store(true)
	mustErrAs[*LostError](t, err)
	return c
}

// wantNothingHeld wants tenant-7/chat.generate to hold nothing reserved
// and to have spent exactly spent tokens, and the audit to be clean.
func wantNothingHeld(t *testing.T, l *testLedger, spent int64) {
	t.Helper()
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 0 || b.GetSpent() != spent {
		t.Fatalf("reserved %d spent %d, want 0 and %d", b.GetReserved(), b.GetSpent(), spent)
	}
	l.audit(t)
}

// A Start whose request was lost never landed, and the hold expired before
// Run undid it: the release answers RESERVATION_EXPIRED, the ledger's word
// that the reservation ended. Run keeps nothing (it used to be a receipt
// no resend could ever need).
func TestAbandonedStartIsNotKeptWhenItsHoldExpired(t *testing.T) {
	const id = "abandon-expired"
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, holdTTL: 100 * time.Millisecond})
	h := &heldAfterReturn{hold: make(chan struct{})}
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: requestLost, getCall: requestLost},
		before: map[string]func(){
			settleCall: h.wait,
			releaseCall: func() {
				if h.returned.Load() {
					h.wait()
					return
				}
				for { // the hold expires before the release arrives
					got, err := l.direct.GetReservation(context.Background(), id)
					if err != nil {
						t.Errorf("get: %v", err)
						return
					}
					if isState(got, ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED) {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			},
		}}
	c := runAbandonedStart(t, l, h, f, id)
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending %+v: the release answered EXPIRED, nothing is left to resolve", pending)
	}
	got, err := l.direct.GetReservation(context.Background(), id)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED) {
		t.Fatalf("reservation %v (%v): want EXPIRED", got.GetState(), err)
	}
	wantNothingHeld(t, l, 0)
}

// A Start whose answer was lost landed; the release answers "already
// started", and before the zero settle arrives an operator settles the
// operation with its real usage (40 tokens). The zero settle answers
// RESERVATION_ALREADY_SETTLED: the reservation ended, nothing is held, so
// Run keeps nothing, and the recorded 40 tokens stand.
func TestAbandonedStartIsNotKeptWhenSettledBeforeItsZeroSettle(t *testing.T) {
	const id = "abandon-settled"
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	h := &heldAfterReturn{hold: make(chan struct{})}
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: answerLost, getCall: requestLost},
		before: map[string]func(){
			releaseCall: h.wait,
			settleCall: func() {
				if h.returned.Load() {
					h.wait()
					return
				}
				ctx := context.Background()
				got, err := l.direct.GetReservation(ctx, id)
				if err != nil {
					t.Errorf("get: %v", err)
					return
				}
				if _, err := l.direct.Settle(ctx, id, got.GetOperationId(), Units{"tokens": 40}); err != nil {
					t.Errorf("operator's settle: %v", err)
				}
			},
		}}
	c := runAbandonedStart(t, l, h, f, id)
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending %+v: the zero settle answered ALREADY_SETTLED, nothing is left to resolve", pending)
	}
	got, err := l.direct.GetReservation(context.Background(), id)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("reservation %v actual %v (%v): want SETTLED with the operator's 40 tokens", got.GetState(), got.GetActualUnits(), err)
	}
	wantNothingHeld(t, l, 40)
}

// A Start whose request was lost never landed; the release that undoes it
// lands but its answer is lost. Only the ledger's answer that the
// reservation ended lets the receipt go: Run keeps it (zero usage) and the
// resend learns the reservation is RELEASED, then lets it go.
func TestAbandonedStartIsKeptWhenItsReleaseAnswerIsLost(t *testing.T) {
	const id = "abandon-release-lost"
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	h := &heldAfterReturn{hold: make(chan struct{})}
	healed := &atomic.Bool{}
	f := faultyCalls{next: http.DefaultTransport, healed: healed,
		faults: map[string]callFault{startCall: requestLost, getCall: requestLost, releaseCall: answerLost},
		before: map[string]func(){settleCall: h.wait, releaseCall: h.wait}}
	c := runAbandonedStart(t, l, h, f, id)
	got, err := l.direct.GetReservation(context.Background(), id)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_RELEASED) {
		t.Fatalf("reservation %v (%v): want RELEASED (the release landed)", got.GetState(), err)
	}
	pending := c.PendingUnknown()
	if len(pending) != 1 || pending[0].ReservationID != id || pending[0].Actual == nil || !usedNothing(pending[0].Actual) {
		t.Fatalf("pending %+v: want the abandoned start's receipt with zero usage (the release answer was lost)", pending)
	}
	healed.Store(true)
	h.release() // the resend goes out and is answered
	waitResends(c)
	if left := c.PendingUnknown(); len(left) != 0 {
		t.Fatalf("pending %+v after the resend", left)
	}
	wantNothingHeld(t, l, 0)
}
