package engine

import (
	"context"
	"fmt"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// lifecycle runs n reserve/start/settle lifecycles through e.
func lifecycle(t *testing.T, e *Engine, prefix string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s%04d", prefix, i)
		cmds := []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindStart, ReservationID: id, OperationID: "op"},
			{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op", Units: ledger.Amounts{4}}}
		if _, err := e.DoBatch(context.Background(), cmds); err != nil {
			t.Fatal(err)
		}
	}
}

func journalLen(t *testing.T, st store.Store) int {
	t.Helper()
	snap, err := st.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(snap.Journal)
}

// compactingOptions are the options of the compaction tests' engines:
// the clock clk, no background workers (each test runs the passes), a
// checkpoint due every hour, deletions 7 a batch.
func compactingOptions(clk *clock) Options {
	return Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour, Batch: 7}}
}

// The compaction pass cuts a checkpoint once per Every and deletes the
// journal it summarises; the audit stays clean in both modes, the
// journal since the checkpoint stays, and an account changed behind the
// journal's back stops compaction: no checkpoint, nothing deleted.
func TestCompactionCutsVerifiedCheckpoints(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			clk := newClock()
			e := New(st, compactingOptions(clk))
			defer e.Close()
			publish(t, e, 1_000_000, time.Minute, 0)
			lifecycle(t, e, "a", 50)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 1 || s.Deleted == 0 || s.LastSeq != 1 {
				t.Fatalf("after the first pass: %+v", s)
			}
			if n := journalLen(t, st); n != 0 {
				t.Fatalf("%d entries left after compaction", n)
			}
			lifecycle(t, e, "b", 20)
			since := journalLen(t, st)
			e.runCompaction(ctx) // same hour: no new checkpoint
			if s := e.CompactionStats(); s.Checkpoints != 1 || journalLen(t, st) != since {
				t.Fatalf("a second pass within the hour: %+v, %d entries of %d", s, journalLen(t, st), since)
			}
			auditClean(t, e)
			for _, mode := range []bool{false, true} {
				var last AuditProgress
				found, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: mode, Progress: func(p AuditProgress) { last = p }})
				if err != nil || len(found) > 0 {
					t.Fatalf("audit (since checkpoint %v): %v %v", mode, found, err)
				}
				if !last.Done || last.Fraction != 1 || last.Rows < int64(since) || last.Estimate <= 0 {
					t.Fatalf("audit (since checkpoint %v) ended with progress %+v, %d entries since", mode, last, since)
				}
			}
			clk.Advance(time.Hour)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 2 || journalLen(t, st) != 0 {
				t.Fatalf("after the next hour: %+v, %d entries", s, journalLen(t, st))
			}
			auditClean(t, e)

			// Change an account behind the journal: the next cut refuses.
			lifecycle(t, e, "c", 5)
			changeAccountBehindTheJournal(t, st)
			left := journalLen(t, st)
			clk.Advance(time.Hour)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 2 || s.Refused != 1 || journalLen(t, st) != left || left == 0 {
				t.Fatalf("a pass over a broken ledger: %+v, %d entries of %d", s, journalLen(t, st), left)
			}
		})
	}
}

// A restarted server (a new engine over the same store) takes when it
// last cut from the store's last checkpoint: its first pass cuts nothing
// while that checkpoint is of the current period, and cuts once a period
// boundary has passed since it. Before, a zero last-cut time made every
// restart cut at its first pass.
func TestCompactionAfterRestartFollowsTheStoredCheckpoint(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	clk.Advance(10 * time.Minute) // not on the hour: a boundary is not due at once
	opts := compactingOptions(clk)
	first := New(st, opts)
	publish(t, first, 1_000_000, time.Minute, 0)
	lifecycle(t, first, "a", 20)
	first.runCompaction(ctx)
	if s := first.CompactionStats(); s.Checkpoints != 1 || s.LastSeq != 1 {
		t.Fatalf("first process, first pass: %+v", s)
	}
	cutAt := first.CompactionStats().LastCutAt
	first.Close()

	// Restart within the same hour, with journal since the checkpoint.
	clk.Advance(20 * time.Minute)
	second := New(st, opts)
	defer second.Close()
	lifecycle(t, second, "b", 10)
	since := journalLen(t, st)
	second.runCompaction(ctx)
	if s := second.CompactionStats(); s.Checkpoints != 0 || s.LastSeq != 1 || !s.LastCutAt.Equal(cutAt) || journalLen(t, st) != since || since == 0 {
		t.Fatalf("restart with a checkpoint of this hour: %+v (cut at %v), %d entries of %d", s, cutAt, journalLen(t, st), since)
	}

	// Restart after the hour turned: the stored checkpoint is old, cut.
	clk.Advance(time.Hour)
	third := New(st, opts)
	defer third.Close()
	third.runCompaction(ctx)
	if s := third.CompactionStats(); s.Checkpoints != 1 || s.LastSeq != 2 || journalLen(t, st) != 0 {
		t.Fatalf("restart with a checkpoint of an earlier hour: %+v, %d entries", s, journalLen(t, st))
	}
	auditClean(t, third)
}

