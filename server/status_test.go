package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// /statusz and /metrics show whether the replica runs the workers: on an
// embedded store the process owns the worker lease; with workers disabled
// nobody here runs them.
func TestStatusShowsTheWorkerLeader(t *testing.T) {
	for _, workers := range []bool{true, false} {
		h := newHarness(t, harnessOptions{workers: workers})
		var st server.Status
		for i := 0; ; i++ {
			if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
				t.Fatal(err)
			}
			if st.Workers.Leader || !workers || i > 500 {
				break
			}
			time.Sleep(10 * time.Millisecond) // the first lease attempt runs on its own goroutine
		}
		if !st.Ready || st.Workers.Leader != workers || st.Workers.Self == "" || (workers && st.Workers.Holder != st.Workers.Self) {
			t.Fatalf("workers %v: status %+v", workers, st)
		}
		// The fields API.md names for an embedded store, and no other:
		// the process owns the lease, which never lapses, so there is no
		// leaseExpires; leaderSince only while leading; no leaseError
		// without a failed attempt.
		var raw struct {
			Workers map[string]any `json:"workers"`
		}
		if err := json.Unmarshal([]byte(h.get("/statusz")), &raw); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for k := range raw.Workers {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		wantKeys := "fence,health,leader,self"
		if workers {
			wantKeys = "fence,health,holder,leader,leaderSince,self"
			if raw.Workers["fence"] != 1.0 {
				t.Errorf("embedded store: fence %v, want 1", raw.Workers["fence"])
			}
		}
		if got := strings.Join(keys, ","); got != wantKeys {
			t.Errorf("workers %v: /statusz workers has %s, want %s (docs/API.md)", workers, got, wantKeys)
		}
		want := "capledger_worker_leader 0"
		if workers {
			want = "capledger_worker_leader 1"
		}
		if got := grep(h.get("/metrics"), "capledger_worker_leader"); !strings.Contains(got, want) {
			t.Fatalf("workers %v: metrics %q, want %q", workers, got, want)
		}
	}
}

// /statusz shows the retention and compaction blocks only where they are
// configured (docs/API.md: unless serve --compaction 0 / --retention 0):
// a replica with retention off must not show a retention worker whose
// passes stay at 0, which reads as a stuck one. No pass is under way
// here, so none is shown.
func TestStatusShowsOnlyTheMaintenanceThatIsOn(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		h := newHarness(t, harnessOptions{retention: retention})
		var st map[string]any
		if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
			t.Fatal(err)
		}
		if _, ok := st["compaction"]; ok {
			t.Fatalf("retention %s, compaction off: /statusz shows compaction: %v", retention, st)
		}
		r, ok := st["retention"].(map[string]any)
		if ok != (retention > 0) {
			t.Fatalf("retention %s: /statusz retention %v", retention, st["retention"])
		}
		if _, running := r["passRunningSeconds"]; running {
			t.Fatalf("no pass under way, /statusz shows one: %v", r)
		}
	}
}

// A replica that does not hold the worker lease still shows the retention
// block of its configured worker, with what it counted itself: 0 when it
// never led (docs/API.md, OPERATIONS.md "Checking it works": read the
// holder's). Hiding it there would contradict the docs' "unless serve
// --retention 0".
func TestStatusShowsRetentionOnAReplicaThatDoesNotLead(t *testing.T) {
	h := newHarness(t, harnessOptions{workers: false, retention: time.Hour})
	var st server.Status
	if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
		t.Fatal(err)
	}
	if st.Workers.Leader {
		t.Fatalf("workers disabled, yet this replica leads: %+v", st.Workers)
	}
	if st.Retention == nil {
		t.Fatalf("retention on, replica not leading: /statusz has no retention block")
	}
	if r := *st.Retention; r.Passes != 0 || r.Retired != 0 || r.LastPassAt != nil {
		t.Fatalf("a replica that never led shows retention passes of its own: %+v", r)
	}
}

// /metrics carries the retention and compaction counters /statusz shows,
// so that an alert can see retention fall behind; only for the workers
// that are on.
func TestMetricsShowRetention(t *testing.T) {
	off := newHarness(t, harnessOptions{})
	if got := grep(off.get("/metrics"), "capledger_retention_"); got != "" {
		t.Fatalf("retention off, /metrics shows %q", got)
	}
	h := newHarness(t, harnessOptions{retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("gone-soon", 600), "")
	h.ok("Release", `{"reservationId":"gone-soon"}`, "")
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	metrics := h.get("/metrics")
	for _, want := range []string{
		"capledger_retention_passes_total 1",
		`capledger_retention_removed_total{kind="reservation"} 1`,
		`capledger_retention_removed_total{kind="tombstone"} 0`,
		"capledger_retention_failed_total 0",
		"capledger_retention_pass_running_seconds 0",
		"capledger_retention_last_pass_seconds ",
	} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, grep(metrics, "capledger_retention_"))
		}
	}
	if got := grep(metrics, "capledger_compaction_"); got != "" {
		t.Fatalf("compaction off, /metrics shows %q", got)
	}
}

