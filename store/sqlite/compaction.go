package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"slices"

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
// transaction of a checkpoint writer inserts or deletes: a few
// milliseconds on the writer, after which the batches queued for it go
// first. A million accounts in one transaction held the writer for
// seconds.
const checkpointPage = 1024

// CheckpointWrite implements store.CheckpointStore without holding the
// writer for long: the writer stages the accounts in transactions of
// checkpointPage rows under their seq (invisible: readers read the
// accounts of the last stored header only), then stores the header in
// one short transaction that checks it still follows the chain, and then
// deletes the accounts older checkpoints no longer need, a page at a
// time. Rows staged by an attempt that ended before its header (a crash,
// ctx, a conflict) are deleted here first. One writer at a time per
// store: a second gets ErrConflict.
func (s *Store) CheckpointWrite(ctx context.Context, seq int64) (store.CheckpointWriter, error) {
	if !s.checkpointWriting.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("checkpoint %d: another checkpoint is being written: %w", seq, store.ErrConflict)
	}
	w := &checkpointWriter{s: s, seq: seq}
	err := w.inTx(ctx, func(tx *writeTx) error {
		last, _, _, err := lastCheckpoint(tx)
		if err == nil && seq != last+1 {
			err = fmt.Errorf("checkpoint %d does not follow %d: %w", seq, last, store.ErrConflict)
		}
		return err
	})
	if err == nil {
		err = w.deletePages(ctx, seq, math.MaxInt64)
	}
	if err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// lastCheckpoint returns the last stored checkpoint's seq, through and
// digest (0, 0, "" without one).
func lastCheckpoint(tx *writeTx) (seq, through int64, digest string, err error) {
	_, err = tx.queryRow("SELECT seq, through, digest FROM checkpoints ORDER BY seq DESC LIMIT 1", nil,
		func(sc scanner) error { return sc.Scan(&seq, &through, &digest) })
	return seq, through, digest, err
}

// checkpointWriter is the SQLite store.CheckpointWriter.
type checkpointWriter struct {
	s      *Store
	seq    int64
	closed bool
}

// inTx runs f in a write transaction of its own between batches.
func (w *checkpointWriter) inTx(ctx context.Context, f func(tx *writeTx) error) error {
	return w.s.withWriter(ctx, func(wr *writer) error { return w.s.inWriteTx(ctx, wr, "checkpoint", f) })
}

