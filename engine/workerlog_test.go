package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// unreachableStore fails, while fail is set, the first read of each
// worker (expiry, epochs, retention, compaction, the resolver) and the
// lease renewal with err (errUnreachable unless set): a store that is
// down for them.
type unreachableStore struct {
	*memstore.Store
	fail atomic.Bool
	mu   sync.Mutex
	err  error
}

var errUnreachable = errors.New("failed to connect to `host=127.0.0.1`: dial error: connection refused")

// failure returns the error the store's reads fail with now, nil when
// they work.
func (s *unreachableStore) failure() error {
	if !s.fail.Load() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	return errUnreachable
}

func (s *unreachableStore) failWith(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
}

func (s *unreachableStore) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.ReservationsDue(ctx, now, limit)
}

func (s *unreachableStore) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.PolicyList(ctx)
}

func (s *unreachableStore) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.PolicyPage(ctx, f)
}

func (s *unreachableStore) PolicyListAfter(ctx context.Context, after uint64) ([]ledger.Policy, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.PolicyListAfter(ctx, after)
}

func (s *unreachableStore) ReservationsFinished(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.ReservationsFinished(ctx, before, limit)
}

func (s *unreachableStore) CheckpointLast(ctx context.Context) (ledger.Checkpoint, bool, error) {
	if err := s.failure(); err != nil {
		return ledger.Checkpoint{}, false, err
	}
	return s.Store.CheckpointLast(ctx)
}

func (s *unreachableStore) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	if err := s.failure(); err != nil {
		return nil, err
	}
	return s.Store.ReservationsUnknown(ctx, f)
}

func (s *unreachableStore) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if err := s.failure(); err != nil {
		return store.Lease{}, err
	}
	return s.Store.LeaseAcquire(ctx, name, holder, ttl)
}

// driveFailLogs makes every failLog of e (its workers', the resolver's,
// the lease loop's) read now instead of the wall clock.
func driveFailLogs(e *Engine, now func() time.Time) {
	logs := []*failLog{&e.fails.expiry, &e.fails.epochs, &e.fails.retention, &e.fails.compaction, &e.fails.lease}
	if e.resolver != nil {
		logs = append(logs, &e.resolver.fails)
	}
	for _, f := range logs {
		f.mu.Lock()
		f.now = now
		f.mu.Unlock()
	}
}

// failingSinceOf returns the worker's FailingSince (WorkersHealth).
func failingSinceOf(t *testing.T, e *Engine, name string) time.Time {
	t.Helper()
	for _, h := range e.WorkersHealth() {
		if h.Name == name {
			return h.FailingSince
		}
	}
	t.Fatalf("no worker %q in %+v", name, e.WorkersHealth())
	return time.Time{}
}

// The cadence of a worker's lines while it keeps failing: the
// failing_for of each line after the first, whose passes come every
// 250 ms or 1 s (expiry, the resolver) and every minute (epochs,
// retention, compaction), over an hour.
var (
	cadenceOfFrequentPasses = []string{"30s", "1m30s", "3m30s", "7m30s", "15m30s", "30m30s", "45m30s"}
	cadenceOfMinutePasses   = []string{"1m0s", "2m0s", "4m0s", "8m0s", "16m0s", "31m0s", "46m0s"}
)

