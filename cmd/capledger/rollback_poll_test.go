package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// drainPollGate is a reverse proxy in front of a server (a load balancer)
// that passes the first answered DrainProgress polls, then answers every
// later one 503, as a balancer does whose backends all went away; every
// other call goes through.
type drainPollGate struct {
	answered int64 // DrainProgress polls passed before the 503s
	polls    atomic.Int64
	url      string
}

func newDrainPollGate(t *testing.T, target string, answered int64) *drainPollGate {
	g := &drainPollGate{answered: answered}
	g.url = proxyDrainPolls(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		if g.polls.Add(1) > g.answered {
			http.Error(w, "no healthy upstream", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	return g
}

// proxyDrainPolls starts a reverse proxy in front of the server at target
// and returns its URL: DrainProgress calls go to drain, given the proxy
// to pass them on; every other call goes straight through.
func proxyDrainPolls(t *testing.T, target string, drain func(w http.ResponseWriter, r *http.Request, proxy http.Handler)) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/DrainProgress") {
			proxy.ServeHTTP(w, r)
			return
		}
		drain(w, r, proxy)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// cliWithin is cli with a bound on how long the command may run: a
// follow that never ends is cut off at within (its exit code then says
// interrupted, not what the test wants).
func cliWithin(t *testing.T, within time.Duration, url string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var stdout, stderr lockedBuffer
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string {
		if k == "CAPLEDGER_ADDR" {
			return url
		}
		return ""
	}}
	code := run(ctx, e, args)
	return code, stdout.String(), stderr.String()
}

// `rollback GEN --wait` whose rollback was answered but whose very first
// drain poll finds the server unavailable ends at once with exit 5: the
// rollback's own answer is no poll answered (rollback --help: "a server
// unavailable after the first answer is polled again"). Once a poll has
// answered, an unavailable server is polled again every --interval,
// each failure shown, and the follow gives up with exit 5 at --max-wait.
// The gate counts the bar's read-only start too (one DrainProgress before
// the first poll; it failing changes nothing).
func TestRollbackWaitPollsAgainOnlyAfterAPollAnswered(t *testing.T) {
	server := startInProcess(t)
	publishTwoGenerations(t, server)
	code, out, errOut := cli(t, server, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100", "--id", "hold")
	wantExit(t, exitOK, code, out, errOut)

	// Generation 2 holds the reservation: it does not drain while followed.
	// Both the bar's start and the first poll find the server unavailable.
	first := newDrainPollGate(t, server, 0)
	code, out, errOut = cliWithin(t, 20*time.Second, first.url, "rollback", "2", "--wait", "--interval", "50ms", "--max-wait", "5s", "--timeout", "2s")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(out, "rolled back generation 2 of tenant-7/chat.generate@global") || first.polls.Load() != 2 ||
		strings.Contains(errOut, "poll failed") || !strings.Contains(errOut, "unavailable") {
		t.Fatalf("a first drain poll that failed after the rollback answered: %d polls, exit %d\nstdout: %s\nstderr: %s",
			first.polls.Load(), code, out, errOut)
	}

	// The bar's start and the first poll answer.
	later := newDrainPollGate(t, server, 2)
	const interval, maxWait = 100 * time.Millisecond, 2 * time.Second
	code, out, errOut = cliWithin(t, 20*time.Second, later.url, "rollback", "--status", "2", "--wait",
		"--interval", interval.String(), "--max-wait", maxWait.String(), "--timeout", "2s")
	wantExit(t, exitUnavailable, code, out, errOut)
	failed := strings.Count(errOut, "poll failed, polling again in 100ms: unavailable")
	// Polls after the first answer are --interval apart: at most one per
	// interval within --max-wait (a slow machine polls less, never more).
	if !strings.Contains(errOut, "100 units left") || failed < 2 || failed > int(maxWait/interval)+1 ||
		later.polls.Load() != int64(failed)+3 {
		t.Fatalf("polls failing after one answered: %d polls, %d failures shown, exit %d\nstdout: %s\nstderr: %s",
			later.polls.Load(), failed, code, out, errOut)
	}
}

// slowDrainPolls is a reverse proxy in front of a server that makes each
// DrainProgress call take at least cost longer (as the passes of a
// generation with a million accounts do) and records when each began and
// ended; every other call goes straight through.
type slowDrainPolls struct {
	cost  time.Duration
	mu    sync.Mutex
	spans [][2]time.Time
	url   string
}

func newSlowDrainPolls(t *testing.T, target string, cost time.Duration) *slowDrainPolls {
	p := &slowDrainPolls{cost: cost}
	p.url = proxyDrainPolls(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		began := time.Now()
		time.Sleep(p.cost)
		proxy.ServeHTTP(w, r)
		p.mu.Lock()
		p.spans = append(p.spans, [2]time.Time{began, time.Now()})
		p.mu.Unlock()
	})
	return p
}

// `rollback --wait` never starts a poll before the previous one ended
// plus as long as it took, whatever --interval: with polls that take
// 300 ms and --interval 10ms, each poll (the bar's read-only start
// included) begins at least its predecessor's duration after that one
// ended. Before, a poll began --interval after the last, so a follow of
// a generation whose passes take a minute kept the server's core busy
// for its whole length.
func TestRollbackWaitPausesAsLongAsAPollTook(t *testing.T) {
	server := startInProcess(t)
	publishTwoGenerations(t, server)
	// Generation 2 holds the reservation: it does not drain while followed.
	code, out, errOut := cli(t, server, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100", "--id", "hold")
	wantExit(t, exitOK, code, out, errOut)

	slow := newSlowDrainPolls(t, server, 300*time.Millisecond)
	code, out, errOut = cliWithin(t, time.Minute, slow.url, "rollback", "2", "--wait", "--interval", "10ms", "--max-wait", "3s", "--timeout", "30s")
	wantExit(t, exitConflict, code, out, errOut)
	if !strings.Contains(errOut, "not drained after 3s") {
		t.Fatalf("the follow did not run to --max-wait:\n%s", errOut)
	}
	slow.mu.Lock()
	defer slow.mu.Unlock()
	if len(slow.spans) < 3 {
		t.Fatalf("%d polls; want the bar's start and at least 2 more", len(slow.spans))
	}
	for i := 1; i < len(slow.spans); i++ {
		prev, next := slow.spans[i-1], slow.spans[i]
		if took, pause := prev[1].Sub(prev[0]), next[0].Sub(prev[1]); pause < took {
			t.Errorf("poll %d began %s after poll %d ended, which took %s", i+1, pause, i, took)
		}
	}
}

// publishTwoGenerations publishes generations 1 and 2 of tenant-7's
// chat.generate policy through the CLI (maxOverdraft 0, then 100).
func publishTwoGenerations(t *testing.T, server string) {
	t.Helper()
	dir := t.TempDir()
	for _, overdraft := range []string{"0", "100"} {
		path := filepath.Join(dir, "policy"+overdraft+".yaml")
		body := "subject: tenant-7\nroute: chat.generate\nholdTTL: 1h\n" +
			"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 1\n    refillInterval: 1h\n    maxOverdraft: " + overdraft + "\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, server, "policy", "publish", path)
		wantExit(t, exitOK, code, out, errOut)
	}
}
