package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// workerLogEvery is how often, at most, a worker that keeps failing logs
// again after its first failure.
const workerLogEvery = 30 * time.Second

// failLog rate-limits the warnings of a failing worker (a store that is
// down fails every tick, four times a second for the expiry worker): the
// first failure is logged at once, then at most one line per every
// period, with the failures since the last line and how long it has been
// failing, and one line when it works again.
//
// It reads the wall clock, not the engine's Clock: the Clock is the time
// commands are applied at (a test's frozen clock, a replay's fast one),
// while this period is the operators' time between log lines, like the
// other operational durations the engine measures (batch retries, pacing,
// the worker lease).
type failLog struct {
	mu sync.Mutex
	// now is time.Now when nil; tests drive it.
	now func() time.Time
	m   map[string]*failing
}

func (f *failLog) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

type failing struct {
	since, logged   time.Time
	total, unlogged int
}

// failed logs err (and attrs) of the worker named msg as a warning,
// unless it logged within workerLogEvery.
func (f *failLog) failed(log *slog.Logger, msg string, err error, attrs ...any) {
	f.failedEvery(log, slog.LevelWarn, workerLogEvery, msg, err, attrs...)
}

// failedEvery is failed at level, at most once per every: a refusal that
// is the ledger's fault, not the store's (the compaction audit's
// discrepancies), stays an error while it repeats, and a worker whose
// passes are a minute or more apart needs a period longer than
// workerLogEvery for its lines to be fewer than its passes. err may be
// nil when attrs say what happened.
func (f *failLog) failedEvery(log *slog.Logger, level slog.Level, every time.Duration, msg string, err error, attrs ...any) {
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	now := f.clock()
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*failing{}
	}
	s := f.m[msg]
	if s == nil {
		s = &failing{since: now, logged: now}
		f.m[msg] = s
		s.total++
		f.mu.Unlock()
		log.Log(context.Background(), level, msg, attrs...)
		return
	}
	s.total++
	s.unlogged++
	if now.Sub(s.logged) < every {
		f.mu.Unlock()
		return
	}
	n := s.unlogged
	s.logged, s.unlogged = now, 0
	failingFor := now.Sub(s.since).Round(time.Second)
	f.mu.Unlock()
	log.Log(context.Background(), level, msg, append(attrs, "failures_since_last_log", n, "failing_for", failingFor.String())...)
}

// ok ends a failure run of the worker named msg: logs once that it
// recovered, with how many times it failed.
func (f *failLog) ok(log *slog.Logger, msg string) {
	f.mu.Lock()
	s := f.m[msg]
	if s == nil {
		f.mu.Unlock()
		return
	}
	delete(f.m, msg)
	f.mu.Unlock()
	log.Info(msg+" recovered", "failures", s.total, "failed_for", f.clock().Sub(s.since).Round(time.Millisecond).String())
}
