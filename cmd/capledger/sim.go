package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"time"

	"github.com/capledger/capledger/sim"
)

// maxSimWorkers bounds --workers: a worker is a goroutine running
// interleavings; more than the cores only share them.
const maxSimWorkers = 1 << 12

// maxSimLastEvents bounds --last: each worker keeps a ring of that many
// events for its reports (--last 1e15 panicked making it).
const maxSimLastEvents = 1 << 16

// maxSimNodes bounds --gateways and --executors, and maxSimTenants
// --tenants and --requests (per gateway): 64 gateways and executors with
// 256 tenants and 256 requests each (16,384 requests) run an interleaving
// in about 5 s of CPU and 400 MB (seed 1), enough to put many tenants in each executor's queue
// (where the old weight-class fairness gate went wrong), while
// --requests 1e9 or --gateways 1e8 ran out of memory in the first one.
const (
	maxSimNodes   = 64
	maxSimTenants = 256
)

// maxSimTime bounds the simulated --arrival-window, --heal-at and
// --deadline: the workers' ticks make an interleaving's cost grow with
// its simulated time (10000h took 37 s for one; the defaults are minutes).
const maxSimTime = 24 * time.Hour

func init() {
	register(&command{name: "sim", summary: "run the deterministic simulator and its release gates (exit 6 on a violation)", help: simHelp, run: runSim})
}

const simHelp = `Usage: capledger sim [--interleavings N] [--seed S] [--workers K] [flags]

Sim runs the deterministic simulator: N interleavings, each one seeded run
of several gateways, executors and the ledger's workers against the real
ledger and engine code over an in-memory store, through a simulated network
that drops, duplicates, delays and reorders messages and partitions nodes,
with ledger and executor crashes, failed and unacknowledged commits and the
seed's fault list (see docs/SIMULATOR.md). Every step is checked; a
violation prints the seed, the configuration, the last events and the
command that replays it exactly. The run ends with a table of the release
gates, fault-site counts, UNKNOWN convergence and fairness.

Interleaving i runs seed S+i. Runs of 10,000 interleavings or more also
require every fault site to have fired at least 1,000 times (every site
--only switched on; lost_record_ack not with --record-share 0).

Flags:
  --interleavings N   seeded runs to do (default 10000)
  --seed S            first seed (default: from the clock, printed)
  --workers K         parallel workers (default: all cores; 1 to 4096)
  --trace             print every event (use with --interleavings 1)
  --last N            events shown in a violation report (default 40; 0 to
                      65536)
  --reports N         full violation reports printed (default 5; the rest
                      one line each)
  --min-fires N       site gate: fires every site needs (default 1000 for
                      runs of 10,000 interleavings or more, else 0)
  --only LIST         enable only these comma-separated fault sites
  --gateways N, --executors N, --tenants N, --requests N
                      most gateways, executors, tenants, requests per gateway
                      an interleaving draws (defaults 4, 3, 3, 6; at most
                      64, 64, 256, 256; gateways at least 2, the rest at
                      least 1)
  --arrival-window D, --heal-at D, --deadline D
                      requests arrive within D; faults heal at D; everything
                      must converge within D after healing (defaults 2m, 3m,
                      30m, simulated; at most 24h each)
  --audit-every N     full ledger.Audit after every N-th commit, besides
                      after every restart and at the end (default 0: only
                      there; the incremental checks run after every commit)
  --sqlite-share F    share of interleavings (0..1, drawn per seed) whose
                      ledger runs on the real SQLite store in a temporary
                      directory instead of the in-memory store (default 0)
  --pipelined-share F share of interleavings (0..1, drawn per seed) whose
                      ledger answers a batch only after a simulated fsync,
                      committing the next ones meanwhile; a crash before
                      it may lose every commit since the last (default 0)
  --record-share F    share of requests (0..1, drawn per request) that
                      reserve nothing and record their usage after the
                      work (RecordUsage), retried under the same id
                      (default 0.2; 0 runs the interleavings of before)

Examples:
  capledger sim --interleavings 1000000           # the release gate
  capledger sim --seed 42 --interleavings 1 --trace   # replay one seed

CAPLEDGER_MUTANT=NAME selects a deliberately broken ledger or store in a
binary built with -tags capledger_mutants (docs/SIMULATOR.md); a name it
does not know (or any name, in a binary built without the tag) is a usage
error that lists the known names.

Exit codes: 0 every gate passed, 1 usage error (an unknown CAPLEDGER_MUTANT
too), 6 a gate failed, 130 interrupted (no verdict, see the RESULT line).
`

