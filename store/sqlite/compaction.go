package sqlite

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// Journal compaction (not to be confused with checkpoint.go, the WAL
// checkpointer): statement checkpoints are stored in checkpoints and
// checkpoint_accounts (schema version 8), and JournalCompact deletes the
// journal batches the last one summarises. Both write on the store's one
// write connection between batches (withWriter), each in a transaction
// of its own.

// checkpointPage is how many checkpoint account rows one write
// transaction of CheckpointPut inserts or deletes: a few milliseconds on
// the writer, after which the batches queued for it go first. A million
// accounts in one transaction held the writer for seconds.
const checkpointPage = 1024

// CheckpointPut implements store.CheckpointStore without holding the
// writer for long: it stages the accounts in transactions of
// checkpointPage rows under c.Seq (invisible: readers read the accounts of
// the last stored header only), then stores the header in one short
// transaction that checks c still follows the chain, and then deletes the
// accounts older checkpoints no longer need, a page at a time. Rows
// staged by an attempt that ended before its header (a crash, ctx, a
// conflict) are deleted by the next attempt first.
func (s *Store) CheckpointPut(ctx context.Context, c *ledger.Checkpoint) error {
	var conv codec.Conv
	cutAt := conv.Nanos(c.CutAt)
	for i := range c.Accounts {
		conv.Int(c.Accounts[i].Account.Generation)
	}
	if err := conv.Err(); err != nil {
		return fmt.Errorf("checkpoint %d: %w", c.Seq, err)
	}
	// follows checks that c extends the stored chain.
	follows := func(tx *writeTx) error {
		var seq, through int64
		var prev string
		found, err := tx.queryRow("SELECT seq, through, digest FROM checkpoints ORDER BY seq DESC LIMIT 1", nil,
			func(sc scanner) error { return sc.Scan(&seq, &through, &prev) })
		if err != nil {
			return err
		}
		if !found {
			seq = 0
		}
		if c.Seq != seq+1 || c.Prev != prev || c.Through <= through {
			return fmt.Errorf("checkpoint %d (previous %q, through %d) does not follow %d (%q, through %d): %w",
				c.Seq, c.Prev, c.Through, seq, prev, through, store.ErrConflict)
		}
		return nil
	}
	inTx := func(f func(tx *writeTx) error) error {
		return s.withWriter(ctx, func(w *writer) error { return s.inWriteTx(ctx, w, "checkpoint", f) })
	}
	// deletePages deletes the account rows of seqs from lo to hi, a page
	// per transaction.
	deletePages := func(lo, hi int64) error {
		for {
			var n int64
			err := inTx(func(tx *writeTx) error {
				var err error
				n, err = tx.exec(`DELETE FROM checkpoint_accounts WHERE (seq, subject, route, region, generation) IN
					(SELECT seq, subject, route, region, generation FROM checkpoint_accounts WHERE seq BETWEEN ? AND ? LIMIT ?)`,
					lo, hi, int64(checkpointPage))
				return err
			})
			if err != nil || n < checkpointPage {
				return err
			}
		}
	}
	if err := inTx(follows); err != nil {
		return err
	}
	if err := deletePages(c.Seq, math.MaxInt64); err != nil {
		return err
	}
	for start := 0; start < len(c.Accounts); start += checkpointPage {
		page := c.Accounts[start:min(start+checkpointPage, len(c.Accounts))]
		err := inTx(func(tx *writeTx) error {
			for i := range page {
				a := &page[i]
				if _, err := tx.exec("INSERT INTO checkpoint_accounts (seq, "+checkpointAccountCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
					c.Seq, a.Account.Subject, a.Account.Route, a.Account.Region, int64(a.Account.Generation),
					codec.EncodeBalances(&a.Balances), a.Entries, a.Journal); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	err := inTx(func(tx *writeTx) error {
		if err := follows(tx); err != nil {
			return err
		}
		_, err := tx.exec("INSERT INTO checkpoints ("+checkpointCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
			c.Seq, c.Through, cutAt, c.Entries, c.Moves, c.Prev, c.AccountsDigest, c.Digest)
		return err
	})
	if err != nil {
		return err
	}
	// The header is stored: what follows only frees space, and what it
	// leaves (an error, ctx ending) the next checkpoint's put deletes.
	_ = deletePages(math.MinInt64, c.Seq-2)
	return nil
}

// JournalCompact implements store.CheckpointStore.
func (s *Store) JournalCompact(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("journal compaction: limit %d, want a positive one", limit)
	}
	var deleted int64
	err := s.withWriter(ctx, func(w *writer) error {
		return s.inWriteTx(ctx, w, "journal compaction", func(tx *writeTx) error {
			var through int64
			found, err := tx.queryRow("SELECT through FROM checkpoints ORDER BY seq DESC LIMIT 1", nil,
				func(sc scanner) error { return sc.Scan(&through) })
			if err != nil || !found {
				return err
			}
			// Rows of the journal table (schema versions 1 and 2) are at
			// position 0: every checkpoint summarises them.
			n, err := tx.exec("DELETE FROM journal WHERE seq IN (SELECT seq FROM journal ORDER BY seq LIMIT ?)", int64(limit))
			if err != nil {
				return err
			}
			deleted = n
			if left := int64(limit) - n; left > 0 {
				// The newest batch stays even when summarised: seq is a
				// rowid, and SQLite hands out max(rowid)+1, so an empty
				// table would give the next batch a position the
				// checkpoint already covers.
				n, err = tx.exec(`DELETE FROM journal_batches WHERE seq IN (SELECT seq FROM journal_batches
					WHERE seq <= ? AND seq < (SELECT MAX(seq) FROM journal_batches) ORDER BY seq LIMIT ?)`, through, left)
				deleted += n
			}
			return err
		})
	})
	return int(deleted), err
}

// writeTx is a transaction of the write connection outside a batch.
type writeTx struct {
	ctx context.Context
	w   *writer
}

// exec runs q and returns how many rows it changed.
func (t *writeTx) exec(q string, args ...any) (int64, error) {
	st, err := t.w.stmt(t.ctx, q)
	if err != nil {
		return 0, err
	}
	nv, err := t.w.named(args)
	if err != nil {
		return 0, err
	}
	res, err := st.(driver.StmtExecContext).ExecContext(t.ctx, nv)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// queryRow calls scan with the first row of q, if any, and reports
// whether there was one.
func (t *writeTx) queryRow(q string, args []any, scan func(scanner) error) (bool, error) {
	st, err := t.w.stmt(t.ctx, q)
	if err != nil {
		return false, err
	}
	found := false
	err = t.w.query(t.ctx, st, args, func(sc scanner) error {
		if found {
			return nil
		}
		found = true
		return scan(sc)
	})
	return found, err
}

// inWriteTx runs f in a write transaction on w (BEGIN IMMEDIATE), commits
// it when f succeeds and rolls it back otherwise.
func (s *Store) inWriteTx(ctx context.Context, w *writer, what string, f func(*writeTx) error) error {
	sctx := stmtCtx(ctx)
	if err := w.exec(sctx, w.begin, nil); err != nil {
		return fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	if err := f(&writeTx{ctx: sctx, w: w}); err != nil {
		_ = w.exec(sctx, w.rollback, nil)
		if errors.Is(err, store.ErrConflict) {
			return err
		}
		return fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	if err := w.exec(sctx, w.commit, nil); err != nil {
		_ = w.exec(sctx, w.rollback, nil)
		return fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	s.commits.Add(1) // the WAL checkpointer copies what this wrote
	return nil
}
