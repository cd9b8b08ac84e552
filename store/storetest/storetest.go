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
//     each comes with its committed state and that due time;
//   - ReservationsUnknown orders USAGE_UNKNOWN reservations by UnknownAt
//     (when they were marked, not when they started), ties by id, and
//     pages strictly after its cursor, so that following the last row of
//     each page visits every row once; a Limit <= 0 is an error;
//     ReservationsUnknownBacklog finds the earliest UnknownAt, and of no
//     such reservation is a zero count and the zero time;
//   - AccountsInDebt lists the accounts whose row owes debt in any balance
//     (OverdraftIssued > OverdraftRepaid; issued == repaid is no debt) as
//     whole rows, in key order with generations compared as numbers, and
//     pages strictly after its cursor (the zero key starts at the first);
//     a Limit <= 0 or a cursor generation above math.MaxInt64 is an error;
//   - PolicyPage lists generations oldest first, those of the keys its
//     filters select (each exactly), strictly after its cursor; a Limit
//     <= 0 is an error, a cursor past every generation an empty page;
//   - AccountsByEpoch lists one generation's accounts in (EpochStart,
//     subject, route, region) order, those with EpochStart <= StartedBy
//     when it is set, and pages strictly after its cursor; with
//     AllGenerations every generation's, in (EpochStart, subject, route,
//     region, generation) order; after rolls, each once by its EpochStart,
//     and in that order again once EpochIndexCatchUp went over the range;
//   - a lease is held by its first holder, renewed by it with the same
//     fence, and free again after its holder releases it;
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
		{"ReservationsUnknown", testReservationsUnknown},
		{"ReservationsUnknownBacklog", testReservationsUnknownBacklog},
		{"AccountsInDebt", testAccountsInDebt},
		{"AccountsInDebtFollowsWrites", testAccountsInDebtFollowsWrites},
		{"AccountsInDebtCount", testAccountsInDebtCount},
		{"AccountsPage", testAccountsPage},
		{"AccountsPageOfSubject", testAccountsPageOfSubject},
		{"AccountsPageOfRoute", testAccountsPageOfRoute},
		{"ShardsUnreconciled", testShardsUnreconciled},
		{"AccountsByEpoch", testAccountsByEpoch},
		{"AccountsByEpochAfterRolls", testAccountsByEpochAfterRolls},
		{"AccountsByEpochAcrossGenerations", testAccountsByEpochAcross},
		{"AccountsByEpochAcrossGenerationsAfterRolls", testAccountsByEpochAcrossAfterRolls},
		{"Leases", testLeases},
		{"AccountList", testAccountList},
		{"AccountsOfSubjects", testAccountsOfSubjects},
		{"AccountsViewOwing", testAccountsViewOwing},
		{"AccountsViewOwingOneSnapshot", testAccountsViewOwingOneSnapshot},
		{"AccountsViewOneSnapshot", testAccountsViewOneSnapshot},
		{"PolicyHeads", testPolicyHeads},
		{"PoliciesOfGenerations", testPoliciesOfGenerations},
		{"Lists", testLists},
		{"PolicyPage", testPolicyPage},
		{"PolicyChanges", testPolicyChanges},
		{"TimePrecision", testTimePrecision},
		{"CancelledContext", testCancelledContext},
		{"EndedTx", testEndedTx},
		{"Isolation", testIsolation},
		{"SeedScenario", testSeedScenario},
		{"RecordScenario", testRecordScenario},
	}
	tests = append(tests, retentionCases...)
	tests = append(tests, shardRetentionCases...)
	tests = append(tests, rolloutCases...)
	tests = append(tests, checkpointCases...)
	tests = append(tests, consoleCases...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.f(t, open(t))
		})
	}
}