// materialising counts the most accounts its store hands over or takes
// at once around a checkpoint cut: account slices in an audit snapshot
// (the ledger's, the last checkpoint's), pages put to a checkpoint
// writer and accounts carried by a finished header.
type materialising struct {
	store.Store
	most int
	gc   int // the GC target at the last page put
	// reads counts the passes over the accounts (or their keys) of the
	// last snapshot; released says its read was released (Release),
	// early says a page was put before that although it could be.
	reads           int
	released, early bool
}

// gcPercent is the GC target (debug.SetGCPercent's).
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func (m *materialising) note(n int) { m.most = max(m.most, n) }

func (m *materialising) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	return m.Store.AuditSnapshot(ctx, cut, func(snap *ledger.Snapshot, through int64) error {
		m.note(len(snap.Accounts))
		if last := snap.LastCheckpoint(); last != nil {
			m.note(len(last.Accounts))
		}
		m.reads, m.released, m.early = 0, false, false
		if accounts := snap.AccountStream; accounts != nil {
			snap.AccountStream = func(yield func(*ledger.Account) error) error { m.reads++; return accounts(yield) }
		}
		if keys := snap.AccountKeyStream; keys != nil {
			snap.AccountKeyStream = func(yield func(*ledger.AccountKey) error) error { m.reads++; return keys(yield) }
		}
		if release := snap.Release; release != nil {
			snap.Release = func() { m.released = true; release() }
		} else {
			m.released = true // nothing to release
		}
		return f(snap, through)
	})
}

func (m *materialising) CheckpointWrite(ctx context.Context, seq int64) (store.CheckpointWriter, error) {
	w, err := m.Store.CheckpointWrite(ctx, seq)
	if err != nil {
		return nil, err
	}
	return &materialisingWriter{CheckpointWriter: w, m: m}, nil
}

type materialisingWriter struct {
	store.CheckpointWriter
	m *materialising
}

func (w *materialisingWriter) Put(ctx context.Context, page []ledger.CheckpointAccount) error {
	w.m.note(len(page))
	w.m.gc = gcPercent()
	if !w.m.released {
		w.m.early = true
	}
	return w.CheckpointWriter.Put(ctx, page)
}

func (w *materialisingWriter) Finish(ctx context.Context, c *ledger.Checkpoint) error {
	w.m.note(len(c.Accounts))
	return w.CheckpointWriter.Finish(ctx, c)
}

// TestCheckpointCutLowersTheGCTarget: with CutGCPercent, the GC target
// is that while the cut writes its pages, and what it was afterwards.
func TestCheckpointCutLowersTheGCTarget(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	ctx := context.Background()
	st := &materialising{Store: memstore.New()}
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour, CutGCPercent: 37}})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	if _, err := e.DoBatch(ctx, []ledger.Command{reserveCmd("gc-1", 1)}); err != nil {
		t.Fatal(err)
	}
	cp, found, err := e.CutCheckpoint(ctx, clk.Now())
	if err != nil || len(found) > 0 || cp == nil {
		t.Fatalf("cut: %+v, %v, %v", cp, found, err)
	}
	if st.gc != 37 || gcPercent() != 400 {
		t.Fatalf("GC target %d while the cut wrote, %d after it; want 37 and 400", st.gc, gcPercent())
	}
}

