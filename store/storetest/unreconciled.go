package storetest

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testShardsUnreconciled: ShardsUnreconciled returns the shards of one
// generation that are not reconciled, in id order, page by page after a
// cursor; a shard leaves them when a write reconciles it, and enters
// them when issued.
func testShardsUnreconciled(t *testing.T, s store.Store) {
	ctx := context.Background()
	template := fixtureShards()[1]
	var shards []ledger.Shard
	want := map[uint64][]string{}
	for i := range 12 {
		sh := template
		sh.ID = fmt.Sprintf("su-%02d", i)
		sh.Account.Generation = uint64(7 + i%3) // generations 7, 8, 9
		sh.Reconciled = i%4 == 3
		if sh.Reconciled {
			sh.Reminted = sh.Allocated
		} else {
			want[sh.Account.Generation] = append(want[sh.Account.Generation], sh.ID)
		}
		shards = append(shards, sh)
	}
	Commit(t, s, &store.Changes{Shards: shards})

	pages := func(generation uint64, limit int) []string {
		t.Helper()
		var ids []string
		f := store.UnreconciledShardFilter{Generation: generation, Limit: limit}
		for {
			page, err := s.ShardsUnreconciled(ctx, f)
			if err != nil {
				t.Fatalf("generation %d after %q: %v", generation, f.After, err)
			}
			if len(page) > limit {
				t.Fatalf("generation %d after %q: %d shards, limit %d", generation, f.After, len(page), limit)
			}
			for i := range page {
				if page[i].Reconciled || page[i].Account.Generation != generation {
					t.Fatalf("generation %d: %+v", generation, page[i])
				}
				ids = append(ids, page[i].ID)
			}
			if len(page) < limit {
				return ids
			}
			f.After = page[len(page)-1].ID
		}
	}
	for _, g := range []uint64{7, 8, 9} {
		for _, limit := range []int{1, 2, 100} {
			sameIDs(t, fmt.Sprintf("generation %d, pages of %d", g, limit), pages(g, limit), want[g])
		}
	}
	// A whole shard, as ShardGet reads it.
	if page, err := s.ShardsUnreconciled(ctx, store.UnreconciledShardFilter{Generation: 7, Limit: 1}); err != nil || len(page) != 1 {
		t.Fatalf("generation 7, one: %v, %v", page, err)
	} else if got, err := s.ShardGet(ctx, page[0].ID); err != nil || fmt.Sprint(got) != fmt.Sprint(page[0]) {
		t.Errorf("generation 7: %+v; ShardGet reads %+v (%v)", page[0], got, err)
	}

	// Reconciling one leaves the rest; a newly issued one joins them.
	reconciled := shards[0] // su-00, generation 7
	reconciled.Reconciled, reconciled.Reminted = true, reconciled.Allocated
	issued := template
	issued.ID, issued.Account.Generation = "su-99", 7
	Commit(t, s, &store.Changes{Shards: []ledger.Shard{reconciled, issued}})
	sameIDs(t, "generation 7 after a reconciliation and an issue", pages(7, 2), append(want[7][1:], "su-99"))

	for _, g := range []uint64{1, 10, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
		if page, err := s.ShardsUnreconciled(ctx, store.UnreconciledShardFilter{Generation: g, Limit: 10}); err != nil || len(page) != 0 {
			t.Errorf("generation %d: %v, %v; want none", g, page, err)
		}
	}
	if page, err := s.ShardsUnreconciled(ctx, store.UnreconciledShardFilter{Generation: 8, After: "su-99", Limit: 10}); err != nil || len(page) != 0 {
		t.Errorf("generation 8 after the last: %v, %v; want none", page, err)
	}
	if _, err := s.ShardsUnreconciled(ctx, store.UnreconciledShardFilter{Generation: 7}); err == nil {
		t.Error("limit 0: no error")
	}
}