// /statusz's ready is /readyz's answer (capledger status exits 5 on it):
// a replica /readyz takes out of rotation, here by its ReadyCheck (as a
// PostgreSQL primary whose replication is at risk), must not call itself
// ready on /statusz, and is ready on both again when the check passes.
func TestStatusReadyIsReadyz(t *testing.T) {
	var risk atomic.Pointer[error]
	h := newHarness(t, harnessOptions{ready: func(context.Context) (string, error) {
		if err := risk.Load(); err != nil {
			return "", *err
		}
		return "primary, 1 synchronous standby", nil
	}})
	status := func() server.Status {
		var st server.Status
		if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); !st.Ready || st.ReadyError != "" {
		t.Fatalf("ready store and check: status %+v", st)
	}
	atRisk := errors.New("replication at risk: no synchronous standby")
	risk.Store(&atRisk)
	resp, err := http.Get(h.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz with the check failing: %d", resp.StatusCode)
	}
	if st := status(); st.Ready || !strings.Contains(st.ReadyError, "replication at risk") {
		t.Fatalf("statusz while /readyz answers 503: ready %v, readyError %q", st.Ready, st.ReadyError)
	}
	risk.Store(nil)
	if st := status(); !st.Ready || st.ReadyError != "" {
		t.Fatalf("after the check passes again: status %+v", st)
	}
}

// subjectIndexStore is a console store whose subject index reports a
// given status (a SQLite store catching up cannot be made to from here).
type subjectIndexStore struct {
	store.ConsoleStore
	status store.SubjectIndexStatus
}

func (s subjectIndexStore) SubjectIndexStatus() store.SubjectIndexStatus { return s.status }

// /statusz and /metrics show the store's subject index where the store
// has one written behind the commits (SQLite): an operator whose console
// listings answer 503 sees the catch-up from the journal under way, and
// an alert can watch it; other stores show no such block.
func TestStatusShowsTheSubjectIndex(t *testing.T) {
	statusOf := func(url string) map[string]any {
		t.Helper()
		resp, err := http.Get(url + "/statusz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	metricsOf := func(url string) string {
		t.Helper()
		resp, err := http.Get(url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	h := newHarness(t, harnessOptions{}) // SQLite
	if got, ok := statusOf(h.url)["subjectIndex"].(map[string]any); !ok || got["catchingUp"] != false || got["catchUps"] != 0.0 {
		t.Errorf("SQLite: /statusz subjectIndex %v, want catchingUp false, catchUps 0", got)
	}
	if got := metricsOf(h.url); !strings.Contains(got, "\ncapledger_subject_index_catching_up 0\n") {
		t.Errorf("SQLite: /metrics lacks capledger_subject_index_catching_up 0:\n%s", grep(got, "capledger_subject_index_"))
	}

	cs := h.store.(store.ConsoleStore)
	behind := subjectIndexStore{cs, store.SubjectIndexStatus{CatchingUp: true, CatchUps: 2, Pending: 7, LastError: "database or disk is full"}}
	url := serve(t, server.New(h.engine, server.Config{Console: behind}))
	got, _ := statusOf(url)["subjectIndex"].(map[string]any)
	if got["catchingUp"] != true || got["catchUps"] != 2.0 || got["pending"] != 7.0 || got["lastError"] != "database or disk is full" {
		t.Errorf("catching up: /statusz subjectIndex %v", got)
	}
	metrics := metricsOf(url)
	for _, want := range []string{"capledger_subject_index_catching_up 1", "capledger_subject_index_catch_ups_total 2", "capledger_subject_index_pending 7"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("catching up: /metrics lacks %q:\n%s", want, grep(metrics, "capledger_subject_index_"))
		}
	}

	mem := newHarness(t, harnessOptions{faults: true}) // the in-memory store
	if got, ok := statusOf(mem.url)["subjectIndex"]; ok {
		t.Errorf("in-memory store: /statusz shows subjectIndex %v", got)
	}
	if got := grep(metricsOf(mem.url), "capledger_subject_index_"); got != "" {
		t.Errorf("in-memory store: /metrics shows %q", got)
	}
}

// leaseUnreadable is a store whose worker lease row cannot be read, as on
// PostgreSQL when the leases table does not answer while the rest does.
type leaseUnreadable struct{ store.Store }

func (leaseUnreadable) LeaseAcquire(context.Context, string, string, time.Duration) (store.Lease, error) {
	return store.Lease{}, errors.New("lease workers: the leases table does not answer")
}

// A replica whose lease attempts failed before it ever read the lease row
// knows no holder, fence or expiry: /statusz shows no holder and no
// leaseExpires, fence 0 and the error, and /metrics a fence of 0
// (docs/API.md: holder and leaseExpires are absent until the lease was
// first read, not only before the first attempt).
func TestStatusBeforeTheLeaseWasRead(t *testing.T) {
	h := newHarness(t, harnessOptions{workers: true, wrapStore: func(st store.Store) store.Store { return leaseUnreadable{st} }})
	var workers map[string]any
	for i := 0; ; i++ {
		var raw struct {
			Workers map[string]any `json:"workers"`
		}
		if err := json.Unmarshal([]byte(h.get("/statusz")), &raw); err != nil {
			t.Fatal(err)
		}
		workers = raw.Workers
		if _, failed := workers["leaseError"]; failed || i > 500 {
			break
		}
		time.Sleep(10 * time.Millisecond) // the first lease attempt runs on its own goroutine
	}
	var keys []string
	for k := range workers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if got, want := strings.Join(keys, ","), "fence,health,leader,leaseError,self"; got != want {
		t.Fatalf("/statusz workers has %s, want %s: %v", got, want, workers)
	}
	if workers["fence"] != 0.0 || workers["leader"] != false {
		t.Fatalf("lease never read: /statusz workers %v, want fence 0, not leader", workers)
	}
	metrics := h.get("/metrics")
	for _, want := range []string{"capledger_worker_leader 0\n", "capledger_worker_lease_fence 0\n"} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, grep(metrics, "capledger_worker_le"))
		}
	}
}

