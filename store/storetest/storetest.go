// Package storetest is the conformance suite every store.Store passes:
// the in-memory store, SQLite and PostgreSQL run the same checks, so the
// engine and the simulator can rely on one set of semantics.
//
// The conventions it pins down, beyond the store package's doc comments:
//   - times read back in UTC, exact to the nanosecond (stores keep Unix
//     nanoseconds in an int64; the zero time stays zero); a time outside the
//     int64 nanosecond range, or a uint64 counter above math.MaxInt64, is an
//     error at Write or Commit, never a silently different value;
//   - an empty policy Dimensions slice or shard Signature reads back nil;
//   - a Tx reads its own writes;
//   - after a Write error the transaction can only be rolled back: Commit
//     returns an error and nothing of the transaction becomes visible;
//   - a transaction whose Begin or Commit context ended makes nothing
//     visible;
//   - list orders: AccountList by generation (by full key with an empty
//     Subject), PolicyList by generation, ShardList by id; Snapshot holds
//     accounts by key, reservations by id, moves by receipt id, shards by
//     id, policies by generation, statements and journal in insertion
//     order, and JournalComplete;
//   - ReservationsDue orders by the time a reservation became due
//     (ExpiresAt for RESERVED and EXPIRING, ExecutionDeadline for STARTED),
//     ties by id; an EXPIRING reservation is due whatever its ExpiresAt;
//   - a second insert of a reservation id (NewReservations), a move receipt
//     id, or a statement for the same account and EpochStart is
//     store.ErrDuplicate; everything else is an upsert.
package storetest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Run runs the suite. open must return a new, empty store for each call and
// close it through t.Cleanup; Run never closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		f    func(t *testing.T, s store.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"NotFound", testNotFound},
		{"TxReadsOwnWrites", testTxReadsOwnWrites},
		{"Upsert", testUpsert},
		{"RowsAreCopies", testRowsAreCopies},
		{"RollbackDiscards", testRollbackDiscards},
		{"DuplicateReservationLeavesNothing", testDuplicateReservation},
		{"DuplicateMoveLeavesNothing", testDuplicateMove},
		{"DuplicateStatement", testDuplicateStatement},
		{"UnstorableValues", testUnstorableValues},
		{"JournalOrder", testJournalOrder},
		{"LargeBatch", testLargeBatch},
		{"ReservationsDue", testReservationsDue},
		{"AccountList", testAccountList},
		{"Lists", testLists},
		{"TimePrecision", testTimePrecision},
		{"CancelledContext", testCancelledContext},
		{"EndedTx", testEndedTx},
		{"Isolation", testIsolation},
		{"SeedScenario", testSeedScenario},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.f(t, open(t))
		})
	}
}

// commit writes c in one transaction and fails the test on any error.
func commit(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// inTx runs f in a transaction that is rolled back afterwards.
func inTx(t *testing.T, s store.Store, f func(ctx context.Context, tx store.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() {
		if err := tx.Rollback(ctx); err != nil {
			t.Errorf("rollback: %v", err)
		}
	}()
	f(ctx, tx)
}

func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

func mustNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s: err %v, want store.ErrNotFound", what, err)
	}
}

// checkRows reads every row of c back through a transaction and through the
// store's committed reads, and compares.
func checkRows(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		for name, want := range c.Meta {
			got, err := tx.MetaGet(ctx, name)
			if err != nil || got != want {
				t.Errorf("tx meta %s: %d, %v; want %d", name, got, err, want)
			}
		}
		for _, want := range c.Currents {
			got, err := tx.AccountCurrentGet(ctx, want.Subject)
			if err != nil || got != want.Generation {
				t.Errorf("tx current %s: %d, %v; want %d", want.Subject, got, err, want.Generation)
			}
		}
		readBack(t, "tx policy", c.Policies, policyGeneration, owned(ctx, tx.PolicyGet))
		readBack(t, "tx head", c.Heads, headKey, owned(ctx, tx.PolicyHeadGet))
		readBack(t, "tx account", c.Accounts, accountKey, owned(ctx, tx.AccountGet))
		readBack(t, "tx reservation", c.Reservations, reservationID, owned(ctx, tx.ReservationGet))
		readBack(t, "tx move", c.Moves, moveReceiptID, owned(ctx, tx.MoveGet))
		readBack(t, "tx shard", c.Shards, shardID, owned(ctx, tx.ShardGet))
	})
	readBack(t, "store policy", c.Policies, policyGeneration, committed(ctx, s.PolicyGet))
	readBack(t, "store account", c.Accounts, accountKey, committed(ctx, s.AccountGet))
	readBack(t, "store reservation", c.Reservations, reservationID, committed(ctx, s.ReservationGet))
	readBack(t, "store shard", c.Shards, shardID, committed(ctx, s.ShardGet))
}

