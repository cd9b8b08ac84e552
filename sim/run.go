package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Outcome is what one interleaving produced.
type Outcome struct {
	Seed uint64
	// Events is the number of simulated events run; Commits the number of
	// store transactions the engine ran.
	Events  int64
	Commits int64
	// SimTime is how much simulated time passed.
	SimTime time.Duration
	// Fired counts how often each fault site fired; Enabled says which
	// sites the seed switched on.
	Fired   [numSites]int64
	Enabled [numSites]bool
	// Violation is the first violation (the run stopped there), or nil.
	Violation *Violation
	// TraceHash is a hash of every event of the run, in order: the same
	// seed and Config always give the same hash.
	TraceHash uint64
	// ReservationUnknown and UsageUnknown are how long each
	// RESERVATION_UNKNOWN and USAGE_UNKNOWN took to resolve (simulated).
	ReservationUnknown []time.Duration
	UsageUnknown       []time.Duration
	// Fairness is the fairness figure of the interleaving's scheduler.
	Fairness FairnessResult
	// SQLite says the interleaving ran on the real SQLite store.
	SQLite bool
	// Pipelined says it ran with pipelined durability, and Lost how
	// many commits crashes took before their fsync.
	Pipelined bool
	Lost      int
	// Retention says the retention worker ran; TombstoneReplays counts the
	// retried reserves the ledger answered from a tombstone.
	Retention        bool
	TombstoneReplays int64
	Retired          int64
	// ShardsRemoved counts the emergency shards it removed
	// (engine.Core.ShardsRemove), LateShardResends the resubmissions
	// gateways sent for them, ShardsReissued the shards issued under the
	// id of a removed one.
	ShardsRemoved, LateShardResends, ShardsReissued int64
	// Compaction says the compaction worker ran; Checkpoints counts the
	// checkpoints it stored, Compacted the journal rows it deleted,
	// CutCrashes the cuts crash_mid_cut ended.
	Compaction                         bool
	Checkpoints, Compacted, CutCrashes int64
	// Records counts what the recorded requests (Config.RecordShare) did.
	Records RecordStats
}

// Violation says which gate a run broke, where, and how to replay it.
type Violation struct {
	Gate   Gate
	Seed   uint64
	Detail string
	// At is the simulated time of the violation.
	At time.Duration
	// Shape and Sites describe the interleaving's configuration.
	Shape string
	Sites string
	// Last holds the last events before the violation, formatted.
	Last []string
	// Replay is the command that replays the interleaving.
	Replay string
}

// Report formats the violation for a terminal. The text depends only on
// the seed and Config, so a replay prints it byte for byte.
func (v *Violation) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "VIOLATION of gate %s in seed %d at simulated %s\n", v.Gate, v.Seed, fmtSimTime(int64(v.At)))
	fmt.Fprintf(&b, "  %s\n", v.Detail)
	fmt.Fprintf(&b, "  configuration: %s\n", v.Shape)
	fmt.Fprintf(&b, "  fault sites on: %s\n", v.Sites)
	fmt.Fprintf(&b, "  last %d events:\n", len(v.Last))
	for _, line := range v.Last {
		fmt.Fprintf(&b, "    %s\n", line)
	}
	fmt.Fprintf(&b, "  replay: %s\n", v.Replay)
	return b.String()
}

// ReplayCommand returns the command line that runs exactly the
// interleaving of seed under cfg.
func ReplayCommand(seed uint64, cfg *Config) string {
	cmd := fmt.Sprintf("capledger sim --seed %d --interleavings 1%s", seed, cfg.Flags())
	if m := os.Getenv("CAPLEDGER_MUTANT"); m != "" {
		// Only a binary built with -tags capledger_mutants reads it.
		cmd = "CAPLEDGER_MUTANT=" + m + " " + cmd + "   (capledger built with: go build -tags capledger_mutants ./cmd/capledger)"
	}
	return cmd
}

func (w *world) violate(g Gate, detail string) {
	if w.fail != nil {
		return
	}
	w.log(recViolation, ledgerNodeID, 0, "", 0, g.String()+": "+detail)
	w.fail = &Violation{
		Gate:   g,
		Seed:   w.seed,
		Detail: detail,
		At:     time.Duration(w.now),
		Shape:  w.shape.String(),
		Sites:  w.f.describe(),
		Last:   w.tr.last(),
		Replay: ReplayCommand(w.seed, w.cfg),
	}
}

