package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/client"
)

// memOperations is a gateway's operation records in memory: the
// client.OperationStore its operation-status endpoint answers from.
type memOperations struct {
	mu   sync.Mutex
	recs map[string]client.OperationRecord
}

func (m *memOperations) Put(_ context.Context, rec client.OperationRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[rec.OperationID] = rec
	return nil
}

func (m *memOperations) Get(_ context.Context, operationID string) (client.OperationRecord, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.recs[operationID]
	return rec, ok, nil
}

// The kinds of unknown work TestUnknownWorkIsClaimedOnceAcrossAKill
// races: what its gateway does and what the gateway's operation-status
// endpoint tells the resolver.
const (
	unknownSettledByBoth = iota // marked unknown, settled by the gateway too: the resolver and the gateway race
	unknownFinished             // marked unknown; the endpoint answers finished
	unknownNeverStarted         // marked unknown; the endpoint answers never started (zero)
	unknownRunning              // left started: the execution-limit worker marks it; the endpoint answers running, later finished
	unknownKinds
)

// unknownWork is one reservation of the race.
type unknownWork struct {
	id, op string
	kind   int
	usage  int64 // what the operation used (0 for never started)
}

// TestUnknownWorkIsClaimedOnceAcrossAKill races the USAGE_UNKNOWN
// resolver's claims (it reads the backlog and settles each reservation
// with what the route's operation-status endpoint, client's
// OperationStatusHandler, answers) with gateways' Start and
// MarkUsageUnknown calls, the execution-limit worker's markings and
// gateways' own settles, on 240 holds of 10 tokens (a burst of exactly
// 2400), and kills serve with SIGKILL at a seeded random point of it. A
// gateway sends each Start and MarkUsageUnknown at once (the mark is
// sent again once the start is answered when it came first), a Start
// again after the mark, and for a quarter of the work its own Settle
// with the usage the endpoint also reports. After the restart every
// gateway sends all its calls again, each answered as a replay or as
// what a resolver's settle meanwhile made of it. Then: every reservation
// whose operation finished or never started is SETTLED with its usage;
// the running ones stay USAGE_UNKNOWN with their holds reserved (the
// resolver asked and heard "running"; a release is refused), then settle
// once the endpoint reports them finished. Nothing is settled twice
// (spent is the sum of the usages, reserved 0, available the rest),
// nothing is lost, and the audit of the stopped store is clean.
func TestUnknownWorkIsClaimedOnceAcrossAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	onEachStore(t, testUnknownWorkIsClaimedOnceAcrossAKill)
}

