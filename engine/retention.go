package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Retention defaults (see docs/OPERATIONS.md, "Retention and compaction").
const (
	// DefaultRetention is how long a finished reservation stays whole: 72
	// hours, three times the 24-hour idempotency horizon of the IETF
	// Idempotency-Key draft and of Stripe, so a retry, a receipt lookup or
	// a dispute within a long weekend still sees the full receipt.
	DefaultRetention = 72 * time.Hour
	// DefaultTombstoneRetention is how long a removed reservation's
	// tombstone answers a retry of its id: 30 days.
	DefaultTombstoneRetention = 30 * 24 * time.Hour
	// DefaultRetentionBatch is how many rows one retention page removes.
	// A page rides in the engine's next batch beside gateways' commands
	// and lengthens that batch's commit by its store work, about 50 µs
	// of CPU per row (a profile of scripts/auditsize -phase retire: the
	// prefetch, the deletes, the tombstones, the WAL frames), so 32 rows
	// add about 1.6 ms to one batch: each of the gateways' calls in that
	// batch waits for it, which is what reserve p99 sees.
	DefaultRetentionBatch = 32
	// retentionKeepUp: while a pass removes what comes due now (rows
	// that finished within retentionRecentIntervals retention intervals
	// of their due time), it removes reservations, and forgets
	// tombstones, each at least this many times the rate at which
	// reservations finish (in the store, whichever replica committed
	// them: dueSpan), whatever MaintenanceShare allows: what comes due
	// in steady state is what finished a window (or a tombstone horizon)
	// ago, each row once, so keeping up costs what the workload itself
	// makes due (about 50 µs a row, some 5 % of what writing its
	// lifecycle cost), and only the rate above the finish rate is extra.
	// Capped by the share (1.25x, before), a loaded machine's slower
	// pages cut removal below the finish rate: beside a CI run the
	// 30-minute soak retained 62,620 settled reservations against about
	// 36,000 due and grew its data directory 41 % (docs/PERFORMANCE.md,
	// "Bounded history"). Twice the rate leaves room for what finished a
	// window ago to have come faster than what finishes now, and wears a
	// lag of a few intervals down at the finish rate.
	retentionKeepUp = 2.0
	// retentionBacklogKeepUp: while a pass is in a backlog (its page
	// holds a row due longer ago than that), it removes once the finish
	// rate, so the store does not grow while the backlog drains, and the
	// backlog itself at the share (retentionBacklogDivisor). At twice
	// the rate, a backlog beside a lifecycle load finishing 600-900
	// reservations a second went at 1,200-2,000 rows a second, whatever
	// the share, and reserves beside it ran at 0.87x their rate and
	// 1.22x their p99 (docs/PERFORMANCE.md, "Bounded history").
	retentionBacklogKeepUp = 1.0
	// retentionRecentIntervals: a row is recent, and its finish time
	// measures the finish rate (dueSpan), while it has been due for at
	// most this many retention intervals: a pass starts at most one
	// interval after a row came due, and one more covers a pass that
	// runs long.
	retentionRecentIntervals = 2
	// retentionBacklogDivisor: beyond that rate, a backlog is removed at
	// an eighth of MaintenanceShare. A backlog (a retention window just
	// shortened, a store upgraded to retention, a pass after an outage)
	// is old rows that cost nothing where they are; clearing it at the
	// full share cost reserves 0.83x their throughput and 1.70x their
	// p99, at a quarter 0.88x and 1.20x (measured for commit 7585d0a).
	// Idle, it goes at half the time.
	retentionBacklogDivisor = 8
)

// finishedBy counts the reservations that cmds made terminal (results
// are theirs): settles, records, releases and expiries that were not
// replays.
func finishedBy(cmds []ledger.Command, results []ledger.Result) uint64 {
	var n uint64
	for i := range min(len(cmds), len(results)) {
		switch cmds[i].Kind {
		case ledger.KindSettle, ledger.KindRecord, ledger.KindRelease, ledger.KindExpire, ledger.KindExpireClaim:
			if r := &results[i]; r.Err == nil && !r.Replayed && r.Reservation.State.Terminal() {
				n++
			}
		}
	}
	return n
}

// retentionRate is a mark this replica's finish rate is measured from:
// a time and the count of reservations its commands had finished by then.
type retentionRate struct {
	at    time.Time
	count uint64
}

