package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The USAGE_UNKNOWN resolver: a worker that asks the gateway (or executor)
// of each USAGE_UNKNOWN reservation what its operation used, through an
// OperationStatusSource that cmd wires to the HTTP endpoint of
// docs/CLIENTS.md, and settles with the answer through the same Settle
// command a gateway sends. Only a receipt settles: a finished operation's
// actual units, or an authenticated "never started" (zero usage). Every
// other outcome (still running, unknown, an error of any kind) leaves the
// reservation USAGE_UNKNOWN, its capacity held and counted as consumed.

// OperationState is what an operation-status endpoint said of one
// operation.
type OperationState int

const (
	// OperationRunning: the work is still going; keep it held.
	OperationRunning OperationState = iota + 1
	// OperationFinished: the work ended and used OperationStatus.Units.
	OperationFinished
	// OperationNeverStarted: the work was never called and never will
	// be (the source vouches for this: it authenticated the answer).
	// The resolver settles it with zero usage.
	OperationNeverStarted
	// OperationUnknown: the gateway has no usage for it either; it stays
	// USAGE_UNKNOWN for an operator.
	OperationUnknown
)

func (s OperationState) String() string {
	switch s {
	case OperationRunning:
		return "running"
	case OperationFinished:
		return "finished"
	case OperationNeverStarted:
		return "never_started"
	case OperationUnknown:
		return "unknown"
	}
	return fmt.Sprintf("OperationState(%d)", int(s))
}

// OperationStatus is one answer of an OperationStatusSource.
type OperationStatus struct {
	State OperationState
	// Units are a finished operation's actual units by unit name (a unit
	// of the policy left out is 0, as in a Settle).
	Units map[string]ledger.Units
}

// OperationStatusSource asks the operation-status endpoint of a
// reservation's route. It returns an error for anything that is not a
// verified answer (no endpoint for the route: ErrNoStatusEndpoint; a
// timeout, a refused connection, a 5xx, garbage, an unauthenticated
// settling answer; wrap ErrUnusableStatusAnswer for an answer the
// endpoint gave); the resolver then leaves the reservation as it is and
// asks again later. It must be safe for concurrent use.
type OperationStatusSource interface {
	OperationStatus(ctx context.Context, r *ledger.Reservation) (OperationStatus, error)
}

// DefaultResolverMinBackoff is ResolverOptions.MinBackoff when unset.
const DefaultResolverMinBackoff = time.Second

// DefaultResolverMaxInFlight is ResolverOptions.MaxInFlight when unset:
// eight routes' worth of the default per-route Concurrency.
const DefaultResolverMaxInFlight = 64

// ErrNoStatusEndpoint is returned by a source for a route it has no
// endpoint for; the resolver asks about such a reservation only at its
// longest backoff.
var ErrNoStatusEndpoint = errors.New("route has no operation-status endpoint")

// ErrUnusableStatusAnswer is wrapped by a source's error for an answer the
// endpoint gave that cannot be used (a bad signature, garbage, an answer
// about another operation, a 4xx): the reservation's own failure, while
// its route answers; such a reservation stays on its backoff. Any other
// error (refused, a timeout, a 5xx) says the route could not answer: when
// it answers again, the reservations whose questions failed are asked out
// of turn (see Resolver.routeDown).
var ErrUnusableStatusAnswer = errors.New("operation-status answer unusable")

