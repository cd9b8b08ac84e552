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

// Options tune an Engine. Zero values pick the defaults.
type Options struct {
	// MaxBatch caps the commands grouped into one transaction (default 512).
	MaxBatch int
	// Clock returns the time commands are applied at (default time.Now).
	Clock func() time.Time
	// WorkerInterval is how often expiry and unknown-usage marking run
	// (default 250ms); EpochInterval how often ended epochs are closed
	// and superseded generations drained (default 1 minute), and besides
	// within a second of the end of an accounting epoch of any policy the
	// last run read or published through this engine since (epochWatch:
	// one published through another engine counts from the next run).
	// Workers are off when DisableWorkers is set.
	WorkerInterval time.Duration
	EpochInterval  time.Duration
	DisableWorkers bool
	// MaxConflictRetries bounds how often a batch that lost a race is run
	// again before its callers get store.ErrConflict (default 10), unless
	// ConflictRetryBudget has not passed yet since its first attempt:
	// then it is run again anyway (default 2s), so a burst of lost races
	// at a hot account shared by replicas is absorbed by the server
	// instead of surfacing as 503 STORE_CONFLICT. Reruns back off by a
	// random 1-2x of the attempt number in milliseconds.
	MaxConflictRetries  int
	ConflictRetryBudget time.Duration
	// BatchTimeout bounds one store transaction (default 10s).
	BatchTimeout time.Duration
	// LeaseTTL is how long the worker lease lasts unless renewed (default
	// DefaultLeaseTTL); LeaseHolder names this engine in it (default host,
	// pid and a random suffix). Only the holder runs the workers.
	LeaseTTL    time.Duration
	LeaseHolder string
	// PageSize is how many accounts one page of the epoch and drain
	// workers reads and commits (default DefaultPageSize).
	PageSize int
	// OnBatch, when set, is called after every batch (metrics).
	OnBatch func(BatchInfo)
	Logger  *slog.Logger
	// Resolver, when set, runs the USAGE_UNKNOWN resolver (resolver.go)
	// with the other workers.
	Resolver *ResolverOptions

	// Retention, when positive, removes terminal reservations that
	// finished longer ago than it (engine/retention.go), leaving a
	// tombstone that TombstoneRetention later drops (0: never). The pass
	// runs every RetentionInterval (default 1 minute) in pages of
	// RetentionBatch rows (default DefaultRetentionBatch), paced
	// (engine/pace.go) and at least RetentionPause apart (default 5ms).
	Retention          time.Duration
	TombstoneRetention time.Duration
	RetentionInterval  time.Duration
	RetentionBatch     int
	RetentionPause     time.Duration
	// StatementRetention, when positive, also removes the epoch
	// statements whose epoch ended longer ago than it, at the end of each
	// retention pass (retention.go, StatementsRemove; 0 keeps them
	// forever). It needs Retention: the pass runs only with it.
	StatementRetention time.Duration

	// Compaction, when set, cuts statement checkpoints and deletes the
	// journal they summarise (engine/compaction.go).
	Compaction *CompactionOptions

	// MaintenanceShare is the share of wall time that retention,
	// compaction, giving space back and audits take while gateways'
	// commands are being committed (engine/pace.go; default
	// DefaultMaintenanceShare, 1 for no pacing).
	MaintenanceShare float64
}

// BatchInfo describes one committed (or failed) batch.
type BatchInfo struct {
	Commands int
	Attempts int
	Duration time.Duration
	Err      error
}

// Stats are cumulative counters since the engine started.
type Stats struct {
	Commands    uint64
	Batches     uint64
	Conflicts   uint64
	Failures    uint64
	WorkerRuns  uint64
	WorkerCmds  uint64
	LastBatchAt time.Time
}

// Engine serves ledger commands over a store with group commit. Its
// methods are safe for concurrent use.
type Engine struct {
	core *Core
	opts Options
	// pacerMade, when set (tests), sees every maintenance pacer made.
	pacerMade func(*pacer)
	// retentionPaced, when set (tests), sees how each retention page
	// was paced.
	retentionPaced func(pagePacing)
	queue          chan *request
	wake           chan struct{} // one pending wake-up for the committer
	log            *slog.Logger

	ctx     context.Context // ends when Close starts
	stop    context.CancelFunc
	stopped chan struct{}
	// running is held by whoever runs a batch: the committer goroutine, or
	// a caller that found the engine idle and runs its batch itself (see
	// DoBatch). One batch at a time, whoever runs it.
	running  sync.Mutex
	workers  sync.WaitGroup
	closeErr sync.Once
	resolver *Resolver // nil without Options.Resolver
	// leaderWorkers are the maintenance workers (workers.go), made once.
	leaderWorkers []*worker
	// pipe is pipelined durability (pipeline.go), nil unless the store
	// is a pipelined store.Syncer.
	pipe *pipeline

	commands, batches, conflicts, failures, workerRuns, workerCmds atomic.Uint64
	// admittedCmds counts the committed commands no maintenance worker
	// submitted (pace.go).
	admittedCmds atomic.Uint64
	// finished counts the reservations this engine's commands made
	// terminal: what retention will have to remove (retention.go).
	finished  atomic.Uint64
	lastBatch atomic.Int64
	lastErr   atomic.Pointer[errBox]
	// lastProbe is when Ready last probed the store (Unix nanoseconds).
	lastProbe atomic.Int64

	// lead is the worker lease; drains what the drain worker remembers.
	lead   leader
	drains drainMemo
	// drainPolicies is what the drain worker keeps of the policies.
	drainPolicies DrainPolicies
	epochScans    EpochScans
	epochWatch    epochWatch
	// published holds the epoch lengths of the policies published
	// through this engine since the epoch worker last looked, for its
	// watch (runEpochsWhenDue).
	published publishedEpochs
	pace      workerPacer
	// fails are the workers' failure runs (workerlog.go), one failLog
	// per worker (the resolver's is its own: Resolver.fails) and the
	// lease loop's.
	fails      workerFails
	retention  retentionCounters
	compaction compactionCounters

	// epochCatchUpCut is set when the last epoch pass's catch-up stopped
	// for a new epoch (runEpochs): the next pass's catch-up then runs to
	// its end.
	epochCatchUpCut bool
}