// TestCheckpointCutHoldsAPage: cutting a checkpoint of many accounts, the
// first and then one over the previous checkpoint's accounts, never has
// more than a page of accounts in hand across the store interface: the
// accounts and the last checkpoint's accounts are streamed, the new
// checkpoint's go to the writer a page at a time. On SQLite the cut is
// staged: one pass over the accounts, the read ended before the writes.
// The chain is whole and the ledger audits clean.
func TestCheckpointCutHoldsAPage(t *testing.T) {
	defer func(page int) { checkpointPage = page }(checkpointPage)
	checkpointPage = 16
	const accounts = 600
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := &materialising{Store: open(t)}
			clk := newClock()
			e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour}})
			defer e.Close()
			publish(t, e, 1_000_000, time.Minute, 0)
			reserveAll := func(round string, n int) {
				var cmds []ledger.Command
				for i := range n {
					cmd := reserveCmd(fmt.Sprintf("%s-%04d", round, i), 1)
					cmd.Subject = fmt.Sprintf("tenant-%04d", i)
					cmds = append(cmds, cmd)
				}
				if _, err := e.DoBatch(ctx, cmds); err != nil {
					t.Fatal(err)
				}
			}
			reserveAll("a", accounts)
			for seq, touched := range []int{accounts, accounts / 10} {
				if seq > 0 {
					reserveAll("b", touched)
				}
				st.most = 0
				cp, found, err := e.CutCheckpoint(ctx, clk.Now())
				if err != nil || len(found) > 0 || cp == nil || cp.Seq != int64(seq+1) {
					t.Fatalf("cut %d: %+v, %v, %v", seq+1, cp, found, err)
				}
				if st.most > checkpointPage {
					t.Fatalf("cut %d over %d accounts (%d touched) had %d accounts in hand at once, a page is %d",
						cp.Seq, accounts, touched, st.most, checkpointPage)
				}
				// SQLite's snapshot has a directory to stage the cut in:
				// the accounts are read once, and its read is ended
				// before the first row is written.
				if want := map[string]int{"memstore": 2, "sqlite": 1}[name]; st.reads != want || st.early {
					t.Fatalf("cut %d: the accounts read %d times (want %d), a page put before the read was released: %v",
						cp.Seq, st.reads, want, st.early)
				}
				snap, err := st.Snapshot(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if last := snap.LastCheckpoint(); last == nil || last.Digest != cp.Digest || len(last.Accounts) != accounts {
					t.Fatalf("stored checkpoint %v with %d accounts, want %s with %d", last != nil, len(last.Accounts), cp.Digest, accounts)
				}
				auditClean(t, e)
			}
		})
	}
}

// snapshotCounter counts the audit snapshots its store takes.
type snapshotCounter struct {
	store.Store
	snapshots int
}

func (c *snapshotCounter) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	c.snapshots++
	return c.Store.AuditSnapshot(ctx, cut, f)
}

// forcedGCs counts the garbage collections forced since the process
// started (runtime.GC, debug.FreeOSMemory).
func forcedGCs() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/forced:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestDueCompactionWithNothingNewTakesNoSnapshot: once a checkpoint is
// due (a period boundary passed since the last cut) but nothing was
// committed after the last checkpoint, a pass reads the watermark
// (store.JournalAfter) and neither takes an audit snapshot nor forces a
// collection; with nothing new the cut stays due, so before, every pass
// (each minute, on every idle store after its first boundary) did both:
// every policy, move, shard, statement and retained total read into
// memory, and the whole heap marked. Something new is cut at the next
// pass.
func TestDueCompactionWithNothingNewTakesNoSnapshot(t *testing.T) {
	ctx := context.Background()
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			st := &snapshotCounter{Store: open(t)}
			clk := newClock()
			e := New(st, compactingOptions(clk))
			defer e.Close()
			publish(t, e, 1_000_000, time.Minute, 0)
			lifecycle(t, e, "a", 5)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 1 || st.snapshots != 1 {
				t.Fatalf("first pass: %+v, %d snapshots", s, st.snapshots)
			}
			clk.Advance(2 * time.Hour)
			gcs := forcedGCs()
			for range 3 {
				e.runCompaction(ctx)
			}
			if s := e.CompactionStats(); s.Checkpoints != 1 || st.snapshots != 1 || forcedGCs() != gcs {
				t.Fatalf("three due passes with nothing new: %+v, %d snapshots, %d collections forced", s, st.snapshots, forcedGCs()-gcs)
			}
			lifecycle(t, e, "b", 1)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 2 || st.snapshots != 2 {
				t.Fatalf("a pass with something new: %+v, %d snapshots", s, st.snapshots)
			}
			auditClean(t, e)
		})
	}
}

