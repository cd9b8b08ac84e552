package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
)

// serverProcess is a running `capledger serve`.
type serverProcess struct {
	cmd  *exec.Cmd
	url  string
	logs *lockedBuffer
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var listeningLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startServer runs `capledger serve` on a free loopback port over dataDir
// and waits until it listens.
func startServer(t *testing.T, bin, dataDir string, extra ...string) *serverProcess {
	t.Helper()
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir}, extra...)
	cmd := exec.Command(bin, args...)
	childproc.DieWithParent(cmd)
	p := &serverProcess{cmd: cmd, logs: &lockedBuffer{}}
	// An io.Writer rather than a pipe: Wait then waits until every line
	// was copied, so the last log lines are never lost.
	cmd.Stderr = p.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := listeningLine.FindStringSubmatch(p.logs.String()); m != nil {
			p.url = "http://" + m[1]
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start; logs:\n%s", p.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// post sends one JSON call (method of the LedgerService, or
// "Service/Method" of another capledger.v1 service); status 0 means no
// answer arrived (connection refused or reset, timeout): the outcome is
// unknown to the client.
func post(client *http.Client, url, method, body string) (int, map[string]any) {
	path := "/capledger.v1.LedgerService/" + method
	if strings.Contains(method, "/") {
		path = "/capledger.v1." + method
	}
	resp, err := client.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil
	}
	var out map[string]any
	if json.Unmarshal(raw, &out) != nil {
		return 0, nil
	}
	return resp.StatusCode, out
}

// step is how far a client saw one reservation acknowledged.
type step int

const (
	stepNone step = iota
	stepReserved
	stepStarted
	stepSettled
)

// record is one reservation a load worker attempted, and how far a client
// saw it acknowledged.
type record struct {
	id       string
	subject  string
	reserved int64
	actual   int64
	acked    step
	// settleSent: a settle was sent (acknowledged or not); retention may
	// since have removed the reservation.
	settleSent bool
}

// load runs concurrent gateways against url, each reserving, starting and
// settling (some reservations are left held, some started) until the
// server stops answering or stop is closed. It returns once at least
// minAcks calls were acknowledged (or after a minute); done waits for
// every worker and returns what they attempted.
func load(t *testing.T, url string, minAcks int64) (stop func(), done func() map[string]*record) {
	client := &http.Client{Timeout: 5 * time.Second}
	policy := `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s",
	  "dimensions":[{"unit":"tokens","burst":"100000000","refillUnits":"1000","refillInterval":"1s"},
	                {"unit":"requests","burst":"1000000"}]}}`
	if status, body := post(client, url, "PublishPolicy", policy); status != 200 {
		t.Fatalf("publish: %d %v", status, body)
	}
	const workers = 8
	var mu sync.Mutex
	records := map[string]*record{}
	var acks atomic.Int64
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stopped:
					return
				default:
				}
				r := &record{
					id:       fmt.Sprintf("w%d-%d", w, k),
					subject:  fmt.Sprintf("tenant-%d", (w+k)%5),
					reserved: int64(100 + (w*37+k*11)%400),
				}
				r.actual = r.reserved / 2
				mu.Lock()
				records[r.id] = r
				mu.Unlock()
				ack := func(s step) {
					mu.Lock()
					r.acked = s
					mu.Unlock()
					acks.Add(1)
				}
				// answered reports whether the call was acknowledged; no
				// answer (the server died) or a 503 (it is shutting down)
				// stops the worker, any other answer is a bug.
				answered := func(method, body string) bool {
					status, out := post(client, url, method, body)
					if status != 200 && status != 0 && status != http.StatusServiceUnavailable {
						t.Errorf("%s %s: %d %v", method, r.id, status, out)
					}
					return status == 200
				}
				if !answered("Reserve", fmt.Sprintf(
					`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":%d,"requests":1}}`, r.id, r.subject, r.reserved)) {
					return
				}
				ack(stepReserved)
				if k%3 == 0 {
					continue // leave some reservations held
				}
				if !answered("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, r.id, r.id)) {
					return
				}
				ack(stepStarted)
				if k%3 == 1 {
					continue // leave some started
				}
				if !answered("Settle", fmt.Sprintf(
					`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d,"requests":1}}`, r.id, r.id, r.actual)) {
					return
				}
				ack(stepSettled)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(stopped) }) }
	done = func() map[string]*record {
		stop()
		wg.Wait()
		return records
	}
	// A test that fails before done stops the workers too, before the
	// server (started earlier, so cleaned up later) is killed: a worker's
	// t.Errorf after the test ended would panic and hide the failure.
	t.Cleanup(func() { done() })
	deadline := time.Now().Add(60 * time.Second)
	for acks.Load() < minAcks && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if acks.Load() < minAcks {
		t.Fatalf("only %d acknowledgements within a minute", acks.Load())
	}
	return stop, done
}

