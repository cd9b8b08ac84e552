package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

func writeTx(t *testing.T, s *sqlite.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// readTx reads the account and the meta counter "n" in a write transaction
// (where the row cache answers), then rolls back.
func readTx(t *testing.T, s *sqlite.Store) (available int64, n int64, nFound bool) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	a, err := tx.AccountGet(ctx, crashAccount)
	if err != nil {
		t.Fatal(err)
	}
	n, err = tx.MetaGet(ctx, "n")
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return a.Balances[0].Available, n, err == nil
}

func accountWith(available int64) ledger.Account {
	return ledger.Account{Key: crashAccount, Dims: 1, EpochStart: t0,
		Balances: ledger.Balances{{Opening: 1000, Available: available, Reserved: 1000 - available}}}
}

// TestRowCacheSeesOtherWriters: rows (and absences) a Store cached are read
// again once another connection to the same file committed, and a
// rolled-back write leaves the cache as it was.
func TestRowCacheSeesOtherWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	first, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()

	writeTx(t, first, &store.Changes{Accounts: []ledger.Account{accountWith(900)}})
	if available, _, found := readTx(t, first); available != 900 || found {
		t.Fatalf("first read: available %d, meta found %v", available, found)
	}
	// Cached now: the account row and the absence of meta "n".
	writeTx(t, second, &store.Changes{Accounts: []ledger.Account{accountWith(700)}, Meta: map[string]int64{"n": 5}})
	if available, n, found := readTx(t, first); available != 700 || !found || n != 5 {
		t.Fatalf("after another writer: available %d, meta n %d (found %v); want 700, 5", available, n, found)
	}

	// A write rolled back must not reach the cache.
	tx, err := first.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{accountWith(1)}}); err != nil {
		t.Fatal(err)
	}
	if a, err := tx.AccountGet(ctx, crashAccount); err != nil || a.Balances[0].Available != 1 {
		t.Fatalf("a transaction reads its own writes: %+v %v", a, err)
	}
	tx.Rollback(ctx)
	if available, _, _ := readTx(t, first); available != 700 {
		t.Fatalf("after a rollback: available %d, want 700", available)
	}

	// A committed write is what the next transaction reads, from either
	// store.
	writeTx(t, first, &store.Changes{Accounts: []ledger.Account{accountWith(650)}})
	if available, _, _ := readTx(t, first); available != 650 {
		t.Fatalf("own commit: available %d, want 650", available)
	}
	if available, _, _ := readTx(t, second); available != 650 {
		t.Fatalf("other store after commit: available %d, want 650", available)
	}
}

// TestPrefetchAnswersUntilWrite: prefetched reservations (and absences)
// answer ReservationGet, more ids than one statement carries included, and
// after a Write the transaction reads its own writes again.
func TestPrefetchAnswersUntilWrite(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	var c store.Changes
	c.NewReservations = map[string]bool{}
	var ids []string
	for i := range 150 {
		id := batchID(1, i)
		ids = append(ids, id)
		if i%2 == 0 {
			c.Reservations = append(c.Reservations, reservation(id))
			c.NewReservations[id] = true
		}
	}
	writeTx(t, s, &c)
	for _, n := range []int{1, 3, 8, 9, 64, 65, 150} {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.(store.Prefetcher).ReservationsPrefetch(ctx, ids[:n]); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids[:n] {
			r, err := tx.ReservationGet(ctx, id)
			switch {
			case i%2 == 0 && (err != nil || r.ID != id):
				t.Fatalf("prefetch of %d: %s: %+v %v", n, id, r, err)
			case i%2 == 1 && !errors.Is(err, store.ErrNotFound):
				t.Fatalf("prefetch of %d: %s must be absent: %+v %v", n, id, r, err)
			}
		}
		tx.Rollback(ctx)
	}

	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.(store.Prefetcher).ReservationsPrefetch(ctx, ids[:2]); err != nil {
		t.Fatal(err)
	}
	r := reservation(ids[1])
	if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{r}, NewReservations: map[string]bool{r.ID: true}}); err != nil {
		t.Fatal(err)
	}
	if got, err := tx.ReservationGet(ctx, ids[1]); err != nil || got.ID != ids[1] {
		t.Fatalf("after a write the prefetch must not answer: %+v %v", got, err)
	}
}

