package sqlite

import (
	"context"
	"database/sql/driver"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// Retention rows (schema version 7): tombstones of removed reservations
// and the per-account totals of what was removed.

const (
	tombstoneCols = "id, request_digest, subject, route, region, generation, state, finished_at"
	retainedCols  = "subject, route, region, generation, reservations, spent, overdraft"
	// terminalStates must match the WHERE of the partial index
	// reservations_finished, literally.
	terminalStates = "state IN (3, 4, 5, 7)"
)

func init() {
	// The literal states of the partial index are the ledger's terminal
	// states; a build whose numbering moved fails every test here.
	for _, s := range []ledger.State{3, 4, 5, 7} {
		if !s.Terminal() {
			panic(fmt.Sprintf("state %d is not terminal: reservations_finished is stale", s))
		}
	}
}

var (
	tombstoneGetSQL     = "SELECT " + tombstoneCols + " FROM tombstones WHERE id = ?"
	retainedGetSQL      = "SELECT " + retainedCols + " FROM retained WHERE subject = ? AND route = ? AND region = ? AND generation = ?"
	retainedPutSQL      = upsertSQL("retained", retainedCols, "subject, route, region, generation")
	finishedSQL         = "SELECT id FROM reservations WHERE " + terminalStates + " AND finished_at <= ? ORDER BY finished_at, id LIMIT ?"
	tombstonesDueSQL    = "SELECT id FROM tombstones WHERE finished_at <= ? ORDER BY finished_at, id LIMIT ?"
	retainedSnapshotSQL = "SELECT " + retainedCols + " FROM retained ORDER BY subject, route, region, generation"
)

func scanTombstone(sc scanner) (ledger.Tombstone, error) {
	var (
		t               ledger.Tombstone
		generation      int64
		state, finished int64
	)
	if err := sc.Scan(&t.ID, &t.RequestDigest, &t.Account.Subject, &t.Account.Route, &t.Account.Region,
		&generation, &state, &finished); err != nil {
		return t, err
	}
	var conv codec.Conv
	t.Account.Generation = uint64(generation)
	t.State = ledger.State(state)
	t.FinishedAt = conv.Time(finished)
	return t, conv.Err()
}

func scanRetained(sc scanner) (ledger.Retained, error) {
	var (
		r                ledger.Retained
		generation       int64
		spent, overdraft []byte
	)
	if err := sc.Scan(&r.Account.Subject, &r.Account.Route, &r.Account.Region, &generation, &r.Reservations, &spent, &overdraft); err != nil {
		return r, err
	}
	r.Account.Generation = uint64(generation)
	var err error
	if r.Spent, err = codec.DecodeAmounts(spent); err != nil {
		return r, err
	}
	r.Overdraft, err = codec.DecodeAmounts(overdraft)
	return r, err
}

// stmt returns the write connection's prepared statement for q, preparing
// it on first use (retention's statements are kept apart from the hot
// path's numbered ones).
func (w *writer) stmt(ctx context.Context, q string) (driver.Stmt, error) {
	if st, ok := w.extra[q]; ok {
		return st, nil
	}
	st, err := w.conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	if w.extra == nil {
		w.extra = map[string]driver.Stmt{}
	}
	w.extra[q] = st
	return st, nil
}

func (tx *Tx) retentionGet(ctx context.Context, q, what string, args []any, scan func(scanner) (any, error)) (any, error) {
	if err := tx.check(ctx); err != nil {
		return nil, err
	}
	st, err := tx.w.stmt(stmtCtx(ctx), q)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, tx.err(ctx, err))
	}
	v, err := queryOneRow(stmtCtx(ctx), tx.w, st, args, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, tx.err(ctx, err))
	}
	return v, nil
}

