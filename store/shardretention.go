package store

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"

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

// PrefixEnd returns the least text above every string that begins with
// prefix, in bytes order, for a key range [prefix, end): the prefix with
// its last character replaced by the next one. UTF-8 orders as its code
// points do, so the end stays valid text (PostgreSQL refuses a parameter
// that is not) where adding one to the last byte would not. It returns
// "" when there is no such text: an empty prefix, one of only U+10FFFF,
// or one that is not valid UTF-8.
func PrefixEnd(prefix string) string {
	for p := prefix; p != ""; {
		r, size := utf8.DecodeLastRuneInString(p)
		p = p[:len(p)-size]
		switch {
		case r == utf8.RuneError && size == 1:
			return ""
		case r == 0xD7FF: // the surrogates are not characters
			return p + string(rune(0xE000))
		case r < utf8.MaxRune:
			return p + string(r+1)
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