// A compaction cut its audit refuses shows on /statusz (refusing, since
// when, the next audit) and /metrics (capledger_compaction_refusing 1)
// for as long as it lasts, not only at the pass that audited: the passes
// between audits do not audit again. An operator's Audit that still finds
// the discrepancy changes nothing; once the ledger is repaired, a clean
// Audit through the API (recorded in the store) makes the next pass cut,
// and both show it ended (docs/OPERATIONS.md, "Retention and
// compaction").
func TestStatusShowsARefusedCompaction(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, harnessOptions{compaction: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("before", 100), "")
	if err := h.engine.RunCompaction(ctx); err != nil {
		t.Fatal(err)
	}
	h.ok("Reserve", reserveBody("after", 100), "")
	shift := func(delta int64) {
		t.Helper()
		accounts, err := h.store.AccountList(ctx, ledger.PolicyKey{})
		if err != nil || len(accounts) != 1 {
			t.Fatalf("accounts %v %v", accounts, err)
		}
		a := accounts[0]
		a.Balances[0].Opening += delta
		a.Balances[0].Available += delta
		tx, err := h.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	compaction := func() server.CompactionStatus {
		t.Helper()
		var st server.Status
		if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
			t.Fatal(err)
		}
		if st.Compaction == nil {
			t.Fatal("compaction on, /statusz shows none")
		}
		return *st.Compaction
	}
	shift(1) // behind the journal
	h.clock.Advance(time.Hour)
	if err := h.engine.RunCompaction(ctx); err != nil {
		t.Fatal(err)
	}
	refusedAt := h.clock.Now()
	for _, operatorAudits := range []bool{false, true} {
		if operatorAudits {
			if found := h.ok("Audit", "{}", "")["discrepancies"]; found == nil {
				t.Fatal("the operator's audit of the broken ledger found nothing")
			}
		}
		h.clock.Advance(10 * time.Second) // the next audit is not due yet
		if err := h.engine.RunCompaction(ctx); err != nil {
			t.Fatal(err)
		}
		c := compaction()
		if !c.Refusing || c.Refused != 1 || c.Checkpoints != 1 || c.RefusingSince == nil || !c.RefusingSince.Equal(refusedAt) ||
			c.NextAuditAt == nil || !c.NextAuditAt.After(h.clock.Now()) {
			t.Fatalf("refusing (an operator's dirty audit: %v): /statusz compaction %+v", operatorAudits, c)
		}
		if got := grep(h.get("/metrics"), "capledger_compaction_refus"); !slices.Contains(strings.Split(got, "\n"), "capledger_compaction_refusing 1") ||
			!slices.Contains(strings.Split(got, "\n"), "capledger_compaction_refused_total 1") {
			t.Fatalf("refusing: /metrics %q", got)
		}
		// The refusal is the compaction worker failing, as its log line
		// says, and nothing else is.
		if w := workerHealth(t, h); !w["compaction"].Failing || w["compaction"].FailingSince == nil || w["expiry"].Failing {
			t.Fatalf("refusing: /statusz workers.health %+v", w)
		}
		if got := grep(h.get("/metrics"), "capledger_worker_failing"); !strings.Contains(got, `capledger_worker_failing{worker="compaction"} 1`) ||
			!strings.Contains(got, `capledger_worker_failing{worker="expiry"} 0`) {
			t.Fatalf("refusing: /metrics %q", got)
		}
	}
	shift(-1) // repaired
	if found := h.ok("Audit", "{}", "")["discrepancies"]; found != nil {
		t.Fatalf("the operator's audit of the repaired ledger: %v", found)
	}
	h.clock.Advance(10 * time.Second)
	if err := h.engine.RunCompaction(ctx); err != nil {
		t.Fatal(err)
	}
	if c := compaction(); c.Refusing || c.RefusingSince != nil || c.NextAuditAt != nil || c.Checkpoints != 2 {
		t.Fatalf("after a clean audit: /statusz compaction %+v", c)
	}
	if got := grep(h.get("/metrics"), "capledger_compaction_refusing"); !slices.Contains(strings.Split(got, "\n"), "capledger_compaction_refusing 0") {
		t.Fatalf("after a clean audit: /metrics %q", got)
	}
	if w := workerHealth(t, h); w["compaction"].Failing || w["compaction"].FailingSince != nil {
		t.Fatalf("after a clean audit: /statusz workers.health %+v", w)
	}
	if got := grep(h.get("/metrics"), "capledger_worker_failing"); !strings.Contains(got, `capledger_worker_failing{worker="compaction"} 0`) {
		t.Fatalf("after a clean audit: /metrics %q", got)
	}
}

