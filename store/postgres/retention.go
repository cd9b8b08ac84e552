package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Retention rows (schema version 8): tombstones of removed reservations
// and the per-account totals of what was removed.
//
// Locks: a tombstone is immutable (written once by retire, deleted once by
// forget) and read without a lock, like a move; a reservation's row lock
// already orders a retire against every other command on the id. The
// retained row of an account is read-modify-written, so it is locked, at
// rankRetained: after every account in the lock order.

// rankRetained ranks retained rows after accounts (rankAccount) in the
// fixed lock order, below the share-locked tags.
const rankRetained uint8 = 50

func retainedRow(k ledger.AccountKey) rowKey {
	return rowKey{rank: rankRetained, a: k.Subject, b: k.Route, c: k.Region, generation: k.Generation}
}

const (
	tombstoneSelect       = `SELECT id, request_digest, subject, route, region, generation, state, finished_at FROM tombstones`
	tombstonesPrefetchSQL = tombstoneSelect + ` WHERE id = ANY($1)`
	retainedSelect        = `SELECT subject, route, region, generation, reservations, spent, overdraft FROM retained`

	sqlReservationsDelete = `DELETE FROM reservations WHERE id = ANY($1)`
	sqlTombstonesInsert   = `INSERT INTO tombstones (id, request_digest, subject, route, region, generation, state, finished_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::smallint[], $8::bigint[])`
	sqlTombstonesDelete = `DELETE FROM tombstones WHERE id = ANY($1)`
	sqlRetainedInsert   = `INSERT INTO retained (subject, route, region, generation, reservations, spent, overdraft)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`
	sqlRetainedUpdate = `UPDATE retained SET reservations = $5, spent = $6, overdraft = $7
		WHERE subject = $1 AND route = $2 AND region = $3 AND generation = $4`

	// The state literals match the partial index reservations_finished.
	sqlFinished      = `SELECT id FROM reservations WHERE state IN (3, 4, 5, 7) AND finished_at <= $1 ORDER BY finished_at, id LIMIT $2`
	sqlTombstonesDue = `SELECT id FROM tombstones WHERE finished_at <= $1 ORDER BY finished_at, id LIMIT $2`
)

func scanTombstone(row pgx.Row) (*ledger.Tombstone, error) {
	var (
		t                    ledger.Tombstone
		generation, finished int64
		state                int16
	)
	if err := row.Scan(&t.ID, &t.RequestDigest, &t.Account.Subject, &t.Account.Route, &t.Account.Region,
		&generation, &state, &finished); err != nil {
		return nil, err
	}
	var conv codecConv
	t.Account.Generation = conv.Uint(generation)
	t.State = ledger.State(state)
	t.FinishedAt = conv.Time(finished)
	return &t, conv.Err()
}

func scanRetained(row pgx.Row) (*ledger.Retained, error) {
	var (
		r                ledger.Retained
		generation       int64
		spent, overdraft []int64
	)
	if err := row.Scan(&r.Account.Subject, &r.Account.Route, &r.Account.Region, &generation, &r.Reservations, &spent, &overdraft); err != nil {
		return nil, err
	}
	if len(spent) != ledger.MaxDimensions || len(overdraft) != ledger.MaxDimensions {
		return nil, fmt.Errorf("retained totals of %s: %d and %d amounts", r.Account, len(spent), len(overdraft))
	}
	var conv codecConv
	r.Account.Generation = conv.Uint(generation)
	copy(r.Spent[:], spent)
	copy(r.Overdraft[:], overdraft)
	return &r, conv.Err()
}

