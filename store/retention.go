package store

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
)

// MetaForgetsJournaledAfter names the meta row where a SQL store keeps
// ledger.Snapshot.ForgetsJournaledAfter: the journal position its
// migration found when it began to journal forgotten tombstones (0 for a
// store created since). Its audit snapshot reads it.
const MetaForgetsJournaledAfter = "forgets_journaled_after"

// RetentionStore is the part of Store retention reads outside a write
// transaction. The ledger decides what may be removed (ledger.Retire,
// ledger.Forget); these reads only find the candidates, through an index
// of the rows concerned, in bounded pages.
type RetentionStore interface {
	// ReservationsFinished returns up to limit ids of terminal
	// reservations (SETTLED, SETTLED_WITH_DEBT, RELEASED, EXPIRED) that
	// finished at or before before, the earliest finished first (then by
	// id). limit <= 0 is an error. A driver keeps an index of terminal
	// rows by finish time, so this reads no live reservation.
	ReservationsFinished(ctx context.Context, before time.Time, limit int) ([]string, error)
	// TombstonesDue returns up to limit ids of tombstones of reservations
	// that finished at or before before, the earliest first (then by id),
	// through an index by finish time. limit <= 0 is an error.
	TombstonesDue(ctx context.Context, before time.Time, limit int) ([]string, error)
	// TombstoneGet returns the committed tombstone of a removed
	// reservation, or ErrNotFound.
	TombstoneGet(ctx context.Context, id string) (ledger.Tombstone, error)
	// ShardFencesIdle returns up to limit gateway ids that have a
	// ledger.MetaShardFence row and no shard expiring after before, in
	// id order (bytes compared); none is an empty list, limit <= 0 an
	// error. It reads the fence rows and the shards' gateways and expiry
	// times, one read of each (no index by gateway: shards are few
	// beside reservations). Retention folds them (ledger.FoldShardFences),
	// so the next call finds the ones after them.
	ShardFencesIdle(ctx context.Context, before time.Time, limit int) ([]string, error)
	// StatementsRemove deletes up to limit epoch statements whose epoch
	// ended at or before before, the earliest ended first (then in
	// insertion order), in one short transaction, and returns how many it
	// deleted: 0 once none is due. limit <= 0 is an error. A driver finds
	// them through an index by epoch end, so it reads no statement that
	// is not due. An account's epochs end one after another, so what a
	// call leaves of an account is its latest statements, a chain from
	// the oldest kept on. Statements are only ever inserted, each with
	// an end at most the time its epoch closed, so a statement ending
	// before before is never written again: the delete is safe in any
	// interleaving with writers and with another replica deleting.
	StatementsRemove(ctx context.Context, before time.Time, limit int) (int, error)
}

// RetentionTx is the part of Tx retention reads: a tombstone, and an
// account's retained totals, each locked like any other row read through
// the transaction. Both return ErrNotFound for a missing row.
type RetentionTx interface {
	TombstoneGet(ctx context.Context, id string) (*ledger.Tombstone, error)
	RetainedGet(ctx context.Context, key ledger.AccountKey) (*ledger.Retained, error)
}

// RetentionChanges is what a batch of retire and forget commands wrote:
// reservation rows deleted, tombstones inserted (an id that has one
// already is ErrDuplicate) or deleted, retained totals upserted. A driver
// deletes RemovedReservations before it writes Changes.Reservations, and
// applies the rest after the other rows. An id may be in both: one batch
// retired it and then admitted it again (its tombstone forgotten in the
// batch, or never left: a retire past the tombstone horizon), which
// inserts the new row (Changes.NewReservations) in place of the old one,
// never a duplicate key; the engine commits a retention page in the same
// transaction as the gateways' commands beside it.
type RetentionChanges struct {
	RemovedReservations []string
	Tombstones          []ledger.Tombstone
	RemovedTombstones   []string
	Retained            []ledger.Retained
}

// Empty reports whether the batch retired and forgot nothing.
func (c *RetentionChanges) Empty() bool {
	return len(c.RemovedReservations) == 0 && len(c.Tombstones) == 0 && len(c.RemovedTombstones) == 0 && len(c.Retained) == 0
}

// bookRetention holds the retention rows of a Book.
type bookRetention struct {
	tombstones    map[string]*ledger.Tombstone // nil value: read, absent
	tombNew       map[string]bool
	tombGone      map[string]bool
	resGone       map[string]bool
	retained      map[ledger.AccountKey]*ledger.Retained
	retainedDirty map[ledger.AccountKey]bool
}

var _ ledger.RetentionBook = (*Book)(nil)

func (b *Book) Tombstone(id string) (*ledger.Tombstone, bool) {
	if t, ok := b.ret.tombstones[id]; ok {
		return t, t != nil
	}
	t, err := b.tx.TombstoneGet(b.ctx, id)
	b.note(err)
	if err != nil {
		t = nil
	}
	set(&b.ret.tombstones, id, t)
	return t, t != nil
}

func (b *Book) TombstonePut(t *ledger.Tombstone) {
	set(&b.ret.tombstones, t.ID, t)
	set(&b.ret.tombNew, t.ID, true)
	delete(b.ret.tombGone, t.ID)
}

func (b *Book) TombstoneRemove(id string) {
	set(&b.ret.tombstones, id, nil)
	if b.ret.tombNew[id] {
		delete(b.ret.tombNew, id)
		return
	}
	set(&b.ret.tombGone, id, true)
}

func (b *Book) ReservationRemove(id string) {
	b.reservations[id] = nil
	delete(b.resDirty, id)
	if b.resNew[id] {
		delete(b.resNew, id)
		return
	}
	set(&b.ret.resGone, id, true)
}

func (b *Book) Retained(key ledger.AccountKey) (*ledger.Retained, bool) {
	if r, ok := b.ret.retained[key]; ok {
		return r, r != nil
	}
	r, err := b.tx.RetainedGet(b.ctx, key)
	b.note(err)
	if err != nil {
		r = nil
	}
	set(&b.ret.retained, key, r)
	return r, r != nil
}

func (b *Book) RetainedPut(r *ledger.Retained) {
	set(&b.ret.retained, r.Account, r)
	set(&b.ret.retainedDirty, r.Account, true)
}

// retentionChanges fills c.Retention, rows in key order.
func (b *Book) retentionChanges(c *Changes) {
	r := &c.Retention
	r.RemovedReservations = slices.Sorted(maps.Keys(b.ret.resGone))
	for _, id := range slices.Sorted(maps.Keys(b.ret.tombNew)) {
		r.Tombstones = append(r.Tombstones, *b.ret.tombstones[id])
	}
	r.RemovedTombstones = slices.Sorted(maps.Keys(b.ret.tombGone))
	for _, k := range sortedKeys(b.ret.retainedDirty, ledger.AccountKey.Compare) {
		r.Retained = append(r.Retained, *b.ret.retained[k])
	}
}
