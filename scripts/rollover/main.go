// Command rollover measures what an epoch rollover of many busy accounts
// costs the reserves that arrive during it (issue 15: reserve p99 during
// an epoch rollover within 2x of the same run outside it), at the engine
// over SQLite, with the engine's clock moved instead of waiting for an
// epoch to end.
//
// It fills a new store with -accounts accounts (one reserve each, through
// engine.Core in batches of 500), then runs rounds. Each round:
//
//  1. touch: one reserve on every account, so each is busy in the
//     current epoch (the first round's fill is its touch); with
//     -hold-read, a window with a read transaction open throughout, and
//     one after it ended (the WAL the reader kept is copied then);
//  2. outside: -window of reserves on random accounts from -concurrency
//     callers, the epoch still open;
//  3. the clock jumps to -after past the epoch's end;
//  4. rollover: -window of the same load, while every account's epoch
//     has ended: each reserve on an account not closed yet closes its
//     epoch inline, and the epoch worker (every -epoch-interval) closes
//     the others, paced.
//
// It prints per window the reserves/s, p50/p99/max of engine.Do, CPU per
// reserve (getrusage) and the commands the workers committed, and the
// p99 ratio rollover/outside per round. Each round runs a new engine,
// its epoch worker as -epoch-interval says (a list alternates by round,
// so variants are compared in one run). Compaction, retention and the
// resolver are off; the expiry worker runs (holds last a week: nothing
// expires). The row cache is -cache-rows (default a tenth of the
// accounts: the ratio of the default cache to a million accounts).
//
// Usage: go run ./scripts/rollover -accounts 200000 -dir /tmp/rollover
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

const epoch = time.Hour

// t0 is the fill's time, early in an epoch.
var t0 = time.Date(2026, 7, 19, 14, 0, 5, 0, time.UTC)

