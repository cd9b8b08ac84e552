package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// DefaultLeaseTTL is how long the worker lease lasts unless renewed. The
// holder renews it every third of that; when the holder dies, another
// replica takes over within LeaseTTL + LeaseTTL/3, and its workers run at
// their next tick.
const DefaultLeaseTTL = 15 * time.Second

// worker is one maintenance service that runs only on the worker leader.
type worker struct {
	name     string
	interval time.Duration
	run      func(ctx context.Context)
	// wait, when set, waits for work run left going (the resolver's
	// lanes); the worker calls it when it stops.
	wait func()
	// fails is the worker's failure runs: its log lines and its failing
	// status (WorkerHealth).
	fails *failLog
	// newTerm, when set, forgets what the worker's passes remembered
	// from an earlier term as leader (tick).
	newTerm func()
	// term is the term as worker leader (leaderTerm) of the worker's
	// last pass.
	term atomic.Uint64
}

// workerFails are the engine's failLogs: one per worker that logs its
// failures (the resolver's is Resolver.fails), and the lease loop's.
type workerFails struct {
	expiry, epochs, retention, compaction, lease failLog
}

// newLeaderWorkers lists the maintenance workers, the one place they are
// registered: each runs every interval while this engine holds the worker
// lease (store.DefaultWorkerLease), and never on the other replicas of the
// same store. A new worker (retention, the USAGE_UNKNOWN resolver) is one
// more entry here.
func (e *Engine) newLeaderWorkers() []*worker {
	workers := []*worker{
		{name: "expiry", interval: e.opts.WorkerInterval, run: e.runDue, fails: &e.fails.expiry},
		// A new term reads every policy again: a replica of an older
		// version may have led meanwhile (DrainPolicies).
		{name: "epochs", interval: min(e.opts.EpochInterval, epochWatchInterval), run: e.runEpochsWhenDue, fails: &e.fails.epochs,
			newTerm: e.drainPolicies.Forget},
	}
	if e.opts.Retention > 0 {
		workers = append(workers, &worker{name: "retention", interval: e.opts.RetentionInterval, run: e.runRetention, fails: &e.fails.retention})
	}
	if e.opts.Compaction != nil {
		workers = append(workers, &worker{name: "compaction", interval: e.opts.Compaction.Interval, run: e.runCompaction, fails: &e.fails.compaction,
			newTerm: e.compaction.newTerm})
	}
	if e.resolver != nil {
		// ScanWhile with IsLeader, so the lanes stop asking once this
		// replica loses the lease; Scan, not Run: the next scan does not
		// wait for a route whose questions are still out.
		workers = append(workers, &worker{name: "resolver", interval: e.resolver.opts.Interval,
			run: func(ctx context.Context) { e.resolver.ScanWhile(ctx, e.IsLeader) }, wait: e.resolver.Wait,
			fails: &e.resolver.fails, newTerm: e.resolver.restartPass})
	}
	return workers
}

// tick runs one pass of w if this engine leads. The first pass of each
// term as leader starts the worker afresh, as on a replica that never
// led: while this one did not lead, another may have, so what its
// passes remembered says nothing now (its open failure runs, which end
// without a recovery line: "worker lease lost" said why; the compaction
// refusal's backoff; the resolver's backlog count).
func (e *Engine) tick(ctx context.Context, w *worker) {
	term := e.leaderTerm()
	if term == 0 {
		return
	}
	if w.term.Load() != term {
		w.fails.forget()
		if w.newTerm != nil {
			w.newTerm()
		}
		w.term.Store(term)
	}
	w.run(ctx)
}

// WorkerHealth is one maintenance worker's failing status.
type WorkerHealth struct {
	// Name is the worker's (expiry, epochs, retention, compaction,
	// resolver), or lease: the worker lease's renewals.
	Name string
	// FailingSince is when the oldest of the worker's failures still
	// without a recovery line in the log was (wall clock); zero when
	// none is, or this engine does not run the worker: it does not hold
	// the worker lease, or has not run a pass in this term yet.
	FailingSince time.Time
}