// readBack reads each row of wants through get, by the key key names, and
// reports a read error or a row that differs from the one written.
func readBack[R, K any](t *testing.T, what string, wants []R, key func(R) K, get func(K) (R, error)) {
	t.Helper()
	for _, want := range wants {
		k := key(want)
		got, err := get(k)
		if err != nil {
			t.Errorf("%s %v: %v", what, k, err)
			continue
		}
		same(t, what, got, want)
	}
}

// owned adapts a Tx getter, which returns a row the caller owns by
// pointer, to readBack.
func owned[K, R any](ctx context.Context, get func(context.Context, K) (*R, error)) func(K) (R, error) {
	return func(k K) (R, error) {
		row, err := get(ctx, k)
		if err != nil {
			var zero R
			return zero, err
		}
		return *row, nil
	}
}

// committed adapts a Store getter of committed state to readBack.
func committed[K, R any](ctx context.Context, get func(context.Context, K) (R, error)) func(K) (R, error) {
	return func(k K) (R, error) { return get(ctx, k) }
}

func policyGeneration(p ledger.Policy) uint64       { return p.Generation }
func headKey(h ledger.PolicyHead) ledger.PolicyKey  { return h.Key }
func accountKey(a ledger.Account) ledger.AccountKey { return a.Key }
func reservationID(r ledger.Reservation) string     { return r.ID }
func moveReceiptID(m ledger.Move) string            { return m.ReceiptID }
func shardID(s ledger.Shard) string                 { return s.ID }

// snapshotOf returns the rows of c in Snapshot order.
func snapshotOf(c *store.Changes) *ledger.Snapshot {
	s := &ledger.Snapshot{
		Policies: slices.Clone(c.Policies), Accounts: slices.Clone(c.Accounts),
		Reservations: slices.Clone(c.Reservations), Moves: slices.Clone(c.Moves), Shards: slices.Clone(c.Shards),
		Statements: slices.Clone(c.Statements), Journal: slices.Clone(c.Journal), JournalComplete: true,
	}
	slices.SortFunc(s.Policies, func(a, b ledger.Policy) int { return cmp.Compare(a.Generation, b.Generation) })
	slices.SortFunc(s.Accounts, func(a, b ledger.Account) int { return compareAccountKeys(a.Key, b.Key) })
	slices.SortFunc(s.Reservations, func(a, b ledger.Reservation) int { return cmp.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Moves, func(a, b ledger.Move) int { return cmp.Compare(a.ReceiptID, b.ReceiptID) })
	slices.SortFunc(s.Shards, func(a, b ledger.Shard) int { return cmp.Compare(a.ID, b.ID) })
	return s
}

func checkSnapshot(t *testing.T, s store.Store, want *ledger.Snapshot) {
	t.Helper()
	got, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if !got.JournalComplete {
		t.Error("snapshot: JournalComplete is false")
	}
	same(t, "snapshot policies", got.Policies, want.Policies)
	same(t, "snapshot accounts", got.Accounts, want.Accounts)
	same(t, "snapshot reservations", got.Reservations, want.Reservations)
	same(t, "snapshot moves", got.Moves, want.Moves)
	same(t, "snapshot shards", got.Shards, want.Shards)
	same(t, "snapshot statements", got.Statements, want.Statements)
	same(t, "snapshot journal", got.Journal, want.Journal)
}

// checkEmpty asserts that no row of c is visible, through the store's reads
// and through a new transaction.
func checkEmpty(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	if n := len(snap.Policies) + len(snap.Accounts) + len(snap.Reservations) + len(snap.Moves) +
		len(snap.Shards) + len(snap.Statements) + len(snap.Journal); n != 0 {
		t.Errorf("%d rows visible: %+v", n, snap)
	}
	for _, r := range c.Reservations {
		_, err := s.ReservationGet(ctx, r.ID)
		mustNotFound(t, "store reservation "+r.ID, err)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		for name := range c.Meta {
			_, err := tx.MetaGet(ctx, name)
			mustNotFound(t, "meta "+name, err)
		}
		for _, h := range c.Heads {
			_, err := tx.PolicyHeadGet(ctx, h.Key)
			mustNotFound(t, "head", err)
		}
		for _, cur := range c.Currents {
			_, err := tx.AccountCurrentGet(ctx, cur.Subject)
			mustNotFound(t, "current", err)
		}
		for _, a := range c.Accounts {
			_, err := tx.AccountGet(ctx, a.Key)
			mustNotFound(t, "account", err)
		}
		for _, m := range c.Moves {
			_, err := tx.MoveGet(ctx, m.ReceiptID)
			mustNotFound(t, "move", err)
		}
	})
}

