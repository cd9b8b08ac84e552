package storetest

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// AccountsView reads subjects' accounts, the owing rows of those that
// owe, the generation deciding for each (its own key's head, else its
// route's "*" head) and the policies of those generations and the
// accounts' from one snapshot: a publish that a subject's next command
// switched to, or a rollback, committed between its reads
// (store.WithBetweenReads) is in the whole view or in none of it (not
// generation 1's account beside generation 2 deciding with burst 10, nor
// generation 2's account beside a head that never had it); the next read
// has it whole.
func testAccountsViewOneSnapshot(t *testing.T, s store.Store) {
	ctx := context.Background()
	subject := ledger.PolicyKey{Subject: "t7", Route: "chat", Region: "eu"}
	debtor := ledger.PolicyKey{Subject: "t9", Route: "chat", Region: "eu"}
	anyKey := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat", Region: "eu"}
	policy := func(k ledger.PolicyKey, generation uint64, burst int64) ledger.Policy {
		return ledger.Policy{Key: k, Generation: generation,
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: ledger.Units(burst), RefillUnits: 1}}}.WithDefaults()
	}
	account := func(k ledger.PolicyKey, generation uint64, version uint64, b ledger.Balance) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: generation},
			Dims: 1, EpochStart: at(0), Version: version}
		a.Balances[0] = b
		a.RefilledTo[0] = at(0).UnixNano()
		return a
	}
	Commit(t, s, &store.Changes{
		Policies: []ledger.Policy{policy(anyKey, 1, 100)},
		Heads:    []ledger.PolicyHead{{Key: anyKey, Active: 1, Latest: 1}},
		Accounts: []ledger.Account{account(subject, 1, 1, noDebt()), account(debtor, 1, 1, owing(30, 0))},
		Currents: []store.Current{{Subject: subject, Generation: 1}, {Subject: debtor, Generation: 1}},
	})
	asked := []ledger.PolicyKey{debtor, subject, subject, {Route: "chat"}}
	read := func(ctx context.Context) store.AccountsView {
		t.Helper()
		v, err := s.AccountsView(ctx, asked)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// hookedRead reads with change committed between the view's reads,
	// once, and returns what it read.
	hookedRead := func(change *store.Changes) store.AccountsView {
		t.Helper()
		ran := 0
		got := read(store.WithBetweenReads(ctx, func() {
			if ran++; ran == 1 {
				Commit(t, s, change)
			}
		}))
		if ran != 1 {
			t.Fatalf("the hook between the reads ran %d times, want once", ran)
		}
		return got
	}

	before := read(ctx)
	if want := map[ledger.PolicyKey]uint64{subject: 1, debtor: 1}; !reflect.DeepEqual(before.Deciding, want) {
		t.Errorf("deciding %v, want %v (the route's \"*\" generation)", before.Deciding, want)
	}
	if got := slices.Sorted(maps.Keys(before.Policies)); !reflect.DeepEqual(got, []uint64{1}) {
		t.Errorf("policies of generations %v, want [1]", got)
	}
	if _, ok := before.Owing[subject]; ok || len(before.Owing) != 1 || !before.Owing[debtor].HasCurrent {
		t.Errorf("owing %+v, want the debtor's only", before.Owing)
	}
	if len(before.Accounts) != 2 || before.Accounts[0].Key.Subject != "t7" {
		t.Errorf("accounts %v, want t7's then t9's", viewString(before))
	}

	// Generation 2 published for t7 (burst 10) and t7's next command
	// switched to it: generation 1's capacity retired, 10 minted in 2.
	got := hookedRead(&store.Changes{
		Policies: []ledger.Policy{policy(subject, 2, 10)},
		Heads:    []ledger.PolicyHead{{Key: subject, Active: 2, Latest: 2}},
		Accounts: []ledger.Account{
			account(subject, 1, 2, ledger.Balance{Opening: 100, RetiredForMove: 100}),
			account(subject, 2, 1, ledger.Balance{Opening: 10, Available: 10}),
		},
		Currents: []store.Current{{Subject: subject, Generation: 2}},
	})
	switched := read(ctx)
	if switched.Deciding[subject] != 2 || len(switched.Accounts) != 3 {
		t.Fatalf("after the switch: %s; want generation 2 deciding, its account read", viewString(switched))
	}
	if !reflect.DeepEqual(got, before) && !reflect.DeepEqual(got, switched) {
		t.Errorf("a publish and switch committed between the reads shows half of it:\n got %s\nwant %s\n  or %s",
			viewString(got), viewString(before), viewString(switched))
	}

	// Generation 2 rolled back: "*"'s generation 1 decides again.
	rolledBack := policy(subject, 2, 10)
	rolledBack.RolledBack = true
	got = hookedRead(&store.Changes{
		Policies: []ledger.Policy{rolledBack},
		Heads:    []ledger.PolicyHead{{Key: subject, Active: 0, Latest: 2}},
	})
	after := read(ctx)
	if after.Deciding[subject] != 1 || !after.Policies[2].RolledBack {
		t.Fatalf("after the rollback: %s; want generation 1 deciding, 2 rolled back", viewString(after))
	}
	if !reflect.DeepEqual(got, switched) && !reflect.DeepEqual(got, after) {
		t.Errorf("a rollback committed between the reads shows half of it:\n got %s\nwant %s\n  or %s",
			viewString(got), viewString(switched), viewString(after))
	}

	if v, err := s.AccountsView(ctx, []ledger.PolicyKey{{Route: "chat"}}); err != nil || len(v.Accounts) != 0 || len(v.Deciding) != 0 {
		t.Errorf("no subject named: %+v, %v; want an empty view", v, err)
	}
}

// viewString names a view's accounts by key and version, with what
// decides and the policies read (rolled back marked).
func viewString(v store.AccountsView) string {
	var b strings.Builder
	for _, a := range v.Accounts {
		fmt.Fprintf(&b, "%s v%d, ", a.Key, a.Version)
	}
	fmt.Fprintf(&b, "deciding %v, policies", v.Deciding)
	for _, g := range slices.Sorted(maps.Keys(v.Policies)) {
		fmt.Fprintf(&b, " %d(rolled back %t)", g, v.Policies[g].RolledBack)
	}
	fmt.Fprintf(&b, ", owing %v", v.Owing)
	return b.String()
}
