package sqlite

import (
	"slices"
	"sync"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// DefaultCacheRows bounds the row cache: the most rows of each cached
// table (accounts, account currents, policy heads, ...) it keeps. A
// tenant (its account and current generation, kept encoded) costs about
// 260 bytes cached, so the default holds the 524,288 most recently used
// tenants in about 135 MB whatever the number of accounts in the file:
// about as much memory as 131,072 accounts took as structs. A million
// would fit in about 260 MB, but then a checkpoint cut over a million
// accounts (about 160 MB more live heap) ran the GC near serve's memory
// limit and took twice the CPU (docs/PERFORMANCE.md, a million tenants).
const DefaultCacheRows = 1 << 19

// WithCacheRows sets the row cache's bound, rows per cached table
// (default DefaultCacheRows; at least 1).
func WithCacheRows(n int) Option { return func(c *config) { c.cacheRows = n } }

// cached is one cached row, or the knowledge that the row does not exist
// (row nil).
type cached[T any] struct{ row *T }

// clockEntry is what a clock's slot holds: the key the clock indexes it
// by, and the rest of the entry.
type clockEntry[K comparable] interface{ clockKey() K }

// clock is the one CLOCK algorithm (second chance, an approximation of
// least recently used that costs one flag per hit) of both kinds of row
// cache table (clockTable, packedTable): at most limit slots, indexed by
// key. A hit sets its slot's used flag and the hand passing by clears it,
// so a row the hand finds unused since its last pass is evicted: a working
// set that fits stays cached however many rows the table holds, and a scan
// over more rows than fit evicts only what it passes, never the whole
// cache.
type clock[K comparable, S clockEntry[K]] struct {
	index map[K]int32
	slots []S
	// used[i] is slot i's flag (kept beside the slots, not in them, so a
	// slot pays no padding for it).
	used  []bool
	hand  int
	limit int
	// evictions counts slots evicted to make room (tests, metrics).
	evictions uint64
}

func newClock[K comparable, S clockEntry[K]](limit int) clock[K, S] {
	return clock[K, S]{index: map[K]int32{}, limit: max(limit, 1)}
}

// slot returns the index of key's slot and whether it holds one.
func (c *clock[K, S]) slot(key K) (int32, bool) {
	i, ok := c.index[key]
	return i, ok
}

// touch marks slot i used (a hit).
func (c *clock[K, S]) touch(i int32) { c.used[i] = true }

// set replaces slot i's entry, whose key indexes slot i, and marks it used.
func (c *clock[K, S]) set(i int32, e S) { c.slots[i], c.used[i] = e, true }

// add puts e, whose key holds no slot, in a free slot or else in the
// first unused one the hand finds, and returns whether that evicted an
// entry. The new entry starts unused, so a row read once is the next to
// go unless it is read again: one pass of a scan cannot flush the hot
// rows.
func (c *clock[K, S]) add(e S) (evicted bool) {
	if len(c.slots) < c.limit {
		c.index[e.clockKey()] = int32(len(c.slots))
		c.slots = append(c.slots, e)
		c.used = append(c.used, false)
		return false
	}
	// Full: advance the hand past used slots (clearing their flag) to the
	// first unused one.
	for c.used[c.hand] {
		c.used[c.hand] = false
		c.hand = (c.hand + 1) % len(c.slots)
	}
	delete(c.index, c.slots[c.hand].clockKey())
	c.slots[c.hand], c.used[c.hand] = e, false
	c.index[e.clockKey()] = int32(c.hand)
	c.hand = (c.hand + 1) % len(c.slots)
	c.evictions++
	return true
}

// remove empties slot i, moving the last slot into it.
func (c *clock[K, S]) remove(i int32) {
	last := len(c.slots) - 1
	delete(c.index, c.slots[i].clockKey())
	if int(i) != last {
		c.slots[i], c.used[i] = c.slots[last], c.used[last]
		c.index[c.slots[i].clockKey()] = i
	}
	var zero S
	c.slots[last] = zero
	c.slots, c.used = c.slots[:last], c.used[:last]
	if c.hand >= len(c.slots) {
		c.hand = 0
	}
}

// reset empties the clock, keeping its memory.
func (c *clock[K, S]) reset() {
	clear(c.index)
	clear(c.slots)
	c.slots, c.used = c.slots[:0], c.used[:0]
	c.hand = 0
}

func (c *clock[K, S]) len() int { return len(c.slots) }

// clockSlot is one entry of a clockTable.
type clockSlot[K comparable, T any] struct {
	key K
	val cached[T]
}

func (s clockSlot[K, T]) clockKey() K { return s.key }

// clockTable is one table's part of the row cache, its rows kept as
// structs: at most limit rows, evicted by the CLOCK algorithm (clock).
type clockTable[K comparable, T any] struct {
	clock[K, clockSlot[K, T]]
	// complete is set while the table holds every row of its SQL table,
	// so a key it does not hold does not exist (completeHeads); an
	// eviction or a reset clears it.
	complete bool
}

func newClockTable[K comparable, T any](limit int) *clockTable[K, T] {
	return &clockTable[K, T]{clock: newClock[K, clockSlot[K, T]](limit)}
}

func (t *clockTable[K, T]) get(key K) (cached[T], bool) {
	i, ok := t.slot(key)
	if !ok {
		return cached[T]{}, false
	}
	t.touch(i)
	return t.slots[i].val, true
}

func (t *clockTable[K, T]) put(key K, val cached[T]) {
	if i, ok := t.slot(key); ok {
		t.set(i, clockSlot[K, T]{key: key, val: val})
		return
	}
	if t.add(clockSlot[K, T]{key: key, val: val}) {
		t.complete = false
	}
}

func (t *clockTable[K, T]) delete(key K) {
	// The slot goes; the last slot moves into its place in the clock.
	if i, ok := t.slot(key); ok {
		t.remove(i)
	}
}

func (t *clockTable[K, T]) reset() {
	t.clock.reset()
	t.complete = false
}

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
	// heads (one row per policy key: with a policy per tenant, per
	// tenant), accounts and currents (one row per tenant) are kept
	// encoded.
	heads    *packedTable[ledger.PolicyKey, ledger.PolicyHead]
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
		heads:    newPackedTable(rows, headCodec),
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

func (t *clockTable[K, T]) lookupRow(key K, clone func(*T) *T) (*T, bool, int32) {
	e, ok := t.get(key)
	if !ok {
		// In a complete table, a key not held is a row that does not
		// exist.
		return nil, t.complete, noSlot
	}
	if e.row == nil {
		return nil, true, noSlot
	}
	return clone(e.row), true, noSlot
}

func (t *clockTable[K, T]) rememberRow(key K, row *T, clone func(*T) *T) {
	if row != nil {
		row = clone(row)
	}
	t.put(key, cached[T]{row: row})
}

// lookup returns a copy of the cached row (nil with found true when the row
// is known not to exist); found is false when the key is not cached. slot
// is rowTable.lookupRow's hint.
func lookup[K comparable, T any](c *rowCache, m rowTable[K, T], key K, clone func(*T) *T) (row *T, found bool, slot int32) {
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
// generation) are only forgotten, to be read again. accountSlot returns
// where the transaction found an account in the cache (noSlot if it did
// not), a hint that saves looking it up again.
func (c *rowCache) committed(ch *store.Changes, accountSlot func(ledger.AccountKey) int32) {
	for name, v := range ch.Meta {
		remember(c, c.meta, name, &v, copyRow)
	}
	for _, name := range ch.MetaRemoved {
		remember[string, int64](c, c.meta, name, nil, copyRow)
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
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range ch.Accounts {
		// The packed table keeps the epoch start as Unix nanoseconds, as
		// the file does, and decodes it as a read returns it (UTC, no
		// monotonic reading), so the committed row is encoded as it stands:
		// no copy of it to convert first (a heap copy of every account).
		a := &ch.Accounts[i]
		c.accounts.rememberAt(a.Key, a, accountSlot(a.Key))
	}
	for i := range ch.Currents {
		c.currents.rememberRow(ch.Currents[i].Subject, &ch.Currents[i].Generation, nil)
	}
}
