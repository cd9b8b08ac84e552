package storetest

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// txBook is a ledger.Book over one store transaction, the way the engine
// runs commands: every row read is cached (so a command that reads a row
// twice sees its own changes), every Put is collected, and Changes returns
// the batch for Tx.Write. A getter error other than store.ErrNotFound is
// remembered and the row reported absent; the owner must then discard the
// batch (Err says why).
type txBook struct {
	ctx context.Context
	tx  store.Tx
	err error

	// Caches map a key to the row read or put; a nil value records a row
	// known to be absent.
	meta         map[string]*int64
	policies     map[uint64]*ledger.Policy
	heads        map[ledger.PolicyKey]*ledger.PolicyHead
	accounts     map[ledger.AccountKey]*ledger.Account
	currents     map[ledger.PolicyKey]*uint64
	reservations map[string]*ledger.Reservation
	moves        map[string]*ledger.Move
	shards       map[string]*ledger.Shard

	// dirty sets name the rows to write; newReservations the ones absent
	// before this batch (inserts).
	dirtyMeta, dirtyReservations, newReservations, dirtyMoves, dirtyShards map[string]bool
	dirtyPolicies                                                          map[uint64]bool
	dirtyHeads, dirtyCurrents                                              map[ledger.PolicyKey]bool
	dirtyAccounts                                                          map[ledger.AccountKey]bool
	statements                                                             []ledger.Statement
	journal                                                                []ledger.JournalEntry
}

var _ ledger.Book = (*txBook)(nil)

func newTxBook(ctx context.Context, tx store.Tx) *txBook {
	return &txBook{
		ctx: ctx, tx: tx,
		meta: map[string]*int64{}, policies: map[uint64]*ledger.Policy{}, heads: map[ledger.PolicyKey]*ledger.PolicyHead{},
		accounts: map[ledger.AccountKey]*ledger.Account{}, currents: map[ledger.PolicyKey]*uint64{},
		reservations: map[string]*ledger.Reservation{}, moves: map[string]*ledger.Move{}, shards: map[string]*ledger.Shard{},
		dirtyMeta: map[string]bool{}, dirtyReservations: map[string]bool{}, newReservations: map[string]bool{},
		dirtyMoves: map[string]bool{}, dirtyShards: map[string]bool{}, dirtyPolicies: map[uint64]bool{},
		dirtyHeads: map[ledger.PolicyKey]bool{}, dirtyCurrents: map[ledger.PolicyKey]bool{},
		dirtyAccounts: map[ledger.AccountKey]bool{},
	}
}

// Err returns the first read error other than store.ErrNotFound, or nil.
func (b *txBook) Err() error { return b.err }

// load returns the cached row for key, reading it through get on a miss.
func load[K comparable, V any](b *txBook, cache map[K]*V, key K, get func(context.Context, K) (*V, error)) (*V, bool) {
	if v, ok := cache[key]; ok {
		return v, v != nil
	}
	v, err := get(b.ctx, key)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) && b.err == nil {
			b.err = err
		}
		v = nil
	}
	cache[key] = v
	return v, v != nil
}

func valueGetter[K comparable, V any](get func(context.Context, K) (V, error)) func(context.Context, K) (*V, error) {
	return func(ctx context.Context, k K) (*V, error) {
		v, err := get(ctx, k)
		if err != nil {
			return nil, err
		}
		return &v, nil
	}
}

func (b *txBook) Meta(name string) int64 {
	if v, ok := load(b, b.meta, name, valueGetter(b.tx.MetaGet)); ok {
		return *v
	}
	return 0
}

func (b *txBook) MetaPut(name string, value int64) {
	b.meta[name] = &value
	b.dirtyMeta[name] = true
}

func (b *txBook) Policy(g uint64) (*ledger.Policy, bool) {
	return load(b, b.policies, g, b.tx.PolicyGet)
}
func (b *txBook) PolicyPut(p *ledger.Policy) {
	b.policies[p.Generation] = p
	b.dirtyPolicies[p.Generation] = true
}

func (b *txBook) PolicyHead(k ledger.PolicyKey) (*ledger.PolicyHead, bool) {
	return load(b, b.heads, k, b.tx.PolicyHeadGet)
}
func (b *txBook) PolicyHeadPut(h *ledger.PolicyHead) {
	b.heads[h.Key] = h
	b.dirtyHeads[h.Key] = true
}