// ResolverOptions configure the resolver (Options.Resolver). Zero values
// pick the defaults.
type ResolverOptions struct {
	// Source answers the status questions. Without one the resolver only
	// flags overdue reservations (Deadline).
	Source OperationStatusSource
	// Interval is how often the backlog is scanned (default 1s).
	Interval time.Duration
	// MinBackoff is the wait after the first unsettled answer, doubling
	// per answer up to MaxBackoff (defaults 1s and 1m); each wait is
	// drawn uniformly from [d/2, d) (jitter), so gateways that came back
	// together are not asked in lockstep.
	MinBackoff, MaxBackoff time.Duration
	// CallTimeout bounds one status call (default 5s).
	CallTimeout time.Duration
	// Concurrency is how many status calls run at once per route
	// (default 8). Routes are asked independently: one whose endpoint
	// hangs holds back only its own reservations.
	Concurrency int
	// MaxInFlight is how many status calls run at once across all routes
	// (default DefaultResolverMaxInFlight), so a backlog on a thousand
	// routes does not open a thousand times Concurrency connections. See
	// callSlots for how the slots are shared: a route whose endpoint
	// hangs holds at most Concurrency of them, and a freed slot goes to
	// the waiting route with the fewest calls out, so routes that answer
	// keep getting slots while others hang.
	MaxInFlight int
	// PageSize and MaxPages bound one scan: at most MaxPages pages of
	// PageSize reservations, oldest-marked first (defaults 256 and 16);
	// the next scan goes on from where this one stopped.
	PageSize, MaxPages int
	// Deadline returns the reservation's unknownDeadline (0: none). Past
	// it the reservation stays held and is flagged overdue (Overdue,
	// logged once) for an operator; it is never refunded for it.
	Deadline func(r *ledger.Reservation) time.Duration
	// Seed seeds the jitter (0: a fixed seed).
	Seed uint64
}

// ResolverStats are the resolver's cumulative counters.
type ResolverStats struct {
	// Polls counts status calls (routes without an endpoint aside);
	// Failures those that returned an error or an answer that cannot
	// settle (an unknown unit).
	Polls, Failures uint64
	// Settled counts reservations the resolver settled (a replay of a
	// settle that had landed counts too), by a finished answer or a
	// never-started one.
	Settled, SettledNeverStarted uint64
	// Overdue is the number of USAGE_UNKNOWN reservations past their
	// deadline as of the last complete scan of the backlog; Scanned is
	// true once one scan completed.
	Overdue int64
	Scanned bool
}

// unknownKey names one USAGE_UNKNOWN reservation: its account and its id.
// The resolver keeps what it learnt of a reservation under both, since
// ids are the clients': once retention forgot a reservation, another
// account may reserve under its id (and reach USAGE_UNKNOWN while this
// resolver still remembers the first), and that reservation must start
// afresh, not with the first one's backoff, attempt count or overdue
// flag. (An id reused by its own account within one pass goes on with
// the backoff: it is the same tenant's, and costs at most a wait.)
type unknownKey struct {
	account ledger.AccountKey
	id      string
}

func keyOf(r *ledger.Reservation) unknownKey { return unknownKey{r.Account, r.ID} }

// attempt is the backoff state of one reservation.
type attempt struct {
	polls   int
	next    time.Time
	flagged bool // overdue logged
	pass    uint64
	// failedAt is when its last question failed (zero after an answer);
	// unusable says that failure was an answer that could not be used
	// (ErrUnusableStatusAnswer): its own failure, not its route's, so it
	// is not asked out of turn and stays on its backoff. outOfTurnFor is
	// the comeback of its route (routeBack) it was last asked out of turn
	// for, zero after an answer (see routeDown).
	// alone says a question of it failed in a scan in which its route
	// answered another: its failures are its own, not an outage of the
	// route, so it is not asked out of turn (until it gets an answer).
	// inLane says it was handed to its route's lane and the lane is not
	// done with it: a scan meanwhile does not hand it over again.
	failedAt     time.Time
	unusable     bool
	inLane       bool
	alone        bool
	outOfTurnFor time.Time
}

// routeOutage is a route that could not answer: failer is the first
// reservation whose question failed, several that another's failed too.
type routeOutage struct {
	failer  unknownKey
	several bool
}

// routeComeback is the first answer of a route after an outage.
type routeComeback struct {
	at      time.Time
	several bool
}