func testRoundTrip(t *testing.T, s store.Store) {
	c := fixture()
	commit(t, s, c)
	checkRows(t, s, fixture())
	checkSnapshot(t, s, snapshotOf(fixture()))
}

func testNotFound(t *testing.T, s store.Store) {
	ctx := context.Background()
	// One unrelated row of each kind, so a store that answers "the first
	// row" for any key is caught too.
	commit(t, s, fixture())
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		_, err := tx.MetaGet(ctx, "no_such_counter")
		mustNotFound(t, "tx MetaGet", err)
		_, err = tx.PolicyGet(ctx, 99)
		mustNotFound(t, "tx PolicyGet", err)
		_, err = tx.PolicyHeadGet(ctx, ledger.PolicyKey{Subject: "nobody", Route: "chat.generate", Region: "eu"})
		mustNotFound(t, "tx PolicyHeadGet", err)
		_, err = tx.AccountGet(ctx, ledger.AccountKey{Subject: "tenant7", Route: "chat.generate", Region: "eu", Generation: 99})
		mustNotFound(t, "tx AccountGet", err)
		_, err = tx.AccountCurrentGet(ctx, ledger.PolicyKey{Subject: "tenant7", Route: "chat.generate", Region: "us"})
		mustNotFound(t, "tx AccountCurrentGet", err)
		_, err = tx.ReservationGet(ctx, "rl-none")
		mustNotFound(t, "tx ReservationGet", err)
		_, err = tx.MoveGet(ctx, "mv-none")
		mustNotFound(t, "tx MoveGet", err)
		_, err = tx.ShardGet(ctx, "sh-none")
		mustNotFound(t, "tx ShardGet", err)
	})
	_, err := s.ReservationGet(ctx, "rl-none")
	mustNotFound(t, "ReservationGet", err)
	_, err = s.AccountGet(ctx, ledger.AccountKey{Subject: "tenant7", Route: "chat.generate", Region: "eu", Generation: 99})
	mustNotFound(t, "AccountGet", err)
	_, err = s.PolicyGet(ctx, 99)
	mustNotFound(t, "PolicyGet", err)
	_, err = s.ShardGet(ctx, "sh-none")
	mustNotFound(t, "ShardGet", err)
}

func testTxReadsOwnWrites(t *testing.T, s store.Store) {
	c := fixture()
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, c); err != nil {
			t.Fatalf("write: %v", err)
		}
		for _, want := range c.Accounts {
			got, err := tx.AccountGet(ctx, want.Key)
			if err != nil {
				t.Fatalf("account %s: %v", want.Key, err)
			}
			same(t, "own account", *got, want)
		}
		for _, want := range c.Reservations {
			got, err := tx.ReservationGet(ctx, want.ID)
			if err != nil {
				t.Fatalf("reservation %s: %v", want.ID, err)
			}
			same(t, "own reservation", *got, want)
		}
		g, err := tx.MetaGet(ctx, ledger.MetaGeneration)
		if err != nil || g != 3 {
			t.Fatalf("own meta: %d, %v", g, err)
		}
		// Not visible outside before Commit.
		_, err = s.ReservationGet(ctx, c.Reservations[0].ID)
		mustNotFound(t, "uncommitted reservation read by the store", err)
	})
	checkEmpty(t, s, c)
}

