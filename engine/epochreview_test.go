package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

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

// Review of the epoch index across generations: random traffic, random
// publishes (new keys, and new generations of existing keys with other
// epoch lengths, one at a time and more than freshPerGeneration at once),
// page sizes down to one (so pages split between entries equal but for
// their generation), passes that stop midway (EpochScans.Update with
// complete=false), passes whose catch-up is cut (no Update) and new
// leaders: after every complete pass no account's epoch that ended by the
// pass's clock is left unclosed unless idle.
func TestReviewEpochPassesRandomized(t *testing.T) {
	lengths := []time.Duration{5 * time.Minute, 10 * time.Minute, time.Hour}
	for name, open := range memstoreAndSQLite {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("%s/seed%d", name, seed), func(t *testing.T) {
				ctx := context.Background()
				st := open(t)
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
				}
				if closes < 50 {
					t.Fatalf("only %d closes: the test does not exercise the worker", closes)
				}
			})
		}
	}
}