func main() {
	accounts := flag.Int("accounts", 200000, "accounts (subjects) to fill and load")
	dir := flag.String("dir", "", "data directory (new)")
	concurrency := flag.Int("concurrency", 64, "callers")
	window := flag.Duration("window", 10*time.Second, "measured time per window")
	rounds := flag.Int("rounds", 2, "outside/rollover pairs")
	after := flag.Duration("after", 2*time.Second, "how far past the epoch's end the clock jumps")
	intervals := flag.String("epoch-interval", "1s", "how often the epoch worker runs; a list (1s,off) alternates by round, off: no workers")
	cacheRows := flag.Int("cache-rows", 0, "row cache (default accounts/10)")
	holdRead := flag.Bool("hold-read", false, "before each round's outside window, a window with a read transaction open throughout (as an audit's snapshot keeps one), then a window after it ended")
	template := flag.String("template", "", "a filled store to start from: when it holds none yet, the fill is written there too, then copied (faster runs on one machine; the fill's reservations then count)")
	flag.StringVar(&profilePrefix, "profile", "", "write a CPU profile of each window to PREFIX-rN-WINDOW.pprof")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "rollover: -dir is required")
		os.Exit(2)
	}
	if *cacheRows <= 0 {
		*cacheRows = max(*accounts/10, 1)
	}
	must(os.MkdirAll(*dir, 0o755))
	ctx := context.Background()
	filled := false
	if *template != "" {
		if _, err := os.Stat(filepath.Join(*template, "capledger.db")); err == nil {
			for _, f := range []string{"capledger.db", "capledger.db-wal"} {
				copyFile(filepath.Join(*template, f), filepath.Join(*dir, f))
			}
			filled = true
		}
	}
	st, err := sqlite.Open(ctx, filepath.Join(*dir, "capledger.db"), sqlite.WithCacheRows(*cacheRows))
	must(err)
	defer st.Close()
	statementsDB, err = sql.Open("sqlite", filepath.Join(*dir, "capledger.db")+"?_pragma=query_only(1)")
	must(err)

	// The clock: real time since start, from t0, plus jumps.
	var offset atomic.Int64
	start := time.Now()
	clock := func() time.Time { return t0.Add(time.Since(start) + time.Duration(offset.Load())) }

	core := engine.NewCore(st)
	p := ledger.Policy{
		Key:         ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1, RefillInterval: time.Hour}},
		HoldTTL:     7 * 24 * time.Hour,
		EpochLength: epoch,
	}.WithDefaults()
	if !filled {
		res, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, clock())
		must(err)
		must(res[0].Err)
	}
	var seq atomic.Uint64
	// The ids of a run from a template must not repeat the fill's.
	idPrefix := "rl-roll-"
	if filled {
		idPrefix = "rl-roll-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-"
	}
	reserve := func(subject int) ledger.Command {
		id := idPrefix + strconv.FormatUint(seq.Add(1), 10)
		return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-" + strconv.Itoa(subject), Route: "chat.generate", Region: "eu", Units: ledger.Amounts{1}}
	}
	touch := func(do func([]ledger.Command) ([]ledger.Result, error)) {
		began := time.Now()
		for from := 0; from < *accounts; from += 500 {
			cmds := make([]ledger.Command, 0, 500)
			for i := from; i < min(from+500, *accounts); i++ {
				cmds = append(cmds, reserve(i))
			}
			results, err := do(cmds)
			must(err)
			for i := range results {
				must(results[i].Err)
			}
		}
		fmt.Printf("touched %d accounts in %.1f s\n", *accounts, time.Since(began).Seconds())
	}
	if !filled {
		touch(func(cmds []ledger.Command) ([]ledger.Result, error) { return core.Commit(ctx, cmds, clock()) })
		if *template != "" {
			// Closed, the store's files are whole; copy them, then reopen.
			must(st.Close())
			must(os.MkdirAll(*template, 0o755))
			for _, f := range []string{"capledger.db", "capledger.db-wal"} {
				copyFile(filepath.Join(*dir, f), filepath.Join(*template, f))
			}
			st, err = sqlite.Open(ctx, filepath.Join(*dir, "capledger.db"), sqlite.WithCacheRows(*cacheRows))
			must(err)
			core = engine.NewCore(st)
		}
	}

	variants := strings.Split(*intervals, ",")
	var e *engine.Engine
	defer func() {
		if e != nil {
			e.Close()
		}
	}()
	fmt.Printf("accounts %d, row cache %d, concurrency %d, window %s\n", *accounts, *cacheRows, *concurrency, *window)
	fmt.Printf("%-6s %-9s %-6s %10s %9s %9s %9s %12s %11s %11s\n", "round", "window", "epochs", "reserves/s", "p50 ms", "p99 ms", "max ms", "cpu µs/res", "worker cmds", "statements")
	for r := 1; r <= *rounds; r++ {
		// A new engine per round, with the round's epoch worker.
		variant := variants[(r-1)%len(variants)]
		opts := engine.Options{Clock: clock, Logger: slog.New(slog.DiscardHandler)}
		if variant == "off" {
			opts.DisableWorkers = true // nothing expires: holds last a week
		} else {
			opts.EpochInterval, err = time.ParseDuration(variant)
			must(err)
		}
		if e != nil {
			must(e.Close())
		}
		e = engine.New(st, opts)
		for !opts.DisableWorkers && !e.IsLeader() {
			time.Sleep(10 * time.Millisecond)
		}
		if r > 1 {
			touch(func(cmds []ledger.Command) ([]ledger.Result, error) { return e.DoBatch(ctx, cmds) })
		}
		if *holdRead {
			// A reader keeps the WAL from being copied into the file
			// while the window writes to it; the window after it shows
			// what copying it costs the commits.
			read, err := statementsDB.BeginTx(ctx, nil)
			must(err)
			var n sql.NullInt64
			must(read.QueryRow("SELECT max(seq) FROM statements").Scan(&n))
			load(ctx, e, *accounts, *concurrency, *window, reserve).print(r, "reading", variant)
			must(read.Rollback())
			load(ctx, e, *accounts, *concurrency, *window, reserve).print(r, "after", variant)
		}
		stop := startProfile(r, "outside")
		out := load(ctx, e, *accounts, *concurrency, *window, reserve)
		stop()
		out.print(r, "outside", variant)
		// Jump to just past the end of the current epoch.
		now := clock()
		end := now.Truncate(epoch).Add(epoch)
		offset.Add(int64(end.Sub(now) + *after))
		stop = startProfile(r, "rollover")
		in := load(ctx, e, *accounts, *concurrency, *window, reserve)
		stop()
		in.print(r, "rollover", variant)
		fmt.Printf("round %d (epochs %s): p99 rollover/outside %.2f, reserves/s %.2f, cpu/reserve %.2f\n", r, variant,
			in.p99.Seconds()/out.p99.Seconds(), in.rate/out.rate, in.cpu/out.cpu)
	}
}