func testUpsert(t *testing.T, s store.Store) {
	commit(t, s, fixture())
	up := fixture()
	up.NewReservations = nil
	up.Meta = map[string]int64{ledger.MetaGeneration: 4}
	up.Policies = up.Policies[1:2]
	up.Policies[0].RolledBack = true
	up.Heads = []ledger.PolicyHead{{Key: keyEU, Active: 0, Latest: 2}}
	up.Currents = []store.Current{{Subject: keyEU, Generation: 1}}
	up.Accounts = up.Accounts[:1]
	// Stays non-negative: the PostgreSQL store's CHECK constraints refuse a
	// negative term, as the ledger never writes one.
	up.Accounts[0].Balances[0].Available -= 400
	up.Accounts[0].Balances[0].Reserved += 400
	up.Accounts[0].Version++
	up.Accounts[0].Breaches++
	up.Reservations = up.Reservations[1:2] // rl-reserved
	r := &up.Reservations[0]
	r.State = ledger.StateStarted
	r.OperationID = "op-late"
	r.StartedAt = at(10 * time.Second)
	r.ExecutionDeadline = at(310 * time.Second)
	up.Shards = up.Shards[1:]
	up.Shards[0].Reconciled = true
	up.Shards[0].Spent = ledger.Amounts{40}
	up.Shards[0].Reminted = ledger.Amounts{60}
	up.Moves, up.Statements, up.Journal = nil, nil, nil
	commit(t, s, up)
	checkRows(t, s, up)
	want := snapshotOf(fixture())
	want.Policies[1] = up.Policies[0]
	for i := range want.Accounts {
		if want.Accounts[i].Key == up.Accounts[0].Key {
			want.Accounts[i] = up.Accounts[0]
		}
	}
	for i := range want.Reservations {
		if want.Reservations[i].ID == r.ID {
			want.Reservations[i] = *r
		}
	}
	for i := range want.Shards {
		if want.Shards[i].ID == up.Shards[0].ID {
			want.Shards[i] = up.Shards[0]
		}
	}
	checkSnapshot(t, s, want)
}

func testRowsAreCopies(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := fixture()
	commit(t, s, c)
	// Changing the batch after Commit must not reach the store.
	c.Policies[0].Dimensions[0].Burst = 1
	c.Shards[0].Signature[0] ^= 0xff
	c.Accounts[0].Version = 999
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		p, err := tx.PolicyGet(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		p.Dimensions[0].Burst = 2
		sh, err := tx.ShardGet(ctx, "sh-1")
		if err != nil {
			t.Fatal(err)
		}
		sh.Signature[1] ^= 0xff
		a, err := tx.AccountGet(ctx, accEU1)
		if err != nil {
			t.Fatal(err)
		}
		a.Version = 1000
	})
	p, err := s.PolicyGet(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	p.Dimensions[0].Burst = 3
	sh, err := s.ShardGet(ctx, "sh-1")
	if err != nil {
		t.Fatal(err)
	}
	sh.Signature[2] ^= 0xff
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap.Policies[0].Dimensions[0].Burst = 4
	snap.Shards[0].Signature[3] ^= 0xff
	checkRows(t, s, fixture())
}

func testRollbackDiscards(t *testing.T, s store.Store) {
	ctx := context.Background()
	c := fixture()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("second rollback: %v", err)
	}
	checkEmpty(t, s, c)
	// The store still works, and the rolled-back ids are free.
	commit(t, s, fixture())
	checkSnapshot(t, s, snapshotOf(fixture()))
}

// failingWrite runs a transaction that writes first, then a batch that
// Write must refuse with store.ErrDuplicate, then checks Commit refuses too
// and that only before remains visible.
func failingWrite(t *testing.T, s store.Store, first, failing *store.Changes, before *ledger.Snapshot) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, first); err != nil {
		t.Fatalf("first write: %v", err)
	}
	err = tx.Write(ctx, failing)
	if !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("write: err %v, want store.ErrDuplicate", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit after a failed write returned nil")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	checkSnapshot(t, s, before)
}

func testDuplicateReservation(t *testing.T, s store.Store) {
	base := fixture()
	commit(t, s, base)
	before := snapshotOf(base)
	first := &store.Changes{
		Meta:     map[string]int64{"other": 1},
		Journal:  []ledger.JournalEntry{{At: at(time.Hour), Kind: ledger.KindRefill, Account: accOther, Delta: ledger.Balances{{Minted: 5, Available: 5}}}},
		Accounts: []ledger.Account{fixtureAccounts()[2]},
	}
	first.Accounts[0].Version = 50
	// A batch whose accounts and a new reservation are fine, then a "new"
	// reservation whose id exists: the whole transaction must vanish.
	fresh := fixtureReservations()[1]
	fresh.ID = "rl-fresh"
	dup := fixtureReservations()[1]
	dup.RequestDigest = "sha256:other"
	failing := &store.Changes{
		Accounts:        []ledger.Account{fixtureAccounts()[0]},
		Reservations:    []ledger.Reservation{dup, fresh},
		NewReservations: map[string]bool{dup.ID: true, fresh.ID: true},
		Journal:         fixtureJournal()[:1],
	}
	failing.Accounts[0].Version = 99
	slices.SortFunc(failing.Reservations, func(a, b ledger.Reservation) int { return cmp.Compare(a.ID, b.ID) })
	failingWrite(t, s, first, failing, before)
	_, err := s.ReservationGet(context.Background(), "rl-fresh")
	mustNotFound(t, "reservation of the failed batch", err)

	// Two inserts of one new id in a single batch collide as well.
	twice := &store.Changes{
		Reservations:    []ledger.Reservation{fresh, fresh},
		NewReservations: map[string]bool{fresh.ID: true},
	}
	failingWrite(t, s, &store.Changes{}, twice, before)
}