type retentionCounters struct {
	passes, retired, forgotten, failed atomic.Uint64
	// fencesFolded counts shard fence rows folded into the floor.
	fencesFolded atomic.Uint64
	// statementsRemoved counts epoch statements removed
	// (Options.StatementRetention).
	statementsRemoved    atomic.Uint64
	lastPassAt, lastPass atomic.Int64
	runningSince         atomic.Int64 // the pass under way's start, 0 when none runs
	// rate is where the next pass measures this replica's finish rate
	// from: the last mark of the previous pass (retention.go,
	// finishWindow).
	rateMu sync.Mutex
	rate   retentionRate
	// dueRate is the rate at which the last pass's rows came due, per
	// second, from their finish times (retention.go, dueSpan).
	dueRate float64

	// shardsRemoved counts settled shards removed (Core.ShardsRemove).
	shardsRemoved atomic.Uint64
}

// errBox holds the outcome of the last batch (or ready probe): its error,
// nil when it reached the store, and the commands of the failed batch,
// which size the probes that stand in for it.
type errBox struct {
	err  error
	cmds int
}

type request struct {
	cmds    []ledger.Command
	results []ledger.Result
	err     error
	done    chan struct{}
	// maintenance says a maintenance worker submitted the commands
	// (doMaintenance): they are not admission (pace.go).
	maintenance bool
	// ctx is the caller's: a request still queued when it ends is not
	// applied (runBatch).
	ctx context.Context
}

// ErrClosed is returned for commands submitted after Close.
var ErrClosed = errors.New("engine closed")

// ErrNotApplied marks an operating failure whose outcome is known: the
// batch failed before its COMMIT was sent (Begin, a read or a write
// failed: the store rolls the open transaction back), its commit was
// refused as a conflict (rolled back, store.ErrConflict) or failed and
// was rolled back (store.ErrRolledBack: SQLite's full disk), or the command
// was refused before it was sent (a failed fsync, pipelined). Nothing of
// it was applied. Any other operating error may have committed (a COMMIT
// whose answer was lost, a caller that stopped waiting): its outcome is
// unknown. Either way a retry with the same ids is right.
var ErrNotApplied = errors.New("not applied")

