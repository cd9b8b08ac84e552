package client

import (
	"context"
	"errors"
	"sync"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// LostReserve is a Reserve whose answers were all lost and whose id could
// not be looked up before the caller's deadline (or while the breaker was
// open): the SDK keeps looking it up in the background, once the ledger is
// reachable again, instead of holding the caller.
type LostReserve struct {
	ReservationID string
	RequestDigest string
	Since         time.Time
	// Done is set once resolved. Reservation is the ledger's reservation
	// when the id was admitted (nil when the ledger does not have it); Err
	// is ErrDigestMismatch for an id admitted for another request, or why
	// the SDK gave up (the Client closed, or DefaultLostReserveLookup
	// passed).
	Done        bool
	Reservation *ledgerv1.Reservation
	Err         error
}

// DefaultLostReserveLookup bounds how long a lost Reserve is looked up in
// the background.
const DefaultLostReserveLookup = 10 * time.Minute

// WithLostReserveHandler calls h (on its own goroutine) with each lost
// Reserve the background lookup resolved or gave up on.
func WithLostReserveHandler(h func(LostReserve)) Option {
	return func(c *config) { c.lostHandler = h }
}

type lookup struct {
	LostReserve
	onFound []func(*ledgerv1.Reservation)
	// watch keeps looking after a not-found answer (watchLostReserve).
	watch bool
}

type lookups struct {
	ctx     context.Context
	cancel  context.CancelFunc
	handler func(LostReserve)
	mu      sync.Mutex
	m       map[string]*lookup
	wg      sync.WaitGroup
}

func newLookups(h func(LostReserve)) *lookups {
	ctx, cancel := context.WithCancel(context.Background())
	return &lookups{ctx: ctx, cancel: cancel, handler: h, m: map[string]*lookup{}}
}

// LostReserves returns the lost Reserves still being looked up (not the
// ones Emergency keeps watching for a late landing after a not-found
// answer: those are resolved, as not admitted).
func (c *Client) LostReserves() []LostReserve {
	c.lookups.mu.Lock()
	defer c.lookups.mu.Unlock()
	out := make([]LostReserve, 0, len(c.lookups.m))
	for _, l := range c.lookups.m {
		out = append(out, l.LostReserve)
	}
	return out
}

// lookUpLater starts (once per id) the background lookup of a lost
// Reserve: it asks the ledger, once reachable, until it answers (found,
// not found, another digest) or DefaultLostReserveLookup passes.
func (c *Client) lookUpLater(id, digest string) {
	c.startLookup(id, digest, nil, false)
}

// watchLostReserve is lookUpLater for a lost Reserve whose late landing
// matters: a Reserve still in flight may land after a not-found answer,
// so that answer resolves the lookup (LostReserves drops it, the handler
// hears of it) but does not end it: watchAfterNotFound keeps asking,
// backing off to maxWatchWait, for the rest of the lookup window
// (DefaultLostReserveLookup), and runs onFound if the id lands in it.
// onFound also runs if the lookup finds the id before any not-found
// answer; it is registered before the lookup can end, so it never misses
// the finding. Emergency watches the ids it served from its shard, so a
// late central hold is released instead of held until its TTL.
func (c *Client) watchLostReserve(id, digest string, onFound func(*ledgerv1.Reservation)) {
	c.startLookup(id, digest, onFound, true)
}

// maxWatchWait bounds the wait between two not-found answers of a
// watched lookup: about 25 lookups over DefaultLostReserveLookup.
const maxWatchWait = 30 * time.Second

// maxLookupWait bounds the wait between two lost answers of a lookup
// not answered yet.
const maxLookupWait = 2 * time.Second

func (c *Client) startLookup(id, digest string, onFound func(*ledgerv1.Reservation), watch bool) {
	ls := c.lookups
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx.Err() != nil {
		return
	}
	if l, ok := ls.m[id]; ok {
		if onFound != nil {
			l.onFound = append(l.onFound, onFound)
		}
		l.watch = l.watch || watch
		return
	}
	l := &lookup{LostReserve: LostReserve{ReservationID: id, RequestDigest: digest, Since: time.Now()}, watch: watch}
	if onFound != nil {
		l.onFound = append(l.onFound, onFound)
	}
	ls.m[id] = l
	ls.wg.Add(1)
	go c.lookUp(l)
}

// lookUp runs one lookup for the lookup window: until the ledger answers,
// then, for a watched lookup answered not found, the watch.
func (c *Client) lookUp(l *lookup) {
	ls := c.lookups
	defer ls.wg.Done()
	ctx, cancel := context.WithTimeout(ls.ctx, DefaultLostReserveLookup)
	defer cancel()
	if onFound, wait, watch := c.lookUpUntilAnswered(ctx, l); watch {
		c.watchAfterNotFound(ctx, l.ReservationID, l.RequestDigest, onFound, wait)
	}
}

// lookUpUntilAnswered asks the ledger for l's id, whenever the breaker is
// closed, backing off to maxLookupWait while the answers are lost, until
// it answers or ctx ends, and resolves l with the outcome
// (finishLookup). It returns whether to watch on (a not-found answer of
// a watched lookup), with the callbacks to run then and the current wait.
func (c *Client) lookUpUntilAnswered(ctx context.Context, l *lookup) (onFound []func(*ledgerv1.Reservation), wait time.Duration, watch bool) {
	wait = 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			c.finishLookup(l, nil, ctx.Err())
			return nil, wait, false
		case <-c.breaker.closedChan():
		}
		res, err := c.askLedger(ctx, l.ReservationID, l.RequestDigest)
		switch {
		case err == nil:
			c.finishLookup(l, res, nil)
			return nil, wait, false
		case errors.Is(err, ErrDigestMismatch):
			c.finishLookup(l, nil, err)
			return nil, wait, false
		case errors.Is(err, ErrNotFound):
			onFound, watch = c.finishLookup(l, nil, nil)
			return onFound, wait, watch
		}
		if !sleep(ctx, halfJitter(wait)) {
			c.finishLookup(l, nil, ctx.Err())
			return nil, wait, false
		}
		wait = min(2*wait, maxLookupWait)
	}
}

