package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkBatchSubjects measures DoBatch of 100 reserves over SQLite on
// a file holding many accounts: over 10 subjects (always cached) and over
// all of them at random (mostly row cache misses). The account count is
// CAPLEDGER_BENCH_ACCOUNTS (default 20,000) and the row cache bound
// CAPLEDGER_BENCH_CACHE_ROWS (default a tenth of the accounts, the ratio
// of the default cache to a million accounts), so a small file shows the
// miss rate of the 1M case; CAPLEDGER_BENCH_WARM=1 fills the cache first
// (Store.WarmCache), as serve does at its start.
//
//	CAPLEDGER_BENCH_ACCOUNTS=200000 go test -run '^$' -bench BatchSubjects -benchtime 200x ./engine
func BenchmarkBatchSubjects(b *testing.B) {
	accounts := envInt(b, "CAPLEDGER_BENCH_ACCOUNTS", 20000)
	cacheRows := envInt(b, "CAPLEDGER_BENCH_CACHE_ROWS", max(accounts/10, 1))
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "capledger.db")
	// CAPLEDGER_BENCH_DB names a file "capledger bench --subjects N" filled
	// (N = CAPLEDGER_BENCH_ACCOUNTS; subjects bench-0.., route
	// bench.reserve, region global): the benchmark writes to it.
	subject, route, region := "tenant-", "chat.generate", "eu"
	existing := os.Getenv("CAPLEDGER_BENCH_DB")
	if existing != "" {
		path, subject, route, region = existing, "bench-", "bench.reserve", "global"
	}
	st, err := sqlite.Open(ctx, path, sqlite.WithCacheRows(cacheRows))
	if err != nil {
		b.Fatal(err)
	}
	e := New(st, Options{DisableWorkers: true})
	b.Cleanup(func() { e.Close(); st.Close() })
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1, RefillInterval: time.Hour}},
		HoldTTL:    time.Hour,
	}.WithDefaults()
	if existing == "" {
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
			b.Fatalf("publish: %v %v", err, res.Err)
		}
	}
	reserve := func(i int) ledger.Command {
		id := fmt.Sprintf("rl-bench-%012d", benchSeq.Add(1))
		return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: subject + strconv.Itoa(i), Route: route, Region: region, Units: ledger.Amounts{1}}
	}
	batch := func(b *testing.B, subjectOf func(i int) int, size int) {
		cmds := make([]ledger.Command, size)
		for i := range cmds {
			cmds[i] = reserve(subjectOf(i))
		}
		results, err := e.DoBatch(ctx, cmds)
		if err != nil {
			b.Fatal(err)
		}
		for i := range results {
			if results[i].Err != nil {
				b.Fatal(results[i].Err)
			}
		}
	}
	for from := 0; existing == "" && from < accounts; from += 500 {
		batch(b, func(i int) int { return min(from+i, accounts-1) }, 500)
	}
	if os.Getenv("CAPLEDGER_BENCH_WARM") != "" {
		// As serve does at its start: the cache holds the first cacheRows
		// subjects before the measured batches.
		if _, err := st.WarmCache(ctx); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, over := range []int{10, accounts} {
		b.Run(fmt.Sprintf("subjects=%d", over), func(b *testing.B) {
			cpu := cpuTime()
			b.ResetTimer()
			// The label tells a CPU profile's measured runs from the setup:
			// go tool pprof -tagfocus subjects=N.
			pprof.Do(ctx, pprof.Labels("subjects", strconv.Itoa(over)), func(context.Context) {
				for range b.N {
					batch(b, func(int) int { return rng.IntN(over) }, 100)
				}
			})
			b.ReportMetric(float64(b.N*100)/b.Elapsed().Seconds(), "reserves/s")
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N*100), "cpu-µs/reserve")
		})
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
