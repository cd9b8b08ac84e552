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
// Reserve. onFound, if not nil, runs with the reservation if the lookup
// finds the id admitted; it is registered before the lookup can end, so
// it never misses the finding.
func (c *Client) lookUpLater(id, digest string, onFound func(*ledgerv1.Reservation)) {
	c.startLookup(id, digest, onFound, false)
}

// watchLostReserve is lookUpLater for a lost Reserve whose late landing
// matters: a Reserve still in flight may land after a not-found answer,
// so that answer resolves the lookup (LostReserves drops it, the handler
// hears of it) but does not end it. It keeps asking, backing off to
// maxWatchWait, for the rest of the lookup window
// (DefaultLostReserveLookup), and runs onFound if the id lands in it.
// Emergency watches the ids it may serve from its shard, so a late
// central hold is released instead of held until its TTL.
func (c *Client) watchLostReserve(id, digest string, onFound func(*ledgerv1.Reservation)) {
	c.startLookup(id, digest, onFound, true)
}

// maxWatchWait bounds the wait between two not-found answers of a
// watched lookup: about 25 lookups over DefaultLostReserveLookup.
const maxWatchWait = 30 * time.Second

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

type lostReserveFoundKey struct{}

// withLostReserveFound returns ctx carrying f for a Reserve made under it:
// if that Reserve's answers are lost, its id is watched in the background
// (watchLostReserve, even when the ledger answers not found at once), and
// f runs with the reservation when the watch finds it admitted (Emergency
// releases the central hold of a request it served from its shard).
func withLostReserveFound(ctx context.Context, f func(*ledgerv1.Reservation)) context.Context {
	return context.WithValue(ctx, lostReserveFoundKey{}, f)
}

func lostReserveFound(ctx context.Context) func(*ledgerv1.Reservation) {
	f, _ := ctx.Value(lostReserveFoundKey{}).(func(*ledgerv1.Reservation))
	return f
}

func (c *Client) lookUp(l *lookup) {
	ls := c.lookups
	defer ls.wg.Done()
	ctx, cancel := context.WithTimeout(ls.ctx, DefaultLostReserveLookup)
	defer cancel()
	wait := 100 * time.Millisecond
	// finished is set once a watched lookup was answered not found: it is
	// resolved (LostReserves no longer lists it) but keeps watching.
	finished := false
	for {
		select {
		case <-ctx.Done():
			if !finished {
				c.finishLookup(l, nil, ctx.Err())
			}
			return
		case <-c.breaker.closedChan():
		}
		actx, acancel := context.WithTimeout(ctx, 2*c.timeout)
		res, err := c.ResolveReservation(actx, l.ReservationID, l.RequestDigest)
		acancel()
		switch {
		case err == nil && finished:
			// A Reserve in flight landed after the not-found answer.
			ls.mu.Lock()
			onFound := l.onFound
			ls.mu.Unlock()
			for _, f := range onFound {
				f(res)
			}
			return
		case err == nil:
			c.finishLookup(l, res, nil)
			return
		case errors.Is(err, ErrDigestMismatch):
			if !finished {
				c.finishLookup(l, nil, err)
			}
			return
		case errors.Is(err, ErrNotFound):
			ls.mu.Lock()
			watch := l.watch
			ls.mu.Unlock()
			if !finished {
				c.finishLookup(l, nil, nil)
				finished = true
			}
			if !watch {
				return
			}
		}
		t := time.NewTimer(halfJitter(wait))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if finished {
			wait = min(2*wait, maxWatchWait)
		} else {
			wait = min(2*wait, 2*time.Second)
		}
	}
}

// finishLookup records the lookup's outcome (the admitted reservation, or
// why it ended without one) under mu, where LostReserves reads it, and
// tells whoever waits for it.
func (c *Client) finishLookup(l *lookup, res *ledgerv1.Reservation, err error) {
	ls := c.lookups
	ls.mu.Lock()
	delete(ls.m, l.ReservationID)
	l.Reservation, l.Err, l.Done = res, err, true
	onFound, outcome := l.onFound, l.LostReserve
	ls.mu.Unlock()
	if res != nil {
		for _, f := range onFound {
			f(res)
		}
	}
	if ls.handler != nil {
		ls.handler(outcome)
	}
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