// finishWindow measures this replica's finish rate over the last one to
// two retention intervals: from is where it measures from, mark where it
// will once an interval has passed since mark.
type finishWindow struct {
	from, mark retentionRate
}

// perSecond is the finish rate at now, count reservations finished,
// moving the marks when interval has passed since the last.
func (w *finishWindow) perSecond(now time.Time, count uint64, interval time.Duration) float64 {
	if now.Sub(w.mark.at) >= interval {
		w.from, w.mark = w.mark, retentionRate{at: now, count: count}
	}
	return w.from.perSecond(now, count)
}

// Rates are trusted only when measured over enough time and rows: the
// finish times of two batches committed microseconds apart read as
// millions a second, and the pass paced by that rate did not pause.
const (
	// minRateSpan is the shortest time a rate is measured over.
	minRateSpan = 100 * time.Millisecond
	// minDueRows is the fewest rows a dueSpan's rate counts: below
	// that, what finished is too few to say how fast rows finish (and
	// at so few a pass, the share's pace removes them anyway).
	minDueRows = 16
)

// perSecond is the finish rate from r to now (0 over less than
// minRateSpan).
func (r retentionRate) perSecond(now time.Time, count uint64) float64 {
	d := now.Sub(r.at)
	if r.at.IsZero() || d < minRateSpan || count < r.count {
		return 0
	}
	return float64(count-r.count) / d.Seconds()
}

// dueSpan measures the rate at which rows of one kind came due from the
// finish times of the rows retention removed: rows finished after the
// earliest one, over the time from it to the latest. The rows are the
// store's, whichever replica committed them, so on PostgreSQL the lease
// holder sees what every replica finishes without a query of its own.
// Rows of one batch share a finish time, so the rows at the earliest
// instant open the span and count for nothing in it.
type dueSpan struct {
	first, last time.Time
	n, atFirst  int
}

// add counts a removed row that finished at t.
func (s *dueSpan) add(t time.Time) {
	switch {
	case t.IsZero():
		return
	case s.n == 0 || t.Before(s.first):
		s.first, s.atFirst = t, 1
		if s.n == 0 {
			s.last = t
		}
	case t.Equal(s.first):
		s.atFirst++
	case t.After(s.last):
		s.last = t
	}
	s.n++
}

// perSecond is the rate at which the rows came due: 0 (unknown) until
// they span minRateSpan and count minDueRows after the earliest.
func (s *dueSpan) perSecond() float64 {
	d := s.last.Sub(s.first)
	if d < minRateSpan || s.n-s.atFirst < minDueRows {
		return 0
	}
	return float64(s.n-s.atFirst) / d.Seconds()
}

// retentionPause is the pause after a page that took took and removed up
// to rows of each kind (reservations, tombstones), given the share of
// time pacing allows now (busy: gateways were admitted since the last
// page), the rate at which reservations finish, and whether the pass is
// in a backlog. The share's pause keeps the pages to
// share/retentionBacklogDivisor of the time while busy (to share, idle).
// Keeping up with what comes due now, it is shortened to one that removes
// retentionKeepUp times the finish rate; in a backlog, to one that
// removes retentionBacklogKeepUp times the finish rate on top of what the
// share removes, so the store does not grow while the backlog drains and
// the backlog goes at the share. Neither is capped by the share (no pause
// when the page itself took longer), so removal never falls behind what
// finishes however long a loaded machine makes each page. It holds idle
// too: on PostgreSQL the lease holder may admit nothing of what the other
// replicas finish.
func retentionPause(took time.Duration, rows int, share float64, busy, backlog bool, finishRate float64) time.Duration {
	if busy {
		share /= retentionBacklogDivisor
	}
	pause := pauseFor(took, share)
	if !backlog {
		return keepUpPause(pause, took, rows, retentionKeepUp, finishRate)
	}
	if finishRate <= 0 || rows <= 0 || took+pause <= 0 {
		return pause
	}
	shareRate := float64(rows) / (took + pause).Seconds()
	return keepUpPause(pause, took, rows, 1, shareRate+retentionBacklogKeepUp*finishRate)
}

