package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Journal compaction at statement checkpoints (see docs/OPERATIONS.md,
// "Retention and compaction"). Not to be confused with SQLite's WAL
// checkpointer (store/sqlite/checkpoint.go).
//
// Once per Every (at the first pass after each multiple of it, so at the
// epoch close when Every is the policies' epoch length), the worker audits
// the ledger since the last checkpoint; when the audit finds nothing, the
// ledger cuts the next checkpoint from that same read (ledger.AuditWith)
// and the store appends it to the chain. Then the worker deletes the
// journal the last checkpoint summarises, in transactions of Batch rows,
// paced like retention (pace.go) so admission goes on between them. A
// discrepancy stops compaction: nothing is deleted that an operator may
// need to see why.

// CompactionOptions configure the compaction worker.
type CompactionOptions struct {
	// Every is how often a checkpoint is cut (default 1 hour,
	// ledger.DefaultEpochLength).
	Every time.Duration
	// Interval is how often the worker runs (default 1 minute).
	Interval time.Duration
	// Batch is how many stored journal rows one deletion removes
	// (default 256: a stored row is a whole batch's journal, a few KiB
	// under load, so a deletion frees about a MiB).
	Batch int
	// CutGCPercent, when positive, is the GC target (debug.SetGCPercent)
	// while a checkpoint is cut, restored afterwards: a cut holds a replay
	// per account touched since the last checkpoint (about 160 bytes
	// each with its index entry) for its length, and under a large
	// target its garbage grows the heap to several times that
	// (docs/PERFORMANCE.md, a million tenants). 0 leaves the target alone.
	CutGCPercent int
}

func (o *CompactionOptions) withDefaults() *CompactionOptions {
	if o == nil {
		return nil
	}
	out := *o
	if out.Every <= 0 {
		out.Every = ledger.DefaultEpochLength
	}
	if out.Interval <= 0 {
		out.Interval = time.Minute
	}
	if out.Batch <= 0 {
		out.Batch = defaultCompactionBatch
	}
	return &out
}

const defaultCompactionBatch = 256

// The compaction worker's failures and refusals, each logged through
// the worker's failLog at the cadence every worker's failures follow
// (workerlog.go: the first at once, then further and further apart, and
// once when a pass gets past it again).
//
// compactionConflictLog is the warning of a worker whose cuts the store
// refuses with store.ErrConflict pass after pass (another writer holds
// the checkpoint lease), logged from the compactionConflictsLogged-th
// pass in a row on. compactionRefusedLog is the error of a cut its audit
// refused (discrepancies; counted in CompactionStats.Refused at every
// refused audit). The other three are the store's failures at each
// step.
const (
	compactionConflictLog     = "compaction: checkpoint refused pass after pass, another writer holds the store's checkpoint lease"
	compactionConflictsLogged = 2
	compactionRefusedLog      = "compaction: the audit found discrepancies; no checkpoint cut, nothing deleted"
	compactionLastLog         = "compaction: last checkpoint"
	compactionCutLog          = "compaction: checkpoint"
	compactionJournalLog      = "compaction: journal"
)

// A refused cut's audit is not run again at every pass: nothing it
// read changes by itself (a discrepancy is an account, a chain or an
// entry already written), and on a large ledger it reads every account.
// The k-th refused audit in a row waits Interval<<k (2, 4, 8 ... passes)
// for the next, at most compactionRefusedWaitMax (never below Interval),
// unless the operator's fix shows first: a clean audit recorded in the
// store after the refused one (capledger audit, the console's Run audit,
// against any replica), or a last checkpoint other than the one the
// refused audit started from (another replica cut, a restore). A restart
// audits at its first due pass. The journal moving on is no sign: under
// load it always does.
const compactionRefusedWaitMax = time.Hour

// compactionRefusal is the compaction worker's state while its audits
// refuse the cut: written by its passes, read by CompactionStats.
type compactionRefusal struct {
	mu sync.Mutex
	// audits counts the refused audits in a row (0: not refusing);
	// since is the first's time and next when the next is due, on the
	// engine's Clock (the schedule the passes keep, as the cut's due
	// time is); seq is the last checkpoint's Seq the last refused audit
	// started from. auditedAt is when the last refused audit ended on
	// the wall clock (cleanAuditSince says why).
	audits      int
	since, next time.Time
	auditedAt   time.Time
	seq         int64
}

// refused notes an audit at now (engine Clock), ended at the wall
// clock's auditedAt, from the checkpoint seq, that refused the cut, and
// returns when the next audit is due.
func (r *compactionRefusal) refused(now, auditedAt time.Time, seq int64, interval time.Duration) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.audits == 0 {
		r.since = now
	}
	r.audits++
	wait, most := interval, max(interval, compactionRefusedWaitMax)
	for range r.audits {
		wait = min(2*wait, most)
	}
	r.auditedAt, r.next, r.seq = auditedAt, now.Add(wait), seq
	return r.next
}