// TombstoneGet returns the tombstone, or store.ErrNotFound.
func (tx *Tx) TombstoneGet(ctx context.Context, id string) (*ledger.Tombstone, error) {
	if t, ok := tx.tombs[id]; ok {
		if err := tx.check(ctx); err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fmt.Errorf("tombstone %s: %w", id, store.ErrNotFound)
		}
		out := *t
		return &out, nil
	}
	v, err := tx.retentionGet(ctx, tombstoneGetSQL, "tombstone "+id, []any{id},
		func(sc scanner) (any, error) { return scanTombstone(sc) })
	if err != nil {
		return nil, err
	}
	t := v.(ledger.Tombstone)
	return &t, nil
}

// RetainedGet returns the account's retained totals, or store.ErrNotFound.
func (tx *Tx) RetainedGet(ctx context.Context, key ledger.AccountKey) (*ledger.Retained, error) {
	if !storable(key.Generation) {
		return nil, fmt.Errorf("retained totals of %s: %w", key, store.ErrNotFound)
	}
	v, err := tx.retentionGet(ctx, retainedGetSQL, "retained totals of "+key.String(),
		[]any{key.Subject, key.Route, key.Region, int64(key.Generation)},
		func(sc scanner) (any, error) { return scanRetained(sc) })
	if err != nil {
		return nil, err
	}
	r := v.(ledger.Retained)
	return &r, nil
}

// retentionRun returns a function that runs retention statement q with
// args, prepared on first use, naming what in its error.
func (tx *Tx) retentionRun(ctx context.Context, conv *codec.Conv) func(q, what string, args []any) error {
	return func(q, what string, args []any) error {
		if err := conv.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		st, err := tx.w.stmt(stmtCtx(ctx), q)
		if err == nil {
			err = tx.w.exec(stmtCtx(ctx), st, args)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, tx.err(ctx, err))
		}
		return nil
	}
}

// deleteReservations deletes the reservation rows ids removed, with their
// subject index entries. write runs it before it writes the batch's
// reservations: a batch that retired an id and then admitted it again
// (store.RetentionChanges) inserts the new row once the old one is gone.
// Deletes run in id order, up to retentionChunk rows per statement (a
// retention page is mostly these): one statement per row cost a VDBE
// program's setup and a B-tree descent from the root per row, where in
// key order neighbours share the leaf the previous row left in the page
// cache.
func (tx *Tx) deleteReservations(ctx context.Context, removed []string) error {
	if len(removed) == 0 {
		return nil
	}
	var conv codec.Conv
	run := tx.retentionRun(ctx, &conv)
	ids := slices.Sorted(slices.Values(removed))
	args := make([]any, 0, min(len(ids), retentionChunk))
	return inChunks(len(ids), func(from, n int) error {
		args = args[:0]
		for _, id := range ids[from : from+n] {
			args = append(args, id)
			// The file holds no row of id now: a later write of it
			// in this transaction is not an update of what was read.
			delete(tx.storedReservations, id)
		}
		// The subject index's entries first, read from the rows
		// (those still pending are forgotten at Commit).
		if err := run(subjectDeleteSQL(n), fmt.Sprintf("delete the subject index entries of %d reservations from %s", n, ids[from]), args); err != nil {
			return err
		}
		return run(reservationDelSQL(n), fmt.Sprintf("delete %d reservations from %s", n, ids[from]), args)
	})
}

