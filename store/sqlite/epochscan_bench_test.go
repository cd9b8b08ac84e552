package sqlite_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// BenchmarkAccountsByEpochOfAnEmptyGeneration is the epoch worker's read
// of one generation that holds no due account, what a pass does for
// every generation (with a policy per tenant, for every tenant), and the
// catch-up's read of the same range.
func BenchmarkAccountsByEpochOfAnEmptyGeneration(b *testing.B) {
	s := openTempB(b)
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	b.ResetTimer()
	for i := range b.N {
		f := store.EpochFilter{Generation: uint64(i%100_000 + 1), StartedBy: now, Limit: 512}
		if _, _, err := s.AccountsByEpoch(ctx, f); err != nil {
			b.Fatal(err)
		}
		if _, _, err := s.EpochIndexCatchUp(ctx, f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAccountsByEpochAcrossGenerations is what an epoch pass reads
// instead, once per epoch length (schema 19): the read of the index
// across generations over the epoch starts since the last pass, and the
// catch-up's read of the same range, here with 100,000 accounts of as
// many generations, idle in an earlier epoch, none in the range.
//
//	go test -run '^$' -bench AccountsByEpochAcrossGenerations -benchtime 20000x ./store/sqlite
func BenchmarkAccountsByEpochAcrossGenerations(b *testing.B) {
	s := openTempB(b)
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for from := 0; from < 100_000; from += 1000 {
		var list []ledger.Account
		for i := from; i < from+1000; i++ {
			a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%06d", i), Route: "chat", Region: "eu", Generation: uint64(i + 1)},
				Dims: 1, EpochStart: now.Add(-48 * time.Hour)}
			a.Balances[0] = ledger.Balance{Opening: 1000, Available: 1000}
			a.EpochOpening = a.Balances
			list = append(list, a)
		}
		writeTxB(b, s, &store.Changes{Accounts: list})
	}
	b.ResetTimer()
	for range b.N {
		f := store.EpochFilter{AllGenerations: true, StartedBy: now.Add(-time.Hour),
			After: store.EpochCursor{EpochStart: now.Add(-time.Hour - 3*time.Minute)}, Limit: 256}
		if page, _, err := s.AccountsByEpoch(ctx, f); err != nil || len(page) != 0 {
			b.Fatal(len(page), err)
		}
		if _, _, err := s.EpochIndexCatchUp(ctx, f); err != nil {
			b.Fatal(err)
		}
	}
}
