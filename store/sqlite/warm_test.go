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

var warmEpoch = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func warmKey(i int) ledger.PolicyKey {
	return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%03d", i), Route: "chat", Region: "eu"}
}

func warmAccount(i int, available ledger.Units) ledger.Account {
	k := warmKey(i)
	return ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: 1},
		Dims: 1, EpochStart: warmEpoch, Balances: ledger.Balances{{Opening: 1000, Available: available}}}
}

// writeAccounts commits the accounts (and their currents, generation 1)
// through s's writer.
func writeAccounts(t *testing.T, s *Store, accounts ...ledger.Account) {
	t.Helper()
	ctx := context.Background()
	var c store.Changes
	for _, a := range accounts {
		c.Accounts = append(c.Accounts, a)
		c.Currents = append(c.Currents, store.Current{Subject: a.Key.SubjectKey(), Generation: a.Key.Generation})
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
}

// waitWarmed waits until the warmer has handled n subjects (cached or
// skipped).
func waitWarmed(t *testing.T, s *Store, n uint64) CacheStats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := s.CacheStats()
		if st.Warmed+st.WarmSkipped >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warmer handled %d+%d subjects; want %d", st.Warmed, st.WarmSkipped, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// availableNow reads subject i's account in a write transaction, as a
// batch would (from the row cache when it holds it).
func availableNow(t *testing.T, s *Store, i int) ledger.Units {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	g, err := tx.AccountCurrentGet(ctx, warmKey(i))
	if err != nil {
		t.Fatal(err)
	}
	k := warmKey(i)
	a, err := tx.AccountGet(ctx, ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g})
	if err != nil {
		t.Fatal(err)
	}
	return a.Balances[0].Available
}

// TestWarmAccountsCachesOffTheWriter: WarmAccounts reads the currents and
// accounts the row cache misses (more than one statement carries, and
// subjects without rows) on a read connection, so a transaction's
// AccountsPrefetch finds them all cached, and the getters answer what the
// rows hold.
func TestWarmAccountsCachesOffTheWriter(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), WithCacheRows(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const subjects = 300
	var accounts []ledger.Account
	for i := range subjects {
		accounts = append(accounts, warmAccount(i, ledger.Units(i)))
	}
	writeAccounts(t, s, accounts...)
	s.cache.invalidate()

	var asked []ledger.PolicyKey
	for i := range subjects + 20 { // 20 subjects without any row
		asked = append(asked, warmKey(i))
	}
	s.WarmAccounts(asked)
	if st := waitWarmed(t, s, subjects+20); st.Warmed != subjects+20 || st.WarmSkipped != 0 {
		t.Fatalf("warmed %d, skipped %d; want %d and 0", st.Warmed, st.WarmSkipped, subjects+20)
	}
	s.cache.mu.Lock()
	currents, cachedAccounts := s.cache.currents.len(), s.cache.accounts.len()
	s.cache.mu.Unlock()
	if currents != subjects+20 || cachedAccounts != subjects {
		t.Fatalf("cached %d currents and %d accounts; want %d and %d", currents, cachedAccounts, subjects+20, subjects)
	}
	for _, i := range []int{0, 127, 128, 299} {
		if got := availableNow(t, s, i); got != ledger.Units(i) {
			t.Fatalf("subject %d: available %d, want %d", i, got, i)
		}
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.AccountCurrentGet(ctx, warmKey(subjects+3)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a subject without a current: %v", err)
	}
}

// TestWarmSkipsWhatChangedSinceItsRead: a row the warmer read before a
// commit changed it is not cached, even when the cache no longer holds
// the commit's row (evicted), nor after the cache was reset for another
// process's commit; the transaction then reads the new row.
func TestWarmSkipsWhatChangedSinceItsRead(t *testing.T) {
	ctx := context.Background()
	t.Run("commit", func(t *testing.T) {
		s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), WithCacheRows(4))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		writeAccounts(t, s, warmAccount(0, 1))
		for i := 1; i <= 4; i++ {
			writeAccounts(t, s, warmAccount(i, 0)) // evict subject 0
		}
		s.warm.afterRead = func() {
			// The warmer has read available 1. Commit 2, then evict it.
			writeAccounts(t, s, warmAccount(0, 2))
			for i := 5; i <= 8; i++ {
				writeAccounts(t, s, warmAccount(i, 0))
			}
			s.cache.mu.Lock()
			_, held := s.cache.accounts.index[warmAccount(0, 0).Key]
			s.cache.mu.Unlock()
			if held {
				t.Error("subject 0 still cached: the test does not evict it")
			}
		}
		s.WarmAccounts([]ledger.PolicyKey{warmKey(0)})
		if st := waitWarmed(t, s, 1); st.WarmSkipped != 1 {
			t.Errorf("warmed %d, skipped %d; want the read skipped", st.Warmed, st.WarmSkipped)
		}
		if got := availableNow(t, s, 0); got != 2 {
			t.Fatalf("available %d after the warmer; want 2, the committed row", got)
		}
	})
	t.Run("another process", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "capledger.db")
		s, err := Open(ctx, path, WithCacheRows(1))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		writeAccounts(t, s, warmAccount(0, 1))
		writeAccounts(t, s, warmAccount(1, 0)) // evicts subject 0
		other, err := Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		s.warm.afterRead = func() {
			// Another store commits 2; s's next transaction notices
			// (data_version) and resets its cache.
			writeAccounts(t, other, warmAccount(0, 2))
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			tx.Rollback(ctx)
		}
		s.WarmAccounts([]ledger.PolicyKey{warmKey(0)})
		if st := waitWarmed(t, s, 1); st.WarmSkipped != 1 {
			t.Errorf("warmed %d, skipped %d; want the read skipped", st.Warmed, st.WarmSkipped)
		}
		if got := availableNow(t, s, 0); got != 2 {
			t.Fatalf("available %d after the warmer; want 2, the committed row", got)
		}
	})
}
