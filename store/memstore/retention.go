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
	"github.com/capledger/capledger/store/codec"
)

// retention holds the retention rows of one rows set. In the overlay of a
// transaction, goneRes and goneTomb are the deletions it staged.
type retention struct {
	tombstones map[string]*ledger.Tombstone
	retained   map[ledger.AccountKey]*ledger.Retained
	// finished holds the ids of terminal reservations, as the SQL stores'
	// partial index does, so ReservationsFinished need not read live ones.
	finished map[string]bool
	goneRes  map[string]bool
	goneTomb map[string]bool
}

func newRetention() retention {
	return retention{tombstones: map[string]*ledger.Tombstone{}, retained: map[ledger.AccountKey]*ledger.Retained{},
		finished: map[string]bool{}, goneRes: map[string]bool{}, goneTomb: map[string]bool{}}
}

// TombstoneGet returns a copy of the tombstone, or store.ErrNotFound.
func (tx *Tx) TombstoneGet(ctx context.Context, id string) (out *ledger.Tombstone, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		if p.ret.goneTomb[id] {
			return notFound("tombstone", id)
		}
		v, ok := lookup(p.ret.tombstones, c.ret.tombstones, id)
		if !ok {
			return notFound("tombstone", id)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// RetainedGet returns a copy of the account's retained totals, or
// store.ErrNotFound.
func (tx *Tx) RetainedGet(ctx context.Context, key ledger.AccountKey) (out *ledger.Retained, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.ret.retained, c.ret.retained, key)
		if !ok {
			return notFound("retained totals of", key)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// reservationLookup returns the reservation row id as the transaction of
// overlay p over committed rows c sees it: staged, or committed and not
// removed by the transaction.
func reservationLookup(p, c *rows, id string) (*ledger.Reservation, bool) {
	if v, ok := p.reservations[id]; ok {
		return v, true
	}
	if p.ret.goneRes[id] {
		return nil, false
	}
	v, ok := c.reservations[id]
	return v, ok
}

// stageRemovedReservations stages the deletion of the reservation rows
// ids, before the rows of the same Write are staged (stage).
func stageRemovedReservations(p *rows, ids []string) {
	for _, id := range ids {
		delete(p.reservations, id)
		p.ret.goneRes[id] = true
	}
}

// stageRetention copies c's retention changes into the overlay, but for
// the removed reservations, which stage deleted before the other rows.
func (tx *Tx) stageRetention(c *store.RetentionChanges) error {
	p, committed := tx.pending, tx.s.committed
	var conv codec.Conv
	for _, t := range c.Tombstones {
		if _, exists := lookup(p.ret.tombstones, committed.ret.tombstones, t.ID); exists && !p.ret.goneTomb[t.ID] {
			return fmt.Errorf("insert tombstone %s: %w", t.ID, store.ErrDuplicate)
		}
		conv.Int(t.Account.Generation)
		t.FinishedAt = conv.Time(conv.Nanos(t.FinishedAt))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("tombstone %s: %w", t.ID, err)
		}
		p.ret.tombstones[t.ID] = &t
		delete(p.ret.goneTomb, t.ID)
	}
	for _, id := range c.RemovedTombstones {
		delete(p.ret.tombstones, id)
		p.ret.goneTomb[id] = true
	}
	for _, r := range c.Retained {
		if conv.Int(r.Account.Generation); conv.Err() != nil {
			return fmt.Errorf("retained totals of %s: %w", r.Account, conv.Err())
		}
		p.ret.retained[r.Account] = &r
	}
	return nil
}

// applyRetention merges the overlay's retention rows. s.mu must be held.
func (tx *Tx) applyRetention() {
	p, c := tx.pending, tx.s.committed
	for id := range p.ret.goneRes {
		if _, again := p.reservations[id]; again {
			continue // re-inserted after removal in the same transaction
		}
		delete(c.reservations, id)
		delete(c.live, id)
		delete(c.unknown, id)
		delete(c.ret.finished, id)
	}
	for id := range p.ret.goneTomb {
		delete(c.ret.tombstones, id)
	}
	for k, v := range p.ret.tombstones {
		c.ret.tombstones[k] = v
	}
	for k, v := range p.ret.retained {
		c.ret.retained[k] = v
	}
}

// ReservationsFinished returns the terminal reservations that finished at
// or before before, earliest first, then by id (store.RetentionStore).
func (s *Store) ReservationsFinished(ctx context.Context, before time.Time, limit int) (out []string, err error) {
	if limit <= 0 {
		return nil, fmt.Errorf("finished reservations: limit %d, want a positive one", limit)
	}
	err = s.read(ctx, func(r *rows) error {
		type due struct {
			at time.Time
			id string
		}
		var all []due
		for id := range r.ret.finished {
			if res := r.reservations[id]; !res.FinishedAt.After(before) {
				all = append(all, due{res.FinishedAt, id})
			}
		}
		slices.SortFunc(all, func(a, b due) int { return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.id, b.id)) })
		for i := 0; i < len(all) && i < limit; i++ {
			out = append(out, all[i].id)
		}
		return nil
	})
	return out, err
}

