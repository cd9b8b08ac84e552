package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"
)

// newTestBreaker returns a breaker whose watchdogs the test fires itself
// (their timers would fire after an hour) and whose probes find no ledger.
func newTestBreaker(t *testing.T) *breaker {
	b := newBreaker(BreakerPolicy{DetectTimeout: time.Hour}, func(context.Context) error {
		return connect.NewError(connect.CodeUnavailable, errors.New("test breaker: no ledger"))
	})
	t.Cleanup(b.shutdown)
	return b
}

// An answer that arrives while the watchdog of a slower attempt is firing
// wins: the watchdog decides after it and keeps the breaker closed. It
// used to check for answers, then open: an answer between the two left
// the breaker open just after the ledger answered, and the next calls
// failed fast until a probe closed it. The watchdog now decides in one
// step under the breaker's lock (tripIf), so "after it fired, before it
// decided" is "before it decided": the answer is delivered, then slow's
// watchdog fires.
func TestWatchdogDoesNotOpenTheBreakerAfterAnAnswer(t *testing.T) {
	ctx := context.Background()
	b := newTestBreaker(t)
	slow := b.attempt(ctx, 2*time.Hour, func() {})
	answer := b.attempt(ctx, 2*time.Hour, func() {})
	answer(ctx, nil)
	b.watchdogFired(0) // slow's watchdog: no answer had arrived when slow began
	if st := b.stats(); st.State != BreakerClosed || st.Trips != 0 {
		t.Fatalf("breaker %s after an answer that arrived before its watchdog decided (%d trips)", st.State, st.Trips)
	}
	slow(ctx, nil)

	// The same watchdog with no answer meanwhile opens it.
	b = newTestBreaker(t)
	slow = b.attempt(ctx, 2*time.Hour, func() {})
	b.watchdogFired(0)
	if st := b.stats(); st.State == BreakerClosed || st.Trips != 1 {
		t.Fatalf("a watchdog with no answer since its attempt began left the breaker %s (%d trips)", st.State, st.Trips)
	}
	slow(ctx, nil) // the slow answer closes it again
	if st := b.stats(); st.State != BreakerClosed {
		t.Fatalf("breaker %s after an answer", st.State)
	}
}
