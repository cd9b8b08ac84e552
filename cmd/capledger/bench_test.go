package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// The callers' subjects come from --seed: the same seed repeats a run's
// subjects, another seed (a new one per run by default) draws others, and
// two callers of one run draw different ones.
func TestBenchSeedChoosesSubjects(t *testing.T) {
	draw := func(seed uint64, caller int) []string {
		cfg := &benchConfig{subjects: 1000000, seed: seed}
		w := newBenchWorker(cfg, caller)
		var got []string
		for range 8 {
			got = append(got, w.subject(cfg))
		}
		return got
	}
	if a, b := draw(7, 0), draw(7, 0); !slices.Equal(a, b) {
		t.Fatalf("seed 7 drew %v, then %v", a, b)
	}
	if a, b := draw(7, 0), draw(8, 0); slices.Equal(a, b) {
		t.Fatalf("seeds 7 and 8 both drew %v", a)
	}
	if a, b := draw(7, 0), draw(7, 1); slices.Equal(a, b) {
		t.Fatalf("callers 0 and 1 both drew %v", a)
	}
}

// bench prints the seed it drew (a new one per run) or the one given.
func TestBenchPrintsSeed(t *testing.T) {
	url := startInProcess(t)
	run := func(args ...string) string {
		code, out, errOut := cli(t, url, append([]string{"bench", "--concurrency", "1", "--duration", "50ms", "--warmup", "0s", "--progress=false"}, args...)...)
		wantExit(t, exitOK, code, out, errOut)
		return benchRow(t, out, "seed")
	}
	if a, b := run(), run(); a == b {
		t.Fatalf("two runs drew the same seed %s", a)
	}
	if s := run("--seed", "12345"); s != "12345" {
		t.Fatalf("--seed 12345 printed seed %s", s)
	}
	code, out, errOut := cli(t, url, "bench", "--seed", "-1")
	wantExit(t, exitUsage, code, out, errOut)
}

func TestBenchModesAgainstServer(t *testing.T) {
	url := startInProcess(t)
	for _, args := range [][]string{
		{"--mode", "reserve", "--subjects", "1"},
		{"--mode", "reserve", "--subjects", "7", "--protocol", "grpc"},
		{"--mode", "lifecycle", "--protocol", "connect-json"},
		{"--mode", "batch", "--batch-size", "20"},
		{"--mode", "reserve", "--protocol", "grpc-go"},
		{"--mode", "lifecycle", "--protocol", "grpc-go"},
		{"--mode", "batch", "--batch-size", "20", "--protocol", "grpc-go"},
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

// TestBenchEchoBaseline runs the echo baseline end to end: the echo server
// on a real loopback socket, and bench's echo mode against it.
func TestBenchEchoBaseline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveEchoOn(ctx, &env{stdout: io.Discard, stderr: io.Discard}, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("echo server: %v", err)
		}
	})
	code, out, errOut := cli(t, "http://"+ln.Addr().String(), "bench", "--mode", "echo", "--concurrency", "2", "--duration", "200ms", "--warmup", "0s", "--progress=false")
	wantExit(t, exitOK, code, out, errOut)
	if ops, _ := strconv.Atoi(benchRow(t, out, "ops")); ops == 0 || benchRow(t, out, "errors") != "0" {
		t.Fatalf("echo baseline:\n%s", out)
	}
}

