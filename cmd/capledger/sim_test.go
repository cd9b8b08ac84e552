package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
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