// TombstonesDue returns the tombstones of reservations that finished at or
// before before, earliest first, then by id (store.RetentionStore).
func (s *Store) TombstonesDue(ctx context.Context, before time.Time, limit int) (out []string, err error) {
	if limit <= 0 {
		return nil, fmt.Errorf("tombstones due: limit %d, want a positive one", limit)
	}
	err = s.read(ctx, func(r *rows) error {
		var all []*ledger.Tombstone
		for _, t := range r.ret.tombstones {
			if !t.FinishedAt.After(before) {
				all = append(all, t)
			}
		}
		slices.SortFunc(all, func(a, b *ledger.Tombstone) int {
			return cmp.Or(a.FinishedAt.Compare(b.FinishedAt), cmp.Compare(a.ID, b.ID))
		})
		for i := 0; i < len(all) && i < limit; i++ {
			out = append(out, all[i].ID)
		}
		return nil
	})
	return out, err
}

// TombstoneGet returns a copy of the committed tombstone, or
// store.ErrNotFound.
func (s *Store) TombstoneGet(ctx context.Context, id string) (out ledger.Tombstone, err error) {
	err = s.read(ctx, func(r *rows) error {
		t, ok := r.ret.tombstones[id]
		if !ok {
			return notFound("tombstone", id)
		}
		out = *t
		return nil
	})
	return out, err
}

// retainedSnapshot lists the retained totals by account key.
func retainedSnapshot(r *rows) []ledger.Retained {
	var out []ledger.Retained
	for _, k := range slices.SortedFunc(maps.Keys(r.ret.retained), ledger.AccountKey.Compare) {
		out = append(out, *r.ret.retained[k])
	}
	return out
}

// ShardFencesIdle returns the gateways that have a fence row and no shard
// expiring after before, in id order (store.RetentionStore).
func (s *Store) ShardFencesIdle(ctx context.Context, before time.Time, limit int) (out []string, err error) {
	if limit <= 0 {
		return nil, fmt.Errorf("idle shard fences: limit %d, want a positive one", limit)
	}
	err = s.read(ctx, func(r *rows) error {
		live := map[string]bool{}
		for _, sh := range r.shards {
			if sh.ExpiresAt.After(before) {
				live[sh.GatewayID] = true
			}
		}
		for _, name := range slices.Sorted(maps.Keys(r.meta)) {
			g, ok := strings.CutPrefix(name, ledger.MetaShardFencePrefix)
			if !ok || live[g] {
				continue
			}
			if out = append(out, g); len(out) == limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// StatementsRemove deletes up to limit statements whose epoch ended at
// or before before, the earliest ended first, then in insertion order
// (store.RetentionStore). It is durable at once, as the SQL stores'
// deletes are, together with every deferred commit before it (as
// JournalCompact and Commit are): it may have been decided on them. It
// looks at every statement's end, as the other retention reads of this
// store look at their sets; the SQL stores read an index by epoch end.
func (s *Store) StatementsRemove(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("statement retention: limit %d, want a positive one", limit)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, errClosed
	}
	r := s.committed
	var due []int
	for i := range r.statements {
		if !r.statements[i].EpochEnd.After(before) {
			due = append(due, i)
		}
	}
	if len(due) == 0 {
		return 0, nil
	}
	slices.SortStableFunc(due, func(a, b int) int { return r.statements[a].EpochEnd.Compare(r.statements[b].EpochEnd) })
	due = due[:min(len(due), limit)]
	gone := make(map[int]bool, len(due))
	for _, i := range due {
		gone[i] = true
	}
	s.beforeApply(false)
	kept := make([]ledger.Statement, 0, len(r.statements)-len(due))
	for i, st := range r.statements {
		if gone[i] {
			delete(r.statementIDs, statementKey{st.Account, st.EpochStart})
			continue
		}
		kept = append(kept, st)
	}
	r.statements = kept
	return len(due), nil
}
