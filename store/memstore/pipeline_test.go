package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// A write that is durable at once (a Commit, and the removals outside
// transactions, as the SQL stores' are) must take the pipelined commits
// before it along: it may have been decided on them (a removal on rows a
// deferred commit settled), and a crash must never keep it while losing
// one of them. A power loss (LoseUnsynced) after a deferred commit and
// then such a write keeps both.
func TestDurableWriteMakesEarlierDeferredCommitsDurable(t *testing.T) {
	ctx := context.Background()
	account := reservation("rl-any").Account
	statements := func(t *testing.T, s *memstore.Store) int {
		t.Helper()
		got, err := s.StatementsOf(ctx, store.StatementFilter{Account: account, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(got)
	}
	for _, tc := range []struct {
		name string
		// write makes its write; kept reports whether it survived the crash.
		write func(t *testing.T, s *memstore.Store)
		kept  func(t *testing.T, s *memstore.Store) bool
	}{
		{
			name: "StatementsRemove",
			write: func(t *testing.T, s *memstore.Store) {
				if n, err := s.StatementsRemove(ctx, t0, 10); err != nil || n != 1 {
					t.Fatalf("StatementsRemove = %d, %v; want 1", n, err)
				}
			},
			kept: func(t *testing.T, s *memstore.Store) bool { return statements(t, s) == 0 },
		},
		{
			// The shard removal's transactions are committed so.
			name: "Commit",
			write: func(t *testing.T, s *memstore.Store) {
				if err := write(t, s, insert("rl-committed")).Commit(ctx); err != nil {
					t.Fatal(err)
				}
			},
			kept: func(t *testing.T, s *memstore.Store) bool { return exists(t, s, "rl-committed") },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New()
			s.SetPipelined(true)
			statement := ledger.Statement{Account: account, EpochStart: t0.Add(-time.Hour), EpochEnd: t0, Dims: 1}
			if err := write(t, s, &store.Changes{Statements: []ledger.Statement{statement}}).Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := write(t, s, insert("rl-deferred")).(store.DeferredCommitter).CommitDeferred(ctx); err != nil {
				t.Fatal(err)
			}
			if !s.Unsynced() {
				t.Fatal("the deferred commit is durable before any Sync")
			}
			tc.write(t, s)
			s.LoseUnsynced()
			if !tc.kept(t, s) {
				t.Errorf("the %s was lost in the crash: it is durable at once", tc.name)
			}
			if !exists(t, s, "rl-deferred") {
				t.Errorf("the deferred commit before the %s was lost in the crash", tc.name)
			}
		})
	}
}