// WorkersHealth returns each maintenance worker's failing status, in
// the order they are registered (newLeaderWorkers), then the lease's.
// The lease's is shown on every replica, leader or not: every replica
// renews it, and while the store is down longer than the lease lasts no
// replica leads, so no worker's failure would show anywhere else.
func (e *Engine) WorkersHealth() []WorkerHealth {
	out := make([]WorkerHealth, 0, len(e.leaderWorkers)+1)
	for _, w := range e.leaderWorkers {
		h := WorkerHealth{Name: w.name}
		if e.runsTermOf(w) {
			h.FailingSince = w.fails.failingSince()
		}
		out = append(out, h)
	}
	return append(out, WorkerHealth{Name: "lease", FailingSince: e.fails.lease.failingSince()})
}

// runsTermOf reports whether what w's passes remember is this engine's
// to show: with workers disabled (tests, tools that run passes
// themselves) always; otherwise while it leads and w's last pass was in
// this term. A replica that lost the lease no longer runs w: its
// failures, if they last, are the new holder's to show.
func (e *Engine) runsTermOf(w *worker) bool {
	if e.opts.DisableWorkers {
		return true
	}
	term := e.leaderTerm()
	return term != 0 && w.term.Load() == term
}

// leaderWorker returns the registered worker named name (nil if it is
// not configured).
func (e *Engine) leaderWorker(name string) *worker {
	for _, w := range e.leaderWorkers {
		if w.name == name {
			return w
		}
	}
	return nil
}

// LeaderStatus is this engine's view of the worker lease.
type LeaderStatus struct {
	// Leader reports whether this engine runs the workers now.
	Leader bool
	// Holder is who holds the lease as last read (this engine's
	// LeaseHolder when Leader), empty before the first attempt.
	Holder string
	// Self is this engine's holder name.
	Self string
	// Fence is the lease's fence as last read; Expires its expiry at the
	// store's clock.
	Fence   int64
	Expires time.Time
	// Since is when this engine last became leader (zero when it is not).
	Since time.Time
	// Err is the last lease error, if the last attempt failed.
	Err string
}

// leaderTerm returns which of this engine's terms as worker leader runs
// now (1 for the first), or 0 when it does not lead.
func (e *Engine) leaderTerm() uint64 {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	if !e.lead.status.Leader || !time.Now().Before(e.lead.until) {
		return 0
	}
	return e.lead.term
}

// leader tracks the worker lease.
type leader struct {
	mu     sync.Mutex
	status LeaderStatus
	// until is when this engine stops believing it leads unless a renewal
	// succeeds: the local time a successful acquire started plus the ttl
	// (the store's expiry is measured from later than that, so this ends
	// first).
	until time.Time
	// term counts the times this engine became leader (leaderTerm).
	term uint64
}

// defaultHolder names this process for the lease: host, pid and a random
// suffix, so two engines in one process are two holders.
func defaultHolder() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// IsLeader reports whether this engine holds the worker lease now.
func (e *Engine) IsLeader() bool {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	return e.lead.status.Leader && time.Now().Before(e.lead.until)
}

// Leader returns this engine's view of the worker lease.
func (e *Engine) Leader() LeaderStatus {
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	s := e.lead.status
	if s.Leader && !time.Now().Before(e.lead.until) {
		s.Leader, s.Since = false, time.Time{}
	}
	return s
}

// startWorkers runs the lease loop and the leader's workers until ctx
// ends; Close waits for them.
func (e *Engine) startWorkers(ctx context.Context) {
	e.workers.Add(1)
	go e.leaseLoop(ctx)
	for _, w := range e.leaderWorkers {
		e.workers.Add(1)
		go e.everyAsLeader(ctx, w)
	}
}

