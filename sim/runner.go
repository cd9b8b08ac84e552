package sim

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
)

// Release-gate thresholds.
const (
	// DefaultMinFires is how often every fault site must fire in a gate
	// run: a gate cannot pass by not testing.
	DefaultMinFires = 1000
	// MinFiresFrom is the smallest run the site gate applies to by
	// default; smaller runs (a replay of one seed) report the counts only.
	MinFiresFrom = 10000
	// MaxUnknownP99 is the longest the 99th percentile of UNKNOWN
	// convergence may take, in simulated time.
	MaxUnknownP99 = 10 * time.Minute
)

// gcPercent is the GOGC a Run uses unless GOGC is set.
const gcPercent = 800

// Options say which interleavings a run covers and how it reports.
type Options struct {
	// Seed is the first interleaving's seed; interleaving i runs seed
	// Seed+i.
	Seed uint64
	// Interleavings is how many seeded runs to do.
	Interleavings int64
	// Workers is how many run in parallel (default: all cores).
	Workers int
	// MinFires is the site gate (see DefaultMinFires); negative picks the
	// default for the run's size.
	MinFires int64
	// Progress, when set, receives a progress bar (rate, ETA, violations).
	Progress io.Writer
	// Violations, when set, receives each violation's report as it is
	// found: the full report for the first MaxReports, a one-line summary
	// with the replay command after that.
	Violations io.Writer
	MaxReports int
}

// Report aggregates a run.
type Report struct {
	Seed          uint64
	Interleavings int64
	Workers       int
	Events        int64
	Commits       int64
	SimTime       time.Duration
	Fired         [numSites]int64
	// EnabledIn counts the interleavings that had each site switched on.
	EnabledIn [numSites]int64
	Gates     [numGates]int64
	// Violations holds the first reports (up to 16), in the order found.
	Violations         []*Violation
	ReservationUnknown Histogram
	UsageUnknown       Histogram
	Fairness           FairnessSummary
	MinFires           int64
	// OnSQLite counts the interleavings that ran on the SQLite store.
	OnSQLite int64
	// Pipelined counts the interleavings with pipelined durability, and
	// LostUnsynced the commits their crashes lost before an fsync.
	Pipelined, LostUnsynced int64
	// OnRetention counts the interleavings whose retention worker ran;
	// TombstoneReplays the retried reserves answered from a tombstone.
	OnRetention      int64
	TombstoneReplays int64
	Retired          int64
	// ShardsRemoved counts the emergency shards it removed,
	// LateShardResends the gateways' resubmissions for them,
	// ShardsReissued the shards issued under a removed one's id.
	ShardsRemoved, LateShardResends, ShardsReissued int64
	// OnCompaction counts the interleavings whose compaction worker ran;
	// Checkpoints the checkpoints it stored, Compacted the journal rows it
	// deleted, CutCrashes the cuts a crash ended.
	OnCompaction                       int64
	Checkpoints, Compacted, CutCrashes int64
	// Records counts what the recorded requests did; RecordsOff says the
	// run had none (Config.RecordShare 0), which exempts lost_record_ack
	// from the site gate.
	Records    RecordStats
	RecordsOff bool
	// OnlyOff marks the sites a run restricted with Config.Only left off:
	// they cannot fire, so the site gate does not judge them.
	OnlyOff [numSites]bool
	Wall    time.Duration
	CPU     time.Duration
	// Interrupted: the context ended the run after Interleavings of the
	// Requested (Ctrl-C); only the gate violations found are judged.
	Interrupted bool
	Requested   int64
}

// acc is one worker's share of a Report.
type acc struct {
	events, commits int64
	simTime         time.Duration
	fired, enabled  [numSites]int64
	gates           [numGates]int64
	resUnknown      Histogram
	usageUnknown    Histogram
	fair            FairnessSummary
	onSQLite        int64
	pipelined, lost int64
	onRetention     int64
	tombReplays     int64
	retired         int64
	shardsRemoved   int64
	lateShard       int64
	reissued        int64
	onCompaction    int64
	checkpoints     int64
	compacted       int64
	cutCrashes      int64
	records         RecordStats
}