func (s *Store) tombstoneGet(ctx context.Context, q querier, id string) (*ledger.Tombstone, error) {
	t, err := scanTombstone(q.QueryRow(ctx, tombstoneSelect+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("tombstone " + id)
	}
	if err != nil {
		return nil, s.c.classify("tombstone "+id, err, false)
	}
	return t, nil
}

// TombstoneGet returns the tombstone (not locked: it is immutable), or
// ErrNotFound.
func (t *tx) TombstoneGet(ctx context.Context, id string) (*ledger.Tombstone, error) {
	if t.done {
		return nil, fmt.Errorf("tombstone: %w", pgx.ErrTxClosed)
	}
	if tb, ok := t.tombs[id]; ok {
		if tb == nil {
			return nil, notFound("tombstone " + id)
		}
		copied := *tb
		return &copied, nil
	}
	return t.s.tombstoneGet(ctx, t.tx, id)
}

// prefetchTombstones reads, in one query, the tombstones of the prefetched
// ids that have no reservation row, so that the tombstone lookup of a
// batch's new reserves costs one round trip, not one per reserve.
// Tombstones are immutable, so what it read stays true for the
// transaction (a forget racing it only makes a replay answer where a new
// reserve could have been).
func (t *tx) prefetchTombstones(ctx context.Context, ids []string, found map[string]*ledger.Reservation) error {
	var missing []string
	for _, id := range ids {
		if found[id] == nil {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	read := make(map[string]*ledger.Tombstone, len(missing))
	err := t.queryLookup(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			tb, err := scanTombstone(rows)
			if err != nil {
				return err
			}
			read[tb.ID] = tb
		}
		return nil
	}, tombstonesPrefetchSQL, missing)
	if err != nil {
		return t.s.c.classify("tombstones prefetch", err, false)
	}
	if t.tombs == nil {
		t.tombs = make(map[string]*ledger.Tombstone, len(missing))
	}
	for _, id := range missing {
		t.tombs[id] = read[id]
	}
	return nil
}

// RetainedGet returns the account's retained totals, locked, or
// ErrNotFound (remembered, so Write inserts the row and a concurrent
// creator surfaces as ErrDuplicate instead of being overwritten).
func (t *tx) RetainedGet(ctx context.Context, key ledger.AccountKey) (*ledger.Retained, error) {
	if t.done {
		return nil, fmt.Errorf("retained: %w", pgx.ErrTxClosed)
	}
	k := retainedRow(key)
	var conv codecConv
	g := conv.Int(key.Generation)
	if conv.Err() != nil {
		return nil, t.result(k, notFound("retained totals of "+key.String()))
	}
	mode, err := t.lockMode(ctx, k)
	if err != nil {
		return nil, err
	}
	r, err := scanRetained(t.tx.QueryRow(ctx, retainedSelect+` WHERE subject = $1 AND route = $2 AND region = $3 AND generation = $4`+
		mode.clause(""), key.Subject, key.Route, key.Region, g))
	if errors.Is(err, pgx.ErrNoRows) {
		err = notFound("retained totals of " + key.String())
	} else if err != nil {
		err = t.s.c.classify("retained totals of "+key.String(), err, false)
	}
	return r, t.result(k, err)
}

// deleteReservations queues the deletion of the reservation rows ids
// retention removed. Write queues it before the batch's reservation
// writes: a batch that retired an id and then admitted it again
// (store.RetentionChanges) inserts the new row once the old one is gone.
func (t *tx) deleteReservations(w *batchWriter, ids []string) {
	if len(ids) > 0 {
		w.queueLookup("delete reservations", sqlReservationsDelete, ids)
	}
}

// writeRetention queues c's retention changes on w, but for the removed
// reservations (deleteReservations).
func (t *tx) writeRetention(w *batchWriter, c *store.RetentionChanges) {
	if n := len(c.Tombstones); n > 0 {
		var (
			id, digest, subject, route, region = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			generation, finished               = make([]int64, n), make([]int64, n)
			state                              = make([]int16, n)
		)
		for i := range c.Tombstones {
			tb := &c.Tombstones[i]
			id[i], digest[i], subject[i], route[i], region[i] = tb.ID, tb.RequestDigest, tb.Account.Subject, tb.Account.Route, tb.Account.Region
			generation[i], state[i], finished[i] = w.conv.Int(tb.Account.Generation), int16(tb.State), w.conv.Nanos(tb.FinishedAt)
		}
		w.queue("insert tombstones", sqlTombstonesInsert, id, digest, subject, route, region, generation, state, finished)
	}
	if len(c.RemovedTombstones) > 0 {
		w.queueLookup("delete tombstones", sqlTombstonesDelete, c.RemovedTombstones)
	}
	for i := range c.Retained {
		r := &c.Retained[i]
		q := sqlRetainedUpdate
		if t.absent[retainedRow(r.Account)] {
			q = sqlRetainedInsert
		}
		w.queue("retained "+r.Account.String(), q, r.Account.Subject, r.Account.Route, r.Account.Region,
			w.conv.Int(r.Account.Generation), r.Reservations, r.Spent[:], r.Overdraft[:])
	}
}

// retentionWritten updates what the transaction knows after c was stored.
func (t *tx) retentionWritten(c *store.RetentionChanges) {
	t.tombs = nil
	for i := range c.Retained {
		delete(t.absent, retainedRow(c.Retained[i].Account))
	}
}

// ReservationsFinished returns up to limit ids of terminal reservations
// finished at or before before, in (finished_at, id) order, through the
// partial index reservations_finished.
func (s *Store) ReservationsFinished(ctx context.Context, before time.Time, limit int) ([]string, error) {
	return s.retentionIDs(ctx, sqlFinished, "finished reservations", before, limit)
}

// TombstonesDue returns up to limit ids of tombstones of reservations
// finished at or before before, in (finished_at, id) order, through the
// index tombstones_finished.
func (s *Store) TombstonesDue(ctx context.Context, before time.Time, limit int) ([]string, error) {
	return s.retentionIDs(ctx, sqlTombstonesDue, "tombstones due", before, limit)
}

func (s *Store) retentionIDs(ctx context.Context, q, what string, before time.Time, limit int) ([]string, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("%s: limit %d, want a positive one", what, limit)
	}
	var conv codecConv
	cutoff := conv.Nanos(before)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rows, err := s.pool.Query(ctx, q, cutoff, limit)
	if err != nil {
		return nil, s.c.classify(what, err, false)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return ids, s.c.classify(what, err, false)
}

// TombstoneGet returns the committed tombstone, or ErrNotFound.
func (s *Store) TombstoneGet(ctx context.Context, id string) (ledger.Tombstone, error) {
	t, err := s.tombstoneGet(ctx, s.pool, id)
	if err != nil {
		return ledger.Tombstone{}, err
	}
	return *t, nil
}

// retainedList reads every account's retained totals, by key.
func (s *Store) retainedList(ctx context.Context, q querier) ([]ledger.Retained, error) {
	rows, err := q.Query(ctx, retainedSelect+` ORDER BY subject, route, region, generation`)
	if err != nil {
		return nil, s.c.classify("retained", err, false)
	}
	defer rows.Close()
	var out []ledger.Retained
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		r, err := scanRetained(rows)
		if err != nil {
			return nil, s.c.classify("retained", err, false)
		}
		out = append(out, *r)
	}
	return out, s.c.classify("retained", rows.Err(), false)
}

