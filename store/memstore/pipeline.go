package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/capledger/capledger/store"
)

// Pipelined durability (store.Syncer), for the simulator and the engine's
// tests: a pipelined memstore keeps, besides the committed rows every
// reader sees, the rows as of its last Sync. CommitDeferred applies to the
// committed rows only; Sync makes them the durable ones; LoseUnsynced (a
// power loss with the process) goes back to the durable rows, losing every
// commit since the last Sync together. Reads are not held back here (the
// simulator answers its callers only after a Sync itself); the SQL stores'
// reads are.

// SetPipelined switches pipelined durability on or off; call it before
// the first transaction.
func (s *Store) SetPipelined(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pipelined = on
}

// Pipelined reports whether SetPipelined switched pipelined durability on.
func (s *Store) Pipelined() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pipelined
}

// Sync makes every commit so far durable and returns nil; or, once a sync
// failed (FailNextSync), that error for good.
func (s *Store) Sync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.syncFailed != nil {
		return s.syncFailed
	}
	if s.closed {
		return errClosed
	}
	if err := s.failNextSync; err != nil {
		s.failNextSync = nil
		s.syncFailed = fmt.Errorf("%w: fsync failed, the store refuses everything until it is opened again: %w", store.ErrUnavailable, err)
		return s.syncFailed
	}
	s.durable = nil
	return nil
}

// FailNextSync makes the next Sync fail with err, and every call after it
// (Sync, Begin, reads) fail too, as a store must after a failed fsync.
func (s *Store) FailNextSync(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNextSync = err
}

// Unsynced reports whether commits since the last Sync could be lost.
func (s *Store) Unsynced() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.durable != nil
}

// LoseUnsynced drops every commit since the last Sync, as a power loss
// that took the process with it does to a pipelined store: the rows go
// back to what the last Sync made durable. It crashes the open
// transaction too (Crash).
func (s *Store) LoseUnsynced() {
	s.Crash()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.durable != nil {
		s.committed, s.durable = s.durable, nil
	}
}

// CommitDeferred is Commit that, in a pipelined store, leaves the commit
// to be made durable by a later Sync (store.DeferredCommitter).
func (tx *Tx) CommitDeferred(ctx context.Context) error { return tx.commit(ctx, true) }

// beforeApply keeps the durable rows before a deferred commit changes the
// committed ones (s.mu held).
func (s *Store) beforeApply(deferred bool) {
	if !s.pipelined {
		return
	}
	if !deferred {
		// Commit: durable when it returns, with every commit before it.
		s.durable = nil
		return
	}
	if s.durable == nil {
		s.durable = s.committed.clone()
	}
}

// clone copies the row set: maps and slices of its own (rows themselves
// are never changed in place, only replaced), so applying a transaction to
// one leaves the other as it was.
func (r *rows) clone() *rows {
	c := *r
	c.meta = maps.Clone(r.meta)
	c.policies = maps.Clone(r.policies)
	c.heads = maps.Clone(r.heads)
	c.accounts = maps.Clone(r.accounts)
	c.currents = maps.Clone(r.currents)
	c.reservations = maps.Clone(r.reservations)
	c.live = maps.Clone(r.live)
	c.unknown = maps.Clone(r.unknown)
	c.debtors = maps.Clone(r.debtors)
	c.moves = maps.Clone(r.moves)
	c.shards = maps.Clone(r.shards)
	c.statementIDs = maps.Clone(r.statementIDs)
	// Appends to either copy must not write into a shared array.
	c.statements = slices.Clip(r.statements)
	r.statements = slices.Clip(r.statements)
	c.journal = slices.Clip(r.journal)
	r.journal = slices.Clip(r.journal)
	c.ret.tombstones = maps.Clone(r.ret.tombstones)
	c.ret.retained = maps.Clone(r.ret.retained)
	c.ret.finished = maps.Clone(r.ret.finished)
	c.ret.goneRes = maps.Clone(r.ret.goneRes)
	c.ret.goneTomb = maps.Clone(r.ret.goneTomb)
	c.rollouts = maps.Clone(r.rollouts)
	c.cp.chain = slices.Clone(r.cp.chain)
	return &c
}