func (b *txBook) Account(k ledger.AccountKey) (*ledger.Account, bool) {
	return load(b, b.accounts, k, b.tx.AccountGet)
}
func (b *txBook) AccountPut(a *ledger.Account) {
	b.accounts[a.Key] = a
	b.dirtyAccounts[a.Key] = true
}

func (b *txBook) AccountCurrent(k ledger.PolicyKey) (uint64, bool) {
	if g, ok := load(b, b.currents, k, valueGetter(b.tx.AccountCurrentGet)); ok {
		return *g, true
	}
	return 0, false
}
func (b *txBook) AccountCurrentPut(k ledger.PolicyKey, g uint64) {
	b.currents[k] = &g
	b.dirtyCurrents[k] = true
}

func (b *txBook) Reservation(id string) (*ledger.Reservation, bool) {
	return load(b, b.reservations, id, b.tx.ReservationGet)
}
func (b *txBook) ReservationPut(r *ledger.Reservation) {
	// A put of a row this batch never read must still know whether it is
	// an insert, so read it first.
	if _, existed := b.Reservation(r.ID); !existed && !b.dirtyReservations[r.ID] {
		b.newReservations[r.ID] = true
	}
	b.reservations[r.ID] = r
	b.dirtyReservations[r.ID] = true
}

func (b *txBook) Move(id string) (*ledger.Move, bool) { return load(b, b.moves, id, b.tx.MoveGet) }
func (b *txBook) MovePut(m *ledger.Move) {
	b.moves[m.ReceiptID] = m
	b.dirtyMoves[m.ReceiptID] = true
}

func (b *txBook) Shard(id string) (*ledger.Shard, bool) { return load(b, b.shards, id, b.tx.ShardGet) }
func (b *txBook) ShardPut(s *ledger.Shard) {
	b.shards[s.ID] = s
	b.dirtyShards[s.ID] = true
}

func (b *txBook) StatementPut(s ledger.Statement)     { b.statements = append(b.statements, s) }
func (b *txBook) JournalAppend(e ledger.JournalEntry) { b.journal = append(b.journal, e) }

// Changes returns everything put so far, each kind of row in a fixed order.
func (b *txBook) Changes() *store.Changes {
	c := &store.Changes{Statements: b.statements, Journal: b.journal}
	if len(b.dirtyMeta) > 0 {
		c.Meta = map[string]int64{}
		for name := range b.dirtyMeta {
			c.Meta[name] = *b.meta[name]
		}
	}
	for _, g := range slices.Sorted(maps.Keys(b.dirtyPolicies)) {
		c.Policies = append(c.Policies, *b.policies[g])
	}
	for _, k := range slices.SortedFunc(maps.Keys(b.dirtyHeads), comparePolicyKeys) {
		c.Heads = append(c.Heads, *b.heads[k])
	}
	for _, k := range slices.SortedFunc(maps.Keys(b.dirtyAccounts), compareAccountKeys) {
		c.Accounts = append(c.Accounts, *b.accounts[k])
	}
	for _, k := range slices.SortedFunc(maps.Keys(b.dirtyCurrents), comparePolicyKeys) {
		c.Currents = append(c.Currents, store.Current{Subject: k, Generation: *b.currents[k]})
	}
	for _, id := range slices.Sorted(maps.Keys(b.dirtyReservations)) {
		c.Reservations = append(c.Reservations, *b.reservations[id])
	}
	if len(b.newReservations) > 0 {
		c.NewReservations = maps.Clone(b.newReservations)
	}
	for _, id := range slices.Sorted(maps.Keys(b.dirtyMoves)) {
		c.Moves = append(c.Moves, *b.moves[id])
	}
	for _, id := range slices.Sorted(maps.Keys(b.dirtyShards)) {
		c.Shards = append(c.Shards, *b.shards[id])
	}
	return c
}

func comparePolicyKeys(a, b ledger.PolicyKey) int {
	return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Route, b.Route), cmp.Compare(a.Region, b.Region))
}

func compareAccountKeys(a, b ledger.AccountKey) int {
	return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Route, b.Route),
		cmp.Compare(a.Region, b.Region), cmp.Compare(a.Generation, b.Generation))
}
