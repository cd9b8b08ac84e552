package storetest

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// AccountsView reads a subject's accounts and its current pointer and
// owing-set rows from one snapshot: a commit between its reads
// (store.WithBetweenReads) that moves the subject's capacity and debt from
// generation 1's account to generation 2's, with its pointer, and joins it
// to its owing set, is in both parts of the answer or in neither (not
// generation 1's debt shown beside a pointer at generation 2, nor both
// accounts' capacity); the next read has it in both.
func testAccountsViewOwingOneSnapshot(t *testing.T, s store.Store) {
	ctx := context.Background()
	subject := ledger.PolicyKey{Subject: "t7", Route: "chat", Region: "eu"}
	other := ledger.PolicyKey{Subject: "t8", Route: "chat", Region: "eu"}
	account := func(k ledger.PolicyKey, generation uint64, version uint64, b ledger.Balance) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: generation},
			Dims: 1, EpochStart: at(0), Version: version}
		a.Balances[0] = b
		a.RefilledTo[0] = at(0).UnixNano()
		return a
	}
	base := ledger.OwingMetaName(subject)
	before := view{
		accounts: []ledger.Account{account(subject, 1, 4, owing(40, 10))},
		owing:    store.SubjectOwing{Current: 1, HasCurrent: true},
	}
	// The switch: generation 1's capacity retired for the move, its debt
	// now generation 2's, the pointer at 2, the subject in its owing set.
	after := view{
		accounts: []ledger.Account{
			account(subject, 1, 5, ledger.Balance{Opening: 100, RetiredForMove: 100}),
			account(subject, 2, 1, owing(30, 0)),
		},
		owing: store.SubjectOwing{Current: 2, HasCurrent: true, Meta: map[string]int64{base: 1, base + "/0": 1}},
	}
	bystander := account(other, 1, 1, noDebt())
	Commit(t, s, &store.Changes{
		Accounts: []ledger.Account{before.accounts[0], bystander},
		Currents: []store.Current{{Subject: subject, Generation: 1}},
	})
	asked := []ledger.PolicyKey{subject, other}
	read := func(ctx context.Context) view {
		t.Helper()
		got, err := s.AccountsView(ctx, asked)
		if err != nil {
			t.Fatal(err)
		}
		accounts, owing := got.Accounts, got.Owing
		var v view
		for _, a := range accounts {
			if a.Key.SubjectKey() == subject {
				v.accounts = append(v.accounts, a)
			} else if a != bystander {
				t.Errorf("bystander read as %+v, want %+v", a, bystander)
			}
		}
		v.owing = owing[subject]
		return v
	}
	switched := 0
	hooked := store.WithBetweenReads(ctx, func() {
		if switched++; switched > 1 {
			return
		}
		Commit(t, s, &store.Changes{
			Accounts: after.accounts,
			Currents: []store.Current{{Subject: subject, Generation: 2}},
			Meta:     after.owing.Meta,
		})
	})
	got := read(hooked)
	if switched != 1 {
		t.Fatalf("the hook between the reads ran %d times, want once", switched)
	}
	if !reflect.DeepEqual(got, before) && !reflect.DeepEqual(got, after) {
		t.Errorf("a switch committed between the reads shows half of it:\n got %v\nwant %v\n  or %v", got, before, after)
	}
	if got := read(ctx); !reflect.DeepEqual(got, after) {
		t.Errorf("after the switch:\n got %v\nwant %v", got, after)
	}
}

// view is what AccountsView returns of one subject's accounts and owing rows.
type view struct {
	accounts []ledger.Account
	owing    store.SubjectOwing
}

// String names the view's accounts by key and version, with its pointer
// and owing-set rows.
func (v view) String() string {
	var b strings.Builder
	for _, a := range v.accounts {
		fmt.Fprintf(&b, "%s v%d, ", a.Key, a.Version)
	}
	fmt.Fprintf(&b, "current %d (%t), owing rows %v", v.owing.Current, v.owing.HasCurrent, v.owing.Meta)
	return b.String()
}
