package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// A fleet re-issues shards every few minutes: each cycle issues shards to
// a new pod, reconciles them (some usage, the rest reminted, a receipt
// left unknown and resolved in the next cycle), and retention removes the
// settled ones a window after they ended. Shard rows and their meta rows
// stay flat over the cycles instead of growing with every shard issued;
// an unreconciled shard and one still holding unknown work are kept; the
// audit adds the removed shards up exactly; shard list and drain progress
// read the kept shards and still count the unreconciled one; and a
// reconciliation sent again for a removed shard is not found and
// reminds nothing.
func TestRetentionKeepsShardsFlat(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			st := open(t)
			e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
				TombstoneRetention: 2 * time.Hour, RetentionPause: time.Millisecond})
			defer e.Close()
			p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
				Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EmergencyMode: true}.WithDefaults()
			res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			if err != nil || res.Err != nil {
				t.Fatalf("publish: %+v %v", res, err)
			}
			gen := res.Generation
			_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
			do := func(cmd ledger.Command) ledger.Result {
				t.Helper()
				res, err := e.Do(ctx, cmd)
				if err != nil || res.Err != nil {
					t.Fatalf("%s %s: %+v %v", cmd.Kind, cmd.Shard.ShardID, res, err)
				}
				return res
			}
			shards := 0
			issue := func(gateway string, ttl time.Duration) string {
				t.Helper()
				shards++
				id := fmt.Sprintf("sh-%d", shards)
				do(ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, BootEpoch: 1,
						TTL: ttl, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
				return id
			}
			reconcile := func(id, gateway string, receipts ...ledger.ShardReceipt) {
				t.Helper()
				do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, Receipts: receipts}})
			}
			issue("gw-live", 1000*time.Hour) // never reconciled
			stuck := issue("gw-stuck", time.Minute)
			reconcile(stuck, "gw-stuck", ledger.ShardReceipt{ReservationID: "r", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{4}})
			const cycles = 30
			var rows, metas []int
			var first string
			type pendingReceipt struct{ shard, gateway string }
			var late []pendingReceipt
			for cycle := range cycles {
				for _, l := range late { // resolve last cycle's unknown work
					reconcile(l.shard, l.gateway, ledger.ShardReceipt{ReservationID: "u", State: ledger.StateSettled, Actual: ledger.Amounts{2}})
				}
				late = late[:0]
				gateway := fmt.Sprintf("pod-%d", cycle)
				for i := range 3 {
					id := issue(gateway, time.Minute)
					if first == "" {
						first = id
					}
					receipts := []ledger.ShardReceipt{{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}}}
					if i == 0 {
						receipts = append(receipts, ledger.ShardReceipt{ReservationID: "u", State: ledger.StateStarted, Reserved: ledger.Amounts{5}})
						late = append(late, pendingReceipt{id, gateway})
					}
					reconcile(id, gateway, receipts...)
				}
				clk.Advance(20 * time.Minute)
				if err := e.RunRetention(ctx); err != nil {
					t.Fatal(err)
				}
				list, err := e.Shards(ctx)
				if err != nil {
					t.Fatal(err)
				}
				names, err := st.MetaNames(ctx, "shard_", 1<<20)
				if err != nil {
					t.Fatal(err)
				}
				rows, metas = append(rows, len(list)), append(metas, len(names))
			}
			t.Logf("shard rows per cycle %v, meta rows %v", rows, metas)
			// A window of an hour at three shards every 20 minutes: the
			// last few cycles' shards, gw-live's and gw-stuck's.
			for cycle := 10; cycle < cycles; cycle++ {
				if rows[cycle] > 14 || rows[cycle] != rows[9] || metas[cycle] != metas[9] {
					t.Fatalf("shard rows per cycle %v, meta rows %v: not flat (cycle %d)", rows, metas, cycle)
				}
			}
			for _, id := range []string{"sh-1", stuck} {
				if _, err := e.Shard(ctx, id); err != nil {
					t.Fatalf("kept shard %s: %v", id, err)
				}
			}
			if _, err := e.Shard(ctx, first); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("first pod's shard %s: %v, want it removed", first, err)
			}
			if s := e.RetentionStats(); s.ShardsRemoved < 3*(cycles-4) {
				t.Fatalf("stats %+v: removed %d shards", s, s.ShardsRemoved)
			}
			drains, err := e.DrainProgress(ctx, []uint64{gen})
			if err != nil {
				t.Fatal(err)
			}
			if d := drains[0]; d.UnreconciledShards != 1 || d.ShardUnits[0] != 10 {
				t.Fatalf("drain progress %+v: want gw-live's shard alone unreconciled", d)
			}
			auditClean(t, e)
			before, err := st.AccountGet(ctx, ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: gen})
			if err != nil {
				t.Fatal(err)
			}
			res, err = e.Do(ctx, ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: first, GatewayID: "pod-0",
				Receipts: []ledger.ShardReceipt{{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}}}}})
			if err != nil || !errors.Is(res.Err, ledger.ErrShardNotFound) {
				t.Fatalf("reconcile of a removed shard: %+v %v", res, err)
			}
			after, err := st.AccountGet(ctx, before.Key)
			if err != nil {
				t.Fatal(err)
			}
			if after.Balances[0].Available != before.Balances[0].Available {
				t.Fatalf("a reconciliation of a removed shard changed available: %d, was %d", after.Balances[0].Available, before.Balances[0].Available)
			}
		})
	}
}