// TestBenchGubernatorRequest checks what the gubernator baseline sends and
// how it reads the answer, against a handler that answers as the HTTP
// gateway of gubernator v2.13.0 answered (the body below was recorded from
// one). bench counts an answer that is not UNDER_LIMIT as an error, so a
// mode that silently measured refusals would fail here.
func TestBenchGubernatorRequest(t *testing.T) {
	var calls, bad atomic.Int64
	var overLimit atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		var req struct {
			Requests []map[string]any `json:"requests"`
		}
		if r.Method != "POST" || r.URL.Path != "/v1/GetRateLimits" || json.NewDecoder(r.Body).Decode(&req) != nil ||
			len(req.Requests) != 1 || req.Requests[0]["hits"] != "3" || req.Requests[0]["unique_key"] != "bench-0" ||
			req.Requests[0]["name"] != "bench.reserve" || req.Requests[0]["duration"] != "3600000" {
			bad.Add(1)
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		status := "UNDER_LIMIT"
		if overLimit.Load() {
			status = "OVER_LIMIT"
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"responses":[{"status":%q,"limit":"1125899906842624","remaining":"1125899906842621","reset_time":"1796019847791","error":"","metadata":{}}]}`, status)
	}))
	defer srv.Close()
	args := []string{"bench", "--mode", "gubernator", "--units", "3", "--concurrency", "2", "--duration", "200ms", "--warmup", "0s", "--progress=false"}
	code, out, errOut := cli(t, srv.URL, args...)
	wantExit(t, exitOK, code, out, errOut)
	if ops, _ := strconv.Atoi(benchRow(t, out, "ops")); ops == 0 || benchRow(t, out, "errors") != "0" || bad.Load() != 0 {
		t.Fatalf("gubernator baseline (%d malformed requests of %d):\n%s", bad.Load(), calls.Load(), out)
	}
	overLimit.Store(true)
	code, out, errOut = cli(t, srv.URL, args...)
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(out, "OVER_LIMIT") {
		t.Fatalf("an OVER_LIMIT answer was not reported:\n%s", out)
	}
}

// --subjects N prefills an account for every subject before it measures,
// and --addrs spreads the callers over several servers.
func TestBenchPrefillAndAddrs(t *testing.T) {
	first, second := startInProcess(t), startInProcess(t)
	code, out, errOut := cli(t, first, "bench", "--concurrency", "4", "--duration", "200ms", "--warmup", "0s",
		"--progress=false", "--subjects", "600")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(errOut, "prefilled 600 subjects") {
		t.Fatalf("no prefill report:\n%s", errOut)
	}
	code, out, errOut = cli(t, first, "account", "--subject", "bench-599", "--route", "bench.reserve")
	wantExit(t, exitOK, code, out, errOut)
	// An interrupted prefill resumes where it stopped.
	code, out, errOut = cli(t, first, "bench", "--concurrency", "4", "--duration", "500ms", "--warmup", "0s",
		"--progress=false", "--subjects", "700", "--prefill-from", "600")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(errOut, "prefilled 100 subjects") {
		t.Fatalf("no resumed prefill report:\n%s", errOut)
	}
	code, out, errOut = cli(t, first, "account", "--subject", "bench-699", "--route", "bench.reserve")
	wantExit(t, exitOK, code, out, errOut)
	// Prefill reservations have fixed ids: on a fresh server, a prefill
	// from 600 leaves subject 0 without one and gives subject 600 its own.
	fresh := startInProcess(t)
	code, out, errOut = cli(t, fresh, "bench", "--concurrency", "1", "--duration", "500ms", "--warmup", "0s",
		"--progress=false", "--subjects", "700", "--prefill-from", "600")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, fresh, "get", "prefill-bench.reserve-600")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, fresh, "get", "prefill-bench.reserve-0")
	wantExit(t, 3, code, out, errOut)
	code, out, errOut = cli(t, first, "bench", "--subjects", "700", "--prefill-from", "701")
	wantExit(t, exitUsage, code, out, errOut)

	// Servers of their own stores here (replicas would share one): the
	// bench policy is published through the first address only, so the
	// second lacks it and its callers' errors are counted by reason.
	code, out, errOut = cli(t, first, "bench", "--addrs", first+","+second, "--concurrency", "4", "--duration", "300ms",
		"--warmup", "0s", "--progress=false", "--subjects", "1")
	wantExit(t, exitOK, code, out, errOut)
	if benchRow(t, out, "errors") == "0" || benchRow(t, out, "errors NO_POLICY") != benchRow(t, out, "errors") {
		t.Fatalf("want the second server's NO_POLICY errors, counted by reason:\n%s", out)
	}
	code, out, errOut = cli(t, second, "bench", "--concurrency", "1", "--duration", "50ms", "--warmup", "0s", "--progress=false")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, first, "bench", "--addrs", first+","+second, "--concurrency", "4", "--duration", "300ms",
		"--warmup", "0s", "--progress=false", "--subjects", "1")
	wantExit(t, exitOK, code, out, errOut)
	if e := benchRow(t, out, "errors"); e != "0" {
		t.Fatalf("errors %s:\n%s", e, out)
	}
	// Both servers served reserves: the second has the hot subject's account.
	code, out, errOut = cli(t, second, "account", "--subject", "bench-0", "--route", "bench.reserve")
	wantExit(t, exitOK, code, out, errOut)
}

// A measured window shorter than the first calls (as on a loaded machine,
// where the first calls also open the connections) goes on until a call
// has finished, instead of ending with nothing measured and bench failing
// with "no operation finished".
func TestBenchWindowWaitsForAFinishedCall(t *testing.T) {
	cfg := &benchConfig{mode: "reserve", concurrency: 2, duration: 20 * time.Millisecond}
	var calls atomic.Int64
	res := drive(context.Background(), &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}, cfg,
		func(ctx context.Context, w *benchWorker) (int, error) {
			calls.Add(1)
			time.Sleep(300 * time.Millisecond) // 15 times --duration
			return 1, nil
		})
	if res.ops == 0 || len(res.latencies) == 0 || res.firstErr != nil {
		t.Fatalf("a window in which the first calls outlast --duration measured %d ops (%d latencies, error %v) of %d calls begun",
			res.ops, len(res.latencies), res.firstErr, calls.Load())
	}
}

// --rate paces all callers together: over a window of 1 s at 40 ops a
// second, 8 callers whose calls take no time make about 40 calls, not the
// millions a closed loop would. (Only the upper bound is asserted: a slow
// machine may make fewer, never more than the schedule allows.)
func TestBenchRatePacesAllCallers(t *testing.T) {
	cfg := &benchConfig{mode: "reserve", concurrency: 8, duration: time.Second, rate: 40}
	var calls atomic.Int64
	res := drive(context.Background(), &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}, cfg,
		func(ctx context.Context, w *benchWorker) (int, error) {
			calls.Add(1)
			return 1, nil
		})
	// The window ends at the first 100 ms tick past 1 s; the schedule
	// allows one call per 25 ms from the start, plus one per caller
	// already due when the window ends.
	if n := calls.Load(); n == 0 || n > 40*12/10+int64(cfg.concurrency) {
		t.Fatalf("--rate 40 for 1 s made %d calls (%d measured ops)", n, res.ops)
	}
	code, out, errOut := cli(t, "127.0.0.1:1", "bench", "--rate", "-1")
	wantExit(t, exitUsage, code, out, errOut)
}