// outageLines drives run (one pass of worker) against a store that is
// down for an hour, a pass every every, and checks what an on-call
// engineer sees: the first failure's line at once, then lines at the
// cadence of workerlog.go (want: their failing_for), each with the
// store's error and the worker's name; the worker failing since the
// first failure (failingSince, "" when it is no leader worker); a new
// error text at once, one changing at every pass at most once per
// workerLogFirstGap; one recovery line when the store is back, and the
// worker no longer failing.
func outageLines(t *testing.T, st *unreachableStore, clock *time.Time, logs *logcapture.Logs, worker, msg string,
	every time.Duration, want []string, failingSince func() time.Time, run func()) {
	t.Helper()
	line := fmt.Sprintf("msg=%q", msg)
	start := *clock
	st.fail.Store(true)
	passes := 0
	for ; clock.Sub(start) < time.Hour; *clock = clock.Add(every) {
		run()
		passes++
		if passes == 1 && failingSince != nil && !failingSince().Equal(start) {
			t.Fatalf("%s after its first failure: failing since %v, want %v", worker, failingSince(), start)
		}
	}
	var got []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(l, line) {
			continue
		}
		if !strings.Contains(l, " err=") || !strings.HasSuffix(l, " worker="+worker) {
			t.Fatalf("a failure line without the store's error or the worker's name: %s", l)
		}
		if _, after, ok := strings.Cut(l, " failing_for="); ok {
			got = append(got, strings.Fields(after)[0])
		}
	}
	if n := logs.Count(line); n != len(want)+1 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%d %q lines in an hour of %d failed passes, want %d: the first, then at failing_for %v, got %v:\n%s",
			n, msg, passes, len(want)+1, want, got, logs.String())
	}
	if failingSince != nil && !failingSince().Equal(start) {
		t.Fatalf("%s after an hour of failures: failing since %v, want %v", worker, failingSince(), start)
	}

	// Another error: its line at once. Then a text that changes at every
	// pass (a port number in it), for two minutes: a line per
	// workerLogFirstGap at most.
	before := logs.Count(line)
	st.failWith(errors.New("the database system is shutting down (SQLSTATE 57P03)"))
	run()
	passes++
	if logs.Count(line) != before+1 || logs.Count("57P03") != 1 {
		t.Fatalf("a new error text was not logged at once:\n%s", logs.String())
	}
	changing := 0
	for end := clock.Add(2 * time.Minute); clock.Before(end); changing++ {
		*clock = clock.Add(every)
		st.failWith(fmt.Errorf("read tcp 127.0.0.1:%d->127.0.0.1:5432: connection reset by peer", 40000+changing))
		run()
		passes++
	}
	if n := logs.Count(line) - before - 1; n < 1 || n > 4 {
		t.Fatalf("an error text that changed at each of %d passes over two minutes: %d lines, want 1 to 4 (one per %s):\n%s",
			changing, n, workerLogFirstGap, logs.String())
	}

	st.failWith(nil)
	st.fail.Store(false)
	*clock = clock.Add(every)
	failedFor := clock.Sub(start)
	run()
	run()
	recovered := fmt.Sprintf("msg=%q failures=%d failed_for=%s worker=%s", msg+" recovered", passes, failedFor, worker)
	if n := logs.Count(fmt.Sprintf("msg=%q", msg+" recovered")); n != 1 || logs.Count(recovered) != 1 {
		t.Fatalf("want one recovery line %q:\n%s", recovered, logs.String())
	}
	if failingSince != nil && !failingSince().IsZero() {
		t.Fatalf("%s recovered: still failing since %v", worker, failingSince())
	}
}

// A store outage of an hour: every worker that reads it at each pass
// (the expiry worker four times a second, the resolver every second,
// the epoch, retention and compaction workers every minute) and the
// lease loop (every 5 s) log as workerlog.go's cadence says, not a line
// per pass or per 30 s (hundreds an hour), and show as failing
// (WorkersHealth: /statusz, capledger_worker_failing) from the first
// failure to the recovery.
func TestFailingWorkersLogAtOneCadence(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)
	type setup struct {
		st    *unreachableStore
		e     *Engine
		logs  *logcapture.Logs
		clock *time.Time
	}
	open := func(t *testing.T, opts Options) setup {
		st := &unreachableStore{Store: memstore.New()}
		logger, logs := logcapture.New()
		opts.DisableWorkers, opts.Logger = true, logger
		now := start
		opts.Clock = func() time.Time { return now }
		e := New(st, opts)
		t.Cleanup(func() { e.Close() })
		driveFailLogs(e, func() time.Time { return now })
		return setup{st, e, logs, &now}
	}
	t.Run("expiry", func(t *testing.T) {
		s := open(t, Options{})
		outageLines(t, s.st, s.clock, s.logs, "expiry", "expiry worker", 250*time.Millisecond, cadenceOfFrequentPasses,
			func() time.Time { return failingSinceOf(t, s.e, "expiry") }, func() { s.e.runDue(ctx) })
	})
	t.Run("epochs", func(t *testing.T) {
		s := open(t, Options{})
		outageLines(t, s.st, s.clock, s.logs, "epochs", "epoch worker", time.Minute, cadenceOfMinutePasses,
			func() time.Time { return failingSinceOf(t, s.e, "epochs") }, func() { s.e.runEpochsWhenDue(ctx) })
	})
	t.Run("retention", func(t *testing.T) {
		s := open(t, Options{Retention: time.Hour})
		outageLines(t, s.st, s.clock, s.logs, "retention", "retention worker", time.Minute, cadenceOfMinutePasses,
			func() time.Time { return failingSinceOf(t, s.e, "retention") }, func() {
				if err := s.e.RunRetention(ctx); err != nil {
					t.Fatal(err)
				}
			})
	})
	t.Run("compaction", func(t *testing.T) {
		s := open(t, Options{Compaction: &CompactionOptions{}})
		outageLines(t, s.st, s.clock, s.logs, "compaction", compactionLastLog, time.Minute, cadenceOfMinutePasses,
			func() time.Time { return failingSinceOf(t, s.e, "compaction") }, func() { s.e.runCompaction(ctx) })
	})
	t.Run("resolver", func(t *testing.T) {
		s := open(t, Options{Resolver: &ResolverOptions{}})
		outageLines(t, s.st, s.clock, s.logs, "resolver", "resolver: read backlog", time.Second, cadenceOfFrequentPasses,
			func() time.Time { return failingSinceOf(t, s.e, "resolver") }, func() { s.e.resolver.ScanWhile(ctx, nil) })
	})
	t.Run("lease", func(t *testing.T) {
		s := open(t, Options{})
		outageLines(t, s.st, s.clock, s.logs, "lease", "worker lease", 5*time.Second, cadenceOfFrequentPasses,
			func() time.Time { return failingSinceOf(t, s.e, "lease") }, func() { s.e.renewLease(ctx, DefaultLeaseTTL) })
	})
}

