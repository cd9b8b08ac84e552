package sqlite

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// TestAccountPrefetchChunksRepeatAtMostOneKey: the prefetch reads n keys
// in statements of the sizes it prepares, repeating at most one key to
// fill the last one, in few statements.
func TestAccountPrefetchChunksRepeatAtMostOneKey(t *testing.T) {
	for n := 2; n <= 1000; n++ {
		chunks := accountPrefetchChunks(n)
		sum := 0
		for _, c := range chunks {
			if accountPrefetchQueries[c] == "" {
				t.Fatalf("%d keys: a statement of %d, not a prepared size %v", n, c, accountPrefetchSizes)
			}
			sum += c
		}
		if sum < n || sum > n+1 {
			t.Fatalf("%d keys in statements %v (%d keys): want n or n+1", n, chunks, sum)
		}
		if max := n/accountPrefetchSizes[0] + len(accountPrefetchSizes); len(chunks) > max {
			t.Fatalf("%d keys in %d statements %v, want at most %d", n, len(chunks), chunks, max)
		}
	}
}

// TestAccountsPrefetchAnswersFromTheCache: AccountsPrefetch reads the
// current generation and its account of many subjects (more than one
// statement carries) into the row cache, a subject without a current row
// as absent, and the getters then answer exactly what the rows hold.
func TestAccountsPrefetchAnswersFromTheCache(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), WithCacheRows(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := func(i int) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%03d", i), Route: "chat", Region: "eu"}
	}
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var c store.Changes
	const subjects = 300 // three chunks of 128
	for i := range subjects {
		k := key(i)
		g := uint64(1 + i%2)
		c.Currents = append(c.Currents, store.Current{Subject: k, Generation: g})
		if i%10 == 9 {
			continue // a current without its account
		}
		c.Accounts = append(c.Accounts, ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g},
			Dims: 1, EpochStart: epoch, Balances: ledger.Balances{{Opening: 1000, Available: ledger.Units(i)}}})
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s.cache.invalidate()

	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var asked []ledger.PolicyKey
	for i := range subjects + 20 { // 20 subjects without any row
		asked = append(asked, key(i), key(i)) // repeated keys are read once
	}
	if err := tx.(*Tx).AccountsPrefetch(ctx, asked, nil, nil); err != nil {
		t.Fatal(err)
	}
	s.cache.mu.Lock()
	currents, accounts := s.cache.currents.len(), s.cache.accounts.len()
	s.cache.mu.Unlock()
	if currents != subjects+20 || accounts != subjects {
		t.Fatalf("cached %d currents and %d accounts; want %d and %d", currents, accounts, subjects+20, subjects)
	}
	for i := range subjects + 20 {
		k := key(i)
		g, err := tx.AccountCurrentGet(ctx, k)
		if i >= subjects {
			if !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("subject %d without a current: %d, %v", i, g, err)
			}
			continue
		}
		if err != nil || g != uint64(1+i%2) {
			t.Fatalf("current of subject %d: %d, %v", i, g, err)
		}
		a, err := tx.AccountGet(ctx, ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g})
		switch {
		case i%10 == 9:
			if !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("subject %d has no account: %+v, %v", i, a, err)
			}
		case err != nil || a.Balances[0].Available != ledger.Units(i) || !a.EpochStart.Equal(epoch):
			t.Fatalf("account of subject %d: %+v, %v", i, a, err)
		}
	}
	s.cache.mu.Lock()
	grown := s.cache.currents.len() != currents || s.cache.accounts.len() != accounts
	s.cache.mu.Unlock()
	if grown {
		t.Error("the getters read rows the prefetch should have cached")
	}
}
