// Package memstore is an in-memory store.Store for the deterministic
// simulator and for tests of the layers above the store.
//
// It has the semantics of the SQL stores (it passes store/storetest): one
// writer at a time (Begin waits for the previous transaction to end, or for
// its context), atomic commits, ErrDuplicate on a second insert of a
// reservation id, move receipt or epoch statement, times kept as UTC Unix
// nanoseconds and counters bounded to int64. It starts no goroutine, reads
// no clock, iterates in sorted order everywhere, and copies rows on the way
// in and out, so a run is a function of its inputs and callers cannot alias
// the store's state.
//
// A Store also injects the faults the simulator needs: Crash (the process
// died: the open transaction is gone, committed data stays), FailNextCommit
// (the commit fails and applies nothing) and LoseNextCommitAck (the commit
// applies durably but the caller hears ErrUnavailable).
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// rows is one complete set of the ledger's rows.
type rows struct {
	meta map[string]int64
	// metaGone holds the meta names a transaction's overlay deleted
	// (Changes.MetaRemoved); empty in the committed rows.
	metaGone map[string]bool
	// shardGone holds the shard ids a transaction's overlay deleted
	// (Changes.RemovedShards); empty in the committed rows.
	shardGone map[string]bool
	policies  map[uint64]*ledger.Policy
	heads     map[ledger.PolicyKey]*ledger.PolicyHead
	accounts  map[ledger.AccountKey]*ledger.Account
	// debtors holds the keys of the accounts whose row owes debt
	// (store.RowInDebt), as the SQL stores' debtor index does, so
	// AccountsInDebt need not read the others.
	debtors      map[ledger.AccountKey]bool
	currents     map[ledger.PolicyKey]uint64
	reservations map[string]*ledger.Reservation
	// live holds the ids of reservations a worker may need (RESERVED,
	// EXPIRING, STARTED), so ReservationsDue does not scan finished ones.
	live map[string]bool
	// unknown holds the ids of the USAGE_UNKNOWN reservations, as the SQL
	// stores' partial index does, so the backlog reads need not scan the
	// others.
	unknown      map[string]bool
	moves        map[string]*ledger.Move
	shards       map[string]*ledger.Shard
	statements   []ledger.Statement
	statementIDs map[statementKey]bool
	journal      []ledger.JournalEntry
	ret          retention
	// rollouts holds each rollout's stored form (store/codec), by name.
	rollouts map[string][]byte
	cp       checkpoints
	// console holds the resolver's answers and the audit records
	// (console.go).
	console consoleRows
}

type statementKey struct {
	account    ledger.AccountKey
	epochStart time.Time
}

func newRows() *rows {
	return &rows{
		meta:         map[string]int64{},
		policies:     map[uint64]*ledger.Policy{},
		heads:        map[ledger.PolicyKey]*ledger.PolicyHead{},
		accounts:     map[ledger.AccountKey]*ledger.Account{},
		currents:     map[ledger.PolicyKey]uint64{},
		reservations: map[string]*ledger.Reservation{},
		live:         map[string]bool{},
		unknown:      map[string]bool{},
		debtors:      map[ledger.AccountKey]bool{},
		moves:        map[string]*ledger.Move{},
		shards:       map[string]*ledger.Shard{},
		statementIDs: map[statementKey]bool{},
		ret:          newRetention(),
		rollouts:     map[string][]byte{},
	}
}

// Store is an in-memory store.Store. The zero value is not usable; call New.
type Store struct {
	// writer holds one token while a transaction is open: Begin takes it
	// (waiting in a select with the context), Commit/Rollback/Crash return
	// it. A channel rather than a mutex so that waiting honours ctx.
	writer chan struct{}

	mu        sync.RWMutex // guards everything below
	committed *rows
	open      *Tx // the open transaction, nil when none
	closed    bool
	failNext  error
	failAll   error // FailCommits: every Commit fails while set
	loseAck   bool
	// Pipelined durability (pipeline.go): durable is the rows as of the
	// last Sync while deferred commits are not synced (nil otherwise).
	pipelined    bool
	durable      *rows
	failNextSync error
	syncFailed   error
	// checkpointWriting is held by the one checkpoint writer
	// (checkpoint.go).
	checkpointWriting atomic.Bool
}

var _ store.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{writer: make(chan struct{}, 1), committed: newRows()}
}