// end ends the refusal (a cut went through, or another replica's did).
func (r *compactionRefusal) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.audits, r.since, r.auditedAt, r.next, r.seq = 0, time.Time{}, time.Time{}, time.Time{}, 0
}

// state returns the refusal's start and when its next audit is due (zero
// times when no cut is refused), and the checkpoint and time of its last
// refused audit.
func (r *compactionRefusal) state() (since, next time.Time, seq int64, auditedAt time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.since, r.next, r.seq, r.auditedAt
}

type compactionCounters struct {
	checkpoints, deleted, refused atomic.Uint64
	// conflicts counts the passes in a row whose cut was refused with
	// store.ErrConflict.
	conflicts atomic.Uint64
	lastCut   atomic.Int64 // Unix nanoseconds of the last CutAt seen
	lastSeq   atomic.Int64
	// written is the rate at which journal rows were stored, per second
	// (math.Float64bits), between the cuts of the last two checkpoints
	// this engine saw (sawCheckpoint): journal positions, so every
	// replica's batches count.
	written atomic.Uint64
	// seenMu guards seen, the newest checkpoint header this engine saw.
	seenMu sync.Mutex
	seen   ledger.Checkpoint
	// refusal is set while the audits refuse the cut.
	refusal compactionRefusal
}

// newTerm forgets the refusal and the conflicts in a row: this engine
// starts a term as worker leader (tick), and while another replica led,
// an operator may have fixed what the audit refused, or that replica
// cut. Its first due pass audits at once, as a replica that never led
// does, instead of waiting out the backoff of its earlier term.
func (c *compactionCounters) newTerm() {
	c.refusal.end()
	c.conflicts.Store(0)
}

// sawCheckpoint notes c, a checkpoint header read from the store or just
// cut, whichever replica cut it. When c is newer than the newest this
// engine saw before, the rate at which the journal was written between
// their cuts becomes the rate journal deletion keeps up with: the rows c
// made deletable are exactly those, so the rate is theirs, and it is
// refreshed at every compaction pass that finds a new checkpoint (the
// pass reads the last header anyway), not only when this engine cuts
// one: a replica that holds the lease while another replica's cut lands
// (its own cut refused with store.ErrConflict, or the lease moving back
// and forth) paced the deletion by a rate a period or more old, or by
// none. Only the first checkpoint an engine sees (after a start or a
// first lease) gives no rate: what an earlier holder left undeleted, at
// most the rows of one period, then goes at the deferrable share until
// this engine sees the next checkpoint, whose deletion keeps up with
// both at journalKeepUp times the rate.
func (e *Engine) sawCheckpoint(c ledger.Checkpoint) {
	e.compaction.seenMu.Lock()
	defer e.compaction.seenMu.Unlock()
	seen := &e.compaction.seen
	if c.Seq <= seen.Seq {
		return
	}
	if seen.Seq > 0 {
		e.compaction.written.Store(math.Float64bits(journalRate(seen.Through, seen.CutAt, c.Through, c.CutAt)))
	}
	*seen = c
	seen.Accounts = nil
}

// journalKeepUp: while gateways are admitted, journal deletion removes at
// least this many times the rate at which journal rows are written,
// whatever the deferrable pacer's share allows (as retentionKeepUp): in
// steady state each cut makes an interval's rows deletable, and deleting
// them costs what writing them made due. At a quarter of the share with
// pauses capped at 1 s, steps of 50 ms or more deleted about 256 rows a
// second, below a load of 1,000 batches a second.
const journalKeepUp = 2.0

// journalRate is the rate at which journal rows were written between
// position from at fromAt and position through at now.
func journalRate(from int64, fromAt time.Time, through int64, now time.Time) float64 {
	d := now.Sub(fromAt).Seconds()
	if d <= 0 || through <= from {
		return 0
	}
	return float64(through-from) / d
}

