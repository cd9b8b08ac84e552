package storetest

import (
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// PoliciesOfGenerations returns what PolicyGet returns for each named
// generation that exists, by generation, and nothing for the others (no
// error): generations named twice, in any order, 0 and those above
// math.MaxInt64, none named, none committed yet, an uncommitted policy;
// and as many as fill SQLite's statements of 8, 32 and 128 exactly, and
// one more (9, 33, 129, 300: past a statement of 128), come back whole.
func testPoliciesOfGenerations(t *testing.T, s store.Store) {
	ctx := context.Background()
	asked := []uint64{3, 99, 1, 3, 0, math.MaxUint64, 1 << 63, math.MaxInt64, 2, 1}
	for _, generations := range [][]uint64{nil, {}, asked} {
		if got, err := s.PoliciesOfGenerations(ctx, generations); err != nil || len(got) != 0 {
			t.Errorf("empty store, generations %v: %v, %v; want none", generations, got, err)
		}
	}
	policies := fixturePolicies()
	slices.Reverse(policies) // insertion order is not the answer
	Commit(t, s, &store.Changes{Policies: policies})
	check := func(what string, generations []uint64, want map[uint64]ledger.Policy) {
		t.Helper()
		got, err := s.PoliciesOfGenerations(ctx, generations)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// Named by generation: a whole map of policies would bury the
		// difference.
		var missing, extra, differ []uint64
		for g, p := range want {
			if q, ok := got[g]; !ok {
				missing = append(missing, g)
			} else if !reflect.DeepEqual(p, q) {
				differ = append(differ, g)
			}
		}
		for g := range got {
			if _, ok := want[g]; !ok {
				extra = append(extra, g)
			}
		}
		if len(missing)+len(extra)+len(differ) > 0 {
			slices.Sort(missing)
			slices.Sort(extra)
			slices.Sort(differ)
			t.Errorf("%s: %d policies, want %d; missing %v, not asked or absent %v, differing %v", what, len(got), len(want), missing, extra, differ)
		}
	}
	want := map[uint64]ledger.Policy{}
	for _, g := range []uint64{1, 2, 3} {
		p, err := s.PolicyGet(ctx, g)
		if err != nil {
			t.Fatalf("PolicyGet %d: %v", g, err)
		}
		want[g] = p
	}
	check("3 generations named among others, twice", asked, want)
	for _, generations := range [][]uint64{nil, {}, {99}, {0}, {math.MaxUint64}} {
		check(fmt.Sprintf("generations %v", generations), generations, map[uint64]ledger.Policy{})
	}
	check("generation 2", []uint64{2}, map[uint64]ledger.Policy{2: want[2]})
	// An uncommitted policy is not read.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		uncommitted := fixturePolicies()[2]
		uncommitted.Generation = 99
		if err := tx.Write(ctx, &store.Changes{Policies: []ledger.Policy{uncommitted}}); err != nil {
			t.Fatal(err)
		}
		check("with an uncommitted policy", asked, want)
	})

	// 300 policies of distinct tenants (generations 10-309).
	base := fixturePolicies()[1]
	var many []ledger.Policy
	for i := range 300 {
		p := base
		p.Generation = uint64(10 + i)
		p.Key = ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%03d", i), Route: "chat", Region: "eu"}
		p.Dimensions = slices.Clone(base.Dimensions)
		p.Dimensions[0].Burst = int64(1000 + i)
		many = append(many, p)
	}
	Commit(t, s, &store.Changes{Policies: many})
	for _, n := range []int{8, 9, 32, 33, 128, 129, 300} {
		// The last n, named in reverse, each twice, with as many that do
		// not exist: 2n distinct generations asked.
		var generations []uint64
		wantMany := map[uint64]ledger.Policy{}
		for _, p := range many[len(many)-n:] {
			wantMany[p.Generation] = p
			generations = append([]uint64{p.Generation, p.Generation + 1000, p.Generation}, generations...)
		}
		check(fmt.Sprintf("%d generations with %d absent", n, n), generations, wantMany)
		// Only those that exist, each once: n distinct.
		var present []uint64
		for _, p := range many[len(many)-n:] {
			present = append(present, p.Generation)
		}
		check(fmt.Sprintf("%d generations", n), present, wantMany)
	}
}