func (a *acc) add(o *Outcome) {
	a.events += o.Events
	a.commits += o.Commits
	a.simTime += o.SimTime
	for s := range o.Fired {
		a.fired[s] += o.Fired[s]
		if o.Enabled[s] {
			a.enabled[s]++
		}
	}
	if o.Violation != nil {
		a.gates[o.Violation.Gate]++
	}
	for _, d := range o.ReservationUnknown {
		a.resUnknown.Add(d)
	}
	for _, d := range o.UsageUnknown {
		a.usageUnknown.Add(d)
	}
	a.fair.add(&o.Fairness)
	if o.SQLite {
		a.onSQLite++
	}
	if o.Pipelined {
		a.pipelined++
		a.lost += int64(o.Lost)
	}
	if o.Retention {
		a.onRetention++
	}
	a.tombReplays += o.TombstoneReplays
	a.retired += o.Retired
	a.shardsRemoved += o.ShardsRemoved
	a.lateShard += o.LateShardResends
	a.reissued += o.ShardsReissued
	if o.Compaction {
		a.onCompaction++
	}
	a.checkpoints += o.Checkpoints
	a.compacted += o.Compacted
	a.cutCrashes += o.CutCrashes
	a.records.add(&o.Records)
}

// Run runs opts.Interleavings interleavings under cfg on opts.Workers
// goroutines (each interleaving itself is single-goroutine and
// deterministic) and returns the aggregate. ctx ending stops it early; the
// report then covers the interleavings that finished.
func Run(ctx context.Context, cfg *Config, opts Options) *Report {
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if int64(workers) > opts.Interleavings {
		workers = int(max(opts.Interleavings, 1))
	}
	minFires := opts.MinFires
	if minFires < 0 {
		minFires = 0
		if opts.Interleavings >= MinFiresFrom {
			minFires = DefaultMinFires
		}
	}
	rep := &Report{Seed: opts.Seed, Workers: workers, MinFires: minFires, RecordsOff: cfg.RecordShare == 0}
	if len(cfg.Only) > 0 {
		for s := range rep.OnlyOff {
			rep.OnlyOff[s] = true
		}
		for _, s := range cfg.Only {
			rep.OnlyOff[s] = false
		}
	}
	if os.Getenv("GOGC") == "" {
		// An interleaving allocates about 2 MB and keeps almost none of
		// it: with the default GOGC=100 the collector (and the scavenger
		// returning pages to the OS) took about 40% of the CPU. Unless the
		// user chose a GOGC, collect at 9x the live heap instead (a few
		// tens of MB per worker).
		defer debug.SetGCPercent(debug.SetGCPercent(gcPercent))
	}
	start := time.Now()
	cpuStart := cpuTime()

	var next, done, violations atomic.Int64
	var mu sync.Mutex
	reported := 0
	accs := make([]acc, workers)
	var wg sync.WaitGroup
	const chunk = 16
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func(a *acc) {
			defer wg.Done()
			for ctx.Err() == nil {
				first := next.Add(chunk) - chunk
				if first >= opts.Interleavings {
					return
				}
				last := min(first+chunk, opts.Interleavings)
				for k := first; k < last && ctx.Err() == nil; k++ {
					o := RunOne(cfg, opts.Seed+uint64(k))
					a.add(&o)
					done.Add(1)
					if o.Violation == nil {
						continue
					}
					violations.Add(1)
					mu.Lock()
					if len(rep.Violations) < 16 {
						rep.Violations = append(rep.Violations, o.Violation)
					}
					if opts.Violations != nil {
						if reported < opts.MaxReports {
							fmt.Fprint(opts.Violations, o.Violation.Report())
						} else {
							fmt.Fprintf(opts.Violations, "VIOLATION of gate %s in seed %d: replay with %s\n", o.Violation.Gate, o.Violation.Seed, o.Violation.Replay)
						}
						reported++
					}
					mu.Unlock()
				}
			}
		}(&accs[i])
	}
	stop := make(chan struct{})
	progressDone := make(chan struct{})
	if opts.Progress != nil {
		go progress(opts.Progress, opts.Interleavings, &done, &violations, start, stop, progressDone)
	} else {
		close(progressDone)
	}
	wg.Wait()
	close(stop)
	<-progressDone

	rep.Wall = time.Since(start)
	rep.CPU = cpuTime() - cpuStart
	for i := range accs {
		a := &accs[i]
		rep.Events += a.events
		rep.Commits += a.commits
		rep.SimTime += a.simTime
		for s := range a.fired {
			rep.Fired[s] += a.fired[s]
			rep.EnabledIn[s] += a.enabled[s]
		}
		for g := range a.gates {
			rep.Gates[g] += a.gates[g]
		}
		rep.ReservationUnknown.Merge(&a.resUnknown)
		rep.UsageUnknown.Merge(&a.usageUnknown)
		rep.Fairness.merge(&a.fair)
		rep.OnSQLite += a.onSQLite
		rep.Pipelined += a.pipelined
		rep.LostUnsynced += a.lost
		rep.OnRetention += a.onRetention
		rep.TombstoneReplays += a.tombReplays
		rep.Retired += a.retired
		rep.ShardsRemoved += a.shardsRemoved
		rep.LateShardResends += a.lateShard
		rep.ShardsReissued += a.reissued
		rep.OnCompaction += a.onCompaction
		rep.Checkpoints += a.checkpoints
		rep.Compacted += a.compacted
		rep.CutCrashes += a.cutCrashes
		rep.Records.add(&a.records)
	}
	rep.Interleavings = done.Load()
	rep.Requested = opts.Interleavings
	rep.Interrupted = rep.Interleavings < opts.Interleavings
	return rep
}