// writeRetention writes c's retention changes but for the removed
// reservations (deleteReservations): tombstones inserted (ErrDuplicate
// for an id that has one) or deleted, retained totals upserted, in id
// order, in chunks as deleteReservations does.
func (tx *Tx) writeRetention(ctx context.Context, c *store.RetentionChanges) error {
	if len(c.Tombstones) == 0 && len(c.RemovedTombstones) == 0 && len(c.Retained) == 0 {
		return nil
	}
	var conv codec.Conv
	run := tx.retentionRun(ctx, &conv)
	var args []any
	if len(c.Tombstones) > 0 {
		tombs := slices.SortedFunc(slices.Values(c.Tombstones), func(a, b ledger.Tombstone) int { return strings.Compare(a.ID, b.ID) })
		err := inChunks(len(tombs), func(from, n int) error {
			args = args[:0]
			for i := range tombs[from : from+n] {
				t := &tombs[from+i]
				args = append(args, t.ID, t.RequestDigest, t.Account.Subject, t.Account.Route,
					t.Account.Region, conv.Int(t.Account.Generation), int64(t.State), conv.Nanos(t.FinishedAt))
			}
			return run(tombstoneInsertSQL(n), fmt.Sprintf("insert %d tombstones from %s", n, tombs[from].ID), args)
		})
		if err != nil {
			return err
		}
	}
	if ids := slices.Sorted(slices.Values(c.RemovedTombstones)); len(ids) > 0 {
		err := inChunks(len(ids), func(from, n int) error {
			args = args[:0]
			for _, id := range ids[from : from+n] {
				args = append(args, id)
			}
			return run(tombstoneDeleteSQL(n), fmt.Sprintf("delete %d tombstones from %s", n, ids[from]), args)
		})
		if err != nil {
			return err
		}
	}
	for i := range c.Retained {
		r := &c.Retained[i]
		if err := run(retainedPutSQL, "retained totals of "+r.Account.String(), []any{r.Account.Subject, r.Account.Route, r.Account.Region,
			conv.Int(r.Account.Generation), r.Reservations, codec.EncodeAmounts(&r.Spent), codec.EncodeAmounts(&r.Overdraft)}); err != nil {
			return err
		}
	}
	return nil
}

// retentionChunk is the most rows one retention statement deletes or
// inserts.
const retentionChunk = 64

// inChunks calls f with consecutive pieces [from, from+n) of n items:
// retentionChunk rows at a time, the rest in pieces of a power of two,
// so that a handful of statement texts (prepared once each) serve every
// page size.
func inChunks(n int, f func(from, n int) error) error {
	for from := 0; from < n; {
		k := retentionChunk
		for k > n-from {
			k /= 2
		}
		if err := f(from, k); err != nil {
			return err
		}
		from += k
	}
	return nil
}

func reservationDelSQL(n int) string {
	return "DELETE FROM reservations WHERE id IN (" + params(n) + ")"
}

func tombstoneDeleteSQL(n int) string {
	return "DELETE FROM tombstones WHERE id IN (" + params(n) + ")"
}

func tombstoneInsertSQL(n int) string {
	return "INSERT INTO tombstones (" + tombstoneCols + ") VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?), ", n), ", ")
}

// ReservationsFinished returns up to limit ids of terminal reservations
// finished at or before before, in (finished_at, id) order, through the
// partial index reservations_finished.
func (s *Store) ReservationsFinished(ctx context.Context, before time.Time, limit int) (_ []string, err error) {
	defer s.readBarrier(ctx, &err)
	return s.retentionIDs(ctx, finishedSQL, "finished reservations", before, limit)
}

// TombstonesDue returns up to limit ids of tombstones of reservations
// finished at or before before, in (finished_at, id) order, through the
// index tombstones_finished.
func (s *Store) TombstonesDue(ctx context.Context, before time.Time, limit int) (_ []string, err error) {
	defer s.readBarrier(ctx, &err)
	return s.retentionIDs(ctx, tombstonesDueSQL, "tombstones due", before, limit)
}

