package memstore

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// ShardsReconciled returns the reconciled shards expiring at or before
// before, after the cursor in (ExpiresAt, ID) order
// (store.ShardRetentionStore). The in-memory store scans its shards.
func (s *Store) ShardsReconciled(ctx context.Context, after store.ShardCursor, before time.Time, limit int) (out []ledger.Shard, err error) {
	if limit <= 0 {
		return nil, fmt.Errorf("reconciled shards: limit %d, want a positive one", limit)
	}
	err = s.read(ctx, func(r *rows) error {
		var all []*ledger.Shard
		for _, sh := range r.shards {
			if sh.Reconciled && !sh.ExpiresAt.After(before) && after.After(sh) {
				all = append(all, sh)
			}
		}
		slices.SortFunc(all, func(a, b *ledger.Shard) int {
			return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), strings.Compare(a.ID, b.ID))
		})
		for i := 0; i < len(all) && i < limit; i++ {
			out = append(out, copyShard(all[i]))
		}
		return nil
	})
	return out, err
}

// MetaNames returns the meta names that begin with prefix, in name order
// (store.ShardRetentionStore).
func (s *Store) MetaNames(ctx context.Context, prefix string, limit int) (out []string, err error) {
	if limit <= 0 || prefix == "" {
		return nil, fmt.Errorf("meta names %q: limit %d, want a prefix and a positive limit", prefix, limit)
	}
	err = s.read(ctx, func(r *rows) error {
		for _, name := range slices.Sorted(maps.Keys(r.meta)) {
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			if out = append(out, name); len(out) == limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// retainedShardsSnapshot lists the retained shard totals by account key,
// from the meta rows that hold them.
func retainedShardsSnapshot(r *rows) []ledger.RetainedShards {
	by := map[ledger.AccountKey]*ledger.RetainedShards{}
	for name, v := range r.meta {
		ledger.ParseRetainedShards(by, name, v)
	}
	return ledger.SortedRetainedShards(by)
}
