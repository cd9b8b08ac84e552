package sqlite_test

import (
	"context"
	"testing"
	"time"

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
