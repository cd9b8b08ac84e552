package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// fenceRows counts the store's shard fence rows (one per gateway that
// has one): every row is idle before the end of time.
func fenceRows(t *testing.T, st store.Store) []string {
	t.Helper()
	gateways, err := st.ShardFencesIdle(context.Background(), time.Unix(0, math.MaxInt64), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return gateways
}

// Gateways named after pods come and go: one new gateway id a cycle,
// each issued shards, reconciled, then never seen again. Retention folds
// the fence rows of gateways whose shards all expired a window ago into
// the store's fence floor, so the rows stay at the gateways active within
// the window, flat over many cycles, instead of one per gateway ever
// seen; a gateway with a shard still live keeps its row; and a gateway id
// that comes back after its row was folded is handed a fence above every
// one it held (and above the folded ones), never one it used.
func TestRetentionKeepsShardFencesFlat(t *testing.T) {
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
			if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
				t.Fatalf("publish: %+v %v", res, err)
			}
			_, key, _ := ed25519.GenerateKey(bytes.NewReader(make([]byte, 64)))
			shards := 0
			issue := func(gateway string, ttl time.Duration) uint64 {
				t.Helper()
				shards++
				id := fmt.Sprintf("sh-%d", shards)
				res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
					Units: ledger.Amounts{10}, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, BootEpoch: 1,
						TTL: ttl, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
				if err != nil || res.Err != nil {
					t.Fatalf("issue %s to %s: %+v %v", id, gateway, res, err)
				}
				if ttl < time.Hour {
					res, err = e.Do(ctx, ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway}})
					if err != nil || res.Err != nil {
						t.Fatalf("reconcile %s: %+v %v", id, res, err)
					}
				}
				return res.Shard.Fence
			}
			issue("gw-live", 1000*time.Hour)
			podMax := map[string]uint64{} // each pod's newest fence
			var first []uint64            // pod-0's fences
			const cycles = 40
			var rows []int
			for cycle := range cycles {
				gateway := fmt.Sprintf("pod-%d", cycle)
				for range 3 {
					f := issue(gateway, time.Minute)
					podMax[gateway] = max(podMax[gateway], f)
					if cycle == 0 {
						first = append(first, f)
					}
				}
				clk.Advance(20 * time.Minute)
				if err := e.RunRetention(ctx); err != nil {
					t.Fatal(err)
				}
				rows = append(rows, len(fenceRows(t, st)))
			}
			// A window of an hour at a gateway every 20 minutes: the
			// last three or four pods, and gw-live.
			for cycle := 10; cycle < cycles; cycle++ {
				if rows[cycle] > 5 || rows[cycle] != rows[9] {
					t.Fatalf("fence rows per cycle %v: not flat (cycle %d has %d)", rows, cycle, rows[cycle])
				}
			}
			left := fenceRows(t, st)
			if left[0] != "gw-live" {
				t.Fatalf("fence rows %v: gw-live's shard is live, its row must stay", left)
			}
			if s := e.RetentionStats(); s.FencesFolded < cycles-5 {
				t.Fatalf("stats %+v: folded %d fence rows", s, s.FencesFolded)
			}
			// pod-0 comes back: its row is long gone.
			var folded uint64 // the highest fence of a folded row
			for gateway, f := range podMax {
				if !slices.Contains(left, gateway) {
					folded = max(folded, f)
				}
			}
			again := issue("pod-0", time.Minute)
			if again <= first[len(first)-1] || again <= folded {
				t.Fatalf("pod-0 came back with fence %d; it held %v, the highest folded fence is %d", again, first, folded)
			}
			auditClean(t, e)
		})
	}
}
