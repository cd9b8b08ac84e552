package client

import (
	"context"
	"math/rand/v2"
	"time"
)

// settleLater resends, in the background, the settle (or the release of
// an abandoned start) of a kept receipt whose usage is known: with the
// receipt's ids, through ResolveUnknown, so a settle that did land replays
// and one that did not applies once. It waits for the breaker to close
// between attempts and backs off (100 ms doubling to 5 s). It stops when
// the receipt is resolved (ResolveUnknown drops it from PendingUnknown),
// when the ledger decides otherwise (e.g. ErrAlreadySettled: the receipt
// stays pending for the caller), when the caller resolved it meanwhile, or
// when the Client closes. The lookups' context and wait group bound it, so
// Close waits for it.
func (c *Client) settleLater(r OperationReceipt) {
	ls := c.lookups
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx.Err() != nil {
		return
	}
	if c.resettling == nil {
		c.resettling = map[string]bool{}
	}
	if c.resettling[r.ReservationID] {
		return
	}
	c.resettling[r.ReservationID] = true
	ls.wg.Add(1)
	go c.resettle(r)
}

func (c *Client) resettle(r OperationReceipt) {
	ls := c.lookups
	defer ls.wg.Done()
	defer func() {
		ls.mu.Lock()
		delete(c.resettling, r.ReservationID)
		ls.mu.Unlock()
	}()
	wait := 100 * time.Millisecond
	for {
		select {
		case <-ls.ctx.Done():
			return
		case <-c.breaker.closedChan():
		}
		c.pendingMu.Lock()
		_, kept := c.pending[r.ReservationID]
		c.pendingMu.Unlock()
		if !kept {
			return // resolved by the caller
		}
		actx, cancel := context.WithTimeout(ls.ctx, 2*c.timeout)
		_, err := c.ResolveUnknown(actx, r, r.Actual)
		cancel()
		if err == nil || !isTransportFault(err) {
			return
		}
		t := time.NewTimer(wait/2 + time.Duration(rand.Int64N(int64(wait/2)+1)))
		select {
		case <-ls.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}