// Commit writes c in one transaction and fails the test (or benchmark)
// on any error: rows set up behind the engine's back.
func Commit(t testing.TB, s store.Store, c *store.Changes) {
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
	readBack(t, "store head", c.Heads, headKey, committed(ctx, s.PolicyHead))
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
	slices.SortFunc(s.Accounts, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
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
	Commit(t, s, c)
	checkRows(t, s, fixture())
	checkSnapshot(t, s, snapshotOf(fixture()))
}

func testNotFound(t *testing.T, s store.Store) {
	ctx := context.Background()
	// One unrelated row of each kind, so a store that answers "the first
	// row" for any key is caught too.
	Commit(t, s, fixture())
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
	_, err = s.PolicyHead(ctx, ledger.PolicyKey{Subject: "nobody", Route: "chat.generate", Region: "eu"})
	mustNotFound(t, "PolicyHead", err)
	_, err = s.ShardGet(ctx, "sh-none")
	mustNotFound(t, "ShardGet", err)

	// What a transaction did not find (and a store may have cached as
	// absent) is found once a later transaction wrote it.
	p := fixturePolicies()[2]
	p.Generation = 99
	Commit(t, s, &store.Changes{Policies: []ledger.Policy{p}, Meta: map[string]int64{"no_such_counter": 4}})
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if got, err := tx.PolicyGet(ctx, 99); err != nil || got.Generation != 99 || !reflect.DeepEqual(got.Dimensions, p.Dimensions) {
			t.Fatalf("tx PolicyGet of generation 99 after it was written: %+v, %v", got, err)
		}
		if v, err := tx.MetaGet(ctx, "no_such_counter"); err != nil || v != 4 {
			t.Fatalf("tx MetaGet of a counter after it was written: %d, %v", v, err)
		}
	})
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
	Commit(t, s, fixture())
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
	Commit(t, s, up)
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
	Commit(t, s, c)
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
	Commit(t, s, fixture())
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
	Commit(t, s, base)
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
	Commit(t, s, base)
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
	Commit(t, s, base)
	st := fixtureStatements()[1]
	st.Closing[0].Available++
	failingWrite(t, s, &store.Changes{}, &store.Changes{Statements: []ledger.Statement{st}}, snapshotOf(base))
	// The same epoch start of another account is not a duplicate.
	st.Account = accEU2
	Commit(t, s, &store.Changes{Statements: []ledger.Statement{st}})
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
		Commit(t, s, &store.Changes{Journal: entries, Statements: []ledger.Statement{st}})
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
	Commit(t, s, first)
	second := batch("rl-b")
	second.Reservations[101] = first.Reservations[57]
	second.NewReservations[first.Reservations[57].ID] = true
	failingWrite(t, s, &store.Changes{}, second, snapshotOf(first))
	third := batch("rl-c")
	Commit(t, s, third)
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
		// Claimed and due at exactly now: listed once, not once as due
		// and once more as EXPIRING.
		mk("rl-expiring-exact", ledger.StateExpiring, now, none),
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
	Commit(t, s, c)
	byID := map[string]ledger.Reservation{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	// listed is what ReservationsDue must say of each row: its state and
	// when it became due (the deadline of started work, else the hold's
	// expiry).
	listed := func(ids ...string) []store.DueReservation {
		out := []store.DueReservation{}
		for _, id := range ids {
			r := byID[id]
			d := store.DueReservation{ID: id, State: r.State, DueAt: r.ExpiresAt}
			if r.State == ledger.StateStarted {
				d.DueAt = r.ExecutionDeadline
			}
			out = append(out, d)
		}
		return out
	}
	same := func(got, want []store.DueReservation) bool {
		return slices.EqualFunc(got, want, func(a, b store.DueReservation) bool {
			return a.ID == b.ID && a.State == b.State && a.DueAt.Equal(b.DueAt)
		})
	}
	want := listed("rl-started-due", "rl-a", "rl-b", "rl-reserved-due", "rl-expiring", "rl-expiring-exact",
		"rl-reserved-exact", "rl-started-exact", "rl-expiring-late")
	for _, limit := range []int{100, len(want), 3, 1} {
		got, err := s.ReservationsDue(ctx, now, limit)
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		w := want[:min(limit, len(want))]
		if !same(got, w) {
			t.Errorf("limit %d:\n got %v\nwant %v", limit, got, w)
		}
	}
	got, err := s.ReservationsDue(ctx, now, 0)
	if err != nil || len(got) != 0 {
		t.Errorf("limit 0: %v, %v", got, err)
	}
	got, err = s.ReservationsDue(ctx, at(-time.Hour-time.Second), 100)
	if err != nil || !same(got, listed("rl-expiring", "rl-expiring-exact", "rl-expiring-late")) {
		t.Errorf("before anything is due: %v, %v; want only the EXPIRING ones", got, err)
	}
	// Moving a due reservation on takes it out of the list, or lists it
	// with its new state and due time: the worker decides from the list.
	started := byID["rl-reserved-due"]
	started.State = ledger.StateStarted
	started.StartedAt = now
	started.OperationID = "op-x"
	claimed := byID["rl-a"]
	claimed.State = ledger.StateExpiring
	overrun := byID["rl-b"]
	overrun.State = ledger.StateStarted
	overrun.StartedAt = at(-30 * time.Second)
	overrun.OperationID = "op-b"
	overrun.ExecutionDeadline = at(-11 * time.Second)
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{claimed, overrun, started}})
	byID[claimed.ID], byID[overrun.ID] = claimed, overrun
	got, err = s.ReservationsDue(ctx, now, 100)
	want = listed("rl-started-due", "rl-a", "rl-b", "rl-expiring", "rl-expiring-exact",
		"rl-reserved-exact", "rl-started-exact", "rl-expiring-late")
	want[1], want[2] = want[2], want[1] // rl-b is due a second earlier now
	if err != nil || !same(got, want) {
		t.Errorf("after starting %s, claiming %s and starting %s with a past deadline:\n got %v, %v\nwant %v",
			started.ID, claimed.ID, overrun.ID, got, err, want)
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
	Commit(t, s, &store.Changes{Accounts: accounts})
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
	slices.SortFunc(want, func(a, b ledger.Account) int { return a.Key.Compare(b.Key) })
	same(t, "every account", all, want)
	none, err := s.AccountList(ctx, ledger.PolicyKey{Subject: "tenant9", Route: "chat", Region: "eu"})
	if err != nil || len(none) != 0 {
		t.Errorf("unknown subject: %v, %v", none, err)
	}
}

