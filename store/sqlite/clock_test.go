package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The row cache is bounded and evicts the least recently used rows one at
// a time: it never grows past its limit, never clears itself wholesale,
// and rows in use survive a scan of many more rows than fit.
func TestClockTableEvictsColdRowsOnly(t *testing.T) {
	const limit = 100
	table := newClockTable[int, int](limit)
	one := 1
	hot := []int{-1, -2, -3, -4, -5}
	for _, k := range hot {
		table.put(k, cached[int]{row: &one})
	}
	for i := range 10 * limit {
		// The hot rows are read between every few scanned rows, as a
		// busy tenant's account is between others' first reserves.
		if i%10 == 0 {
			for _, k := range hot {
				if _, ok := table.get(k); !ok {
					t.Fatalf("hot row %d evicted after %d scanned rows", k, i)
				}
			}
		}
		table.put(i, cached[int]{row: &one})
		if n := table.len(); n > limit {
			t.Fatalf("%d rows cached, limit %d", n, limit)
		}
		if i >= limit && table.len() != limit {
			t.Fatalf("after %d rows the cache holds %d: it cleared itself", i, table.len())
		}
		if len(table.index) != table.len() {
			t.Fatalf("index %d entries, %d slots", len(table.index), table.len())
		}
	}
	// The most recent scanned rows are cached, the oldest are not.
	if _, ok := table.get(10*limit - 1); !ok {
		t.Error("the last row put is not cached")
	}
	if _, ok := table.get(0); ok {
		t.Error("the first scanned row is still cached after 10 limits of others")
	}
	// Deleting keeps the index and slots consistent.
	table.delete(-3)
	table.delete(10*limit - 1)
	if _, ok := table.get(-3); ok {
		t.Error("deleted row still cached")
	}
	for k, i := range table.index {
		if table.slots[i].key != k {
			t.Fatalf("index says %d is in slot %d, which holds %d", k, i, table.slots[i].key)
		}
	}
}

// Through the store: with a small cache, every account still reads back
// as committed (from the cache or, once evicted, from the file), and the
// cache stays within its bound.
func TestRowCacheBoundedThroughTheStore(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "cache.db"), WithCacheRows(32))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := func(i int) ledger.AccountKey {
		return ledger.AccountKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat", Region: "eu", Generation: 1}
	}
	const accounts = 500
	var all []ledger.Account
	for i := range accounts {
		a := ledger.Account{Key: key(i), Dims: 1, Version: uint64(i + 1)}
		a.Balances[0] = ledger.Balance{Opening: 1000, Available: int64(1000 - i), Reserved: int64(i)}
		all = append(all, a)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: all}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range accounts {
			a, err := tx.AccountGet(ctx, key(i))
			if err != nil {
				t.Fatal(err)
			}
			if a.Balances[0].Available != int64(1000-i) || a.Version != uint64(i+1) {
				t.Fatalf("round %d: account %d reads %+v", round, i, a.Balances[0])
			}
		}
		tx.Rollback(ctx)
		st := s.CacheStats()
		if st.Accounts > 32 || st.Limit != 32 {
			t.Fatalf("round %d: cache %+v, want at most 32 accounts", round, st)
		}
	}
	if st := s.CacheStats(); st.Evictions == 0 {
		t.Fatalf("cache %+v: no evictions after reading %d accounts through 32 slots", st, accounts)
	}
	if _, err := Open(ctx, filepath.Join(t.TempDir(), "zero.db"), WithCacheRows(0)); err == nil {
		t.Fatal("a row cache of 0 rows opened")
	}
}
