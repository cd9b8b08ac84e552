package sim

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// The recording store follows the store below in what a write that is
// durable at once does to the deferred commits before it (a Commit, as
// the shard removal's are, or a removal outside transactions, statements
// or journal rows: each makes them durable first, store/memstore's
// beforeApply): it hands the
// checker those commits as durable, before that write, so a crash then
// neither drops them from the checker's view while the store kept them
// nor shows the removal ahead of the commits it was decided on.
func TestRecStoreDurableWriteTakesEarlierDeferredCommits(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := ledger.AccountKey{Subject: "tenant-0", Route: "chat", Region: "eu", Generation: 1}
	statement := ledger.Statement{Account: account, EpochStart: t0.Add(-time.Hour), EpochEnd: t0, Dims: 1}
	reservation := func(id string) *store.Changes {
		return &store.Changes{NewReservations: map[string]bool{id: true}, Reservations: []ledger.Reservation{{
			ID: id, RequestDigest: "sha256:" + id, Account: account, Reserved: ledger.Amounts{10},
			State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}}}
	}
	commit := func(t *testing.T, st *recStore, c *store.Changes, deferred bool) {
		t.Helper()
		tx, err := st.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := tx.Write(ctx, c); err != nil {
			t.Fatal(err)
		}
		if deferred {
			err = tx.(store.DeferredCommitter).CommitDeferred(ctx)
		} else {
			err = tx.Commit(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	committed := reservation("rl-committed")
	for _, tc := range []struct {
		name string
		// write is the write durable at once; recorded, the change set
		// it records (nil: none).
		write    func(t *testing.T, st *recStore)
		recorded *store.Changes
	}{
		{name: "Commit", write: func(t *testing.T, st *recStore) { commit(t, st, committed, false) }, recorded: committed},
		{name: "StatementsRemove", write: func(t *testing.T, st *recStore) {
			if n, err := st.StatementsRemove(ctx, t0, 10); err != nil || n != 1 {
				t.Fatalf("StatementsRemove = %d, %v; want 1", n, err)
			}
		}},
		{name: "JournalCompact", write: func(t *testing.T, st *recStore) {
			// No checkpoint yet: it deletes nothing, durably all the same.
			if n, err := st.JournalCompact(ctx, 10); err != nil || n != 0 {
				t.Fatalf("JournalCompact = %d, %v; want 0", n, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memstore.New()
			mem.SetPipelined(true)
			st := &recStore{Store: mem, mem: mem}
			commit(t, st, &store.Changes{Statements: []ledger.Statement{statement}}, false)
			deferred := reservation("rl-deferred")
			commit(t, st, deferred, true)
			if len(st.unsynced) != 1 {
				t.Fatalf("%d unsynced change sets after a deferred commit, want 1", len(st.unsynced))
			}
			tc.write(t, st)
			if len(st.unsynced) != 0 || mem.Unsynced() {
				t.Fatalf("after the %s: %d change sets unsynced in the recording store, the store unsynced %v; want none in either",
					tc.name, len(st.unsynced), mem.Unsynced())
			}
			want := []*store.Changes{deferred}
			if tc.recorded != nil {
				want = append(want, tc.recorded)
			}
			got := st.committed[1:] // after the statement's
			if len(got) != len(want) {
				t.Fatalf("durable change sets after the statement's: %d, want %d (the deferred commit, then the %s's)", len(got), len(want), tc.name)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("durable change set %d is not the one expected: the deferred commit must come before the %s's", i, tc.name)
				}
			}
		})
	}
}