// AccountsOfSubjects returns what AccountList returns for each named
// subject, every generation, whole rows, in key order across subjects
// whose keys prefix one another, each subject once however often it is
// named, nothing for unknown or empty keys, nothing uncommitted; and as
// many subjects as a debt page of 200 names (past SQLite's statements of
// 128) come back whole.
func testAccountsOfSubjects(t *testing.T, s store.Store) {
	ctx := context.Background()
	accounts, _ := debtAccounts()
	subject := func(subject, route, region string) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: subject, Route: route, Region: region}
	}
	if got, err := s.AccountsOfSubjects(ctx, []ledger.PolicyKey{subject("t7", "chat", "eu")}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}
	Commit(t, s, &store.Changes{Accounts: accounts})
	asked := []ledger.PolicyKey{
		subject("t70", "chat", "eu"), subject("t7", "chat", "eu"), subject("nobody", "chat", "eu"),
		subject("t7", "chatbot", "eu"), subject("t7", "chat", "eu"), subject("", "chat", "eu"),
		subject("t7", "chat", "eu-west"), subject("t", "chat", "eu"), subject("t7", "chat", ""),
	}
	var want []ledger.Account
	for _, k := range []ledger.PolicyKey{subject("t", "chat", "eu"), subject("t7", "chat", "eu"),
		subject("t7", "chat", "eu-west"), subject("t7", "chatbot", "eu"), subject("t70", "chat", "eu")} {
		list, err := s.AccountList(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, list...)
	}
	if len(want) != 8 {
		t.Fatalf("AccountList of the 5 subjects: %d accounts, want 8", len(want))
	}
	got, err := s.AccountsOfSubjects(ctx, asked)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "accounts of 5 subjects named among others, one twice", got, want)
	for _, none := range [][]ledger.PolicyKey{nil, {}, {subject("nobody", "chat", "eu")}, {subject("", "", "")}} {
		if got, err := s.AccountsOfSubjects(ctx, none); err != nil || len(got) != 0 {
			t.Errorf("subjects %q: %v, %v; want none", none, got, err)
		}
	}
	// Uncommitted accounts are not read.
	extra := accounts[0]
	extra.Key.Generation = 99
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{extra}}); err != nil {
			t.Fatal(err)
		}
		got, err := s.AccountsOfSubjects(ctx, asked)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "with an uncommitted account", got, want)
	})

	// 200 subjects of two generations each, named in reverse.
	var many []ledger.Account
	var names []ledger.PolicyKey
	for i := range 200 {
		k := subject(fmt.Sprintf("page-%03d", i), "chat", "eu")
		names = append([]ledger.PolicyKey{k}, names...)
		for _, g := range []uint64{1, 2} {
			a := ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g},
				Dims: 1, EpochStart: at(0), Version: g}
			a.Balances[0] = noDebt()
			many = append(many, a)
		}
	}
	Commit(t, s, &store.Changes{Accounts: many})
	got, err = s.AccountsOfSubjects(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "accounts of 200 subjects", got, many)
}

