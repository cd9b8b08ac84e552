package client

import (
	"context"
	"sync"
	"time"
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
)

// resends are the kept receipts the Client resends in the background, by
// reservation id, and whether the loop that resends them runs. Guarded by
// lookups.mu, whose context and wait group bound the loop.
type resends struct {
	due     map[string]*resend
	running bool
	// wake tells a sleeping loop that a receipt was added (buffered 1).
	wake chan struct{}
}

// resend is one kept receipt's resend state.
type resend struct {
	receipt OperationReceipt
	wait    time.Duration // the back-off after the next failure
	next    time.Time     // not resent before (zero: at once)
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
// receipt stays pending for the caller), or when the caller resolved it
// meanwhile; the loop ends when none is left or the Client closes (Close
// waits for it). A receipt already being resent is not added again.
func (c *Client) settleLater(r OperationReceipt) {
	ls := c.lookups
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx.Err() != nil {
		return
	}
	rs := &c.resends
	if _, ok := rs.due[r.ReservationID]; ok {
		return
	}
	if rs.due == nil {
		rs.due = map[string]*resend{}
		rs.wake = make(chan struct{}, 1)
	}
	rs.due[r.ReservationID] = &resend{receipt: r, wait: resendFirstWait}
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
		for _, s := range c.resends.due {
			switch {
			case !s.next.After(now):
				due = append(due, s)
			case next.IsZero() || s.next.Before(next):
				next = s.next
			}
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
			c.pending.refused.Add(1)
			if c.pending.onRefuse != nil {
				c.pending.onRefuse(s.receipt.clone(), err)
			}
		}
	}
	ls.mu.Lock()
	delete(c.resends.due, id)
	ls.mu.Unlock()
}
