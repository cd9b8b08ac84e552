package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/sched"
)

// ErrQueueFull is returned when a tenant already has as many requests
// waiting in the FairQueue as it may; the middleware answers 429.
var ErrQueueFull = errors.New("fair queue: tenant queue is full")

// ErrCostTooLarge is returned for a request whose reserved amount of the
// cost unit is above sched.MaxCost (2^32): the queue cannot charge it
// that cost, and charging it less would give its tenant more than its
// share. The middleware answers 429 RESERVATION_TOO_LARGE without
// Retry-After (no wait helps) and releases the reservation.
var ErrCostTooLarge = errors.New("fair queue: reserved cost above the largest the queue can charge (2^32 of the cost unit)")

// FairQueueConfig configures a FairQueue.
type FairQueueConfig struct {
	// Concurrency is how many requests the backend runs at once (required).
	Concurrency int
	// CostUnit names the unit whose reserved amount is a request's cost in
	// the fair share (e.g. "tokens"). Empty: every request costs 1. A
	// reservation of more than sched.MaxCost (2^32) of it is refused
	// (ErrCostTooLarge); an actual usage above that is charged as 2^32
	// in the share (the ledger settles all of it), and a reservation
	// without the unit costs 1.
	CostUnit string
	// MaxQueuePerTenant bounds each tenant's waiting requests (0:
	// sched.DefaultMaxQueuePerTenant). One whose caller left is not
	// counted, but sched keeps it until its turn, in room for 4 times
	// this per tenant: a tenant holding that many is refused too.
	MaxQueuePerTenant int
	// Quantum and PriorityMode are passed to sched.Config.
	Quantum      int64
	PriorityMode sched.PriorityMode
	// Weight returns a tenant's fair-share weight and priority level. Nil:
	// the policy's fairness_weight and priority, read once per generation
	// with GetPolicy and kept for the PolicyCache generations used last
	// (one evicted is read again when it comes back). The read runs in
	// the background, one per generation at a time and at most
	// MaxPolicyReads at once; a request waits for it at most PolicyWait
	// from the read's start, and meanwhile, or when it fails (the ledger
	// unreachable) or cannot start (MaxPolicyReads in flight), takes the
	// weight last read for its subject, route and region, kept for the
	// PolicyCache keys used last (weight 1, priority 0 if none was, or
	// it was evicted).
	Weight func(ctx context.Context, subject string, res *ledgerv1.Reservation) (weight int64, priority int)
	// PolicyWait bounds the wait for a policy read (0: DefaultPolicyWait).
	PolicyWait time.Duration
	// PolicyCache bounds each of the two caches of the default Weight:
	// weights by generation, and the last weight by subject, route and
	// region (0: DefaultPolicyCache). Each holds at most this many
	// entries and drops the least recently used. An entry costs about
	// 110 bytes in the first and 260 bytes plus its subject, route and
	// region in the second (measured on amd64); a gateway whose tenants
	// in use outnumber it reads evicted generations again, and in a
	// partition gives an evicted subject weight 1, priority 0.
	PolicyCache int
	// Meter, if set, records every enqueue, dispatch and settle (read it
	// through FairQueue.Meter, which takes the queue's lock).
	Meter *sched.Meter
}

// DefaultPolicyWait is how long requests wait for a FairQueue's policy
// read by default: the breaker's default DetectTimeout.
const DefaultPolicyWait = time.Second

// DefaultPolicyCache is how many entries each of a FairQueue's policy
// caches keeps by default: about 26 MB for both when full (subjects of
// 16 bytes).
const DefaultPolicyCache = 1 << 16

// MaxPolicyReads bounds a FairQueue's policy reads in flight: in a
// partition each may run through its retries for minutes, and requests of
// as many new generations must not start as many goroutines.
const MaxPolicyReads = 64

// FairQueue holds already-RESERVED requests in front of a backend that
// runs at most Concurrency of them at once, and dispatches among tenants
// by weight (package sched: weighted fair queuing on the reserved cost,
// corrected by the settled cost). It never admits anything: only requests
// the ledger reserved enter it. Safe for concurrent use.
type FairQueue struct {
	client   *Client
	costUnit string
	weight   func(ctx context.Context, subject string, res *ledgerv1.Reservation) (int64, int)

	mu       sync.Mutex
	s        *sched.Scheduler
	meter    *sched.Meter
	free     int
	maxQueue int
	waiters  map[string]*waiter
	live     map[string]int // waiting (not abandoned) requests per tenant
	waiting  int            // the sum of live: what Stats reports as queued

	policyMu sync.Mutex
	// policies holds the share of each generation read (generations are
	// immutable), lastShare the share last read per policy key; reads
	// are the GetPolicy calls in flight (at most MaxPolicyReads).
	policies   *lru[uint64, fairShare]
	lastShare  *lru[ledger.PolicyKey, fairShare]
	reads      map[uint64]*policyRead
	maxReads   int // MaxPolicyReads (a test lowers it)
	policyWait time.Duration
}

