package ledger

import (
	"maps"
	"slices"
)

// Memory is an in-memory Book: the reference book for tests, benchmarks
// and the simulator's models. It is not safe for concurrent use.
type Memory struct {
	meta         map[string]int64
	policies     map[uint64]*Policy
	heads        map[PolicyKey]*PolicyHead
	accounts     map[AccountKey]*Account
	current      map[PolicyKey]currentRow
	reservations map[string]*Reservation
	moves        map[string]*Move
	shards       map[string]*Shard
	tombstones   map[string]*Tombstone
	retained     map[AccountKey]*Retained
	Statements   []Statement
	// Journal holds every entry unless DiscardJournal is set (benchmarks).
	Journal        []JournalEntry
	DiscardJournal bool

	// The rows most recently read or written, so that the lookups of one
	// command and of the next on the same hot account compare a key instead
	// of hashing it. Each points at the row stored in its map.
	lastAccount     *Account
	lastHead        *PolicyHead
	lastPolicy      *Policy
	lastReservation *Reservation
	lastCurrentKey  PolicyKey
	lastCurrent     currentRow
	lastCurrentOK   bool

	// slab holds the rows NewReservation has yet to hand out.
	slab []Reservation
}

// reservationSlab is how many reservation rows Memory allocates at once: a
// slab is 24 KiB, and it stays alive while any of its rows does.
const reservationSlab = 64

// NewReservation hands out a zeroed row from the current slab.
func (m *Memory) NewReservation() *Reservation {
	if len(m.slab) == 0 {
		m.slab = make([]Reservation, reservationSlab)
	}
	r := &m.slab[0]
	m.slab = m.slab[1:]
	return r
}

// NewMemory returns an empty in-memory book.
func NewMemory() *Memory {
	return &Memory{
		meta:         map[string]int64{},
		policies:     map[uint64]*Policy{},
		heads:        map[PolicyKey]*PolicyHead{},
		accounts:     map[AccountKey]*Account{},
		current:      map[PolicyKey]currentRow{},
		reservations: map[string]*Reservation{},
		moves:        map[string]*Move{},
		shards:       map[string]*Shard{},
	}
}

func (m *Memory) Meta(name string) int64           { return m.meta[name] }
func (m *Memory) MetaPut(name string, value int64) { m.meta[name] = value }

func (m *Memory) Policy(g uint64) (*Policy, bool) {
	if p := m.lastPolicy; p != nil && p.Generation == g {
		return p, true
	}
	p, ok := m.policies[g]
	if ok {
		m.lastPolicy = p
	}
	return p, ok
}

func (m *Memory) PolicyPut(p *Policy) {
	m.policies[p.Generation] = p
	m.lastPolicy = p
}

func (m *Memory) PolicyHead(k PolicyKey) (*PolicyHead, bool) {
	if h := m.lastHead; h != nil && h.Key == k {
		return h, true
	}
	h, ok := m.heads[k]
	if ok {
		m.lastHead = h
	}
	return h, ok
}

func (m *Memory) PolicyHeadPut(h *PolicyHead) {
	m.heads[h.Key] = h
	m.lastHead = h
}

func (m *Memory) Account(k AccountKey) (*Account, bool) {
	if a := m.lastAccount; a != nil && a.Key == k {
		return a, true
	}
	// Reserve asks which generation is current, then for that account:
	// the current row holds it, sparing a second hash of the key.
	if a := m.lastCurrent.account; m.lastCurrentOK && a != nil && a.Key == k {
		m.lastAccount = a
		return a, true
	}
	a, ok := m.accounts[k]
	if ok {
		m.lastAccount = a
	}
	return a, ok
}

func (m *Memory) AccountPut(a *Account) {
	if m.lastAccount == a {
		return // the row read from (or put in) the map: already stored
	}
	m.accounts[a.Key] = a
	m.lastAccount = a
	// A new row for the key (rare: the hot path puts back the row it read)
	// must not leave the subject's current row holding the old one.
	k := a.Key.SubjectKey()
	if c, ok := m.current[k]; ok && c.generation == a.Key.Generation && c.account != a {
		c.account = a
		m.current[k] = c
		if m.lastCurrentOK && m.lastCurrentKey == k {
			m.lastCurrent = c
		}
	}
}

