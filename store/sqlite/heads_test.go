package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// TestPolicyHeadsCachedWhole: the row cache holds every policy head, so
// subjects without a head of their own are answered "not found" from the
// cache without one entry each, and heads written since (by this store
// or by another connection to the file) are found.
func TestPolicyHeadsCachedWhole(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	head := func(subject string) ledger.PolicyHead {
		return ledger.PolicyHead{Key: ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}, Active: 1, Latest: 1}
	}
	write := func(st *Store, h ledger.PolicyHead) {
		t.Helper()
		tx, err := st.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.Write(ctx, &store.Changes{Heads: []ledger.PolicyHead{h}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// found reads the heads of subjects in one transaction.
	found := func(subjects ...string) (n int) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for _, subject := range subjects {
			h, err := tx.PolicyHeadGet(ctx, head(subject).Key)
			switch {
			case err == nil && h.Key.Subject == subject:
				n++
			case !errors.Is(err, store.ErrNotFound):
				t.Fatalf("head of %s: %+v %v", subject, h, err)
			}
		}
		return n
	}
	write(s, head(ledger.AnySubject))
	var many []string
	for i := range 1000 {
		many = append(many, "tenant-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if n := found(append(many, ledger.AnySubject)...); n != 1 {
		t.Fatalf("%d heads found; want the one of %q", n, ledger.AnySubject)
	}
	s.cache.mu.Lock()
	complete, cached := s.cache.heads.complete, s.cache.heads.len()
	s.cache.mu.Unlock()
	if !complete || cached != 1 {
		t.Fatalf("heads table complete %v with %d rows; want complete with the 1 head", complete, cached)
	}
	write(s, head("tenant-own"))
	if found("tenant-own") != 1 {
		t.Fatal("a head this store committed is not found")
	}
	write(other, head("tenant-other"))
	if found("tenant-other", "tenant-own") != 2 {
		t.Fatal("a head another connection committed is not found")
	}
}

// A complete heads table that evicts a head to make room is no longer
// complete: the evicted head is read again, not answered "not found".
func TestPolicyHeadsEvictionEndsCompleteness(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), WithCacheRows(2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	key := func(subject string) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}
	}
	write := func(subject string) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.Write(ctx, &store.Changes{Heads: []ledger.PolicyHead{{Key: key(subject), Active: 1, Latest: 1}}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	missing := func(subjects ...string) []string {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var out []string
		for _, subject := range subjects {
			if _, err := tx.PolicyHeadGet(ctx, key(subject)); errors.Is(err, store.ErrNotFound) {
				out = append(out, subject)
			} else if err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	write("a")
	write("b")
	if m := missing("a", "b"); len(m) != 0 {
		t.Fatalf("heads not found: %v", m)
	}
	write("c") // the table is full: a head is evicted
	if m := missing("a", "b", "c"); len(m) != 0 {
		t.Fatalf("heads not found after an eviction: %v", m)
	}
}
