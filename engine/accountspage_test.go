package engine

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// Paging through every account with AccountsPage shows each account once,
// as Accounts shows its subject key (the refill due applied to the one
// holding the capacity, which needs the key's every generation), whatever
// the page size: a page never splits a subject key's generations, and a
// key with more generations than the page holds comes whole.
func TestAccountsPageShowsWholeSubjectKeys(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	publish(t, e, 2000, time.Minute, 0)
	publish(t, e, 3000, time.Minute, 0)
	policies, err := e.Policies(ctx)
	if err != nil || len(policies) != 3 {
		t.Fatalf("policies: %v, %v", policies, err)
	}
	account := func(subject string, generation uint64) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: subject, Route: "chat.generate", Region: "eu", Generation: generation},
			Dims: 1, EpochStart: t0, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 1000, Available: 100, Spent: 900}
		a.RefilledTo[0] = t0.UnixNano()
		return a
	}
	var accounts []ledger.Account
	for i := range 4 {
		accounts = append(accounts, account(fmt.Sprintf("u%d", i), policies[2].Generation))
	}
	// u2 holds an account in each of three generations.
	accounts = append(accounts, account("u2", policies[0].Generation), account("u2", policies[1].Generation))
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: accounts}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second) // refill due
	var want []ledger.Account
	for i := range 4 {
		shown, err := e.Accounts(ctx, ledger.PolicyKey{Subject: fmt.Sprintf("u%d", i), Route: "chat.generate", Region: "eu"})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, shown...)
	}
	for _, limit := range []int{1, 2, 3, 4, 100} {
		var got []ledger.Account
		after, more := ledger.AccountKey{}, true
		for calls := 0; more; calls++ {
			if calls > 20 {
				t.Fatalf("limit %d: still paging after 20 pages", limit)
			}
			var page []ledger.Account
			var with ShownWith
			page, with, after, more, err = e.AccountsPage(ctx, store.AccountFilter{After: after, Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, page...)
			// The page's deciding generations are DecidingGenerations' of its subjects.
			var subjects []ledger.PolicyKey
			for i := range page {
				subjects = append(subjects, page[i].Key.SubjectKey())
			}
			wantDeciding, err := e.DecidingGenerations(ctx, subjects)
			if err != nil {
				t.Fatal(err)
			}
			if deciding := with.deciding(); !reflect.DeepEqual(deciding, wantDeciding) {
				t.Errorf("pages of %d: deciding %v for subjects %v, want %v", limit, deciding, subjects, wantDeciding)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("pages of %d:\n got %v\nwant %v", limit, got, want)
		}
	}
}