// pagePacing is how one retention page was paced (tests see it).
type pagePacing struct {
	// finishRate is the rate at which reservations finish, per second,
	// that the page's pause kept up with.
	finishRate float64
	// backlog: the page held a row due for longer than
	// retentionRecentIntervals retention intervals.
	backlog bool
}

// pageRows is how many rows of one kind a retention page removes: its
// retires or its forgets, whichever are more.
func pageRows(cmds []ledger.Command) int {
	retires := 0
	for i := range cmds {
		if cmds[i].Kind == ledger.KindRetire {
			retires++
		}
	}
	return max(retires, len(cmds)-retires)
}

// Reclaimer is an optional store capability: give back the space freed by
// removed rows (SQLite's incremental vacuum). The retention and
// compaction workers call it after a pass that removed something, a step
// at a time, paced like their other steps.
type Reclaimer interface {
	// ReclaimStep gives back up to pages free pages in one short write
	// transaction and reports whether more free pages are left than the
	// store keeps for reuse.
	ReclaimStep(ctx context.Context, pages int) (more bool, err error)
}

// reclaimStepPages is how many pages one ReclaimStep moves: 256 SQLite
// pages of 4 KiB hold the writer for about as long as a retention page.
const reclaimStepPages = 256

// reclaim gives space back through the store's Reclaimer, if any, a
// paced step at a time (newDeferrablePacer: nothing waits for it), until
// the store keeps no more than its reserve or ctx ends.
func (e *Engine) reclaim(ctx context.Context, fails *failLog) {
	r, ok := e.core.store.(Reclaimer)
	if !ok {
		return
	}
	pace := e.newDeferrablePacer(0.5)
	for ctx.Err() == nil {
		started := time.Now()
		more, err := r.ReclaimStep(ctx, reclaimStepPages)
		if err != nil {
			if ctx.Err() == nil {
				fails.failed(fails.worker+" reclaim", err)
			}
			return
		}
		fails.ok(fails.worker + " reclaim")
		if !more || !pace.wait(ctx, time.Since(started), 0) {
			return
		}
	}
}

// RetentionDue returns the retention commands due at now, for at most
// limit rows of each kind: retire for terminal reservations that finished
// at or before now - window, forget for tombstones of reservations that
// finished at or before now - horizon. The ledger decides each (a row that
// changed meanwhile answers an error and is left alone), so the commands
// are safe in any interleaving with gateway commands and with another
// replica running the same pass. horizon <= 0 keeps tombstones forever.
func (c *Core) RetentionDue(ctx context.Context, now time.Time, window, horizon time.Duration, limit int) ([]ledger.Command, error) {
	if window <= 0 {
		return nil, fmt.Errorf("retention window %s, want a positive one", window)
	}
	before := now.Add(-window)
	ids, err := c.store.ReservationsFinished(ctx, before, limit)
	if err != nil {
		return nil, fmt.Errorf("finished reservations: %w", err)
	}
	// A reservation that finished before the tombstone horizon is retired
	// without a tombstone (ledger.Retire): this pass would forget it.
	var forgetBefore time.Time
	if horizon > 0 {
		forgetBefore = now.Add(-horizon)
	}
	cmds := make([]ledger.Command, 0, len(ids))
	for _, id := range ids {
		cmds = append(cmds, ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: before, ForgetBefore: forgetBefore})
	}
	if horizon <= 0 {
		return cmds, nil
	}
	ids, err = c.store.TombstonesDue(ctx, forgetBefore, limit)
	if err != nil {
		return nil, fmt.Errorf("tombstones due: %w", err)
	}
	for _, id := range ids {
		cmds = append(cmds, ledger.Command{Kind: ledger.KindForget, ReservationID: id, Before: forgetBefore})
	}
	return cmds, nil
}

// shardFencePage is how many gateways' fence rows one transaction of
// ShardFencesFold folds.
const shardFencePage = 256

