package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// BreakerPolicy configures the circuit breaker every call of a Client goes
// through. The breaker remembers that the ledger cannot be reached, so that
// a gateway stops paying the retry budget on every request:
//
//   - closed: calls go to the ledger. The breaker opens when no answer
//     has arrived from the ledger for DetectTimeout and either
//     FailureThreshold attempts in a row got none (reset or refused
//     connections, timeouts, UNAVAILABLE) or an attempt has waited that
//     long (a blackholed ledger). DetectTimeout therefore bounds the first
//     detection under traffic, while random losses among answers that keep
//     arriving never open it. The attempts still waiting when it opens are
//     abandoned (their answers count as lost: a lost Reserve is looked up
//     by id later, in the background).
//   - open: every call fails at once with an UNAVAILABLE error matching
//     ErrLedgerUnreachable (nothing is sent, so nothing can have been
//     applied), and Emergency serves from its shards without waiting.
//   - half-open: after a wait with exponential backoff and jitter (from
//     ProbeBase, doubling per failed probe up to ProbeMax, each wait drawn
//     uniformly from [d/2, d)), the breaker sends one probe of its own
//     (a GetReservation of a reserved probe id; any answer, even NOT_FOUND
//     or UNAUTHENTICATED, proves the ledger reachable). Callers keep
//     failing fast meanwhile; an answered probe closes the breaker. One
//     probe loop runs at a time: when a caller's answer closes the breaker
//     and it opens again before the loop's next probe, the loop's wait
//     starts again from ProbeBase.
//
// Audit calls never arm the DetectTimeout watchdog (an audit of a large
// ledger may legitimately take long).
type BreakerPolicy struct {
	// Disabled turns the breaker off: every call pays its own retries.
	Disabled bool
	// FailureThreshold is the number of consecutive unanswered attempts
	// that open the breaker (default 3).
	FailureThreshold int
	// DetectTimeout is how long an attempt may wait with no answer from
	// the ledger at all before the breaker opens (default 1s; it has an
	// effect only when shorter than the call timeout).
	DetectTimeout time.Duration
	// ProbeBase and ProbeMax bound the waits between probes (default
	// 200ms and 5s).
	ProbeBase time.Duration
	ProbeMax  time.Duration
}

// DefaultBreakerPolicy is used when New gets no WithBreaker option.
var DefaultBreakerPolicy = BreakerPolicy{FailureThreshold: 3, DetectTimeout: time.Second, ProbeBase: 200 * time.Millisecond, ProbeMax: 5 * time.Second}

func (p BreakerPolicy) withDefaults() BreakerPolicy {
	d := DefaultBreakerPolicy
	if p.FailureThreshold <= 0 {
		p.FailureThreshold = d.FailureThreshold
	}
	if p.DetectTimeout <= 0 {
		p.DetectTimeout = d.DetectTimeout
	}
	if p.ProbeBase <= 0 {
		p.ProbeBase = d.ProbeBase
	}
	if p.ProbeMax < p.ProbeBase {
		p.ProbeMax = max(d.ProbeMax, p.ProbeBase)
	}
	return p
}

// WithBreaker replaces DefaultBreakerPolicy.
func WithBreaker(p BreakerPolicy) Option { return func(c *config) { c.breaker = p } }

// ErrLedgerUnreachable is what calls fail with (wrapped in a connect error
// of code UNAVAILABLE) while the Client's breaker is open.
var ErrLedgerUnreachable = errors.New("ledger unreachable (circuit breaker open)")

// BreakerState is the state of a Client's circuit breaker.
type BreakerState int

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "closed"
}

// BreakerStats is a snapshot of a Client's breaker.
type BreakerStats struct {
	State BreakerState
	// Trips counts closed -> open transitions; Probes the probes sent.
	Trips, Probes int64
	// OpenedAt is when the breaker last opened (zero if never).
	OpenedAt time.Time
}

// Breaker returns a snapshot of the Client's circuit breaker.
func (c *Client) Breaker() BreakerStats { return c.breaker.stats() }

func (b *breaker) stats() BreakerStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BreakerStats{State: b.state, Trips: b.trips, Probes: b.probes, OpenedAt: b.openedAt}
}