// Resolver is the resolver worker. The engine runs one (Options.Resolver);
// NewResolver builds one over a Core for a driver with its own clock and
// commit path, the simulator.
type Resolver struct {
	store  store.Store
	clock  func() time.Time
	commit func(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error)
	log    *slog.Logger
	// fails rate-limits the warnings of store reads and writes that keep
	// failing (a store that is down fails every scan, once a second at
	// the default interval), as the engine's workers do: the resolver
	// worker's failLog.
	fails failLog
	opts  ResolverOptions

	mu       sync.Mutex
	rng      *rand.Rand
	attempts map[unknownKey]*attempt
	cursor   store.UnknownCursor
	pass     uint64 // scans of the whole backlog begun
	overdue  int64  // counted in the current pass
	// A route is down after a question it could not answer (refused, a
	// timeout, a 5xx) and back at its first answer after that (an
	// unusable one too: the endpoint answered): then every reservation of
	// the route whose question failed before, not with an unusable answer
	// of its own, is asked at the next scan instead of waiting out a
	// backoff that grew while the gateway was down (up to MaxBackoff: a
	// gateway that comes back for less than that would be missed). Once
	// per comeback when the questions of several reservations failed
	// (an outage: again after every later one); when only one
	// reservation's did, once until it gets an answer, so that one whose
	// own questions keep failing (a 5xx for its operation only) is not
	// asked again at every answer of its neighbours, nor is one whose
	// answers are unusable (attempt.unusable) ever, nor one whose question
	// failed in a scan in which the route answered another (attempt.alone):
	// the failures of such reservations open no outage, however many.
	routeDown map[string]*routeOutage
	routeBack map[string]routeComeback
	// lanes holds, per route, the end of its lane's last rows (startLane);
	// laneRows counts the rows its lane holds; lanesBusy counts the lane
	// goroutines (Wait).
	lanes     map[string]chan struct{}
	laneRows  map[string]int
	lanesBusy sync.WaitGroup
	// slots bounds the status calls out across all routes (MaxInFlight).
	slots *callSlots

	polls, failures, settled, neverStarted atomic.Uint64
	overdueDone                            atomic.Int64 // last complete pass; -1 before one
}

// NewResolver returns a resolver that reads the backlog from st, reads the
// time from clock, and commits its settles with commit (Engine.DoBatch,
// or Core.Commit at a simulated time; it is called from several
// goroutines at once, one per route). Call Scan (or Run, which waits for
// the answers) for each scan; neither is safe for concurrent use.
func NewResolver(st store.Store, opts ResolverOptions, clock func() time.Time,
	commit func(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error), log *slog.Logger) *Resolver {
	if log == nil {
		log = slog.Default()
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultResolverMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(time.Minute, opts.MinBackoff)
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 5 * time.Second
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultResolverMaxInFlight
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 256
	}
	if opts.MaxPages <= 0 {
		opts.MaxPages = 16
	}
	r := &Resolver{
		store: st, clock: clock, commit: commit, log: log, fails: newFailLog("resolver", log), opts: opts, attempts: map[unknownKey]*attempt{}, pass: 1,
		routeDown: map[string]*routeOutage{}, routeBack: map[string]routeComeback{},
		lanes: map[string]chan struct{}{}, laneRows: map[string]int{},
		rng:   rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		slots: newCallSlots(opts.MaxInFlight),
	}
	r.overdueDone.Store(-1)
	return r
}

// ResolverStats returns the resolver's counters (zero without a
// resolver). With the workers on, Overdue and Scanned are those of a scan
// completed in this engine's current term as worker leader: a replica that
// does not lead (never did, or lost the lease) reports none, as one that
// took the lease back reports none until it scanned again, since
// meanwhile another replica asked and the backlog changed.
func (e *Engine) ResolverStats() ResolverStats {
	if e.resolver == nil {
		return ResolverStats{}
	}
	s := e.resolver.Stats()
	if !e.runsTermOf(e.leaderWorker("resolver")) {
		s.Overdue, s.Scanned = 0, false
	}
	return s
}

// Stats returns the resolver's counters.
func (r *Resolver) Stats() ResolverStats {
	n := r.overdueDone.Load()
	return ResolverStats{
		Polls: r.polls.Load(), Failures: r.failures.Load(), Settled: r.settled.Load(),
		SettledNeverStarted: r.neverStarted.Load(), Overdue: max(n, 0), Scanned: n >= 0,
	}
}