// currentRow is a subject's current generation and that generation's
// account, held by value in the map so that a lookup is one probe, with
// no row object of its own to fetch.
type currentRow struct {
	generation uint64
	account    *Account
}

func (m *Memory) AccountCurrent(k PolicyKey) (uint64, bool) {
	if m.lastCurrentOK && m.lastCurrentKey == k {
		return m.lastCurrent.generation, true
	}
	c, ok := m.current[k]
	if !ok {
		return 0, false
	}
	m.lastCurrentKey, m.lastCurrent, m.lastCurrentOK = k, c, true
	return c.generation, true
}

func (m *Memory) AccountCurrentPut(k PolicyKey, g uint64) {
	c := m.current[k]
	if c.generation != g || c.account == nil {
		// The ledger puts the account before making it current.
		c = currentRow{generation: g, account: m.accounts[AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g}]}
		m.current[k] = c
	}
	m.lastCurrentKey, m.lastCurrent, m.lastCurrentOK = k, c, true
}

func (m *Memory) Reservation(id string) (*Reservation, bool) {
	if r := m.lastReservation; r != nil && r.ID == id {
		return r, true
	}
	r, ok := m.reservations[id]
	if ok {
		m.lastReservation = r
	}
	return r, ok
}

func (m *Memory) ReservationPut(r *Reservation) {
	if m.lastReservation == r {
		return
	}
	m.reservations[r.ID] = r
	m.lastReservation = r
}

func (m *Memory) Move(id string) (*Move, bool) { mv, ok := m.moves[id]; return mv, ok }
func (m *Memory) MovePut(mv *Move)             { m.moves[mv.ReceiptID] = mv }

func (m *Memory) Shard(id string) (*Shard, bool) { s, ok := m.shards[id]; return s, ok }
func (m *Memory) ShardPut(s *Shard)              { m.shards[s.ID] = s }

func (m *Memory) StatementPut(s Statement) { m.Statements = append(m.Statements, s) }
func (m *Memory) JournalAppend(e JournalEntry) {
	if !m.DiscardJournal {
		m.Journal = append(m.Journal, e)
	}
}

// Accounts returns every account, ordered by key.
func (m *Memory) Accounts() []*Account {
	out := slices.Collect(maps.Values(m.accounts))
	slices.SortFunc(out, func(a, b *Account) int { return a.Key.Compare(b.Key) })
	return out
}

// Reservations returns every reservation, ordered by id.
func (m *Memory) Reservations() []*Reservation {
	out := slices.Collect(maps.Values(m.reservations))
	slices.SortFunc(out, func(a, b *Reservation) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Moves returns every move receipt.
func (m *Memory) Moves() []*Move { return slices.Collect(maps.Values(m.moves)) }

// Shards returns every shard.
func (m *Memory) Shards() []*Shard { return slices.Collect(maps.Values(m.shards)) }

// Policies returns every published generation, oldest first.
func (m *Memory) Policies() []*Policy {
	out := slices.Collect(maps.Values(m.policies))
	slices.SortFunc(out, func(a, b *Policy) int { return int(a.Generation) - int(b.Generation) })
	return out
}

// Snapshot returns everything an audit needs.
func (m *Memory) Snapshot() *Snapshot {
	s := &Snapshot{Statements: m.Statements, Journal: m.Journal, JournalComplete: !m.DiscardJournal}
	for _, a := range m.Accounts() {
		s.Accounts = append(s.Accounts, *a)
	}
	for _, r := range m.Reservations() {
		s.Reservations = append(s.Reservations, *r)
	}
	for _, mv := range m.Moves() {
		s.Moves = append(s.Moves, *mv)
	}
	for _, sh := range m.Shards() {
		s.Shards = append(s.Shards, *sh)
	}
	for _, p := range m.Policies() {
		s.Policies = append(s.Policies, *p)
	}
	for _, r := range m.retained {
		s.Retained = append(s.Retained, *r)
	}
	slices.SortFunc(s.Retained, func(a, b Retained) int { return a.Account.Compare(b.Account) })
	return s
}