func testDuplicateMove(t *testing.T, s store.Store) {
	base := fixture()
	commit(t, s, base)
	before := snapshotOf(base)
	first := &store.Changes{Accounts: []ledger.Account{fixtureAccounts()[1]}}
	first.Accounts[0].Version = 77
	again := fixtureMoves()[0]
	again.Units = ledger.Amounts{1}
	failing := &store.Changes{
		Accounts: []ledger.Account{fixtureAccounts()[0]},
		Moves:    []ledger.Move{again},
		Journal:  fixtureJournal(),
	}
	failingWrite(t, s, first, failing, before)
}

func testDuplicateStatement(t *testing.T, s store.Store) {
	base := fixture()
	commit(t, s, base)
	st := fixtureStatements()[1]
	st.Closing[0].Available++
	failingWrite(t, s, &store.Changes{}, &store.Changes{Statements: []ledger.Statement{st}}, snapshotOf(base))
	// The same epoch start of another account is not a duplicate.
	st.Account = accEU2
	commit(t, s, &store.Changes{Statements: []ledger.Statement{st}})
}

// writeMustFail checks that c cannot be committed, at Write or at Commit,
// and that nothing of it is visible afterwards.
func writeMustFail(t *testing.T, s store.Store, what string, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = tx.Write(ctx, c)
	if err == nil {
		err = tx.Commit(ctx)
	}
	tx.Rollback(ctx)
	if err == nil {
		t.Errorf("%s: committed", what)
	}
	checkEmpty(t, s, c)
}

func testUnstorableValues(t *testing.T, s store.Store) {
	tooLate := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	r := fixtureReservations()[1]
	r.ExpiresAt = tooLate
	writeMustFail(t, s, "time after 2262", &store.Changes{Reservations: []ledger.Reservation{r},
		NewReservations: map[string]bool{r.ID: true}})
	a := fixtureAccounts()[0]
	a.Key.Generation = math.MaxInt64 + 1
	writeMustFail(t, s, "generation above MaxInt64", &store.Changes{Accounts: []ledger.Account{a}})
	p := fixturePolicies()[0]
	p.Dimensions = make([]ledger.Dimension, ledger.MaxDimensions+1)
	writeMustFail(t, s, "five dimensions", &store.Changes{Policies: []ledger.Policy{p}})
	e := fixtureJournal()[0]
	e.At = time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)
	writeMustFail(t, s, "time before 1678", &store.Changes{Journal: []ledger.JournalEntry{e}})
}

func testJournalOrder(t *testing.T, s store.Store) {
	var want []ledger.JournalEntry
	var statements []ledger.Statement
	// Entries out of time order and with equal times: the store keeps the
	// order they were appended in, not any order of their fields.
	for batch := 0; batch < 5; batch++ {
		var entries []ledger.JournalEntry
		for i := 0; i < 7; i++ {
			e := ledger.JournalEntry{
				At: at(time.Duration(10-batch) * time.Second), Kind: ledger.KindSettle, Account: accEU2,
				ReservationID: fmt.Sprintf("rl-%d-%d", batch, 6-i), From: ledger.StateStarted, To: ledger.StateSettled,
				Delta: ledger.Balances{{Available: int64(batch*10 + i), Reserved: -int64(batch*10 + i)}},
			}
			entries = append(entries, e)
		}
		st := ledger.Statement{Account: accOther, EpochStart: at(-time.Duration(batch+1) * time.Hour),
			EpochEnd: at(-time.Duration(batch) * time.Hour), Dims: 1,
			Opening: ledger.Balances{{Opening: int64(batch)}}, Closing: ledger.Balances{{Opening: int64(batch + 1)}}}
		commit(t, s, &store.Changes{Journal: entries, Statements: []ledger.Statement{st}})
		want = append(want, entries...)
		statements = append(statements, st)
	}
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !snap.JournalComplete {
		t.Error("JournalComplete is false")
	}
	same(t, "journal", snap.Journal, want)
	same(t, "statements", snap.Statements, statements)
}