// probeID is the reservation id the breaker's probe looks up.
const probeID = "capledger-sdk-breaker-probe"

type breaker struct {
	policy   BreakerPolicy
	disabled bool
	probe    func(ctx context.Context) error
	// open mirrors state != closed for the lock-free fast path; it is
	// written only under mu.
	open atomic.Bool

	// mu orders answers and decisions to open: an answer counted before a
	// decision prevents it, one after it closes the breaker again, so an
	// answer never leaves the breaker open behind it.
	mu sync.Mutex
	// answers counts answers received (a watchdog compares it);
	// lastAnswer is when the last one arrived.
	answers    uint64
	lastAnswer time.Time
	state      BreakerState
	failures   int
	wait       time.Duration
	trips      int64
	probes     int64
	openedAt   time.Time
	inflight   map[uint64]context.CancelFunc
	nextID     uint64
	// closedCh is closed when the breaker closes (a new one per trip).
	closedCh chan struct{}
	// probing is true while the probe loop runs (from the trip that
	// starts it until it sees the breaker closed): a trip while it runs
	// starts no second loop but signals rearm, which starts the loop's
	// wait again from ProbeBase.
	probing bool
	rearm   chan struct{}
	stop    chan struct{}
	stopped bool
	wg      sync.WaitGroup
}

func newBreaker(p BreakerPolicy, probe func(ctx context.Context) error) *breaker {
	b := &breaker{policy: p.withDefaults(), disabled: p.Disabled, probe: probe,
		inflight: map[uint64]context.CancelFunc{}, stop: make(chan struct{}), rearm: make(chan struct{}, 1)}
	b.closedCh = make(chan struct{})
	close(b.closedCh)
	// A new client has not had the chance to hear from the ledger yet.
	b.lastAnswer = time.Now()
	return b
}

// errOpen is the error of a call refused while the breaker is open.
func errOpen() error { return connect.NewError(connect.CodeUnavailable, ErrLedgerUnreachable) }

// allow returns nil when an attempt may go to the ledger, errOpen otherwise.
func (b *breaker) allow() error {
	if b.disabled || !b.open.Load() {
		return nil
	}
	return errOpen()
}

type slowCallKey struct{}

// attempt registers one attempt: its cancel is called if the breaker
// opens while it waits, and a watchdog opens the breaker if no answer at
// all arrives within DetectTimeout. end must be called with its outcome.
func (b *breaker) attempt(ctx context.Context, timeout time.Duration, cancel context.CancelFunc) (end func(ctx context.Context, err error)) {
	if b.disabled {
		return func(context.Context, error) {}
	}
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	b.inflight[id] = cancel
	seen := b.answers
	b.mu.Unlock()
	var watchdog *time.Timer
	if b.policy.DetectTimeout < timeout && ctx.Value(slowCallKey{}) == nil {
		watchdog = time.AfterFunc(b.policy.DetectTimeout, func() { b.watchdogFired(seen) })
	}
	return func(ctx context.Context, err error) {
		if watchdog != nil {
			watchdog.Stop()
		}
		b.mu.Lock()
		delete(b.inflight, id)
		b.mu.Unlock()
		switch {
		case err == nil || !isTransportFault(err):
			b.answered()
		case ctx.Err() != nil:
			// The caller gave up (or the breaker abandoned it): says
			// nothing about the ledger.
		default:
			b.failed()
		}
	}
}

// watchdogFired opens the breaker unless an answer arrived since the
// watchdog's attempt began (seen is the count of answers then).
func (b *breaker) watchdogFired(seen uint64) {
	b.tripIf(func() bool { return b.answers == seen })
}

// answered records an answer from the ledger: any answer proves it
// reachable and closes the breaker.
func (b *breaker) answered() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answers++
	b.lastAnswer = time.Now()
	b.failures = 0
	b.closeLocked()
}

func (b *breaker) failed() {
	b.tripIf(func() bool {
		b.failures++ // only counted while closed: closing resets it
		// Random losses among answers that keep arriving are not an
		// outage: only failures with no answer for DetectTimeout open
		// the breaker.
		silent := time.Since(b.lastAnswer) >= b.policy.DetectTimeout
		return b.failures >= b.policy.FailureThreshold && silent
	})
}

