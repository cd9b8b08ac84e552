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

// Each debtor of an AccountsInDebt page is shown as Accounts shows its
// subject (with the refill due up to now), whatever the page size: the
// page reads its subjects' accounts in one call, not one per debtor, and
// must show the same. A subject owing in two generations shows both rows
// (from one refill), one whose debt the refill repaid is left out, and a
// keep filter leaves rows out.
func TestAccountsInDebtShowsDebtorsAsAccountsDoes(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0) // refill 10 tokens a second
	publish(t, e, 2000, time.Minute, 0) // a second generation of the same key
	policies, err := e.Policies(ctx)
	if err != nil || len(policies) != 2 {
		t.Fatalf("policies: %v, %v", policies, err)
	}
	old, current := policies[0].Generation, policies[1].Generation
	account := func(subject string, generation uint64, debt int64) ledger.Account {
		a := ledger.Account{Key: ledger.AccountKey{Subject: subject, Route: "chat.generate", Region: "eu", Generation: generation},
			Dims: 1, EpochStart: t0, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 1000, OverdraftIssued: debt, Spent: 1000 + debt}
		a.RefilledTo[0] = t0.UnixNano()
		return a
	}
	accounts := []ledger.Account{
		account("u0", current, 500),
		account("u1", current, 50), // the refill due repays it
		account("u2", old, 300), account("u2", current, 200),
		account("u3", current, 0),
	}
	for i := 4; i < 10; i++ {
		accounts = append(accounts, account(fmt.Sprintf("u%d", i), current, 1000))
	}
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
	clk.Advance(10 * time.Second) // 100 tokens of refill due

	stored, err := st.AccountsInDebt(ctx, store.DebtFilter{Limit: 100})
	if err != nil || len(stored) != 10 {
		t.Fatalf("stored debtors: %d, %v; want 10", len(stored), err)
	}
	keepAll := func(ledger.AccountKey) bool { return true }
	notU4 := func(k ledger.AccountKey) bool { return k.Subject != "u4" }
	for _, keep := range []func(ledger.AccountKey) bool{keepAll, notU4} {
		var want []ledger.Account
		for _, s := range stored {
			if !keep(s.Key) {
				continue
			}
			shown, err := e.Accounts(ctx, s.Key.SubjectKey())
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range shown {
				if dim, _ := a.Debt(); a.Key == s.Key && dim >= 0 {
					want = append(want, a)
				}
			}
		}
		if len(want) < 8 || want[1].Key.Subject != "u2" || want[2].Key.Subject != "u2" {
			t.Fatalf("as Accounts shows them, %d debtors (%v); want u1 left out and u2 twice", len(want), want)
		}
		for _, limit := range []int{1, 2, 3, 100} {
			var got []ledger.Account
			f := store.DebtFilter{Limit: limit}
			for range 20 {
				page, _, next, more, err := e.AccountsInDebt(ctx, f, keep)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, page...)
				if !more {
					break
				}
				f.After = next
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("pages of %d:\n got %+v\nwant %+v", limit, got, want)
			}
		}
	}
}