// API.md: a shard id is free again once retention removed its settled
// shard; IssueShard under it carves a new shard, and answers under the id
// are about the new one. The removed shard's remint moves stay (the audit
// checks them against the retained shard totals), so the new shard's
// remint must not take one of their receipts: the reconciliation of a
// shard issued under a removed id failed as a store conflict on the
// receipt "shard-remint:<id>:1" on every retry, its capacity retired for
// good. Each shard under the id, of another gateway, of the same one and
// of another account, is reconciled, reminted and removed in turn, and
// the audit adds every remint move to the right shard or to the retained
// totals.
func TestShardIDTakenAgainAfterRetentionReconciles(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			st := open(t)
			e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
				TombstoneRetention: 2 * time.Hour, RetentionPause: time.Millisecond})
			defer e.Close()
			for _, subject := range []string{"tenant-7", "tenant-8"} {
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat.generate", Region: "eu"},
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EmergencyMode: true}.WithDefaults()
				if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
					t.Fatalf("publish: %+v %v", res, err)
				}
			}
			_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
			for i, owner := range []struct{ subject, gateway string }{
				{"tenant-7", "gw-a"}, {"tenant-7", "gw-b"}, {"tenant-7", "gw-b"}, {"tenant-8", "gw-a"},
			} {
				res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindShardIssue, Subject: owner.subject, Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: "sh-x", GatewayID: owner.gateway, BootEpoch: 1,
						TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
				if err != nil || res.Err != nil || res.Shard == nil || res.Shard.GatewayID != owner.gateway || res.Replayed {
					t.Fatalf("shard %d under sh-x: issue to %s: %+v %v", i+1, owner.gateway, res, err)
				}
				// Two submissions, so two remints: 5 then 3 of 10 unused.
				for _, receipts := range [][]ledger.ShardReceipt{
					{{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}},
						{ReservationID: "u", State: ledger.StateStarted, Reserved: ledger.Amounts{4}}},
					{{ReservationID: "u", State: ledger.StateSettled, Actual: ledger.Amounts{1}}},
				} {
					res, err = e.Do(ctx, ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: "sh-x", GatewayID: owner.gateway, Receipts: receipts}})
					if err != nil || res.Err != nil || res.Move == nil {
						t.Fatalf("shard %d under sh-x: reconcile: %+v %v", i+1, res, err)
					}
				}
				if got, err := e.Shard(ctx, "sh-x"); err != nil || got.GatewayID != owner.gateway || got.Reminted[0] != 6 {
					t.Fatalf("shard %d under sh-x: %+v %v; want %s's, 6 reminted", i+1, got, err, owner.gateway)
				}
				auditClean(t, e)
				clk.Advance(2 * time.Hour)
				if err := e.RunRetention(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := e.Shard(ctx, "sh-x"); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("shard %d under sh-x after retention: %v, want it removed", i+1, err)
				}
				auditClean(t, e)
			}
		})
	}
}

