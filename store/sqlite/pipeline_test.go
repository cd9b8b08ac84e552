package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
	"github.com/capledger/capledger/store/storetest"
)

func openPipelined(t *testing.T) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "capledger.db"), sqlite.WithPipelinedSync())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Every store contract holds for a pipelined store too (Tx.Commit syncs
// before it returns).
func TestConformancePipelined(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return openPipelined(t) })
}

// countSyncs makes s count its fdatasyncs (still doing them).
func countSyncs(s *sqlite.Store) *atomic.Int64 {
	var n atomic.Int64
	sqlite.SetDatasync(s, func(f *os.File) error {
		n.Add(1)
		return f.Sync()
	})
	return &n
}

func commitDeferred(t *testing.T, s *sqlite.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.(store.DeferredCommitter).CommitDeferred(ctx); err != nil {
		t.Fatal(err)
	}
}

// A pipelined store commits with synchronous=NORMAL and fsyncs in Sync:
// one fdatasync for every commit before it, none when nothing is new.
func TestPipelinedCommitsAreSyncedBySync(t *testing.T) {
	s := openPipelined(t)
	if mode, err := sqlite.WriterSynchronous(s); err != nil || mode != 1 {
		t.Fatalf("writer synchronous %d, %v; want NORMAL (1)", mode, err)
	}
	syncs := countSyncs(s)
	ctx := context.Background()
	commitDeferred(t, s, insert("a"))
	commitDeferred(t, s, insert("b"))
	if n := syncs.Load(); n != 0 {
		t.Fatalf("%d fsyncs inside deferred commits", n)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load(); n != 1 {
		t.Fatalf("%d fsyncs for two commits and two Syncs; want 1", n)
	}
	// Tx.Commit keeps its contract: synced before it returns.
	commit(t, s, insert("c"))
	if n := syncs.Load(); n != 2 {
		t.Fatalf("Commit in a pipelined store: %d fsyncs in all, want 2", n)
	}

	// A store opened without the option fsyncs in COMMIT, never in Sync.
	full := openTemp(t)
	if mode, err := sqlite.WriterSynchronous(full); err != nil || mode != 2 {
		t.Fatalf("default writer synchronous %d, %v; want FULL (2)", mode, err)
	}
}

// The read methods never answer from a commit that is not durable: a read
// after a deferred commit syncs it first.
func TestPipelinedReadsWaitForTheSync(t *testing.T) {
	s := openPipelined(t)
	syncs := countSyncs(s)
	ctx := context.Background()
	commitDeferred(t, s, insert("a"))
	if _, err := s.ReservationGet(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load(); n != 1 {
		t.Fatalf("a read answered a deferred commit after %d fsyncs; want 1 before it", n)
	}
	commitDeferred(t, s, insert("b"))
	if _, err := s.ReservationGet(ctx, "no-such"); !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	if n := syncs.Load(); n != 2 {
		t.Fatalf("not found answered over a deferred commit after %d fsyncs; want 2", n)
	}
	commitDeferred(t, s, insert("c"))
	if _, err := s.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load(); n != 3 {
		t.Fatalf("a snapshot over a deferred commit after %d fsyncs; want 3", n)
	}
}

// fsyncgate: after a failed fsync the store never tries another and
// refuses every read and write until it is opened again.
func TestFailedSyncFailsTheStoreForGood(t *testing.T) {
	s := openPipelined(t)
	var calls atomic.Int64
	sqlite.SetDatasync(s, func(*os.File) error {
		calls.Add(1)
		return syscall.EIO
	})
	ctx := context.Background()
	commitDeferred(t, s, insert("a"))
	err := s.Sync(ctx)
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, sqlite.ErrSyncFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("failed sync: %v", err)
	}
	if err := s.Sync(ctx); !errors.Is(err, sqlite.ErrSyncFailed) {
		t.Fatalf("second Sync: %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d fsync attempts; a failed fsync must never be retried", n)
	}
	if _, err := s.Begin(ctx); !errors.Is(err, sqlite.ErrSyncFailed) {
		t.Fatalf("Begin after a failed fsync: %v", err)
	}
	if _, err := s.ReservationGet(ctx, "a"); !errors.Is(err, sqlite.ErrSyncFailed) {
		t.Fatalf("read after a failed fsync: %v", err)
	}
	if _, err := s.PolicyList(ctx); !errors.Is(err, sqlite.ErrSyncFailed) {
		t.Fatalf("list after a failed fsync: %v", err)
	}
	// A Commit (not deferred) whose sync fails reports it too.
	s2 := openPipelined(t)
	sqlite.SetDatasync(s2, func(*os.File) error { return syscall.EIO })
	tx, err := s2.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, insert("x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, sqlite.ErrSyncFailed) {
		t.Fatalf("Commit whose fsync failed: %v", err)
	}
}

// The writes outside a batch (the subject index flusher, checkpoint
// pages, journal compaction, statement retention, the vacuum) follow
// Commit's rule in a pipelined store: each is fsynced before it returns,
// so a read after it has nothing of it left to sync. Otherwise a read
// could answer from a removal that a power loss undoes (OPERATIONS.md,
// "--pipelined-sync").
func TestPipelinedMaintenanceWritesAreSyncedBeforeTheyReturn(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"),
		sqlite.WithPipelinedSync(), sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	syncs := countSyncs(s)
	durable := func(what string, write func() error) {
		t.Helper()
		before := syncs.Load()
		if err := write(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		after := syncs.Load()
		if after == before {
			t.Fatalf("%s returned without an fsync", what)
		}
		if _, err := s.ReservationGet(ctx, "no-such"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("read after %s: %v", what, err)
		}
		if n := syncs.Load() - after; n != 0 {
			t.Fatalf("a read after %s returned had to fsync it first", what)
		}
	}

	commit(t, s, journaled("a")) // batch 1
	commit(t, s, journaled("b")) // batch 2
	durable("subject index flush", func() error { return s.FlushSubjectIndex(ctx) })
	cp := &ledger.Checkpoint{Seq: 1, Through: 2, CutAt: t0}
	cp.Seal()
	durable("checkpoint", func() error { return store.PutCheckpoint(ctx, s, cp) })
	durable("journal compaction", func() error {
		n, err := s.JournalCompact(ctx, 1000)
		if err == nil && n == 0 {
			err = errors.New("deleted nothing")
		}
		return err
	})

	// Enough statements that removing them frees more than the eighth of
	// the file ReclaimStep keeps.
	var statements store.Changes
	key := reservation("a").Account
	filler := ledger.Balances{{Opening: 1, Available: 1}}
	for i := range 3000 {
		statements.Statements = append(statements.Statements, ledger.Statement{Account: key,
			EpochStart: t0.Add(time.Duration(i) * time.Hour), EpochEnd: t0.Add(time.Duration(i+1) * time.Hour),
			Dims: 1, Opening: filler, Closing: filler})
	}
	commit(t, s, &statements)
	durable("statement retention", func() error {
		n, err := s.StatementsRemove(ctx, t0.Add(10_000*time.Hour), 10_000)
		if err == nil && n != 3000 {
			err = fmt.Errorf("deleted %d statements, want 3000", n)
		}
		return err
	})
	durable("reclaim", func() error {
		_, err := s.ReclaimStep(ctx, 1<<20)
		return err
	})
}

// A transaction that changed no row costs no fdatasync in a pipelined
// store, and no read waits for it: a maintenance pass that finds nothing
// to do (statement retention with none due, journal compaction with
// nothing summarised, a retention page whose rows went meanwhile) commits
// such a transaction every time it runs. One that changed something is
// synced before it returns, as before; and a Commit after deferred
// commits still makes them durable, whatever it wrote itself.
func TestPipelinedTransactionsThatChangeNothingCostNoSync(t *testing.T) {
	ctx := context.Background()
	s := openPipelined(t)
	syncs := countSyncs(s)
	costs := func(want int64, what string, f func() error) {
		t.Helper()
		before := syncs.Load()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if _, err := s.ReservationGet(ctx, "no-such"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("read after %s: %v", what, err)
		}
		if n := syncs.Load() - before; n != want {
			t.Fatalf("%s, then a read: %d fdatasyncs, want %d", what, n, want)
		}
	}
	nothing := func() error {
		tx, err := s.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ReservationGet(ctx, "a"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	removeStatements := func(want int) func() error {
		return func() error {
			n, err := s.StatementsRemove(ctx, t0.Add(10_000*time.Hour), 256)
			if err == nil && n != want {
				err = fmt.Errorf("removed %d statements, want %d", n, want)
			}
			return err
		}
	}

	costs(1, "a commit that wrote", func() error { commit(t, s, insert("a")); return nil })
	costs(0, "a transaction that read and wrote nothing", nothing)
	costs(0, "statement retention with no statement due", removeStatements(0))
	costs(0, "journal compaction with no checkpoint", func() error {
		n, err := s.JournalCompact(ctx, 1000)
		if err == nil && n != 0 {
			err = fmt.Errorf("deleted %d journal rows, want 0", n)
		}
		return err
	})
	costs(1, "a write after them", func() error { commit(t, s, insert("b")); return nil })

	key := reservation("a").Account
	filler := ledger.Balances{{Opening: 1, Available: 1}}
	commit(t, s, &store.Changes{Statements: []ledger.Statement{{Account: key,
		EpochStart: t0, EpochEnd: t0.Add(time.Hour), Dims: 1, Opening: filler, Closing: filler}}})
	costs(1, "statement retention that removed one", removeStatements(1))
	costs(0, "statement retention again, with none left", removeStatements(0))

	// Deferred commits not yet synced: a Commit that wrote nothing still
	// returns only once they are durable, and a read still waits for them.
	commitDeferred(t, s, insert("c"))
	costs(1, "a Commit that wrote nothing after a deferred commit", nothing)
	commitDeferred(t, s, insert("d"))
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.(store.DeferredCommitter).CommitDeferred(ctx); err != nil {
		t.Fatal(err)
	}
	costs(1, "a read after a deferred commit and a deferred commit of nothing", func() error { return nil })
}