// Crash simulates a process death: the open transaction, if any, is
// dropped without applying anything and its later calls return
// store.ErrUnavailable; everything committed stays (it was durable).
// Pending FailNextCommit/LoseNextCommitAck faults are cleared, since they
// belonged to the process that died.
func (s *Store) Crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext, s.loseAck = nil, false
	if s.open != nil {
		s.endLocked(s.open, errCrashed)
	}
}

// FailNextCommit makes the next Commit apply nothing and return err (e.g. a
// store.ErrConflict, or store.ErrUnavailable for a commit that never
// reached the disk).
func (s *Store) FailNextCommit(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = err
}

// FailCommits makes every Commit apply nothing and return err until it
// is called again with nil: a store that stays down (FailNextCommit is a
// one-off).
func (s *Store) FailCommits(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failAll = err
}

// LoseNextCommitAck makes the next Commit apply its changes durably and
// then return store.ErrUnavailable: the acknowledgement was lost.
func (s *Store) LoseNextCommitAck() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseAck = true
}

var (
	errCrashed = fmt.Errorf("%w: process crashed before commit", store.ErrUnavailable)
	errClosed  = fmt.Errorf("%w: store closed", store.ErrUnavailable)
	errDone    = errors.New("transaction already ended")
)

// Begin returns a new write transaction once no other is open. It returns
// ctx's error if ctx ends while it waits, and store.ErrUnavailable after
// Close.
func (s *Store) Begin(ctx context.Context) (store.Tx, error) {
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	// select picks at random among ready cases: check ctx first so an
	// ended context never opens a transaction.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	select {
	case s.writer <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("begin: %w", ctx.Err())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		<-s.writer
		return nil, errClosed
	}
	if s.syncFailed != nil {
		<-s.writer
		return nil, s.syncFailed
	}
	tx := &Tx{s: s, ctx: ctx, pending: newRows()}
	s.open = tx
	return tx, nil
}

func (s *Store) checkOpen() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errClosed
	}
	return nil
}

// endLocked ends tx with reason (nil for a commit) and frees the writer
// slot. s.mu must be held.
func (s *Store) endLocked(tx *Tx, reason error) {
	if tx.ended != nil {
		return
	}
	if reason == nil {
		reason = errDone
	}
	tx.ended = reason
	tx.pending = nil
	if s.open == tx {
		s.open = nil
	}
	<-s.writer
}

// Close makes every later call return store.ErrUnavailable; an open
// transaction is dropped as by Crash. It returns nil.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open != nil {
		s.endLocked(s.open, errClosed)
	}
	s.closed = true
	return nil
}

// read runs f on the committed rows under the read lock; it returns
// store.ErrUnavailable after Close and ctx's error if ctx has ended.
func (s *Store) read(ctx context.Context, f func(r *rows) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errClosed
	}
	if s.syncFailed != nil {
		return s.syncFailed
	}
	return f(s.committed)
}

func notFound(what string, key any) error {
	return fmt.Errorf("%s %v: %w", what, key, store.ErrNotFound)
}

// ReservationGet returns a copy of the committed reservation, or
// store.ErrNotFound.
func (s *Store) ReservationGet(ctx context.Context, id string) (out ledger.Reservation, err error) {
	err = s.read(ctx, func(r *rows) error {
		res, ok := r.reservations[id]
		if !ok {
			return notFound("reservation", id)
		}
		out = *res
		return nil
	})
	return out, err
}

// AccountGet returns a copy of the committed account, or store.ErrNotFound.
func (s *Store) AccountGet(ctx context.Context, key ledger.AccountKey) (out ledger.Account, err error) {
	err = s.read(ctx, func(r *rows) error {
		a, ok := r.accounts[key]
		if !ok {
			return notFound("account", key)
		}
		out = *a
		return nil
	})
	return out, err
}