// fairShare is what the queue keeps of a policy: its fairness weight
// (within sched's bounds) and priority.
type fairShare struct {
	weight   int64
	priority int
}

// shareOf returns p's fair share, its weight clamped to [1, sched.MaxWeight].
func shareOf(p *ledgerv1.Policy) fairShare {
	return fairShare{weight: min(max(p.GetFairnessWeight(), 1), sched.MaxWeight), priority: int(p.GetPriority())}
}

// policyRead is a GetPolicy in flight; done is closed when it ends, with
// read set (and share) if it succeeded.
type policyRead struct {
	started time.Time
	done    chan struct{}
	read    bool
	share   fairShare
}

type waiter struct {
	tenant     string
	ready      chan struct{}
	dispatched bool
	abandoned  bool
}

// NewFairQueue returns a FairQueue for requests reserved through c, or an
// error for a Concurrency below 1 or a configuration sched refuses.
func (c *Client) NewFairQueue(cfg FairQueueConfig) (*FairQueue, error) {
	if cfg.Concurrency < 1 {
		return nil, fmt.Errorf("fair queue: concurrency must be at least 1, got %d", cfg.Concurrency)
	}
	maxQueue := cfg.MaxQueuePerTenant
	if maxQueue <= 0 {
		maxQueue = sched.DefaultMaxQueuePerTenant
	}
	// sched cannot remove a queued request, so one whose caller gave up
	// stays queued until its turn (then it is skipped). The queue counts
	// only live waiters against the per-tenant limit and gives sched room
	// for the abandoned ones. acquire declares the tenant right before
	// each Enqueue, under q.mu, so sched need not keep the declarations of
	// tenants it forgot (ForgetDeclarations): it holds only tenants in use.
	s, err := sched.New(sched.Config{Quantum: cfg.Quantum, MaxQueuePerTenant: 4 * maxQueue, PriorityMode: cfg.PriorityMode, Meter: cfg.Meter, ForgetDeclarations: true})
	if err != nil {
		return nil, fmt.Errorf("fair queue: %w", err)
	}
	q := &FairQueue{
		client: c, costUnit: cfg.CostUnit, weight: cfg.Weight,
		s: s, meter: cfg.Meter, free: cfg.Concurrency, maxQueue: maxQueue,
		waiters:    make(map[string]*waiter),
		live:       make(map[string]int),
		reads:      make(map[uint64]*policyRead),
		maxReads:   MaxPolicyReads,
		policyWait: cfg.PolicyWait,
	}
	cacheSize := cfg.PolicyCache
	if cacheSize <= 0 {
		cacheSize = DefaultPolicyCache
	}
	q.policies = newLRU[uint64, fairShare](cacheSize)
	q.lastShare = newLRU[ledger.PolicyKey, fairShare](cacheSize)
	if q.policyWait <= 0 {
		q.policyWait = DefaultPolicyWait
	}
	if q.weight == nil {
		q.weight = q.policyWeight
	}
	return q, nil
}

// Meter calls f with the queue's meter under the queue's lock (the meter is
// not safe for concurrent use on its own). It does nothing without one.
func (q *FairQueue) Meter(f func(m *sched.Meter)) {
	if q.meter == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	f(q.meter)
}

// Stats returns the requests waiting and running now. A request whose
// caller gave up while waiting is not counted, though sched keeps it
// until its turn (then it is skipped).
func (q *FairQueue) Stats() (queued, running int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting, q.s.InFlight()
}

