package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// checkpointCases are the statement checkpoint and compaction checks, run
// by Run.
var checkpointCases = []struct {
	name string
	f    func(t *testing.T, s store.Store)
}{
	{"CheckpointCompaction", testCheckpointCompaction},
	{"CheckpointConflict", testCheckpointConflict},
	{"CheckpointWriterPaged", testCheckpointWriterPaged},
	{"JournalAfter", testJournalAfter},
}

// cutCheckpoint audits s through AuditSnapshot and returns the checkpoint
// the audit cut (failing the test on any discrepancy).
func cutCheckpoint(t *testing.T, s store.Store, at time.Time) *ledger.Checkpoint {
	t.Helper()
	var cp *ledger.Checkpoint
	var found []ledger.Discrepancy
	err := s.AuditSnapshot(context.Background(), true, func(snap *ledger.Snapshot, through int64) error {
		if through <= 0 {
			t.Fatalf("cut position %d with a journal", through)
		}
		found, cp = ledger.AuditWith(snap, ledger.AuditOptions{Cut: through, CutAt: at})
		return nil
	})
	if err != nil || len(found) > 0 || cp == nil {
		t.Fatalf("audit for a checkpoint: %v, %v, checkpoint %v", err, found, cp != nil)
	}
	return cp
}

// auditAll runs a full and a since-checkpoint audit through AuditSnapshot
// and Snapshot, failing the test on any discrepancy.
func auditAll(t *testing.T, s store.Store, when string) {
	t.Helper()
	ctx := context.Background()
	for _, since := range []bool{false, true} {
		err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			if found, _ := ledger.AuditWith(snap, ledger.AuditOptions{SinceCheckpoint: since}); len(found) > 0 {
				t.Errorf("%s: streamed audit (since checkpoint %v): %v", when, since, found)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if found := ledger.Audit(snap); len(found) > 0 {
		t.Errorf("%s: audit of Snapshot: %v", when, found)
	}
}

// compactAll runs JournalCompact in pages of limit until it deletes
// nothing, and returns how many rows it deleted.
func compactAll(t *testing.T, s store.Store, limit int) int {
	t.Helper()
	total := 0
	for range 10000 {
		n, err := s.JournalCompact(context.Background(), limit)
		if err != nil {
			t.Fatalf("compact: %v", err)
		}
		if n > limit {
			t.Fatalf("compact deleted %d rows, limit %d", n, limit)
		}
		if n == 0 {
			return total
		}
		total += n
	}
	t.Fatal("compaction never ends")
	return 0
}

// testCheckpointCompaction: a checkpoint cut by a sound audit is stored;
// compaction then deletes what it summarises, in pages, and nothing
// after it; the ledger still audits sound (full and since the checkpoint)
// from the checkpoint's vectors, and a second checkpoint extends the
// chain. Without a checkpoint nothing is deleted.
func testCheckpointCompaction(t *testing.T, s store.Store) {
	ctx := context.Background()
	if n, err := s.JournalCompact(ctx, 10); err != nil || n != 0 {
		t.Fatalf("compaction without a checkpoint: %d rows, %v", n, err)
	}
	if _, err := s.JournalCompact(ctx, 0); err == nil {
		t.Fatal("compaction with limit 0: no error")
	}
	now, _ := retentionWorld(t, s, time.Date(2026, 7, 20, 9, 0, 0, 0, time.UTC))
	full, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok, err := s.CheckpointLast(ctx); err != nil || ok {
		t.Fatalf("last checkpoint of an empty chain: %+v, %v, %v", c, ok, err)
	}
	cp := cutCheckpoint(t, s, now)
	if cp.Seq != 1 || cp.Prev != "" || cp.Entries != int64(len(full.Journal)) || len(cp.Accounts) == 0 {
		t.Fatalf("first checkpoint: seq %d prev %q, %d entries of %d, %d accounts", cp.Seq, cp.Prev, cp.Entries, len(full.Journal), len(cp.Accounts))
	}
	if err := store.PutCheckpoint(ctx, s, cp); err != nil {
		t.Fatal(err)
	}
	// Commands after the checkpoint: their entries must survive.
	run := func(cmd ledger.Command) {
		t.Helper()
		if res, err := apply(ctx, s, &cmd, now); err != nil || res.Err != nil {
			t.Fatalf("%s %s: %+v, %v", cmd.Kind, cmd.ReservationID, res, err)
		}
		now = now.Add(time.Second)
	}
	run(ledger.Command{Kind: ledger.KindRelease, ReservationID: "h"})
	before, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Journal) == 0 || len(before.Checkpoints) != 1 || before.Checkpoints[0].Digest != cp.Digest {
		t.Fatalf("snapshot after the checkpoint: %d entries since, chain %d", len(before.Journal), len(before.Checkpoints))
	}
	same(t, "checkpoint read back", before.Checkpoints[0], *cp)
	auditAll(t, s, "before compaction")
	if deleted := compactAll(t, s, 1); deleted == 0 {
		t.Fatal("compaction deleted nothing the checkpoint summarises")
	}
	after, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "journal since the checkpoint after compaction", after.Journal, before.Journal)
	auditAll(t, s, "after compaction")

	// A second checkpoint extends the chain; compaction goes on.
	cp2 := cutCheckpoint(t, s, now)
	if cp2.Seq != 2 || cp2.Prev != cp.Digest || cp2.Entries != cp.Entries+int64(len(before.Journal)) {
		t.Fatalf("second checkpoint: seq %d prev %q (want %q), %d entries (want %d)", cp2.Seq, cp2.Prev, cp.Digest, cp2.Entries, cp.Entries+int64(len(before.Journal)))
	}
	if err := store.PutCheckpoint(ctx, s, cp2); err != nil {
		t.Fatal(err)
	}
	// CheckpointLast: the newest header, its cut time kept to the
	// nanosecond (the compaction worker reads when it last cut from it).
	if c, ok, err := s.CheckpointLast(ctx); err != nil || !ok {
		t.Fatalf("last checkpoint: %v, %v", ok, err)
	} else {
		same(t, "last checkpoint", c, cp2.Header())
	}
	// (A store may keep its newest row even when summarised: SQLite does,
	// so that its rowids never go back. This one may delete nothing.)
	compactAll(t, s, 100)
	end, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(end.Journal) != 0 || len(end.Checkpoints) != 2 || end.Checkpoints[0].Accounts != nil {
		t.Fatalf("after the second compaction: %d entries, chain of %d, first with %d accounts", len(end.Journal), len(end.Checkpoints), len(end.Checkpoints[0].Accounts))
	}
	auditAll(t, s, "after the second compaction")

	// The audit notices a checkpoint that does not match the accounts.
	tampered := *end
	tampered.Checkpoints = append([]ledger.Checkpoint(nil), end.Checkpoints...)
	last := &tampered.Checkpoints[1]
	last.Accounts = append([]ledger.CheckpointAccount(nil), last.Accounts...)
	last.Accounts[0].Balances[0].Spent++
	last.Accounts[0].Balances[0].Available--
	if found := ledger.Audit(&tampered); len(found) == 0 {
		t.Fatal("audit of a tampered checkpoint found nothing")
	}
}

