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

// AccountsInDebt reads accounts in chunks of debtScanRows: with chunks
// smaller than the table, each continuing after the last key of the one
// before, every page from every cursor must still be the debtors after
// it, whether debtors sit at the ends of chunks, across them, or a chunk
// holds none.
func TestAccountsInDebtAcrossChunks(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "debt.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

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
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, &store.Changes{Accounts: accounts}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	keys := func(list []ledger.Account) []ledger.AccountKey {
		out := []ledger.AccountKey{}
		for _, a := range list {
			out = append(out, a.Key)
		}
		return out
	}
	for _, chunk := range []int{1, 2, 3, 4, 5, 7, 40, debtScanChunk} {
		s.debtScanRows = chunk
		// Every page size from the start.
		for _, limit := range []int{1, 2, 3, 4, 100} {
			var got []ledger.AccountKey
			f := store.DebtFilter{Limit: limit}
			for range 20 {
				page, err := s.AccountsInDebt(ctx, f)
				if err != nil {
					t.Fatalf("chunk %d, %+v: %v", chunk, f, err)
				}
				if len(page) > limit {
					t.Fatalf("chunk %d, %+v: %d accounts", chunk, f, len(page))
				}
				got = append(got, keys(page)...)
				if len(page) < limit {
					break
				}
				f.After = page[len(page)-1].Key
			}
			if !slices.Equal(got, debtors) {
				t.Errorf("chunk %d, pages of %d:\n got %v\nwant %v", chunk, limit, got, debtors)
			}
		}
		// Every account's key as the cursor.
		for i, a := range accounts {
			page, err := s.AccountsInDebt(ctx, store.DebtFilter{After: a.Key, Limit: 100})
			if err != nil {
				t.Fatalf("chunk %d, after %s: %v", chunk, a.Key, err)
			}
			want := []ledger.AccountKey{}
			for j := i + 1; j < len(accounts); j++ {
				if owes[j] {
					want = append(want, accounts[j].Key)
				}
			}
			if got := keys(page); !reflect.DeepEqual(got, want) {
				t.Errorf("chunk %d, after %s:\n got %v\nwant %v", chunk, a.Key, got, want)
			}
		}
	}
}