// leaseLoop takes and renews the worker lease every third of its ttl, and
// releases it when ctx ends so another replica takes over at once.
func (e *Engine) leaseLoop(ctx context.Context) {
	defer e.workers.Done()
	ttl := e.opts.LeaseTTL
	ticker := time.NewTicker(ttl / 3)
	defer ticker.Stop()
	for {
		e.renewLease(ctx, ttl)
		select {
		case <-ctx.Done():
			if e.IsLeader() {
				releaseCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if err := e.core.store.LeaseRelease(releaseCtx, store.DefaultWorkerLease, e.opts.LeaseHolder); err != nil {
					e.log.Warn("worker lease: release", "err", err)
				}
				cancel()
			}
			e.lead.mu.Lock()
			e.lead.status.Leader, e.lead.status.Since = false, time.Time{}
			e.lead.mu.Unlock()
			return
		case <-ticker.C:
		}
	}
}

func (e *Engine) renewLease(ctx context.Context, ttl time.Duration) {
	started := time.Now()
	callCtx, cancel := context.WithTimeout(ctx, ttl/3)
	lease, err := e.core.store.LeaseAcquire(callCtx, store.DefaultWorkerLease, e.opts.LeaseHolder, ttl)
	cancel()
	e.lead.mu.Lock()
	defer e.lead.mu.Unlock()
	was := e.lead.status.Leader && started.Before(e.lead.until)
	if err != nil {
		if ctx.Err() == nil {
			e.lead.status.Err = err.Error()
			e.fails.lease.failed("worker lease", err)
		}
		// Keep leading until the last successful renewal lapses: the
		// store may be back before then. Once it lapsed, another replica
		// may lead: say so once, as when another took the lease.
		if ctx.Err() == nil && e.lead.status.Leader && !time.Now().Before(e.lead.until) {
			e.log.Info("worker lease lost", "holder", e.lead.status.Holder, "fence", e.lead.status.Fence, "reason", "renewals failed until it lapsed")
			e.lead.status.Leader, e.lead.status.Since = false, time.Time{}
			e.lead.until = time.Time{}
		}
		return
	}
	e.lead.status.Err = ""
	e.fails.lease.ok("worker lease")
	e.lead.status.Holder, e.lead.status.Fence, e.lead.status.Expires = lease.Holder, lease.Fence, lease.Expires
	if lease.Held {
		e.lead.until = started.Add(ttl)
		if !was {
			e.lead.status.Since = started
			e.lead.term++
			e.log.Info("worker lease acquired: this replica runs the workers", "holder", lease.Holder, "fence", lease.Fence)
		}
		e.lead.status.Leader = true
		return
	}
	if was {
		e.log.Info("worker lease lost", "holder", lease.Holder, "fence", lease.Fence)
	}
	e.lead.status.Leader, e.lead.status.Since = false, time.Time{}
	e.lead.until = time.Time{}
}

// everyAsLeader runs w every interval while this engine leads (tick).
func (e *Engine) everyAsLeader(ctx context.Context, w *worker) {
	defer e.workers.Done()
	if w.wait != nil {
		defer w.wait()
	}
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			e.tick(ctx, w)
		}
	}
}

// runPages commits a pager's commands page by page while this engine
// leads, in paced chunks (runWorkerCommands), so a worker with much to do
// (the epoch rollover of a million accounts) is spread out and admission
// goes on between its chunks. seen, when set, gets each committed
// chunk's commands and results. It returns false if it stopped early (ctx
// ended, leadership lost, a read failed).
func (e *Engine) runPages(ctx context.Context, what string, p *Pager, seen func([]ledger.Command, []ledger.Result)) bool {
	fails := &e.fails.epochs
	for ctx.Err() == nil {
		if !e.IsLeader() {
			return false
		}
		cmds, err := p.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				fails.failed(what+" worker", err)
			}
			return false
		}
		fails.ok(what + " worker")
		if len(cmds) == 0 {
			return true
		}
		if !e.runWorkerCommands(ctx, fails, cmds, seen) {
			return false
		}
	}
	return false
}

// How the maintenance workers share the committer with admission.
const (
	// workerChunk is the most worker commands one transaction carries:
	// a gateway command that arrives behind a worker's chunk waits for
	// at most that many more rows.
	workerChunk = 64
	// workerShare is the share of the committer's time the workers take
	// while they have a backlog (pauseFor: a pause of twice each chunk's
	// commit, queueing included); they slow further when admission is
	// busy, since their chunks then wait longer in the queue.
	workerShare = 1.0 / 3
	// duePage and dueBudget bound the expiry worker: reservations read a
	// page, pages a tick (the rest waits for the next tick).
	duePage   = 256
	dueBudget = 16
)

