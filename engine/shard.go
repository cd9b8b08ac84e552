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
	tx, err := e.core.store.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("meta %s: %w", name, err)
	}
	defer tx.Rollback(ctx)
	v, err := tx.MetaGet(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("meta %s: %w", name, err)
	}
	return v, nil
}