// tripIf opens the breaker if it is closed and due() holds, abandons the
// attempts in flight and starts the prober, or, when the prober of an
// earlier trip still runs (an answer closed the breaker while it slept),
// starts its wait again from ProbeBase: one probe loop at a time. due runs
// under mu, so it sees every answer that arrived before the decision (see
// mu).
func (b *breaker) tripIf(due func() bool) {
	b.mu.Lock()
	if b.state != BreakerClosed || b.stopped || !due() {
		b.mu.Unlock()
		return
	}
	b.state = BreakerOpen
	b.open.Store(true)
	b.trips++
	b.openedAt = time.Now()
	b.wait = b.policy.ProbeBase
	b.closedCh = make(chan struct{})
	cancels := make([]context.CancelFunc, 0, len(b.inflight))
	for _, c := range b.inflight {
		cancels = append(cancels, c)
	}
	startProber := !b.probing
	if startProber {
		b.probing = true
		b.wg.Add(1)
	} else {
		select {
		case b.rearm <- struct{}{}:
		default: // already signalled
		}
	}
	b.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	if startProber {
		go b.probeLoop()
	}
}

// closeLocked closes the breaker if it is open; mu is held.
func (b *breaker) closeLocked() {
	if b.state == BreakerClosed {
		return
	}
	b.state = BreakerClosed
	b.failures = 0
	b.open.Store(false)
	close(b.closedCh)
}

// probeLoop probes with backoff and jitter until it finds the breaker
// closed (by its own answered probe or a caller's answer) or the client
// closes. It decides to end under mu, where tripIf decides whether a loop
// runs, so a trip either finds the loop still running (and rearms it) or
// starts the next one.
func (b *breaker) probeLoop() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		wait := b.wait
		b.mu.Unlock()
		jittered := halfJitter(wait)
		t := time.NewTimer(jittered)
		select {
		case <-b.stop:
			t.Stop()
			return
		case <-b.rearm:
			t.Stop()
			continue // tripped again: wait from ProbeBase (b.wait) anew
		case <-t.C:
		}
		b.mu.Lock()
		if b.state == BreakerClosed {
			b.probingEndsLocked()
			b.mu.Unlock()
			return // a caller's answer closed it
		}
		b.state = BreakerHalfOpen
		b.probes++
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), b.policy.DetectTimeout)
		go func() {
			select {
			case <-b.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		err := b.probe(ctx)
		cancel()
		if err == nil || !isTransportFault(err) {
			b.answered()
		}
		b.mu.Lock()
		switch b.state {
		case BreakerClosed:
			b.probingEndsLocked()
			b.mu.Unlock()
			return
		case BreakerHalfOpen:
			b.state = BreakerOpen
			b.wait = min(2*b.wait, b.policy.ProbeMax)
		}
		// BreakerOpen: closed and tripped again during the probe; the
		// trip set the wait back to ProbeBase.
		b.mu.Unlock()
	}
}

// probingEndsLocked records that the probe loop ends; mu is held. A rearm
// signalled meanwhile is dropped with it: the next trip starts its own
// loop, which waits from ProbeBase anyway.
func (b *breaker) probingEndsLocked() {
	b.probing = false
	select {
	case <-b.rearm:
	default:
	}
}

// WaitReachable returns nil once the Client's breaker is closed (at once
// when it is), or ctx's error. Call it before Emergency.Reconcile after an
// outage: while the breaker is open every call fails fast.
func (c *Client) WaitReachable(ctx context.Context) error {
	select {
	case <-c.breaker.closedChan():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closedChan returns a channel closed once the breaker is closed.
func (b *breaker) closedChan() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closedCh
}

func (b *breaker) shutdown() {
	b.mu.Lock()
	if !b.stopped {
		b.stopped = true
		close(b.stop)
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// probeLedger is the breaker's probe: one GetReservation of probeID.
func (c *Client) probeLedger(ctx context.Context) error {
	_, err := c.rpc.GetReservation(ctx, connect.NewRequest(&ledgerv1.GetReservationRequest{ReservationId: probeID}))
	return err
}
