package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// hotBench opens `replicas` stores (separate pools, as separate server
// processes would have) on one fresh schema with a policy whose one
// account never runs out, so every reserve is admitted and all of them
// contend for the same account row. params are DSN parameters, name then
// value.
func hotBench(b *testing.B, replicas int, params ...string) []*postgres.Store {
	b.Helper()
	dsn := withParam(b, schemaDSN(b), "pool_max_conns", "32")
	for i := 0; i+1 < len(params); i += 2 {
		dsn = withParam(b, dsn, params[i], params[i+1])
	}
	var stores []*postgres.Store
	for range replicas {
		s, err := postgres.Open(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	p := seedPolicy()
	p.Dimensions[0].Burst, p.Dimensions[0].MaxReservation = 1<<50, 1<<50
	p.HoldTTL = time.Hour
	res, err := engine.NewCore(stores[0]).Commit(context.Background(), []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: p}}, time.Now())
	if err != nil || res[0].Err != nil {
		b.Fatalf("publish: %v %v", err, res[0].Err)
	}
	// Open the account, so the measured reserves all update one row.
	commitCmds(b, stores[0], time.Now(), reserveCmd("rl-open", 1))
	return stores
}

var benchID atomic.Int64

func nextID() string { return fmt.Sprintf("rl-%d", benchID.Add(1)) }

// runCommitters runs b.N reserves as batches of batch commands, from
// `committers` goroutines spread over the stores, retrying a batch that
// lost a race, and reports reserves per second.
func runCommitters(b *testing.B, stores []*postgres.Store, committers, batch int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed firstError
	b.ResetTimer()
	start := time.Now()
	for c := range committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			core := engine.NewCore(stores[c%len(stores)])
			for {
				first := next.Add(int64(batch)) - int64(batch)
				if first >= int64(b.N) {
					return
				}
				n := min(batch, b.N-int(first))
				cmds := make([]ledger.Command, n)
				for i := range cmds {
					cmds[i] = reserveCmd(nextID(), 1)
				}
				for attempt := 0; ; attempt++ {
					results, err := core.Commit(context.Background(), cmds, time.Now())
					if err == nil {
						for _, r := range results {
							failed.set(r.Err)
						}
						break
					}
					if attempt > 100 || !isConflict(err) {
						failed.set(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.get(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "reserves/s")
	var conflicts uint64
	for _, s := range stores {
		conflicts += s.Stats().Conflicts
	}
	b.ReportMetric(float64(conflicts)/float64(b.N), "conflicts/op")
}

// runGateways calls op b.N times from `gateways` goroutines (op gets the
// goroutine's number, to pick what it calls), fails the benchmark with the
// first error, and reports reserves per second.
func runGateways(b *testing.B, gateways int, op func(gateway int) error) {
	var next atomic.Int64
	var failed firstError
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(g); err != nil {
					failed.set(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.get(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "reserves/s")
}

// firstError keeps the first non-nil error set from any goroutine. (An
// atomic.Value would panic on the second error of another concrete type.)
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func isConflict(err error) bool { return errors.Is(err, store.ErrConflict) }

// BenchmarkHotAccountReserve measures reserves on one hot account:
//
//   - one_tx_per_reserve: every reserve is its own transaction (lock the
//     account row, insert the reservation and its journal entry, update the
//     account, commit), from 16 concurrent clients over two stores, as a
//     server without group commit would run them;
//   - group_commit: the engine's core commits N reserves per transaction,
//     one committer per store (two stores: two replicas);
//   - engine_two_replicas: 64 gateways call two engines (their own
//     batching), the production path.
func BenchmarkHotAccountReserve(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(fmt.Sprintf("one_tx_per_reserve/clients=%d", clients), func(b *testing.B) {
			runCommitters(b, hotBench(b, 2), clients, 1)
		})
	}
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("group_commit/batch=%d/replicas=2", n), func(b *testing.B) {
			runCommitters(b, hotBench(b, 2), 2, n)
		})
	}
	b.Run("engine_two_replicas/gateways=64", func(b *testing.B) {
		stores := hotBench(b, 2)
		engines := []*engine.Engine{
			engine.New(stores[0], engine.Options{DisableWorkers: true}),
			engine.New(stores[1], engine.Options{DisableWorkers: true}),
		}
		defer engines[0].Close()
		defer engines[1].Close()
		runGateways(b, 64, func(g int) error {
			res, err := engines[g%2].Do(context.Background(), reserveCmd(nextID(), 1))
			if err == nil {
				err = res.Err
			}
			return err
		})
	})
}

// BenchmarkWriteTransactionPlans compares, in one run, the store's choice
// of plans in write transactions (generic plans, the lookups by arrays of
// keys planned at each run: plan.go) with plan_cache_mode=force_custom_plan
// in the DSN (every statement planned at each run, as the store did
// before), on one hot account: two committers, groups of 1 (no prefetch)
// and 13 reserves (a hot subject's group commits at c32). Besides
// reserves/s it reports the CPU of the store's PostgreSQL backends per
// reserve (pg-µs/reserve, from /proc: the server must run on this machine).
//
//	go test ./store/postgres -run '^$' -bench WriteTransactionPlans -benchtime 3000x -count 3
func BenchmarkWriteTransactionPlans(b *testing.B) {
	for _, group := range []int{1, 13} {
		for _, mode := range []string{"store", "force_custom_plan"} {
			b.Run(fmt.Sprintf("group=%d/%s", group, mode), func(b *testing.B) {
				app := fmt.Sprintf("capledger_bench_%d", benchID.Add(1))
				params := []string{"pool_max_conns", "4", "application_name", app}
				if mode != "store" {
					params = append(params, "plan_cache_mode", mode)
				}
				stores := hotBench(b, 1, params...)
				before := backendTicks(b, stores[0], app)
				runCommitters(b, stores, 2, group)
				after := backendTicks(b, stores[0], app)
				var ticks int64
				for pid, t := range after {
					ticks += t - before[pid] // a backend begun since counts from 0
				}
				b.ReportMetric(float64(ticks)/float64(clockTicks)*1e6/float64(b.N), "pg-µs/reserve")
			})
		}
	}
}

// clockTicks is the unit of /proc/PID/stat's CPU times (USER_HZ, 100 on
// Linux).
const clockTicks = 100

// backendTicks returns the CPU time, in clock ticks, of every PostgreSQL
// backend whose application_name is app, by process id.
func backendTicks(b *testing.B, s *postgres.Store, app string) map[int]int64 {
	b.Helper()
	rows, err := postgres.PoolOf(s).Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	ticks := map[int]int64{}
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			b.Fatalf("backend %d: %v (is the server on this machine?)", pid, err)
		}
		// utime and stime: fields 14 and 15, the 12th and 13th after
		// the command name in parentheses.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		user, _ := strconv.ParseInt(f[11], 10, 64)
		system, _ := strconv.ParseInt(f[12], 10, 64)
		ticks[int(pid)] = user + system
	}
	return ticks
}