// New starts an engine over st: one committer goroutine and, unless
// disabled, the background workers. Close stops them. (A caller that finds
// the engine idle commits its batch on its own goroutine instead of handing
// it to the committer; either way one batch runs at a time.)
func New(st store.Store, opts Options) *Engine {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.WorkerInterval <= 0 {
		opts.WorkerInterval = 250 * time.Millisecond
	}
	if opts.EpochInterval <= 0 {
		opts.EpochInterval = time.Minute
	}
	if opts.MaxConflictRetries <= 0 {
		opts.MaxConflictRetries = 10
	}
	if opts.ConflictRetryBudget <= 0 {
		opts.ConflictRetryBudget = 2 * time.Second
	}
	if opts.BatchTimeout <= 0 {
		opts.BatchTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.LeaseHolder == "" {
		opts.LeaseHolder = defaultHolder()
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.RetentionInterval <= 0 {
		opts.RetentionInterval = time.Minute
	}
	if opts.RetentionBatch <= 0 {
		opts.RetentionBatch = DefaultRetentionBatch
	}
	if opts.RetentionPause <= 0 {
		opts.RetentionPause = 5 * time.Millisecond
	}
	if opts.MaintenanceShare <= 0 {
		opts.MaintenanceShare = DefaultMaintenanceShare
	}
	opts.MaintenanceShare = min(opts.MaintenanceShare, 1)
	opts.Compaction = opts.Compaction.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		core:    NewCore(st),
		ctx:     ctx,
		opts:    opts,
		queue:   make(chan *request, 4*opts.MaxBatch),
		wake:    make(chan struct{}, 1),
		log:     opts.Logger,
		stop:    cancel,
		stopped: make(chan struct{}),
	}
	if e.core.Pipelined() {
		e.pipe = newPipeline(e.core, opts.Logger)
	}
	e.lead.status.Self = opts.LeaseHolder
	if opts.Resolver != nil {
		e.resolver = NewResolver(st, *opts.Resolver, opts.Clock, e.DoBatch, opts.Logger)
	}
	e.fails = workerFails{expiry: newFailLog("expiry", opts.Logger), epochs: newFailLog("epochs", opts.Logger),
		retention: newFailLog("retention", opts.Logger), compaction: newFailLog("compaction", opts.Logger), lease: newFailLog("lease", opts.Logger)}
	e.leaderWorkers = e.newLeaderWorkers()
	go e.commitLoop(ctx)
	if !opts.DisableWorkers {
		e.startWorkers(ctx)
	}
	return e
}

// Do applies one command and returns its result once it is durable. The
// error is non-nil only for operating failures (the store is unavailable,
// conflicts persisted, ctx ended, the engine closed): then the command was
// not applied when the error wraps ErrNotApplied, and otherwise may or may
// not have been; either way the caller resolves it by retrying with the
// same ids. Expected outcomes (rejections, replays, state errors)
// are in Result.Err.
func (e *Engine) Do(ctx context.Context, cmd ledger.Command) (ledger.Result, error) {
	results, err := e.DoBatch(ctx, []ledger.Command{cmd})
	if err != nil {
		return ledger.Result{}, err
	}
	return results[0], nil
}

// DoBatch applies several commands in order, in one transaction, and
// returns one result per command; errors as for Do.
func (e *Engine) DoBatch(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	results, err := e.doBatch(ctx, cmds, false)
	if err == nil {
		e.published.note(cmds, results)
	}
	return results, err
}

// doMaintenance is DoBatch for a maintenance worker's commands: the
// pacers of the other maintenance work do not count them as admission.
func (e *Engine) doMaintenance(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	return e.doBatch(ctx, cmds, true)
}

func (e *Engine) doBatch(ctx context.Context, cmds []ledger.Command, maintenance bool) ([]ledger.Result, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	if err := e.failure(); err != nil {
		return nil, fmt.Errorf("%w (%w)", err, ErrNotApplied)
	}
	req := &request{cmds: cmds, done: make(chan struct{}), maintenance: maintenance, ctx: ctx}
	if len(e.queue) == 0 && e.running.TryLock() {
		// Idle engine: run the batch here, taking along whatever was queued
		// meanwhile, instead of waking the committer and being woken by it
		// (two goroutine hand-offs, which cost more than a commit when the
		// machine is busy). The caller waits for the commit as it would
		// for the committer, whatever its ctx does (though a ctx ended
		// before the batch writes leaves the command not applied:
		// dropAbandoned).
		if e.ctx.Err() != nil {
			e.running.Unlock()
			return nil, ErrClosed
		}
		batch, out := e.runBatch([]*request{req})
		e.running.Unlock()
		// Pipelined, the next batch runs while this one's fsync does.
		e.settle(batch, out)
		return req.results, req.err
	}
	select {
	case e.queue <- req:
		select {
		case e.wake <- struct{}{}:
		default: // the committer has a wake-up pending already
		}
	case <-e.stopped:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-req.done:
		return req.results, req.err
	case <-e.stopped:
		select {
		case <-req.done:
			return req.results, req.err
		default:
			return nil, ErrClosed
		}
	case <-ctx.Done():
		// The batch may still commit: the caller's outcome is unknown.
		return nil, ctx.Err()
	}
}

// commitLoop is the committer: it takes whatever requests are waiting (up
// to MaxBatch commands), commits them as one transaction, answers them, and
// repeats. While one batch commits the next one fills up, which is what
// makes throughput grow with load.
func (e *Engine) commitLoop(ctx context.Context) {
	defer close(e.stopped)
	batch := make([]*request, 0, 64)
	for {
		select {
		case <-e.wake:
		case <-ctx.Done():
			// Wait for a batch a caller is running, then fail the rest.
			// running stays held: no caller runs a batch after Close.
			e.running.Lock()
			e.failPending()
			if e.pipe != nil {
				close(e.pipe.queue)
				<-e.pipe.done
			}
			return
		}
		// Requests stay queued (and keep piling up) while a caller runs
		// a batch; they are taken only once this goroutine runs.
		e.running.Lock()
		for len(e.queue) > 0 {
			var out outcome
			batch, out = e.runBatch(batch[:0])
			if e.pipe != nil && out.err == nil && len(batch) > 0 {
				// The syncer answers it once durable; meanwhile the
				// next batch is applied and written.
				e.pipe.queue <- &syncWait{batch: batch, out: out}
				batch = make([]*request, 0, 64)
				continue
			}
			answer(batch, out)
			clear(batch)
		}
		e.running.Unlock()
	}
}

// runBatch adds waiting requests to batch (up to MaxBatch commands in
// all) and commits their commands as one transaction, less those whose
// callers stopped waiting (dropAbandoned, answered here). It returns batch
// (what is left of it) and the outcome, for the caller to answer (answer, or settle, or the
// syncer when pipelined). The caller holds running; batch holds a request
// or the queue does.
func (e *Engine) runBatch(batch []*request) ([]*request, outcome) {
	queued := 0
	for _, req := range batch {
		queued += len(req.cmds)
	}
	if len(batch) != 1 || len(e.queue) != 0 {
	fill:
		for queued < e.opts.MaxBatch {
			select {
			case req := <-e.queue:
				batch = append(batch, req)
				queued += len(req.cmds)
			default:
				break fill
			}
		}
	}
	batch = dropAbandoned(batch)
	if len(batch) == 0 {
		return batch, outcome{}
	}
	var out outcome
	batch, out = e.commit(e.ctx, batch)
	for _, req := range batch {
		if !req.maintenance {
			e.admittedCmds.Add(uint64(len(req.cmds)))
		}
	}
	return batch, out
}

// dropAbandoned answers, not applied, every request of batch whose caller
// has stopped waiting, and returns the others (batch's own array). The
// caller took that outcome for unknown and may have had its retry decided
// elsewhere since (on another replica, while this one's store was
// unreachable). A capacity rejection writes nothing, so the abandoned
// attempt, committed later, would admit an id its caller was told was
// rejected, holding units nobody settles (the failover gate's
// non-linearizable history of 6 Dec). Checked when the batch is formed
// and again once its transaction holds the rows it read (Core.commit's
// wanted): a retry decided after that waits for the batch and finds its
// receipt.
func dropAbandoned(batch []*request) []*request {
	kept := batch[:0]
	for _, req := range batch {
		if req.callerGone() {
			req.err = fmt.Errorf("%w (%w)", req.ctx.Err(), ErrNotApplied)
			close(req.done)
			continue
		}
		kept = append(kept, req)
	}
	clear(batch[len(kept):])
	return kept
}

// abandoned reports whether a caller of batch has stopped waiting.
func abandoned(batch []*request) bool {
	return slices.ContainsFunc(batch, (*request).callerGone)
}

// callerGone reports whether req's caller has stopped waiting.
func (req *request) callerGone() bool { return req.ctx != nil && req.ctx.Err() != nil }

func batchCommands(batch []*request) []ledger.Command {
	if len(batch) == 1 {
		return batch[0].cmds
	}
	var cmds []ledger.Command
	for _, req := range batch {
		cmds = append(cmds, req.cmds...)
	}
	return cmds
}

// commit runs one batch, retrying it whole while it loses races, and
// without the commands of callers who stopped waiting before it wrote
// (dropAbandoned); it returns what is left of batch and its outcome.
// Pipelined, the batch gets a number (before it commits: a batch that
// writes nothing read what the batches before it wrote, so it waits for
// their fsync too) and is committed without its fsync. A failed batch is
// logged ("batch failed") unless only maintenance workers submitted it:
// each of them logs its own failures at the cadence of
// its failLog (workerlog.go), which a line per batch (four a second
// from the expiry worker on a full disk) would undo.
func (e *Engine) commit(ctx context.Context, batch []*request) ([]*request, outcome) {
	start := time.Now()
	var results []ledger.Result
	var err error
	var seq uint64
	deferred := false
	if e.pipe != nil {
		seq = e.pipe.started.Add(1)
		deferred = true
		defer e.pipe.committed.Store(seq)
	}
	cmds := batchCommands(batch)
	wanted := func() bool { return !abandoned(batch) }
	attempts := 0
	for attempts < e.opts.MaxConflictRetries || time.Since(start) < e.opts.ConflictRetryBudget {
		attempts++
		batchCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.BatchTimeout)
		results, err = e.core.commit(batchCtx, cmds, e.opts.Clock(), deferred, wanted)
		cancel()
		if errors.Is(err, errCallerGone) {
			// Not applied: run the batch again without the commands of
			// the callers who left (each time one less at least).
			attempts--
			if batch = dropAbandoned(batch); len(batch) == 0 {
				return batch, outcome{seq: seq}
			}
			cmds = batchCommands(batch)
			continue
		}
		if !errors.Is(err, store.ErrConflict) {
			break
		}
		e.conflicts.Add(1)
		// Jittered, so the batches of two replicas that keep colliding
		// drift apart; capped so a long budget is not spent asleep.
		backoff := time.Duration(min(attempts, 20)) * time.Millisecond
		time.Sleep(backoff + rand.N(backoff))
	}
	workersOnly := true
	for _, req := range batch {
		workersOnly = workersOnly && req.maintenance
	}
	e.batches.Add(1)
	e.commands.Add(uint64(len(cmds)))
	if err == nil {
		e.finished.Add(finishedBy(cmds, results))
	}
	e.lastBatch.Store(time.Now().UnixNano())
	if err != nil {
		e.failures.Add(1)
		if !errors.Is(err, store.ErrConflict) {
			err = fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		e.lastErr.Store(&errBox{err: err, cmds: len(cmds)})
		if !workersOnly {
			e.log.Warn("batch failed", "commands", len(cmds), "attempts", attempts, "err", err)
		}
	} else {
		e.lastErr.Store(&errBox{})
	}
	if e.opts.OnBatch != nil {
		e.opts.OnBatch(BatchInfo{Commands: len(cmds), Attempts: attempts, Duration: time.Since(start), Err: err})
	}
	return batch, outcome{results: results, err: err, seq: seq}
}

func (e *Engine) failPending() {
	for {
		select {
		case req := <-e.queue:
			req.err = ErrClosed
			close(req.done)
		default:
			return
		}
	}
}

// runDue expires holds past their TTL and marks overrunning work
// USAGE_UNKNOWN, through the same queue as gateway commands: up to
// dueBudget pages of duePage reservations a tick, committed in paced
// chunks (runWorkerCommands), so a mass expiry (a million holds made in
// the same minute) is spread over ticks instead of taking the committer.
func (e *Engine) runDue(ctx context.Context) {
	for page := range dueBudget {
		if ctx.Err() != nil || page > 0 && !e.IsLeader() {
			return
		}
		cmds, err := e.core.Due(ctx, e.opts.Clock(), duePage)
		if err != nil {
			if ctx.Err() == nil {
				e.fails.expiry.failed("expiry worker", err)
			}
			return
		}
		e.fails.expiry.ok("expiry worker")
		if len(cmds) == 0 {
			// Nothing is due: no batch of this worker failed and waits
			// to be committed again (a gateway may have ended what a
			// failed one held), so a batch failure would otherwise stay
			// open, and the worker failing, until the next expiry.
			e.fails.expiry.ok("worker batch")
			return
		}
		if !e.runWorkerCommands(ctx, &e.fails.expiry, cmds, nil) {
			return
		}
	}
}

// epochWatchInterval is how often the epoch worker looks whether an
// accounting epoch ended since its last pass (epochWatch.due): a look is
// a few time comparisons, no store read.
const epochWatchInterval = time.Second

// epochWatch decides when the epoch worker runs a pass: every
// EpochInterval, and at once (within epochWatchInterval) when an epoch of
// one of the policies the last pass read has ended since that pass
// started. So the busy accounts of an epoch that just ended are closed by
// the worker right after the boundary, in due order and paced, ahead of
// their next commands, rather than up to an EpochInterval later, while
// every command on such an account pays its close inline.
type epochWatch struct {
	last    time.Time       // the engine clock when the last pass started
	lengths []time.Duration // the epoch lengths of the policies it read
}

// due reports whether a pass should start at now.
func (w *epochWatch) due(now time.Time, every time.Duration) bool {
	if w.last.IsZero() || now.Before(w.last) || now.Sub(w.last) >= every {
		return true
	}
	return w.ended(now)
}

// ended reports whether an epoch of one of the policies the last pass read
// has ended between that pass's start and now.
func (w *epochWatch) ended(now time.Time) bool {
	for _, length := range w.lengths {
		// One ended when now is in a later epoch than the pass's start.
		if ledger.EpochStartOf(now, length).After(ledger.EpochStartOf(w.last, length)) {
			return true
		}
	}
	return false
}

// publishedEpochs collects the epoch lengths of policies published
// through this engine (DoBatch) until the epoch worker takes them.
type publishedEpochs struct {
	mu      sync.Mutex
	lengths []time.Duration
}

// note records the epoch length of each policy cmds published.
func (p *publishedEpochs) note(cmds []ledger.Command, results []ledger.Result) {
	for i := range cmds {
		c := &cmds[i]
		if c.Kind != ledger.KindPublishPolicy || c.Policy == nil || i >= len(results) || results[i].Err != nil {
			continue
		}
		length := c.Policy.EpochLength
		if length <= 0 {
			length = ledger.DefaultEpochLength
		}
		p.mu.Lock()
		if !slices.Contains(p.lengths, length) {
			p.lengths = append(p.lengths, length)
		}
		p.mu.Unlock()
	}
}

// take returns the lengths noted since the last take and forgets them.
func (p *publishedEpochs) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	lengths := p.lengths
	p.lengths = nil
	return lengths
}