// testLargeBatch writes batches of the size a group commit produces (stores
// may insert them in chunks): every row arrives, the journal in order, and
// a duplicate deep inside a batch still fails the whole transaction.
func testLargeBatch(t *testing.T, s store.Store) {
	const n = 137
	batch := func(prefix string) *store.Changes {
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := 0; i < n; i++ {
			r := fixtureReservations()[1]
			r.ID = fmt.Sprintf("%s-%04d", prefix, i)
			r.Reserved = ledger.Amounts{int64(i + 1)}
			c.Reservations = append(c.Reservations, r)
			c.NewReservations[r.ID] = true
			c.Journal = append(c.Journal, ledger.JournalEntry{At: at(time.Duration(n - i)), Kind: ledger.KindReserve,
				Account: accEU2, ReservationID: r.ID, From: ledger.StateRequested, To: ledger.StateReserved,
				Delta: ledger.Balances{{Available: -int64(i + 1), Reserved: int64(i + 1)}}})
		}
		return c
	}
	first := batch("rl-a")
	commit(t, s, first)
	second := batch("rl-b")
	second.Reservations[101] = first.Reservations[57]
	second.NewReservations[first.Reservations[57].ID] = true
	failingWrite(t, s, &store.Changes{}, second, snapshotOf(first))
	third := batch("rl-c")
	commit(t, s, third)
	want := snapshotOf(first)
	want.Reservations = append(want.Reservations, third.Reservations...)
	want.Journal = append(want.Journal, third.Journal...)
	checkSnapshot(t, s, want)
}

func testReservationsDue(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := t0
	mk := func(id string, state ledger.State, expires, deadline time.Time) ledger.Reservation {
		r := ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: accEU2, AccountingEpoch: at(0),
			Reserved: ledger.Amounts{10}, State: state, CreatedAt: at(-time.Hour), ExpiresAt: expires,
			ExecutionDeadline: deadline}
		if !deadline.IsZero() || state == ledger.StateStarted {
			r.StartedAt = at(-time.Hour)
			r.OperationID = "op-" + id
		}
		return r
	}
	var none time.Time
	rows := []ledger.Reservation{
		mk("rl-started-due", ledger.StateStarted, at(-time.Hour), at(-20*time.Second)),
		mk("rl-b", ledger.StateReserved, at(-10*time.Second), none),
		mk("rl-a", ledger.StateReserved, at(-10*time.Second), none),
		mk("rl-reserved-due", ledger.StateReserved, at(-8*time.Second), none),
		mk("rl-expiring", ledger.StateExpiring, at(-5*time.Second), none),
		mk("rl-reserved-exact", ledger.StateReserved, now, none),
		mk("rl-started-exact", ledger.StateStarted, at(-time.Hour), now),
		mk("rl-expiring-late", ledger.StateExpiring, at(time.Hour), none),
		// Not due:
		mk("rl-reserved-future", ledger.StateReserved, now.Add(time.Nanosecond), none),
		mk("rl-started-nolimit", ledger.StateStarted, at(-time.Hour), none),
		mk("rl-started-future", ledger.StateStarted, at(-time.Hour), now.Add(time.Nanosecond)),
		mk("rl-requested", ledger.StateRequested, at(-time.Hour), none),
		mk("rl-settled", ledger.StateSettled, at(-time.Hour), at(-time.Hour)),
		mk("rl-debt", ledger.StateSettledWithDebt, at(-time.Hour), at(-time.Hour)),
		mk("rl-released", ledger.StateReleased, at(-time.Hour), none),
		mk("rl-expired", ledger.StateExpired, at(-time.Hour), none),
		mk("rl-unknown", ledger.StateUsageUnknown, at(-time.Hour), at(-time.Hour)),
	}
	c := &store.Changes{Reservations: rows, NewReservations: map[string]bool{}}
	for _, r := range rows {
		c.NewReservations[r.ID] = true
	}
	commit(t, s, c)
	want := []string{"rl-started-due", "rl-a", "rl-b", "rl-reserved-due", "rl-expiring",
		"rl-reserved-exact", "rl-started-exact", "rl-expiring-late"}
	for _, limit := range []int{100, len(want), 3, 1} {
		got, err := s.ReservationsDue(ctx, now, limit)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		w := want[:min(limit, len(want))]
		if !slices.Equal(got, w) {
			t.Errorf("limit %d:\n got %v\nwant %v", limit, got, w)
		}
	}
	got, err := s.ReservationsDue(ctx, now, 0)
	if err != nil || len(got) != 0 {
		t.Errorf("limit 0: %v, %v", got, err)
	}
	got, err = s.ReservationsDue(ctx, at(-time.Hour-time.Second), 100)
	if err != nil || !slices.Equal(got, []string{"rl-expiring", "rl-expiring-late"}) {
		t.Errorf("before anything is due: %v, %v; want only the EXPIRING ones", got, err)
	}
	// Moving a due reservation on takes it out of the list.
	started := rows[3]
	started.State = ledger.StateStarted
	started.StartedAt = now
	started.OperationID = "op-x"
	commit(t, s, &store.Changes{Reservations: []ledger.Reservation{started}})
	got, err = s.ReservationsDue(ctx, now, 100)
	if err != nil || slices.Contains(got, started.ID) || len(got) != len(want)-1 {
		t.Errorf("after starting %s: %v, %v", started.ID, got, err)
	}
}

