package sqlite_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// BenchmarkEpochRoll rolls the epoch of 100,000 accounts in random order,
// 64 a transaction (each read, then written under the next epoch), as the
// commands of a rollover do: "busy" rolls leave the epoch index's entry
// behind (schema 14), and EpochIndexCatchUp then moves every entry in
// index order, 256 a chunk; "idle" rolls move it at once (as every roll
// did before schema 14). It reports CPU per roll and per entry caught up
// (the process's getrusage, fsyncs' system time included).
//
//	go test -run '^$' -bench EpochRoll -benchtime 2x ./store/sqlite
func BenchmarkEpochRoll(b *testing.B) {
	const accounts, perTx, chunk = 100000, 64, 256
	for _, busy := range []bool{true, false} {
		name := "idle"
		if busy {
			name = "busy"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			s := openTempB(b)
			epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
			row := func(i int, start time.Time, v ledger.Units) ledger.Account {
				a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%07d", i), Route: "chat", Region: "eu", Generation: 1},
					Dims: 1, EpochStart: start}
				a.Balances[0] = ledger.Balance{Opening: 1000, Available: 1000 - v, Reserved: v}
				a.EpochOpening[0] = ledger.Balance{Opening: 1000, Available: 1000}
				if !busy {
					a.EpochOpening = a.Balances
				}
				return a
			}
			for from := 0; from < accounts; from += 1000 {
				var list []ledger.Account
				for i := from; i < from+1000; i++ {
					list = append(list, row(i, epoch, 1))
				}
				writeTxB(b, s, &store.Changes{Accounts: list})
			}
			rng := rand.New(rand.NewPCG(1, 2))
			var rollCPU, catchCPU time.Duration
			b.ResetTimer()
			for n := range b.N {
				start := epoch.Add(time.Duration(n+1) * time.Hour)
				order := rng.Perm(accounts)
				before := cpuTime()
				for from := 0; from < accounts; from += perTx {
					tx, err := s.Begin(ctx)
					if err != nil {
						b.Fatal(err)
					}
					var list []ledger.Account
					for _, i := range order[from:min(from+perTx, accounts)] {
						if _, err := tx.AccountGet(ctx, row(i, epoch, 0).Key); err != nil {
							b.Fatal(err)
						}
						list = append(list, row(i, start, ledger.Units(n+2)))
					}
					if err := tx.Write(ctx, &store.Changes{Accounts: list}); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(ctx); err != nil {
						b.Fatal(err)
					}
				}
				rollCPU += cpuTime() - before
				before = cpuTime()
				f := store.EpochFilter{Generation: 1, Limit: chunk}
				for {
					next, more, err := s.EpochIndexCatchUp(ctx, f)
					if err != nil {
						b.Fatal(err)
					}
					if !more {
						break
					}
					f.After = next
				}
				catchCPU += cpuTime() - before
			}
			b.ReportMetric(float64(rollCPU.Microseconds())/float64(b.N*accounts), "cpu-µs/roll")
			b.ReportMetric(float64(catchCPU.Microseconds())/float64(b.N*accounts), "cpu-µs/catch-up")
		})
	}
}

func writeTxB(b *testing.B, s store.Store, c *store.Changes) {
	b.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}