// runEpochsWhenDue runs runEpochs when epochWatch says so. The epoch
// lengths of policies published through this engine since are watched
// from then on, so the end of a new policy's first epoch starts a pass
// within epochWatchInterval even when no policy the last pass read had
// its epoch length (one published through another replica is read by
// the next pass, up to an EpochInterval later).
func (e *Engine) runEpochsWhenDue(ctx context.Context) {
	for _, length := range e.published.take() {
		if !slices.Contains(e.epochWatch.lengths, length) {
			e.epochWatch.lengths = append(e.epochWatch.lengths, length)
		}
	}
	if e.epochWatch.due(e.opts.Clock(), e.opts.EpochInterval) {
		e.runEpochs(ctx)
	}
}

// runEpochs closes idle accounts' epochs and drains what superseded or
// rolled-back generations still hold into the subjects' current accounts,
// so a rollback reaches zero without waiting for new traffic. Both read
// only the rows their indexes say are due, a page at a time (runPages).
func (e *Engine) runEpochs(ctx context.Context) {
	now := e.opts.Clock()
	epochs, err := e.core.EpochPager(ctx, now, e.opts.PageSize, &e.epochScans)
	if err != nil {
		if ctx.Err() == nil {
			e.fails.epochs.failed("epoch worker", err)
		}
		return
	}
	e.fails.epochs.ok("epoch worker")
	e.epochWatch = epochWatch{last: now, lengths: epochs.lengths}
	complete := e.runPages(ctx, "epoch", epochs, nil)
	if complete {
		// Then the index entries the pass's rolls left behind (SQLite):
		// EpochScans may remember this pass only once they have moved.
		// A catch-up after a rollover of many accounts takes a while
		// (about a minute at 1M, paced); an epoch that ends meanwhile
		// must not wait for it: the catch-up stops, EpochScans keeps
		// what it remembered before this pass (the pass's closes and
		// the entries it left behind all lie after that), and the
		// watch starts the next pass at its next look, which reads
		// this pass's range again and catches it up with its own.
		// Only once in a row: with epochs shorter than a catch-up,
		// stopping every time would leave the entries behind for ever
		// and each pass reading from further back.
		stoppable, superseded := !e.epochCatchUpCut, false
		e.epochCatchUpCut = false
		err := epochs.CatchUp(ctx, func() bool {
			if stoppable && e.epochWatch.ended(e.opts.Clock()) {
				superseded = true
				return false
			}
			return e.IsLeader() && e.pace.turn(ctx)
		}, e.pace.done)
		switch {
		case superseded:
			e.epochCatchUpCut = true
			return
		case err != nil:
			if ctx.Err() == nil {
				e.fails.epochs.failed("epoch worker", err)
			}
			complete = false
		}
	}
	e.epochScans.Update(epochs, complete)
	if !complete {
		return
	}
	// The memo's key is the digest of the active generations of the view
	// of the policies DrainPager took into drainPolicies.
	drains, active, err := e.core.DrainPager(ctx, e.opts.PageSize, func(active activeDigest, g uint64) DrainPlan {
		return e.drains.planDigest(active, g, now)
	}, &e.drainPolicies)
	if err != nil {
		if ctx.Err() == nil {
			e.fails.epochs.failed("drain worker", err)
		}
		return
	}
	e.fails.epochs.ok("drain worker")
	moved := drainOutcomes{}
	complete = e.runPages(ctx, "drain", drains, moved.seen)
	e.drains.updateDigest(active, drains, moved, complete, now)
}