// policyWeight reads the fairness weight and priority of the policy that
// admitted res, caching each generation (generations are immutable) in
// an LRU. An uncached generation is read in the background (one read
// per generation at a time, at most MaxPolicyReads at once, on the
// Client's background context: bounded, and ended by Close); the caller
// waits for it at most policyWait from the read's start, so a partition
// costs a request at most that, and requests arriving later not even
// that. Without the policy it takes the last one read for the same
// subject, route and region, else weight 1, priority 0.
func (q *FairQueue) policyWeight(ctx context.Context, _ string, res *ledgerv1.Reservation) (int64, int) {
	gen := res.GetPolicyGeneration()
	key := ledger.PolicyKey{Subject: res.GetSubject(), Route: res.GetRoute(), Region: res.GetRegion()}
	q.policyMu.Lock()
	share, ok := q.policies.Get(gen)
	read := q.reads[gen]
	if !ok && read == nil && len(q.reads) < q.maxReads {
		read = &policyRead{started: time.Now(), done: make(chan struct{})}
		if q.client.goBackground(func(bctx context.Context) { q.readPolicy(bctx, gen, read) }) {
			q.reads[gen] = read
		} else {
			read = nil // the Client is closed
		}
	}
	last, lastOK := q.lastShare.Get(key)
	q.policyMu.Unlock()
	if !ok && read != nil {
		t := time.NewTimer(time.Until(read.started.Add(q.policyWait)))
		select {
		case <-read.done:
			share, ok = read.share, read.read
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	switch {
	case ok && (!lastOK || share != last):
		q.policyMu.Lock()
		q.lastShare.Put(key, share)
		q.policyMu.Unlock()
	case !ok && lastOK:
		share = last
	case !ok:
		share = fairShare{weight: 1}
	}
	return share.weight, share.priority
}

// readPolicy is one background read of generation gen's policy.
func (q *FairQueue) readPolicy(ctx context.Context, gen uint64, read *policyRead) {
	got, err := q.client.GetPolicy(ctx, gen)
	q.policyMu.Lock()
	defer q.policyMu.Unlock()
	delete(q.reads, gen)
	if err == nil {
		read.share, read.read = shareOf(got), true
		q.policies.Put(gen, read.share)
	}
	close(read.done)
}

// cost is a request's cost in the fair share: its reserved amount of the
// cost unit, at least 1; ErrCostTooLarge above sched.MaxCost (clamping it
// would undercharge its tenant).
func (q *FairQueue) cost(units Units) (int64, error) {
	if q.costUnit == "" {
		return 1, nil
	}
	n := units[q.costUnit]
	if n > sched.MaxCost {
		return 0, fmt.Errorf("%w: %d %s reserved", ErrCostTooLarge, n, q.costUnit)
	}
	return max(n, 1), nil
}

// acquire queues the reserved request and waits for its dispatch. It
// returns the function to call, exactly once, with the actual units when
// the backend is done (it frees the slot and corrects the tenant's share);
// ErrQueueFull when the tenant's queue is full; ctx.Err() when ctx ends
// while it waits (the queue then drops the request when its turn comes).
func (q *FairQueue) acquire(ctx context.Context, rr *ReserveResult) (func(actual Units), error) {
	res := rr.Reservation
	cost, err := q.cost(res.GetReservedUnits())
	if err != nil {
		return nil, err
	}
	subject := res.GetSubject()
	weight, priority := q.weight(ctx, subject, res)
	id := rr.ReservationID
	w := &waiter{tenant: subject, ready: make(chan struct{})}

	q.mu.Lock()
	// No sched call between this declaration and the Enqueue below: with
	// ForgetDeclarations it may lapse at the next one.
	if err := q.s.SetTenant(subject, weight, priority); err != nil {
		q.mu.Unlock()
		return nil, fmt.Errorf("fair queue: tenant %s: %w", subject, err)
	}
	if q.live[subject] >= q.maxQueue {
		q.mu.Unlock()
		return nil, ErrQueueFull
	}
	if err := q.s.Enqueue(sched.Request{ReservationID: id, Tenant: subject, EstimatedCost: cost}); err != nil {
		q.mu.Unlock()
		if errors.Is(err, sched.ErrQueueFull) {
			return nil, ErrQueueFull
		}
		return nil, fmt.Errorf("fair queue: %w", err)
	}
	q.waiters[id] = w
	q.live[subject]++
	q.waiting++
	q.dispatchLocked()
	q.mu.Unlock()

	var once sync.Once
	done := func(actual Units) {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			// The id is dispatched and unsettled here, so Settle cannot
			// fail with ErrUnknownDispatch. The work ran: an actual cost
			// above MaxCost is charged as MaxCost (sched takes no more;
			// refusing it would leave the slot taken).
			_ = q.s.Settle(id, min(max(actual[q.costUnit], 0), sched.MaxCost))
			q.free++
			q.dispatchLocked()
		})
	}
	if q.costUnit == "" {
		done = func(actual Units) {
			once.Do(func() {
				q.mu.Lock()
				defer q.mu.Unlock()
				// Every request costs 1; a request that never ran costs 0.
				cost := int64(1)
				if actual == nil {
					cost = 0
				}
				_ = q.s.Settle(id, cost)
				q.free++
				q.dispatchLocked()
			})
		}
	}

	select {
	case <-w.ready:
		return done, nil
	case <-ctx.Done():
		q.mu.Lock()
		if w.dispatched {
			// Dispatched while we gave up: hand the slot back.
			q.mu.Unlock()
			done(nil)
			return nil, ctx.Err()
		}
		w.abandoned = true
		q.unlive(w.tenant)
		q.mu.Unlock()
		return nil, ctx.Err()
	}
}

// dispatchLocked hands free backend slots to the next requests in fair
// order. A request whose caller gave up while waiting is settled at cost 0
// and skipped (sched has no removal: the order of the others is kept).
func (q *FairQueue) dispatchLocked() {
	for q.free > 0 {
		req, ok := q.s.Dispatch()
		if !ok {
			return
		}
		w := q.waiters[req.ReservationID]
		delete(q.waiters, req.ReservationID)
		if w == nil || w.abandoned {
			_ = q.s.Settle(req.ReservationID, 0)
			continue
		}
		q.free--
		q.unlive(w.tenant)
		w.dispatched = true
		close(w.ready)
	}
}

func (q *FairQueue) unlive(tenant string) {
	q.waiting--
	if q.live[tenant]--; q.live[tenant] <= 0 {
		delete(q.live, tenant)
	}
}