// workerPacer spreads the commits of all the leader's workers (expiry,
// epoch close, drains) so that together they keep to their share of the
// committer: one chunk at a time, and no chunk before the pause after
// the previous one has passed.
type workerPacer struct {
	slot chan struct{} // one token: the right to commit the next chunk
	mu   sync.Mutex
	next time.Time // no chunk starts before
}

// turn waits for this worker's turn to commit a chunk; it returns false
// if ctx ended first. The caller must call done afterwards.
func (p *workerPacer) turn(ctx context.Context) bool {
	p.mu.Lock()
	if p.slot == nil {
		p.slot = make(chan struct{}, 1)
	}
	slot := p.slot
	p.mu.Unlock()
	select {
	case slot <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	p.mu.Lock()
	wait := time.Until(p.next)
	p.mu.Unlock()
	if wait <= 0 {
		return true
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		<-slot
		return false
	}
}

// done ends a turn whose chunk took took to commit.
func (p *workerPacer) done(took time.Duration) {
	p.mu.Lock()
	p.next = time.Now().Add(pauseFor(took, workerShare))
	slot := p.slot
	p.mu.Unlock()
	<-slot
}

// How long the drain worker leaves a superseded generation whose drains
// moved nothing before it reads it again (drainMemo): the first wait is
// drainRecheckFirst, each later one twice the one before, up to
// DrainRecheckMax.
const (
	drainRecheckFirst = time.Minute
	// DrainRecheckMax bounds how long capacity that can move waits for
	// the drain worker: a generation whose drains moved nothing (capacity
	// blocked by the deciding account's burst) or that holds reservations
	// is read again at least this often.
	DrainRecheckMax = 16 * time.Minute
)

// drainMemoPoints bounds the accounts the drain memo lists, over all
// generations (about 100 bytes each): a generation that does not fit is
// read in full when it is read.
const drainMemoPoints = 1 << 16

// drainMemo remembers, per superseded generation, what the drain
// worker's last full pass over it found, so that later passes read only
// what can still need a drain, and only when it may (its cost is one
// entry per generation and up to drainMemoPoints account keys; its saving
// a read of every account of the generation and a command per blocked
// one). While the active generations stay the same (a publish or a
// rollback forgets everything):
//
//   - settled: the scan produced no command, no account it read held
//     reservations, and none may still hold its subject's capacity under
//     a generation that refills (Pager.mayStayCurrent). Nothing can land
//     on such an account: capacity arrives on a superseded account only
//     as a late refund or overuse of one of its own reservations, or as
//     the lazy refill that the switch away from it mints there under its
//     own rule and leaves behind where the deciding burst has no room. It
//     is not read again.
//   - waiting: the accounts that got a drain, held reservations or may
//     still be current (ScanEnd.Waiting); the others cannot need one, so
//     only these are read again (point reads; the whole generation when
//     they were too many). When a drain moved something, at the next pass. When none
//     did, the capacity there is blocked by the deciding account's burst
//     (ledger.Drain moves only into its room, after the refill due), or a
//     late refund may land and stay for the same reason (the ledger's
//     forward moves what fits at once). Refill never makes room (it fills
//     up to the burst); only the subject's own commands do (settles that
//     spend, shards issued, overuse), and this replica does not see those
//     of the others. So they are read again after drainRecheckFirst, then
//     after twice as long each time nothing moved, up to DrainRecheckMax:
//     a drain that can move waits at most that long (and moves if the
//     room is still there then: a refill due first takes it, as it would
//     in the ledger).
type drainMemo struct {
	// active is a digest of the active generations the verdicts hold
	// for (not the map: with a policy per tenant it held every key).
	active activeDigest
	gens   map[uint64]drainVerdict
}

// activeDigest identifies a set of active generations: their number and
// two independent order-free sums of their entries' hashes (two sets
// that differ share a digest with a chance of about 2^-128).
type activeDigest struct {
	n          int
	sum1, sum2 uint64
}

// activeSeeds are this process's seeds of activeDigest.
var activeSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// digestActive returns the digest of active (n 0 for none: a memo
// without verdicts matches no pass until its first update, as nil did).
func digestActive(active ledger.ActiveGenerations) activeDigest {
	d := activeDigest{n: 1}
	for k, g := range active {
		d.add(k, g)
	}
	return d
}

// add takes one more active generation, key's, into d (started as
// digestActive of none, n 1): the sums are order-free, so a drain pass
// that reads the policies a page at a time digests them as it goes.
func (d *activeDigest) add(key ledger.PolicyKey, generation uint64) {
	type entry struct {
		key        ledger.PolicyKey
		generation uint64
	}
	d.n++
	d.sum1 += maphash.Comparable(activeSeeds[0], entry{key, generation})
	d.sum2 += maphash.Comparable(activeSeeds[1], entry{key, generation})
}

// drainVerdict is what the memo holds for one generation.
type drainVerdict struct {
	settled bool
	// byPoints says to read only points.
	byPoints bool
	points   []ledger.AccountKey
	// at is when the pass that found it waiting ran (the engine clock),
	// wait how long it is left alone after that (0: read at the next
	// pass).
	at   time.Time
	wait time.Duration
}

// plan says how the drain pass starting at now reads generation g.
func (m *drainMemo) plan(active ledger.ActiveGenerations, g uint64, now time.Time) DrainPlan {
	return m.planDigest(digestActive(active), g, now)
}

// planDigest is plan of the active generations whose digest is d (the
// drain worker's: DrainPolicies keeps it with its view).
func (m *drainMemo) planDigest(d activeDigest, g uint64, now time.Time) DrainPlan {
	v, ok := m.gens[g]
	if !ok || m.active != d {
		return DrainPlan{}
	}
	// A clock that went back before the verdict reads it again.
	if v.settled || !now.Before(v.at) && now.Before(v.at.Add(v.wait)) {
		return DrainPlan{Skip: true}
	}
	return DrainPlan{ByPoints: v.byPoints, Points: v.points}
}

// drainOutcomes collects, over one drain pass, the generations one of
// whose drains moved something (Result.Move).
type drainOutcomes map[uint64]bool

func (o drainOutcomes) seen(cmds []ledger.Command, results []ledger.Result) {
	for i := range results {
		if results[i].Move != nil && i < len(cmds) {
			o[cmds[i].Account.Generation] = true
		}
	}
}

// update records the outcome of the pass that started at now; complete
// is whether it ran to its end (an incomplete pass records nothing: the
// generations it read and did not record are read again next pass).
func (m *drainMemo) update(active ledger.ActiveGenerations, p *Pager, moved drainOutcomes, complete bool, now time.Time) {
	m.updateDigest(digestActive(active), p, moved, complete, now)
}

// updateDigest is update of the active generations whose digest is d.
func (m *drainMemo) updateDigest(d activeDigest, p *Pager, moved drainOutcomes, complete bool, now time.Time) {
	if m.active != d {
		m.active, m.gens = d, map[uint64]drainVerdict{}
	}
	if !complete {
		return
	}
	listed := 0
	for _, v := range m.gens {
		listed += len(v.points)
	}
	for _, s := range p.Ended() {
		previous := m.gens[s.Generation]
		listed -= len(previous.points)
		if s.Commands == 0 && !s.Holds {
			m.gens[s.Generation] = drainVerdict{settled: true}
			continue
		}
		v := drainVerdict{at: now}
		switch {
		case moved[s.Generation]:
		case previous.wait > 0:
			v.wait = min(2*previous.wait, DrainRecheckMax)
		default:
			v.wait = drainRecheckFirst
		}
		if !s.Overflow && listed+len(s.Waiting) <= drainMemoPoints {
			v.byPoints, v.points = true, s.Waiting
			listed += len(s.Waiting)
		}
		m.gens[s.Generation] = v
	}
}