// PolicyHeads returns what PolicyHead returns for each named key that
// has a head, by key, and nothing for the others (no error): keys whose
// texts prefix one another, named twice, in any order, none named, none
// committed yet, an uncommitted head; and 300 keys (past SQLite's
// statements of 128) come back whole.
func testPolicyHeads(t *testing.T, s store.Store) {
	ctx := context.Background()
	key := func(subject, route, region string) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: subject, Route: route, Region: region}
	}
	asked := []ledger.PolicyKey{
		key("t70", "chat", "eu"), key("t7", "chat", "eu"), key("nobody", "chat", "eu"),
		key("t7", "chatbot", "eu"), key("t7", "chat", "eu"), key("*", "chat", "eu"),
		key("t7", "chat", "eu-west"), key("t", "chat", "eu"), key("t7", "chat", ""), key("", "", ""),
	}
	for _, keys := range [][]ledger.PolicyKey{nil, {}, asked} {
		if got, err := s.PolicyHeads(ctx, keys); err != nil || len(got) != 0 {
			t.Errorf("empty store, keys %q: %v, %v; want none", keys, got, err)
		}
	}
	heads := []ledger.PolicyHead{
		{Key: key("t", "chat", "eu"), Active: 1, Latest: 1},
		{Key: key("t7", "chat", "eu"), Active: 0, Latest: 4}, // every generation rolled back
		{Key: key("t7", "chat", "eu-west"), Active: 2, Latest: 3},
		{Key: key("t7", "chatbot", "eu"), Active: 5, Latest: 5},
		{Key: key("*", "chat", "eu"), Active: 6, Latest: 7},
		{Key: key("t70", "chat", "eu"), Active: 1<<63 - 1, Latest: 1<<63 - 1},
		{Key: key("unasked", "chat", "eu"), Active: 8, Latest: 8},
	}
	Commit(t, s, &store.Changes{Heads: heads})
	want := map[ledger.PolicyKey]ledger.PolicyHead{}
	for _, h := range heads[:len(heads)-1] {
		one, err := s.PolicyHead(ctx, h.Key)
		if err != nil {
			t.Fatalf("PolicyHead %s: %v", h.Key, err)
		}
		want[h.Key] = one
	}
	check := func(what string, keys []ledger.PolicyKey, want map[ledger.PolicyKey]ledger.PolicyHead) {
		t.Helper()
		got, err := s.PolicyHeads(ctx, keys)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %v\nwant %v", what, got, want)
		}
	}
	check("6 keys with heads named among others, one twice", asked, want)
	for _, keys := range [][]ledger.PolicyKey{nil, {}, {key("nobody", "chat", "eu")}, {key("", "", "")}} {
		check(fmt.Sprintf("keys %q", keys), keys, map[ledger.PolicyKey]ledger.PolicyHead{})
	}
	// An uncommitted head is not read.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{Heads: []ledger.PolicyHead{{Key: key("nobody", "chat", "eu"), Active: 9, Latest: 9}}}); err != nil {
			t.Fatal(err)
		}
		check("with an uncommitted head", asked, want)
	})

	// 300 keys, named in reverse, each twice, with 300 keys without a head.
	var many []ledger.PolicyHead
	var names []ledger.PolicyKey
	wantMany := map[ledger.PolicyKey]ledger.PolicyHead{}
	for i := range 300 {
		h := ledger.PolicyHead{Key: key(fmt.Sprintf("page-%03d", i), "chat", "eu"), Active: uint64(i), Latest: uint64(i + 1)}
		many = append(many, h)
		wantMany[h.Key] = h
		names = append([]ledger.PolicyKey{h.Key, key(fmt.Sprintf("none-%03d", i), "chat", "eu"), h.Key}, names...)
	}
	Commit(t, s, &store.Changes{Heads: many})
	check("300 keys", names, wantMany)
}

