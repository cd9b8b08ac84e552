package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// The streamed audit of a SQLite store finds what the in-memory audit of
// its snapshot finds: nothing for a sound ledger, the journal_replay
// discrepancy of an account row changed behind the journal's back; and a
// cancelled audit is an error, not a verdict.
func TestStreamingAuditMatchesSnapshotAudit(t *testing.T) {
	ctx := context.Background()
	st, e := sqliteAuditEngine(t)
	for i := range 300 {
		id := fmt.Sprintf("a%03d", i)
		cmds := []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindStart, ReservationID: id, OperationID: "op"},
			{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op", Units: ledger.Amounts{4}}}
		if _, err := e.DoBatch(ctx, cmds); err != nil {
			t.Fatal(err)
		}
	}
	auditClean(t, e)

	// Change an account behind the journal: conservation still holds.
	changeAccountBehindTheJournal(t, st)
	streamed, err := e.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inMemory := ledger.Audit(snap)
	if len(streamed) == 0 || !slices.Equal(streamed, inMemory) {
		t.Fatalf("streamed audit %v, snapshot audit %v", streamed, inMemory)
	}
	if streamed[0].Check != ledger.CheckJournal {
		t.Fatalf("found %v, want journal_replay", streamed)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if d, err := e.Audit(cancelled); err == nil {
		t.Fatalf("cancelled audit answered %v", d)
	}
}

// A full audit of a SQLite store reports progress while the store copies
// the database into a file, before it reads a row: the copy is paced
// at an audit's share, and without reports a streaming client saw no rows
// read for all of it. The fraction never goes back, and the copy takes
// the first auditCopyFraction of it; rows count what was read (0 during
// the copy), so they never go back either.
func TestAuditReportsProgressDuringItsCopy(t *testing.T) {
	ctx := context.Background()
	_, e := sqliteAuditEngine(t)
	const n = 2000
	for b := range n / 100 {
		var cmds []ledger.Command
		for i := range 100 {
			id := fmt.Sprintf("p%02d-%03d", b, i)
			cmds = append(cmds, reserveCmd(id, 1), ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
		}
		if _, err := e.DoBatch(ctx, cmds); err != nil {
			t.Fatal(err)
		}
	}
	var reports []AuditProgress
	found, err := e.AuditWith(ctx, AuditOptions{Progress: func(p AuditProgress) { reports = append(reports, p) }})
	if err != nil || len(found) > 0 {
		t.Fatalf("audit: %v %v", found, err)
	}
	copying, last, lastRows := 0, 0.0, int64(0)
	for i, p := range reports {
		if p.Fraction < last || p.Rows < lastRows {
			t.Fatalf("progress went back from %.3f (%d rows) to %.3f (%d rows) at report %d: %+v", last, lastRows, p.Fraction, p.Rows, i, reports)
		}
		last, lastRows = p.Fraction, p.Rows
		if p.Fraction > 0 && p.Fraction <= auditCopyFraction && i < len(reports)-1 {
			// Nothing is read while the store copies: a count of copied
			// rows here went back to 0 when the reading began.
			if p.Rows != 0 {
				t.Fatalf("report %d during the copy counts %d rows read, want 0: %+v", i, p.Rows, reports)
			}
			copying++
		}
	}
	if copying < 2 {
		t.Fatalf("%d reports during the copy of %d reservations, want several: %+v", copying, n, reports)
	}
	if end := reports[len(reports)-1]; !end.Done || end.Fraction != 1 {
		t.Fatalf("the audit ended with progress %+v", end)
	}
}

// sqliteAuditEngine returns an engine without workers over a new SQLite
// store with a policy published, both closed when the test ends.
func sqliteAuditEngine(t *testing.T) (*sqlite.Store, *Engine) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := New(st, Options{Clock: newClock().Now, DisableWorkers: true})
	t.Cleanup(func() { e.Close() })
	publish(t, e, 1_000_000, time.Minute, 0)
	return st, e
}

// An audit's progress estimate tracks the rows present: a journal of
// gateways' single commands among a worker's batches of hundreds (every
// 300th batch here, as a worker's pages come at a steady period), whose
// reservations retention then removed, is estimated at the rows the
// audit reads. 32 batches sampled evenly landed on the large ones (or
// missed them) and put the estimate several times off (53,938 for 7,992
// rows), which the exact reservation count no longer hid once retention
// had removed them.
func TestAuditEstimateTracksRowsPresent(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, TombstoneRetention: 2 * time.Hour, RetentionPause: time.Microsecond})
	t.Cleanup(func() { e.Close() })
	publish(t, e, 1_000_000, time.Minute, 0)
	for b := range 1200 {
		n := 1
		if b%300 == 299 {
			n = 300
		}
		var cmds []ledger.Command
		for i := range n {
			id := fmt.Sprintf("p%04d-%03d", b, i)
			cmds = append(cmds, reserveCmd(id, 1), ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
		}
		if _, err := e.DoBatch(ctx, cmds); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(90 * time.Minute)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.RetentionStats(); s.Retired == 0 {
		t.Fatalf("retention removed nothing: %+v", s)
	}
	for _, since := range []bool{false, true} {
		var first, last AuditProgress
		reports := 0
		found, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: since, Progress: func(p AuditProgress) {
			if reports == 0 {
				first = p
			}
			last = p
			reports++
		}})
		if err != nil || len(found) > 0 {
			t.Fatalf("audit: %v %v", found, err)
		}
		if !last.Done || last.Rows == 0 || first.Estimate != last.Rows {
			t.Errorf("since checkpoint %v: estimated %d rows, read %d (%+v)", since, first.Estimate, last.Rows, last)
		}
	}
}
