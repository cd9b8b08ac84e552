package memstore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// Tx is a memstore write transaction. Its writes go to a private overlay
// that Commit merges into the committed rows at once. It must end with
// Commit or Rollback (defer Rollback: it is a no-op after Commit), or the
// store admits no other writer.
type Tx struct {
	s   *Store
	ctx context.Context
	// pending holds this transaction's writes; reads look here first.
	pending *rows
	// failed is the error of a Write that did not complete: the overlay
	// may hold part of that batch, so Commit refuses to apply it.
	failed error
	// ended is why the transaction is over (committed, rolled back,
	// crashed); guarded by s.mu.
	ended error
}

var _ store.Tx = (*Tx)(nil)

// usable returns nil when the transaction may go on, else why not. An
// ended Begin context ends the transaction, as database/sql does, so it can
// never commit. s.mu must be held.
func (tx *Tx) usable(ctx context.Context) error {
	if tx.ended != nil {
		return tx.ended
	}
	if err := tx.ctx.Err(); err != nil {
		return fmt.Errorf("transaction context: %w", err)
	}
	return ctx.Err()
}

// get runs f on the overlay and the committed rows with the store locked.
func (tx *Tx) get(ctx context.Context, f func(pending, committed *rows) error) error {
	tx.s.mu.RLock()
	defer tx.s.mu.RUnlock()
	if err := tx.usable(ctx); err != nil {
		return err
	}
	return f(tx.pending, tx.s.committed)
}

// MetaGet returns the named counter, or store.ErrNotFound if never set.
func (tx *Tx) MetaGet(ctx context.Context, name string) (v int64, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		var ok bool
		if v, ok = p.meta[name]; ok {
			return nil
		}
		if p.metaGone[name] {
			return notFound("meta", name)
		}
		if v, ok = c.meta[name]; ok {
			return nil
		}
		return notFound("meta", name)
	})
	return v, err
}

// lookup returns the overlay's row for key, else the committed one.
func lookup[K comparable, V any](p, c map[K]*V, key K) (*V, bool) {
	if v, ok := p[key]; ok {
		return v, true
	}
	v, ok := c[key]
	return v, ok
}

// PolicyGet returns a copy of the policy generation, or store.ErrNotFound.
func (tx *Tx) PolicyGet(ctx context.Context, generation uint64) (out *ledger.Policy, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.policies, c.policies, generation)
		if !ok {
			return notFound("policy generation", generation)
		}
		cp := copyPolicy(v)
		out = &cp
		return nil
	})
	return out, err
}

// PolicyHeadGet returns a copy of the key's head, or store.ErrNotFound.
func (tx *Tx) PolicyHeadGet(ctx context.Context, key ledger.PolicyKey) (out *ledger.PolicyHead, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.heads, c.heads, key)
		if !ok {
			return notFound("policy head", key)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// AccountGet returns a copy of the account, or store.ErrNotFound.
func (tx *Tx) AccountGet(ctx context.Context, key ledger.AccountKey) (out *ledger.Account, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.accounts, c.accounts, key)
		if !ok {
			return notFound("account", key)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// AccountCurrentGet returns the subject's current generation, or
// store.ErrNotFound.
func (tx *Tx) AccountCurrentGet(ctx context.Context, subject ledger.PolicyKey) (g uint64, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		var ok bool
		if g, ok = p.currents[subject]; ok {
			return nil
		}
		if g, ok = c.currents[subject]; ok {
			return nil
		}
		return notFound("current generation of", subject)
	})
	return g, err
}

// ReservationGet returns a copy of the reservation, or store.ErrNotFound.
func (tx *Tx) ReservationGet(ctx context.Context, id string) (out *ledger.Reservation, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := reservationLookup(p, c, id)
		if !ok {
			return notFound("reservation", id)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// MoveGet returns a copy of the move receipt, or store.ErrNotFound.
func (tx *Tx) MoveGet(ctx context.Context, receiptID string) (out *ledger.Move, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.moves, c.moves, receiptID)
		if !ok {
			return notFound("move", receiptID)
		}
		cp := *v
		out = &cp
		return nil
	})
	return out, err
}

// ShardGet returns a copy of the shard, or store.ErrNotFound.
func (tx *Tx) ShardGet(ctx context.Context, id string) (out *ledger.Shard, err error) {
	err = tx.get(ctx, func(p, c *rows) error {
		v, ok := lookup(p.shards, c.shards, id)
		if !ok || p.shardGone[id] {
			return notFound("shard", id)
		}
		cp := copyShard(v)
		out = &cp
		return nil
	})
	return out, err
}