func (f *faults) describe() string {
	var parts []string
	for s := Site(0); s < numSites; s++ {
		if f.enabled[s] {
			parts = append(parts, fmt.Sprintf("%s(p=%.2f)", s, f.rate[s]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// RunOne runs the interleaving of seed under cfg and returns its outcome.
// It is deterministic: the same seed and cfg give the same outcome and the
// same trace.
func RunOne(cfg *Config, seed uint64) Outcome {
	return runOne(cfg, seed, hooks{})
}

// hooks plant broken components for the tests that show the checks catch
// them.
type hooks struct {
	// wrapStore wraps the memstore below the recording store.
	wrapStore func(store.Store) store.Store
	// ignoreWeights gives every tenant weight 1 in the executors'
	// schedulers (the meter keeps the policies' weights).
	ignoreWeights bool
	// answerBeforeSync breaks pipelined durability: a batch is answered
	// as soon as it committed, before its fsync.
	answerBeforeSync bool
}

// runOne is RunOne with hooks.
func runOne(cfg *Config, seed uint64, h hooks) Outcome {
	w := newWorld(cfg, seed, h)
	defer w.closeLedgerStore()
	if w.fail == nil {
		w.start()
		w.run()
	}
	if w.fail == nil && w.finished {
		w.final()
	}
	out := Outcome{
		Seed:      seed,
		Events:    w.events,
		Commits:   w.ledger.commits,
		SimTime:   time.Duration(w.now),
		Fired:     w.f.fired,
		Enabled:   w.f.enabled,
		Violation: w.fail,
		TraceHash: w.tr.hash,
		Fairness:  w.fair.result(),
		SQLite:    w.onSQLite,
		Pipelined: w.pipelined,
		Lost:      w.ledger.lostUnsynced,

		Retention:        w.retention.on,
		TombstoneReplays: w.retention.tombstoneReplays,
		Retired:          int64(w.chk.retired),
		ShardsRemoved:    w.shards.removedCount,
		LateShardResends: w.shards.lateResends,
		ShardsReissued:   w.shards.reissued,

		Compaction:  w.compaction.on,
		Checkpoints: w.compaction.checkpoints,
		Compacted:   w.compaction.deleted,
		CutCrashes:  w.compaction.crashed,

		Records: w.recordStats,
	}
	out.ReservationUnknown = make([]time.Duration, len(w.resUnknown))
	for i, d := range w.resUnknown {
		out.ReservationUnknown[i] = time.Duration(d)
	}
	out.UsageUnknown = make([]time.Duration, len(w.usageUnknown))
	for i, d := range w.usageUnknown {
		out.UsageUnknown[i] = time.Duration(d)
	}
	return out
}

func newWorld(cfg *Config, seed uint64, h hooks) *world {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	w := &world{cfg: cfg, seed: seed, rng: rng, ctx: context.Background(), hooks: h}
	w.shape = shape{
		gateways:  2 + rng.IntN(cfg.Gateways-1),
		executors: 1 + rng.IntN(cfg.Executors),
		tenants:   1 + rng.IntN(cfg.Tenants),
		dims:      1 + rng.IntN(cfg.maxDims()),
		requests:  max(1, cfg.Requests/2) + rng.IntN(cfg.Requests-max(1, cfg.Requests/2)+1),
	}
	w.f = newFaults(rng, cfg.Only, cfg.RecordShare > 0)
	w.shards.on = w.f.enabled[SiteShardReuse] || w.f.enabled[SiteShardReplayAfterRestart] || rng.IntN(2) == 0
	w.tr = newTracer(cfg.LastEvents, cfg.Trace)
	w.tr.names = []string{"ledger"}
	for i := 0; i < w.shape.gateways; i++ {
		w.tr.names = append(w.tr.names, fmt.Sprintf("gw%d", i))
	}
	for i := 0; i < w.shape.executors; i++ {
		w.tr.names = append(w.tr.names, fmt.Sprintf("exec%d", i))
	}
	w.cut = make([]bool, 1+w.shape.gateways+w.shape.executors)
	w.gateways = make([]gateway, w.shape.gateways)
	for i := range w.gateways {
		w.gateways[i] = gateway{up: true, bootEpoch: 1}
	}
	w.execs = make([]executor, w.shape.executors)
	for i := range w.execs {
		w.execs[i].index, w.execs[i].up = i, true
		w.execs[i].q.slots = 1 + rng.IntN(3)
	}
	w.chk = newChecker(w)
	if cfg.SQLiteShare > 0 {
		// Drawn only when asked for, so that a run without SQLite keeps
		// every seed's interleaving as it was.
		w.onSQLite = rng.Float64() < cfg.SQLiteShare
	}
	if cfg.PipelinedShare > 0 {
		// Drawn only when asked for, as SQLiteShare is.
		w.pipelined = rng.Float64() < cfg.PipelinedShare
	}
	w.newLedger()
	return w
}

// start publishes the first policies (before any fault can strike), plans
// the requests' arrivals and schedules the periodic actors.
func (w *world) start() {
	w.op.base = map[ledger.PolicyKey]*ledger.Policy{}
	w.drawRetention()
	w.drawCompaction()
	// Drawn first: a backlog interleaving's policies hold long enough for
	// the burst's queue to drain (initialPolicy).
	w.backlogOn = w.shape.executors >= 2 && w.chance(backlogShare)
	shareAny := w.shape.tenants >= 2 && w.chance(0.5)
	var publish []ledger.Command
	for t := 0; t < w.shape.tenants; t++ {
		subject := fmt.Sprintf("tenant-%d", t)
		key := ledger.PolicyKey{Subject: subject, Route: route, Region: region}
		if shareAny && t == w.shape.tenants-1 {
			key.Subject = ledger.AnySubject
		}
		w.tenants = append(w.tenants, tenant{subject: subject, key: key})
		p := w.initialPolicy(key)
		w.op.base[key] = p
		w.op.keys = append(w.op.keys, key)
		publish = append(publish, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
	}
	results, err := w.ledger.core.Commit(w.ctx, publish, w.time())
	w.ledger.commits++
	w.chk.afterCommit(publish)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("publishing the first policies: %v", err))
		return
	}
	for i := range results {
		if results[i].Err != nil {
			w.violate(GateJournal, fmt.Sprintf("publishing %s: %v", publish[i].Policy.Key, results[i].Err))
			return
		}
	}
	w.op.policiesStale = true
	for i := range w.execs {
		w.newExecSched(&w.execs[i])
	}

	for g := 0; g < w.shape.gateways; g++ {
		for i := 0; i < w.shape.requests; i++ {
			at := w.between(0, int64(w.cfg.ArrivalWindow))
			r := w.newRequest(g, w.rng.IntN(w.shape.tenants), at)
			if w.cfg.RecordShare > 0 && w.chance(w.cfg.RecordShare) {
				// Drawn only when asked for, so that a run without records
				// keeps every seed's interleaving as it was.
				r.record = true
				r.digest = recordDigest(&w.tenants[r.tenant])
			}
			w.schedule(event{at: at, kind: evArrival, a: r.idx})
		}
	}
	if w.backlogOn {
		w.backlogBurst()
	}
	w.after(workerEvery, evWorker, 0, 0, 0)
	w.after(chaosEvery, evChaos, 0, 0, 0)
	w.shards.init(w)
	w.schedule(event{at: int64(w.cfg.HealAt), kind: evHeal})
	w.schedule(event{at: int64(w.cfg.HealAt + w.cfg.Deadline), kind: evDeadline})
}

// backlogShare is the share of interleavings (with 2+ executors) with a
// backlog burst.
const backlogShare = 0.08

// Backlog bursts: each tenant sends backlogMin..backlogMax requests of
// backlogCost tokens within a second. Equal costs and actual = estimate
// keep the scheduler's fairness bound (M + 3·c·E, with E = 0) at one
// request, so a tenant's fair share in the stretches it stays backlogged
// soon outgrows the bound divided by its budget and is judged
// (tenantFairness).
const (
	backlogMin, backlogMax = 40, 110
	backlogCost            = 10
)

// backlogBurst plans a burst of small, short requests from every tenant
// within a second, all run by executor 0: enough queued work for its
// scheduler's fairness to be judged per tenant (tenantFairness).
func (w *world) backlogBurst() {
	// After the faults heal: the burst measures the scheduler, and a
	// partition, crash or overrun holding executor 0's slots for a minute
	// would only end the stretches early (every other request meets them).
	at := int64(w.cfg.HealAt) + w.between(int64(time.Second), int64(10*time.Second))
	for t := 0; t < w.shape.tenants; t++ {
		n := backlogMin + w.rng.IntN(backlogMax-backlogMin+1)
		for i := 0; i < n; i++ {
			r := w.newRequest(w.rng.IntN(w.shape.gateways), t, 0)
			r.backlog = true
			r.units[0] = backlogCost
			for d := 1; d < w.shape.dims; d++ {
				r.units[d] = 0 // no request-count hold: the token bucket decides
			}
			r.digest = digestOf(r)
			r.arrival = at + w.between(0, int64(time.Second))
			w.schedule(event{at: r.arrival, kind: evArrival, a: r.idx})
		}
	}
}

func (w *world) finish() {
	w.finished = true
	w.log(recDone, ledgerNodeID, 0, "", 0, "converged")
}

// final runs the end-of-run checks: the whole store audited, and every
// operation that ran recorded with exactly its receipt's usage.
func (w *world) final() {
	w.chk.fullAudit("at the end")
	if w.fail != nil {
		return
	}
	w.shardFinal()
	if w.fail != nil {
		return
	}
	w.tenantFairness()
	if w.fail != nil {
		return
	}
	for _, r := range w.requests {
		if !r.started {
			continue
		}
		got, err := w.ledgerStore.ReservationGet(w.ctx, r.id)
		if rs := w.chk.resv[r.id]; errors.Is(err, store.ErrNotFound) && rs != nil && rs.retired {
			// Removed by retention: its tombstone says how it ended (until
			// the horizon forgot it), the checker saw what its settle
			// recorded.
			got, err = ledger.Reservation{ID: r.id, State: rs.state, Actual: rs.actual}, nil
			if t, terr := w.ledgerStore.TombstoneGet(w.ctx, r.id); terr == nil {
				got.State = t.State
			} else if !rs.forgotten {
				err = fmt.Errorf("tombstone of %s: %w", r.id, terr)
			}
		}
		if err != nil || (got.State != ledger.StateSettled && got.State != ledger.StateSettledWithDebt) || got.Actual != r.actual {
			w.violate(GateUnknownAsUnconsumed, fmt.Sprintf("operation %s ran and used %v, but the ledger holds %s with %v (%v)",
				r.opID, r.actual, got.State, got.Actual, err))
			return
		}
	}
}
