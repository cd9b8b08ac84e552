package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// The cadence of a failing worker's lines (failLog), the one rule for
// every worker: its first failure is logged at once; while the same
// error repeats, the next line comes workerLogFirstGap later and each
// later one after twice the gap before, at most workerLogMaxGap apart
// (lines at 0, 30 s, 1 m 30 s, 3 m 30 s, 7 m 30 s, 15 m 30 s, then
// every 15 minutes, counted from the first failure: 9 lines in a store
// outage of an hour, whether the worker fails four times a second or
// once a minute); an error text
// other than the last line's is logged at once, at most once per
// workerLogFirstGap (a text that changes at every failure, a port
// number in it, cannot flood the log either); and the first success
// logs one recovery line.
const (
	workerLogFirstGap = 30 * time.Second
	workerLogMaxGap   = 15 * time.Minute
)

// failLog is one worker's failure runs: it rate-limits the lines of the
// worker's steps that keep failing (a store that is down fails every
// tick, four times a second for the expiry worker), by the cadence
// above, with the failures since the last line and how long the step
// has been failing, and logs one line when the step works again. The
// worker's open runs are also its failing status (failingSince:
// /statusz, capledger_worker_failing).
//
// It reads the wall clock, not the engine's Clock: the Clock is the time
// commands are applied at (a test's frozen clock, a replay's fast one),
// while these periods are the operators' time between log lines, like the
// other operational durations the engine measures (batch retries, pacing,
// the worker lease).
type failLog struct {
	// worker names the worker in every line (worker=...), so that two
	// workers' lines of one step ("worker batch") tell apart; log is
	// where the lines go.
	worker string
	log    *slog.Logger

	mu sync.Mutex
	// now is time.Now when nil; tests drive it.
	now func() time.Time
	m   map[string]*failing
}

func newFailLog(worker string, log *slog.Logger) failLog {
	return failLog{worker: worker, log: log}
}

func (f *failLog) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

// failing is one step's failure run: since its first failure, due when
// the next line of the same text is (counted from since, so a line a
// pass late does not delay the ones after it), gap the wait between the
// last due time and due, changed when the last line for a changed text
// was.
type failing struct {
	since, due, changed time.Time
	gap                 time.Duration
	text                string
	total, unlogged     int
}

// failed logs err (and attrs) of the step msg as a warning, as the
// cadence says.
func (f *failLog) failed(msg string, err error, attrs ...any) {
	f.failedAt(slog.LevelWarn, msg, err, attrs...)
}

// failedAt is failed at level: a refusal that is the ledger's fault, not
// the store's (the compaction audit's discrepancies), is an error. err
// may be nil when attrs say what happened.
func (f *failLog) failedAt(level slog.Level, msg string, err error, attrs ...any) {
	text := ""
	if err != nil {
		text = err.Error()
		attrs = append(attrs, "err", err)
	}
	now := f.clock()
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*failing{}
	}
	s := f.m[msg]
	if s == nil {
		f.m[msg] = &failing{since: now, due: now.Add(workerLogFirstGap), gap: workerLogFirstGap, text: text, total: 1}
		f.mu.Unlock()
		f.log.Log(context.Background(), level, msg, append(attrs, "worker", f.worker)...)
		return
	}
	s.total++
	s.unlogged++
	switch changed := text != s.text; {
	case changed && now.Sub(s.changed) >= workerLogFirstGap:
		s.changed = now
	case !changed && !now.Before(s.due):
		for !s.due.After(now) { // passes further apart than a gap log once
			s.gap = min(2*s.gap, workerLogMaxGap)
			s.due = s.due.Add(s.gap)
		}
	default:
		f.mu.Unlock()
		return
	}
	n := s.unlogged
	s.unlogged, s.text = 0, text
	failingFor := now.Sub(s.since).Round(time.Second)
	f.mu.Unlock()
	f.log.Log(context.Background(), level, msg, append(attrs, "failures_since_last_log", n, "failing_for", failingFor.String(), "worker", f.worker)...)
}

// ok ends a failure run of the step msg: logs once that it recovered,
// with how many times it failed.
func (f *failLog) ok(msg string) {
	f.mu.Lock()
	s := f.m[msg]
	if s == nil {
		f.mu.Unlock()
		return
	}
	delete(f.m, msg)
	f.mu.Unlock()
	f.log.Info(msg+" recovered", "failures", s.total, "failed_for", f.clock().Sub(s.since).Round(time.Millisecond).String(), "worker", f.worker)
}

// failingSince returns the start of the oldest failure run still open
// (zero when every step works).
func (f *failLog) failingSince() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var since time.Time
	for _, s := range f.m {
		if since.IsZero() || s.since.Before(since) {
			since = s.since
		}
	}
	return since
}

// forget drops every failure run without a line: the worker starts
// afresh (a new term as worker leader, workers.go tick).
func (f *failLog) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m = nil
}
