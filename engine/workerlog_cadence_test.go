package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/logcapture"
)

// failingForOf returns the failing_for of each repeat line in logs (the
// first line of a run has none).
// clockedFailLog is a failLog of worker logging into logs, on a clock
// that reads *now, which starts at start.
func clockedFailLog(worker string) (f *failLog, logs *logcapture.Logs, start time.Time, now *time.Time) {
	logger, logs := logcapture.New()
	fl := newFailLog(worker, logger)
	f = &fl
	start = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	now = new(time.Time)
	*now = start
	f.now = func() time.Time { return *now }
	return f, logs, start, now
}

func failingForOf(logs string) []string {
	var got []string
	for _, l := range strings.Split(logs, "\n") {
		if _, after, ok := strings.Cut(l, " failing_for="); ok {
			got = append(got, strings.Fields(after)[0])
		}
	}
	return got
}

// A step failing less often than its gap has grown logs once per failure
// that reaches the schedule, and the schedule skips the due times that
// passed meanwhile: failing every 5 minutes, the lines come at 5, 10, 20,
// 35 and 50 minutes (due at 30 s, 1 m 30 s, 3 m 30 s, 7 m 30 s, 15 m 30 s,
// 30 m 30 s, 45 m 30 s, 60 m 30 s), not at every failure as a schedule
// stepped once per line would make them.
func TestFailLogCadenceOfRareFailures(t *testing.T) {
	f, logs, start, now := clockedFailLog("retention")
	for ; now.Sub(start) < time.Hour; *now = now.Add(5 * time.Minute) {
		f.failed("retention pass", errUnreachable)
	}
	want := []string{"5m0s", "10m0s", "20m0s", "35m0s", "50m0s"}
	if got := failingForOf(logs.String()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lines of a step failing every 5 minutes at failing_for %v, want %v:\n%s", got, want, logs.String())
	}
}

// An error text that changes once is logged at once, and its repeats then
// keep to the cadence as the first text's would have: a step failing
// every 7 s, with one text for its first failure and another ever after,
// logs 8 lines in an hour (the first, the new text at 7 s, then the
// schedule's), not the new text every 30 s.
func TestFailLogChangedTextKeepsTheCadence(t *testing.T) {
	f, logs, start, now := clockedFailLog("lease")
	f.failed("worker lease", errors.New("dial tcp 127.0.0.1:5432: connection refused"))
	for *now = now.Add(7 * time.Second); now.Sub(start) < time.Hour; *now = now.Add(7 * time.Second) {
		f.failed("worker lease", errUnreachable)
	}
	want := []string{"7s", "35s", "1m31s", "3m30s", "7m35s", "15m31s", "30m34s", "45m30s"}
	if got := failingForOf(logs.String()); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lines at failing_for %v, want %v:\n%s", got, want, logs.String())
	}
}

// failingSince (FailingSince in WorkersHealth, /statusz) is the start of
// the oldest failure run still open among a worker's steps, whichever
// started failing last.
func TestFailingSinceIsTheOldestOpenRun(t *testing.T) {
	f, _, start, now := clockedFailLog("retention")
	steps := []string{"retention shard fence", "retention pass", "retention statements"}
	for i, step := range steps {
		*now = start.Add(time.Duration(i) * time.Minute)
		f.failed(step, errUnreachable)
	}
	for i := range steps {
		if got, want := f.failingSince(), start.Add(time.Duration(i)*time.Minute); !got.Equal(want) {
			t.Fatalf("failing since %v with %v open, want %v (the oldest)", got, steps[i:], want)
		}
		f.ok(steps[i])
	}
	if got := f.failingSince(); !got.IsZero() {
		t.Fatalf("failing since %v with every step recovered, want zero", got)
	}
}
