package sqlite

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// Retention of settled emergency shards (schema version 18): the index
// shards_reconciled finds the candidates; the retained shard totals are
// meta rows, read by prefix.
const (
	// The literal 1 matches the partial index shards_reconciled.
	shardsReconciledSQL      = "SELECT " + shardCols + " FROM shards WHERE reconciled = 1 AND expires_at <= ? ORDER BY expires_at, id LIMIT ?"
	shardsReconciledAfterSQL = "SELECT " + shardCols + " FROM shards WHERE reconciled = 1 AND expires_at <= ? AND (expires_at, id) > (?, ?) " +
		"ORDER BY expires_at, id LIMIT ?"
	// A generation's unreconciled shards (schema version 22): a range of
	// the partial index shards_unreconciled, which the literal 0 matches.
	shardsUnreconciledSQL = "SELECT " + shardCols + " FROM shards WHERE reconciled = 0 AND generation = ? AND id > ? ORDER BY id LIMIT ?"
	metaNamesSQL          = "SELECT name FROM meta WHERE name >= ? AND name < ? ORDER BY name LIMIT ?"
	metaPrefixSQL         = "SELECT name, value FROM meta WHERE name >= ? AND name < ? ORDER BY name"
	shardsDeleteSQL       = "DELETE FROM shards WHERE id = ?"
	shardRemovedWhat      = "delete shard "
)

// ShardsReconciled returns up to limit reconciled shards expiring at or
// before before, after the cursor in (expires_at, id) order, through the
// index shards_reconciled (store.ShardRetentionStore).
func (s *Store) ShardsReconciled(ctx context.Context, after store.ShardCursor, before time.Time, limit int) (_ []ledger.Shard, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if limit <= 0 {
		return nil, fmt.Errorf("reconciled shards: limit %d, want a positive one", limit)
	}
	var conv codec.Conv
	cutoff := conv.Nanos(before)
	q, args := shardsReconciledSQL, []any{cutoff, limit}
	if after != (store.ShardCursor{}) {
		q, args = shardsReconciledAfterSQL, []any{cutoff, conv.Nanos(after.ExpiresAt), after.ID, limit}
	}
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reconciled shards: %w", err)
	}
	return queryAll(ctx, dbQuery{s.readDB, q}, scanShard, "reconciled shards", args...)
}

// ShardsUnreconciled returns up to f.Limit unreconciled shards of
// f.Generation with ids after f.After, in id order, through the index
// shards_unreconciled (store.Store).
func (s *Store) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) (_ []ledger.Shard, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("unreconciled shards: limit %d, want a positive one", f.Limit)
	}
	if f.Generation > math.MaxInt64 {
		return nil, nil
	}
	return queryAll(ctx, dbQuery{s.readDB, shardsUnreconciledSQL}, scanShard, "unreconciled shards", int64(f.Generation), f.After, f.Limit)
}

// MetaNames returns up to limit meta names that begin with prefix, in
// name order, from the key range of the prefix (store.ShardRetentionStore).
func (s *Store) MetaNames(ctx context.Context, prefix string, limit int) (_ []string, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	end := store.PrefixEnd(prefix)
	if limit <= 0 || end == "" {
		return nil, fmt.Errorf("meta names %q: limit %d, want a prefix below 0xff bytes and a positive limit", prefix, limit)
	}
	return queryAll(ctx, dbQuery{s.readDB, metaNamesSQL}, scanID, "meta names "+prefix, prefix, end, limit)
}

// deleteShards deletes the shard rows retention removed; Write runs it
// after it writes the batch's shards.
func (tx *Tx) deleteShards(ctx context.Context, conv *codec.Conv, ids []string) error {
	run := tx.retentionRun(ctx, conv)
	for _, id := range ids {
		if err := run(shardsDeleteSQL, shardRemovedWhat+id, []any{id}); err != nil {
			return err
		}
	}
	return nil
}

// retainedShards reads the retained shard totals from their meta rows,
// by account key.
func retainedShards(ctx context.Context, q queryer) ([]ledger.RetainedShards, error) {
	type row struct {
		name  string
		value int64
	}
	rows, err := queryAll(ctx, q, func(sc scanner) (row, error) {
		var r row
		err := sc.Scan(&r.name, &r.value)
		return r, err
	}, "snapshot retained shards", ledger.MetaShardRetainedPrefix, store.PrefixEnd(ledger.MetaShardRetainedPrefix))
	if err != nil {
		return nil, err
	}
	by := map[ledger.AccountKey]*ledger.RetainedShards{}
	for _, r := range rows {
		ledger.ParseRetainedShards(by, r.name, r.value)
	}
	return ledger.SortedRetainedShards(by), nil
}