// Compaction is stopped only by what its since-checkpoint audit finds
// (OPERATIONS.md, "Retention and compaction"): a hold changed behind
// the ledger, which only the full audit's reserved-vs-holds check sees
// (it compares accounts with reservations, not with the journal), is
// reported by the full audit while the cut goes through, uncounted in
// Refused.
func TestCompactionIgnoresWhatOnlyTheFullAuditFinds(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			clk := newClock()
			e := New(st, compactingOptions(clk))
			defer e.Close()
			publish(t, e, 1_000_000, time.Hour, 0)
			lifecycle(t, e, "a", 5)
			res, err := e.Do(ctx, reserveCmd("held", 10))
			if err != nil || res.Err != nil {
				t.Fatalf("reserve: %v %v", err, res.Err)
			}
			r := res.Reservation
			r.Reserved = ledger.Amounts{9}
			writeBehindTheJournal(t, st, &store.Changes{Reservations: []ledger.Reservation{r}})
			found, err := e.AuditWith(ctx, AuditOptions{})
			if err != nil || len(found) != 1 || found[0].Check != "reserved_vs_holds" {
				t.Fatalf("full audit: %v %v, want one reserved_vs_holds", found, err)
			}
			if found, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: true}); err != nil || len(found) != 0 {
				t.Fatalf("since-checkpoint audit: %v %v, want clean", found, err)
			}
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 1 || s.Refused != 0 || s.Deleted == 0 {
				t.Fatalf("a pass with a discrepancy only the full audit finds: %+v", s)
			}
		})
	}
}

// auditCounter counts the audit snapshots its store takes and keeps the
// store's audit records (store.AuditRecords), which the server writes
// for every audit it answers.
type auditCounter struct {
	*snapshotCounter
	store.AuditRecords
}