type window struct {
	rate                   float64
	p50, p99, max          time.Duration
	cpu                    float64 // µs per reserve
	workerCmds, statements uint64
}

func (w window) print(round int, what, variant string) {
	fmt.Printf("%-6d %-9s %-6s %10.0f %9.1f %9.1f %9.1f %12.0f %11d %11d\n", round, what, variant, w.rate,
		ms(w.p50), ms(w.p99), ms(w.max), w.cpu, w.workerCmds, w.statements)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// load runs reserves on random accounts from n callers for d.
func load(ctx context.Context, e *engine.Engine, accounts, n int, d time.Duration, reserve func(int) ledger.Command) window {
	var (
		mu   sync.Mutex
		lats []time.Duration
		wg   sync.WaitGroup
	)
	statements0 := countStatements()
	worker0 := e.Stats().WorkerCmds
	cpu0 := cpuTime()
	began := time.Now()
	deadline := began.Add(d)
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), uint64(began.UnixNano())))
			var mine []time.Duration
			for time.Now().Before(deadline) {
				cmd := reserve(rng.IntN(accounts))
				t := time.Now()
				res, err := e.Do(ctx, cmd)
				mine = append(mine, time.Since(t))
				must(err)
				must(res.Err)
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	took := time.Since(began)
	cpu := cpuTime() - cpu0
	slices.Sort(lats)
	at := func(q float64) time.Duration { return lats[min(int(q*float64(len(lats))), len(lats)-1)] }
	return window{
		rate: float64(len(lats)) / took.Seconds(), p50: at(0.5), p99: at(0.99), max: lats[len(lats)-1],
		cpu:        float64(cpu.Microseconds()) / float64(len(lats)),
		workerCmds: e.Stats().WorkerCmds - worker0, statements: countStatements() - statements0,
	}
}

// statementsDB reads the statements' count (the store has no method for
// it): the highest seq, a rowid, so one B-tree descent.
var statementsDB *sql.DB

func countStatements() uint64 {
	var n sql.NullInt64
	must(statementsDB.QueryRow("SELECT max(seq) FROM statements").Scan(&n))
	return uint64(n.Int64)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "rollover:", err)
		os.Exit(1)
	}
}

var profilePrefix string

// startProfile starts a CPU profile of one window when -profile is set and
// returns what stops it.
func startProfile(round int, what string) func() {
	if profilePrefix == "" {
		return func() {}
	}
	f, err := os.Create(fmt.Sprintf("%s-r%d-%s.pprof", profilePrefix, round, what))
	must(err)
	must(pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		must(f.Close())
	}
}

// copyFile copies from to to; a missing from is no error (a closed
// store may have no WAL).
func copyFile(from, to string) {
	in, err := os.Open(from)
	if os.IsNotExist(err) {
		return
	}
	must(err)
	defer in.Close()
	out, err := os.Create(to)
	must(err)
	_, err = io.Copy(out, in)
	must(err)
	must(out.Close())
}
