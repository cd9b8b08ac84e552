package sqlite

import (
	"slices"
	"sync"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// DefaultCacheRows bounds the row cache: the most rows of each cached
// table (accounts, account currents, policy heads, ...) it keeps. A
// tenant (its account and current generation, kept encoded) costs about
// 275 bytes cached, so the default holds the 524,288 most recently used
// tenants in about 145 MB whatever the number of accounts in the file: as
// much memory as 131,072 accounts took as structs. A million would fit
// in about 290 MB, but then a checkpoint cut over a million accounts
// (about 160 MB more live heap) ran the GC near serve's memory limit and
// took twice the CPU (docs/PERFORMANCE.md, a million tenants).
const DefaultCacheRows = 1 << 19

// WithCacheRows sets the row cache's bound, rows per cached table
// (default DefaultCacheRows; at least 1).
func WithCacheRows(n int) Option { return func(c *config) { c.cacheRows = n } }

// cached is one cached row, or the knowledge that the row does not exist
// (row nil).
type cached[T any] struct{ row *T }

// clockSlot is one entry of a clockTable.
type clockSlot[K comparable, T any] struct {
	key K
	val cached[T]
	// used is set by every hit and cleared by the clock hand passing by:
	// a row the hand finds unused since its last pass is evicted.
	used bool
}

// clockTable is one table's part of the row cache: at most limit rows,
// evicted by the CLOCK algorithm (second chance, an approximation of
// least recently used that costs one flag per hit), so a working set that
// fits stays cached however many rows the table holds, and a scan over
// more rows than fit evicts only what it passes, never the whole cache.
type clockTable[K comparable, T any] struct {
	index map[K]int32
	slots []clockSlot[K, T]
	hand  int
	limit int
	// complete is set while the table holds every row of its SQL table,
	// so a key it does not hold does not exist (completeHeads); an
	// eviction or a reset clears it.
	complete bool
	// evictions counts rows evicted to make room (tests, metrics).
	evictions uint64
}

func newClockTable[K comparable, T any](limit int) *clockTable[K, T] {
	return &clockTable[K, T]{index: map[K]int32{}, limit: max(limit, 1)}
}

func (t *clockTable[K, T]) get(key K) (cached[T], bool) {
	i, ok := t.index[key]
	if !ok {
		return cached[T]{}, false
	}
	t.slots[i].used = true
	return t.slots[i].val, true
}

func (t *clockTable[K, T]) put(key K, val cached[T]) {
	if i, ok := t.index[key]; ok {
		t.slots[i].val, t.slots[i].used = val, true
		return
	}
	if len(t.slots) < t.limit {
		t.index[key] = int32(len(t.slots))
		t.slots = append(t.slots, clockSlot[K, T]{key: key, val: val})
		return
	}
	// Full: advance the hand past used rows (clearing their flag) to the
	// first unused one, and put the new row in its slot. The new row
	// starts unused, so a row read once is the next to go unless it is
	// read again: one pass of a scan cannot flush the hot rows.
	for t.slots[t.hand].used {
		t.slots[t.hand].used = false
		t.hand = (t.hand + 1) % len(t.slots)
	}
	t.complete = false
	victim := &t.slots[t.hand]
	delete(t.index, victim.key)
	*victim = clockSlot[K, T]{key: key, val: val}
	t.index[key] = int32(t.hand)
	t.hand = (t.hand + 1) % len(t.slots)
	t.evictions++
}

func (t *clockTable[K, T]) delete(key K) {
	i, ok := t.index[key]
	if !ok {
		return
	}
	// Keep the slot (its position in the clock) but mark the row as not
	// cached: move the last slot into it.
	last := len(t.slots) - 1
	delete(t.index, key)
	if int(i) != last {
		t.slots[i] = t.slots[last]
		t.index[t.slots[i].key] = i
	}
	t.slots[last] = clockSlot[K, T]{}
	t.slots = t.slots[:last]
	if t.hand >= len(t.slots) {
		t.hand = 0
	}
}

func (t *clockTable[K, T]) reset() {
	clear(t.index)
	clear(t.slots)
	t.slots = t.slots[:0]
	t.hand = 0
	t.complete = false
}

func (t *clockTable[K, T]) len() int { return len(t.slots) }

// rowCache keeps copies of the rows of the small, hot tables (meta,
// policies, policy heads, accounts, account currents) as this process's
// write connection last read or committed them, so a batch does not read
// the same policy and account rows from the B-trees again. Each table keeps
// at most the configured number of rows (WithCacheRows), evicting the
// least recently used ones (clockTable).
//
// It is valid only while no other connection has written the file: every
// write transaction first reads PRAGMA data_version, which changes exactly
// when another connection (another process, or another Store on the same
// file) committed, and then the cache starts over. A commit whose outcome is
// unknown also empties it. Rows are copied in and out, so no caller shares
// memory with the cache.
type rowCache struct {
	mu          sync.Mutex
	dataVersion int64
	known       bool // dataVersion was read at least once
	meta        *clockTable[string, int64]
	policies    *clockTable[uint64, ledger.Policy]
	heads       *clockTable[ledger.PolicyKey, ledger.PolicyHead]
	// accounts and currents, one row per tenant, are kept encoded.
	accounts *packedTable[ledger.AccountKey, ledger.Account]
	currents *packedTable[ledger.PolicyKey, uint64]
	// headsTooMany is set when the policy heads were too many to load
	// whole (completeHeads), until the cache starts over.
	headsTooMany bool
}

func newRowCache(rows int) *rowCache {
	return &rowCache{
		meta:     newClockTable[string, int64](rows),
		policies: newClockTable[uint64, ledger.Policy](rows),
		heads:    newClockTable[ledger.PolicyKey, ledger.PolicyHead](rows),
		accounts: newPackedTable(rows, accountCodec),
		currents: newPackedTable(rows, currentCodec),
	}
}

// resetLocked empties the tables in place: the table pointers never
// change, so getters may name them without the lock.
func (c *rowCache) resetLocked() {
	c.meta.reset()
	c.policies.reset()
	c.heads.reset()
	c.accounts.reset()
	c.currents.reset()
	c.headsTooMany = false
}

// sync empties the cache unless version is the data_version it was filled
// under (always read on the store's one write connection: the value is
// only comparable on one connection).
func (c *rowCache) sync(version int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.known || c.dataVersion != version {
		c.resetLocked()
		c.dataVersion, c.known = version, true
	}
}

// invalidate empties the cache and forgets the data_version, so the next
// transaction reads every row again.
func (c *rowCache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resetLocked()
	c.known = false
}

// CacheStats are the row cache's account table figures.
type CacheStats struct {
	// Accounts is how many account rows are cached; Limit the bound.
	Accounts, Limit int
	// Evictions counts account rows evicted to make room.
	Evictions uint64
}

// CacheStats returns the row cache's account figures.
func (s *Store) CacheStats() CacheStats {
	c := s.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Accounts: c.accounts.len(), Limit: c.accounts.limit, Evictions: c.accounts.evictions}
}