func testAccountList(t *testing.T, s store.Store) {
	ctx := context.Background()
	mk := func(subject, route, region string, g uint64) ledger.Account {
		return ledger.Account{Key: ledger.AccountKey{Subject: subject, Route: route, Region: region, Generation: g},
			Dims: 1, Balances: ledger.Balances{{Opening: int64(g), Available: int64(g)}}, EpochStart: at(0), Version: g}
	}
	accounts := []ledger.Account{
		mk("tenant7", "chat", "eu", 12), mk("tenant7", "chat", "eu", 3), mk("tenant7", "chat", "eu", 7),
		mk("tenant7", "chat", "us", 1), mk("tenant7", "embed", "eu", 2), mk("tenant8", "chat", "eu", 4),
		mk("tenant70", "chat", "eu", 5), mk("tenant", "chat", "eu", 6),
	}
	commit(t, s, &store.Changes{Accounts: accounts})
	gens := func(list []ledger.Account) []uint64 {
		var out []uint64
		for _, a := range list {
			out = append(out, a.Key.Generation)
		}
		return out
	}
	got, err := s.AccountList(ctx, ledger.PolicyKey{Subject: "tenant7", Route: "chat", Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gens(got), []uint64{3, 7, 12}) {
		t.Errorf("tenant7/chat@eu: generations %v, want [3 7 12]", gens(got))
	}
	same(t, "listed account", got[0], accounts[1])
	all, err := s.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(accounts)
	slices.SortFunc(want, func(a, b ledger.Account) int { return compareAccountKeys(a.Key, b.Key) })
	same(t, "every account", all, want)
	none, err := s.AccountList(ctx, ledger.PolicyKey{Subject: "tenant9", Route: "chat", Region: "eu"})
	if err != nil || len(none) != 0 {
		t.Errorf("unknown subject: %v, %v", none, err)
	}
}

func testLists(t *testing.T, s store.Store) {
	ctx := context.Background()
	policies := fixturePolicies()
	shards := fixtureShards()
	// Written newest first, so insertion order is not the answer.
	slices.Reverse(policies)
	slices.Reverse(shards)
	commit(t, s, &store.Changes{Policies: policies, Shards: shards})
	gotPolicies, err := s.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "policies", gotPolicies, fixturePolicies())
	gotShards, err := s.ShardList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "shards", gotShards, fixtureShards())
}

func testTimePrecision(t *testing.T, s store.Store) {
	zones := []*time.Location{time.FixedZone("UTC+5:30", 5*3600+1800), time.FixedZone("UTC-8", -8*3600)}
	local := func(tt time.Time, i int) time.Time { return tt.In(zones[i%len(zones)]) }
	r := fixtureReservations()[4] // SETTLED_WITH_DEBT: every time field set
	r.ID = "rl-times"
	times := []*time.Time{&r.AccountingEpoch, &r.CreatedAt, &r.ExpiresAt, &r.StartedAt, &r.ExecutionDeadline, &r.FinishedAt}
	for i, tt := range times {
		*tt = local(tt.Add(time.Duration(i+1)), i) // odd nanoseconds, non-UTC zones
	}
	p := fixturePolicies()[0]
	p.PublishedAt = time.Now() // carries a monotonic clock reading
	m := fixtureMoves()[0]
	m.At = local(time.Date(1700, 1, 1, 0, 0, 0, 1, time.UTC), 0) // long before the Unix epoch
	e := fixtureJournal()[0]
	e.At = local(time.Date(2262, 4, 11, 23, 47, 16, 854775807, time.UTC), 1) // the last storable nanosecond
	sh := fixtureShards()[1]
	sh.ExpiresAt = time.Time{} // zero stays zero
	st := fixtureStatements()[0]
	st.EpochStart, st.EpochEnd = local(st.EpochStart.Add(1), 0), local(st.EpochEnd.Add(999), 1)
	a := fixtureAccounts()[0]
	a.EpochStart = local(a.EpochStart.Add(3), 1)
	commit(t, s, &store.Changes{Policies: []ledger.Policy{p}, Reservations: []ledger.Reservation{r},
		NewReservations: map[string]bool{r.ID: true}, Moves: []ledger.Move{m}, Journal: []ledger.JournalEntry{e},
		Shards: []ledger.Shard{sh}, Statements: []ledger.Statement{st}, Accounts: []ledger.Account{a}})

	for _, tt := range times {
		*tt = tt.UTC()
	}
	p.PublishedAt = p.PublishedAt.UTC()
	m.At, e.At = m.At.UTC(), e.At.UTC()
	st.EpochStart, st.EpochEnd = st.EpochStart.UTC(), st.EpochEnd.UTC()
	a.EpochStart = a.EpochStart.UTC()
	checkRows(t, s, &store.Changes{Policies: []ledger.Policy{p}, Reservations: []ledger.Reservation{r},
		Moves: []ledger.Move{m}, Shards: []ledger.Shard{sh}, Accounts: []ledger.Account{a}})
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	same(t, "journal time", snap.Journal, []ledger.JournalEntry{e})
	same(t, "statement times", snap.Statements, []ledger.Statement{st})
	for _, got := range snap.Reservations {
		for _, tt := range []time.Time{got.AccountingEpoch, got.CreatedAt, got.ExpiresAt, got.StartedAt, got.ExecutionDeadline, got.FinishedAt} {
			if tt.Location() != time.UTC {
				t.Errorf("time %v read back in %v, want UTC", tt, tt.Location())
			}
		}
	}
}