// keepUpPause shortens pause to the one that removes keepUp times rate
// with steps of rows taking took each (none, when the step itself took
// longer).
func keepUpPause(pause, took time.Duration, rows int, keepUp, rate float64) time.Duration {
	if rate <= 0 || rows <= 0 {
		return pause
	}
	return min(pause, max(0, time.Duration(float64(rows)/(keepUp*rate)*float64(time.Second))-took))
}

// CompactionStats are the compaction worker's counters.
type CompactionStats struct {
	// On: the engine cuts checkpoints (Options.Compaction is set), on
	// the lease holder.
	On bool
	// Checkpoints cut by this engine; Deleted journal rows; Refused: cuts
	// not made because the audit found discrepancies, one per refused
	// audit.
	Checkpoints, Deleted, Refused uint64
	// LastSeq and LastCutAt name the newest checkpoint this engine saw.
	LastSeq   int64
	LastCutAt time.Time
	// RefusingSince is when the first of the refused audits in a row
	// ran, NextAuditAt when the next is due (compactionRefusedWaitMax);
	// both zero unless the last audit refused the cut and this engine
	// still runs the worker (it holds the worker lease).
	RefusingSince, NextAuditAt time.Time
}

// CompactionStats returns the compaction worker's counters.
func (e *Engine) CompactionStats() CompactionStats {
	s := CompactionStats{On: e.opts.Compaction != nil, Checkpoints: e.compaction.checkpoints.Load(), Deleted: e.compaction.deleted.Load(),
		Refused: e.compaction.refused.Load(), LastSeq: e.compaction.lastSeq.Load()}
	if t := e.compaction.lastCut.Load(); t != 0 {
		s.LastCutAt = time.Unix(0, t).UTC()
	}
	if w := e.leaderWorker("compaction"); w != nil && e.runsTermOf(w) {
		// A replica that lost the lease no longer runs the worker: the
		// refusal is the new holder's to show.
		s.RefusingSince, s.NextAuditAt, _, _ = e.compaction.refusal.state()
	}
	return s
}

// errAuditFound is CutCheckpoint's error when the audit found
// discrepancies.
var errAuditFound = errors.New("the audit found discrepancies")

