// Command auditsize measures what an audit costs over a SQLite store of N
// finished reservations (docs/PERFORMANCE.md): full (every reservation,
// the journal since the last checkpoint) and since the last checkpoint,
// before and after a statement checkpoint compacted the journal. It fills
// a new store through engine.Core in large batches (reserve, start,
// settle: about 10,000 lifecycles a transaction, far faster than commands
// one by one over the network), then runs each phase in a process of its
// own, so that each peak RSS is its own.
//
// Usage: go run ./scripts/auditsize -n 1000000 -dir /tmp/auditsize
//
//	(fills, then runs itself with -phase full, since, checkpoint, full,
//	since, or the -phases given; -phase retire removes every reservation,
//	as retention would)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func main() {
	n := flag.Int("n", 100000, "finished reservations to write")
	dir := flag.String("dir", "", "data directory (new)")
	phase := flag.String("phase", "", "fill and every phase (default), full, since, checkpoint or retire")
	batch := flag.Int("batch", 10000, "lifecycles per fill transaction")
	phases := flag.String("phases", "full,since,checkpoint,full,since", "the phases run after the fill, in order")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the phase to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	path := filepath.Join(*dir, "capledger.db")
	switch *phase {
	case "":
		must(os.MkdirAll(*dir, 0o700))
		start := time.Now()
		fill(ctx, path, *n, *batch)
		fmt.Printf("fill %d reservations: %s (CPU %s), file %d bytes\n", *n, time.Since(start).Round(time.Millisecond), cpu(), size(path))
		for _, p := range strings.Split(*phases, ",") {
			cmd := exec.Command(os.Args[0], "-phase", p, "-dir", *dir)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			must(cmd.Run())
		}
	case "full", "since":
		st := open(ctx, path)
		e := engine.New(st, engine.Options{DisableWorkers: true})
		start := time.Now()
		var last engine.AuditProgress
		d, err := e.AuditWith(ctx, engine.AuditOptions{SinceCheckpoint: *phase == "since", Progress: func(p engine.AuditProgress) { last = p }})
		must(err)
		fmt.Printf("%s audit: %s (CPU %s), %d rows read (estimate %d), %d discrepancies, peak RSS %s\n", *phase,
			time.Since(start).Round(time.Millisecond), cpu(), last.Rows, last.Estimate, len(d), peakRSS())
		e.Close()
		st.Close()
	case "checkpoint":
		st := open(ctx, path)
		e := engine.New(st, engine.Options{DisableWorkers: true, Compaction: &engine.CompactionOptions{Batch: 4096}})
		start := time.Now()
		cp, found, err := e.CutCheckpoint(ctx, t0.Add(time.Hour))
		must(err)
		if cp == nil || len(found) > 0 {
			must(fmt.Errorf("no checkpoint: %v", found))
		}
		cut := time.Since(start)
		start = time.Now()
		deleted, err := e.CompactJournal(ctx)
		must(err)
		fmt.Printf("checkpoint %d (%d entries, %d accounts): cut %s (CPU %s), compaction of %d batches %s, file %d bytes, peak RSS %s\n",
			cp.Seq, cp.Entries, len(cp.Accounts), cut.Round(time.Millisecond), cpu(), deleted, time.Since(start).Round(time.Millisecond), size(path), peakRSS())
		must(st.Reclaim(ctx))
		fmt.Printf("after reclaim: file %d bytes\n", size(path))
		e.Close()
		st.Close()
	case "retire":
		st := open(ctx, path)
		core := engine.NewCore(st)
		start := time.Now()
		removed := 0
		for {
			cmds, err := core.RetentionDue(ctx, t0.Add(48*time.Hour), time.Hour, 0, 512)
			must(err)
			if len(cmds) == 0 {
				break
			}
			_, err = core.Commit(ctx, cmds, t0.Add(48*time.Hour))
			must(err)
			removed += len(cmds)
		}
		fmt.Printf("retire %d: %s, file %d bytes\n", removed, time.Since(start).Round(time.Millisecond), size(path))
		must(st.Reclaim(ctx))
		fmt.Printf("after reclaim: file %d bytes\n", size(path))
		st.Close()
	}
}

func fill(ctx context.Context, path string, n, batch int) {
	st := open(ctx, path)
	defer st.Close()
	core := engine.NewCore(st)
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "bench", Region: "eu"}, HoldTTL: time.Hour,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: time.Second}}}.WithDefaults()
	_, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, t0)
	must(err)
	for start := 0; start < n; start += batch {
		var cmds []ledger.Command
		for i := start; i < start+batch && i < n; i++ {
			id := fmt.Sprintf("rl-%09d", i)
			subject := fmt.Sprintf("tenant-%d", i%100)
			cmds = append(cmds,
				ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + strings.Repeat("ab", 32),
					Subject: subject, Route: "bench", Region: "eu", Units: ledger.Amounts{100}},
				ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id},
				ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{60}})
		}
		res, err := core.Commit(ctx, cmds, t0)
		must(err)
		for i := range res {
			if res[i].Err != nil {
				must(fmt.Errorf("%s %s: %w", cmds[i].Kind, cmds[i].ReservationID, res[i].Err))
			}
		}
	}
}

func open(ctx context.Context, path string) *sqlite.Store {
	st, err := sqlite.Open(ctx, path)
	must(err)
	return st
}

func size(path string) int64 {
	var total int64
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			total += fi.Size()
		}
	}
	return total
}

// cpu is the process's user and system CPU time so far: on a loaded
// machine a truer cost than the wall time.
func cpu() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Round(time.Millisecond)
}

func peakRSS() string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	return "?"
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