// A worker whose batches fail every tick (the disk is full: the expiry
// worker reads what is due, but cannot commit it) logs as often as a
// worker whose reads fail: its own "worker batch" line at the cadence of
// workerlog.go, and no "batch failed" line per batch beside it (four a
// second).
func TestFailingWorkerBatchesLogAtTheCadence(t *testing.T) {
	st := memstore.New()
	logger, logs := logcapture.New()
	now := time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := New(st, Options{DisableWorkers: true, Clock: clock, Logger: logger})
	defer e.Close()
	driveFailLogs(e, clock) // moves once, before the failures: the 40 ticks are within the first gap
	publish(t, e, 1000, time.Second, 0)
	if res, err := e.Do(context.Background(), reserveCmd("held", 10)); err != nil || res.Err != nil {
		t.Fatalf("reserve: %v %v", err, res.Err)
	}
	mu.Lock()
	now = now.Add(time.Minute) // the hold is due for expiry
	mu.Unlock()
	st.FailCommits(fmt.Errorf("%w: database or disk is full (13)", store.ErrUnavailable))
	for range 40 { // ten seconds of ticks
		e.runDue(context.Background())
	}
	if n := logs.Count(`msg="worker batch"`); n != 1 {
		t.Fatalf("%d worker batch lines for 40 failed ticks, want 1:\n%s", n, logs.String())
	}
	if n := logs.Count(`msg="batch failed"`); n != 0 {
		t.Fatalf("%d batch failed lines for 40 failed worker batches, want none (the worker logs them):\n%s", n, logs.String())
	}
	// A gateway's failed batch is still logged each time.
	if _, err := e.Do(context.Background(), reserveCmd("refused", 10)); err == nil {
		t.Fatal("reserve committed on a store that fails every commit")
	}
	if n := logs.Count(`msg="batch failed"`); n != 1 {
		t.Fatalf("a gateway's failed batch: %d batch failed lines, want 1:\n%s", n, logs.String())
	}
	st.FailCommits(nil)
	e.runDue(context.Background())
	if n := logs.Count(`msg="worker batch recovered" failures=40`); n != 1 {
		t.Fatalf("want one recovery line:\n%s", logs.String())
	}
}

// The cadence counts from the first failure, not from the last line: a
// step that fails every 7 s logs at the first pass after 30 s, 1 m 30 s,
// 3 m 30 s, 7 m 30 s, 15 m 30 s, 30 m 30 s and 45 m 30 s, so a line that
// came a pass late does not put the ones after it later (timed from the
// last line they came at 35 s, 98 s, 224 s, 469 s, ...).
func TestFailLogCadenceCountsFromTheFirstFailure(t *testing.T) {
	f, logs, start, now := clockedFailLog("lease")
	for ; now.Sub(start) < time.Hour; *now = now.Add(7 * time.Second) {
		f.failed("worker lease", errUnreachable)
	}
	want := []string{"35s", "1m31s", "3m30s", "7m35s", "15m31s", "30m34s", "45m30s"}
	if got := failingForOf(logs.String()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lines of a step failing every 7 s at failing_for %v, want %v:\n%s", got, want, logs.String())
	}
}
