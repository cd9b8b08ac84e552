package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

var epochT0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

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
