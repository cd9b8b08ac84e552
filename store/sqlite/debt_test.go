package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A file of schema version 12, whose accounts' debt only the encoded
// balances tell, migrates to the debtor index with every account that
// owes in it: every page from every cursor is still the debtors after it,
// and the index then follows the writes of the new binary.
func TestAccountsInDebtOfAnEarlierSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v12.db")
	db := dbAtSchema(t, path, 12)

	var (
		accounts []ledger.Account
		debtors  []ledger.AccountKey
	)
	owes := map[int]bool{0: true, 1: true, 2: true, 5: true, 11: true, 12: true, 23: true, 24: true, 39: true}
	for i := range 40 {
		// Four generations per subject; subjects s00 to s09.
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("s%02d", i/4), Route: "chat", Region: "eu",
			Generation: uint64(i%4 + 1)}, Dims: 2, Version: uint64(i)}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 100}
		a.Balances[1] = ledger.Balance{Opening: 10, Minted: 4, OverdraftIssued: 4, Spent: 14, OverdraftRepaid: 4}
		if owes[i] {
			a.Balances[1] = ledger.Balance{Opening: 10, Minted: 1, OverdraftIssued: 4, Spent: 14, OverdraftRepaid: 1}
			debtors = append(debtors, a.Key)
		}
		accounts = append(accounts, a)
		insertAccountAt(t, db, &a, "")
	}
	s := openUpgraded(t, db, path)

	check := func(when string) {
		// Every page size from the start.
		for _, limit := range []int{1, 2, 3, 4, 100} {
			var got []ledger.AccountKey
			f := store.DebtFilter{Limit: limit}
			for range 20 {
				page, err := s.AccountsInDebt(ctx, f)
				if err != nil {
					t.Fatalf("%s, %+v: %v", when, f, err)
				}
				if len(page) > limit {
					t.Fatalf("%s, %+v: %d accounts", when, f, len(page))
				}
				got = append(got, keysOf(page)...)
				if len(page) < limit {
					break
				}
				f.After = page[len(page)-1].Key
			}
			if !slices.Equal(got, debtors) {
				t.Errorf("%s, pages of %d:\n got %v\nwant %v", when, limit, got, debtors)
			}
		}
		// Every account's key as the cursor.
		for i, a := range accounts {
			page, err := s.AccountsInDebt(ctx, store.DebtFilter{After: a.Key, Limit: 100})
			if err != nil {
				t.Fatalf("%s, after %s: %v", when, a.Key, err)
			}
			want := []ledger.AccountKey{}
			for j := i + 1; j < len(accounts); j++ {
				if owes[j] {
					want = append(want, accounts[j].Key)
				}
			}
			if got := keysOf(page); !reflect.DeepEqual(got, want) {
				t.Errorf("%s, after %s:\n got %v\nwant %v", when, a.Key, got, want)
			}
		}
	}
	check("migrated")

	// The new binary's writes keep the index: one account repays, one
	// starts owing.
	delete(owes, 5)
	accounts[5].Balances[1] = ledger.Balance{Opening: 10, Minted: 4, OverdraftIssued: 4, Spent: 14, OverdraftRepaid: 4}
	owes[30] = true
	accounts[30].Balances[1] = ledger.Balance{Opening: 10, Minted: 1, OverdraftIssued: 4, Spent: 14, OverdraftRepaid: 1}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{accounts[5], accounts[30]}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	debtors = debtors[:0]
	for i, a := range accounts {
		if owes[i] {
			debtors = append(debtors, a.Key)
		}
	}
	check("written")
}
