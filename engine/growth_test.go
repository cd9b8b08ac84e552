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
	"github.com/capledger/capledger/store/memstore"
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

// statementCount counts the store's epoch statements.
func statementCount(t *testing.T, st store.Store) int {
	t.Helper()
	snap, err := st.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(snap.Statements)
}

// Busy accounts close an epoch statement every epoch. With
// StatementRetention the retention pass removes those whose epoch ended
// longer ago, so the statements stay flat at the accounts times the
// epochs within it, over many epochs; without it they grow by the
// accounts every epoch. Checkpoints are cut and the journal compacted
// meanwhile, and the audit stays clean either way: a kept chain starts at
// its oldest kept statement, and an account that went quiet (its last
// statement removed) is no discrepancy; its statements list answers the
// kept ones, none.
func TestRetentionKeepsStatementsFlat(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		for _, keep := range []time.Duration{3 * time.Hour, 0} {
			t.Run(fmt.Sprintf("%s/keep=%s", name, keep), func(t *testing.T) {
				ctx := context.Background()
				clk := newClock()
				st := open(t)
				e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
					TombstoneRetention: 2 * time.Hour, RetentionPause: time.Millisecond, StatementRetention: keep})
				defer e.Close()
				const accounts = 4
				subject := func(i int) string { return fmt.Sprintf("tenant-%d", i) }
				for i := range accounts + 1 { // the last one goes quiet after the first epoch
					p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject(i), Route: "chat.generate", Region: "eu"},
						Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EpochLength: time.Hour}.WithDefaults()
					if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
						t.Fatalf("publish: %+v %v", res, err)
					}
				}
				n := 0
				touch := func(i int) {
					t.Helper()
					n++
					id := fmt.Sprintf("r-%d", n)
					for _, cmd := range []ledger.Command{
						{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id, Subject: subject(i),
							Route: "chat.generate", Region: "eu", Units: ledger.Amounts{10}},
						{Kind: ledger.KindRelease, ReservationID: id},
					} {
						if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
							t.Fatalf("%s %s: %+v %v", cmd.Kind, id, res, err)
						}
					}
				}
				const epochs = 30
				var counts []int
				for epoch := range epochs {
					for i := range accounts {
						touch(i)
					}
					if epoch < 2 {
						touch(accounts)
					}
					clk.Advance(time.Hour)
					if err := e.RunRetention(ctx); err != nil {
						t.Fatal(err)
					}
					if _, found, err := e.CutCheckpoint(ctx, clk.Now()); err != nil || len(found) > 0 {
						t.Fatalf("epoch %d: cut: %v %v", epoch, found, err)
					}
					if _, err := e.CompactJournal(ctx); err != nil {
						t.Fatal(err)
					}
					counts = append(counts, statementCount(t, st))
				}
				auditClean(t, e)
				quiet := ledger.AccountKey{Subject: subject(accounts), Route: "chat.generate", Region: "eu", Generation: uint64(accounts + 1)}
				kept, err := st.(store.ConsoleStore).StatementsOf(ctx, store.StatementFilter{Account: quiet, Limit: 10})
				if err != nil {
					t.Fatalf("statements of the quiet account: %v", err)
				}
				s := e.RetentionStats()
				if keep == 0 {
					// Each busy account closes an epoch from the second on,
					// the quiet one the first.
					if last := counts[epochs-1]; last != accounts*(epochs-1)+1 || len(kept) != 1 || s.StatementsRemoved != 0 {
						t.Fatalf("without statement retention: statements per epoch %v, quiet account %v, stats %+v", counts, kept, s)
					}
					return
				}
				// Ended within 3 hours of the pass: each busy account's
				// last two (the epoch that just ended closes at the
				// account's next command).
				for epoch := 3; epoch < epochs; epoch++ {
					if counts[epoch] != accounts*2 {
						t.Fatalf("statements per epoch %v: not flat at %d (epoch %d)", counts, accounts*2, epoch)
					}
				}
				if len(kept) != 0 || s.StatementsRemoved != uint64(accounts*(epochs-1)+1-accounts*2) {
					t.Fatalf("quiet account keeps %v; stats %+v", kept, s)
				}
			})
		}
	}
}

// One pass removes every statement due, however many pages of
// statementPage they take, and counts each.
func TestRemoveStatementsPages(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st := memstore.New()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, StatementRetention: time.Hour})
	defer e.Close()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1_000_000}}, EpochLength: time.Second}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		t.Fatalf("publish: %+v %v", res, err)
	}
	const epochs = 2*statementPage + 10
	for i := range epochs + 1 {
		id := fmt.Sprintf("r-%d", i)
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{1}}); err != nil || res.Err != nil {
			t.Fatalf("reserve %s: %+v %v", id, res, err)
		}
		clk.Advance(time.Second)
	}
	if n := statementCount(t, st); n != epochs {
		t.Fatalf("%d statements, want %d", n, epochs)
	}
	clk.Advance(time.Hour)
	n, err := e.RemoveStatements(ctx)
	if err != nil || n != epochs || statementCount(t, st) != 0 || e.RetentionStats().StatementsRemoved != epochs {
		t.Fatalf("removed %d, %v; %d left; stats %+v", n, err, statementCount(t, st), e.RetentionStats())
	}
	auditClean(t, e)
}