// Write stages c in the transaction. It returns store.ErrDuplicate (wrapped)
// when a new reservation id, a move receipt id or an account's epoch
// statement exists already (committed, or earlier in this transaction), and
// an error when a value cannot be stored (a time outside codec's range, a
// counter above math.MaxInt64, a malformed policy or signature). After an
// error the transaction can only be rolled back: Commit refuses it.
func (tx *Tx) Write(ctx context.Context, c *store.Changes) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := tx.usable(ctx); err != nil {
		return err
	}
	if tx.failed != nil {
		return fmt.Errorf("write after a failed write: %w", tx.failed)
	}
	if err := tx.stage(c); err != nil {
		tx.failed = err
		return err
	}
	return nil
}

// stage copies c into the overlay in the documented row order, normalizing
// every value as the SQL stores' columns do.
func (tx *Tx) stage(c *store.Changes) error {
	p, committed := tx.pending, tx.s.committed
	var conv codec.Conv
	for _, name := range sortedKeys(c.Meta) {
		p.meta[name] = c.Meta[name]
		delete(p.metaGone, name)
	}
	for _, name := range c.MetaRemoved {
		delete(p.meta, name)
		if p.metaGone == nil {
			p.metaGone = map[string]bool{}
		}
		p.metaGone[name] = true
	}
	for i := range c.Policies {
		pol, err := normalizePolicy(&c.Policies[i])
		if err != nil {
			return err
		}
		p.policies[pol.Generation] = pol
	}
	for _, h := range c.Heads {
		conv.Int(h.Active)
		conv.Int(h.Latest)
		if err := conv.Err(); err != nil {
			return fmt.Errorf("policy head %s: %w", h.Key, err)
		}
		p.heads[h.Key] = &h
	}
	for _, a := range c.Accounts {
		conv.Int(a.Key.Generation)
		conv.Int(a.Version)
		conv.Dims(int64(a.Dims))
		a.EpochStart = conv.Time(conv.Nanos(a.EpochStart))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("account %s: %w", a.Key, err)
		}
		p.accounts[a.Key] = &a
	}
	for _, cur := range c.Currents {
		if conv.Int(cur.Generation); conv.Err() != nil {
			return fmt.Errorf("current of %s: %w", cur.Subject, conv.Err())
		}
		p.currents[cur.Subject] = cur.Generation
	}
	// Removed rows go first: a batch that retired an id and then admitted
	// it again (store.RetentionChanges) inserts the new row in place of
	// the old one.
	stageRemovedReservations(p, c.Retention.RemovedReservations)
	for _, r := range c.Reservations {
		if c.NewReservations[r.ID] {
			if _, exists := reservationLookup(p, committed, r.ID); exists {
				return fmt.Errorf("insert reservation %s: %w", r.ID, store.ErrDuplicate)
			}
		}
		conv.Int(r.Account.Generation)
		for _, t := range []*time.Time{&r.AccountingEpoch, &r.CreatedAt, &r.ExpiresAt, &r.StartedAt,
			&r.ExecutionDeadline, &r.UnknownAt, &r.FinishedAt} {
			*t = conv.Time(conv.Nanos(*t))
		}
		if err := conv.Err(); err != nil {
			return fmt.Errorf("reservation %s: %w", r.ID, err)
		}
		p.reservations[r.ID] = &r
	}
	for _, m := range c.Moves {
		if _, exists := lookup(p.moves, committed.moves, m.ReceiptID); exists {
			return fmt.Errorf("insert move %s: %w", m.ReceiptID, store.ErrDuplicate)
		}
		conv.Int(m.From.Generation)
		conv.Int(m.To.Generation)
		m.At = conv.Time(conv.Nanos(m.At))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("move %s: %w", m.ReceiptID, err)
		}
		p.moves[m.ReceiptID] = &m
	}
	for _, sh := range c.Shards {
		conv.Int(sh.Account.Generation)
		conv.Int(sh.BootEpoch)
		conv.Int(sh.Fence)
		sh.IssuedAt = conv.Time(conv.Nanos(sh.IssuedAt))
		sh.ExpiresAt = conv.Time(conv.Nanos(sh.ExpiresAt))
		sh.Signature = conv.Signature(sh.Signature) // copies
		if err := conv.Err(); err != nil {
			return fmt.Errorf("shard %s: %w", sh.ID, err)
		}
		p.shards[sh.ID] = &sh
		delete(p.shardGone, sh.ID)
	}
	for _, id := range c.RemovedShards {
		delete(p.shards, id)
		if p.shardGone == nil {
			p.shardGone = map[string]bool{}
		}
		p.shardGone[id] = true
	}
	for _, st := range c.Statements {
		conv.Int(st.Account.Generation)
		conv.Dims(int64(st.Dims))
		st.EpochStart = conv.Time(conv.Nanos(st.EpochStart))
		st.EpochEnd = conv.Time(conv.Nanos(st.EpochEnd))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("statement of %s: %w", st.Account, err)
		}
		key := statementKey{st.Account, st.EpochStart}
		if p.statementIDs[key] || committed.statementIDs[key] {
			return fmt.Errorf("insert statement of %s epoch %s: %w", st.Account, st.EpochStart, store.ErrDuplicate)
		}
		p.statementIDs[key] = true
		p.statements = append(p.statements, st)
	}
	for _, e := range c.Journal {
		conv.Int(e.Account.Generation)
		e.At = conv.Time(conv.Nanos(e.At))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("journal entry of %s: %w", e.Account, err)
		}
		p.journal = append(p.journal, e)
	}
	return tx.stageRetention(&c.Retention)
}