func runSim(ctx context.Context, e *env, args []string) error {
	fs := newFlags("sim")
	def := sim.DefaultConfig()
	interleavings := fs.Int64("interleavings", 10000, "")
	seedFlag := fs.String("seed", "", "")
	workers := fs.Int("workers", runtime.GOMAXPROCS(0), "")
	trace := fs.Bool("trace", false, "")
	last := fs.Int("last", def.LastEvents, "")
	reports := fs.Int("reports", 5, "")
	minFires := fs.Int64("min-fires", -1, "")
	only := fs.String("only", "", "")
	gateways := fs.Int("gateways", def.Gateways, "")
	executors := fs.Int("executors", def.Executors, "")
	tenants := fs.Int("tenants", def.Tenants, "")
	requests := fs.Int("requests", def.Requests, "")
	arrival := fs.Duration("arrival-window", def.ArrivalWindow, "")
	healAt := fs.Duration("heal-at", def.HealAt, "")
	deadline := fs.Duration("deadline", def.Deadline, "")
	auditEvery := fs.Int("audit-every", def.AuditEvery, "")
	sqliteShare := fs.Float64("sqlite-share", def.SQLiteShare, "")
	pipelinedShare := fs.Float64("pipelined-share", def.PipelinedShare, "")
	recordShare := fs.Float64("record-share", def.RecordShare, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	// -1, the default, picks the site gate by the run's size (sim.Options);
	// given, --min-fires is a count.
	minFiresSet := false
	fs.Visit(func(f *flag.Flag) { minFiresSet = minFiresSet || f.Name == "min-fires" })
	if err := sim.CheckMutant(e.getenv("CAPLEDGER_MUTANT")); err != nil {
		return usagef("%v", err)
	}
	if err := firstError(
		intIn("interleavings", *interleavings, 1, math.MaxInt64),
		intIn("workers", *workers, 1, maxSimWorkers),
		intIn("reports", *reports, 0, math.MaxInt),
		intIn("audit-every", *auditEvery, 0, math.MaxInt),
		intIn("last", *last, 0, maxSimLastEvents),
		intIn("gateways", *gateways, 2, maxSimNodes),
		intIn("executors", *executors, 1, maxSimNodes),
		intIn("tenants", *tenants, 1, maxSimTenants),
		intIn("requests", *requests, 1, maxSimTenants),
		durationIn("arrival-window", *arrival, time.Nanosecond, maxSimTime),
		durationIn("heal-at", *healAt, 0, maxSimTime),
		durationIn("deadline", *deadline, time.Nanosecond, maxSimTime),
	); err != nil {
		return err
	}
	if minFiresSet {
		if err := intIn("min-fires", *minFires, 0, math.MaxInt64); err != nil {
			return err
		}
	}
	seed := uint64(time.Now().UnixNano())
	if *seedFlag != "" {
		parsed, err := strconv.ParseUint(*seedFlag, 10, 64)
		if err != nil {
			return usagef("--seed %q: not an unsigned integer", *seedFlag)
		}
		seed = parsed
	}
	cfg := sim.Config{
		Gateways: *gateways, Executors: *executors, Tenants: *tenants, Requests: *requests,
		ArrivalWindow: *arrival, HealAt: *healAt, Deadline: *deadline,
		AuditEvery: *auditEvery, LastEvents: *last, SQLiteShare: *sqliteShare, PipelinedShare: *pipelinedShare,
		RecordShare: *recordShare,
	}
	if *only != "" {
		sites, err := sim.ParseSites(*only)
		if err != nil {
			return usagef("--only: %v", err)
		}
		if len(sites) == 0 {
			// An empty Only is every site: the opposite of the flag.
			return usagef("--only %q: names no fault site", *only)
		}
		cfg.Only = sites
	}
	if err := cfg.Validate(); err != nil {
		return usagef("%v", err)
	}
	if *trace {
		if *interleavings != 1 {
			return usagef("--trace prints every event: use it with --interleavings 1")
		}
		cfg.Trace = e.stdout
	}
	if *seedFlag == "" {
		fmt.Fprintf(e.stderr, "capledger sim: seed %d (replay any interleaving with --seed <its seed> --interleavings 1)\n", seed)
	}
	opts := sim.Options{Seed: seed, Interleavings: *interleavings, Workers: *workers, MinFires: *minFires,
		Violations: e.stdout, MaxReports: *reports}
	if *interleavings > 1 {
		opts.Progress = e.stderr
	}
	// sim.Run raises the GC target itself (unless GOGC is set).
	rep := sim.Run(ctx, &cfg, opts)
	rep.WriteTable(e.stdout, e.stderr)
	if ctx.Err() != nil {
		// main prints this as "capledger sim: interrupted (...)": say how
		// far the run got, not "interrupted" twice.
		return exitError{code: exitInterrupted, err: fmt.Errorf("%d of %d interleavings run", rep.Interleavings, *interleavings)}
	}
	if f := rep.Failures(); len(f) > 0 {
		return exitError{code: exitDiscrepancies, err: fmt.Errorf("%d gate(s) failed; the first: %s", len(f), f[0])}
	}
	return nil
}
