package engine

import (
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
type failLog struct {
	mu    sync.Mutex
	every time.Duration // workerLogEvery; tests shorten it
	m     map[string]*failing
}

type failing struct {
	since, logged   time.Time
	total, unlogged int
}

// failed logs err (and attrs) of the worker named msg, unless it logged
// within every.
func (f *failLog) failed(log *slog.Logger, msg string, err error, attrs ...any) {
	now := time.Now()
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
		log.Warn(msg, append(attrs, "err", err)...)
		return
	}
	s.total++
	s.unlogged++
	every := f.every
	if every <= 0 {
		every = workerLogEvery
	}
	if now.Sub(s.logged) < every {
		f.mu.Unlock()
		return
	}
	n := s.unlogged
	s.logged, s.unlogged = now, 0
	failingFor := now.Sub(s.since).Round(time.Second)
	f.mu.Unlock()
	log.Warn(msg, append(attrs, "err", err, "failures_since_last_log", n, "failing_for", failingFor.String())...)
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
	log.Info(msg+" recovered", "failures", s.total, "failed_for", time.Since(s.since).Round(time.Millisecond).String())
}