// AccountList returns copies of the accounts of subject (every generation,
// by generation), or of every account ordered by key when subject.Subject
// is empty. No match is an empty list, not an error.
func (s *Store) AccountList(ctx context.Context, subject ledger.PolicyKey) (out []ledger.Account, err error) {
	err = s.read(ctx, func(r *rows) error {
		for _, a := range r.accounts {
			if subject.Subject == "" || a.Key.SubjectKey() == subject {
				out = append(out, *a)
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	return out, err
}

// AccountsOfSubjects returns copies of the accounts of subjects (every
// generation of each), in key order; a key with an empty Subject names
// none. No match is an empty list. One read of the committed rows, which
// walks every account, as AccountList does.
func (s *Store) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) (out []ledger.Account, err error) {
	named := make(map[ledger.PolicyKey]bool, len(subjects))
	for _, k := range subjects {
		if k.Subject != "" {
			named[k] = true
		}
	}
	err = s.read(ctx, func(r *rows) error {
		if len(named) == 0 {
			return nil
		}
		for _, a := range r.accounts {
			if named[a.Key.SubjectKey()] {
				out = append(out, *a)
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	return out, err
}

// PolicyGet returns a copy of the policy generation, or store.ErrNotFound.
func (s *Store) PolicyGet(ctx context.Context, generation uint64) (out ledger.Policy, err error) {
	err = s.read(ctx, func(r *rows) error {
		p, ok := r.policies[generation]
		if !ok {
			return notFound("policy generation", generation)
		}
		out = copyPolicy(p)
		return nil
	})
	return out, err
}

// PoliciesOfGenerations returns copies of the committed policies of
// generations, by generation; one that does not exist is absent. One read.
func (s *Store) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	out := make(map[uint64]ledger.Policy, len(generations))
	err := s.read(ctx, func(r *rows) error {
		for _, g := range generations {
			if p, ok := r.policies[g]; ok {
				out[g] = copyPolicy(p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PolicyHead returns a copy of the key's committed head, or
// store.ErrNotFound.
func (s *Store) PolicyHead(ctx context.Context, key ledger.PolicyKey) (out ledger.PolicyHead, err error) {
	err = s.read(ctx, func(r *rows) error {
		h, ok := r.heads[key]
		if !ok {
			return notFound("policy head", key)
		}
		out = *h
		return nil
	})
	return out, err
}

// PolicyHeads returns copies of the committed heads of keys, by key; a
// key without a head is absent. One read.
func (s *Store) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	out := make(map[ledger.PolicyKey]ledger.PolicyHead, len(keys))
	err := s.read(ctx, func(r *rows) error {
		for _, k := range keys {
			if h, ok := r.heads[k]; ok {
				out[k] = *h
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PolicyList returns copies of every policy generation, oldest first.
func (s *Store) PolicyList(ctx context.Context) (out []ledger.Policy, err error) {
	err = s.read(ctx, func(r *rows) error {
		for _, g := range slices.Sorted(maps.Keys(r.policies)) {
			out = append(out, copyPolicy(r.policies[g]))
		}
		return nil
	})
	return out, err
}

// PolicyChanges returns the committed ledger.MetaPolicyChanges row, 0
// when it was never set.
func (s *Store) PolicyChanges(ctx context.Context) (out uint64, err error) {
	err = s.read(ctx, func(r *rows) error {
		out = uint64(r.meta[ledger.MetaPolicyChanges])
		return nil
	})
	return out, err
}

// PolicyListAfter returns copies of the generations newer than after,
// oldest first.
func (s *Store) PolicyListAfter(ctx context.Context, after uint64) (out []ledger.Policy, err error) {
	err = s.read(ctx, func(r *rows) error {
		for _, g := range slices.Sorted(maps.Keys(r.policies)) {
			if g > after {
				out = append(out, copyPolicy(r.policies[g]))
			}
		}
		return nil
	})
	return out, err
}

// PolicyPage returns copies of up to f.Limit generations newer than
// f.After that f's filters select, oldest first, each with whether its
// key's head names it active (store.Store.PolicyPage).
func (s *Store) PolicyPage(ctx context.Context, f store.PolicyFilter) (out []store.ListedPolicy, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("policy page: limit %d is not positive", f.Limit)
	}
	err = s.read(ctx, func(r *rows) error {
		for _, g := range slices.Sorted(maps.Keys(r.policies)) {
			p := r.policies[g]
			if g <= f.After || (f.Subject != "" && f.Subject != p.Key.Subject) ||
				(f.Route != "" && f.Route != p.Key.Route) || (f.Region != "" && f.Region != p.Key.Region) {
				continue
			}
			h, ok := r.heads[p.Key]
			out = append(out, store.ListedPolicy{Policy: copyPolicy(p), Active: ok && h.Active == g})
			if len(out) == f.Limit {
				break
			}
		}
		return nil
	})
	return out, err
}

// ShardGet returns a copy of the shard, or store.ErrNotFound.
func (s *Store) ShardGet(ctx context.Context, id string) (out ledger.Shard, err error) {
	err = s.read(ctx, func(r *rows) error {
		sh, ok := r.shards[id]
		if !ok {
			return notFound("shard", id)
		}
		out = copyShard(sh)
		return nil
	})
	return out, err
}

// ShardList returns copies of every shard, ordered by id.
func (s *Store) ShardList(ctx context.Context) (out []ledger.Shard, err error) {
	err = s.read(ctx, func(r *rows) error {
		for _, id := range slices.Sorted(maps.Keys(r.shards)) {
			out = append(out, copyShard(r.shards[id]))
		}
		return nil
	})
	return out, err
}

// ShardsUnreconciled returns copies of the unreconciled shards of
// f.Generation after f.After, in id order (store.Store). The in-memory
// store scans its shards.
func (s *Store) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) (out []ledger.Shard, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("unreconciled shards: limit %d, want a positive one", f.Limit)
	}
	err = s.read(ctx, func(r *rows) error {
		for _, id := range slices.Sorted(maps.Keys(r.shards)) {
			if sh := r.shards[id]; id > f.After && !sh.Reconciled && sh.Account.Generation == f.Generation {
				if out = append(out, copyShard(sh)); len(out) == f.Limit {
					break
				}
			}
		}
		return nil
	})
	return out, err
}

// nanos is a time as the SQL stores keep it: Unix nanoseconds, 0 for the
// zero time. Due times compare in this form so that every store orders
// and filters identically, edge cases included.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// dueAt returns when a reservation became due for a worker, and whether it
// is due at now: RESERVED once ExpiresAt <= now, EXPIRING always (an expiry
// was claimed and must be finished), STARTED once a non-zero
// ExecutionDeadline <= now.
func dueAt(r *ledger.Reservation, now int64) (int64, bool) {
	switch r.State {
	case ledger.StateReserved:
		return nanos(r.ExpiresAt), nanos(r.ExpiresAt) <= now
	case ledger.StateExpiring:
		return nanos(r.ExpiresAt), true
	case ledger.StateStarted:
		return nanos(r.ExecutionDeadline), !r.ExecutionDeadline.IsZero() && nanos(r.ExecutionDeadline) <= now
	}
	return 0, false
}

// ReservationsDue returns up to limit reservations due at now (id, state
// and due time of each), ordered by the time they became due (ExpiresAt,
// or ExecutionDeadline for STARTED), ties by id. limit <= 0 returns none.
func (s *Store) ReservationsDue(ctx context.Context, now time.Time, limit int) (out []store.DueReservation, err error) {
	if limit <= 0 {
		return nil, s.read(ctx, func(*rows) error { return nil })
	}
	type due struct {
		at  int64
		row store.DueReservation
	}
	var (
		list []due
		conv codec.Conv // DueAt as the SQL stores read it back: nanos, UTC
	)
	err = s.read(ctx, func(r *rows) error {
		for id := range r.live {
			res := r.reservations[id]
			if at, ok := dueAt(res, now.UnixNano()); ok {
				list = append(list, due{at, store.DueReservation{ID: id, State: res.State, DueAt: conv.Time(at)}})
			}
		}
		return nil
	})
	slices.SortFunc(list, func(a, b due) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.row.ID, b.row.ID)) })
	for i := 0; i < len(list) && i < limit; i++ {
		out = append(out, list[i].row)
	}
	return out, err
}

// ReservationsUnknown returns copies of up to f.Limit USAGE_UNKNOWN
// reservations in (UnknownAt, ID) order, strictly after f.After unless it
// is the zero cursor, with f's subject and route when they are not empty;
// none is an empty list. UnknownAt compares as the SQL stores keep it
// (nanos), so every store pages identically. It returns an error for
// f.Limit <= 0 and for a cursor time no row can hold (one
// codec.Conv.Nanos refuses).
func (s *Store) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) (out []ledger.Reservation, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("reservations unknown: limit %d is not positive", f.Limit)
	}
	var conv codec.Conv
	after := conv.Nanos(f.After.MarkedAt)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reservations unknown: cursor: %w", err)
	}
	fromStart := f.After == (store.UnknownCursor{})
	order := func(a, b *ledger.Reservation) int {
		return cmp.Or(cmp.Compare(nanos(a.UnknownAt), nanos(b.UnknownAt)), cmp.Compare(a.ID, b.ID))
	}
	var list []*ledger.Reservation
	err = s.read(ctx, func(r *rows) error {
		for id := range r.unknown {
			res := r.reservations[id]
			if (f.Subject != "" && res.Account.Subject != f.Subject) || (f.Route != "" && res.Account.Route != f.Route) {
				continue
			}
			if !fromStart && cmp.Or(cmp.Compare(nanos(res.UnknownAt), after), cmp.Compare(res.ID, f.After.ID)) <= 0 {
				continue
			}
			list = append(list, res)
		}
		slices.SortFunc(list, order)
		for _, res := range list[:min(f.Limit, len(list))] {
			out = append(out, *res)
		}
		return nil
	})
	return out, err
}

// ReservationsUnknownBacklog returns how many reservations are
// USAGE_UNKNOWN and the earliest UnknownAt among them (the zero time when
// there are none).
func (s *Store) ReservationsUnknownBacklog(ctx context.Context) (b store.UnknownBacklog, err error) {
	err = s.read(ctx, func(r *rows) error {
		for id := range r.unknown {
			marked := r.reservations[id].UnknownAt
			if b.Count == 0 || nanos(marked) < nanos(b.OldestMarkedAt) {
				b.OldestMarkedAt = marked
			}
			b.Count++
		}
		return nil
	})
	return b, err
}

// AccountsInDebtCount counts the debtor set.
func (s *Store) AccountsInDebtCount(ctx context.Context) (n int64, err error) {
	err = s.read(ctx, func(r *rows) error {
		n = int64(len(r.debtors))
		return nil
	})
	return n, err
}

// AccountsInDebt returns copies of up to f.Limit accounts that owe debt
// in some balance (OverdraftIssued > OverdraftRepaid, any of the
// MaxDimensions, as the SQL stores' rows hold them), in key order,
// strictly after f.After unless it is the zero key; none is an empty
// list. It returns an error for f.Limit <= 0 and for a cursor generation
// above math.MaxInt64, which the SQL stores cannot compare with theirs.
// It reads the debtor set only, not the other accounts, and sorts what
// it finds.
func (s *Store) AccountsInDebt(ctx context.Context, f store.DebtFilter) (out []ledger.Account, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts in debt: limit %d is not positive", f.Limit)
	}
	var conv codec.Conv
	if conv.Int(f.After.Generation); conv.Err() != nil {
		return nil, fmt.Errorf("accounts in debt: cursor %s: %w", f.After, conv.Err())
	}
	fromStart := f.After == (ledger.AccountKey{})
	var list []*ledger.Account
	err = s.read(ctx, func(r *rows) error {
		for key := range r.debtors {
			if fromStart || key.Compare(f.After) > 0 {
				list = append(list, r.accounts[key])
			}
		}
		slices.SortFunc(list, func(a, b *ledger.Account) int { return a.Key.Compare(b.Key) })
		for _, a := range list[:min(f.Limit, len(list))] {
			out = append(out, *a)
		}
		return nil
	})
	return out, err
}

// AccountsPage returns copies of up to f.Limit accounts that f selects,
// in key order after f.After (store.Store.AccountsPage): one read, which
// walks every account.
func (s *Store) AccountsPage(ctx context.Context, f store.AccountFilter) (out []ledger.Account, err error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts page: limit %d is not positive", f.Limit)
	}
	var conv codec.Conv
	if conv.Int(f.After.Generation); conv.Err() != nil {
		return nil, fmt.Errorf("accounts page: cursor %s: %w", f.After, conv.Err())
	}
	if err := f.Problem(); err != nil {
		return nil, fmt.Errorf("accounts page: %w", err)
	}
	fromStart := f.After == (ledger.AccountKey{})
	var list []*ledger.Account
	err = s.read(ctx, func(r *rows) error {
		for key, a := range r.accounts {
			if (fromStart || key.Compare(f.After) > 0) && f.Selects(key) {
				list = append(list, a)
			}
		}
		slices.SortFunc(list, func(a, b *ledger.Account) int { return a.Key.Compare(b.Key) })
		for _, a := range list[:min(f.Limit, len(list))] {
			out = append(out, *a)
		}
		return nil
	})
	return out, err
}

// Snapshot returns copies of every committed row in one consistent read:
// accounts by key, reservations by id, moves by receipt id, shards by id,
// policies by generation, statements and journal in insertion order (the
// journal after the last checkpoint), with JournalComplete set.
func (s *Store) Snapshot(ctx context.Context) (*ledger.Snapshot, error) {
	var snap *ledger.Snapshot
	err := s.read(ctx, func(r *rows) error {
		snap = r.snapshot()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// snapshot copies every row for Snapshot and AuditSnapshot.
func (r *rows) snapshot() *ledger.Snapshot {
	snap := &ledger.Snapshot{JournalComplete: true}
	for _, g := range slices.Sorted(maps.Keys(r.policies)) {
		snap.Policies = append(snap.Policies, copyPolicy(r.policies[g]))
	}
	keys := slices.SortedFunc(maps.Keys(r.accounts), ledger.AccountKey.Compare)
	for _, k := range keys {
		snap.Accounts = append(snap.Accounts, *r.accounts[k])
	}
	for _, id := range slices.Sorted(maps.Keys(r.reservations)) {
		snap.Reservations = append(snap.Reservations, *r.reservations[id])
	}
	for _, id := range slices.Sorted(maps.Keys(r.moves)) {
		snap.Moves = append(snap.Moves, *r.moves[id])
	}
	for _, id := range slices.Sorted(maps.Keys(r.shards)) {
		snap.Shards = append(snap.Shards, copyShard(r.shards[id]))
	}
	snap.Statements = slices.Clone(r.statements)
	snap.Journal, _ = r.journalSince()
	snap.Checkpoints = r.chainCopy()
	snap.Retained = retainedSnapshot(r)
	snap.RetainedShards = retainedShardsSnapshot(r)
	return snap
}

func copyPolicy(p *ledger.Policy) ledger.Policy {
	out := *p
	out.Dimensions = slices.Clone(p.Dimensions)
	return out
}

func copyShard(s *ledger.Shard) ledger.Shard {
	out := *s
	out.Signature = slices.Clone(s.Signature)
	return out
}

// AccountsView returns the store.AccountsView of subjects
// (store.ReadAccountsView), read in one hold of the lock. The hook of
// store.WithBetweenReads runs after it.
func (s *Store) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (view store.AccountsView, err error) {
	err = s.read(ctx, func(r *rows) error {
		view, err = store.ReadAccountsView(ctx, subjects, store.ViewReads{
			Accounts: func(keys []ledger.PolicyKey) (out []ledger.Account, _ error) {
				named := make(map[ledger.PolicyKey]bool, len(keys))
				for _, k := range keys {
					named[k] = true
				}
				for _, a := range r.accounts {
					if named[a.Key.SubjectKey()] {
						out = append(out, *a)
					}
				}
				return out, nil
			},
			Owing: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
				out := map[ledger.PolicyKey]store.SubjectOwing{}
				for _, k := range keys {
					if o, ok := owingOf(r, k); ok {
						out[k] = o
					}
				}
				return out, nil
			},
			Heads: func(keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
				out := make(map[ledger.PolicyKey]ledger.PolicyHead, len(keys))
				for _, k := range keys {
					if h, ok := r.heads[k]; ok {
						out[k] = *h
					}
				}
				return out, nil
			},
			Policies: func(generations []uint64) (map[uint64]ledger.Policy, error) {
				out := make(map[uint64]ledger.Policy, len(generations))
				for _, g := range generations {
					if p, ok := r.policies[g]; ok {
						out[g] = copyPolicy(p)
					}
				}
				return out, nil
			},
			Between: func() {}, // under the lock: BetweenReads runs after it
		})
		return err
	})
	if err != nil {
		return store.AccountsView{}, err
	}
	store.BetweenReads(ctx)
	return view, nil
}

// owingOf returns subject's current pointer and owing-set Meta rows in r,
// false when it has neither.
func owingOf(r *rows, k ledger.PolicyKey) (store.SubjectOwing, bool) {
	var o store.SubjectOwing
	o.Current, o.HasCurrent = r.currents[k]
	base := ledger.OwingMetaName(k)
	if v, ok := r.meta[base]; ok {
		o.Meta = map[string]int64{base: v}
		for i := range int(max(v, 0)) {
			name := base + "/" + strconv.Itoa(i)
			if v, ok := r.meta[name]; ok {
				o.Meta[name] = v
			}
		}
	}
	return o, o.HasCurrent || o.Meta != nil
}