// UnknownOverdue reports whether a USAGE_UNKNOWN reservation is past its
// deadline at now (false without a deadline or a resolver).
func (e *Engine) UnknownOverdue(r *ledger.Reservation, now time.Time) bool {
	return e.resolver != nil && e.resolver.Overdue(r, now)
}

// Overdue reports whether a USAGE_UNKNOWN reservation is past its
// deadline at now (false without a deadline).
func (r *Resolver) Overdue(res *ledger.Reservation, now time.Time) bool {
	if r.opts.Deadline == nil || res.State != ledger.StateUsageUnknown {
		return false
	}
	d := r.opts.Deadline(res)
	return d > 0 && !now.Before(res.UnknownAt.Add(d))
}

// backoff returns the wait after polls unsettled answers, jittered.
func (r *Resolver) backoff(polls int) time.Duration {
	d := r.opts.MinBackoff
	for i := 1; i < polls && d < r.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.opts.MaxBackoff)
	r.mu.Lock()
	defer r.mu.Unlock()
	return d/2 + time.Duration(r.rng.Int64N(int64(d/2)+1))
}

// Run is one scan (Scan) that then waits for every route's questions
// and settles to end (Wait): the simulator and RunResolver, whose callers
// read the outcome at once.
func (r *Resolver) Run(ctx context.Context) {
	r.Scan(ctx)
	r.Wait()
}

// Scan is one scan: up to MaxPages pages of the backlog from the cursor.
// Each page's reservations are handed to their route's lane, which asks
// about the due ones and settles with the answers on its own (askRoute),
// so a route whose endpoint hangs holds back only its own reservations:
// Scan returns without waiting for the lanes. A reservation already in a
// lane is not handed over again until its lane is done with it, and a
// route whose lane holds MaxPages pages' worth of reservations gets no
// more until it catches up (they wait for a later pass). Scan is not safe
// for concurrent use.
func (r *Resolver) Scan(ctx context.Context) { r.ScanWhile(ctx, nil) }

// ScanWhile is Scan for a resolver that may stop leading: the engine's
// worker calls it every Interval with Engine.IsLeader. Before each page
// and before each status question its lanes ask, leading is called; once
// it returns false the scan reads no more pages and the lanes ask nothing
// more of the rows it handed them: they drop them (unasked, unrecorded,
// free to be handed over again), since the replica now leading asks about
// them itself. Answers already in are still settled (a second settle
// with the same receipt replays). A nil leading always leads.
func (r *Resolver) ScanWhile(ctx context.Context, leading func() bool) {
	for range r.opts.MaxPages {
		if ctx.Err() != nil || !leads(leading) {
			return
		}
		r.mu.Lock()
		after := r.cursor
		r.mu.Unlock()
		rows, err := r.store.ReservationsUnknown(ctx, store.UnknownFilter{After: after, Limit: r.opts.PageSize})
		if err != nil {
			if ctx.Err() == nil {
				r.fails.failed("resolver: read backlog", err)
			}
			return
		}
		r.fails.ok("resolver: read backlog")
		r.page(ctx, rows, leading)
		r.mu.Lock()
		if len(rows) < r.opts.PageSize {
			r.endPass()
			r.mu.Unlock()
			r.pruneAnswers(ctx)
			return
		}
		last := rows[len(rows)-1]
		r.cursor = store.UnknownCursor{MarkedAt: last.UnknownAt, ID: last.ID}
		r.mu.Unlock()
	}
}

// Wait waits until every lane has finished what Scan handed it.
func (r *Resolver) Wait() { r.lanesBusy.Wait() }

// leads calls leading, if any.
func leads(leading func() bool) bool { return leading == nil || leading() }

// endPass closes a scan of the whole backlog: it publishes the overdue
// count and forgets the reservations the pass did not see (settled by
// someone). The caller holds mu.
func (r *Resolver) endPass() {
	r.overdueDone.Store(r.overdue)
	for id, a := range r.attempts {
		if a.pass != r.pass {
			delete(r.attempts, id)
		}
	}
	r.pass++
	r.overdue = 0
	r.cursor = store.UnknownCursor{}
}