// runWorkerCommands commits a worker's commands in chunks of at most
// workerChunk, each after the pacer's pause (workerPacer), so gateway
// commands never wait behind more than one small chunk. It returns false
// if a chunk failed or ctx ended before all were committed. A failed
// chunk is logged ("worker batch") to fails, the worker's. seen, when
// set, gets each committed chunk's commands and their results (the drain
// worker learns from them which drains moved something).
func (e *Engine) runWorkerCommands(ctx context.Context, fails *failLog, cmds []ledger.Command, seen func([]ledger.Command, []ledger.Result)) bool {
	if len(cmds) == 0 {
		return true
	}
	e.workerRuns.Add(1)
	e.workerCmds.Add(uint64(len(cmds)))
	for start := 0; start < len(cmds); start += workerChunk {
		end := min(start+workerChunk, len(cmds))
		if !e.pace.turn(ctx) {
			return false
		}
		started := time.Now()
		results, err := e.doMaintenance(ctx, cmds[start:end])
		e.pace.done(time.Since(started))
		if err != nil {
			// Stop the pass: the pager's memory (EpochScans, the drain
			// memo) must not count these commands as done.
			if ctx.Err() == nil {
				fails.failed("worker batch", err, "commands", end-start)
			}
			return false
		}
		fails.ok("worker batch")
		if seen != nil {
			seen(cmds[start:end], results)
		}
	}
	return true
}

// RunResolver runs one scan of the USAGE_UNKNOWN resolver now (the
// worker does it every ResolverOptions.Interval); it does nothing without
// Options.Resolver.
func (e *Engine) RunResolver(ctx context.Context) {
	if e.resolver != nil {
		e.resolver.Run(ctx)
	}
}

// Reservation returns the committed reservation (store.ErrNotFound when
// there is none): the recovery path for a lost reserve answer. For a
// reservation retention removed it returns its tombstone's receipt
// (Retired set; see ReservationOrTombstone).
func (e *Engine) Reservation(ctx context.Context, id string) (ledger.Reservation, error) {
	return e.ReservationOrTombstone(ctx, id)
}

// ReservationsUnknown returns a page of the USAGE_UNKNOWN backlog, the
// longest-waiting first (store.Store.ReservationsUnknown).
func (e *Engine) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	return e.core.store.ReservationsUnknown(ctx, f)
}

// UnknownBacklog counts the USAGE_UNKNOWN reservations and finds when the
// longest-waiting of them was marked (store.UnknownBacklog).
func (e *Engine) UnknownBacklog(ctx context.Context) (store.UnknownBacklog, error) {
	return e.core.store.ReservationsUnknownBacklog(ctx)
}

// AccountsInDebtCount counts the accounts whose stored row owes debt
// (store.Store.AccountsInDebtCount: from the store's debt index, in one
// read; a row refill has repaid since its last command counts until its
// next, as AccountsInDebt's store pages list it).
func (e *Engine) AccountsInDebtCount(ctx context.Context) (int64, error) {
	return e.core.store.AccountsInDebtCount(ctx)
}

// maxDebtScans bounds the store pages one AccountsInDebt call reads when
// refill has repaid most of what the stored rows still show.
const maxDebtScans = 8

// ShownWith is what a view's accounts were shown beside, each read in
// one snapshot with the accounts of its subject key
// (store.Store.AccountsView), so a caller marking an account active or
// rolled back marks it as its balances stood: never a generation both
// deciding and rolled back, or deciding beside a subject's capacity that
// a publish or rollback already moved.
type ShownWith struct {
	// one is the view every account shown was read from (AccountsPage,
	// a console page); nil when each subject key has its own (of).
	one *store.AccountsView
	// of holds each shown subject key's view (AccountsInDebt: one view a
	// store page, for the subjects first seen there).
	of map[ledger.PolicyKey]*store.AccountsView
}

// ShownWithView is a ShownWith of accounts all read from view (the
// console's standings for a key).
func ShownWithView(view *store.AccountsView) ShownWith { return ShownWith{one: view} }

