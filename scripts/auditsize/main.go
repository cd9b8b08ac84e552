// Command auditsize measures what a full audit costs over a SQLite store
// of N finished reservations, before and after retention removed them
// (docs/PERFORMANCE.md, "Bounded history"). It fills a new store through
// engine.Core in batches (reserve, start, settle), then in separate
// processes (so that each peak RSS is its own) audits, retires every
// reservation, and audits again.
//
// Usage: go run ./scripts/auditsize -n 1000000 -dir /tmp/auditsize
//
//	(fills, then runs itself with -phase audit, -phase retire, -phase audit)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func main() {
	n := flag.Int("n", 100000, "finished reservations to write")
	dir := flag.String("dir", "", "data directory (new)")
	phase := flag.String("phase", "", "fill (default: all), audit (in-memory snapshot), stream (engine.Audit, journal streamed) or retire")
	flag.Parse()
	ctx := context.Background()
	path := filepath.Join(*dir, "capledger.db")
	switch *phase {
	case "":
		must(os.MkdirAll(*dir, 0o700))
		start := time.Now()
		fill(ctx, path, *n)
		fmt.Printf("fill %d reservations: %s, file %d bytes\n", *n, time.Since(start).Round(time.Millisecond), size(path))
		for _, p := range []string{"audit", "stream", "retire", "audit", "stream"} {
			cmd := exec.Command(os.Args[0], "-phase", p, "-dir", *dir)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			must(cmd.Run())
		}
	case "audit":
		st := open(ctx, path)
		start := time.Now()
		snap, err := st.Snapshot(ctx)
		must(err)
		d := ledger.Audit(snap)
		fmt.Printf("audit: %s, %d reservations, %d journal entries, %d discrepancies, peak RSS %s\n",
			time.Since(start).Round(time.Millisecond), len(snap.Reservations), len(snap.Journal), len(d), peakRSS())
		st.Close()
	case "stream":
		st := open(ctx, path)
		e := engine.New(st, engine.Options{DisableWorkers: true})
		start := time.Now()
		d, err := e.Audit(ctx)
		must(err)
		fmt.Printf("streamed audit: %s, %d discrepancies, peak RSS %s\n", time.Since(start).Round(time.Millisecond), len(d), peakRSS())
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

func fill(ctx context.Context, path string, n int) {
	st := open(ctx, path)
	defer st.Close()
	core := engine.NewCore(st)
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "bench", Region: "eu"}, HoldTTL: time.Hour,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: time.Second}}}.WithDefaults()
	_, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, t0)
	must(err)
	const batch = 500
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
