package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

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
					results, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC))
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