// sqlShardFencesIdle lists the gateways of fence rows with no shard
// expiring after the cutoff ($1), in bytes order: the fence rows are the
// key range of their prefix in meta_name_bytes (the prefix, ASCII, ends
// in '/', so the range ends at '0'), and the shards' live gateways are
// read once (a hashed NOT IN subplan), not per fence row.
const sqlShardFencesIdle = `SELECT substr(name, length('` + ledger.MetaShardFencePrefix + `') + 1) FROM meta
WHERE name COLLATE "C" >= '` + ledger.MetaShardFencePrefix + `'
  AND name COLLATE "C" < '` + shardFencePrefixEnd + `'
  AND substr(name, length('` + ledger.MetaShardFencePrefix + `') + 1) NOT IN (SELECT gateway_id FROM shards WHERE expires_at > $1)
ORDER BY name COLLATE "C" LIMIT $2`

// shardFencePrefixEnd is store.PrefixEnd(ledger.MetaShardFencePrefix),
// written out for the constant query (a test checks they agree).
const shardFencePrefixEnd = "shard_fence0"

// ShardFencesIdle returns the gateways that have a fence row and no
// shard expiring after before, in id order (store.RetentionStore).
func (s *Store) ShardFencesIdle(ctx context.Context, before time.Time, limit int) ([]string, error) {
	return s.retentionIDs(ctx, sqlShardFencesIdle, "idle shard fences", before, limit)
}

// sqlStatementsRemove deletes a page of the statements due, found through
// statements_by_end, with their term rows: one statement, so one
// transaction (the foreign key from statement_terms is checked at its
// end, when both are gone).
const sqlStatementsRemove = `WITH due AS (
		SELECT id FROM statements WHERE epoch_end <= $1 ORDER BY epoch_end, id LIMIT $2),
	terms AS (DELETE FROM statement_terms WHERE statement_id IN (SELECT id FROM due))
	DELETE FROM statements WHERE id IN (SELECT id FROM due)`

// StatementsRemove deletes up to limit statements whose epoch ended at
// or before before, the earliest ended first, with their terms
// (store.RetentionStore).
func (s *Store) StatementsRemove(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("statement retention: limit %d, want a positive one", limit)
	}
	var conv codecConv
	end := conv.Nanos(before)
	if err := conv.Err(); err != nil {
		return 0, fmt.Errorf("statement retention: %w", err)
	}
	tag, err := s.pool.Exec(ctx, sqlStatementsRemove, end, limit)
	if err != nil {
		return 0, s.c.classify("statement retention", err, true)
	}
	return int(tag.RowsAffected()), nil
}
