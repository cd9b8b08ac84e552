package engine

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// checkEpochIndexed fails t, after a complete pass at now on the SQLite
// file at path, for an entry of the epoch index ahead of its account's
// epoch (epoch_indexed > epoch_start), or one that lags below the range
// the next pass reads for its generation's epoch length (now - length -
// EpochLateness): that account would never be read again.
func checkEpochIndexed(t *testing.T, st store.Store, path string, now time.Time, step int) {
	t.Helper()
	ctx := context.Background()
	policies, err := st.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lengths := map[int64]time.Duration{}
	for _, p := range policies {
		lengths[int64(p.Generation)] = p.EpochLength
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SELECT subject, generation, epoch_indexed, epoch_start FROM accounts WHERE epoch_indexed <> epoch_start")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var subject string
		var generation, indexed, start int64
		if err := rows.Scan(&subject, &generation, &indexed, &start); err != nil {
			t.Fatal(err)
		}
		if indexed > start {
			t.Fatalf("step %d: %s#%d indexed at %d, after its epoch %d", step, subject, generation, indexed, start)
		}
		if lower := now.Add(-lengths[generation] - EpochLateness).UnixNano(); indexed < lower {
			t.Fatalf("step %d at %s: %s#%d lags at %s (epoch %s), below the next pass's range from %s",
				step, now, subject, generation, time.Unix(0, indexed).UTC(), time.Unix(0, start).UTC(), time.Unix(0, lower).UTC())
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// republishTenant publishes at now a new generation of tenant-<i>'s policy
// with epoch length length: the same key under several generations, so
// the index across generations holds entries equal but for their
// generation (the cursor's tiebreak).
func republishTenant(t *testing.T, core *Core, now time.Time, i int, length time.Duration) {
	t.Helper()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "eu"},
		Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1 << 40, RefillUnits: 1, RefillInterval: time.Second}},
		EpochLength: length}.WithDefaults()
	commitAlone(t, core, now, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

// The epoch index across generations: random traffic, random
// publishes (new keys, and new generations of existing keys with other
// epoch lengths, one at a time and more than freshPerGeneration at once),
// page sizes down to one (so pages split between entries equal but for
// their generation), passes that stop midway (EpochScans.Update with
// complete=false), passes whose catch-up is cut (no Update) and new
// leaders: after every complete pass no account's epoch that ended by the
// pass's clock is left unclosed unless idle. On every store, PostgreSQL
// too when CAPLEDGER_TEST_POSTGRES is set (its index is on epoch_start).
func TestEpochPassesRandomized(t *testing.T) {
	lengths := []time.Duration{5 * time.Minute, 10 * time.Minute, time.Hour}
	for name, open := range withPostgres(memstoreAndSQLite) {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("%s/seed%d", name, seed), func(t *testing.T) {
				ctx := context.Background()
				var st store.Store
				var path string
				if name == "sqlite" {
					path = filepath.Join(t.TempDir(), "capledger.db")
					s, err := sqlite.Open(ctx, path)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { s.Close() })
					st = s
				} else {
					st = open(t)
				}
				core := NewCore(st)
				rng := rand.New(rand.NewPCG(seed, 99))
				tenants := 6
				for i := range tenants {
					republishTenant(t, core, t0, i, lengths[rng.IntN(len(lengths))])
				}
				var scans EpochScans
				now := t0
				reserved, closes := 0, 0
				for step := range 250 {
					now = now.Add(time.Duration(rng.IntN(9*60)) * time.Second)
					switch r := rng.IntN(100); {
					case r < 4:
						n := 17 + rng.IntN(4)
						for i := range n {
							republishTenant(t, core, now, tenants+i, lengths[rng.IntN(len(lengths))])
						}
						tenants += n
					case r < 14:
						republishTenant(t, core, now, rng.IntN(tenants), lengths[rng.IntN(len(lengths))])
					case r < 18:
						republishTenant(t, core, now, tenants, lengths[rng.IntN(len(lengths))])
						tenants++
					case r < 20:
						scans = EpochScans{}
					}
					for range rng.IntN(5) {
						reserved++
						reserveFor(t, core, now.Add(-time.Duration(rng.IntN(110))*time.Second), rng.IntN(tenants), fmt.Sprintf("rl-%d", reserved))
					}
					size := 1 + rng.IntN(3)
					p, err := core.EpochPager(ctx, now, size, &scans)
					if err != nil {
						t.Fatal(err)
					}
					switch r := rng.IntN(10); {
					case r == 0: // stops midway
						if page, err := p.Next(ctx); err != nil {
							t.Fatal(err)
						} else if len(page) > 0 {
							if _, err := core.Commit(ctx, page, now); err != nil {
								t.Fatal(err)
							}
						}
						scans.Update(p, false)
						continue
					case r == 1: // the catch-up is cut: no Update
						cmds, _ := pages(t, core, p, now)
						closes += len(cmds)
						continue
					}
					cmds, _ := pages(t, core, p, now)
					closes += len(cmds)
					if err := p.CatchUp(ctx, func() bool { return true }, func(time.Duration) {}); err != nil {
						t.Fatal(err)
					}
					scans.Update(p, true)
					checkNoBusyEpochEnded(t, st, now, step)
					if path != "" {
						checkEpochIndexed(t, st, path, now, step)
					}
				}
				if closes < 50 {
					t.Fatalf("only %d closes: the test does not exercise the worker", closes)
				}
			})
		}
	}
}