func testLists(t *testing.T, s store.Store) {
	ctx := context.Background()
	policies := fixturePolicies()
	shards := fixtureShards()
	// Written newest first, so insertion order is not the answer.
	slices.Reverse(policies)
	slices.Reverse(shards)
	Commit(t, s, &store.Changes{Policies: policies, Shards: shards})
	gotPolicies, err := s.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "policies", gotPolicies, fixturePolicies())
	for after := range uint64(len(gotPolicies) + 1) {
		got, err := s.PolicyListAfter(ctx, after)
		if err != nil {
			t.Fatal(err)
		}
		var want []ledger.Policy
		for _, p := range fixturePolicies() {
			if p.Generation > after {
				want = append(want, p)
			}
		}
		same(t, fmt.Sprintf("policies after %d", after), got, want)
	}
	if got, err := s.PolicyListAfter(ctx, math.MaxUint64); err != nil || len(got) != 0 {
		t.Errorf("policies after the largest generation: %v, %v; want none", got, err)
	}
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
	times := []*time.Time{&r.AccountingEpoch, &r.CreatedAt, &r.ExpiresAt, &r.StartedAt, &r.ExecutionDeadline, &r.UnknownAt,
		&r.FinishedAt}
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
	Commit(t, s, &store.Changes{Policies: []ledger.Policy{p}, Reservations: []ledger.Reservation{r},
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
		for _, tt := range []time.Time{got.AccountingEpoch, got.CreatedAt, got.ExpiresAt, got.StartedAt, got.ExecutionDeadline,
			got.UnknownAt, got.FinishedAt} {
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
	Commit(t, s, fixture())
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
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{start}})
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

// unknownRows returns the reservations of the USAGE_UNKNOWN tests: eight
// USAGE_UNKNOWN ones (four marked at the same time, written out of id
// order, across two subjects, two routes and a subject that "tenant7" is
// a prefix of), one STARTED that later turns USAGE_UNKNOWN, and one of
// each other state a reservation passes through, started earlier than
// any of them, so a store that lists another state shows it first. The
// USAGE_UNKNOWN ones started in the reverse of the order they were marked
// in, and the one settled with debt was marked earliest of all, so a
// store that orders or ages the backlog by StartedAt, or counts a
// reservation that is no longer USAGE_UNKNOWN, answers otherwise.
func unknownRows() []ledger.Reservation {
	chat7 := ledger.AccountKey{Subject: "tenant7", Route: "chat.generate", Region: "eu", Generation: 2}
	embed7 := ledger.AccountKey{Subject: "tenant7", Route: "embed", Region: "eu", Generation: 2}
	chat8 := ledger.AccountKey{Subject: "tenant8", Route: "chat.generate", Region: "eu", Generation: 3}
	chat70 := ledger.AccountKey{Subject: "tenant70", Route: "chat.generate", Region: "us", Generation: 1}
	mk := func(id string, account ledger.AccountKey, state ledger.State, started, marked time.Time) ledger.Reservation {
		r := ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: account, AccountingEpoch: at(-2 * time.Hour),
			Reserved: ledger.Amounts{600, 1}, State: state, CreatedAt: at(-3 * time.Hour), ExpiresAt: at(-3*time.Hour + 30*time.Second)}
		if !started.IsZero() {
			r.OperationID = "op-" + id
			r.StartedAt = started
			r.ExecutionDeadline = started.Add(2 * time.Minute)
		}
		r.UnknownAt = marked
		switch state {
		case ledger.StateSettled, ledger.StateSettledWithDebt:
			r.FinishedAt = started.Add(time.Second)
			r.Actual = ledger.Amounts{200, 1}
		}
		return r
	}
	tie := at(-time.Hour)
	ago := func(minutes time.Duration) time.Time { return at(-minutes * time.Minute) }
	return []ledger.Reservation{
		mk("uu-old", chat8, ledger.StateUsageUnknown, ago(91), ago(90)),
		mk("uu-c", chat7, ledger.StateUsageUnknown, ago(110), tie),
		mk("uu-a", embed7, ledger.StateUsageUnknown, ago(95), tie),
		mk("uu-d", chat70, ledger.StateUsageUnknown, ago(120), tie),
		mk("uu-b", chat8, ledger.StateUsageUnknown, ago(100), tie),
		mk("uu-mid", chat7, ledger.StateUsageUnknown, ago(130), tie.Add(time.Nanosecond)),
		mk("uu-0", chat7, ledger.StateUsageUnknown, ago(140), ago(30)),
		mk("uu-late", embed7, ledger.StateUsageUnknown, ago(150), ago(10)),
		mk("rl-to-unknown", chat7, ledger.StateStarted, ago(160), time.Time{}),
		mk("rl-reserved", chat7, ledger.StateReserved, time.Time{}, time.Time{}),
		mk("rl-released", chat8, ledger.StateReleased, time.Time{}, time.Time{}),
		mk("rl-started", chat7, ledger.StateStarted, ago(170), time.Time{}),
		mk("rl-settled", chat7, ledger.StateSettled, ago(170), time.Time{}),
		mk("rl-debt", chat8, ledger.StateSettledWithDebt, ago(170), ago(165)),
	}
}

// insertAll writes rows as new reservations in one transaction.
func insertAll(t *testing.T, s store.Store, rows []ledger.Reservation) {
	t.Helper()
	c := &store.Changes{Reservations: rows, NewReservations: map[string]bool{}}
	for _, r := range rows {
		c.NewReservations[r.ID] = true
	}
	Commit(t, s, c)
}

// settle returns r settled by an operation receipt.
func settle(r ledger.Reservation) ledger.Reservation {
	r.State = ledger.StateSettled
	r.Actual = ledger.Amounts{100, 1}
	r.FinishedAt = at(0)
	return r
}

// unknownPages pages through ReservationsUnknown under f, each page
// after the last row of the one before, until a page comes back short.
// It returns the pages, the empty page included when the last full page
// was the end.
func unknownPages(t *testing.T, s store.Store, f store.UnknownFilter) [][]ledger.Reservation {
	t.Helper()
	var pages [][]ledger.Reservation
	for range 50 {
		page, err := s.ReservationsUnknown(context.Background(), f)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if len(page) > f.Limit {
			t.Fatalf("%+v: %d rows, more than the limit", f, len(page))
		}
		pages = append(pages, page)
		if len(page) < f.Limit {
			return pages
		}
		last := page[len(page)-1]
		f.After = store.UnknownCursor{MarkedAt: last.UnknownAt, ID: last.ID}
	}
	t.Fatalf("%+v: still paging after 50 pages (does the cursor move on?)", f)
	return nil
}

