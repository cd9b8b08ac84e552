package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/sim"
)

func runSimCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}, append([]string{"sim"}, args...))
	return code, out.String(), errOut.String()
}

// A replay of one seed prints the same stdout byte for byte (the timing
// line goes to stderr) and passes its gates.
func TestSimReplayIsByteIdentical(t *testing.T) {
	code, first, stderr := runSimCLI(t, "--seed", "5", "--interleavings", "1", "--trace")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, first, stderr)
	}
	_, second, _ := runSimCLI(t, "--seed", "5", "--interleavings", "1", "--trace")
	if first != second {
		t.Fatal("two replays of seed 5 printed different output")
	}
	for _, want := range []string{"arrive reserve", "capledger sim: 1 interleavings, seeds 5..5", "RESULT: PASS"} {
		if !strings.Contains(first, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !strings.Contains(stderr, "cpu") {
		t.Errorf("stderr lacks the timing line: %q", stderr)
	}
}

func TestSimUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--interleavings", "0"},
		{"--trace", "--interleavings", "2"},
		{"--only", "no_such_site"},
		{"--seed", "-3"},
		{"--gateways", "1"},
		{"stray"},
	} {
		if code, _, stderr := runSimCLI(t, args...); code != exitUsage || stderr == "" {
			t.Errorf("sim %v: exit %d (stderr %q), want %d with a message", args, code, stderr, exitUsage)
		}
	}
}

// A small multi-worker run exits 0 with the gate table; the site gate is
// off below 10,000 interleavings unless asked for, and then it fails.
func TestSimRunAndSiteGate(t *testing.T) {
	code, out, stderr := runSimCLI(t, "--seed", "1", "--interleavings", "20", "--workers", "2")
	if code != exitOK || !strings.Contains(out, "GATE") || !strings.Contains(out, "FAULT SITE") {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	code, out, _ = runSimCLI(t, "--seed", "1", "--interleavings", "20", "--min-fires", "1000")
	if code != exitDiscrepancies || !strings.Contains(out, "TOO FEW") {
		t.Fatalf("a site gate of 1000 fires over 20 interleavings: exit %d\n%s", code, out)
	}
}

// docs/SIMULATOR.md: convergence quantiles are reported at 100 ms
// resolution, the upper edge of their bucket, or the maximum when that is
// lower. Seed 42's RESERVATION_UNKNOWN p99 falls in the maximum's bucket
// (9 samples): it must print as the maximum does, not to the nanosecond.
func TestSimQuantilesAtTheirResolution(t *testing.T) {
	code, out, stderr := runSimCLI(t, "--seed", "42", "--interleavings", "1")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || (f[0] != "RESERVATION_UNKNOWN" && f[0] != "USAGE_UNKNOWN") {
			continue
		}
		rows++
		maxCell, err := time.ParseDuration(f[4])
		if err != nil {
			t.Fatalf("%s: MAX %q: %v", f[0], f[4], err)
		}
		if maxCell%time.Millisecond != 0 {
			t.Errorf("%s: MAX %s finer than a millisecond", f[0], f[4])
		}
		for i, name := range []string{"P50", "P99"} {
			q, err := time.ParseDuration(f[2+i])
			if err != nil {
				t.Fatalf("%s: %s %q: %v", f[0], name, f[2+i], err)
			}
			if q%sim.HistogramStep != 0 && q != maxCell {
				t.Errorf("%s: %s %s is neither a multiple of %s nor the maximum %s:\n%s", f[0], name, f[2+i], sim.HistogramStep, f[4], line)
			}
			if q > maxCell {
				t.Errorf("%s: %s %s above the maximum %s", f[0], name, f[2+i], f[4])
			}
		}
	}
	if rows != 2 {
		t.Fatalf("found %d convergence rows, want 2:\n%s", rows, out)
	}
}

// docs/SIMULATOR.md: a run fails the liveness gate when converging takes
// more than --deadline after healing. Seed 1 converges at some whole
// second T after the heal (the workers notice it on their tick): with
// --deadline T it passes, with T-1s it fails liveness.
func TestSimDeadlineIsInclusive(t *testing.T) {
	code, out, stderr := runSimCLI(t, "--seed", "1", "--interleavings", "1", "--heal-at", "3m", "--trace")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	var at time.Duration
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && f[2] == "done" && f[3] == "converged" {
			d, err := time.ParseDuration(strings.TrimPrefix(f[0], "+"))
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			at = d
		}
	}
	took := at - 3*time.Minute
	if took < 2*time.Second || took%time.Second != 0 {
		t.Fatalf("seed 1 converged at +%s, %s after healing: want a whole number of seconds, at least 2", at, took)
	}
	if code, out, _ := runSimCLI(t, "--seed", "1", "--interleavings", "1", "--deadline", took.String()); code != exitOK {
		t.Errorf("--deadline %s, the time seed 1 took to converge: exit %d, want 0\n%s", took, code, out)
	}
	code, out, _ = runSimCLI(t, "--seed", "1", "--interleavings", "1", "--deadline", (took - time.Second).String())
	if code != exitDiscrepancies || !strings.Contains(out, "VIOLATION of gate liveness") {
		t.Errorf("--deadline %s, a second short of what seed 1 took: exit %d, want %d with a liveness violation\n%s", took-time.Second, code, exitDiscrepancies, out)
	}
}

