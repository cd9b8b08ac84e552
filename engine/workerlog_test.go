package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// dueFailingStore fails ReservationsDue while fail is set: a store that is
// down for the expiry worker.
type dueFailingStore struct {
	*memstore.Store
	fail atomic.Bool
}

func (s *dueFailingStore) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	if s.fail.Load() {
		return nil, errors.New("failed to connect to `host=127.0.0.1`: dial error: connection refused")
	}
	return s.Store.ReservationsDue(ctx, now, limit)
}

// A worker that fails every tick (the store is down) logs its first
// failure, then at most once per period (30 s) with a count and how long
// it has been failing, and once when it works again: not four lines a
// second.
func TestFailingExpiryWorkerLogsOncePerPeriod(t *testing.T) {
	st := &dueFailingStore{Store: memstore.New()}
	logger, logs := logcapture.New()
	e := New(st, Options{DisableWorkers: true, Logger: logger})
	defer e.Close()
	ctx := context.Background()
	start := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	now := start
	e.failLog.now = func() time.Time { return now }
	st.fail.Store(true)
	for range 40 { // ten seconds of ticks
		e.runDue(ctx)
		now = now.Add(250 * time.Millisecond)
	}
	now = start.Add(workerLogEvery - time.Millisecond)
	e.runDue(ctx)
	if n := logs.Count(`msg="expiry worker"`); n != 1 {
		t.Fatalf("%d lines for 41 failed ticks within the period, want 1:\n%s", n, logs.String())
	}
	now = start.Add(workerLogEvery)
	e.runDue(ctx)
	if n := logs.Count(`msg="expiry worker"`); n != 2 || logs.Count("failures_since_last_log=41 failing_for=30s") != 1 {
		t.Fatalf("after the period: want a second line counting 41 failures in 30s:\n%s", logs.String())
	}
	st.fail.Store(false)
	now = now.Add(5 * time.Second)
	e.runDue(ctx)
	e.runDue(ctx)
	if n := logs.Count(`msg="expiry worker recovered" failures=42 failed_for=35s`); n != 1 {
		t.Fatalf("want one recovery line:\n%s", logs.String())
	}
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