// verify checks, on a restarted server, that every acknowledged step is
// stored, every stored reservation is whole and as the client sent it, the
// audit is clean, and retrying the unacknowledged reserves with their ids
// converges (a committed one replays, a lost one is admitted once).
func verify(t *testing.T, url string, records map[string]*record) {
	client := &http.Client{Timeout: 10 * time.Second}
	stateOf := map[step]string{
		stepReserved: "RESERVATION_STATE_RESERVED",
		stepStarted:  "RESERVATION_STATE_STARTED",
		stepSettled:  "RESERVATION_STATE_SETTLED",
	}
	progress := map[string]int{
		"RESERVATION_STATE_RESERVED": 1, "RESERVATION_STATE_STARTED": 2, "RESERVATION_STATE_SETTLED": 3,
	}
	var acked, unackedPresent, unackedAbsent int
	for _, r := range records {
		status, body := post(client, url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, r.id))
		if status == 404 {
			if r.acked != stepNone {
				t.Errorf("%s: acknowledged as %s but missing after the restart", r.id, stateOf[r.acked])
			}
			unackedAbsent++
			continue
		}
		if status != 200 {
			t.Fatalf("get %s: %d %v", r.id, status, body)
		}
		res := body["reservation"].(map[string]any)
		state := res["state"].(string)
		units := res["reservedUnits"].(map[string]any)
		if fmt.Sprint(units["tokens"]) != fmt.Sprint(r.reserved) || fmt.Sprint(units["requests"]) != "1" || res["subject"] != r.subject {
			t.Errorf("%s: stored %v, but the client reserved %d tokens for %s", r.id, res, r.reserved, r.subject)
		}
		if progress[state] < int(r.acked) {
			t.Errorf("%s: acknowledged as %s, but stored as %s", r.id, stateOf[r.acked], state)
		}
		if state == "RESERVATION_STATE_SETTLED" && fmt.Sprint(res["actualUnits"].(map[string]any)["tokens"]) != fmt.Sprint(r.actual) {
			t.Errorf("%s: settled with %v, client sent %d", r.id, res["actualUnits"], r.actual)
		}
		if r.acked == stepNone {
			unackedPresent++
		} else {
			acked++
		}
	}
	status, audit := post(client, url, "Audit", `{}`)
	if status != 200 || audit["discrepancies"] != nil {
		t.Fatalf("audit after the restart: %d %v", status, audit)
	}
	for _, r := range records {
		if r.acked != stepNone {
			continue
		}
		status, body := post(client, url, "Reserve", fmt.Sprintf(
			`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":%d,"requests":1}}`, r.id, r.subject, r.reserved))
		if status != 200 {
			t.Fatalf("retry %s: %d %v", r.id, status, body)
		}
	}
	if status, audit := post(client, url, "Audit", `{}`); status != 200 || audit["discrepancies"] != nil {
		t.Fatalf("audit after retries: %d %v", status, audit)
	}
	t.Logf("%d reservations acknowledged and found, %d unacknowledged but committed, %d unacknowledged and absent",
		acked, unackedPresent, unackedAbsent)
}

// stopGracefully sends SIGTERM and requires exit status 0 and a clean stop
// in the logs.
func stopGracefully(t *testing.T, p *serverProcess) {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("graceful shutdown: %v\n%s", err, p.logs.String())
		}
	case <-ctx.Done():
		t.Fatal("server did not stop after SIGTERM")
	}
	if !strings.Contains(p.logs.String(), "msg=stopped") {
		t.Fatalf("no clean stop in the logs:\n%s", p.logs.String())
	}
}

// TestCrashSafety kills a loaded `capledger serve` with SIGKILL and
// restarts it on the same data directory: every reservation, start and
// settle any client saw acknowledged must be there; a request that was not
// acknowledged is either wholly applied or absent (never half: the audit
// would see reserved, spent or refund terms that disagree with the
// reservations); and the audit finds nothing.
//
// It runs twice: with the default commit (the WAL fsynced inside each
// COMMIT), and with --pipelined-sync (a batch's callers answered after a
// separate fsync, while the next batch commits).
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	bin := buildBinary(t)
	t.Run("default", func(t *testing.T) { testCrashSafety(t, bin) })
	t.Run("pipelined", func(t *testing.T) { testCrashSafety(t, bin, "--pipelined-sync") })
}

func testCrashSafety(t *testing.T, bin string, flags ...string) {
	dataDir := t.TempDir()
	srv := startServer(t, bin, dataDir, flags...)
	stop, done := load(t, srv.url, 600)
	if err := srv.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Wait()
	stop()
	records := done()

	restarted := startServer(t, bin, dataDir, flags...)
	verify(t, restarted.url, records)
	stopGracefully(t, restarted)
}

// TestGracefulShutdownUnderLoad stops a loaded server with SIGTERM: it
// exits 0 after draining, and after a restart everything acknowledged is
// there and the audit is clean.
func TestGracefulShutdownUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two server processes")
	}
	bin := buildBinary(t)
	dataDir := t.TempDir()
	srv := startServer(t, bin, dataDir)
	_, done := load(t, srv.url, 300)
	stopGracefully(t, srv)
	records := done()
	if !strings.Contains(srv.logs.String(), "shutting down: draining in-flight requests") {
		t.Fatalf("no drain in the logs:\n%s", srv.logs.String())
	}
	restarted := startServer(t, bin, dataDir)
	verify(t, restarted.url, records)
}
