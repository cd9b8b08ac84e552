package sqlite

import (
	"slices"
	"sync"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// maxCachedRows bounds the row cache: when a table's entries pass it the
// cache starts over (a ledger with that many hot accounts reads them again,
// which is what it did without the cache).
const maxCachedRows = 1 << 16

// cached is one cached row, or the knowledge that the row does not exist
// (row nil).
type cached[T any] struct{ row *T }

// rowCache keeps copies of the rows of the small, hot tables (meta,
// policies, policy heads, accounts, account currents) as this process's
// write connection last read or committed them, so a batch does not read
// the same policy and account rows from the B-trees again.
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
	meta        map[string]cached[int64]
	policies    map[uint64]cached[ledger.Policy]
	heads       map[ledger.PolicyKey]cached[ledger.PolicyHead]
	accounts    map[ledger.AccountKey]cached[ledger.Account]
	currents    map[ledger.PolicyKey]cached[uint64]
}

func newRowCache() *rowCache {
	return &rowCache{
		meta:     map[string]cached[int64]{},
		policies: map[uint64]cached[ledger.Policy]{},
		heads:    map[ledger.PolicyKey]cached[ledger.PolicyHead]{},
		accounts: map[ledger.AccountKey]cached[ledger.Account]{},
		currents: map[ledger.PolicyKey]cached[uint64]{},
	}
}

// resetLocked empties the maps in place: the map values never change, so
// getters may name them without the lock.
func (c *rowCache) resetLocked() {
	clear(c.meta)
	clear(c.policies)
	clear(c.heads)
	clear(c.accounts)
	clear(c.currents)
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

func copyPolicy(p *ledger.Policy) *ledger.Policy {
	out := *p
	out.Dimensions = slices.Clone(p.Dimensions)
	return &out
}

func copyRow[T any](v *T) *T {
	out := *v
	return &out
}

// lookup returns a copy of the cached row (nil with found true when the row
// is known not to exist); found is false when the key is not cached.
func lookup[K comparable, T any](c *rowCache, m map[K]cached[T], key K, clone func(*T) *T) (row *T, found bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := m[key]
	if !ok {
		return nil, false
	}
	if e.row == nil {
		return nil, true
	}
	return clone(e.row), true
}

// remember caches a copy of row (nil: the row does not exist).
func remember[K comparable, T any](c *rowCache, m map[K]cached[T], key K, row *T, clone func(*T) *T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(m) >= maxCachedRows {
		clear(m)
	}
	if row != nil {
		row = clone(row)
	}
	m[key] = cached[T]{row: row}
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
			delete(c.policies, ch.Policies[i].Generation)
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