// viewOf returns the view subject's accounts were read from; nil when none
// was shown.
func (w ShownWith) viewOf(subject ledger.PolicyKey) *store.AccountsView {
	if w.one != nil {
		return w.one
	}
	return w.of[subject]
}

// Decides reports whether key's generation decided for its subject key
// when it was shown (as DecidingGenerations would have answered in that
// snapshot).
func (w ShownWith) Decides(key ledger.AccountKey) bool {
	v := w.viewOf(key.SubjectKey())
	if v == nil {
		return false
	}
	g, ok := v.Deciding[key.SubjectKey()]
	return ok && g == key.Generation
}

// Policy returns the policy of the account of key (of its generation) as
// read in the snapshot of its balances; ok is false when it was not shown.
// The views' own maps are looked up, not copied per account: a console
// scan of a million accounts shows each with no allocation of its own.
func (w ShownWith) Policy(key ledger.AccountKey) (p ledger.Policy, ok bool) {
	if v := w.viewOf(key.SubjectKey()); v != nil {
		p, ok = v.Policies[key.Generation]
	}
	return p, ok
}

// AccountsInDebt returns up to f.Limit accounts that owe debt now, in key
// order after f.After, with what they were shown beside (ShownWith: the
// generation deciding for each one's subject key and its policy, read in
// the snapshot of its balances). The store finds the rows that owed at
// their last command; each is then shown as Accounts shows it, with the
// refill due up to now (which repays debt first), and left out if that
// repaid it. keep,
// when not nil, leaves out the rows whose key it refuses before anything
// else is read for them (a scoped caller's filter: a row outside the
// scope costs its stored row only). One call reads at most maxDebtScans
// store pages, and at most as many pages of f.Limit rows, whatever keep
// refuses; each read asks for one row more than the page still lacks
// (while that bound allows), so a page filled exactly at the store's end
// says no more. next is the cursor for the following page (the last row
// examined, which may be one keep refused or refill repaid), and more says
// whether the store may hold more debtors after it.
//
// The store reads of a call do not grow with f.Limit: per store page, the
// page itself and one view of the subjects of the rows keep lets through
// that no earlier page of the call viewed (store.Store.AccountsView: their
// accounts, the owing rows of those that owe, their heads and policies
// from one snapshot). A subject key is viewed once a call, so all its
// rows shown stood together.
func (e *Engine) AccountsInDebt(ctx context.Context, f store.DebtFilter, keep func(ledger.AccountKey) bool) (out []ledger.Account, with ShownWith, next ledger.AccountKey, more bool, err error) {
	with = ShownWith{of: map[ledger.PolicyKey]*store.AccountsView{}}
	if f.Limit <= 0 {
		return nil, with, ledger.AccountKey{}, false, fmt.Errorf("accounts in debt: limit %d, want a positive one", f.Limit)
	}
	next = f.After
	now := e.opts.Clock()
	budget := maxDebtScans * f.Limit // stored rows this call may still read
	// ofSubject holds the subjects' accounts as read until a first row
	// shows them, then as refilled: once per subject and call, so a
	// subject with two debtor rows (in one store page or two) shows both
	// from the same view and refill.
	ofSubject := map[ledger.PolicyKey][]ledger.Account{}
	viewOf := map[ledger.PolicyKey]*store.AccountsView{}
	refilled := map[ledger.PolicyKey]bool{}
	for range maxDebtScans {
		if budget == 0 {
			break
		}
		ask := min(f.Limit-len(out)+1, budget)
		stored, err := e.core.store.AccountsInDebt(ctx, store.DebtFilter{After: next, Limit: ask})
		if err != nil {
			return nil, with, ledger.AccountKey{}, false, err
		}
		budget -= len(stored)
		// Refill depends on which of the subject's generations holds its
		// capacity, so each row is shown from its subject's accounts as
		// Accounts shows them: those of every kept row not viewed yet,
		// read with their owing rows, heads and policies from one
		// snapshot (store.Store.AccountsView; the last row's too, though
		// it may only say there is more).
		kept := make([]bool, len(stored))
		var subjects []ledger.PolicyKey
		for i := range stored {
			if kept[i] = keep == nil || keep(stored[i].Key); kept[i] {
				if subject := stored[i].Key.SubjectKey(); viewOf[subject] == nil {
					subjects = append(subjects, subject)
				}
			}
		}
		if len(subjects) > 0 {
			view, err := e.core.store.AccountsView(ctx, subjects)
			if err != nil {
				return nil, with, ledger.AccountKey{}, false, err
			}
			for _, subject := range subjects {
				viewOf[subject] = &view
			}
			for _, a := range view.Accounts {
				ofSubject[a.Key.SubjectKey()] = append(ofSubject[a.Key.SubjectKey()], a)
			}
		}
		for i := range stored {
			if len(out) == f.Limit {
				return out, with, next, true, nil // stored[i] is one more
			}
			key := stored[i].Key
			next = key
			if !kept[i] {
				continue
			}
			subject := key.SubjectKey()
			view := viewOf[subject]
			if !refilled[subject] {
				shown, err := refilledAsShown(ofSubject[subject], policiesOfView(*view), decidingOfView(*view), view.Owing, now)
				if err != nil {
					return nil, with, ledger.AccountKey{}, false, err
				}
				ofSubject[subject], refilled[subject] = shown, true
			}
			accounts := ofSubject[subject]
			for j := range accounts {
				if dim, _ := accounts[j].Debt(); accounts[j].Key == key && dim >= 0 {
					out = append(out, accounts[j])
					with.of[subject] = view
				}
			}
		}
		if len(stored) < ask {
			return out, with, next, false, nil // no more rows that owed
		}
	}
	return out, with, next, true, nil
}

// Accounts returns the subject's accounts (every generation), with the
// refill due up to now applied to the copies shown (the stored rows refill
// lazily, on their next command).
func (e *Engine) Accounts(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, error) {
	shown, _, err := e.AccountsView(ctx, subject)
	return shown, err
}