// CutCheckpoint audits the ledger since the last checkpoint and, when it
// is sound, stores the next checkpoint, cut at now. It returns the
// checkpoint's header (nil when the journal holds nothing new: then it
// reads two indexed rows, store.JournalAfter, and no snapshot), the
// discrepancies found (then no checkpoint is cut), and store.ErrConflict
// when another replica appended first or is writing one.
//
// Nothing is held whole: the audit reads the accounts and the last
// checkpoint's accounts a page at a time, and once every check has passed
// the checkpoint's accounts go to the store's writer, a page of
// checkpointPage per transaction, paced like compaction (pace.go), the
// header last. What the audit holds is the replay of each account with
// journal entries since the last checkpoint. When the store's snapshot
// names a directory (SQLite), the audit's one pass over the accounts
// stages the checkpoint's accounts in an unlinked file there
// (fileStage); once every check has passed, the replays and the store's
// read are let go and the rows are written from the file. Otherwise the
// accounts' keys are read a second time to merge them with the replays.
func (e *Engine) CutCheckpoint(ctx context.Context, now time.Time) (*ledger.Checkpoint, []ledger.Discrepancy, error) {
	// The watermark: with nothing committed after the last checkpoint,
	// or nothing journaled at all before the first, no snapshot is
	// taken. It would read every move, shard, statement and retained
	// total into memory, and every account's policy, to find the same
	// (without a checkpoint, at every pass: a store holding only
	// published policies read them all every minute).
	last, ok, err := e.core.store.CheckpointLast(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	after, err := e.core.store.JournalAfter(ctx, last.Through)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	if !after {
		if ok {
			e.compaction.lastCut.Store(last.CutAt.UnixNano())
			e.compaction.lastSeq.Store(last.Seq)
			e.sawCheckpoint(last)
		}
		return nil, nil, nil
	}
	if o := e.opts.Compaction; o != nil && o.CutGCPercent > 0 {
		defer debug.SetGCPercent(debug.SetGCPercent(o.CutGCPercent))
	}
	var cp *ledger.Checkpoint
	var found []ledger.Discrepancy
	err = e.core.store.AuditSnapshot(ctx, true, func(snap *ledger.Snapshot, through int64) error {
		last := snap.LastCheckpoint()
		if last != nil {
			e.compaction.lastCut.Store(last.CutAt.UnixNano())
			e.compaction.lastSeq.Store(last.Seq)
			e.sawCheckpoint(*last)
		}
		if through <= 0 || last != nil && through <= last.Through {
			return nil
		}
		seq := int64(1)
		if last != nil {
			seq = last.Seq + 1
		}
		out := e.newCheckpointOutput(ctx, seq)
		defer out.close()
		opts := ledger.AuditOptions{SinceCheckpoint: true, Cut: through, CutAt: now, Emit: out.emit}
		var stage *fileStage
		if snap.TempDir != "" {
			// The accounts read once, and the store's read ended before
			// the rows are written (ledger.AuditOptions.Stage).
			var err error
			if stage, err = newFileStage(snap.TempDir); err != nil {
				return err
			}
			defer stage.close()
			opts.Stage = stage
		}
		found, cp = ledger.AuditWith(e.paced(ctx, snap, e.newAuditPacer(0.5)), opts)
		if out.err != nil {
			cp = nil
			return out.err
		}
		if stage != nil && stage.err != nil {
			cp = nil
			return stage.err
		}
		if cp != nil {
			if err := out.finish(cp); err != nil {
				cp = nil
				return err
			}
		}
		return ctx.Err()
	})
	if err != nil {
		if cp == nil && errors.Is(err, store.ErrConflict) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	if len(found) > 0 {
		e.compaction.refused.Add(1)
		return nil, found, nil
	}
	if cp == nil {
		return nil, nil, nil
	}
	e.compaction.checkpoints.Add(1)
	e.compaction.lastCut.Store(cp.CutAt.UnixNano())
	e.compaction.lastSeq.Store(cp.Seq)
	e.sawCheckpoint(*cp)
	return cp, nil, nil
}

// checkpointPage is how many accounts of a checkpoint the engine hands
// the store's writer at a time (a variable: tests lower it).
var checkpointPage = store.CheckpointPage

// checkpointOutput takes a cut checkpoint's accounts from the audit
// (ledger.AuditOptions.Emit) a page at a time into the store's writer,
// opened at the first page: the audit emits only once every check has
// passed, so a refused cut writes nothing.
type checkpointOutput struct {
	e    *Engine
	ctx  context.Context
	seq  int64
	w    store.CheckpointWriter
	page []ledger.CheckpointAccount
	pace *pacer
	err  error
	// held is the most accounts the output held at once (tests).
	held int
}

func (e *Engine) newCheckpointOutput(ctx context.Context, seq int64) *checkpointOutput {
	return &checkpointOutput{e: e, ctx: ctx, seq: seq, page: make([]ledger.CheckpointAccount, 0, checkpointPage), pace: e.newPacer(0.5)}
}

func (o *checkpointOutput) emit(a *ledger.CheckpointAccount) error {
	o.page = append(o.page, *a)
	o.held = max(o.held, len(o.page))
	if len(o.page) < checkpointPage {
		return nil
	}
	return o.flush()
}

// flush puts the page, then pauses as pace.go says.
func (o *checkpointOutput) flush() error {
	if o.err != nil {
		return o.err
	}
	if o.w == nil {
		if o.w, o.err = o.e.core.store.CheckpointWrite(o.ctx, o.seq); o.err != nil {
			o.w = nil
			return o.err
		}
	}
	if len(o.page) > 0 {
		started := time.Now()
		if o.err = o.w.Put(o.ctx, o.page); o.err != nil {
			return o.err
		}
		o.page = o.page[:0]
		o.pace.wait(o.ctx, time.Since(started), 0)
	}
	o.err = o.ctx.Err()
	return o.err
}

// finish puts the last page and stores cp's header.
func (o *checkpointOutput) finish(cp *ledger.Checkpoint) error {
	if err := o.flush(); err != nil {
		return err
	}
	return o.w.Finish(o.ctx, cp)
}

func (o *checkpointOutput) close() {
	if o.w != nil {
		o.w.Close()
	}
}

// CompactJournal deletes the journal the last checkpoint summarises, in
// transactions of the configured batch (defaultCompactionBatch rows
// without Compaction), paced (pace.go, newDeferrablePacer), until none
// is left, ctx ends or
// this engine, running its workers, stops leading. It returns the rows
// deleted.
func (e *Engine) CompactJournal(ctx context.Context) (int, error) {
	batch := defaultCompactionBatch
	if e.opts.Compaction != nil {
		batch = e.opts.Compaction.Batch
	}
	total := 0
	pace := e.newDeferrablePacer(0.5)
	for ctx.Err() == nil && (e.opts.DisableWorkers || e.IsLeader()) {
		started := time.Now()
		n, err := e.core.store.JournalCompact(ctx, batch)
		total += n
		e.compaction.deleted.Add(uint64(n))
		if err != nil || n == 0 {
			return total, err
		}
		took := time.Since(started)
		// Keeping up with what every replica writes is not capped by
		// the share (busy or not: on PostgreSQL this engine's own
		// admissions may be none of the load); a backlog beyond it is.
		pause := keepUpPause(pace.pause(took, 0), took, n, journalKeepUp, math.Float64frombits(e.compaction.written.Load()))
		if !sleep(ctx, pause) {
			break
		}
	}
	return total, ctx.Err()
}

// runCompaction is the compaction worker's pass. A checkpoint is due
// once a period boundary (a multiple of Every) has passed since the last
// stored checkpoint's cut time, read from the store at every pass (one
// row): so a restarted server, or a replica that just took the lease,
// cuts on the schedule the chain already follows instead of at its
// first pass, which on a large ledger is a row per account and a staged
// file of the same size every deploy or crash loop. Only a store without
// any checkpoint is due at once. The journal the last checkpoint
// summarises is deleted at every pass, due or not, so what a process
// that died mid-deletion left goes at the next one's first pass; not
// while the audit refuses the cut, which it runs again only as
// compactionRefusedWaitMax says.
func (e *Engine) runCompaction(ctx context.Context) {
	o := e.opts.Compaction
	now := e.opts.Clock()
	last, ok, err := e.core.store.CheckpointLast(ctx)
	if err != nil {
		if ctx.Err() == nil {
			e.fails.compaction.failed(compactionLastLog, err)
		}
		return
	}
	e.fails.compaction.ok(compactionLastLog)
	if ok {
		e.compaction.lastCut.Store(last.CutAt.UnixNano())
		e.compaction.lastSeq.Store(last.Seq)
		e.sawCheckpoint(last)
	}
	due := !ok || now.Truncate(o.Every).After(last.CutAt)
	if since, next, seq, auditedAt := e.compaction.refusal.state(); !since.IsZero() {
		switch {
		case last.Seq != seq && !due:
			// Another replica's cut went through its audit since.
			e.compaction.refusal.end()
			e.fails.compaction.ok(compactionRefusedLog)
		case last.Seq == seq && now.Before(next) && !e.cleanAuditSince(ctx, auditedAt):
			return // still refused: nothing the audit reads was fixed
		}
	}
	if due {
		cp, found, err := e.CutCheckpoint(ctx, now)
		if cp != nil || len(found) > 0 || err != nil {
			// The cut's snapshot (every account, the last checkpoint's
			// accounts) and the checkpoint are garbage now: hand the
			// heap they grew back to the system rather than keep it
			// until the scavenger gets to it (docs/PERFORMANCE.md, a
			// million tenants). Not after a pass that found nothing new
			// (no snapshot): a forced collection marks the whole heap,
			// the row cache included, and with nothing new the cut stays
			// due at every pass.
			debug.FreeOSMemory()
		}
		if errors.Is(err, store.ErrConflict) {
			// Once is a race with another replica (it appended first,
			// or is writing: the next pass finds its checkpoint). Again
			// at every pass, a writer holds the store's checkpoint lease
			// and no checkpoint lands: say so, and once when a cut goes
			// through again.
			if n := e.compaction.conflicts.Add(1); n >= compactionConflictsLogged {
				e.fails.compaction.failed(compactionConflictLog, err, "passes", n)
			}
		} else if err == nil {
			e.compaction.conflicts.Store(0)
			e.fails.compaction.ok(compactionConflictLog)
		}
		switch {
		case errors.Is(err, store.ErrConflict): // the store answered: another replica cuts
			e.fails.compaction.ok(compactionCutLog)
		case err != nil:
			if ctx.Err() == nil {
				e.fails.compaction.failed(compactionCutLog, err)
			}
			return
		case len(found) > 0:
			next := e.compaction.refusal.refused(now, time.Now(), last.Seq, o.Interval)
			e.fails.compaction.failedAt(slog.LevelError, compactionRefusedLog, nil,
				"count", len(found), "first", found[0].String(), "next_audit_at", next.UTC().Format(time.RFC3339))
			return
		default:
			e.compaction.refusal.end()
			e.fails.compaction.ok(compactionCutLog)
			e.fails.compaction.ok(compactionRefusedLog)
		}
	}
	n, err := e.CompactJournal(ctx)
	if err != nil {
		if ctx.Err() == nil {
			e.fails.compaction.failed(compactionJournalLog, err)
		}
	} else {
		e.fails.compaction.ok(compactionJournalLog)
	}
	if n > 0 {
		e.reclaim(ctx, &e.fails.compaction)
	}
}

// RunCompaction runs one compaction pass now (tests, operators' tools),
// as the worker does every Interval; it returns once the pass ends.
func (e *Engine) RunCompaction(ctx context.Context) error {
	if e.opts.Compaction == nil {
		return errors.New("compaction is off")
	}
	e.runCompaction(ctx)
	return nil
}

// cleanAuditSince reports whether the store records a clean audit after
// at (store.AuditRecords: the server records every audit it answers), the
// sign that an operator fixed what the compaction audit refused. A store
// without the records, or whose read fails, shows none: the refusal's
// wait stands (a failing store shows in the other workers' lines).
//
// at is a wall-clock time, the refused audit's end, not the engine's
// Clock: a record's At is the wall clock of whichever replica answered
// the audit (server: time.Now when it answers), so only the wall clock
// orders the two. The engine's Clock is the time commands apply at and
// need not be the wall clock (a test's, a replay's): one ahead of it
// made a clean audit recorded after the fix look older than the refusal
// (the fix ignored until the next scheduled audit, up to an hour), one
// behind it made a clean audit from before the refusal end it (an audit
// at every pass, which the backoff is there to spare). Against the
// refused audit's end, not its start: a clean audit recorded before
// that ended while the refused one was still reading, from rows read
// before any fix.
func (e *Engine) cleanAuditSince(ctx context.Context, at time.Time) bool {
	records, ok := e.core.store.(store.AuditRecords)
	if !ok {
		return false
	}
	_, clean, err := records.AuditRecordsGet(ctx)
	return err == nil && clean != nil && clean.At.After(at)
}

// AuditOptions choose an audit's mode.
type AuditOptions struct {
	// SinceCheckpoint audits the accounts and the journal since the last
	// checkpoint only, not every reservation (ledger.AuditOptions).
	SinceCheckpoint bool
	// Progress, when set, is called as the audit reads.
	Progress func(AuditProgress)
}

// AuditProgress is how far an audit got.
type AuditProgress struct {
	// Rows counts the reservations, journal entries and accounts read so
	// far: 0 while a store copies them before the audit reads them
	// (SQLite's audit copy), so that it never goes back; Estimate is the
	// store's estimate of how many there are (0 when it has none).
	// Fraction is Rows/Estimate, below 1 until Done; a copy moves it
	// through the first auditCopyFraction, and reading goes on from
	// there: it never goes back either.
	Rows, Estimate int64
	Fraction       float64
	Done           bool
}

// AuditWith audits the ledger through the store's AuditSnapshot: one
// consistent read, reservations and journal streamed, so the audit holds
// the accounts and a page, not the history. A read error or ctx ending is
// the audit's error; whatever it held is garbage once it returns.
func (e *Engine) AuditWith(ctx context.Context, o AuditOptions) ([]ledger.Discrepancy, error) {
	var out []ledger.Discrepancy
	var streamErr error
	// A copy the store makes inside its read (SQLite's audit copy of the
	// database's pages) runs at least at half speed and owes the rest of
	// its pauses (pacer.owe): its read transaction is open while it
	// copies, SQLite cannot restart the WAL behind it, and the WAL grows
	// by everything committed meanwhile (a row copy paced between its
	// steps at the audit's share held its read for many seconds beside a
	// saturating load and the WAL reached 389-648 MB, docs/PERFORMANCE.md,
	// "Bounded history"). The pauses owed are taken
	// once the read has ended (from the first reservation the copy
	// yields), spread over the reading's steps (pacer.wait) so that its
	// progress moves on instead of standing still for seconds, and what is
	// left at the end: the copy still takes the audit's part of
	// MaintenanceShare (auditShareDivisor) of the time while gateways are
	// admitted, and the read is held for at
	// most twice the copy's work. The copy reports its progress as the
	// first half of the audit's: without it a stream showed no rows read
	// for the whole copy.
	copyPace := e.newAuditPacer(1)
	stepStart := time.Now()
	var copyProgress func(copied int64)
	// waiting tells the caller (store.Waits) when the audit waits for its
	// store and when it works on an answer: the server bounds each wait,
	// not the audit (watched).
	waiting := store.Waits(ctx)
	copyCtx := store.WithPause(ctx, func(copied int64) {
		waiting(false) // a step of the copy done: the pacing is the audit's
		defer waiting(true)
		if copyProgress != nil {
			copyProgress(copied)
		}
		if took := time.Since(stepStart); took >= copyStep {
			copyPace.owe(ctx, took)
			stepStart = time.Now()
		} else {
			// Between its pauses the copy gives its P up after every
			// step (defaultAuditCopyPages pages on SQLite): Go preempts a goroutine that runs on only after
			// 10 ms, and a request that became runnable meanwhile would
			// wait that long behind it (beyond a reserve's p99).
			runtime.Gosched()
		}
	})
	waiting(true)
	err := e.core.store.AuditSnapshot(copyCtx, false, func(snap *ledger.Snapshot, _ int64) error {
		waiting(false)
		defer waiting(true)
		snap = watched(snap, waiting)
		var estimate int64
		if o.Progress != nil && snap.Estimate != nil {
			estimate, _ = snap.Estimate(!o.SinceCheckpoint)
		}
		// copied: the store copied rows before the audit read them, and
		// reading them is the second half of the progress.
		copied := false
		report := func(rows int64, done bool) {
			p := AuditProgress{Rows: rows, Estimate: estimate, Done: done}
			switch {
			case done:
				p.Fraction = 1
			case estimate > 0:
				p.Fraction = min(float64(rows)/float64(estimate), 0.99)
				if copied {
					p.Fraction = auditCopyFraction + (1-auditCopyFraction)*p.Fraction
				}
			}
			o.Progress(p)
		}
		if o.Progress != nil {
			copyProgress = func(rows int64) {
				copied = true
				p := AuditProgress{Estimate: estimate}
				if estimate > 0 {
					p.Fraction = auditCopyFraction * min(float64(rows)/float64(estimate), 1)
				}
				o.Progress(p)
			}
		}
		lo := ledger.AuditOptions{SinceCheckpoint: o.SinceCheckpoint}
		var read int64
		if o.Progress != nil {
			report(0, false)
			lo.Progress = func(rows int64) { read = rows; report(rows, false) }
		}
		snap = e.paced(ctx, snap, copyPace)
		journal, reservations := snap.JournalStream, snap.ReservationStream
		snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
			err := journal(yield)
			if err != nil && streamErr == nil {
				streamErr = err
			}
			return err
		}
		snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
			// The store has copied and ended its read by the first
			// reservation it yields (or by returning).
			err := reservations(func(r *ledger.Reservation) error {
				copyPace.repaying = true
				return yield(r)
			})
			copyPace.repaying = true
			if err != nil && streamErr == nil {
				streamErr = err
			}
			return err
		}
		if accounts := snap.AccountStream; accounts != nil {
			snap.AccountStream = func(yield func(*ledger.Account) error) error {
				err := accounts(yield)
				if err != nil && streamErr == nil && !errors.Is(err, ledger.ErrStopped) {
					streamErr = err
				}
				return err
			}
		}
		if cps := snap.CheckpointAccountStream; cps != nil {
			snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
				err := cps(yield)
				if err != nil && streamErr == nil && !errors.Is(err, ledger.ErrStopped) {
					streamErr = err
				}
				return err
			}
		}
		out, _ = ledger.AuditWith(snap, lo)
		if !copyPace.repay(ctx) && streamErr == nil {
			streamErr = ctx.Err()
		}
		if o.Progress != nil && streamErr == nil {
			report(read, true)
		}
		return nil
	})
	waiting(false)
	if err == nil {
		err = streamErr
	}
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return out, nil
}

