package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

// manyAccountCheckpoint is a checkpoint of n accounts following prev
// (nil: the first). store.PutCheckpoint (CheckpointWrite) checks only
// the chain's links.
func manyAccountCheckpoint(prev *ledger.Checkpoint, n int) *ledger.Checkpoint {
	c := &ledger.Checkpoint{Seq: 1, Through: 1, CutAt: time.Unix(1, 0).UTC(), Accounts: make([]ledger.CheckpointAccount, n)}
	if prev != nil {
		c.Seq, c.Through, c.Prev = prev.Seq+1, prev.Through+1, prev.Digest
	}
	for i := range c.Accounts {
		c.Accounts[i] = ledger.CheckpointAccount{Account: ledger.AccountKey{Subject: fmt.Sprintf("t%06d", i), Generation: 1}, Entries: 1, Journal: "j"}
		c.Entries++
	}
	c.Seal()
	return c
}

func checkpointRows(t *testing.T, s *Store) map[int64]int {
	t.Helper()
	rows, err := s.readDB.Query("SELECT seq, count(*) FROM checkpoint_accounts GROUP BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]int{}
	for rows.Next() {
		var seq int64
		var n int
		if err := rows.Scan(&seq, &n); err != nil {
			t.Fatal(err)
		}
		out[seq] = n
	}
	return out
}

// TestCheckpointWriteInBoundedTransactions: a checkpoint of many accounts is
// written in transactions of at most checkpointPage rows (each lets the
// writer go), its header last; the accounts of checkpoints two back are
// deleted the same way, and rows staged by an attempt that never stored
// its header are replaced, not a conflict.
func TestCheckpointWriteInBoundedTransactions(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 3*checkpointPage + 7
	var chain []*ledger.Checkpoint
	var prev *ledger.Checkpoint
	for range 3 {
		c := manyAccountCheckpoint(prev, n)
		before := s.commits.Load()
		if err := store.PutCheckpoint(ctx, s, c); err != nil {
			t.Fatal(err)
		}
		if txs, least := s.commits.Load()-before, uint64(n/checkpointPage+2); txs < least {
			t.Fatalf("checkpoint %d of %d accounts in %d transactions, want at least %d of %d rows", c.Seq, n, txs, least, checkpointPage)
		}
		chain = append(chain, c)
		prev = c
	}
	if got := checkpointRows(t, s); len(got) != 2 || got[2] != n || got[3] != n {
		t.Fatalf("account rows per checkpoint %v, want those of 2 and 3 only, %d each", got, n)
	}

	// An attempt at checkpoint 4 that staged a page and stopped: the
	// snapshot still reads checkpoint 3, and the next put replaces it.
	next := manyAccountCheckpoint(prev, 10)
	err = s.withWriter(ctx, func(w *writer) error {
		return s.inWriteTx(ctx, w, "stage", func(tx *writeTx) error {
			_, err := tx.exec("INSERT INTO checkpoint_accounts (seq, " + checkpointAccountCols + ") VALUES (4, 'stale', '', '', 1, x'', 1, 'j')")
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		read := 0
		err := snap.CheckpointAccountStream(func(*ledger.CheckpointAccount) error { read++; return nil })
		if last := snap.LastCheckpoint(); err != nil || last.Seq != 3 || read != n {
			return fmt.Errorf("snapshot reads checkpoint %d of %d accounts (%v), want 3 of %d", last.Seq, read, err, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutCheckpoint(ctx, s, next); err != nil {
		t.Fatal(err)
	}
	if got := checkpointRows(t, s); got[4] != 10 || got[3] != n || len(got) != 2 {
		t.Fatalf("account rows per checkpoint %v, want 3: %d, 4: 10", got, n)
	}
	if err := store.PutCheckpoint(ctx, s, next); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second put of checkpoint 4: %v, want ErrConflict", err)
	}
	if got := checkpointRows(t, s); got[4] != 10 {
		t.Fatalf("a refused put changed checkpoint 4's rows: %v", got)
	}
}

// TestAuditReadsInPagesOfOne: with pages of one row, the account streams
// of an audit snapshot read every account and checkpoint account in key
// order across page boundaries (the keyset condition), and checkpoints
// still cut, store and verify.
func TestAuditReadsInPagesOfOne(t *testing.T) {
	defer func(n int) { auditPage = n }(auditPage)
	auditPage = 1
	storetest.RunAuditReads(t, func(t *testing.T) store.Store {
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "pages.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