// The engine's own epoch worker (runEpochs: the pass, its catch-up, the
// drain) under random traffic, publishes of new generations of existing
// keys, rollbacks (an older generation active again, the rolled-back
// one drained), passes that do not run every step, and a clock that
// sometimes steps back, by up to 2 minutes or by hours: after every pass
// that EpochScans remembers as complete, no account's epoch that ended
// by its clock is left unclosed unless idle.
func TestEngineEpochWorkerRandomized(t *testing.T) {
	lengths := []time.Duration{5 * time.Minute, 10 * time.Minute, time.Hour}
	for name, open := range memstoreAndSQLite {
		for seed := range uint64(10) {
			t.Run(fmt.Sprintf("%s/seed%d", name, seed), func(t *testing.T) {
				ctx := context.Background()
				st := open(t)
				clk := newClock()
				e := leadingEngine(t, st, Options{Clock: clk.Now, EpochInterval: time.Hour, PageSize: 2})
				rng := rand.New(rand.NewPCG(seed, 7))
				do := func(cmd ledger.Command) ledger.Result {
					t.Helper()
					res, err := e.Do(ctx, cmd)
					if err != nil {
						t.Fatal(err)
					}
					return res
				}
				publish := func(i int) {
					t.Helper()
					p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "eu"},
						Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: int64(1<<40 + rng.IntN(1000)), RefillUnits: 1, RefillInterval: time.Second}},
						EpochLength: lengths[rng.IntN(len(lengths))]}.WithDefaults()
					if res := do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); res.Err != nil {
						t.Fatal(res.Err)
					}
				}
				tenants := 5
				for i := range tenants {
					publish(i)
				}
				reserved, rollbacks := 0, 0
				for step := range 200 {
					switch r := rng.IntN(40); {
					case r < 2:
						// A step back within EpochLateness.
						clk.Advance(-time.Duration(rng.IntN(120)) * time.Second)
					case r == 2:
						// NTP correcting the clock by up to 2 hours: commands
						// are stamped long before the last pass's clock.
						clk.Advance(-time.Duration(rng.IntN(2*60*60)) * time.Second)
					default:
						clk.Advance(time.Duration(rng.IntN(9*60)) * time.Second)
					}
					switch r := rng.IntN(100); {
					case r < 3:
						for range 17 {
							publish(tenants)
							tenants++
						}
					case r < 13:
						publish(rng.IntN(tenants))
					case r < 18:
						publish(tenants)
						tenants++
					case r < 24:
						policies, err := st.PolicyList(ctx)
						if err != nil {
							t.Fatal(err)
						}
						p := policies[rng.IntN(len(policies))]
						if res := do(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: p.Generation}); res.Err == nil {
							rollbacks++
						}
					}
					for range rng.IntN(5) {
						reserved++
						cmd := reserveCmd(fmt.Sprintf("rl-%d", reserved), 1)
						cmd.Subject = fmt.Sprintf("tenant-%04d", rng.IntN(tenants))
						do(cmd)
					}
					if rng.IntN(4) == 0 {
						// No pass this step (a long pass still running, a
						// term as follower): the next one comes later.
						continue
					}
					before := e.epochScans.last()
					e.runEpochs(ctx)
					if at := e.epochScans.last(); !at.IsZero() && !at.Equal(before) {
						checkNoBusyEpochEnded(t, st, at, step)
					}
				}
				if rollbacks == 0 {
					t.Fatal("no rollback")
				}
			})
		}
	}
}

// At the bounds: a pass at exactly an epoch's end closes it (StartedBy is
// inclusive), through the index across generations, for the same key
// under two generations with equal epoch starts read a page of one at a
// time (the cursor's generation tiebreak); and a pass with the clock
// stepped back before the last one neither closes early nor loses what
// the next one must read.
func TestEpochPassAtTheBounds(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			core := NewCore(st)
			for i := range 3 {
				republishTenant(t, core, t0, i, 10*time.Minute)
			}
			reserved := 0
			touchAll := func(at time.Time) {
				for i := range 3 {
					reserved++
					reserveFor(t, core, at, i, fmt.Sprintf("rl-%d", reserved))
				}
			}
			// Accounts under the first generations, then under a second
			// generation of each key with the same length (a different
			// burst, so not a replay): all in epoch t0.
			touchAll(t0.Add(time.Minute))
			for i := range 3 {
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "eu"},
					Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1<<40 - 1, RefillUnits: 1, RefillInterval: time.Second}},
					EpochLength: 10 * time.Minute}.WithDefaults()
				commitAlone(t, core, t0.Add(90*time.Second), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			var scans EpochScans
			pass := func(now time.Time, size int) int {
				t.Helper()
				p, err := core.EpochPager(ctx, now, size, &scans)
				if err != nil {
					t.Fatal(err)
				}
				cmds, _ := pages(t, core, p, now)
				if err := p.CatchUp(ctx, func() bool { return true }, func(time.Duration) {}); err != nil {
					t.Fatal(err)
				}
				scans.Update(p, true)
				return len(cmds)
			}
			touchAll(t0.Add(100 * time.Second))
			pass(t0.Add(2*time.Minute), 1)
			for step, at := range []time.Duration{10 * time.Minute, 20 * time.Minute, 30 * time.Minute} {
				touchAll(t0.Add(at - 9*time.Minute))
				now := t0.Add(at)
				if back := now.Add(-3 * time.Minute); step == 1 {
					pass(back, 1) // a clock stepped back: nothing ended by then
				}
				if n := pass(now, 1); n == 0 || (step == 0 && n != 6) {
					t.Fatalf("step %d: a pass at exactly the epoch's end closed nothing", step)
				}
				checkNoBusyEpochEnded(t, st, now, step)
			}
		})
	}
}