// A CAPLEDGER_MUTANT this binary does not know (misspelt, or any name in
// a binary built without -tags capledger_mutants) is refused with exit 1
// and the known names, before anything runs: run unmutated, it would pass
// as if the simulator had missed the bug. A known name runs. Run it in
// both builds: go test [-tags capledger_mutants] -run TestSimRefusesAnUnknownMutant ./cmd/capledger
func TestSimRefusesAnUnknownMutant(t *testing.T) {
	simWith := func(mutant string) (code int, stdout, stderr string) {
		var out, errOut bytes.Buffer
		getenv := func(k string) string {
			if k == "CAPLEDGER_MUTANT" {
				return mutant
			}
			return ""
		}
		code = run(context.Background(), &env{stdout: &out, stderr: &errOut, getenv: getenv},
			[]string{"sim", "--seed", "1", "--interleavings", "1"})
		return code, out.String(), errOut.String()
	}
	code, out, stderr := simWith("refund_twise")
	if code != exitUsage || out != "" {
		t.Fatalf("CAPLEDGER_MUTANT=refund_twise: exit %d, %d bytes of stdout (%q), want %d and nothing run",
			code, len(out), out[strings.LastIndex(out, "RESULT")+1:], exitUsage)
	}
	names := sim.MutantNames()
	if !strings.Contains(stderr, "CAPLEDGER_MUTANT=refund_twise") {
		t.Errorf("stderr does not name the variable and its value: %q", stderr)
	}
	if len(names) == 0 && !strings.Contains(stderr, "-tags capledger_mutants") {
		t.Errorf("a build without mutants: stderr does not say how to build one: %q", stderr)
	}
	for _, name := range names {
		if !strings.Contains(stderr, name) {
			t.Errorf("stderr does not list the known mutant %s: %q", name, stderr)
		}
	}
	if len(names) > 0 {
		// A known name is accepted: a verdict, not a usage error (the
		// variants read the process environment, where it is unset here,
		// so this run is unmutated).
		if code, out, stderr := simWith(names[0]); code != exitOK && code != exitDiscrepancies {
			t.Fatalf("CAPLEDGER_MUTANT=%s: exit %d\n%s\n%s", names[0], code, out, stderr)
		}
	}
	if code, _, stderr := simWith(""); code != exitOK {
		t.Fatalf("without CAPLEDGER_MUTANT: exit %d\n%s", code, stderr)
	}
}

// An interrupted sim (its context cancelled, as Ctrl-C does) exits 130,
// says after how many interleavings, and judges neither UNKNOWN
// convergence nor fairness: no row of those tables says "ok".
func TestSimInterruptedSaysSo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }},
		[]string{"sim", "--seed", "1", "--interleavings", "50", "--workers", "1"})
	if code != exitInterrupted {
		t.Fatalf("exit %d, want %d\n%s\n%s", code, exitInterrupted, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "RESULT: INTERRUPTED after 0 of 50 interleavings") || !strings.Contains(errOut.String(), "interrupted") {
		t.Errorf("no interrupted verdict:\n%s\n%s", out.String(), errOut.String())
	}
	// The last stderr line is main's "capledger sim: interrupted (...)"
	// around the command's error: that error says how far the run got,
	// not "interrupted" a second time.
	if want := "capledger sim: interrupted (0 of 50 interleavings run)\n"; !strings.HasSuffix(errOut.String(), want) {
		t.Errorf("stderr %q, want it to end %q", errOut.String(), want)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "RESERVATION_UNKNOWN") || strings.HasPrefix(line, "USAGE_UNKNOWN") || strings.HasPrefix(line, "tenants of weight") {
			if strings.HasSuffix(strings.TrimSpace(line), " ok") || !strings.Contains(line, "not judged: interrupted") {
				t.Errorf("interrupted run: %q, want it marked not judged: interrupted", line)
			}
		}
	}
}

// TestSimProgressETAOfAHugeRun: the progress line's ETA (SIMULATOR.md:
// done/total, rate, ETA) of a run longer than a time.Duration holds (the
// flag takes up to 2^63-1 interleavings) said "ETA -2562047h47m16.854775808s"
// (the conversion overflowed); it says the wait is beyond 292 years.
func TestSimProgressETAOfAHugeRun(t *testing.T) {
	var line string
	// The line has an ETA once an interleaving is done: on a busy machine
	// that may take longer than the first try.
	for _, wait := range []time.Duration{1500 * time.Millisecond, 5 * time.Second, 20 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		var out, errOut bytes.Buffer
		code := run(ctx, &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }},
			[]string{"sim", "--seed", "1", "--interleavings", "9223372036854775807", "--workers", "1"})
		cancel()
		if code != exitInterrupted {
			t.Fatalf("exit %d, want %d\n%s", code, exitInterrupted, errOut.String())
		}
		for _, l := range strings.Split(errOut.String(), "\n") {
			if strings.Contains(l, "ETA") {
				line = l
			}
		}
		if !strings.Contains(line, "ETA --") {
			break
		}
	}
	if !strings.Contains(line, "ETA more than 292 years ") || strings.Contains(line, "ETA -") {
		t.Errorf("progress line %q: want ETA more than 292 years", line)
	}
}