func testUnknownWorkIsClaimedOnceAcrossAKill(t *testing.T, fs faultStore) {
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	const (
		n       = 240
		hold    = 10
		subject = "tenant-race"
	)
	ops := &memOperations{recs: map[string]client.OperationRecord{}}
	secret := []byte("unknown-race-secret-0123456789")
	endpoint := httptest.NewServer(client.OperationStatusHandler(ops, secret))
	t.Cleanup(endpoint.Close)
	cfgDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(cfgDir, "race.secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`{"interval":"100ms","minBackoff":"100ms","maxBackoff":"300ms","timeout":"2s",
	  "routes":{"race":{"statusUrl":%q,"secretFile":"race.secret"}}}`, endpoint.URL)
	if err := os.WriteFile(filepath.Join(cfgDir, "resolver.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := fs.serveArgs("--resolver-config", filepath.Join(cfgDir, "resolver.json"))

	srv := startServer(t, bin, dir, serve...)
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":"race","holdTtl":"3600s","executionLimit":"1s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, n*hold))
	work := make([]unknownWork, n)
	for i := range work {
		w := unknownWork{id: fmt.Sprintf("race-%03d", i), op: fmt.Sprintf("op-race-%03d", i), kind: i % unknownKinds, usage: int64(i % (hold + 1))}
		if w.kind == unknownNeverStarted {
			w.usage = 0
		}
		work[i] = w
	}
	reserveInBatches(t, srv.url, n, func(i int) string {
		return fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"race","units":{"tokens":%d}}`, work[i].id, subject, hold)
	})
	record := func(w unknownWork, status string) {
		rec := client.OperationRecord{OperationID: w.op, ReservationID: w.id, Status: status}
		if status == client.OperationFinished {
			rec.ActualUnits = client.Units{"tokens": w.usage}
		}
		ops.Put(context.Background(), rec)
	}
	for _, w := range work {
		switch w.kind {
		case unknownNeverStarted:
			record(w, client.OperationNeverStarted)
		case unknownRunning:
			record(w, client.OperationRunning)
		default:
			record(w, client.OperationFinished)
		}
	}

	first := srv
	// resolverFirst counts the gateways' first settles (before the kill)
	// answered as replays: the resolver's claim settled first.
	var resolverFirst atomic.Int64
	var beforeKill atomic.Bool
	beforeKill.Store(true)
	// gateway sends w's calls; it returns false once a call got no
	// answer (serve killed), and calls marked after each acknowledged
	// mark.
	gateway := func(url string, w unknownWork, marked func()) bool {
		startBody := fmt.Sprintf(`{"reservationId":%q,"operationId":%q}`, w.id, w.op)
		startOnce := func() bool {
			status, out := post(crashClient, url, "Start", startBody)
			if status == 0 {
				return false
			}
			r := asMap(out["reservation"])
			switch state := fmt.Sprint(r["state"]); {
			case status != 200 || r["operationId"] != w.op:
				t.Errorf("start of %s: %d %v", w.id, status, out)
			case state != "RESERVATION_STATE_STARTED" && state != "RESERVATION_STATE_USAGE_UNKNOWN" && state != "RESERVATION_STATE_SETTLED":
				t.Errorf("start of %s: %s, want STARTED, or USAGE_UNKNOWN or SETTLED on a replay", w.id, state)
			}
			return true
		}
		if w.kind == unknownRunning {
			return startOnce()
		}
		started := make(chan bool, 1)
		go func() { started <- startOnce() }()
		startAnswered := sync.OnceValue(func() bool { return <-started })
		for tries := 0; ; tries++ {
			status, out := post(crashClient, url, "MarkUsageUnknown", fmt.Sprintf(`{"reservationId":%q}`, w.id))
			if status == 0 {
				startAnswered()
				return false
			}
			if status == 400 && reasonOf(out) == "RESERVATION_NOT_STARTED" && tries == 0 {
				// Ahead of its start: sent again once the start is answered.
				if !startAnswered() {
					return false
				}
				continue
			}
			if (status != 200 || asMap(out["reservation"])["state"] != "RESERVATION_STATE_USAGE_UNKNOWN") &&
				(status != 400 || reasonOf(out) != "RESERVATION_ALREADY_SETTLED") {
				t.Errorf("mark of %s unknown: %d %v, want USAGE_UNKNOWN or RESERVATION_ALREADY_SETTLED", w.id, status, out)
			}
			break
		}
		if !startAnswered() {
			return false
		}
		marked()
		// A start sent again (its first answer lost, as far as the
		// gateway knows) meets the work unknown or settled.
		if !startOnce() {
			return false
		}
		if w.kind != unknownSettledByBoth {
			return true
		}
		status, out := post(crashClient, url, "Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":%q,"actualUnits":{"tokens":%d}}`, w.id, w.op, w.usage))
		if status == 0 {
			return false
		}
		if out["replayed"] == true && beforeKill.Load() {
			resolverFirst.Add(1)
		}
		if status != 200 || fmt.Sprint(asMap(asMap(out["reservation"])["actualUnits"])["tokens"]) != fmt.Sprint(w.usage) && w.usage != 0 {
			t.Errorf("settle of %s by its gateway: %d %v, want settled (or a replay) with %d tokens", w.id, status, out, w.usage)
		}
		return true
	}

	// The race, killed once killAt marks were acknowledged.
	killAt := n/4 + rng.IntN(n/2)
	var marks atomic.Int64
	var killOnce sync.Once
	kill := func() {
		killOnce.Do(func() {
			first.cmd.Process.Signal(syscall.SIGKILL)
			first.cmd.Wait()
		})
	}
	var done atomic.Int64
	parallelN(16, n, func(i int) {
		if gateway(first.url, work[i], func() {
			if marks.Add(1) == int64(killAt) {
				kill()
			}
		}) {
			done.Add(1)
		}
	})
	kill()
	beforeKill.Store(false)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("killed after %d marks acknowledged; %d of %d gateways had done all their calls", killAt, done.Load(), n)

	srv = startServer(t, bin, dir, serve...)
	parallelN(16, n, func(i int) {
		if !gateway(srv.url, work[i], func() {}) {
			t.Errorf("%s: a call after the restart got no answer", work[i].id)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	state := func(w unknownWork) (string, string) {
		r := asMap(mustPost(t, srv.url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, w.id))["reservation"])
		return fmt.Sprint(r["state"]), fmt.Sprint(asMap(r["actualUnits"])["tokens"])
	}
	// settled waits until every reservation of work whose endpoint
	// reports it finished or never started is settled, then checks each:
	// settled with its usage, or (still running) USAGE_UNKNOWN.
	settled := func(running bool) {
		t.Helper()
		var waiting string
		waitUntil(t, time.Minute, func() string { return "still waiting: " + waiting }, func() bool {
			for _, w := range work {
				want := "RESERVATION_STATE_SETTLED"
				if running && w.kind == unknownRunning {
					want = "RESERVATION_STATE_USAGE_UNKNOWN" // the execution-limit worker marks it
				}
				st, _ := state(w)
				if want != "RESERVATION_STATE_SETTLED" && st == "RESERVATION_STATE_SETTLED" {
					t.Fatalf("%s: settled while its operation is still running: its hold was not kept", w.id)
				}
				if st != want {
					waiting = fmt.Sprintf("%s %s, want %s", w.id, st, want)
					return false
				}
			}
			return true
		})
		for _, w := range work {
			st, used := state(w)
			switch {
			case running && w.kind == unknownRunning:
				if st != "RESERVATION_STATE_USAGE_UNKNOWN" {
					t.Errorf("%s, running: %s, want USAGE_UNKNOWN (held)", w.id, st)
				}
			case used != fmt.Sprint(w.usage) && (w.usage != 0 || used != "<nil>"):
				t.Errorf("%s: settled with %s tokens, want %d", w.id, used, w.usage)
			}
		}
	}
	terms := func(reserved, spent int64) {
		t.Helper()
		tm := routeTerms(t, srv.url, subject, "race")
		checkConservation(t, subject, tm)
		if m := tm["tokens"]; m["reserved"] != reserved || m["spent"] != spent || m["available"] != n*hold-reserved-spent {
			t.Errorf("%s: %v, want reserved %d, spent %d, available %d", subject, m, reserved, spent, n*hold-reserved-spent)
		}
	}
	var running []string
	var spent, spentRunning int64
	for _, w := range work {
		if w.kind == unknownRunning {
			running = append(running, w.id)
			spentRunning += w.usage
		} else {
			spent += w.usage
		}
	}
	settled(true)
	terms(int64(len(running))*hold, spent)
	// The resolver claimed the running work, heard "running", and left
	// it held: a release is refused.
	heard := map[string]string{}
	waitUntil(t, time.Minute, func() string { return fmt.Sprintf("the resolver's last answers: %v", heard) }, func() bool {
		answers := mustPost(t, srv.url, "ConsoleService/GetResolverAnswers", `{"reservationIds":["`+strings.Join(running, `","`)+`"]}`)
		list, _ := answers["answers"].([]any)
		for _, a := range list {
			heard[fmt.Sprint(asMap(a)["reservationId"])] = fmt.Sprint(asMap(a)["answer"])
		}
		for _, id := range running {
			if heard[id] != "running" {
				return false
			}
		}
		return true
	})
	for _, id := range running {
		if status, out := post(crashClient, srv.url, "Release", fmt.Sprintf(`{"reservationId":%q}`, id)); status != 400 || reasonOf(out) != "RESERVATION_ALREADY_STARTED" {
			t.Errorf("release of running %s: %d %v, want RESERVATION_ALREADY_STARTED", id, status, out)
		}
	}
	terms(int64(len(running))*hold, spent)
	// The running work finishes: the resolver settles it, once.
	for _, w := range work {
		if w.kind == unknownRunning {
			record(w, client.OperationFinished)
		}
	}
	settled(false)
	terms(0, spent+spentRunning)
	t.Logf("%d gateway settles before the kill met the resolver's settle; /metrics after the restart: the resolver settled %v finished and %v never started",
		resolverFirst.Load(), metricValue(t, srv.url, `capledger_resolver_settled_total{answer="finished"}`), metricValue(t, srv.url, `capledger_resolver_settled_total{answer="never_started"}`))
	fs.auditStopped(t, bin, dir, srv)
}

// parallelN calls f for 0..n-1 on workers goroutines.
func parallelN(workers, n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}
