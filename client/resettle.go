package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// How kept receipts are resent (see settleLater).
const (
	// resendParallel bounds the resends in flight: after an outage of a
	// busy gateway thousands of receipts may be due at once, and they go
	// out this many at a time rather than all together.
	resendParallel = 8
	// The back-off of one receipt: 100 ms, doubling per failed resend up
	// to 5 s, each wait drawn from [d/2, d].
	resendFirstWait = 100 * time.Millisecond
	resendMaxWait   = 5 * time.Second
	// checkMaxWait caps the back-off of a check (checkOne). Work of
	// unknown usage waits for the ledger's resolver or an operator, on a
	// scale of minutes, and may stay unknown for hours: a thousand kept
	// receipts read every 5 s would be 200 reads a second from one
	// gateway; every minute, about 17.
	checkMaxWait = time.Minute
)

// resends are the kept receipts the Client resends in the background, by
// reservation id, and whether the loop that resends them runs. Guarded by
// lookups.mu, whose context and wait group bound the loop.
type resends struct {
	due     map[string]*resend
	running bool
	// wake tells a sleeping loop that a receipt was added (buffered 1).
	wake chan struct{}
	// checksNotBefore: no check (checkOne) is sent before it.
	checksNotBefore time.Time
}

// resend is one kept receipt's resend state.
type resend struct {
	receipt OperationReceipt
	// check: a receipt of unknown usage, whose reservation is read
	// (checkOne), never settled or released.
	check bool
	wait  time.Duration // the back-off after the next failure
	next  time.Time     // not resent before (zero: at once)
}

// settleLater resends, in the background, the settle (or the release of
// an abandoned start) of a kept receipt whose usage is known: with the
// receipt's ids, through ResolveUnknown, so a settle that did land replays
// and one that did not applies once. One loop per Client does it for every
// such receipt, resendParallel at a time, while the breaker is closed;
// each receipt backs off on its own (100 ms doubling to 5 s). A receipt
// leaves the loop when it is resolved (ResolveUnknown drops it from
// PendingUnknown), when the ledger's answer is final (ErrReceiptRefused:
// ResolveUnknown drops it from PendingUnknown too, and resendOne reports
// it), when the ledger refuses the call without a final answer (the
// receipt stays pending for the caller, and the loop reads its
// reservation from then on, as checkLater's), or when the caller resolved it
// meanwhile; the loop ends when none is left or the Client closes (Close
// waits for it). A receipt already being resent is not added again. The
// same loop checks the receipts of unknown usage (checkLater).
func (c *Client) settleLater(r OperationReceipt) {
	c.addResend(&resend{receipt: r, wait: resendFirstWait})
}

// checkLater checks, in the background, a kept receipt of unknown usage
// (checkOne), in the loop of settleLater: first after about
// resendFirstWait, then backing off like a resend up to checkMaxWait, at
// most resendParallel checks per resendFirstWait for all receipts
// together.
func (c *Client) checkLater(r OperationReceipt) {
	c.addResend(&resend{receipt: r, check: true, wait: resendFirstWait, next: time.Now().Add(halfJitter(resendFirstWait))})
}

// addResend adds s to the loop, starting it if needed. A receipt already
// in the loop is not added again, unless s resends a settle where a check
// was due: the resend replaces the check.
func (c *Client) addResend(s *resend) {
	ls := c.lookups
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx.Err() != nil {
		return
	}
	rs := &c.resends
	if old, ok := rs.due[s.receipt.ReservationID]; ok && (s.check || !old.check) {
		return
	}
	if rs.due == nil {
		rs.due = map[string]*resend{}
		rs.wake = make(chan struct{}, 1)
	}
	rs.due[s.receipt.ReservationID] = s
	if !rs.running {
		rs.running = true
		ls.wg.Add(1)
		go c.resendLoop()
		return
	}
	select {
	case rs.wake <- struct{}{}:
	default:
	}
}

