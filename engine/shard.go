package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Shard returns one committed emergency shard (store.ErrNotFound when
// there is none).
func (e *Engine) Shard(ctx context.Context, id string) (ledger.Shard, error) {
	return e.core.store.ShardGet(ctx, id)
}

// Meta returns a committed named counter of the ledger (0 when never
// set), such as ledger.MetaShardRefusedFor(id). It reads through a
// transaction that it rolls back, since the store has no other read path
// for counters.
func (e *Engine) Meta(ctx context.Context, name string) (int64, error) {
	vs, err := e.Metas(ctx, []string{name})
	if err != nil {
		return 0, err
	}
	return vs[0], nil
}

// Metas returns committed named counters in the order of names (0 for one
// never set), read through one transaction that it rolls back: a list of
// shards reads each shard's refusals in one go, not one transaction each.
func (e *Engine) Metas(ctx context.Context, names []string) ([]int64, error) {
	out := make([]int64, len(names))
	if len(names) == 0 {
		return out, nil
	}
	tx, err := e.core.store.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("meta %s: %w", names[0], err)
	}
	defer tx.Rollback(ctx)
	for i, name := range names {
		v, err := tx.MetaGet(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("meta %s: %w", name, err)
		}
		out[i] = v
	}
	return out, nil
}