// TestFreshReservationsRoundTrip: reservations written through the
// statement for fresh ones (zero columns as literals, due_at from
// expires_at) read back as written, mixed with others in one batch of
// every chunk size, and are due when they expire.
func TestFreshReservationsRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	c := store.Changes{NewReservations: map[string]bool{}}
	want := map[string]ledger.Reservation{}
	for i := range 63 {
		r := reservation(batchID(2, i))
		r.Reserved = ledger.Amounts{int64(i + 1), 2}
		r.AccountingEpoch = t0
		// Ten rows at a time share a creation and expiry time, as a
		// batch's reserves do.
		r.CreatedAt = t0.Add(time.Duration(i/10) * time.Millisecond)
		r.ExpiresAt = t0.Add(time.Minute + time.Duration(i/10)*time.Second)
		if i%7 == 3 { // not fresh: started
			r.State, r.OperationID, r.StartedAt = ledger.StateStarted, "op-"+r.ID, t0
		}
		// Accounts: 40 rows of one (four groups of shared-key
		// statements), 10 of a generation of their own, and 13 rows of 5
		// accounts, too few each for a group.
		switch {
		case i >= 50:
			r.Account = ledger.AccountKey{Subject: fmt.Sprintf("tenant-%d", i%5), Route: "chat", Region: "us", Generation: uint64(i % 5)}
		case i >= 40:
			r.Account.Generation = 2
		}
		c.Reservations = append(c.Reservations, r)
		c.NewReservations[r.ID] = true
		want[r.ID] = r
	}
	writeTx(t, s, &c)
	for id, w := range want {
		got, err := s.ReservationGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s:\n got %+v\nwant %+v", id, got, w)
		}
	}
	due, err := s.ReservationsDue(ctx, t0.Add(time.Minute+500*time.Millisecond), 100)
	if err != nil {
		t.Fatal(err)
	}
	var wantDue []string
	for i := range 10 {
		if i%7 != 3 {
			wantDue = append(wantDue, batchID(2, i))
		}
	}
	var dueIDs []string
	for _, d := range due {
		dueIDs = append(dueIDs, d.ID)
	}
	if !reflect.DeepEqual(dueIDs, wantDue) {
		t.Fatalf("due: %v, want %v", dueIDs, wantDue)
	}
}

// A duplicate id among a group of one account's fresh reservations fails
// the Write with store.ErrDuplicate, and the transaction cannot commit.
func TestFreshGroupDuplicate(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	writeTx(t, s, insert(batchID(3, 2)))
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var ids []string
	for i := range 6 {
		ids = append(ids, batchID(3, i))
	}
	if err := tx.Write(ctx, insert(ids...)); !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("write: %v, want ErrDuplicate", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit after a failed write succeeded")
	}
	for _, id := range ids {
		_, err := s.ReservationGet(ctx, id)
		if exists := err == nil; exists != (id == batchID(3, 2)) {
			t.Fatalf("%s: %v after the rolled-back write", id, err)
		}
	}
}

// An account committed with an epoch start in a local zone and with a
// monotonic reading is cached as it is stored: the write transaction's
// next read (from the row cache) returns what a read of the file
// returns, and a policy head the cache knows is absent is not found.
func TestCommittedAccountReadsAsTheFile(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := accountWith(400)
	a.EpochStart = time.Now().In(time.FixedZone("UTC+3", 3*3600)) // a monotonic reading, too
	a.Version = 7
	writeTx(t, s, &store.Changes{Accounts: []ledger.Account{a}})

	stored, err := s.AccountGet(ctx, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	cached, err := tx.AccountGet(ctx, a.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*cached, stored) {
		t.Fatalf("after its commit the account reads\n%+v\nwhere the file holds\n%+v", *cached, stored)
	}
	missing := ledger.PolicyKey{Subject: "nobody", Route: "chat", Region: "eu"}
	for range 2 { // read, then answered by the cache
		_, err := tx.PolicyHeadGet(ctx, missing)
		if !errors.Is(err, store.ErrNotFound) || err.Error() != "policy head: not found" {
			t.Fatalf("policy head of %s: %v, want policy head: not found", missing, err)
		}
	}
}

// TestCommittedAccountMovedInTheCache: an account a transaction read from
// the row cache, evicted by the transaction's other reads and read again
// into another slot, is updated after the commit where it now stands: the
// cache reads as the file, for it and for the accounts that took its
// first slot.
func TestCommittedAccountMovedInTheCache(t *testing.T) {
	ctx := context.Background()
	const rows = 4
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), sqlite.WithCacheRows(rows))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	accounts := make([]ledger.Account, 3*rows)
	for i := range accounts {
		accounts[i] = accountWith(int64(i))
		accounts[i].Key.Subject = fmt.Sprintf("tenant-%d", i)
	}
	writeTx(t, s, &store.Changes{Accounts: accounts})
	moved := accounts[0].Key

	read := func(tx store.Tx, key ledger.AccountKey) ledger.Account {
		t.Helper()
		a, err := tx.AccountGet(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return *a
	}
	// A first transaction caches the account, so the next reads it from
	// the cache.
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	read(tx, moved)
	tx.Rollback(ctx)

	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	a := read(tx, moved)
	evictions := s.CacheStats().Evictions
	for i := 1; i <= 2*rows; i++ {
		read(tx, accounts[i].Key)
	}
	if s.CacheStats().Evictions-evictions < 2*rows {
		t.Fatalf("%d evictions, want the account evicted", s.CacheStats().Evictions-evictions)
	}
	read(tx, moved) // from the file, into another slot
	a.Version++
	a.Balances[0].Available--
	a.Balances[0].Reserved++
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, k := range append([]ledger.AccountKey{moved}, accounts[1].Key, accounts[2*rows].Key) {
		for range 2 { // the cache's answer, if cached, then surely cached
			stored, err := s.AccountGet(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if got := read(tx, k); !reflect.DeepEqual(got, stored) {
				t.Fatalf("%s reads\n%+v\nwhere the file holds\n%+v", k, got, stored)
			}
		}
	}
}