func testCancelledContext(t *testing.T, s store.Store) {
	c := fixture()
	// Cancelled after Write, before Commit: the Begin context.
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, c); err != nil {
		t.Fatalf("write: %v", err)
	}
	cancel()
	if err := tx.Commit(ctx); err == nil {
		t.Error("commit under a cancelled context returned nil")
	}
	tx.Rollback(context.Background())
	checkEmpty(t, s, c)

	// Commit with its own context already cancelled.
	tx, err = s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(context.Background(), c); err != nil {
		t.Fatalf("write: %v", err)
	}
	done, cancelCommit := context.WithCancel(context.Background())
	cancelCommit()
	if err := tx.Commit(done); err == nil {
		t.Error("commit with a cancelled context returned nil")
	}
	tx.Rollback(context.Background())
	checkEmpty(t, s, c)

	// Begin with a cancelled context opens nothing.
	if tx, err := s.Begin(done); err == nil {
		tx.Rollback(context.Background())
		t.Error("begin with a cancelled context returned a transaction")
	}
	commit(t, s, fixture())
	checkSnapshot(t, s, snapshotOf(fixture()))
}

func testEndedTx(t *testing.T, s store.Store) {
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Meta: map[string]int64{"n": 1}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Errorf("rollback after commit: %v", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Error("second commit returned nil")
	}
	if err := tx.Write(ctx, &store.Changes{Meta: map[string]int64{"n": 2}}); err == nil {
		t.Error("write after commit returned nil")
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if n, err := tx.MetaGet(ctx, "n"); err != nil || n != 1 {
			t.Errorf("meta n: %d, %v; want 1", n, err)
		}
	})
}

// testIsolation runs two writers doing read-modify-write of one account,
// each retrying whole on store.ErrConflict: no increment may be lost. This
// is the property the engine's per-account batches rely on.
func testIsolation(t *testing.T, s store.Store) {
	const perWriter = 200
	ctx := context.Background()
	start := fixtureAccounts()[2]
	start.Version = 0
	commit(t, s, &store.Changes{Accounts: []ledger.Account{start}})
	increment := func() error {
		tx, err := s.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		a, err := tx.AccountGet(ctx, start.Key)
		if err != nil {
			return err
		}
		a.Version++
		a.Balances[0].Minted++
		a.Balances[0].Available++
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{*a}}); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				for attempt := 0; ; attempt++ {
					err := increment()
					if err == nil {
						break
					}
					if !errors.Is(err, store.ErrConflict) || attempt > 1000 {
						errs <- fmt.Errorf("increment %d attempt %d: %w", i, attempt, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := s.AccountGet(ctx, start.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 2*perWriter || got.Balances[0].Minted != 2*perWriter {
		t.Fatalf("after %d increments: version %d, minted %d (lost updates)", 2*perWriter, got.Version, got.Balances[0].Minted)
	}
}

func compareAccountKeys(a, b ledger.AccountKey) int {
	return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Route, b.Route),
		cmp.Compare(a.Region, b.Region), cmp.Compare(a.Generation, b.Generation))
}