// ids returns the ids of each page.
func pageIDs(pages [][]ledger.Reservation) [][]string {
	out := [][]string{}
	for _, page := range pages {
		ids := []string{}
		for _, r := range page {
			ids = append(ids, r.ID)
		}
		out = append(out, ids)
	}
	return out
}

func testReservationsUnknown(t *testing.T, s store.Store) {
	ctx := context.Background()
	rows := unknownRows()
	byID := map[string]ledger.Reservation{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	insertAll(t, s, rows)
	all := []string{"uu-old", "uu-a", "uu-b", "uu-c", "uu-d", "uu-mid", "uu-0", "uu-late"}

	// The first page holds whole rows, decoded as ReservationGet does.
	first, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var want []ledger.Reservation
	for _, id := range all {
		want = append(want, byID[id])
	}
	same(t, "every USAGE_UNKNOWN reservation", first, want)

	for _, tc := range []struct {
		name  string
		f     store.UnknownFilter
		pages [][]string
	}{
		{"limit 3", store.UnknownFilter{Limit: 3},
			[][]string{{"uu-old", "uu-a", "uu-b"}, {"uu-c", "uu-d", "uu-mid"}, {"uu-0", "uu-late"}}},
		{"limit 2", store.UnknownFilter{Limit: 2},
			[][]string{{"uu-old", "uu-a"}, {"uu-b", "uu-c"}, {"uu-d", "uu-mid"}, {"uu-0", "uu-late"}, {}}},
		{"limit 1", store.UnknownFilter{Limit: 1},
			[][]string{{"uu-old"}, {"uu-a"}, {"uu-b"}, {"uu-c"}, {"uu-d"}, {"uu-mid"}, {"uu-0"}, {"uu-late"}, {}}},
		{"subject", store.UnknownFilter{Subject: "tenant7", Limit: 2},
			[][]string{{"uu-a", "uu-c"}, {"uu-mid", "uu-0"}, {"uu-late"}}},
		{"route", store.UnknownFilter{Route: "chat.generate", Limit: 4},
			[][]string{{"uu-old", "uu-b", "uu-c", "uu-d"}, {"uu-mid", "uu-0"}}},
		{"subject and route", store.UnknownFilter{Subject: "tenant7", Route: "chat.generate", Limit: 1},
			[][]string{{"uu-c"}, {"uu-mid"}, {"uu-0"}, {}}},
		{"another subject's route", store.UnknownFilter{Subject: "tenant8", Route: "embed", Limit: 5}, [][]string{{}}},
		{"no such subject", store.UnknownFilter{Subject: "tenant9", Limit: 5}, [][]string{{}}},
		{"after a row inside a tie", store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-time.Hour), ID: "uu-b"}, Limit: 10},
			[][]string{{"uu-c", "uu-d", "uu-mid", "uu-0", "uu-late"}}},
		{"after a time, before its ids", store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-time.Hour)}, Limit: 10},
			[][]string{{"uu-a", "uu-b", "uu-c", "uu-d", "uu-mid", "uu-0", "uu-late"}}},
		{"after a time, past its ids", store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-time.Hour), ID: "uu-zzz"}, Limit: 10},
			[][]string{{"uu-mid", "uu-0", "uu-late"}}},
		{"after a time between rows", store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-20 * time.Minute), ID: "zz"}, Limit: 10},
			[][]string{{"uu-late"}}},
		{"after the last row", store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-10 * time.Minute), ID: "uu-late"}, Limit: 10},
			[][]string{{}}},
		{"subject after a cursor", store.UnknownFilter{Subject: "tenant7", After: store.UnknownCursor{MarkedAt: at(-time.Hour), ID: "uu-b"}, Limit: 10},
			[][]string{{"uu-c", "uu-mid", "uu-0", "uu-late"}}},
	} {
		same(t, tc.name, pageIDs(unknownPages(t, s, tc.f)), tc.pages)
	}

	for _, limit := range []int{0, -1} {
		if got, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Limit: limit}); err == nil {
			t.Errorf("limit %d: %v and no error", limit, got)
		}
	}
	tooLate := store.UnknownCursor{MarkedAt: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), ID: "uu-a"}
	if got, err := s.ReservationsUnknown(ctx, store.UnknownFilter{After: tooLate, Limit: 10}); err == nil {
		t.Errorf("cursor after 2262: %v and no error", got)
	}

	// A reservation that turns USAGE_UNKNOWN joins the list in the place
	// of its marking (it started before all of them); settled ones leave
	// it, whether first or inside a tie.
	toUnknown := byID["rl-to-unknown"]
	toUnknown.State = ledger.StateUsageUnknown
	toUnknown.UnknownAt = at(-45 * time.Minute)
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{toUnknown, settle(byID["uu-old"]), settle(byID["uu-b"])}})
	same(t, "after settling uu-old and uu-b", pageIDs(unknownPages(t, s, store.UnknownFilter{Limit: 2})),
		[][]string{{"uu-a", "uu-c"}, {"uu-d", "uu-mid"}, {"rl-to-unknown", "uu-0"}, {"uu-late"}})
	got, err := s.ReservationsUnknown(ctx, store.UnknownFilter{After: store.UnknownCursor{MarkedAt: at(-time.Hour), ID: "uu-d"}, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	same(t, "after uu-d", got, []ledger.Reservation{byID["uu-mid"], toUnknown})
}

func testReservationsUnknownBacklog(t *testing.T, s store.Store) {
	ctx := context.Background()
	backlog := func(what string, want store.UnknownBacklog) {
		t.Helper()
		got, err := s.ReservationsUnknownBacklog(ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		same(t, what, got, want)
		list, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 100})
		if err != nil {
			t.Fatalf("%s: list: %v", what, err)
		}
		if int64(len(list)) != want.Count {
			t.Errorf("%s: %d listed, backlog %d", what, len(list), want.Count)
		}
	}
	backlog("empty store", store.UnknownBacklog{})
	rows := unknownRows()

	// Uncommitted USAGE_UNKNOWN rows are not part of it.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		c := &store.Changes{Reservations: rows[:3], NewReservations: map[string]bool{}}
		for _, r := range c.Reservations {
			c.NewReservations[r.ID] = true
		}
		if err := tx.Write(ctx, c); err != nil {
			t.Fatal(err)
		}
		backlog("uncommitted", store.UnknownBacklog{})
	})

	// Only the other states: still empty.
	var others, unknown []ledger.Reservation
	for _, r := range rows {
		if r.State == ledger.StateUsageUnknown {
			unknown = append(unknown, r)
		} else {
			others = append(others, r)
		}
	}
	insertAll(t, s, others)
	backlog("no USAGE_UNKNOWN reservation", store.UnknownBacklog{})
	insertAll(t, s, unknown)
	backlog("eight", store.UnknownBacklog{Count: 8, OldestMarkedAt: at(-90 * time.Minute)})

	// Settling the oldest moves the age to the next; settling every one
	// empties the backlog.
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{settle(unknown[0])}})
	backlog("oldest settled", store.UnknownBacklog{Count: 7, OldestMarkedAt: at(-time.Hour)})
	var rest []ledger.Reservation
	for _, r := range unknown[1:] {
		rest = append(rest, settle(r))
	}
	Commit(t, s, &store.Changes{Reservations: rest})
	backlog("every one settled", store.UnknownBacklog{})
}

