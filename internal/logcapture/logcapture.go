// Package logcapture gives a test a logger whose lines it can read while
// the code under test is still writing them from goroutines of its own (a
// worker, a compaction loop, the copier of a child process's output). It
// knows nothing of the ledger; it is the one lock-guarded log buffer the
// engine's and the stores' tests share.
package logcapture

import (
	"log/slog"
	"strings"
	"sync"
)

// Logs is what was written to it. The zero value is empty and ready to
// use (as a child process's Stdout and Stderr, say), and every method is
// safe to call while others write.
type Logs struct {
	mu   sync.Mutex
	text strings.Builder
}

// New returns a logger that writes slog's text lines (default options:
// Info and above) into a new Logs, and that Logs.
func New() (*slog.Logger, *Logs) {
	logs := &Logs{}
	return slog.New(slog.NewTextHandler(logs, nil)), logs
}

// Write appends p; it never fails.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.Write(p)
}

// String returns everything written so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// Count returns how many times substr occurs in what was written so far
// (a whole line's text, `msg="expiry worker"`, counts the lines).
func (l *Logs) Count(substr string) int {
	return strings.Count(l.String(), substr)
}
