package store

import (
	"context"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
)

// ShardRetentionStore is the part of Store the retention of emergency
// shards reads outside a write transaction (ledger.RemoveShards decides
// what is removed; these reads only find the candidates).
type ShardRetentionStore interface {
	// ShardsReconciled returns up to limit reconciled shards that expire
	// at or before before, after f in the order (ExpiresAt, ID), through
	// an index of reconciled shards by expiry, so it reads no live or
	// unreconciled shard. None is an empty list; limit <= 0 is an error.
	// A shard still holding unknown work is among them (the ledger leaves
	// it): the cursor pages past it.
	ShardsReconciled(ctx context.Context, after ShardCursor, before time.Time, limit int) ([]ledger.Shard, error)
	// MetaNames returns the names of the meta rows that begin with
	// prefix, in name order (bytes compared), up to limit; none is an
	// empty list, limit <= 0 or an empty prefix an error. It reads the
	// meta rows' key range of the prefix.
	MetaNames(ctx context.Context, prefix string, limit int) ([]string, error)
}

// ShardCursor is a position in the order of ShardsReconciled: the expiry
// and id of the last shard of the previous page; the zero cursor starts
// at the first.
type ShardCursor struct {
	ExpiresAt time.Time
	ID        string
}

// After reports whether s comes after c in the order of ShardsReconciled.
func (c ShardCursor) After(s *ledger.Shard) bool {
	if c.ExpiresAt.IsZero() && c.ID == "" {
		return true
	}
	if d := s.ExpiresAt.Compare(c.ExpiresAt); d != 0 {
		return d > 0
	}
	return s.ID > c.ID
}

// PrefixEnd returns the least string above every string that begins with
// prefix (bytes compared), for a key range [prefix, end); "" when there is
// none (prefix is all 0xff bytes).
func PrefixEnd(prefix string) string {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}

var _ ledger.ShardRemover = (*Book)(nil)

// ShardRemove deletes a shard row (ledger.RemoveShards): Changes lists it
// in RemovedShards.
func (b *Book) ShardRemove(id string) {
	set(&b.shards, id, nil)
	delete(b.shardDirty, id)
	set(&b.shardGone, id, true)
}

// removedShards fills c.RemovedShards, in id order.
func (b *Book) removedShards(c *Changes) {
	c.RemovedShards = sortedKeys(b.shardGone, strings.Compare)
}