// testPolicyChanges: PolicyChanges counts the committed publishes of a
// new generation and rollbacks (ledger.MetaPolicyChanges), each in its own
// transaction, and nothing else: not a replayed publish or rollback, not
// a transaction still open or rolled back.
func testPolicyChanges(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	want := func(step string, n uint64) {
		t.Helper()
		if got, err := s.PolicyChanges(ctx); err != nil || got != n {
			t.Fatalf("%s: PolicyChanges = %d, %v; want %d", step, got, err, n)
		}
	}
	run := func(step string, cmd ledger.Command) ledger.Result {
		t.Helper()
		res, err := apply(ctx, s, &cmd, now)
		if err != nil || res.Err != nil {
			t.Fatalf("%s: %v, %v", step, err, res.Err)
		}
		return res
	}
	policy := func(subject string, burst int64) *ledger.Policy {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: 1, RefillInterval: time.Second}}}.WithDefaults()
		return &p
	}
	want("a new store", 0)
	run("publish a", ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy("a", 10)})
	want("one publish", 1)
	run("publish a again", ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy("a", 10)})
	want("a replayed publish", 1)
	g2 := run("publish a's next", ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy("a", 20)}).Generation
	run("publish b", ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy("b", 10)})
	want("three publishes", 3)
	key := policy("a", 20).Key
	run("rollback", ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: g2})
	want("a rollback", 4)
	run("rollback again", ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: g2})
	want("a replayed rollback", 4)

	// A rollback written and not committed, then rolled back.
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	book := store.NewBook(ctx, tx, 1)
	if res := ledger.Apply(book, &ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 1}, now); res.Err != nil || book.Err() != nil {
		t.Fatalf("rollback in a transaction: %v, %v", res.Err, book.Err())
	}
	if err := tx.Write(ctx, book.Changes()); err != nil {
		t.Fatal(err)
	}
	want("a rollback written, not committed", 4)
	tx.Rollback(ctx)
	want("a rollback rolled back", 4)
	run("rollback of generation 1", ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 1})
	want("the second rollback", 5)
}

