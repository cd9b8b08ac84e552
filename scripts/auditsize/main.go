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
//	since, or the -phases given, none with -phases none; -phase retire
//	removes every reservation, as retention would; -phase liveread times
//	and -phase snapshot is the baseline of what a full audit does inside
//	its read of the live database, for callgrind)
//
// With -checkpoint-every K the fill does what a running server's
// compaction worker does while the store grows: after every K lifecycles
// (one simulated hour of commits) it cuts a statement checkpoint through
// engine.CutCheckpoint, which audits the journal since the previous one,
// and compacts the journal it summarises. -fill-only stops after the fill
// and -from resumes an interrupted fill at lifecycle number FROM (a fill
// is split into runs of its own that way; each prints its progress every
// -report lifecycles).
package main

import (
	"context"
	"errors"
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
	phase := flag.String("phase", "", "fill and every phase (default), full, since, checkpoint, retire, liveread or snapshot")
	batch := flag.Int("batch", 10000, "lifecycles per fill transaction")
	phases := flag.String("phases", "full,since,checkpoint,full,since", "the phases run after the fill, in order (none: no phase)")
	every := flag.Int("checkpoint-every", 0, "cut a checkpoint and compact the journal after every this many lifecycles of the fill (0: never)")
	from := flag.Int("from", 0, "resume a fill at this lifecycle number (the store holds lifecycles 0 to from-1)")
	report := flag.Int("report", 1000000, "print the fill's progress every this many lifecycles")
	subjects := flag.Int("subjects", 100, "the fill's reservations go round this many subjects (an account each)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the phase to this file")
	memprofile := flag.String("memprofile", "", "write a heap profile (allocations included) at the end of the phase to this file")
	flag.Parse()
	if *memprofile != "" {
		defer func() {
			f, err := os.Create(*memprofile)
			must(err)
			must(pprof.Lookup("allocs").WriteTo(f, 0))
			must(f.Close())
		}()
	}
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
		fill(ctx, path, *from, *n, *batch, *every, *report, *subjects)
		fmt.Printf("fill %d to %d reservations: %s (CPU %s), file %d bytes\n", *from, *n, time.Since(start).Round(time.Millisecond), cpu(), size(path))
		if *phases == "none" {
			return
		}
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
	case "liveread", "snapshot":
		// The part of a full audit inside its read transaction on the
		// live database (liveread: AuditSnapshot until its first
		// reservation, by when the store has copied what the audit reads
		// and ended that read), unpaced; snapshot opens the same read and
		// reads nothing more, the baseline to subtract (callgrind).
		st := open(ctx, path)
		start := time.Now()
		stop := errors.New("stop")
		err := st.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			if *phase == "snapshot" {
				return nil
			}
			return snap.ReservationStream(func(*ledger.Reservation) error { return stop })
		})
		if !errors.Is(err, stop) {
			must(err)
		}
		fmt.Printf("%s: read held %s (CPU %s), peak RSS %s\n", *phase, time.Since(start).Round(time.Millisecond), cpu(), peakRSS())
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
		fmt.Printf("cut: peak RSS %s\n", peakRSS())
		start = time.Now()
		deleted, err := e.CompactJournal(ctx)
		must(err)
		fmt.Printf("checkpoint %d (%d entries): cut %s (CPU %s), compaction of %d batches %s, file %d bytes, peak RSS %s\n",
			cp.Seq, cp.Entries, cut.Round(time.Millisecond), cpu(), deleted, time.Since(start).Round(time.Millisecond), size(path), peakRSS())
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
		fmt.Printf("retire %d: %s (CPU %s), file %d bytes\n", removed, time.Since(start).Round(time.Millisecond), cpu(), size(path))
		must(st.Reclaim(ctx))
		fmt.Printf("after reclaim: file %d bytes\n", size(path))
		st.Close()
	}
}

// fillAt is the simulated time of lifecycle i of a fill with a
// checkpoint every `every` lifecycles: every block of them is one hour
// after the one before, so the compaction worker's hourly cut falls
// between blocks.
func fillAt(i, every int) time.Time {
	if every <= 0 {
		return t0
	}
	return t0.Add(time.Duration(i/every) * time.Hour)
}

func fill(ctx context.Context, path string, from, n, batch, every, report, subjects int) {
	st := open(ctx, path)
	defer st.Close()
	core := engine.NewCore(st)
	if from == 0 {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "bench", Region: "eu"}, HoldTTL: time.Hour,
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: time.Second}}}.WithDefaults()
		_, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, t0)
		must(err)
	}
	var e *engine.Engine
	if every > 0 {
		e = engine.New(st, engine.Options{DisableWorkers: true, Compaction: &engine.CompactionOptions{Batch: 4096}})
		defer e.Close()
	}
	began, lastReport := time.Now(), time.Now()
	cmds := make([]ledger.Command, 0, 3*batch)
	for start := from; start < n; {
		end := min(start+batch, n)
		if every > 0 {
			end = min(end, (start/every+1)*every) // a block ends with its hour
		}
		cmds = cmds[:0]
		for i := start; i < end; i++ {
			id := fmt.Sprintf("rl-%09d", i)
			subject := fmt.Sprintf("tenant-%d", i%subjects)
			cmds = append(cmds,
				ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + strings.Repeat("ab", 32),
					Subject: subject, Route: "bench", Region: "eu", Units: ledger.Amounts{100}},
				ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id},
				ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{60}})
		}
		res, err := core.Commit(ctx, cmds, fillAt(start, every))
		must(err)
		for i := range res {
			if res[i].Err != nil {
				must(fmt.Errorf("%s %s: %w", cmds[i].Kind, cmds[i].ReservationID, res[i].Err))
			}
		}
		if every > 0 && end%every == 0 {
			cutAt := fillAt(end, every)
			cp, found, err := e.CutCheckpoint(ctx, cutAt)
			must(err)
			if len(found) > 0 {
				must(fmt.Errorf("checkpoint at %d: the audit found %d discrepancies, first %s", end, len(found), found[0]))
			}
			deleted, err := e.CompactJournal(ctx)
			must(err)
			if cp != nil {
				fmt.Printf("  checkpoint %d at %d lifecycles: %d entries, %d journal rows deleted\n", cp.Seq, end, cp.Entries, deleted)
			}
		}
		if end/report != start/report || end == n {
			fmt.Printf("  %d lifecycles, %s since start (%s for the last %d), CPU %s, file %d bytes\n", end,
				time.Since(began).Round(time.Second), time.Since(lastReport).Round(time.Second), report, cpu(), size(path))
			lastReport = time.Now()
		}
		start = end
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