// A cut its audit refuses (an account changed behind the journal) is
// not audited again at every pass while nothing the audit reads was
// fixed: over three hours of passes a minute apart, with the journal
// moving, the audit runs after 2, 4, 8, 16, 32 and then 60 minutes
// (compactionRefusedWaitMax), each refused audit counted in Refused. The
// error line comes at the first refusal, then at the cadence of every
// worker's failures (workerlog.go), which the audits' backoff keeps
// behind: a line per refused audit. Audits recorded (at the wall clock,
// as the server stamps them) before the refusal (clean) or during it
// (dirty) change nothing. Once the account
// is repaired, the refusal ends at the next pass after a clean audit is
// recorded in the store (capledger audit), at the next scheduled audit
// without one, or at the pass after another replica cut a checkpoint,
// with one recovery line.
func TestRefusedCompactionBacksOff(t *testing.T) {
	for _, fix := range []string{"clean audit recorded", "next scheduled audit", "another replica cut"} {
		for name, open := range memstoreAndSQLite {
			t.Run(name+"/"+fix, func(t *testing.T) {
				ctx := context.Background()
				inner := open(t)
				st := &auditCounter{snapshotCounter: &snapshotCounter{Store: inner}, AuditRecords: inner.(store.AuditRecords)}
				logger, logs := logcapture.New()
				clk := newClock()
				opts := compactingOptions(clk)
				opts.Logger = logger
				e := New(st, opts)
				defer e.Close()
				driveFailLogs(e, clk.Now)
				publish(t, e, 1_000_000, time.Minute, 0)
				lifecycle(t, e, "a", 5)
				e.runCompaction(ctx)
				if s := e.CompactionStats(); s.Checkpoints != 1 {
					t.Fatalf("first pass: %+v", s)
				}
				if err := st.AuditRecordPut(ctx, &store.AuditRecord{At: time.Now(), Mode: "full"}); err != nil {
					t.Fatal(err) // a clean audit before the refusal
				}
				lifecycle(t, e, "b", 5)
				shiftSubjectBehindTheJournal(t, inner, "tenant-7", 1)
				clk.Advance(time.Hour) // the next cut is due, and stays due while refused
				start := clk.Now()
				const msg = `level=ERROR msg="compaction: the audit found discrepancies; no checkpoint cut, nothing deleted"`
				var auditedAt []int
				for minute := range 180 {
					if minute%10 == 5 { // the journal moves: no sign of a fix
						cmd := reserveCmd(fmt.Sprintf("other-%03d", minute), 1)
						cmd.Subject = "tenant-8"
						if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
							t.Fatalf("reserve: %v %v", err, res.Err)
						}
					}
					if minute == 20 { // an operator's audit finds the discrepancy too
						if err := st.AuditRecordPut(ctx, &store.AuditRecord{At: time.Now(), Mode: "full", Discrepancies: 1}); err != nil {
							t.Fatal(err)
						}
					}
					before := st.snapshots
					e.runCompaction(ctx)
					if st.snapshots != before {
						auditedAt = append(auditedAt, minute)
					}
					clk.Advance(time.Minute)
				}
				if want := []int{0, 2, 6, 14, 30, 62, 122}; fmt.Sprint(auditedAt) != fmt.Sprint(want) {
					t.Fatalf("refused cuts audited at minutes %v, want %v", auditedAt, want)
				}
				s := e.CompactionStats()
				if s.Refused != 7 || s.Checkpoints != 1 || !s.RefusingSince.Equal(start) || !s.NextAuditAt.Equal(start.Add(182*time.Minute)) {
					t.Fatalf("after three hours of refusals: %+v, want 7 refused since %v, the next audit at minute 182", s, start)
				}
				// A line per refused audit: minutes 0, 2, 6, 14, 30, 62 and 122.
				if n := logs.Count(msg); n != 7 || logs.Count("failures_since_last_log=1 failing_for=30m0s") != 1 ||
					logs.Count("failures_since_last_log=1 failing_for=2h2m0s") != 1 || logs.Count(" first=") != 7 {
					t.Fatalf("%d refusal lines, want 7 (minutes 0, 2, 6, 14, 30, 62, 122) with their counts:\n%s", n, logs.String())
				}

				shiftSubjectBehindTheJournal(t, inner, "tenant-7", -1) // repaired
				audits := st.snapshots
				e.runCompaction(ctx)
				if st.snapshots != audits {
					t.Fatal("a pass before the next audit is due, with nothing recorded, audited")
				}
				checkpoints := uint64(2)
				switch fix {
				case "clean audit recorded":
					found, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: true})
					if err != nil || len(found) > 0 {
						t.Fatalf("the operator's audit after the repair: %v %v", found, err)
					}
					if err := st.AuditRecordPut(ctx, &store.AuditRecord{At: time.Now(), Mode: "since_checkpoint"}); err != nil {
						t.Fatal(err)
					}
					audits = st.snapshots
				case "next scheduled audit":
					clk.Advance(s.NextAuditAt.Sub(clk.Now()))
				case "another replica cut":
					other := New(st, compactingOptions(clk))
					defer other.Close()
					other.runCompaction(ctx)
					if s := other.CompactionStats(); s.Checkpoints != 1 || s.LastSeq != 2 {
						t.Fatalf("the other replica's pass: %+v", s)
					}
					checkpoints, audits = 1, st.snapshots-1
				}
				clk.Advance(time.Minute)
				e.runCompaction(ctx)
				if s := e.CompactionStats(); s.Checkpoints != checkpoints || s.LastSeq != 2 || s.Refused != 7 ||
					!s.RefusingSince.IsZero() || !s.NextAuditAt.IsZero() || st.snapshots != audits+1 {
					t.Fatalf("the pass after the fix: %+v, %d audits, want checkpoint 2 through at one audit", s, st.snapshots-audits)
				}
				if n := logs.Count(`msg="compaction: the audit found discrepancies; no checkpoint cut, nothing deleted recovered" failures=7`); n != 1 {
					t.Fatalf("want one recovery line:\n%s", logs.String())
				}
				auditClean(t, e)
			})
		}
	}
}

