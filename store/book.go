package store

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
)

// Book is the ledger.Book of one batch: it reads rows through a store
// transaction on first use, keeps them for the rest of the batch (so a hot
// account is read and locked once per batch, not once per command), and
// collects every Put into one store.Changes written at the end.
//
// A read error other than ErrNotFound is remembered (Err) and the row
// reported absent; the book's owner then discards the batch whole (the
// engine's Core.Commit does), so the ledger never acts on a half-read view.
// The engine and the conformance suite (storetest) both drive the ledger
// through it.
type Book struct {
	ctx context.Context
	tx  Tx
	err error

	meta         map[string]int64
	metaDirty    map[string]bool
	metaGone     map[string]bool
	policies     map[uint64]*ledger.Policy
	policyDirty  map[uint64]bool
	heads        map[ledger.PolicyKey]*ledger.PolicyHead
	headDirty    map[ledger.PolicyKey]bool
	accounts     map[ledger.AccountKey]*ledger.Account
	accountDirty map[ledger.AccountKey]bool
	current      map[ledger.PolicyKey]uint64
	currentKnown map[ledger.PolicyKey]bool
	currentDirty map[ledger.PolicyKey]bool
	reservations map[string]*ledger.Reservation
	resDirty     map[string]bool
	resNew       map[string]bool
	moves        map[string]*ledger.Move
	moveNew      map[string]bool
	shards       map[string]*ledger.Shard
	shardDirty   map[string]bool
	shardGone    map[string]bool
	statements   []ledger.Statement
	journal      []ledger.JournalEntry
	ret          bookRetention
}

// NewBook returns the book of a batch of the given number of commands
// over tx. The maps a reserve needs are sized for the batch (a batch over
// as many subjects as commands fills them; growing them cost a rehash per
// doubling); the others are made on first write (a nil map reads as
// empty), so a batch pays for what it uses.
func NewBook(ctx context.Context, tx Tx, commands int) *Book {
	return &Book{
		ctx: ctx, tx: tx,
		policies:     make(map[uint64]*ledger.Policy, 1),
		heads:        make(map[ledger.PolicyKey]*ledger.PolicyHead, commands+1),
		accounts:     make(map[ledger.AccountKey]*ledger.Account, commands),
		accountDirty: make(map[ledger.AccountKey]bool, commands),
		current:      make(map[ledger.PolicyKey]uint64, commands),
		currentKnown: make(map[ledger.PolicyKey]bool, commands),
		reservations: make(map[string]*ledger.Reservation, commands),
		resDirty:     make(map[string]bool, commands),
		resNew:       make(map[string]bool, commands),
		journal:      make([]ledger.JournalEntry, 0, commands),
	}
}

// set stores v under k in *m, making the map on first use.
func set[K comparable, V any](m *map[K]V, k K, v V) {
	if *m == nil {
		*m = make(map[K]V)
	}
	(*m)[k] = v
}

// note records a read error; ErrNotFound is an answer, not an error.
// Err returns the first read error, or nil.
func (b *Book) Err() error { return b.err }

func (b *Book) note(err error) {
	if err != nil && !errors.Is(err, ErrNotFound) && b.err == nil {
		b.err = err
	}
}

func (b *Book) Meta(name string) int64 {
	if v, ok := b.meta[name]; ok {
		return v
	}
	v, err := b.tx.MetaGet(b.ctx, name)
	b.note(err)
	set(&b.meta, name, v)
	return v
}

func (b *Book) MetaPut(name string, value int64) {
	set(&b.meta, name, value)
	set(&b.metaDirty, name, true)
	delete(b.metaGone, name)
}

// MetaRemove deletes a named counter (ledger.MetaRemover): Changes lists
// it in MetaRemoved, and Meta answers 0 for it meanwhile.
func (b *Book) MetaRemove(name string) {
	set(&b.meta, name, 0)
	delete(b.metaDirty, name)
	set(&b.metaGone, name, true)
}

func (b *Book) Policy(generation uint64) (*ledger.Policy, bool) {
	if p, ok := b.policies[generation]; ok {
		return p, p != nil
	}
	p, err := b.tx.PolicyGet(b.ctx, generation)
	b.note(err)
	if err != nil {
		p = nil
	}
	b.policies[generation] = p
	return p, p != nil
}

func (b *Book) PolicyPut(p *ledger.Policy) {
	b.policies[p.Generation] = p
	set(&b.policyDirty, p.Generation, true)
}

func (b *Book) PolicyHead(key ledger.PolicyKey) (*ledger.PolicyHead, bool) {
	if h, ok := b.heads[key]; ok {
		return h, h != nil
	}
	h, err := b.tx.PolicyHeadGet(b.ctx, key)
	b.note(err)
	if err != nil {
		h = nil
	}
	b.heads[key] = h
	return h, h != nil
}

func (b *Book) PolicyHeadPut(h *ledger.PolicyHead) {
	b.heads[h.Key] = h
	set(&b.headDirty, h.Key, true)
}

func (b *Book) Account(key ledger.AccountKey) (*ledger.Account, bool) {
	if a, ok := b.accounts[key]; ok {
		return a, a != nil
	}
	a, err := b.tx.AccountGet(b.ctx, key)
	b.note(err)
	if err != nil {
		a = nil
	}
	b.accounts[key] = a
	return a, a != nil
}

func (b *Book) AccountPut(a *ledger.Account) {
	b.accounts[a.Key] = a
	b.accountDirty[a.Key] = true
}

