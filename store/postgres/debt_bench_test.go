package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// backendCPU returns the CPU time (user + system) the PostgreSQL backend
// with process id pid has used, from /proc (the server runs on this
// machine in the benchmarks).
func backendCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("backend CPU: %v (needs the server on this machine)", err)
	}
	// Fields after the command name, which ends with the last ')':
	// state is field 3, utime and stime fields 14 and 15, in clock ticks
	// (100 a second on Linux).
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDebtLifecycles runs reserve, start and settle lifecycles
// through the engine's core on one PostgreSQL connection, in batches of
// 100 (one per account, 100 accounts), and reports the CPU per lifecycle
// of the store's backend (server-cpu-µs/lifecycle) and of this process
// (client-cpu-µs/lifecycle). With debt=false each settle uses what it
// reserved; with debt=true each settles one unit above it, so every
// lifecycle draws debt at its settle and repays it at the next reserve
// of its account (the refill of the hour that passes between rounds):
// the most often an account's debt can start and end. Schema 12's
// triggers on account_terms run exactly for those writes.
func BenchmarkDebtLifecycles(b *testing.B) {
	const accounts = 100
	for _, debt := range []bool{false, true} {
		b.Run(fmt.Sprintf("debt=%v", debt), func(b *testing.B) {
			ctx := context.Background()
			dsn := withParam(b, schemaDSN(b), "pool_max_conns", "1")
			s, err := postgres.Open(ctx, dsn)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var pid int
			if err := postgres.PoolOf(s).QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				b.Fatal(err)
			}
			core := engine.NewCore(s)
			p := ledger.Policy{
				Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
				Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 1000, RefillInterval: time.Minute, MaxOverdraft: 500}},
				HoldTTL:    time.Hour,
			}.WithDefaults()
			now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
			commit := func(cmds []ledger.Command) {
				res, err := core.Commit(ctx, cmds, now)
				if err != nil {
					b.Fatal(err)
				}
				for i := range res {
					if res[i].Err != nil {
						b.Fatalf("%v: %v", cmds[i].Kind, res[i].Err)
					}
				}
			}
			commit([]ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}})
			round := 0
			lifecycles := func() {
				round++
				reserves, starts, settles := make([]ledger.Command, accounts), make([]ledger.Command, accounts), make([]ledger.Command, accounts)
				// The whole burst, so a settle above it draws debt (it
				// takes from available first).
				actual := int64(1000)
				if debt {
					actual = 1001
				}
				for i := range accounts {
					id := fmt.Sprintf("rl-%d-%d", round, i)
					reserves[i] = ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
						Subject: fmt.Sprintf("tenant-%03d", i), Route: "chat.generate", Region: "eu", Units: ledger.Amounts{1000}}
					starts[i] = ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}
					settles[i] = ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{actual}}
				}
				commit(reserves)
				now = now.Add(time.Second)
				commit(starts)
				now = now.Add(time.Second)
				commit(settles)
				now = now.Add(time.Hour)
			}
			lifecycles() // the accounts exist from here on
			owing, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 2 * accounts})
			if want := map[bool]int{false: 0, true: accounts}[debt]; err != nil || len(owing) != want {
				b.Fatalf("after a round: %d accounts in debt, %v; want %d", len(owing), err, want)
			}
			server, client := backendCPU(b, pid), processCPU()
			b.ResetTimer()
			rounds := (b.N + accounts - 1) / accounts
			for range rounds {
				lifecycles()
			}
			b.StopTimer()
			n := float64(rounds * accounts)
			b.ReportMetric(float64((backendCPU(b, pid)-server).Microseconds())/n, "server-cpu-µs/lifecycle")
			b.ReportMetric(float64((processCPU()-client).Microseconds())/n, "client-cpu-µs/lifecycle")
			b.ReportMetric(0, "ns/op")
		})
	}
}
