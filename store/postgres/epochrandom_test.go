package postgres_test

import (
	"strings"

	"context"
	"fmt"
	"github.com/jackc/pgx/v5"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

var epochT0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func epochPublish(t *testing.T, core *engine.Core, now time.Time, i int, length time.Duration) {
	t.Helper()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "eu"},
		Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1 << 40, RefillUnits: 1, RefillInterval: time.Second}},
		EpochLength: length}.WithDefaults()
	epochCommit(t, core, now, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

func epochCommit(t *testing.T, core *engine.Core, now time.Time, cmds ...ledger.Command) {
	t.Helper()
	results, err := core.Commit(context.Background(), cmds, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// The epoch pass across generations on PostgreSQL (accounts_by_epoch_across,
// on epoch_start): random traffic and publishes (new generations of
// existing keys too), page sizes down to one, passes stopped midway or
// not remembered, new leaders; after every complete pass no account's
// epoch that ended by its clock is left unclosed unless idle.
func TestEpochPassesRandomizedPostgres(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) { randomEpochPasses(t, seed) })
	}
}

func randomEpochPasses(t *testing.T, seed uint64) {
	ctx := context.Background()
	lengths := []time.Duration{5 * time.Minute, 10 * time.Minute, time.Hour}
	s, _ := openStore(t)
	core := engine.NewCore(s)
	rng := rand.New(rand.NewPCG(seed, 99))
	tenants := 6
	for i := range tenants {
		epochPublish(t, core, epochT0, i, lengths[rng.IntN(len(lengths))])
	}
	var scans engine.EpochScans
	now := epochT0
	reserved, closes := 0, 0
	for step := range 150 {
		now = now.Add(time.Duration(rng.IntN(9*60)) * time.Second)
		switch r := rng.IntN(100); {
		case r < 4:
			n := 17 + rng.IntN(4)
			for i := range n {
				epochPublish(t, core, now, tenants+i, lengths[rng.IntN(len(lengths))])
			}
			tenants += n
		case r < 14:
			epochPublish(t, core, now, rng.IntN(tenants), lengths[rng.IntN(len(lengths))])
		case r < 18:
			epochPublish(t, core, now, tenants, lengths[rng.IntN(len(lengths))])
			tenants++
		case r < 20:
			scans = engine.EpochScans{}
		}
		for range rng.IntN(5) {
			reserved++
			id := fmt.Sprintf("rl-%d", reserved)
			epochCommit(t, core, now.Add(-time.Duration(rng.IntN(110))*time.Second), ledger.Command{Kind: ledger.KindReserve, ReservationID: id,
				RequestDigest: "sha256:" + id, Subject: fmt.Sprintf("tenant-%04d", rng.IntN(tenants)), Route: "chat.generate", Region: "eu", Units: ledger.Amounts{1}})
		}
		p, err := core.EpochPager(ctx, now, 1+rng.IntN(3), &scans)
		if err != nil {
			t.Fatal(err)
		}
		all := func() {
			for {
				page, err := p.Next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					return
				}
				closes += len(page)
				epochCommit(t, core, now, page...)
			}
		}
		switch r := rng.IntN(10); {
		case r == 0:
			if page, err := p.Next(ctx); err != nil {
				t.Fatal(err)
			} else if len(page) > 0 {
				epochCommit(t, core, now, page...)
			}
			scans.Update(p, false)
			continue
		case r == 1:
			all()
			continue
		}
		all()
		if err := p.CatchUp(ctx, func() bool { return true }, func(time.Duration) {}); err != nil {
			t.Fatal(err)
		}
		scans.Update(p, true)
		reviewCheck(t, s, now, step)
	}
	if closes < 30 {
		t.Fatalf("only %d closes", closes)
	}
}

func reviewCheck(t *testing.T, st store.Store, now time.Time, step int) {
	t.Helper()
	ctx := context.Background()
	policies, err := st.PolicyList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range policies {
		f := store.EpochFilter{Generation: p.Generation, StartedBy: now.Add(-p.EpochLength), Limit: 100}
		for {
			page, next, err := st.AccountsByEpoch(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range page {
				if !a.EpochIdle() && !a.EpochStart.After(now.Add(-p.EpochLength)) {
					t.Fatalf("step %d at %s: %s's epoch of %s from %s ended and is not closed", step, now, a.Key, p.EpochLength, a.EpochStart)
				}
			}
			if len(page) < f.Limit {
				break
			}
			f.After = next
		}
	}
}

// Generations become visible in the order of their numbers on PostgreSQL
// with several replicas publishing at once (they serialize on the meta
// row policy_generation): every PolicyListAfter(known) a reader makes
// lists known+1, known+2, ... without a gap, so EpochScans, which
// remembers the newest generation its last pass knew, never misses one
// that commits later with a lower number.
func TestGenerationsCommitInOrderPostgres(t *testing.T) {
	ctx := context.Background()
	first, dsn := openStore(t)
	second, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	var wg sync.WaitGroup
	done := make(chan struct{})
	const each = 60
	for r, st := range []*postgres.Store{first, second} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			core := engine.NewCore(st)
			for i := range each {
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d-%d", r, i%5), Route: "chat.generate", Region: "eu"},
					Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: int64(100 + i), RefillUnits: 1, RefillInterval: time.Second}},
					EpochLength: time.Hour}.WithDefaults()
				for {
					results, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, epochT0)
					if err == nil && results[0].Err == nil {
						break
					}
					// a conflict: publish again
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	var known uint64
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		ps, err := first.PolicyListAfter(ctx, known)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Generation != known+1 {
				t.Fatalf("after %d the list holds %d: generation %d is not visible yet", known, p.Generation, known+1)
			}
			known = p.Generation
		}
	}
	if known != 2*each {
		t.Fatalf("%d generations, want %d", known, 2*each)
	}
}

// The reads across generations seek accounts_by_epoch_across (schema 19)
// at the bound and the cursor, a page at a time: no sequential scan of
// accounts, no sort of every due account.
func TestEpochAcrossQueriesUseTheirIndex(t *testing.T) {
	_, dsn := openStore(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO accounts (subject, route, region, generation, dims, epoch_start, breaches, version)
		SELECT 'tenant' || (i % 500), 'chat.generate', 'eu', 1 + i / 500, 1, (i % 97) * 600000000000, 0, 1 FROM generate_series(1, 50000) AS i`,
		`ANALYZE accounts`,
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, tc := range []struct {
		name, query string
		args        []any
	}{
		{"first page", postgres.AcrossFirstSQL, []any{int64(30 * 600000000000), 8}},
		{"page after a cursor", postgres.AcrossAfterSQL, []any{int64(30 * 600000000000), 8, int64(29 * 600000000000), "tenant1", "chat.generate", "eu", 3}},
	} {
		plan := genericPlan(t, conn, tc.query, tc.args)
		t.Logf("%s:\n%s", tc.name, plan)
		if !strings.Contains(plan, "accounts_by_epoch_across") {
			t.Errorf("%s: does not read accounts_by_epoch_across:\n%s", tc.name, plan)
		}
		if strings.Contains(plan, "Seq Scan on accounts") {
			t.Errorf("%s: scans accounts:\n%s", tc.name, plan)
		}
	}
}