// deletePages deletes the account rows of seqs from lo to hi, a page per
// transaction.
func (w *checkpointWriter) deletePages(ctx context.Context, lo, hi int64) error {
	for {
		var n int64
		err := w.inTx(ctx, func(tx *writeTx) error {
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

// Put implements store.CheckpointWriter: a transaction per
// checkpointPage rows.
func (w *checkpointWriter) Put(ctx context.Context, page []ledger.CheckpointAccount) error {
	var conv codec.Conv
	for i := range page {
		conv.Int(page[i].Account.Generation)
	}
	if err := conv.Err(); err != nil {
		return fmt.Errorf("checkpoint %d: %w", w.seq, err)
	}
	for start := 0; start < len(page); start += checkpointPage {
		part := page[start:min(start+checkpointPage, len(page))]
		err := w.inTx(ctx, func(tx *writeTx) error {
			for i := range part {
				a := &part[i]
				if _, err := tx.exec("INSERT INTO checkpoint_accounts (seq, "+checkpointAccountCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
					w.seq, a.Account.Subject, a.Account.Route, a.Account.Region, int64(a.Account.Generation),
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
	return nil
}

// Finish implements store.CheckpointWriter.
func (w *checkpointWriter) Finish(ctx context.Context, c *ledger.Checkpoint) error {
	var conv codec.Conv
	cutAt := conv.Nanos(c.CutAt)
	if err := conv.Err(); err != nil {
		return fmt.Errorf("checkpoint %d: %w", c.Seq, err)
	}
	if c.Seq != w.seq {
		return fmt.Errorf("checkpoint %d finished by the writer of %d", c.Seq, w.seq)
	}
	err := w.inTx(ctx, func(tx *writeTx) error {
		seq, through, prev, err := lastCheckpoint(tx)
		if err != nil {
			return err
		}
		if c.Seq != seq+1 || c.Prev != prev || c.Through <= through {
			return fmt.Errorf("checkpoint %d (previous %q, through %d) does not follow %d (%q, through %d): %w",
				c.Seq, c.Prev, c.Through, seq, prev, through, store.ErrConflict)
		}
		_, err = tx.exec("INSERT INTO checkpoints ("+checkpointCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
			c.Seq, c.Through, cutAt, c.Entries, c.Moves, c.Prev, c.AccountsDigest, c.Digest)
		return err
	})
	if err != nil {
		return err
	}
	// The header is stored: what follows only frees space, and what it
	// leaves (an error, ctx ending) the next checkpoint's write deletes.
	_ = w.deletePages(ctx, math.MinInt64, c.Seq-2)
	return nil
}

// Close implements store.CheckpointWriter.
func (w *checkpointWriter) Close() {
	if !w.closed {
		w.closed = true
		w.s.checkpointWriting.Store(false)
	}
}

// auditPage is how many rows one query of an audit's account streams
// reads (AuditSnapshot): a page is what the audit holds of them.
var auditPage = 1024

// accountKeyAfter is the keyset condition of the next page of a table
// keyed by (subject, route, region, generation): SQLite compares the row
// value through the primary key.
const accountKeyAfter = "(subject, route, region, generation) > (?, ?, ?, ?)"

// pagedByKey calls yield with every row q reads in pages of auditPage
// (q has a %s for the keyset condition, its first argument after args,
// and ends in ORDER BY the key LIMIT ?), each row scanned by scan into
// the page and valid only during the call.
func pagedByKey[T any](ctx context.Context, tx *sql.Tx, q string, args []any, scan func(scanner) (T, error),
	key func(*T) ledger.AccountKey, what string, yield func(*T) error) error {
	page := make([]T, 0, auditPage)
	first := fmt.Sprintf(q, "1")
	next := fmt.Sprintf(q, accountKeyAfter)
	var after ledger.AccountKey
	for n := 0; ; n++ {
		page = page[:0]
		var rows *sql.Rows
		var err error
		if n == 0 {
			rows, err = tx.QueryContext(ctx, first, append(slices.Clip(args), auditPage)...)
		} else {
			rows, err = tx.QueryContext(ctx, next, append(slices.Clip(args), after.Subject, after.Route, after.Region, int64(after.Generation), auditPage)...)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, translate(ctx, err))
		}
		for rows.Next() {
			v, err := scan(rows)
			if err != nil {
				rows.Close()
				return fmt.Errorf("%s: %w", what, translate(ctx, err))
			}
			page = append(page, v)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, translate(ctx, err))
		}
		for i := range page {
			if err := yield(&page[i]); err != nil {
				return err
			}
		}
		if len(page) < auditPage {
			return nil
		}
		after = key(&page[len(page)-1])
	}
}

// accountsByKey and checkpointAccountsByKey read the accounts and one
// checkpoint's accounts in key order, a page at a time (pagedByKey).
const (
	accountsByKey           = "SELECT " + accountCols + " FROM accounts WHERE %s ORDER BY subject, route, region, generation LIMIT ?"
	accountKeysByKey        = "SELECT subject, route, region, generation FROM accounts WHERE %s ORDER BY subject, route, region, generation LIMIT ?"
	checkpointAccountsByKey = "SELECT " + checkpointAccountCols + " FROM checkpoint_accounts WHERE seq = ? AND %s ORDER BY subject, route, region, generation LIMIT ?"
)

// keyScanner scans account keys (accountKeysByKey), keeping the route
// and the region of the key before when they repeat (most keys of a
// ledger share them): one string allocated per key, not three.
type keyScanner struct {
	route, region sql.RawBytes
	last          ledger.AccountKey
}

func (ks *keyScanner) scan(sc scanner) (ledger.AccountKey, error) {
	var (
		k          ledger.AccountKey
		generation int64
		c          codec.Conv
	)
	if err := sc.Scan(&k.Subject, &ks.route, &ks.region, &generation); err != nil {
		return k, err
	}
	k.Route, k.Region = ks.last.Route, ks.last.Region
	if string(ks.route) != k.Route {
		k.Route = string(ks.route)
	}
	if string(ks.region) != k.Region {
		k.Region = string(ks.region)
	}
	k.Generation = c.Uint(generation)
	ks.last = k
	return k, c.Err()
}

// accountScanner is scanAccount for a stream of many rows: the values
// are scanned into its own fields, reused from row to row (scanning into
// a fresh ledger.Account made each row escape whole, about 1 KB, and the
// blobs were copied first), and the route and the region kept when they
// repeat.
type accountScanner struct {
	keys                               keyScanner
	dims, epochStart, ver              int64
	balances, epochOpening, refilledTo sql.RawBytes
	held                               sql.RawBytes
	breaches                           int64
	subject                            string
	generation                         int64
}

func (as *accountScanner) scan(sc scanner) (ledger.Account, error) {
	var (
		a ledger.Account
		c codec.Conv
	)
	ks := &as.keys
	err := sc.Scan(&as.subject, &ks.route, &ks.region, &as.generation, &as.dims, &as.balances, &as.epochStart,
		&as.epochOpening, &as.refilledTo, &as.breaches, &as.ver, &as.held)
	if err != nil {
		return a, err
	}
	a.Key = ledger.AccountKey{Subject: as.subject, Route: ks.last.Route, Region: ks.last.Region}
	if string(ks.route) != a.Key.Route {
		a.Key.Route = string(ks.route)
	}
	if string(ks.region) != a.Key.Region {
		a.Key.Region = string(ks.region)
	}
	ks.last = a.Key
	a.Key.Generation = c.Uint(as.generation)
	a.Dims = c.Dims(as.dims)
	a.Balances = c.Balances(as.balances)
	a.EpochStart = c.Time(as.epochStart)
	a.EpochOpening = c.Balances(as.epochOpening)
	a.RefilledTo = c.Amounts(as.refilledTo)
	a.Breaches = as.breaches
	a.Version = c.Uint(as.ver)
	a.HeldElsewhere = heldElsewhereOf(&c, as.held)
	return a, c.Err()
}

// streamAccounts sets snap's account streams: the accounts and the last
// checkpoint's accounts, read in key order a page at a time in tx.
func streamAccounts(ctx context.Context, tx *sql.Tx, snap *ledger.Snapshot) {
	snap.AccountStream = func(yield func(*ledger.Account) error) error {
		var sc accountScanner
		return pagedByKey(ctx, tx, accountsByKey,
			nil, sc.scan, func(a *ledger.Account) ledger.AccountKey { return a.Key }, "snapshot accounts", yield)
	}
	snap.AccountKeyStream = func(yield func(*ledger.AccountKey) error) error {
		var sc keyScanner
		return pagedByKey(ctx, tx, accountKeysByKey,
			nil, sc.scan, func(k *ledger.AccountKey) ledger.AccountKey { return *k }, "snapshot account keys", yield)
	}
	if last := snap.LastCheckpoint(); last != nil {
		seq := last.Seq
		snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
			return pagedByKey(ctx, tx, checkpointAccountsByKey,
				[]any{seq}, scanCheckpointAccount, func(a *ledger.CheckpointAccount) ledger.AccountKey { return a.Account }, "snapshot checkpoint accounts", yield)
		}
	}
}

// JournalAfter implements store.CheckpointStore: one probe of
// journal_batches' key. Rows of the journal table (schema versions 1
// and 2) are at position 0, after none.
func (s *Store) JournalAfter(ctx context.Context, pos int64) (_ bool, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return false, errClosed
	}
	found, err := queryAll(ctx, s.reader("SELECT seq FROM journal_batches WHERE seq > ? LIMIT 1"),
		func(sc scanner) (int64, error) { var seq int64; err := sc.Scan(&seq); return seq, err }, "journal after", pos)
	return len(found) > 0, err
}

// JournalCompact implements store.CheckpointStore.
func (s *Store) JournalCompact(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("journal compaction: limit %d, want a positive one", limit)
	}
	deleted, behind, err := s.journalCompact(ctx, limit)
	if err == nil && deleted == 0 && behind {
		// The subject index's watermark holds back batches the
		// checkpoint summarises: flush it, and compact once more.
		if err := s.flushSubjects(ctx); err != nil {
			return 0, fmt.Errorf("journal compaction: %w", err)
		}
		deleted, _, err = s.journalCompact(ctx, limit)
	}
	return deleted, err
}

// journalCompact deletes up to limit journal rows the last checkpoint
// summarises, keeping the batches after subject_index_through, and
// reports whether any of them is one the checkpoint summarises.
func (s *Store) journalCompact(ctx context.Context, limit int) (int, bool, error) {
	var (
		deleted int64
		behind  bool
	)
	err := s.withWriter(ctx, func(w *writer) error {
		return s.inWriteTx(ctx, w, "journal compaction", func(tx *writeTx) error {
			var through, indexed int64
			found, err := tx.queryRow("SELECT c.through, m.value FROM checkpoints c, meta m WHERE m.name = '"+subjectIndexMeta+"'"+
				" ORDER BY c.seq DESC LIMIT 1", nil,
				func(sc scanner) error { return sc.Scan(&through, &indexed) })
			if err != nil || !found {
				return err
			}
			behind = indexed < through
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
				// The batches after subject_index_through stay too: Open
				// rebuilds the subject index from them (subjectindex.go).
				n, err = tx.exec(`DELETE FROM journal_batches WHERE seq IN (SELECT seq FROM journal_batches
					WHERE seq <= ? AND seq < (SELECT MAX(seq) FROM journal_batches) ORDER BY seq LIMIT ?)`, min(through, indexed), left)
				deleted += n
			}
			return err
		})
	})
	return int(deleted), behind, err
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

// query calls row with each row of q.
func (t *writeTx) query(q string, args []any, row func(scanner) error) error {
	st, err := t.w.stmt(t.ctx, q)
	if err != nil {
		return err
	}
	return t.w.query(t.ctx, st, args, row)
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
// it when f succeeds and rolls it back otherwise. w is the writer that
// withWriter lends, which makes the commit durable before it returns.
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
	// Counted like Tx.commit's COMMIT: a read from here on waits for the
	// Sync that withWriter runs after it (pipeline.go), unless f changed
	// nothing (beginCommit). Counting from BEGIN instead would hold every
	// read back for the whole transaction, though none sees its writes
	// before the COMMIT.
	seq := s.beginCommit(sctx, w)
	err := w.exec(sctx, w.commit, nil)
	s.endWrite(seq)
	if err != nil {
		_ = w.exec(sctx, w.rollback, nil)
		return fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	s.commits.Add(1) // the WAL checkpointer copies what this wrote
	return nil
}
