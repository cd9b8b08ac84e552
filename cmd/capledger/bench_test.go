package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// benchRow returns the value of a row of bench's table.
func benchRow(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(.+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q row in:\n%s", name, out)
	}
	return strings.TrimSpace(m[1])
}

func TestBenchModesAgainstServer(t *testing.T) {
	url := startInProcess(t)
	for _, args := range [][]string{
		{"--mode", "reserve", "--subjects", "1"},
		{"--mode", "reserve", "--subjects", "7", "--protocol", "grpc"},
		{"--mode", "lifecycle", "--protocol", "connect-json"},
		{"--mode", "batch", "--batch-size", "20"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			full := append([]string{"bench", "--concurrency", "4", "--duration", "300ms", "--warmup", "50ms", "--progress=false"}, args...)
			code, out, errOut := cli(t, url, full...)
			wantExit(t, exitOK, code, out, errOut)
			ops, err := strconv.Atoi(benchRow(t, out, "ops"))
			if err != nil || ops == 0 {
				t.Fatalf("ops %q:\n%s", benchRow(t, out, "ops"), out)
			}
			if e := benchRow(t, out, "errors"); e != "0" {
				t.Fatalf("errors %s:\n%s", e, out)
			}
			for _, row := range []string{"ops/s", "p50", "p99", "p999"} {
				benchRow(t, out, row)
			}
			if args[1] == "batch" {
				perSec, _ := strconv.ParseFloat(benchRow(t, out, "reservations/s"), 64)
				opsPerSec, _ := strconv.ParseFloat(benchRow(t, out, "ops/s"), 64)
				if perSec < 19*opsPerSec {
					t.Fatalf("batch of 20: %v reservations/s for %v ops/s", perSec, opsPerSec)
				}
			}
		})
	}
}

func TestBenchUsageAndUnreachable(t *testing.T) {
	code, out, errOut := cli(t, "", "bench", "--mode", "nope")
	wantExit(t, exitUsage, code, out, errOut)
	code, out, errOut = cli(t, "", "bench", "--batch-size", "1001", "--mode", "batch")
	wantExit(t, exitUsage, code, out, errOut)
	// Nothing listens on port 1 of loopback.
	code, out, errOut = cli(t, "http://127.0.0.1:1", "bench", "--setup=false", "--duration", "100ms", "--warmup", "0s", "--progress=false", "--timeout", "200ms")
	wantExit(t, exitUnavailable, code, out, errOut)
}