// AccountsView returns each named subject's accounts, as
// AccountsOfSubjects does, and for each that owes its committed current
// pointer and owing-set rows, not another subject's whose key (or
// owing-set name) its own prefixes, nor other meta rows; a subject with
// neither, or none of whose accounts owes, is absent from the owing map;
// nothing uncommitted; 200 subjects (past SQLite's statements of 128)
// come back whole.
func testAccountsViewOwing(t *testing.T, s store.Store) {
	ctx := context.Background()
	key := func(subject, region string) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: subject, Route: "chat", Region: region}
	}
	owingOf := func(ctx context.Context, subjects []ledger.PolicyKey) (map[ledger.PolicyKey]store.SubjectOwing, error) {
		t.Helper()
		view, err := s.AccountsView(ctx, subjects)
		if err != nil {
			return nil, err
		}
		accounts, owing := view.Accounts, view.Owing
		want, err := s.AccountsOfSubjects(ctx, subjects)
		if err != nil {
			t.Fatal(err)
		}
		if len(accounts) != 0 || len(want) != 0 {
			same(t, fmt.Sprintf("accounts with owing of %d subjects", len(subjects)), accounts, want)
		}
		return owing, nil
	}
	frozen, near, plain, none := key("t7", "eu"), key("t7", "eu-west"), key("t70", "eu"), key("nobody", "eu")
	if got, err := owingOf(ctx, []ledger.PolicyKey{frozen}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}
	for _, empty := range [][]ledger.PolicyKey{nil, {key("", "eu")}} {
		if view, err := s.AccountsView(ctx, empty); err != nil || len(view.Accounts) != 0 || len(view.Owing) != 0 {
			t.Errorf("subjects %q: %+v, %v; want none", empty, view, err)
		}
	}
	base, nearBase := ledger.OwingMetaName(frozen), ledger.OwingMetaName(near)
	accounts, _ := debtAccounts()
	Commit(t, s, &store.Changes{
		Meta: map[string]int64{base: 2, base + "/0": 4, base + "/1": 9, nearBase: 1, nearBase + "/0": 3, "policy_generation": 9},
		Currents: []store.Current{{Subject: frozen, Generation: 4}, {Subject: near, Generation: 3}, {Subject: plain, Generation: 7},
			{Subject: key("t", "eu"), Generation: 1}},
		Accounts: accounts,
	})
	// t/chat/eu has a current pointer but owes nothing: absent.
	got, err := owingOf(ctx, []ledger.PolicyKey{frozen, plain, none, frozen, key("", "eu"), key("t", "eu")})
	if err != nil {
		t.Fatal(err)
	}
	want := map[ledger.PolicyKey]store.SubjectOwing{
		frozen: {Current: 4, HasCurrent: true, Meta: map[string]int64{base: 2, base + "/0": 4, base + "/1": 9}},
		plain:  {Current: 7, HasCurrent: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("owing of subjects:\n got %+v\nwant %+v", got, want)
	}
	// Uncommitted rows are not read.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{Meta: map[string]int64{ledger.OwingMetaName(plain): 1}, Currents: []store.Current{{Subject: none, Generation: 1}}}); err != nil {
			t.Fatal(err)
		}
		got, err := owingOf(ctx, []ledger.PolicyKey{frozen, plain, none})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("with uncommitted rows:\n got %+v\nwant %+v", got, want)
		}
	})
	var currents []store.Current
	var names []ledger.PolicyKey
	var many []ledger.Account
	for i := range 200 {
		k := key(fmt.Sprintf("page-%03d", i), "eu")
		names = append([]ledger.PolicyKey{k}, names...)
		currents = append(currents, store.Current{Subject: k, Generation: uint64(i + 1)})
		a := ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: uint64(i + 1)},
			Dims: 1, EpochStart: at(0), Version: 1}
		a.Balances[0] = owing(1, 0)
		many = append(many, a)
	}
	Commit(t, s, &store.Changes{Currents: currents, Accounts: many})
	got, err = owingOf(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 200 {
		t.Fatalf("200 subjects: %d answers", len(got))
	}
	for _, c := range currents {
		if o := got[c.Subject]; !o.HasCurrent || o.Current != c.Generation || o.Meta != nil {
			t.Errorf("%s: %+v, want current %d", c.Subject, o, c.Generation)
		}
	}
}