// restartPass forgets the overdue count of the last complete scan and
// starts the next scan at the oldest of the backlog, as a new pass: the
// engine's worker calls it when this replica begins a term as worker
// leader. The backoff of the reservations it knows is kept.
func (r *Resolver) restartPass() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overdueDone.Store(-1)
	r.pass++
	r.overdue = 0
	r.cursor = store.UnknownCursor{}
}

// page handles one page of the backlog: it counts the overdue and hands
// each route's reservations to the route's lane (startLane).
func (r *Resolver) page(ctx context.Context, rows []ledger.Reservation, leading func() bool) {
	now := r.clock()
	stored := r.storedAnswers(ctx, rows)
	byRoute := map[string][]*ledger.Reservation{}
	var routes []string
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range rows {
		row := &rows[i]
		a := r.attempts[keyOf(row)]
		if a == nil {
			a = &attempt{}
			if prev, ok := stored[keyOf(row)]; ok {
				// Asked before this resolver started (a restart, or
				// another replica led): go on with that backoff.
				a.polls, a.next = int(prev.Attempts), prev.NextAt
			}
			r.attempts[keyOf(row)] = a
		}
		a.pass = r.pass
		if r.opts.Deadline != nil {
			if d := r.opts.Deadline(row); d > 0 && !now.Before(row.UnknownAt.Add(d)) {
				r.overdue++
				if !a.flagged {
					a.flagged = true
					r.log.Warn("USAGE_UNKNOWN past its deadline: held, needs an operator",
						"reservation", row.ID, "operation", row.OperationID, "subject", row.Account.Subject,
						"route", row.Account.Route, "marked", row.UnknownAt, "deadline", d)
				}
			}
		}
		route := row.Account.Route
		if r.opts.Source == nil || a.inLane || r.laneRows[route] >= r.opts.PageSize*r.opts.MaxPages {
			continue
		}
		a.inLane = true
		r.laneRows[route]++
		if byRoute[route] == nil {
			routes = append(routes, route)
		}
		byRoute[route] = append(byRoute[route], row)
	}
	for _, route := range routes {
		r.startLane(ctx, route, byRoute[route], leading)
	}
}

