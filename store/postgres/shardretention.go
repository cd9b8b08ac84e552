package postgres

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Retention of settled emergency shards (schema version 17): the partial
// index shards_reconciled finds the candidates; the retained shard totals
// are meta rows (ledger.MetaShardRetainedPrefix), read by prefix.
const (
	sqlShardsReconciled      = shardSelect + ` WHERE reconciled AND expires_at <= $1 ORDER BY expires_at, id LIMIT $2`
	sqlShardsReconciledAfter = shardSelect + ` WHERE reconciled AND expires_at <= $1 AND (expires_at, id) > ($2, $3)
	ORDER BY expires_at, id LIMIT $4`
	// A generation's unreconciled shards (schema version 21): a range of
	// the partial index shards_unreconciled.
	sqlShardsUnreconciled = shardSelect + ` WHERE NOT reconciled AND generation = $1 AND id > $2 ORDER BY id LIMIT $3`
	// A prefix of meta names is read as the key range [$1, $2) of the
	// index meta_name_bytes (schema 18), names compared as bytes whatever
	// the database's collation; $2 is store.PrefixEnd($1).
	sqlMetaNames    = `SELECT name FROM meta WHERE ` + metaNameInRange + ` ORDER BY name COLLATE "C" LIMIT $3`
	sqlMetaPrefix   = `SELECT name, value FROM meta WHERE ` + metaNameInRange
	metaNameInRange = `name COLLATE "C" >= $1 AND name COLLATE "C" < $2`
	sqlShardsDelete = `DELETE FROM shards WHERE id = ANY($1)`
)

// ShardsReconciled returns up to limit reconciled shards expiring at or
// before before, after the cursor in (expires_at, id) order, through the
// partial index shards_reconciled (store.ShardRetentionStore).
func (s *Store) ShardsReconciled(ctx context.Context, after store.ShardCursor, before time.Time, limit int) ([]ledger.Shard, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("reconciled shards: limit %d, want a positive one", limit)
	}
	var conv codecConv
	cutoff := conv.Nanos(before)
	q, args := sqlShardsReconciled, []any{cutoff, limit}
	if after != (store.ShardCursor{}) {
		q, args = sqlShardsReconciledAfter, []any{cutoff, conv.Nanos(after.ExpiresAt), after.ID, limit}
	}
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reconciled shards: %w", err)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, s.c.classify("reconciled shards", err, false)
	}
	defer rows.Close()
	var out []ledger.Shard
	for rows.Next() {
		sh, err := scanShard(rows)
		if err != nil {
			return nil, s.c.classify("reconciled shards", err, false)
		}
		out = append(out, *sh)
	}
	return out, s.c.classify("reconciled shards", rows.Err(), false)
}

// ShardsUnreconciled returns up to f.Limit unreconciled shards of
// f.Generation with ids after f.After, in id order, through the partial
// index shards_unreconciled (store.Store).
func (s *Store) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("unreconciled shards: limit %d, want a positive one", f.Limit)
	}
	if f.Generation > math.MaxInt64 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, sqlShardsUnreconciled, int64(f.Generation), f.After, f.Limit)
	if err != nil {
		return nil, s.c.classify("unreconciled shards", err, false)
	}
	defer rows.Close()
	var out []ledger.Shard
	for rows.Next() {
		sh, err := scanShard(rows)
		if err != nil {
			return nil, s.c.classify("unreconciled shards", err, false)
		}
		out = append(out, *sh)
	}
	return out, s.c.classify("unreconciled shards", rows.Err(), false)
}

// MetaNames returns up to limit meta names that begin with prefix, in
// bytes order (store.ShardRetentionStore).
func (s *Store) MetaNames(ctx context.Context, prefix string, limit int) ([]string, error) {
	if limit <= 0 || prefix == "" {
		return nil, fmt.Errorf("meta names %q: limit %d, want a prefix and a positive limit", prefix, limit)
	}
	end := store.PrefixEnd(prefix)
	if end == "" {
		return nil, fmt.Errorf("meta names %q: no text follows every name with this prefix", prefix)
	}
	rows, err := s.pool.Query(ctx, sqlMetaNames, prefix, end, limit)
	if err != nil {
		return nil, s.c.classify("meta names "+prefix, err, false)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return names, s.c.classify("meta names "+prefix, err, false)
}

// deleteShards queues the deletion of the shard rows retention removed;
// Write queues it after the batch's shard writes.
func (t *tx) deleteShards(w *batchWriter, ids []string) {
	if len(ids) > 0 {
		w.queueLookup("delete shards", sqlShardsDelete, ids)
	}
}

// retainedShardsList reads the retained shard totals from their meta
// rows, by account key.
func (s *Store) retainedShardsList(ctx context.Context, q querier) ([]ledger.RetainedShards, error) {
	end := store.PrefixEnd(ledger.MetaShardRetainedPrefix)
	rows, err := q.Query(ctx, sqlMetaPrefix, ledger.MetaShardRetainedPrefix, end)
	if err != nil {
		return nil, s.c.classify("retained shards", err, false)
	}
	defer rows.Close()
	by := map[ledger.AccountKey]*ledger.RetainedShards{}
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		var (
			name  string
			value int64
		)
		if err := rows.Scan(&name, &value); err != nil {
			return nil, s.c.classify("retained shards", err, false)
		}
		ledger.ParseRetainedShards(by, name, value)
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("retained shards", err, false)
	}
	return ledger.SortedRetainedShards(by), nil
}