// watched returns snap with every read of its store (its streams' rows,
// PoliciesOf, Estimate) inside waiting(true) ... waiting(false), and the
// audit's work on each answer (a row yielded, the pacing after it)
// outside: the caller of an audit (the server, store.Waits) bounds how
// long the store takes to answer each read, not the audit, which takes
// as long as its rows need.
func watched(snap *ledger.Snapshot, waiting func(asking bool)) *ledger.Snapshot {
	if f := snap.PoliciesOf; f != nil {
		snap.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
			waiting(true)
			defer waiting(false)
			return f(generations)
		}
	}
	if f := snap.Estimate; f != nil {
		snap.Estimate = func(reservations bool) (int64, error) {
			waiting(true)
			defer waiting(false)
			return f(reservations)
		}
	}
	if j := snap.JournalStream; j != nil {
		snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
			waiting(true)
			defer waiting(false)
			return j(func(pos int64, e *ledger.JournalEntry) error {
				waiting(false)
				defer waiting(true)
				return yield(pos, e)
			})
		}
	}
	snap.AccountStream = watchedStream(snap.AccountStream, waiting)
	snap.AccountKeyStream = watchedStream(snap.AccountKeyStream, waiting)
	snap.ReservationStream = watchedStream(snap.ReservationStream, waiting)
	snap.CheckpointAccountStream = watchedStream(snap.CheckpointAccountStream, waiting)
	return snap
}