// resendLoop resends the due receipts, waiting for the breaker to close
// before each round and sleeping until the next receipt is due or a new
// one arrives. It returns when no receipt is left or the Client closes.
func (c *Client) resendLoop() {
	ls := c.lookups
	defer ls.wg.Done()
	for {
		select {
		case <-ls.ctx.Done():
			return
		case <-c.breaker.closedChan():
		}
		now := time.Now()
		var due []*resend
		var next time.Time // the earliest receipt not due yet
		ls.mu.Lock()
		if len(c.resends.due) == 0 {
			c.resends.running = false
			ls.mu.Unlock()
			return
		}
		var checks []*resend
		for _, s := range c.resends.due {
			switch {
			case s.next.After(now):
				next = earliest(next, s.next)
			case s.check:
				checks = append(checks, s)
			default:
				due = append(due, s)
			}
		}
		checks, later := pickChecks(checks, now, c.resends.checksNotBefore)
		if len(checks) > 0 {
			c.resends.checksNotBefore = now.Add(resendFirstWait)
			due = append(due, checks...)
		}
		if later {
			next = earliest(next, c.resends.checksNotBefore)
		}
		wake := c.resends.wake
		ls.mu.Unlock()
		if len(due) > 0 {
			c.resendRound(due)
			continue
		}
		t := time.NewTimer(time.Until(next))
		select {
		case <-ls.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-wake:
			t.Stop()
		}
	}
}

// earliest returns the earlier of a and b, a zero one counting as none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// pickChecks returns the checks (checkOne) of due to send now: none
// before notBefore, else the resendParallel due earliest. later reports
// whether due checks were left for a later round.
func pickChecks(due []*resend, now, notBefore time.Time) (picked []*resend, later bool) {
	if len(due) == 0 {
		return nil, false
	}
	if now.Before(notBefore) {
		return nil, true
	}
	for _, s := range due {
		i := len(picked)
		for i > 0 && s.next.Before(picked[i-1].next) {
			i--
		}
		if i == resendParallel {
			continue
		}
		if len(picked) < resendParallel {
			picked = append(picked, nil)
		}
		copy(picked[i+1:], picked[i:len(picked)-1])
		picked[i] = s
	}
	return picked, len(due) > len(picked)
}

// resendRound resends due, resendParallel at a time, and returns when all
// are done (or the Client closes).
func (c *Client) resendRound(due []*resend) {
	ls := c.lookups
	jobs := make(chan *resend)
	var wg sync.WaitGroup
	for range min(resendParallel, len(due)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range jobs {
				c.resendOne(s)
			}
		}()
	}