// ShardsRemove reads the candidates a page at a time after a cursor: a
// full page of shards it keeps (work left unknown) is followed by the
// next page, and the settled shards behind it are removed in the same
// call.
func TestShardsRemovePagesPastAFullPageKept(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e, clk, key, do := newShardRemoveRig(t, open(t))
			for i := range 7 {
				id := fmt.Sprintf("sh-%d", i)
				do(ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", BootEpoch: 1,
						TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
				clk.Advance(time.Second)
			}
			clk.Advance(time.Minute)
			for i := range 7 {
				receipt := ledger.ShardReceipt{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}}
				if i < 2 { // the first page (of 2): kept
					receipt = ledger.ShardReceipt{ReservationID: "u", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{4}}
				}
				do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: fmt.Sprintf("sh-%d", i), GatewayID: "gw-1",
					Receipts: []ledger.ShardReceipt{receipt}}})
			}
			clk.Advance(2 * time.Hour)
			n, err := e.core.ShardsRemove(ctx, clk.Now(), 2, nil)
			if err != nil || n != 5 {
				t.Fatalf("ShardsRemove with pages of 2: removed %d, %v; want the 5 settled shards behind a full page kept", n, err)
			}
			list, err := e.Shards(ctx)
			if err != nil || len(list) != 2 {
				t.Fatalf("kept shards %d, %v: want sh-0 and sh-1", len(list), err)
			}
		})
	}
}

// A settled shard is removed with up to shardUnknownNames receipt
// counters (receipts it once left unknown, resolved since), so its
// removal is one bounded transaction; one with a counter more is kept.
func TestShardsRemoveKeepsAShardWithMoreThanTheReceiptCounterBound(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e, clk, key, do := newShardRemoveRig(t, open(t))
			counters := map[string]int{"sh-at-bound": shardUnknownNames, "sh-past-bound": shardUnknownNames + 1}
			for id := range counters {
				do(ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", BootEpoch: 1,
						TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
			}
			clk.Advance(2 * time.Minute)
			for id, n := range counters {
				// n receipts left unknown holding nothing (one counter
				// each), then resolved: n counters, the shard settled.
				unknown := []ledger.ShardReceipt{{ReservationID: "s", State: ledger.StateSettled, Actual: ledger.Amounts{3}}}
				var resolved []ledger.ShardReceipt
				for i := range n {
					rid := fmt.Sprintf("u-%d", i)
					unknown = append(unknown, ledger.ShardReceipt{ReservationID: rid, State: ledger.StateUsageUnknown})
					resolved = append(resolved, ledger.ShardReceipt{ReservationID: rid, State: ledger.StateSettled, Actual: ledger.Amounts{0}})
				}
				do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", Receipts: unknown}})
				do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: "gw-1", Receipts: resolved}})
				names, err := e.core.store.MetaNames(ctx, ledger.ShardUnknownPrefix(id), 2*shardUnknownNames)
				if err != nil || len(names) != n {
					t.Fatalf("shard %s: %d receipt counters, %v; want %d", id, len(names), err, n)
				}
			}
			clk.Advance(2 * time.Hour)
			n, err := e.core.ShardsRemove(ctx, clk.Now(), shardRemovePage, nil)
			if err != nil || n != 1 {
				t.Fatalf("ShardsRemove: removed %d, %v; want only sh-at-bound", n, err)
			}
			list, err := e.Shards(ctx)
			if err != nil || len(list) != 1 || list[0].ID != "sh-past-bound" {
				t.Fatalf("kept shards %+v, %v: want sh-past-bound only", list, err)
			}
		})
	}
}

// newShardRemoveRig starts an engine on st (workers off, retention an
// hour, tombstones two hours) with an emergency-mode policy for
// tenant-7/chat.generate/eu published, and returns it, its clock, the
// key shards are signed with and do, which fails the test unless a
// command is applied without error.
func newShardRemoveRig(t *testing.T, st store.Store) (*Engine, *clock, ed25519.PrivateKey, func(ledger.Command)) {
	t.Helper()
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, TombstoneRetention: 2 * time.Hour})
	t.Cleanup(func() { e.Close() })
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EmergencyMode: true}.WithDefaults()
	_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
	do := func(cmd ledger.Command) {
		t.Helper()
		res, err := e.Do(context.Background(), cmd)
		if err != nil || res.Err != nil {
			t.Fatalf("%s: %+v %v", cmd.Kind, res.Err, err)
		}
	}
	do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	return e, clk, key, do
}