// failingCompaction fails, while set, the store's journal deletion
// (journalErr) and the cut's audit snapshot (cutErr): a store.ErrConflict
// there is another replica appending first or holding the checkpoint
// lease.
type failingCompaction struct {
	store.Store
	journalErr, cutErr error
}

func (f *failingCompaction) JournalCompact(ctx context.Context, limit int) (int, error) {
	if f.journalErr != nil {
		return 0, f.journalErr
	}
	return f.Store.JournalCompact(ctx, limit)
}

func (f *failingCompaction) AuditSnapshot(ctx context.Context, cut bool, fn func(*ledger.Snapshot, int64) error) error {
	if f.cutErr != nil {
		return f.cutErr
	}
	return f.Store.AuditSnapshot(ctx, cut, fn)
}

// The compaction worker's warnings each end with their own recovery line
// (OPERATIONS.md, "Retention and compaction"): a journal deletion that
// failed, once one works; a cut the store failed, once the store answers
// again (a conflict is an answer); and the conflict warning (from the
// second conflicting pass in a row), once a cut goes through, after which
// a single conflict is a race again and logs nothing; a cut the store
// failed, once a cut goes through.
func TestCompactionWarningsRecover(t *testing.T) {
	ctx := context.Background()
	st := &failingCompaction{Store: memstore.New()}
	logger, logs := logcapture.New()
	clk := newClock()
	opts := compactingOptions(clk)
	opts.Logger = logger
	e := New(st, opts)
	defer e.Close()
	driveFailLogs(e, clk.Now)
	publish(t, e, 1_000_000, time.Minute, 0)
	lines := func(msg string) int { t.Helper(); return logs.Count(fmt.Sprintf("msg=%q", msg)) }
	conflict := fmt.Errorf("%w: another replica appended checkpoint 2", store.ErrConflict)

	// The journal deletion fails, then works.
	lifecycle(t, e, "a", 5)
	st.journalErr = fmt.Errorf("%w: disk I/O error", store.ErrUnavailable)
	e.runCompaction(ctx)
	st.journalErr = nil
	clk.Advance(time.Minute)
	e.runCompaction(ctx)
	if s := e.CompactionStats(); lines("compaction: journal") != 1 || lines("compaction: journal recovered") != 1 ||
		!strings.Contains(logs.String(), `msg="compaction: journal recovered" failures=1 failed_for=1m0s`) || s.Checkpoints != 1 || s.Deleted == 0 {
		t.Fatalf("a journal deletion that failed, then worked: %+v\n%s", s, logs.String())
	}

	// The cut fails (the store is down), then conflicts twice, then
	// goes through.
	lifecycle(t, e, "b", 5)
	clk.Advance(time.Hour)
	st.cutErr = fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	e.runCompaction(ctx)
	st.cutErr = conflict
	e.runCompaction(ctx)
	if lines("compaction: checkpoint") != 1 || lines("compaction: checkpoint recovered") != 1 || lines(compactionConflictLog) != 0 {
		t.Fatalf("a failed cut, then one conflict (a race, no warning):\n%s", logs.String())
	}
	e.runCompaction(ctx)
	st.cutErr = nil
	e.runCompaction(ctx)
	if s := e.CompactionStats(); lines(compactionConflictLog) != 1 || !strings.Contains(logs.String(), " passes=2") ||
		!strings.Contains(logs.String(), fmt.Sprintf("msg=%q failures=1", compactionConflictLog+" recovered")) || s.Checkpoints != 2 {
		t.Fatalf("two conflicts in a row, then a cut: %+v\n%s", s, logs.String())
	}
	lifecycle(t, e, "c", 5)
	clk.Advance(time.Hour)
	st.cutErr = conflict
	e.runCompaction(ctx)
	if lines(compactionConflictLog) != 1 {
		t.Fatalf("one conflict after a cut went through: a race, no warning:\n%s", logs.String())
	}

	// The cut fails again, then goes through.
	st.cutErr = fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	e.runCompaction(ctx)
	st.cutErr = nil
	e.runCompaction(ctx)
	if s := e.CompactionStats(); lines("compaction: checkpoint") != 2 || lines("compaction: checkpoint recovered") != 2 || s.Checkpoints != 3 {
		t.Fatalf("a failed cut, then one through: %+v\n%s", s, logs.String())
	}
}