func (s *Store) retentionIDs(ctx context.Context, q, what string, before time.Time, limit int) ([]string, error) {
	if s.closed.Load() {
		return nil, errClosed
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%s: limit %d, want a positive one", what, limit)
	}
	var conv codec.Conv
	cutoff := conv.Nanos(before)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rows, err := s.readDB.QueryContext(ctx, q, cutoff, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		id, err := scanID(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	return out, nil
}

// TombstoneGet returns the committed tombstone, or store.ErrNotFound.
func (s *Store) TombstoneGet(ctx context.Context, id string) (_ ledger.Tombstone, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return ledger.Tombstone{}, errClosed
	}
	t, err := scanTombstone(s.readDB.QueryRowContext(ctx, tombstoneGetSQL, id))
	if err != nil {
		return ledger.Tombstone{}, fmt.Errorf("tombstone %s: %w", id, translate(ctx, err))
	}
	return t, nil
}

// prefetchTombstones reads the tombstones of the prefetched ids that have
// no reservation row in statements of up to prefetchChunk ids, so that a
// batch of new reserves looks its tombstones up in one statement, not one
// each.
func (tx *Tx) prefetchTombstones(ctx context.Context, ids []string, found map[string]*ledger.Reservation) error {
	var missing []string
	for _, id := range ids {
		if found[id] == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	tombs := make(map[string]*ledger.Tombstone, len(missing))
	st, err := tx.w.stmt(stmtCtx(ctx), tombstonePrefetchSQL)
	if err != nil {
		return fmt.Errorf("prefetch tombstones: %w", tx.err(ctx, err))
	}
	args := make([]any, prefetchChunk)
	for start := 0; start < len(missing); start += prefetchChunk {
		chunk := missing[start:min(start+prefetchChunk, len(missing))]
		for i := range args {
			args[i] = chunk[min(i, len(chunk)-1)] // IN ignores repeats
		}
		err := tx.w.query(stmtCtx(ctx), st, args, func(sc scanner) error {
			t, err := scanTombstone(sc)
			if err != nil {
				return err
			}
			tombs[t.ID] = &t
			return nil
		})
		if err != nil {
			return fmt.Errorf("prefetch tombstones: %w", tx.err(ctx, err))
		}
	}
	for _, id := range missing {
		if _, ok := tombs[id]; !ok {
			tombs[id] = nil
		}
	}
	tx.tombs = tombs
	return nil
}

var tombstonePrefetchSQL = "SELECT " + tombstoneCols + " FROM tombstones WHERE id IN (" + params(prefetchChunk) + ")"

// shardFencesIdleSQL lists the gateways of fence rows with no shard
// expiring after the cutoff: the shards' live gateways are read once
// (NOT IN over a subquery without outer references), not per fence row.
const shardFencesIdleSQL = `SELECT substr(name, length('` + ledger.MetaShardFencePrefix + `') + 1) FROM meta
WHERE substr(name, 1, length('` + ledger.MetaShardFencePrefix + `')) = '` + ledger.MetaShardFencePrefix + `'
  AND substr(name, length('` + ledger.MetaShardFencePrefix + `') + 1) NOT IN (SELECT gateway_id FROM shards WHERE expires_at > ?)
ORDER BY name LIMIT ?`

// ShardFencesIdle returns the gateways that have a fence row and no
// shard expiring after before, in id order (store.RetentionStore).
func (s *Store) ShardFencesIdle(ctx context.Context, before time.Time, limit int) (_ []string, err error) {
	defer s.readBarrier(ctx, &err)
	return s.retentionIDs(ctx, shardFencesIdleSQL, "idle shard fences", before, limit)
}

// statementsRemoveSQL deletes a page of the statements due, found
// through statements_by_end (whose entries carry the rowid, seq).
const statementsRemoveSQL = "DELETE FROM statements WHERE seq IN (SELECT seq FROM statements WHERE epoch_end <= ? ORDER BY epoch_end, seq LIMIT ?)"

// StatementsRemove deletes up to limit statements whose epoch ended at
// or before before, the earliest ended first (store.RetentionStore), in
// one write transaction. Deleting the newest rows would let SQLite hand
// their seq out again (a rowid, max+1); the next statement still sorts
// after every kept one, which is all Snapshot's order needs.
func (s *Store) StatementsRemove(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("statement retention: limit %d, want a positive one", limit)
	}
	var conv codec.Conv
	end := conv.Nanos(before)
	if err := conv.Err(); err != nil {
		return 0, fmt.Errorf("statement retention: %w", err)
	}
	var deleted int64
	err := s.withWriter(ctx, func(w *writer) error {
		return s.inWriteTx(ctx, w, "statement retention", func(tx *writeTx) error {
			n, err := tx.exec(statementsRemoveSQL, end, int64(limit))
			deleted = n
			return err
		})
	})
	return int(deleted), err
}