// startLane hands rows, all of route, to the route's lane: a goroutine
// that first waits for the lane's previous rows (so a route's questions,
// answers and backoff draws keep the order of the backlog, and the
// outage rules see one route's scans one after another), then asks about
// them (askRoute) while leading says so. The caller holds mu.
func (r *Resolver) startLane(ctx context.Context, route string, rows []*ledger.Reservation, leading func() bool) {
	prev := r.lanes[route]
	done := make(chan struct{})
	r.lanes[route] = done
	r.lanesBusy.Add(1)
	go func() {
		defer r.lanesBusy.Done()
		defer close(done)
		if prev != nil {
			<-prev
		}
		if ctx.Err() == nil && leads(leading) {
			r.askRoute(ctx, route, rows, leading)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, row := range rows {
			if a := r.attempts[keyOf(row)]; a != nil {
				a.inLane = false
			}
		}
		r.laneRows[route] -= len(rows)
		if r.lanes[route] == done {
			delete(r.lanes, route)
		}
	}()
}

// askRoute asks about the due ones of rows, all of route, and settles
// with the answers. Which are due is decided now, when the lane gets to
// them, with what the route's earlier questions taught (routeBack). It
// asks at most Concurrency at once, each in one of the resolver's slots
// (callSlots), and stops asking when leading says this replica no longer
// leads or ctx ends: the due ones not asked are left as they were.
func (r *Resolver) askRoute(ctx context.Context, route string, rows []*ledger.Reservation, leading func() bool) {
	now := r.clock()
	var due []*ledger.Reservation
	r.mu.Lock()
	for _, row := range rows {
		a := r.attempts[keyOf(row)]
		if a == nil {
			continue // left USAGE_UNKNOWN meanwhile (a pass did not see it)
		}
		if !now.Before(a.next) {
			due = append(due, row)
		} else if back, ok := r.routeBack[row.Account.Route]; ok && !a.failedAt.IsZero() && !a.unusable && !a.alone && back.at.After(a.failedAt) &&
			((back.several && a.outOfTurnFor.Before(back.at)) || a.outOfTurnFor.IsZero()) {
			a.outOfTurnFor = back.at
			due = append(due, row)
		}
	}
	r.mu.Unlock()
	if len(due) == 0 {
		return
	}
	answers := make([]OperationStatus, len(due))
	errs := make([]error, len(due))
	sem := make(chan struct{}, r.opts.Concurrency)
	var wg sync.WaitGroup
	asked := 0
	for i := range due {
		// The route's own slot first, then a global one: a lane waits
		// for a global slot with at most one question (callSlots.waiting
		// holds one entry per route), and a hanging route holds at most
		// Concurrency global slots.
		sem <- struct{}{}
		if !r.slots.acquire(ctx, route) {
			<-sem
			break
		}
		// Checked after the wait for the slots, just before asking: a
		// replica that stopped leading while it waited asks nothing more.
		if !leads(leading) {
			r.slots.release(route)
			<-sem
			break
		}
		asked++
		wg.Add(1)
		go func() {
			defer func() { r.slots.release(route); <-sem; wg.Done() }()
			cctx, cancel := context.WithTimeout(ctx, r.opts.CallTimeout)
			defer cancel()
			answers[i], errs[i] = r.opts.Source.OperationStatus(cctx, due[i])
		}()
	}
	wg.Wait()
	// Those not asked (leadership lost, ctx ended) keep their state: no
	// failure recorded, no backoff drawn; the lane drops them.
	due, answers, errs = due[:asked], answers[:asked], errs[:asked]
	if asked == 0 {
		return
	}

	// heard[i] is the answer recorded for due[i] once its next question
	// is scheduled (recordAnswers); a settled one is not recorded.
	heard := make([]store.ResolverAnswer, len(due))
	defer r.recordAnswers(ctx, due, heard, now)
	var cmds []ledger.Command
	var settling []int
	// A route that answered any question of this scan was not down for it:
	// the questions of it that failed failed on their own.
	answered := map[string]bool{}
	for i, row := range due {
		if errs[i] == nil || errors.Is(errs[i], ErrUnusableStatusAnswer) {
			answered[row.Account.Route] = true
		}
	}
	r.mu.Lock()
	for i, row := range due {
		a := r.attempts[keyOf(row)]
		if a == nil {
			a = &attempt{} // forgotten meanwhile: record only the route
		}
		switch {
		case errors.Is(errs[i], ErrNoStatusEndpoint):
			continue
		case errors.Is(errs[i], ErrUnusableStatusAnswer):
			a.failedAt, a.unusable = now, true
		case errs[i] != nil && (answered[route] || a.alone):
			// Once its failure was its own, its later ones are taken for
			// its own too (until it gets an answer): several such
			// reservations, failing together in a scan the route answered
			// nothing else in, would otherwise look like an outage and be
			// asked out of turn at the route's next answer, again and again.
			a.failedAt, a.unusable, a.alone = now, false, true
			continue
		case errs[i] != nil:
			a.failedAt, a.unusable, a.alone = now, false, false
			if o := r.routeDown[route]; o == nil {
				r.routeDown[route] = &routeOutage{failer: keyOf(row)}
			} else if o.failer != keyOf(row) {
				o.several = true
			}
			continue
		default:
			a.failedAt, a.unusable, a.alone, a.outOfTurnFor = time.Time{}, false, false, time.Time{}
		}
		if o := r.routeDown[route]; o != nil { // the route answered
			delete(r.routeDown, route)
			r.routeBack[route] = routeComeback{at: now, several: o.several}
		}
	}
	r.mu.Unlock()
	for i, row := range due {
		if errors.Is(errs[i], ErrNoStatusEndpoint) {
			heard[i] = store.ResolverAnswer{Answer: AnswerNoEndpoint}
			r.later(keyOf(row), true) // not a question asked: not counted
			continue
		}
		r.polls.Add(1)
		cmd, err := r.settleCommand(ctx, row, answers[i], errs[i])
		if err != nil {
			heard[i] = store.ResolverAnswer{Answer: AnswerError, Detail: err.Error()}
			if errs[i] == nil {
				heard[i].Answer = AnswerSettleRefused // an answer that cannot settle
			}
			r.failures.Add(1)
			r.later(keyOf(row), false)
			r.log.Debug("resolver: stays USAGE_UNKNOWN", "reservation", row.ID, "operation", row.OperationID, "err", err)
			continue
		}
		if cmd == nil {
			heard[i] = store.ResolverAnswer{Answer: answers[i].State.String()}
			r.later(keyOf(row), false) // running or unknown
			continue
		}
		cmds = append(cmds, *cmd)
		settling = append(settling, i)
	}
	if len(cmds) == 0 {
		return
	}
	results, err := r.commit(ctx, cmds)
	if err != nil {
		// Outcome unknown: the next scan sees whether they settled, and a
		// second settle with the same receipt replays.
		if ctx.Err() == nil {
			r.fails.failed("resolver: settle batch", err, "commands", len(cmds))
		}
		for _, i := range settling {
			heard[i] = store.ResolverAnswer{Answer: AnswerError, Detail: "settle: " + err.Error()}
			r.later(keyOf(due[i]), false)
		}
		return
	}
	r.fails.ok("resolver: settle batch")
	for k, i := range settling {
		row, res := due[i], &results[k]
		switch {
		case res.Err == nil:
			r.settled.Add(1)
			if answers[i].State == OperationNeverStarted {
				r.neverStarted.Add(1)
			}
			r.forget(keyOf(row))
		case errors.Is(res.Err, ledger.ErrReservationAlreadySettled):
			r.forget(keyOf(row)) // settled by someone else meanwhile
		default:
			// Refused (the lifetime bound, a mismatched operation):
			// it stays USAGE_UNKNOWN for an operator.
			r.log.Warn("resolver: settle refused; stays USAGE_UNKNOWN", "reservation", row.ID, "err", res.Err)
			heard[i] = store.ResolverAnswer{Answer: AnswerSettleRefused, Detail: res.Err.Error()}
			r.later(keyOf(row), true)
		}
	}
}

// settleCommand turns one answer into the settle it calls for: nil for
// running and unknown, an error for anything that cannot settle.
func (r *Resolver) settleCommand(ctx context.Context, row *ledger.Reservation, st OperationStatus, err error) (*ledger.Command, error) {
	if err != nil {
		return nil, err
	}
	var units ledger.Amounts
	switch st.State {
	case OperationRunning, OperationUnknown:
		return nil, nil
	case OperationNeverStarted:
		// zero usage, vouched for by the source
	case OperationFinished:
		p, err := r.store.PolicyGet(ctx, row.Account.Generation)
		if err != nil {
			return nil, fmt.Errorf("policy %d: %w", row.Account.Generation, err)
		}
		if len(st.Units) == 0 {
			// Every unit left out is 0, as the contract says (CLIENTS.md),
			// so it settles as zero usage; but finished work that reports
			// no usage at all more likely comes from a broken executor
			// than from free work: the operator should hear of it.
			r.log.Warn("resolver: finished answer without actualUnits; settling as zero usage", "reservation", row.ID,
				"operation", row.OperationID, "route", row.Account.Route)
		}
		for unit, n := range st.Units {
			i := p.DimensionIndex(unit)
			if i < 0 {
				return nil, fmt.Errorf("answer has unit %q, which generation %d does not limit", unit, p.Generation)
			}
			if n < 0 || n > ledger.MaxUnits {
				return nil, fmt.Errorf("answer has %s = %d", unit, n)
			}
			units[i] = n
		}
	default:
		return nil, fmt.Errorf("answer has state %v", st.State)
	}
	// Checked against row's account: the answer is about row's operation,
	// in row's units, and settles nothing that took the id since.
	return &ledger.Command{Kind: ledger.KindSettle, ReservationID: row.ID, OperationID: row.OperationID, Units: units,
		CheckedAccount: row.Account}, nil
}

// later schedules the next question about k after a backoff; longest
// goes straight to MaxBackoff.
func (r *Resolver) later(k unknownKey, longest bool) {
	r.mu.Lock()
	a := r.attempts[k]
	r.mu.Unlock()
	if a == nil {
		return
	}
	var wait time.Duration
	if longest {
		wait = r.backoff(1 << 20)
	} else {
		wait = r.backoff(a.polls + 1)
	}
	r.mu.Lock()
	a.polls++
	a.next = r.clock().Add(wait)
	r.mu.Unlock()
}

func (r *Resolver) forget(k unknownKey) {
	r.mu.Lock()
	delete(r.attempts, k)
	r.mu.Unlock()
}

// callSlots are the resolver's status-call slots across all routes
// (ResolverOptions.MaxInFlight). A lane takes one per question, after
// its route's own (Concurrency), and gives it back when the call ends.
//
// Why not a plain semaphore: a route whose endpoint hangs keeps its
// slots for a whole CallTimeout per question and always wants more, so
// with enough hanging routes every slot is held by one of them, and in
// a first-come queue a route that answers in a millisecond would, after
// each answer, queue behind every hanging route again: one question per
// round of timeouts. Here a freed slot goes to the waiting route with
// the fewest calls out (the longest-waiting among equals), so:
//   - a hanging route holds at most Concurrency slots (its own bound
//     still applies), and MaxInFlight is never exceeded;
//   - when hanging routes hold every slot, an answering route waits for
//     the first call to end anywhere (at most CallTimeout), and from then
//     on its own answers hand it the slot back (it has the fewest out),
//     so it keeps asking at its own pace, and gets more slots as the
//     hanging calls time out, up to an even share (or Concurrency).
//
// Reserving slots per route instead would bound nothing with a thousand
// routes, and splitting MaxInFlight into fixed per-route shares would
// leave most slots idle when only a few routes have a backlog.
type callSlots struct {
	mu   sync.Mutex
	free int
	out  map[string]int // calls out, per route
	// waiting are the lanes waiting for a slot, oldest first; there are
	// waiters only while free is 0.
	waiting []*slotWaiter
}

type slotWaiter struct {
	route   string
	granted chan struct{} // closed when release hands it a slot
}

func newCallSlots(n int) *callSlots {
	return &callSlots{free: n, out: map[string]int{}}
}

// acquire takes a slot for route, waiting for one if none is free. It
// returns false, holding none, if ctx ends first.
func (s *callSlots) acquire(ctx context.Context, route string) bool {
	s.mu.Lock()
	if s.free > 0 {
		s.free--
		s.out[route]++
		s.mu.Unlock()
		return true
	}
	w := &slotWaiter{route: route, granted: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.granted:
		return true
	case <-ctx.Done():
	}
	s.mu.Lock()
	select {
	case <-w.granted: // handed one meanwhile: hand it on
		s.mu.Unlock()
		s.release(route)
		return false
	default:
	}
	s.waiting = slices.DeleteFunc(s.waiting, func(x *slotWaiter) bool { return x == w })
	s.mu.Unlock()
	return false
}

// release gives route's slot back: to the waiting route with the fewest
// calls out, the oldest waiter among equals, or to the free ones.
func (s *callSlots) release(route string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.out[route]--; s.out[route] <= 0 {
		delete(s.out, route)
	}
	if len(s.waiting) == 0 {
		s.free++
		return
	}
	best := 0
	for i, w := range s.waiting {
		if s.out[w.route] < s.out[s.waiting[best].route] {
			best = i
		}
	}
	w := s.waiting[best]
	s.waiting = slices.Delete(s.waiting, best, best+1)
	s.out[w.route]++
	close(w.granted)
}