// workerHealth returns /statusz workers.health.
func workerHealth(t *testing.T, h *harness) map[string]server.WorkerHealthStatus {
	t.Helper()
	var st server.Status
	if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
		t.Fatal(err)
	}
	return st.Workers.Health
}

// A worker whose store fails (the disk is full: the expiry worker reads
// what is due but cannot commit it) shows as failing in /statusz
// (workers.health.expiry, since its first failure) and /metrics
// (capledger_worker_failing{worker="expiry"} 1) on the replica that runs
// it, until a pass works again; every configured worker is listed, and
// the lease, the others not failing.
func TestStatusShowsAFailingWorker(t *testing.T) {
	h := newHarness(t, harnessOptions{workers: true, faults: true, retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("held", 100), "")
	waitFor := func(what string, done func(map[string]server.WorkerHealthStatus) bool) map[string]server.WorkerHealthStatus {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			w := workerHealth(t, h)
			if done(w) {
				return w
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /statusz workers.health %+v", what, w)
			}
		}
	}
	w := waitFor("workers configured", func(w map[string]server.WorkerHealthStatus) bool { return len(w) > 0 })
	if len(w) != 4 || w["expiry"].Failing || w["epochs"].Failing || w["retention"].Failing || w["lease"].Failing {
		t.Fatalf("before the failure: /statusz workers.health %+v, want expiry, epochs, retention, lease, none failing", w)
	}
	before := time.Now()
	h.faults.FailCommits(fmt.Errorf("%w: database or disk is full (13)", store.ErrUnavailable))
	h.clock.Advance(time.Minute) // the hold is due for expiry
	w = waitFor("the expiry worker's batches fail", func(w map[string]server.WorkerHealthStatus) bool { return w["expiry"].Failing })
	if since := w["expiry"].FailingSince; since == nil || since.Before(before.Add(-time.Second)) || since.After(time.Now()) {
		t.Fatalf("failing: /statusz workers.health.expiry %+v, want failingSince now", w["expiry"])
	}
	if got := grep(h.get("/metrics"), "capledger_worker_failing"); !strings.Contains(got, `capledger_worker_failing{worker="expiry"} 1`) ||
		!strings.Contains(got, `capledger_worker_failing{worker="retention"} 0`) {
		t.Fatalf("failing: /metrics %q", got)
	}
	h.faults.FailCommits(nil)
	waitFor("the store is back", func(w map[string]server.WorkerHealthStatus) bool {
		return !w["expiry"].Failing && w["expiry"].FailingSince == nil
	})
	if got := grep(h.get("/metrics"), "capledger_worker_failing"); !strings.Contains(got, `capledger_worker_failing{worker="expiry"} 0`) {
		t.Fatalf("recovered: /metrics %q", got)
	}
}
