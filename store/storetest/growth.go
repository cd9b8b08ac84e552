package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// metaOf reads a meta counter in a transaction of its own; found is false
// for an absent row.
func metaOf(t *testing.T, s store.Store, name string) (v int64, found bool) {
	t.Helper()
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		var err error
		v, err = tx.MetaGet(ctx, name)
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, store.ErrNotFound):
			t.Fatalf("meta %s: %v", name, err)
		}
	})
	return v, found
}

// ShardFencesIdle lists the gateways that have a fence row and no shard
// expiring after the cutoff, by id as bytes (an upper-case id first),
// ids holding "/" and "%" whole; a gateway with a shard expiring after it
// is left out, rows that only look alike (the floor, other shard
// counters) are not fence rows, and limit bounds the page.
func testShardFencesIdle(t *testing.T, s store.Store) {
	ctx := context.Background()
	shards := fixtureShards() // gw-a's expires at -30m, gw-b's at +1h
	Commit(t, s, &store.Changes{Policies: fixturePolicies(), Shards: shards, Meta: map[string]int64{
		ledger.MetaShardFence("gw-a"):      4,
		ledger.MetaShardFence("gw-b"):      1,
		ledger.MetaShardFence("gw-c"):      7, // no shard at all
		ledger.MetaShardFence("GW-upper"):  2,
		ledger.MetaShardFence("gw/pod%2"):  3,
		ledger.MetaShardFenceFloor:         9,
		ledger.MetaShardRefusedFor("gw-c"): 1,
		"shard_fencex":                     5,
	}})
	idle := func(before int, limit int) []string {
		t.Helper()
		got, err := s.ShardFencesIdle(ctx, at(time.Duration(before)*time.Minute), limit)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same(t, "idle at 0", idle(0, 10), []string{"GW-upper", "gw-a", "gw-c", "gw/pod%2"})
	same(t, "idle at 0, a page of 2", idle(0, 2), []string{"GW-upper", "gw-a"})
	// gw-a's shard expires after -31m: not idle then.
	same(t, "idle at -31m", idle(-31, 10), []string{"GW-upper", "gw-c", "gw/pod%2"})
	// A shard expiring exactly at the cutoff is expired by it.
	same(t, "idle at -30m", idle(-30, 10), []string{"GW-upper", "gw-a", "gw-c", "gw/pod%2"})
	same(t, "idle at +2h", idle(120, 10), []string{"GW-upper", "gw-a", "gw-b", "gw-c", "gw/pod%2"})
	if _, err := s.ShardFencesIdle(ctx, at(0), 0); err == nil {
		t.Error("limit 0: no error")
	}
}

// Changes.MetaRemoved deletes meta rows (an absent one is no error): the
// transaction reads its own removal, a rollback keeps the row, a commit
// removes it for later transactions (a row cached before included), and a
// removed name can be written again.
func testMetaRemoved(t *testing.T, s store.Store) {
	ctx := context.Background()
	gw := ledger.MetaShardFence("gw-a")
	Commit(t, s, &store.Changes{Meta: map[string]int64{gw: 4, "other": 1}})
	if v, found := metaOf(t, s, gw); !found || v != 4 {
		t.Fatalf("before: %d %v", v, found)
	}
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{MetaRemoved: []string{gw}}); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.MetaGet(ctx, gw); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("removed in the transaction, read back: %v", err)
		}
	}) // rolled back
	if v, found := metaOf(t, s, gw); !found || v != 4 {
		t.Fatalf("after a rollback: %d %v", v, found)
	}
	Commit(t, s, &store.Changes{Meta: map[string]int64{ledger.MetaShardFenceFloor: 4},
		MetaRemoved: []string{gw, "never-set"}})
	if _, found := metaOf(t, s, gw); found {
		t.Fatal("removed row still read after commit")
	}
	if v, found := metaOf(t, s, ledger.MetaShardFenceFloor); !found || v != 4 {
		t.Fatalf("floor: %d %v", v, found)
	}
	if v, found := metaOf(t, s, "other"); !found || v != 1 {
		t.Fatalf("other row: %d %v", v, found)
	}
	if got, err := s.ShardFencesIdle(ctx, at(0), 10); err != nil || len(got) != 0 {
		t.Fatalf("idle fences after the removal: %v %v", got, err)
	}
	// Removed then written again, in one transaction and in the next.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{MetaRemoved: []string{"other"}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Write(ctx, &store.Changes{Meta: map[string]int64{"other": 2}}); err != nil {
			t.Fatal(err)
		}
		if v, err := tx.MetaGet(ctx, "other"); err != nil || v != 2 {
			t.Fatalf("removed and written again: %d %v", v, err)
		}
	})
	Commit(t, s, &store.Changes{Meta: map[string]int64{gw: 5}})
	if v, found := metaOf(t, s, gw); !found || v != 5 {
		t.Fatalf("written again: %d %v", v, found)
	}
}