// watchAfterNotFound keeps asking the ledger for an id it answered not
// found, whenever the breaker is closed, backing off to maxWatchWait,
// until ctx ends (the rest of the lookup window), the id lands (then
// onFound runs with it) or is found admitted for another request. The
// lookup is resolved already: nothing is reported.
func (c *Client) watchAfterNotFound(ctx context.Context, id, digest string, onFound []func(*ledgerv1.Reservation), wait time.Duration) {
	for {
		if !sleep(ctx, halfJitter(wait)) {
			return
		}
		wait = min(2*wait, maxWatchWait)
		select {
		case <-ctx.Done():
			return
		case <-c.breaker.closedChan():
		}
		res, err := c.askLedger(ctx, id, digest)
		switch {
		case err == nil:
			// A Reserve in flight landed after the not-found answer.
			for _, f := range onFound {
				f(res)
			}
			return
		case errors.Is(err, ErrDigestMismatch):
			return
		}
	}
}

// askLedger is one lookup of a lost Reserve's id, bounded by twice the
// call timeout.
func (c *Client) askLedger(ctx context.Context, id, digest string) (*ledgerv1.Reservation, error) {
	actx, cancel := context.WithTimeout(ctx, 2*c.timeout)
	defer cancel()
	return c.ResolveReservation(actx, id, digest)
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// finishLookup records the lookup's outcome (the admitted reservation, or
// why it ended without one) under mu, where LostReserves reads it, and
// tells whoever waits for it. It returns l's callbacks and whether l is
// watched, read under the same lock that drops l from the lookups: a
// watchLostReserve of the id after that starts a lookup of its own.
func (c *Client) finishLookup(l *lookup, res *ledgerv1.Reservation, err error) (onFound []func(*ledgerv1.Reservation), watch bool) {
	ls := c.lookups
	ls.mu.Lock()
	delete(ls.m, l.ReservationID)
	l.Reservation, l.Err, l.Done = res, err, true
	onFound, watch, outcome := l.onFound, l.watch, l.LostReserve
	ls.mu.Unlock()
	if res != nil {
		for _, f := range onFound {
			f(res)
		}
	}
	if ls.handler != nil {
		ls.handler(outcome)
	}
	return onFound, watch
}

func (ls *lookups) shutdown() {
	// Cancelled under mu: lookUpLater and settleLater check ctx under mu
	// before they add to wg, so none adds after the Wait below began (an
	// Add racing a Wait at zero is a misuse, and its goroutine would
	// outlive Close).
	ls.mu.Lock()
	ls.cancel()
	ls.mu.Unlock()
	ls.wg.Wait()
}