// normalizePolicy returns a private copy of p as the SQL stores would read
// it back: times in UTC nanoseconds, dimensions through their JSON form.
func normalizePolicy(p *ledger.Policy) (*ledger.Policy, error) {
	var conv codec.Conv
	out := *p
	conv.Int(out.Generation)
	out.PublishedAt = conv.Time(conv.Nanos(out.PublishedAt))
	out.Dimensions = conv.Dimensions(conv.EncodeDimensions(out.Dimensions))
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("policy generation %d: %w", p.Generation, err)
	}
	return &out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Commit applies the transaction's writes to the committed rows at once and
// returns nil. It applies nothing and returns: the Write error after a
// failed Write; the context's error when the Begin or Commit context has
// ended; store.ErrUnavailable after Crash or Close; the injected error of
// FailNextCommit. Under LoseNextCommitAck it applies everything and returns
// store.ErrUnavailable. Every outcome ends the transaction.
func (tx *Tx) Commit(ctx context.Context) error { return tx.commit(ctx, false) }

func (tx *Tx) commit(ctx context.Context, deferred bool) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if tx.ended != nil {
		return fmt.Errorf("commit: %w", tx.ended)
	}
	if err := tx.usable(ctx); err != nil {
		s.endLocked(tx, nil)
		return fmt.Errorf("commit: %w", err)
	}
	if tx.failed != nil {
		err := tx.failed
		s.endLocked(tx, nil)
		return fmt.Errorf("commit after a failed write: %w", err)
	}
	if err := s.failNext; err != nil {
		s.failNext = nil
		s.endLocked(tx, nil)
		return fmt.Errorf("commit: %w", err)
	}
	if err := s.failAll; err != nil {
		s.endLocked(tx, nil)
		return fmt.Errorf("commit: %w", err)
	}
	s.beforeApply(deferred)
	tx.apply()
	s.endLocked(tx, nil)
	if s.loseAck {
		s.loseAck = false
		return fmt.Errorf("commit: acknowledgement lost: %w", store.ErrUnavailable)
	}
	return nil
}

// apply merges the overlay into the committed rows. s.mu must be held.
func (tx *Tx) apply() {
	p, c := tx.pending, tx.s.committed
	for k := range p.metaGone {
		delete(c.meta, k)
	}
	for k, v := range p.meta {
		c.meta[k] = v
	}
	for k, v := range p.policies {
		c.policies[k] = v
	}
	for k, v := range p.heads {
		c.heads[k] = v
	}
	for k, v := range p.accounts {
		c.accounts[k] = v
		if store.RowInDebt(v) {
			c.debtors[k] = true
		} else {
			delete(c.debtors, k)
		}
	}
	for k, v := range p.currents {
		c.currents[k] = v
	}
	for k, v := range p.reservations {
		c.reservations[k] = v
		switch v.State {
		case ledger.StateReserved, ledger.StateExpiring, ledger.StateStarted:
			c.live[k] = true
		default:
			delete(c.live, k)
		}
		if v.State == ledger.StateUsageUnknown {
			c.unknown[k] = true
		} else {
			delete(c.unknown, k)
		}
		if v.State.Terminal() {
			c.ret.finished[k] = true
		} else {
			delete(c.ret.finished, k)
		}
	}
	for k, v := range p.moves {
		c.moves[k] = v
	}
	for k, v := range p.shards {
		c.shards[k] = v
	}
	for k := range p.shardGone {
		delete(c.shards, k)
	}
	for k := range p.statementIDs {
		c.statementIDs[k] = true
	}
	c.statements = append(c.statements, p.statements...)
	c.journal = append(c.journal, p.journal...)
	tx.applyRetention()
}

// Rollback discards the transaction and returns nil; after Commit, a
// previous Rollback, Crash or Close it does nothing and returns nil.
func (tx *Tx) Rollback(ctx context.Context) error {
	s := tx.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(tx, nil)
	return nil
}