// testCheckpointConflict: store.PutCheckpoint refuses a checkpoint that does
// not extend the stored chain (another replica cut first), with
// ErrConflict, and keeps the chain as it was.
func testCheckpointConflict(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, _ := retentionWorld(t, s, time.Date(2026, 7, 21, 9, 0, 0, 0, time.UTC))
	cp := cutCheckpoint(t, s, now)
	bad := *cp
	bad.Seq = 2
	if err := store.PutCheckpoint(ctx, s, &bad); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("checkpoint 2 on an empty chain: %v, want ErrConflict", err)
	}
	if err := store.PutCheckpoint(ctx, s, cp); err != nil {
		t.Fatal(err)
	}
	if err := store.PutCheckpoint(ctx, s, cp); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the same checkpoint twice: %v, want ErrConflict", err)
	}
	// The next checkpoint must summarise entries past the last one's.
	none := *cp
	none.Seq, none.Prev = cp.Seq+1, cp.Digest
	if err := store.PutCheckpoint(ctx, s, &none); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a checkpoint through %d after one through %d: %v, want ErrConflict", none.Through, cp.Through, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Checkpoints) != 1 {
		t.Fatalf("chain of %d after refusals, want 1", len(snap.Checkpoints))
	}
}

// streamedCheckpoint returns the last checkpoint of an audit snapshot and
// its accounts as CheckpointAccountStream reads them (nil, nil without a
// checkpoint).
func streamedCheckpoint(t *testing.T, s store.Store) (*ledger.Checkpoint, []ledger.CheckpointAccount) {
	t.Helper()
	var last *ledger.Checkpoint
	var accounts []ledger.CheckpointAccount
	err := s.AuditSnapshot(context.Background(), false, func(snap *ledger.Snapshot, _ int64) error {
		if l := snap.LastCheckpoint(); l != nil {
			h := l.Header()
			last = &h
		}
		if snap.CheckpointAccountStream == nil {
			if last != nil {
				t.Error("a checkpoint without an account stream")
			}
			return nil
		}
		return snap.CheckpointAccountStream(func(a *ledger.CheckpointAccount) error {
			accounts = append(accounts, *a)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return last, accounts
}

// testCheckpointWriterPaged: a checkpoint written a page at a time is
// invisible until its header is stored: a writer closed before Finish
// leaves nothing an audit reads, and the next writer deletes what it put;
// one writer at a time; a header that no longer follows the chain is
// refused with ErrConflict and nothing becomes visible. The stored
// checkpoint streams back page for page as it was cut, and audits clean.
func testCheckpointWriterPaged(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, _ := retentionWorld(t, s, time.Date(2026, 7, 22, 9, 0, 0, 0, time.UTC))
	cp := cutCheckpoint(t, s, now)
	if len(cp.Accounts) == 0 {
		t.Fatal("a checkpoint without accounts")
	}
	stale := cp.Accounts[0]
	stale.Account.Subject = "zz-stale-" + stale.Account.Subject

	// An attempt that ends before its header.
	w, err := s.CheckpointWrite(ctx, cp.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CheckpointWrite(ctx, cp.Seq); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second writer beside an open one: %v, want ErrConflict", err)
	}
	if err := w.Put(ctx, append(append([]ledger.CheckpointAccount(nil), cp.Accounts...), stale)); err != nil {
		t.Fatal(err)
	}
	if last, accounts := streamedCheckpoint(t, s); last != nil || len(accounts) != 0 {
		t.Fatalf("a checkpoint without its header is visible: %+v, %d accounts", last, len(accounts))
	}
	w.Close()
	auditAll(t, s, "after an unfinished checkpoint")
	if _, err := s.CheckpointWrite(ctx, cp.Seq+1); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("checkpoint %d on an empty chain: %v, want ErrConflict", cp.Seq+1, err)
	}

	// A header that does not follow is refused; nothing shows.
	w, err = s.CheckpointWrite(ctx, cp.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Put(ctx, cp.Accounts); err != nil {
		t.Fatal(err)
	}
	bad := cp.Header()
	bad.Prev = "not-the-last"
	if err := w.Finish(ctx, &bad); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a header that does not follow: %v, want ErrConflict", err)
	}
	w.Close()
	if last, _ := streamedCheckpoint(t, s); last != nil {
		t.Fatalf("a refused checkpoint is visible: %+v", last)
	}

	// The whole checkpoint, one account per page.
	w, err = s.CheckpointWrite(ctx, cp.Seq)
	if err != nil {
		t.Fatal(err)
	}
	for i := range cp.Accounts {
		if err := w.Put(ctx, cp.Accounts[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	header := cp.Header()
	if err := w.Finish(ctx, &header); err != nil {
		t.Fatal(err)
	}
	w.Close()
	last, accounts := streamedCheckpoint(t, s)
	if last == nil || last.Digest != cp.Digest {
		t.Fatalf("stored checkpoint %+v, want %s", last, cp.Digest)
	}
	same(t, "checkpoint accounts streamed back", accounts, cp.Accounts)
	auditAll(t, s, "after a paged checkpoint")
}

// RunAuditReads runs the checks of what an audit reads (the streamed
// snapshot, checkpoints and their paged writes) alone: a driver runs them
// again with its read pages made tiny, so every page boundary is crossed.
func RunAuditReads(t *testing.T, open func(t *testing.T) store.Store) {
	cases := append([]struct {
		name string
		f    func(t *testing.T, s store.Store)
	}{{"SnapshotStreaming", testSnapshotStreaming}}, checkpointCases...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open(t)) })
	}
}

// testJournalAfter: JournalAfter, the compaction worker's watermark, says
// whether an entry after a position is committed: on an empty store none
// is; after commands some are; after a checkpoint of them none is after
// its Through (before and after compaction deletes what it summarises),
// until the next command.
func testJournalAfter(t *testing.T, s store.Store) {
	ctx := context.Background()
	after := func(when string, pos int64, want bool) {
		t.Helper()
		if got, err := s.JournalAfter(ctx, pos); err != nil || got != want {
			t.Fatalf("%s: JournalAfter(%d) = %v, %v; want %v", when, pos, got, err, want)
		}
	}
	after("empty store", 0, false)
	now, _ := retentionWorld(t, s, time.Date(2026, 7, 22, 9, 0, 0, 0, time.UTC))
	after("after commands", 0, true)
	cp := cutCheckpoint(t, s, now)
	if err := store.PutCheckpoint(ctx, s, cp); err != nil {
		t.Fatal(err)
	}
	after("after a checkpoint of every entry", cp.Through, false)
	after("after a checkpoint, from the start", 0, true)
	compactAll(t, s, 100)
	after("after compaction", cp.Through, false)
	cmd := ledger.Command{Kind: ledger.KindRelease, ReservationID: "h"}
	if res, err := apply(ctx, s, &cmd, now.Add(time.Second)); err != nil || res.Err != nil {
		t.Fatalf("release: %+v, %v", res, err)
	}
	after("after a command since the checkpoint", cp.Through, true)
}
