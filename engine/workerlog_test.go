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

// unreachableStore fails, while fail is set, the first read of the
// expiry worker, the retention worker and the resolver: a store that is
// down for them.
type unreachableStore struct {
	*memstore.Store
	fail atomic.Bool
}

var errUnreachable = errors.New("failed to connect to `host=127.0.0.1`: dial error: connection refused")

func (s *unreachableStore) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	if s.fail.Load() {
		return nil, errUnreachable
	}
	return s.Store.ReservationsDue(ctx, now, limit)
}

func (s *unreachableStore) ReservationsFinished(ctx context.Context, before time.Time, limit int) ([]string, error) {
	if s.fail.Load() {
		return nil, errUnreachable
	}
	return s.Store.ReservationsFinished(ctx, before, limit)
}

func (s *unreachableStore) CheckpointLast(ctx context.Context) (ledger.Checkpoint, bool, error) {
	if s.fail.Load() {
		return ledger.Checkpoint{}, false, errUnreachable
	}
	return s.Store.CheckpointLast(ctx)
}

func (s *unreachableStore) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	if s.fail.Load() {
		return nil, errUnreachable
	}
	return s.Store.ReservationsUnknown(ctx, f)
}

// A worker that fails every tick (the store is down) logs its first
// failure, then at most once per period (30 s) with a count and how long
// it has been failing, and once when it works again: not four lines a
// second.
func TestFailingExpiryWorkerLogsOncePerPeriod(t *testing.T) {
	st := &unreachableStore{Store: memstore.New()}
	logger, logs := logcapture.New()
	e := New(st, Options{DisableWorkers: true, Logger: logger})
	defer e.Close()
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	e.failLog.now = func() time.Time { return now }
	failingLines(t, st, &now, logs, "expiry worker", func() { e.runDue(ctx) })
	// A new failure after recovery is logged at once.
	st.fail.Store(true)
	e.runDue(ctx)
	e.runDue(ctx)
	if n := logs.Count(`msg="expiry worker"`); n != 3 {
		t.Fatalf("a new outage's first failure: %d lines:\n%s", n, logs.String())
	}
}

// A worker whose batches fail every tick (the disk is full: the expiry
// worker reads what is due, but cannot commit it) logs as often as a
// worker whose reads fail: its own "worker batch" line at most once per
// period, and no "batch failed" line per batch beside it (four a second).
func TestFailingWorkerBatchesLogOncePerPeriod(t *testing.T) {
	st := memstore.New()
	logger, logs := logcapture.New()
	now := time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	e := New(st, Options{DisableWorkers: true, Clock: clock, Logger: logger})
	defer e.Close()
	e.failLog.now = clock // moves once, before the failures: the 40 ticks are within one period
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

// failingLines drives run (one pass of a worker) against a store that is
// down, ten seconds of passes every 250 ms and one just before the
// period ends, then one at its end, then two after the store is back,
// and checks the worker logged msg as the expiry worker does: its first
// failure, one line at the period counting the failures since, and one
// recovery line.
func failingLines(t *testing.T, st *unreachableStore, clock *time.Time, logs *logcapture.Logs, msg string, run func()) {
	t.Helper()
	start := *clock
	st.fail.Store(true)
	for range 40 {
		run()
		*clock = clock.Add(250 * time.Millisecond)
	}
	*clock = start.Add(workerLogEvery - time.Millisecond)
	run()
	if n := logs.Count(fmt.Sprintf("msg=%q", msg)); n != 1 {
		t.Fatalf("%d %q lines for 41 failed passes within the period, want 1:\n%s", n, msg, logs.String())
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, fmt.Sprintf("msg=%q", msg)) && !strings.Contains(line, " err=") {
			t.Fatalf("a failure line without the store's error: %s", line)
		}
	}
	*clock = start.Add(workerLogEvery)
	run()
	if n := logs.Count(fmt.Sprintf("msg=%q", msg)); n != 2 || logs.Count("failures_since_last_log=41 failing_for=30s") != 1 {
		t.Fatalf("after the period: want a second %q line counting 41 failures in 30s:\n%s", msg, logs.String())
	}
	st.fail.Store(false)
	*clock = clock.Add(5 * time.Second)
	run()
	run()
	if n := logs.Count(fmt.Sprintf("msg=%q failures=42 failed_for=35s", msg+" recovered")); n != 1 {
		t.Fatalf("want one %q recovery line:\n%s", msg, logs.String())
	}
}

// The retention and compaction workers and the resolver, whose store
// reads fail at every pass while the store is down, log as rarely as the
// expiry worker: a line at the first failure, one a period, one on
// recovery.
func TestFailingRetentionCompactionAndResolverLogOncePerPeriod(t *testing.T) {
	ctx := context.Background()
	t.Run("retention", func(t *testing.T) {
		st := &unreachableStore{Store: memstore.New()}
		logger, logs := logcapture.New()
		e := New(st, Options{DisableWorkers: true, Logger: logger, Retention: time.Hour})
		defer e.Close()
		now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		e.failLog.now = func() time.Time { return now }
		failingLines(t, st, &now, logs, "retention worker", func() {
			if err := e.RunRetention(ctx); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("compaction", func(t *testing.T) {
		st := &unreachableStore{Store: memstore.New()}
		logger, logs := logcapture.New()
		e := New(st, Options{DisableWorkers: true, Logger: logger, Compaction: &CompactionOptions{}})
		defer e.Close()
		now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		e.failLog.now = func() time.Time { return now }
		failingLines(t, st, &now, logs, "compaction: last checkpoint", func() { e.runCompaction(ctx) })
	})
	t.Run("resolver", func(t *testing.T) {
		st := &unreachableStore{Store: memstore.New()}
		logger, logs := logcapture.New()
		commit := func(context.Context, []ledger.Command) ([]ledger.Result, error) {
			return nil, errors.New("nothing to commit here")
		}
		r := NewResolver(st, ResolverOptions{}, time.Now, commit, logger)
		now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
		r.fails.now = func() time.Time { return now }
		failingLines(t, st, &now, logs, "resolver: read backlog", func() { r.ScanWhile(ctx, nil) })
	})
}
