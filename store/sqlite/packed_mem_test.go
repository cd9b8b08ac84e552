package sqlite

import (
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// TestPackedCacheBytesPerTenant reports what a cached tenant (its account
// and its current generation) costs in the row cache's packed tables
// against the struct tables they replaced (CAPLEDGER_CACHE_MEM=N tenants).
func TestPackedCacheBytesPerTenant(t *testing.T) {
	n := 0
	fmt.Sscan(os.Getenv("CAPLEDGER_CACHE_MEM"), &n)
	if n == 0 {
		t.Skip("CAPLEDGER_CACHE_MEM=N measures N tenants")
	}
	account := func(i int) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("bench-%d", i), Route: "bench.reserve", Region: "global", Generation: 1},
			Dims: 1, EpochStart: time.Unix(0, 1764720000000000000).UTC(), Version: 3}
		a.RefilledTo[0] = 1764748800123456789
		a.Balances[0] = ledger.Balance{Opening: 0, Minted: 1_000_000_000, Available: 1_000_000_000 - 200, Reserved: 200}
		return a
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, packed := range []bool{false, true} {
		before := heap()
		c := newRowCache(n)
		var keep any
		if packed {
			keep = c
		} else {
			accounts := newClockTable[ledger.AccountKey, ledger.Account](n)
			currents := newClockTable[ledger.PolicyKey, uint64](n)
			keep = []any{accounts, currents}
			for i := range n {
				a := account(i)
				g := uint64(1)
				currents.rememberRow(a.Key.SubjectKey(), &g, copyRow)
				accounts.rememberRow(a.Key, &a, copyRow)
			}
		}
		if packed {
			for i := range n {
				a := account(i)
				g := uint64(1)
				c.currents.rememberRow(a.Key.SubjectKey(), &g, copyRow)
				c.accounts.rememberRow(a.Key, &a, copyRow)
			}
		}
		after := heap()
		t.Logf("packed %v: %d tenants, %.0f bytes each", packed, n, float64(after-before)/float64(n))
		runtime.KeepAlive(keep)
	}
}

// A cached policy head (with a policy per tenant, one per tenant that
// reserved lately) is kept encoded, as accounts and currents are: about
// 100 bytes with its index entry and its key's strings, where as a struct
// with a pointer to a copy of the row it took about 217 and the strings
// the read allocated (this test, on the clockTable).
func TestHeadCacheBytesPerPolicyKey(t *testing.T) {
	const n = 50_000
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// The keys' strings, which the store's read of each row allocates,
	// are counted apart: a packed row copies them into its encoding.
	keys := make([]ledger.PolicyKey, n)
	for i := range keys {
		keys[i] = ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat.generate", Region: "eu"}
	}
	before := heap()
	c := newRowCache(n)
	for i, k := range keys {
		remember(c, c.heads, k, &ledger.PolicyHead{Key: k, Active: uint64(i + 1), Latest: uint64(i + 1)}, copyRow)
	}
	held := float64(int64(heap())-int64(before)) / n
	if h, found, _ := lookup(c, c.heads, keys[7], copyRow); !found || h == nil || h.Active != 8 || h.Key != keys[7] {
		t.Fatalf("head of %v: %+v, %v", keys[7], h, found)
	}
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys)
	t.Logf("%d policy heads cached: %.0f bytes each", n, held)
	if held > maxCachedHeadBytes {
		t.Fatalf("a cached policy head takes %.0f bytes, want at most %d", held, maxCachedHeadBytes)
	}
}

// maxCachedHeadBytes bounds TestHeadCacheBytesPerPolicyKey: what it
// measured plus about a quarter.
const maxCachedHeadBytes = 130