func copyPolicy(p *ledger.Policy) *ledger.Policy {
	out := *p
	out.Dimensions = slices.Clone(p.Dimensions)
	return &out
}

func copyRow[T any](v *T) *T {
	out := *v
	return &out
}

func (t *clockTable[K, T]) has(key K) bool {
	_, ok := t.index[key]
	return ok
}

func (t *clockTable[K, T]) lookupRow(key K, clone func(*T) *T) (*T, bool) {
	e, ok := t.get(key)
	if !ok {
		// In a complete table, a key not held is a row that does not
		// exist.
		return nil, t.complete
	}
	if e.row == nil {
		return nil, true
	}
	return clone(e.row), true
}

func (t *clockTable[K, T]) rememberRow(key K, row *T, clone func(*T) *T) {
	if row != nil {
		row = clone(row)
	}
	t.put(key, cached[T]{row: row})
}

// lookup returns a copy of the cached row (nil with found true when the row
// is known not to exist); found is false when the key is not cached.
func lookup[K comparable, T any](c *rowCache, m rowTable[K, T], key K, clone func(*T) *T) (row *T, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.lookupRow(key, clone)
}

// remember caches a copy of row (nil: the row does not exist).
func remember[K comparable, T any](c *rowCache, m rowTable[K, T], key K, row *T, clone func(*T) *T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m.rememberRow(key, row, clone)
}

// committed records what a committed transaction wrote to the cached
// tables, as a read would return it. Policies (written once per
// generation) are only forgotten, to be read again.
func (c *rowCache) committed(ch *store.Changes) {
	for name, v := range ch.Meta {
		remember(c, c.meta, name, &v, copyRow)
	}
	if len(ch.Policies) > 0 {
		c.mu.Lock()
		for i := range ch.Policies {
			c.policies.delete(ch.Policies[i].Generation)
		}
		c.mu.Unlock()
	}
	for i := range ch.Heads {
		remember(c, c.heads, ch.Heads[i].Key, &ch.Heads[i], copyRow)
	}
	for i := range ch.Accounts {
		// Times read back as UTC without a monotonic reading.
		a := ch.Accounts[i]
		var conv codec.Conv
		a.EpochStart = conv.Time(conv.Nanos(a.EpochStart))
		remember(c, c.accounts, a.Key, &a, copyRow)
	}
	for _, cur := range ch.Currents {
		remember(c, c.currents, cur.Subject, &cur.Generation, copyRow)
	}
}