feed:
	for _, s := range due {
		select {
		case jobs <- s:
		case <-ls.ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
}

// resendOne resends one receipt and either drops it from the loop (it
// landed, the ledger decided, or the caller resolved it) or schedules its
// next resend after its back-off: when no answer came (lost, unavailable,
// a 5xx) or a proxy in between refused it (429). A final answer
// (ErrReceiptRefused) has dropped the receipt from PendingUnknown too:
// it is counted and reported. A resend the breaker would refuse is not
// sent and not counted: the loop waits for the breaker instead.
func (c *Client) resendOne(s *resend) {
	if s.check {
		c.checkOne(s)
		return
	}
	ls := c.lookups
	id := s.receipt.ReservationID
	kept := c.pending.has(id)
	if kept && c.breaker.allow() != nil {
		return
	}
	if kept {
		actx, cancel := context.WithTimeout(ls.ctx, 2*c.timeout)
		_, removed, err := c.resolveUnknown(actx, s.receipt, s.receipt.Actual)
		cancel()
		if err != nil && isTransportFault(err) { // also a proxy's 429 (*RejectedError, no connect code)
			ls.mu.Lock()
			s.next = time.Now().Add(halfJitter(s.wait))
			s.wait = min(2*s.wait, resendMaxWait)
			ls.mu.Unlock()
			return
		}
		if removed {
			c.reportRefused(s.receipt, err)
		}
		if err != nil && !removed {
			// Refused, not for good (invalid_argument, lifetime counters
			// full): the receipt stays the caller's, and is read from now
			// on as one of unknown usage is, so that it leaves once the
			// ledger ends the reservation (checkOne).
			ls.mu.Lock()
			if c.resends.due[id] == s {
				s.check, s.wait, s.next = true, resendFirstWait, time.Now().Add(halfJitter(resendFirstWait))
			}
			ls.mu.Unlock()
			return
		}
	}
	ls.mu.Lock()
	delete(c.resends.due, id)
	ls.mu.Unlock()
}

// reportRefused counts r (PendingRefused) and hands it to
// WithRefusedReceipts' function with err, which matches ErrReceiptRefused.
func (c *Client) reportRefused(r OperationReceipt, err error) {
	c.pending.refused.Add(1)
	if c.pending.onRefuse != nil {
		c.pending.onRefuse(r.clone(), err)
	}
}

// checkOne reads the reservation of a kept receipt of unknown usage
// (GetReservation; it never settles or releases anything). When the
// ledger shows it ended or taken by another operation, or answers
// RESERVATION_NOT_FOUND (see ErrReceiptRefused), no call with the
// receipt can settle it: the receipt leaves PendingUnknown and the loop,
// and is reported (reportRefused) with an error matching
// ErrReceiptRefused and the answer (endedAnswer's, or the not_found).
// Otherwise (still STARTED or USAGE_UNKNOWN under this operation, no
// answer, a 5xx, any other refusal, or a ResolveUnknown of it in flight)
// the receipt stays and is checked again after its back-off. It leaves
// the loop when the receipt is no longer kept (resolved, dropped).
func (c *Client) checkOne(s *resend) {
	ls := c.lookups
	r := s.receipt
	if !c.pending.hasOperation(r.ReservationID, r.OperationID) {
		ls.mu.Lock()
		if c.resends.due[r.ReservationID] == s {
			delete(c.resends.due, r.ReservationID)
		}
		ls.mu.Unlock()
		return
	}
	if c.breaker.allow() != nil {
		return
	}
	actx, cancel := context.WithTimeout(ls.ctx, 2*c.timeout)
	got, err := c.GetReservation(actx, r.ReservationID)
	cancel()
	var final error
	var le *LedgerError
	switch {
	case err == nil:
		final = endedAnswer(r, got)
	case errors.As(err, &le) && le.Reason == ReasonReservationNotFound:
		final = err
	}
	if final != nil && c.pending.removeChecked(r.ReservationID, r.OperationID) {
		c.reportRefused(r, fmt.Errorf("check %s: %w: %w", r.ReservationID, ErrReceiptRefused, final))
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !c.pending.hasOperation(r.ReservationID, r.OperationID) {
		if c.resends.due[r.ReservationID] == s {
			delete(c.resends.due, r.ReservationID)
		}
		return
	}
	s.next = time.Now().Add(halfJitter(s.wait))
	s.wait = min(2*s.wait, checkMaxWait)
}

// endedReason returns the reason of the ledger's answer to a command on a
// reservation that ended in state: ALREADY_SETTLED (SETTLED or
// SETTLED_WITH_DEBT), RELEASED, or EXPIRED; false for a state that has
// not ended (EXPIRING among them: its claim may still fail).
func endedReason(state ledgerv1.ReservationState) (string, bool) {
	switch state {
	case ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT:
		return ReasonReservationAlreadySettled, true
	case ledgerv1.ReservationState_RESERVATION_STATE_RELEASED:
		return ReasonReservationReleased, true
	case ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED:
		return ReasonReservationExpired, true
	}
	return "", false
}

// endedAnswer returns, for a receipt of unknown usage and its reservation
// as read (got), the answer a settle with the receipt would get when it
// is final, as a *LedgerError of Op "get reservation" with got as its
// Reservation: ErrAlreadySettled (SETTLED or SETTLED_WITH_DEBT, also as
// a tombstone), ErrReleased, ErrExpired, or ErrOperationMismatch (started
// under another operation id). It returns nil while the receipt may still
// settle it (STARTED or USAGE_UNKNOWN under the receipt's operation id,
// or not started yet).
func endedAnswer(r OperationReceipt, got *ledgerv1.Reservation) error {
	reason, ended := endedReason(got.GetState())
	if !ended {
		if op := got.GetOperationId(); op == "" || op == r.OperationID {
			return nil
		}
		reason = ReasonOperationMismatch
	}
	return &LedgerError{Op: "get reservation", Code: connect.CodeFailedPrecondition, Reason: reason, Reservation: got,
		Err: fmt.Errorf("reservation %s is %s, operation %q", r.ReservationID, got.GetState(), got.GetOperationId())}
}