// AccountsView returns what Accounts returns, with the view it was
// shown from (store.AccountsView: the policies of the accounts'
// generations and the generation deciding for the subject, read with
// the accounts from one snapshot), so that a caller rendering the
// accounts with their policies renders what stood together. For the
// zero key (every account) the accounts are listed first, then viewed
// (store.Store.AccountsView of the subjects listed).
func (e *Engine) AccountsView(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, store.AccountsView, error) {
	subjects := []ledger.PolicyKey{subject}
	if subject.Subject == "" {
		listed, err := e.core.store.AccountList(ctx, subject)
		if err != nil {
			return nil, store.AccountsView{}, err
		}
		subjects = subjectsOf(listed)
	}
	if len(subjects) == 0 {
		return []ledger.Account{}, store.AccountsView{}, nil
	}
	view, err := e.core.store.AccountsView(ctx, subjects)
	if err != nil {
		return nil, store.AccountsView{}, err
	}
	shown, err := e.shown(view)
	if shown == nil && err == nil {
		shown = []ledger.Account{}
	}
	return shown, view, err
}

// shown returns view's accounts with the refill due up to now applied
// (refilledAsShown, by the view's policies and deciding generations).
func (e *Engine) shown(view store.AccountsView) ([]ledger.Account, error) {
	return refilledAsShown(view.Accounts, policiesOfView(view), decidingOfView(view), view.Owing, e.opts.Clock())
}

// subjectsOf returns the distinct subject keys of accounts (in key
// order), in their order.
func subjectsOf(accounts []ledger.Account) []ledger.PolicyKey {
	var subjects []ledger.PolicyKey
	for i := range accounts {
		if s := accounts[i].Key.SubjectKey(); len(subjects) == 0 || subjects[len(subjects)-1] != s {
			subjects = append(subjects, s)
		}
	}
	return subjects
}

// policiesOfView returns view's policies by generation, as
// refilledAsShown takes them.
func policiesOfView(view store.AccountsView) map[uint64]*ledger.Policy {
	out := make(map[uint64]*ledger.Policy, len(view.Policies))
	for g, p := range view.Policies {
		out[g] = &p
	}
	return out
}

// decidingOfView returns the generation deciding for a subject of view.
func decidingOfView(view store.AccountsView) func(ledger.PolicyKey) (uint64, bool) {
	return func(subject ledger.PolicyKey) (uint64, bool) {
		g, ok := view.Deciding[subject]
		return g, ok
	}
}

// AccountsPage returns the accounts f selects after the subject key of
// f.After (the zero key: from the first) in key order, whole subject
// keys of about f.Limit accounts (at least 1), shown as Accounts shows them (refill due up to now
// applied to the account holding each subject's capacity), what they
// were shown beside (ShownWith: the generation deciding for each of
// their subject keys, absent when none decides, what the refill shown
// went by, as DecidingGenerations would answer for them, and each
// one's policy, so a caller need not read those heads and policies
// again), and the cursor of the next page; more is false at the end. Each page is a read
// of its own (store.Store.AccountsPage): reading every account this way
// never holds one read open over all of them, and reading one subject's
// (f.Subject) reads its accounts only. The page's subjects are then shown
// from one snapshot of their accounts, owing rows, heads and generations
// (store.Store.AccountsView), so the accounts, the deciding
// generations and the policies stood together.
func (e *Engine) AccountsPage(ctx context.Context, f store.AccountFilter) (_ []ledger.Account, with ShownWith, next ledger.AccountKey, more bool, err error) {
	after := f.After
	limit := max(f.Limit, 1)
	f.Limit = limit
	page, err := e.core.store.AccountsPage(ctx, f)
	if err != nil {
		return nil, with, after, false, err
	}
	if len(page) == limit {
		// The last subject key may go on in the next page: leave it
		// there, whole, unless it fills the page alone (the view reads
		// it whole).
		last := page[len(page)-1].Key.SubjectKey()
		whole := len(page)
		for whole > 0 && page[whole-1].Key.SubjectKey() == last {
			whole--
		}
		if whole > 0 {
			page = page[:whole]
		}
		more = true
	}
	if len(page) == 0 {
		return page, with, next, false, nil
	}
	next = page[len(page)-1].Key
	// The page's subjects whole, with their owing rows, heads and
	// policies, from one snapshot: reads in proportion to the page, not
	// every policy.
	view, err := e.core.store.AccountsView(ctx, subjectsOf(page))
	if err != nil {
		return nil, with, after, false, err
	}
	if n := len(view.Accounts); n > 0 && view.Accounts[n-1].Key.Compare(next) > 0 {
		next = view.Accounts[n-1].Key // the last subject read again has one more
	}
	shown, err := e.shown(view)
	with = ShownWithView(&view)
	return shown, with, next, more, err
}

// refilledAsShown applies to accounts, whole subject keys (every
// generation of each), the refill due up to now, given the policies of
// their generations (byGeneration, and the deciding one of each subject
// in owing) and the generation that decides for each subject (deciding,
// as ledger.DecidingGeneration): what Accounts shows. A subject in owing
// (its current pointer and owing-set rows as stored, read with its
// accounts: readOwing) is
// brought to now as its next command finds it, without the switch that
// command may make (ledger.BringToNowAsShown): while it is frozen its
// owing accounts repay at their own rates and its current account is
// the one the ledger keeps current. It returns store.ErrNotFound
// (wrapped) for an account whose generation byGeneration does not hold.
func refilledAsShown(accounts []ledger.Account, byGeneration map[uint64]*ledger.Policy, deciding func(ledger.PolicyKey) (uint64, bool), owing map[ledger.PolicyKey]store.SubjectOwing, now time.Time) ([]ledger.Account, error) {
	policies := make([]*ledger.Policy, len(accounts))
	// The account holding a subject's capacity, the only one shown
	// refilled, is the deciding generation's (ledger.DecidingGeneration).
	// When that generation has no account yet (a switch is pending, made by
	// the subject's next command) the capacity is still in the newest
	// generation not rolled back that has one, which the switch brings to
	// now under its own rule first.
	current := map[ledger.PolicyKey]uint64{}
	for i := range accounts {
		p, ok := byGeneration[accounts[i].Key.Generation]
		if !ok {
			return nil, fmt.Errorf("policy %d: %w", accounts[i].Key.Generation, store.ErrNotFound)
		}
		policies[i] = p
		if subject := accounts[i].Key.SubjectKey(); !p.RolledBack && p.Generation > current[subject] {
			current[subject] = p.Generation
		}
	}
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		if g, ok := deciding(subject); ok && g == accounts[i].Key.Generation {
			current[subject] = g
		}
	}
	// Subjects shown from what they store: a scratch book each.
	scratches := map[ledger.PolicyKey]*ledger.Memory{}
	keys := map[ledger.PolicyKey][]ledger.AccountKey{}
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		o, ok := owing[subject]
		if !ok {
			continue
		}
		scratch := scratches[subject]
		if scratch == nil {
			scratch = ledger.NewMemory()
			scratch.DiscardJournal = true
			if o.HasCurrent {
				scratch.AccountCurrentPut(subject, o.Current)
			}
			for name, v := range o.Meta {
				scratch.MetaPut(name, v)
			}
			scratches[subject] = scratch
		}
		scratch.PolicyPut(policies[i])
		scratch.AccountPut(&accounts[i])
		keys[subject] = append(keys[subject], accounts[i].Key)
	}
	for subject, scratch := range scratches {
		var p *ledger.Policy
		if g, ok := deciding(subject); ok {
			if p, ok = byGeneration[g]; !ok {
				return nil, fmt.Errorf("policy %d: %w", g, store.ErrNotFound)
			}
			scratch.PolicyPut(p)
		}
		ledger.BringToNowAsShown(scratch, subject, keys[subject], p, now)
	}
	for i := range accounts {
		subject := accounts[i].Key.SubjectKey()
		if scratch, ok := scratches[subject]; ok {
			if a, found := scratch.Account(accounts[i].Key); found && a != &accounts[i] {
				accounts[i] = *a
			}
			continue
		}
		scratch := ledger.NewMemory()
		scratch.DiscardJournal = true
		scratch.PolicyPut(policies[i])
		scratch.AccountPut(&accounts[i])
		if g, ok := current[subject]; ok {
			scratch.AccountCurrentPut(subject, g)
		}
		ledger.Refill(scratch, accounts[i].Key, now)
	}
	return accounts, nil
}