// A refusal shows (CompactionStats.RefusingSince, NextAuditAt: /statusz,
// capledger_compaction_refusing) only while this engine holds the worker
// lease and so runs the worker: a replica that stopped leading leaves
// the refusal, if it lasts, to the new holder, instead of showing its
// own last one for ever. Refused keeps what it counted.
func TestRefusalShowsOnlyWhileLeading(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	// The worker's own passes are an hour apart: the test runs them.
	e := New(st, Options{Clock: clk.Now, Compaction: &CompactionOptions{Every: time.Hour, Interval: time.Hour}})
	defer e.Close()
	for deadline := time.Now().Add(10 * time.Second); !e.IsLeader(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the engine never took the worker lease of its own store")
		}
	}
	publish(t, e, 1_000_000, time.Minute, 0)
	lifecycle(t, e, "a", 5)
	w := e.leaderWorker("compaction")
	e.tick(ctx, w)
	lifecycle(t, e, "b", 5)
	changeAccountBehindTheJournal(t, st)
	clk.Advance(time.Hour)
	e.tick(ctx, w)
	if s := e.CompactionStats(); s.Refused != 1 || s.RefusingSince.IsZero() || s.NextAuditAt.IsZero() {
		t.Fatalf("the leader's refused cut: %+v", s)
	}
	e.Close() // releases the lease
	if s := e.CompactionStats(); s.Refused != 1 || !s.RefusingSince.IsZero() || !s.NextAuditAt.IsZero() {
		t.Fatalf("after the lease was let go: %+v, want the refusal no longer shown, still counted", s)
	}
}

// leaseSwitch is a store whose worker lease another replica holds while
// elsewhere is set.
type leaseSwitch struct {
	*auditCounter
	elsewhere atomic.Bool
}

func (s *leaseSwitch) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if s.elsewhere.Load() {
		return store.Lease{Name: name, Holder: "other-replica", Fence: 2, Expires: time.Now().Add(ttl)}, nil
	}
	return s.auditCounter.LeaseAcquire(ctx, name, holder, ttl)
}

// A replica that lost the worker lease and took it back starts the
// compaction worker afresh, as a replica that never led does: while
// another replica led, an operator may have repaired the ledger (and
// that replica cut), so its first due pass audits at once, not when the
// backoff of its earlier term says, and its refusal (status and log)
// starts again. Between losing the lease and that first pass it shows
// no refusal.
func TestRegainedLeaseStartsCompactionAfresh(t *testing.T) {
	ctx := context.Background()
	inner := memstore.New()
	st := &leaseSwitch{auditCounter: &auditCounter{snapshotCounter: &snapshotCounter{Store: inner}, AuditRecords: inner}}
	logger, logs := logcapture.New()
	clk := newClock()
	// The worker's own passes, and the lease loop's renewals, are hours
	// apart: the test runs them.
	e := New(st, Options{Clock: clk.Now, Logger: logger, LeaseTTL: 3 * time.Hour,
		Compaction: &CompactionOptions{Every: time.Hour, Interval: time.Hour}})
	defer e.Close()
	driveFailLogs(e, clk.Now)
	for deadline := time.Now().Add(10 * time.Second); !e.IsLeader(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the engine never took the worker lease")
		}
	}
	renew := func(leads bool) {
		t.Helper()
		e.renewLease(ctx, 3*time.Hour)
		if e.IsLeader() != leads {
			t.Fatalf("after a renewal: leader %v, want %v", e.IsLeader(), leads)
		}
	}
	w := e.leaderWorker("compaction")
	publish(t, e, 1_000_000, time.Minute, 0)
	lifecycle(t, e, "a", 5)
	e.tick(ctx, w)
	lifecycle(t, e, "b", 5)
	shiftSubjectBehindTheJournal(t, inner, "tenant-7", 1)
	clk.Advance(time.Hour)
	e.tick(ctx, w)
	audits := st.snapshots
	clk.Advance(time.Minute)
	e.tick(ctx, w) // the next audit is due in an hour (Interval, at most compactionRefusedWaitMax)
	if s := e.CompactionStats(); s.Refused != 1 || s.RefusingSince.IsZero() || st.snapshots != audits {
		t.Fatalf("refusing, before the next audit: %+v, %d audits since the refusal", s, st.snapshots-audits)
	}

	st.elsewhere.Store(true)
	renew(false)
	e.tick(ctx, w)
	if s := e.CompactionStats(); !s.RefusingSince.IsZero() || st.snapshots != audits {
		t.Fatalf("another replica leads: %+v, %d audits", s, st.snapshots-audits)
	}
	clk.Advance(30 * time.Second) // long before the earlier term's next audit
	st.elsewhere.Store(false)
	renew(true)
	if s := e.CompactionStats(); !s.RefusingSince.IsZero() || !s.NextAuditAt.IsZero() {
		t.Fatalf("the lease taken back, before the worker's first pass: %+v, want the earlier term's refusal not shown", s)
	}
	e.tick(ctx, w)
	const msg = `level=ERROR msg="compaction: the audit found discrepancies; no checkpoint cut, nothing deleted"`
	if s := e.CompactionStats(); st.snapshots != audits+1 || s.Refused != 2 || !s.RefusingSince.Equal(clk.Now()) ||
		!s.NextAuditAt.Equal(clk.Now().Add(time.Hour)) {
		t.Fatalf("the first pass of the new term: %+v, %d audits, want one audit refused now, the next in an hour", s, st.snapshots-audits)
	}
	if n := logs.Count(msg); n != 2 || logs.Count("failures_since_last_log") != 0 {
		t.Fatalf("want the refusal logged as a first one again:\n%s", logs.String())
	}
}