// watchedStream is stream (nil for nil) with its reads inside
// waiting(true) ... waiting(false) and each row's yield outside (watched).
func watchedStream[T any](stream func(yield func(T) error) error, waiting func(asking bool)) func(yield func(T) error) error {
	if stream == nil {
		return nil
	}
	return func(yield func(T) error) error {
		waiting(true)
		defer waiting(false)
		return stream(func(row T) error {
			waiting(false)
			defer waiting(true)
			return yield(row)
		})
	}
}

// An audit looks at the clock every auditCheckRows rows, and at its
// pacer once a step has taken auditStep. auditCopyFraction is the share
// of an audit's progress a store's copy before it (SQLite's audit copy)
// reports: roughly what the copy takes of the whole audit.
const (
	auditCheckRows    = 256
	auditStep         = 2 * time.Millisecond
	auditCopyFraction = 0.5
)

// paced makes snap's streams stop when ctx ends and pause after every
// auditStep of reading as pace says (an audit pacer: while gateways are
// admitted, the audit takes a tenth of MaintenanceShare of the time,
// as it runs beside the committer on the same cores and reads on a read
// connection of its own, so what it takes from admission is CPU; its
// idle share otherwise), each pause also taking a part of what pace owes
// once it repays (pacer.wait).
// The read transaction stays open meanwhile: on SQLite the WAL then
// grows until the audit ends or releases its read (docs/OPERATIONS.md).
func (e *Engine) paced(ctx context.Context, snap *ledger.Snapshot, pace *pacer) *ledger.Snapshot {
	var rows int
	stepStart := time.Now()
	step := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if rows++; rows%auditCheckRows != 0 {
			return nil
		}
		if took := time.Since(stepStart); took >= auditStep {
			pace.wait(ctx, took, 0)
			stepStart = time.Now()
		} else {
			runtime.Gosched() // as the copy's pages do (AuditWith)
		}
		return ctx.Err()
	}
	if j := snap.JournalStream; j != nil {
		snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
			return j(func(pos int64, e *ledger.JournalEntry) error {
				if err := step(); err != nil {
					return err
				}
				return yield(pos, e)
			})
		}
	}
	if a := snap.AccountStream; a != nil {
		snap.AccountStream = func(yield func(*ledger.Account) error) error {
			return a(func(acc *ledger.Account) error {
				if err := step(); err != nil {
					return err
				}
				return yield(acc)
			})
		}
	}
	if k := snap.AccountKeyStream; k != nil {
		snap.AccountKeyStream = func(yield func(*ledger.AccountKey) error) error {
			return k(func(key *ledger.AccountKey) error {
				if err := step(); err != nil {
					return err
				}
				return yield(key)
			})
		}
	}
	if c := snap.CheckpointAccountStream; c != nil {
		snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
			return c(func(acc *ledger.CheckpointAccount) error {
				if err := step(); err != nil {
					return err
				}
				return yield(acc)
			})
		}
	}
	if r := snap.ReservationStream; r != nil {
		snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
			return r(func(res *ledger.Reservation) error {
				if err := step(); err != nil {
					return err
				}
				return yield(res)
			})
		}
	}
	return snap
}