// Policies returns every published generation, oldest first.
func (e *Engine) Policies(ctx context.Context) ([]ledger.Policy, error) {
	return e.core.store.PolicyList(ctx)
}

// PoliciesPage returns a page of the policies f selects, oldest first,
// each with whether it is its key's active generation
// (store.Store.PolicyPage).
func (e *Engine) PoliciesPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	return e.core.store.PolicyPage(ctx, f)
}

// PoliciesAfter returns the generations newer than generation, oldest
// first.
func (e *Engine) PoliciesAfter(ctx context.Context, generation uint64) ([]ledger.Policy, error) {
	return e.core.store.PolicyListAfter(ctx, generation)
}

// PolicyHead returns a policy key's head (store.ErrNotFound when the key
// never had a policy).
func (e *Engine) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	return e.core.store.PolicyHead(ctx, key)
}

// Policy returns one generation (store.ErrNotFound when unknown).
func (e *Engine) Policy(ctx context.Context, generation uint64) (ledger.Policy, error) {
	return e.core.store.PolicyGet(ctx, generation)
}

// Shards returns every emergency shard.
func (e *Engine) Shards(ctx context.Context) ([]ledger.Shard, error) {
	return e.core.store.ShardList(ctx)
}

// Audit runs a full audit (AuditWith, engine/compaction.go) and returns
// the discrepancies ledger.Audit finds (none for a sound ledger).
func (e *Engine) Audit(ctx context.Context) ([]ledger.Discrepancy, error) {
	return e.AuditWith(ctx, AuditOptions{})
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	s := Stats{
		Commands: e.commands.Load(), Batches: e.batches.Load(), Conflicts: e.conflicts.Load(),
		Failures: e.failures.Load(), WorkerRuns: e.workerRuns.Load(), WorkerCmds: e.workerCmds.Load(),
	}
	if t := e.lastBatch.Load(); t != 0 {
		s.LastBatchAt = time.Unix(0, t)
	}
	return s
}

// readyProbeEvery is how often, at most, Ready probes a store whose last
// batch failed.
const readyProbeEvery = time.Second

// probePadPerCommand and probePadMin size a ready probe after a failed
// batch of n commands: max(probePadMin, n*probePadPerCommand) meta rows of
// about 40 bytes (capped at ProbePadMax, ~80 KiB), more than such a batch
// writes on SQLite (a reserve: one reservation row, its account and
// journal rows and their index entries).
const (
	probePadPerCommand = 32
	probePadMin        = 256
)

// Ready returns nil when the last batch reached the store. After a failed
// batch it probes the store (Core.Probe, at most once per readyProbeEvery,
// not while a batch runs) with a write at least as large as the failed
// batch's, and returns nil once a probe commits, so a replica that
// readiness took out of rotation, and so gets no commands, comes back when
// its store does, and a full disk with room for one small row but not for
// a batch stays not ready; until then it returns the error of the failed
// batch or of the last failed probe. After a failed fsync (pipelined) it
// returns that error for good.
func (e *Engine) Ready() error {
	if err := e.failure(); err != nil {
		return err
	}
	box := e.lastErr.Load()
	if box == nil || box.err == nil {
		return nil
	}
	if box = e.probe(box); box.err != nil {
		return box.err
	}
	return e.failure()
}

// probe runs Core.Probe after the failed batch of failed, unless one ran
// within readyProbeEvery or a batch runs now (its outcome will say), and
// records the outcome where no batch has since: nil error when the store
// took the write. A failed probe keeps the failed batch's size, so the
// next probe is as large. It returns lastErr's box as it stands then.
func (e *Engine) probe(failed *errBox) *errBox {
	now := time.Now().UnixNano()
	last := e.lastProbe.Load()
	if now-last < int64(readyProbeEvery) || !e.lastProbe.CompareAndSwap(last, now) || !e.running.TryLock() {
		return e.lastErr.Load()
	}
	defer e.running.Unlock()
	ctx, cancel := context.WithTimeout(e.ctx, min(e.opts.BatchTimeout, 2*time.Second))
	err := e.core.Probe(ctx, e.opts.Clock(), max(probePadMin, failed.cmds*probePadPerCommand))
	cancel()
	next := &errBox{}
	if err != nil {
		next = &errBox{err: fmt.Errorf("%w: ready probe after a failed batch: %w", store.ErrUnavailable, err), cmds: failed.cmds}
	}
	e.lastErr.CompareAndSwap(failed, next)
	return e.lastErr.Load()
}

// Close stops the workers and the committer; commands already taken into a
// batch finish, commands still queued fail with ErrClosed. It does not close
// the store.
func (e *Engine) Close() error {
	e.closeErr.Do(func() {
		e.stop()
		e.workers.Wait()
		<-e.stopped
	})
	return nil
}