func (b *Book) AccountCurrent(subject ledger.PolicyKey) (uint64, bool) {
	if b.currentKnown[subject] {
		g, ok := b.current[subject]
		return g, ok
	}
	g, err := b.tx.AccountCurrentGet(b.ctx, subject)
	b.note(err)
	b.currentKnown[subject] = true
	if err != nil {
		return 0, false
	}
	b.current[subject] = g
	return g, true
}

func (b *Book) AccountCurrentPut(subject ledger.PolicyKey, generation uint64) {
	b.currentKnown[subject] = true
	b.current[subject] = generation
	set(&b.currentDirty, subject, true)
}

func (b *Book) Reservation(id string) (*ledger.Reservation, bool) {
	if r, ok := b.reservations[id]; ok {
		return r, r != nil
	}
	r, err := b.tx.ReservationGet(b.ctx, id)
	b.note(err)
	if err != nil {
		r = nil
	}
	b.reservations[id] = r
	return r, r != nil
}

func (b *Book) ReservationPut(r *ledger.Reservation) {
	if existing, ok := b.reservations[r.ID]; !ok || existing == nil {
		b.resNew[r.ID] = true
	}
	b.reservations[r.ID] = r
	b.resDirty[r.ID] = true
}

func (b *Book) Move(receiptID string) (*ledger.Move, bool) {
	if m, ok := b.moves[receiptID]; ok {
		return m, m != nil
	}
	m, err := b.tx.MoveGet(b.ctx, receiptID)
	b.note(err)
	if err != nil {
		m = nil
	}
	set(&b.moves, receiptID, m)
	return m, m != nil
}

func (b *Book) MovePut(m *ledger.Move) {
	set(&b.moves, m.ReceiptID, m)
	set(&b.moveNew, m.ReceiptID, true)
}

func (b *Book) Shard(id string) (*ledger.Shard, bool) {
	if s, ok := b.shards[id]; ok {
		return s, s != nil
	}
	s, err := b.tx.ShardGet(b.ctx, id)
	b.note(err)
	if err != nil {
		s = nil
	}
	set(&b.shards, id, s)
	return s, s != nil
}

func (b *Book) ShardPut(s *ledger.Shard) {
	set(&b.shards, s.ID, s)
	set(&b.shardDirty, s.ID, true)
	delete(b.shardGone, s.ID)
}

func (b *Book) StatementPut(s ledger.Statement) { b.statements = append(b.statements, s) }

func (b *Book) JournalAppend(e ledger.JournalEntry) { b.journal = append(b.journal, e) }

// Changes returns everything the batch wrote, rows in key order so every
// replica writes (and so locks) in the same order.
func (b *Book) Changes() *Changes {
	c := &Changes{Statements: b.statements, Journal: b.journal}
	if len(b.metaDirty) > 0 {
		c.Meta = make(map[string]int64, len(b.metaDirty))
		for name := range b.metaDirty {
			c.Meta[name] = b.meta[name]
		}
	}
	if len(b.metaGone) > 0 {
		c.MetaRemoved = sortedKeys(b.metaGone, strings.Compare)
	}
	for _, g := range sortedKeys(b.policyDirty, cmp.Compare) {
		c.Policies = append(c.Policies, *b.policies[g])
	}
	if len(b.headDirty) > 0 {
		c.Heads = make([]ledger.PolicyHead, 0, len(b.headDirty))
		for _, k := range sortedKeys(b.headDirty, ledger.PolicyKey.Compare) {
			c.Heads = append(c.Heads, *b.heads[k])
		}
	}
	if len(b.accountDirty) > 0 {
		// Made at its size: an account is about 700 bytes, and a batch
		// over many subjects writes one for each.
		c.Accounts = make([]ledger.Account, 0, len(b.accountDirty))
		for _, k := range sortedKeys(b.accountDirty, ledger.AccountKey.Compare) {
			c.Accounts = append(c.Accounts, *b.accounts[k])
		}
	}
	if len(b.currentDirty) > 0 {
		c.Currents = make([]Current, 0, len(b.currentDirty))
		for _, k := range sortedKeys(b.currentDirty, ledger.PolicyKey.Compare) {
			c.Currents = append(c.Currents, Current{Subject: k, Generation: b.current[k]})
		}
	}
	if len(b.resDirty) > 0 {
		c.NewReservations = make(map[string]bool, len(b.resNew))
		c.Reservations = make([]ledger.Reservation, 0, len(b.resDirty))
		for _, id := range sortedKeys(b.resDirty, strings.Compare) {
			c.Reservations = append(c.Reservations, *b.reservations[id])
			if b.resNew[id] {
				c.NewReservations[id] = true
			}
		}
	}
	for _, id := range sortedKeys(b.moveNew, strings.Compare) {
		c.Moves = append(c.Moves, *b.moves[id])
	}
	for _, id := range sortedKeys(b.shardDirty, strings.Compare) {
		c.Shards = append(c.Shards, *b.shards[id])
	}
	b.retentionChanges(c)
	b.removedShards(c)
	return c
}

// sortedKeys returns the keys of set in compare's order, in a slice made
// at its size (collecting them into a growing one cost an allocation and
// a copy per doubling, per batch).
func sortedKeys[K comparable](set map[K]bool, compare func(a, b K) int) []K {
	if len(set) == 0 {
		return nil
	}
	keys := make([]K, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compare)
	return keys
}