// The clean audit that ends a refusal early is ordered against the
// refused audit by the wall clock, the time base of the audit records
// (the server stamps each with time.Now when it answers), whatever the
// engine's Clock says: with a Clock a day behind the wall clock, a clean
// audit recorded before the refusal does not end it (it did: an audit
// at every pass); with one a day ahead, a clean audit recorded after the
// repair does (it did not: the refusal waited for its next scheduled
// audit).
func TestRefusalEndsOnACleanAuditByTheWallClock(t *testing.T) {
	for _, offset := range []time.Duration{-24 * time.Hour, 24 * time.Hour} {
		t.Run("clock "+offset.String(), func(t *testing.T) {
			ctx := context.Background()
			inner := memstore.New()
			st := &auditCounter{snapshotCounter: &snapshotCounter{Store: inner}, AuditRecords: inner}
			clk := &clock{}
			clk.nanos.Store(time.Now().Add(offset).UnixNano())
			e := New(st, compactingOptions(clk))
			defer e.Close()
			cleanAudit := func() {
				t.Helper()
				if err := st.AuditRecordPut(ctx, &store.AuditRecord{At: time.Now(), Mode: "full"}); err != nil {
					t.Fatal(err)
				}
			}
			publish(t, e, 1_000_000, time.Minute, 0)
			lifecycle(t, e, "a", 5)
			e.runCompaction(ctx)
			cleanAudit() // before the refusal
			lifecycle(t, e, "b", 5)
			shiftSubjectBehindTheJournal(t, inner, "tenant-7", 1)
			clk.Advance(time.Hour)
			e.runCompaction(ctx)
			audits := st.snapshots
			clk.Advance(time.Minute) // the next audit is due a minute later
			e.runCompaction(ctx)
			if s := e.CompactionStats(); st.snapshots != audits || s.Refused != 1 {
				t.Fatalf("a clean audit recorded before the refusal: %+v, %d audits since, want none", s, st.snapshots-audits)
			}
			shiftSubjectBehindTheJournal(t, inner, "tenant-7", -1) // repaired
			cleanAudit()
			clk.Advance(30 * time.Second)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); st.snapshots != audits+1 || s.Checkpoints != 2 || !s.RefusingSince.IsZero() {
				t.Fatalf("a clean audit recorded after the repair: %+v, %d audits since, want the next pass to cut", s, st.snapshots-audits)
			}
		})
	}
}
