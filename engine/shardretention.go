package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

const (
	// shardRemovePage is how many reconciled shards one read of
	// ShardsRemove lists.
	shardRemovePage = 64
	// shardRemoveRows bounds the meta rows one transaction of
	// ShardsRemove deletes (a shard's three and its receipts'): a page
	// is committed in as many transactions as it needs. Besides them it
	// writes the retained shard totals of the shards' accounts, at most
	// 14 rows an account, at most 64 accounts (a page).
	shardRemoveRows = 1024
	// shardUnknownNames is the most receipt counters a shard may have to
	// be removed: a shard whose gateway left more receipts unknown is
	// kept, so one transaction stays bounded.
	shardUnknownNames = shardRemoveRows
)

// ShardsRemove removes the emergency shards that are settled
// (ledger.ShardSettled: reconciled, nothing left unknown) and ended at or
// before before, with their meta rows, folding their totals into their
// accounts' retained shard totals (ledger.RemoveShards decides each, in
// the transaction that removes it). It reads reconciled shards by expiry
// (store.ShardsReconciled) page by page after a cursor, so shards it
// keeps (work still unknown) do not hold up the ones behind them, and
// commits transactions of at most shardRemoveRows meta rows. It is safe
// in any interleaving with reconciliations and with another replica
// removing the same shards. After each transaction it calls pause (when
// not nil) with the time the transaction took, and stops when pause
// returns false. It returns how many shards it removed, and the first
// error (the rest is left to the next pass).
func (c *Core) ShardsRemove(ctx context.Context, before time.Time, page int, pause func(took time.Duration) bool) (int, error) {
	total := 0
	var after store.ShardCursor
	commit := func(ids []string, unknown map[string][]string) (bool, error) {
		started := time.Now()
		n, err := c.removeShards(ctx, ids, before, unknown)
		total += n
		if err != nil {
			return false, err
		}
		return pause == nil || pause(time.Since(started)), nil
	}
	for ctx.Err() == nil {
		shards, err := c.store.ShardsReconciled(ctx, after, before, page)
		if err != nil {
			return total, fmt.Errorf("reconciled shards: %w", err)
		}
		if len(shards) == 0 {
			return total, nil
		}
		last := &shards[len(shards)-1]
		after = store.ShardCursor{ExpiresAt: last.ExpiresAt, ID: last.ID}
		var ids []string
		unknown := map[string][]string{}
		rows := 0
		for i := range shards {
			s := &shards[i]
			if !ledger.ShardSettled(s) {
				continue
			}
			names, err := c.store.MetaNames(ctx, ledger.ShardUnknownPrefix(s.ID), shardUnknownNames+1)
			if err != nil {
				return total, fmt.Errorf("receipts of shard %s: %w", s.ID, err)
			}
			if len(names) > shardUnknownNames {
				continue
			}
			if rows+3+len(names) > shardRemoveRows && len(ids) > 0 {
				if more, err := commit(ids, unknown); err != nil || !more {
					return total, err
				}
				ids, unknown, rows = nil, map[string][]string{}, 0
			}
			ids = append(ids, s.ID)
			unknown[s.ID] = names
			rows += 3 + len(names)
		}
		if len(ids) > 0 {
			if more, err := commit(ids, unknown); err != nil || !more {
				return total, err
			}
		}
		if len(shards) < page {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// removeShards commits one transaction of ShardsRemove.
func (c *Core) removeShards(ctx context.Context, ids []string, before time.Time, unknown map[string][]string) (int, error) {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("remove shards: %w", err)
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 0)
	n := ledger.RemoveShards(book, ids, before, unknown)
	if err := book.Err(); err != nil {
		return 0, fmt.Errorf("remove shards: read: %w", err)
	}
	if changes := book.Changes(); !changes.Empty() {
		if err := tx.Write(ctx, changes); err != nil {
			return 0, fmt.Errorf("remove shards: write: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("remove shards: %w", err)
	}
	return n, nil
}

// removeShards is the retention pass's step over emergency shards: those
// settled and ended a retention window ago, a transaction at a time,
// paced as the pass's pages are (half the time idle, MaintenanceShare
// while gateways are admitted, at least RetentionPause apart). It
// returns how many it removed.
func (e *Engine) removeShards(ctx context.Context) int {
	var pace *pacer // made at the first transaction: a pass with no shard to remove makes none
	n, err := e.core.ShardsRemove(ctx, e.opts.Clock().Add(-e.opts.Retention), shardRemovePage,
		func(took time.Duration) bool {
			if pace == nil {
				pace = e.newPacer(0.5)
			}
			return pace.wait(ctx, took, e.opts.RetentionPause)
		})
	e.retention.shardsRemoved.Add(uint64(n))
	if err != nil {
		if ctx.Err() == nil {
			e.fails.retention.failed("retention shards", err)
		}
	} else {
		e.fails.retention.ok("retention shards")
	}
	return n
}
