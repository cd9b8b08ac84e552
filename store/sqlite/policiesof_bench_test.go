package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

// BenchmarkPoliciesOfAPage reads the generations of a page of 1,000
// tenants' accounts among 20,000 policies: in one PoliciesOfGenerations
// (statements of 128), or by a PolicyGet each (what a page cost before).
func BenchmarkPoliciesOfAPage(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	changes := &store.Changes{}
	for i := range 20_000 {
		changes.Policies = append(changes.Policies, ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%06d", i), Route: "chat", Region: "eu"},
			Generation: uint64(i + 1), FairnessWeight: 1, Rollout: ledger.RolloutEnforce,
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: time.Hour}}})
	}
	storetest.Commit(b, s, changes)
	page := make([]uint64, 1000)
	for i := range page {
		page[i] = uint64(5001 + i)
	}
	b.Run("one read", func(b *testing.B) {
		for range b.N {
			if got, err := s.PoliciesOfGenerations(ctx, page); err != nil || len(got) != len(page) {
				b.Fatal(len(got), err)
			}
		}
	})
	b.Run("a read each", func(b *testing.B) {
		for range b.N {
			for _, g := range page {
				if _, err := s.PolicyGet(ctx, g); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