// cpuTime returns the process's user+system CPU time (0 where the
// platform does not say).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// progress draws a progress bar on w until stop closes: done/total, rate,
// ETA and violations so far. On a terminal it redraws one line; elsewhere
// (a CI log) it prints a line every 10 seconds.
func progress(w io.Writer, total int64, done, violations *atomic.Int64, start time.Time, stop, finished chan struct{}) {
	defer close(finished)
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	every := 200 * time.Millisecond
	if !tty {
		every = 10 * time.Second
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	draw := func(final bool) {
		n := done.Load()
		elapsed := time.Since(start)
		rate := float64(n) / max(elapsed.Seconds(), 1e-9)
		eta := "--"
		if rate > 0 && n < total {
			if left := float64(total-n) / rate; left < float64(math.MaxInt64/int64(time.Second)) {
				eta = time.Duration(left * float64(time.Second)).Round(time.Second).String()
			} else {
				eta = "more than 292 years" // beyond a time.Duration
			}
		}
		const width = 30
		filled := int(float64(width) * float64(n) / float64(max(total, 1)))
		bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
		line := fmt.Sprintf("[%s] %3.0f%% %d/%d  %.0f/s  ETA %s  violations %d",
			bar, 100*float64(n)/float64(max(total, 1)), n, total, rate, eta, violations.Load())
		switch {
		case tty && final:
			fmt.Fprintf(w, "\r%s\n", line)
		case tty:
			fmt.Fprintf(w, "\r%s", line)
		default:
			fmt.Fprintln(w, line)
		}
	}
	for {
		select {
		case <-stop:
			draw(true)
			return
		case <-ticker.C:
			draw(false)
		}
	}
}

// Failures returns why the run fails its gates (none when it passes):
// any violation, a fault site that fired fewer than MinFires times, an
// UNKNOWN convergence p99 above MaxUnknownP99, a fairness error beyond a
// budget. Of an interrupted run only the violations: the other gates
// judge the whole run, which more interleavings could still meet.
func (r *Report) Failures() []string {
	var out []string
	for g := Gate(0); g < numGates; g++ {
		if r.Gates[g] > 0 {
			out = append(out, fmt.Sprintf("gate %s: %d violations", g, r.Gates[g]))
		}
	}
	if r.Interrupted {
		return out
	}
	for s := Site(0); s < numSites; s++ {
		if r.Fired[s] < r.MinFires && r.siteExempt(s) == "" {
			out = append(out, fmt.Sprintf("fault site %s fired %d times, fewer than %d", s, r.Fired[s], r.MinFires))
		}
	}
	if p := r.ReservationUnknown.Quantile(0.99); p > MaxUnknownP99 {
		out = append(out, fmt.Sprintf("RESERVATION_UNKNOWN p99 %s > %s", p, MaxUnknownP99))
	}
	if p := r.UsageUnknown.Quantile(0.99); p > MaxUnknownP99 {
		out = append(out, fmt.Sprintf("USAGE_UNKNOWN p99 %s > %s", p, MaxUnknownP99))
	}
	return append(out, r.Fairness.Failures()...)
}

// siteExempt says why the site gate does not judge site s in this run (a
// flag switched it off, so it cannot fire), or "" when it does.
func (r *Report) siteExempt(s Site) string {
	switch {
	case r.OnlyOff[s]:
		return "not in --only"
	case s == SiteLostRecordAck && r.RecordsOff:
		return "no records"
	}
	return ""
}

// WriteTable writes the run's summary: the interleavings and events, each
// gate's figure, each fault site's count, UNKNOWN convergence, fairness,
// and PASS or FAIL with the reasons (INTERRUPTED, without a verdict,
// for an interrupted run that found no violation). The wall and CPU time line goes to
// timing (which may be w): everything else depends only on the seeds and
// the Config, so a replay prints it byte for byte.
func (r *Report) WriteTable(w, timing io.Writer) {
	n := max(r.Interleavings, 1)
	fmt.Fprintf(w, "\ncapledger sim: %d interleavings, seeds %d..%d\n", r.Interleavings, r.Seed, r.Seed+uint64(n)-1)
	fmt.Fprintf(w, "  %d events (%d per interleaving), %d store commits, %s simulated\n",
		r.Events, r.Events/n, r.Commits, r.SimTime.Round(time.Second))
	fmt.Fprintf(w, "  %d interleavings on the memstore, %d on the SQLite store\n", r.Interleavings-r.OnSQLite, r.OnSQLite)
	if r.Pipelined > 0 {
		fmt.Fprintf(w, "  %d with pipelined durability; their crashes lost %d commits made before an fsync\n", r.Pipelined, r.LostUnsynced)
	}
	fmt.Fprintf(w, "  %d with the retention worker (engine.Core.RetentionDue): %d reservations removed, %d retried reserves answered from a tombstone\n", r.OnRetention, r.Retired, r.TombstoneReplays)
	fmt.Fprintf(w, "    and engine.Core.ShardsRemove: %d emergency shards removed, %d late resubmissions for them answered SHARD_NOT_FOUND, %d shards issued again under a removed one's id\n",
		r.ShardsRemoved, r.LateShardResends, r.ShardsReissued)
	fmt.Fprintf(w, "  %d records (RecordUsage, no reservation): %d with debt; retries answered by %d replays, %d from a tombstone\n",
		r.Records.Records, r.Records.WithDebt, r.Records.Replays, r.Records.FromTombstone)
	fmt.Fprintf(w, "  %d with the compaction worker: %d checkpoints stored, %d journal rows deleted, %d cuts ended by a crash\n", r.OnCompaction, r.Checkpoints, r.Compacted, r.CutCrashes)
	fmt.Fprintf(timing, "  wall %s on %d workers, cpu %s (%.2f ms cpu per interleaving)\n",
		r.Wall.Round(time.Millisecond), r.Workers, r.CPU.Round(time.Millisecond), float64(r.CPU)/float64(n)/1e6)
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GATE\tVIOLATIONS\t")
	for g := Gate(0); g < numGates; g++ {
		fmt.Fprintf(tw, "%s\t%d\t\n", g, r.Gates[g])
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "FAULT SITE\tFIRED\tON IN\tMIN\t\n")
	for s := Site(0); s < numSites; s++ {
		mark := "ok"
		switch {
		case r.Fired[s] < r.MinFires && r.Interrupted:
			mark = "-" // not judged: the run was interrupted
		case r.Fired[s] < r.MinFires && r.siteExempt(s) != "":
			mark = "- (" + r.siteExempt(s) + ")"
		case r.Fired[s] < r.MinFires:
			mark = "TOO FEW"
		}
		seed := ""
		if s.SeedSite() {
			seed = " (seed)"
		}
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%d %s\t\n", s, seed, r.Fired[s], r.EnabledIn[s], r.MinFires, mark)
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "UNKNOWN CONVERGENCE (simulated)\tCOUNT\tP50\tP99\tMAX\tGATE P99 <= %s\t\n", MaxUnknownP99)
	for _, row := range []struct {
		name string
		h    *Histogram
	}{{"RESERVATION_UNKNOWN", &r.ReservationUnknown}, {"USAGE_UNKNOWN", &r.UsageUnknown}} {
		mark := "ok"
		switch {
		case r.Interrupted:
			// Not judged: the p99 of a partial run is no verdict (and
			// of none at all, 0s), whatever it is.
			mark = "- (not judged: interrupted)"
		case row.h.Quantile(0.99) > MaxUnknownP99:
			mark = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t\n", row.name, row.h.Count(),
			upToMillisecond(row.h.Quantile(0.5)), upToMillisecond(row.h.Quantile(0.99)), upToMillisecond(row.h.Max()), mark)
	}
	tw.Flush()
	fmt.Fprintln(w)
	r.Fairness.write(w, r.Interrupted)

	f := r.Failures()
	switch {
	case r.Interrupted && len(f) > 0:
		fmt.Fprintf(w, "\nRESULT: FAIL (interrupted after %d of %d interleavings)\n", r.Interleavings, r.Requested)
	case r.Interrupted:
		fmt.Fprintf(w, "\nRESULT: INTERRUPTED after %d of %d interleavings: no violation so far; no verdict on the fault sites, UNKNOWN p99 and fairness, which judge a whole run\n",
			r.Interleavings, r.Requested)
		return
	case len(f) > 0:
		fmt.Fprintf(w, "\nRESULT: FAIL\n")
	}
	if len(f) > 0 {
		for _, reason := range f {
			fmt.Fprintf(w, "  %s\n", reason)
		}
		return
	}
	fmt.Fprintf(w, "\nRESULT: PASS (every gate 0")
	if r.MinFires > 0 && slices.Contains(r.OnlyOff[:], true) {
		fmt.Fprintf(w, ", every fault site --only switched on fired at least %d times", r.MinFires)
	} else if r.MinFires > 0 {
		fmt.Fprintf(w, ", every fault site fired at least %d times", r.MinFires)
	} else {
		fmt.Fprintf(w, "; the fault-site gate applies to runs of %d interleavings or more", MinFiresFrom)
	}
	fmt.Fprintf(w, ")\n")
}

// upToMillisecond rounds d up to the millisecond for the convergence
// table: a quantile is a bucket's upper edge (a multiple of HistogramStep,
// unchanged) or, when the maximum is lower, the exact maximum, which then
// prints like the maximum's own column, and neither below its true value.
func upToMillisecond(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d
}