// ShardFencesFold removes the fence rows (ledger.MetaShardFence) of
// gateways none of whose shards expires after before, folding them into
// the store's fence floor (ledger.FoldShardFences), page transactions of
// up to page gateways until none is left. Without it a store keeps one row
// per gateway id ever issued a shard: gateways named after pods add one
// with every deployment. It is safe in any interleaving with issuance
// and with another replica folding the same rows: each page reads the
// rows it removes, locked, in the transaction that removes them and
// raises the floor, and a gateway issued a shard meanwhile only has its
// next fence come from the floor. It returns how many rows it removed,
// and the first error (a conflict leaves the rest to the next pass).
func (c *Core) ShardFencesFold(ctx context.Context, before time.Time, page int) (int, error) {
	total := 0
	for ctx.Err() == nil {
		gateways, err := c.store.ShardFencesIdle(ctx, before, page)
		if err != nil {
			return total, err // the store names the read ("idle shard fences: ...")
		}
		if len(gateways) == 0 {
			return total, nil
		}
		n, err := c.foldFences(ctx, gateways)
		total += n
		if err != nil {
			return total, err
		}
		if n == 0 || len(gateways) < page {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// foldFences commits one page of ShardFencesFold.
func (c *Core) foldFences(ctx context.Context, gateways []string) (int, error) {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("fold shard fences: %w", err)
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 0)
	n := ledger.FoldShardFences(book, gateways)
	if err := book.Err(); err != nil {
		return 0, fmt.Errorf("fold shard fences: read: %w", err)
	}
	if changes := book.Changes(); !changes.Empty() {
		if err := tx.Write(ctx, changes); err != nil {
			return 0, fmt.Errorf("fold shard fences: write: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("fold shard fences: %w", err)
	}
	return n, nil
}

// statementPage is how many epoch statements one transaction of
// RemoveStatements deletes: on PostgreSQL each is a row and two term rows
// per dimension; 256 one-dimension statements of 100,000 took 12 ms to
// delete (EXPLAIN ANALYZE, a 2-core machine at load 8).
const statementPage = 256

// RemoveStatements deletes the epoch statements whose epoch ended more
// than Options.StatementRetention ago (store.StatementsRemove), the
// earliest ended first, statementPage a transaction, paced like giving
// space back (newDeferrablePacer: nothing waits for it, and statements
// come due at the rate epochs close, a few a second at most), until none
// is due or ctx ends. It returns how many it deleted, and the first
// error (the rest wait for the next pass).
//
// What may go: nothing else reads a statement. Compaction's checkpoints
// hold each account's closing vector from the journal, not from
// statements (ledger/checkpoint.go), so journal_replay and
// checkpoint_chain never read one, and an account's row carries its
// current epoch's opening (EpochOpening) itself. The audit's
// statement_chain check compares each kept statement with the one before
// it and the account's current epoch with the latest: an account's
// epochs end in order, so removing by epoch end takes the oldest of each
// account first and leaves an unbroken tail, whose chain starts at its
// oldest kept statement, and an account with none kept is checked against
// nothing. Statements are only inserted, each ending by the time its
// epoch closed, so one due is never written again.
func (e *Engine) RemoveStatements(ctx context.Context) (int, error) {
	if e.opts.StatementRetention <= 0 {
		return 0, fmt.Errorf("statement retention is off")
	}
	total := 0
	pace := e.newDeferrablePacer(0.5)
	for ctx.Err() == nil {
		started := time.Now()
		n, err := e.core.store.StatementsRemove(ctx, e.opts.Clock().Add(-e.opts.StatementRetention), statementPage)
		total += n
		e.retention.statementsRemoved.Add(uint64(n))
		if err != nil {
			return total, err // the store names the step ("statement retention: ...")
		}
		if n < statementPage || !pace.wait(ctx, time.Since(started), 0) {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// RetentionStats are the retention worker's counters.
type RetentionStats struct {
	// On: the engine has a retention window (Options.Retention > 0),
	// so the worker runs on the lease holder.
	On                                 bool
	Passes, Retired, Forgotten, Failed uint64
	// FencesFolded counts the shard fence rows of quiet gateways folded
	// into the store's fence floor (Core.ShardFencesFold).
	FencesFolded uint64
	// StatementsRemoved counts the epoch statements removed past
	// Options.StatementRetention (RemoveStatements).
	StatementsRemoved uint64
	// LastPassAt and LastPass are the start and length of the last
	// finished pass.
	LastPassAt time.Time
	LastPass   time.Duration
	// RunningSince is the start of the pass under way (zero when none
	// is): a pass runs until nothing is due, so one that has run longer
	// than the retention interval shows the worker is behind before it
	// ends, which under a saturating load may be hours away.
	RunningSince time.Time

	// ShardsRemoved counts the settled emergency shards removed with
	// their meta rows (Core.ShardsRemove).
	ShardsRemoved uint64
}

// runRetention is one retention pass: pages of RetentionBatch rows, each
// committed as one batch through the engine's queue (so gateway commands
// waiting meanwhile share its commit instead of waiting behind a long
// transaction), paced (retentionPause: what comes due now at
// retentionKeepUp times the rate at which reservations finish, a backlog
// at that rate once and beyond it at an eighth of MaintenanceShare while
// gateways are admitted, idle half the time) and at least RetentionPause
// apart, until nothing is due or ctx ends. It then asks the store to give
// back the freed space, paced the same way.
func (e *Engine) runRetention(ctx context.Context) {
	start := time.Now()
	e.retention.runningSince.Store(start.UnixNano())
	removed := 0
	pace := e.newPacer(0.5)
	// This replica's finish rate is measured over the last one to two
	// retention intervals: from the previous pass's last mark, then,
	// as a pass runs on (a backlog may take hours), from a mark moved
	// every interval. Measured since the pass began, a backlog pass
	// that began beside a lifecycle load alone (about 800 finished a
	// second) went on at 546 a second after reserves joined and the
	// load finished about 330.
	mark := retentionRate{at: start, count: e.finished.Load()}
	e.retention.rateMu.Lock()
	rate := finishWindow{from: e.retention.rate, mark: mark}
	e.retention.rateMu.Unlock()
	if rate.from.at.IsZero() {
		rate.from = mark
	}
	// What finishes is measured twice: from this replica's commits (a
	// lower bound), and from the finish times of the rows each kind
	// removes (dueSpan: what every replica finished, a window or a
	// tombstone horizon ago), the previous pass's until this one's rows
	// span some time.
	e.retention.rateMu.Lock()
	prevDue := e.retention.dueRate
	e.retention.rateMu.Unlock()
	var retired, forgot dueSpan
	for ctx.Err() == nil {
		cmds, err := e.core.RetentionDue(ctx, e.opts.Clock(), e.opts.Retention, e.opts.TombstoneRetention, e.opts.RetentionBatch)
		if err != nil {
			if ctx.Err() == nil {
				e.fails.retention.failed("retention worker", err)
			}
			break
		}
		e.fails.retention.ok("retention worker")
		if len(cmds) == 0 {
			break
		}
		// Only rows that came due since about the previous pass are
		// recent: they measure the rate at which rows finish, and a page
		// of them keeps up with it. A row due long ago is backlog, and
		// its finish time says how fast the store once wrote, not how
		// fast rows finish now (a backlog written at 25,000 a second read
		// that rate and drained at it, reserves beside it 0.90x their
		// rate and 1.26x their p99).
		now := e.opts.Clock()
		recent := retentionRecentIntervals * e.opts.RetentionInterval
		retireRecent := now.Add(-e.opts.Retention - recent)
		forgetRecent := now.Add(-e.opts.TombstoneRetention - recent)
		started := time.Now()
		results, err := e.doMaintenance(ctx, cmds)
		if err != nil {
			if ctx.Err() == nil {
				e.fails.retention.failed("retention batch", err, "commands", len(cmds))
			}
			break
		}
		e.fails.retention.ok("retention batch")
		progress := 0
		backlog := false
		for i := range results {
			switch {
			case results[i].Err != nil:
				e.retention.failed.Add(1)
			case results[i].Replayed: // another replica got there first
			case cmds[i].Kind == ledger.KindRetire:
				e.retention.retired.Add(1)
				if t := results[i].Reservation.FinishedAt; !t.Before(retireRecent) {
					retired.add(t)
				} else {
					backlog = true
				}
				progress++
			default:
				e.retention.forgotten.Add(1)
				if t := results[i].Reservation.FinishedAt; !t.Before(forgetRecent) {
					forgot.add(t)
				} else {
					backlog = true
				}
				progress++
			}
		}
		removed += progress
		if progress == 0 {
			break // everything listed was refused or done by another replica: wait for the next pass
		}
		// The page's time includes waiting for the batch before it: on
		// a busy store both grow, and so does the pause. Each kind keeps
		// up on its own: the page's rows are the more numerous kind's.
		took := time.Since(started)
		share, busy := pace.share()
		// Each kind's rate, the faster: a kind whose page was full (the
		// one that can fall behind) has at most that rate and the most
		// rows, so it keeps up.
		due := max(retired.perSecond(), forgot.perSecond())
		if due > 0 {
			prevDue = due
		}
		finishRate := max(rate.perSecond(time.Now(), e.finished.Load(), e.opts.RetentionInterval), prevDue)
		if e.retentionPaced != nil {
			e.retentionPaced(pagePacing{finishRate: finishRate, backlog: backlog})
		}
		pause := max(e.opts.RetentionPause, retentionPause(took, pageRows(cmds), share, busy, backlog, finishRate))
		if !sleep(ctx, pause) {
			break
		}
	}
	e.retention.rateMu.Lock()
	e.retention.rate = rate.mark
	if due := max(retired.perSecond(), forgot.perSecond()); due > 0 {
		e.retention.dueRate = due
	}
	e.retention.rateMu.Unlock()
	if ctx.Err() == nil {
		removed += e.removeShards(ctx)
	}
	if ctx.Err() == nil {
		folded, err := e.core.ShardFencesFold(ctx, e.opts.Clock().Add(-e.opts.Retention), shardFencePage)
		e.retention.fencesFolded.Add(uint64(folded))
		removed += folded
		if err != nil {
			if ctx.Err() == nil {
				e.fails.retention.failed("retention shard fences", err)
			}
		} else {
			e.fails.retention.ok("retention shard fences")
		}
	}
	if ctx.Err() == nil && e.opts.StatementRetention > 0 {
		n, err := e.RemoveStatements(ctx)
		removed += n
		if err != nil {
			if ctx.Err() == nil {
				e.fails.retention.failed("retention statements", err)
			}
		} else {
			e.fails.retention.ok("retention statements")
		}
	}
	if removed > 0 {
		e.reclaim(ctx, &e.fails.retention)
	}
	e.retention.passes.Add(1)
	e.retention.lastPassAt.Store(start.UnixNano())
	e.retention.lastPass.Store(int64(time.Since(start)))
	e.retention.runningSince.Store(0)
}

// sleep pauses for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// RetentionStats returns the retention worker's counters.
func (e *Engine) RetentionStats() RetentionStats {
	s := RetentionStats{On: e.opts.Retention > 0, Passes: e.retention.passes.Load(), Retired: e.retention.retired.Load(),
		Forgotten: e.retention.forgotten.Load(), Failed: e.retention.failed.Load(),
		FencesFolded: e.retention.fencesFolded.Load(), StatementsRemoved: e.retention.statementsRemoved.Load(),
		LastPass: time.Duration(e.retention.lastPass.Load())}
	if t := e.retention.lastPassAt.Load(); t != 0 {
		s.LastPassAt = time.Unix(0, t)
	}
	if t := e.retention.runningSince.Load(); t != 0 {
		s.RunningSince = time.Unix(0, t)
	}
	s.ShardsRemoved = e.retention.shardsRemoved.Load()
	return s
}

// RunRetention runs one retention pass now (tests, operators' tools),
// with the engine's retention options; it returns once the pass ends.
func (e *Engine) RunRetention(ctx context.Context) error {
	if e.opts.Retention <= 0 {
		return fmt.Errorf("retention is off (no retention window)")
	}
	e.runRetention(ctx)
	return nil
}

// Tombstone returns the tombstone of a reservation retention removed
// (store.ErrNotFound when there is none): what Reservation falls back on.
func (e *Engine) Tombstone(ctx context.Context, id string) (ledger.Tombstone, error) {
	return e.core.store.TombstoneGet(ctx, id)
}

// ReservationOrTombstone returns the committed reservation, or the receipt
// of its tombstone (Retired set) when retention removed it, or
// store.ErrNotFound.
func (e *Engine) ReservationOrTombstone(ctx context.Context, id string) (ledger.Reservation, error) {
	r, err := e.core.store.ReservationGet(ctx, id)
	if err == nil || !isNotFound(err) {
		return r, err
	}
	t, terr := e.core.store.TombstoneGet(ctx, id)
	if terr != nil {
		if isNotFound(terr) {
			return ledger.Reservation{}, err
		}
		return ledger.Reservation{}, terr
	}
	return t.Receipt(), nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
