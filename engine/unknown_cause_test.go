package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// listHookStore runs afterList once, right after the first ReservationsDue
// answers: the moment between the worker's listing of due holds and its
// batch, where a gateway's command can land.
type listHookStore struct {
	store.Store
	once      sync.Once
	afterList func()
}

func (s *listHookStore) ReservationsDue(ctx context.Context, now time.Time, limit int) ([]store.DueReservation, error) {
	due, err := s.Store.ReservationsDue(ctx, now, limit)
	s.once.Do(s.afterList)
	return due, err
}

// TestStartBetweenDueListingAndWorkerBatchStaysStarted reproduces the
// interleaving of issue 13: the worker lists a RESERVED hold past its TTL,
// a Start commits, and only then does the worker run its batch, decided
// from the listing. Started work without an execution limit (or before its
// deadline) must stay STARTED: only MarkUsageUnknown or a passed execution
// limit makes it USAGE_UNKNOWN.
func TestStartBetweenDueListingAndWorkerBatchStaysStarted(t *testing.T) {
	for _, execLimit := range []time.Duration{0, 30 * time.Second} {
		t.Run("executionLimit="+execLimit.String(), func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			hook := &listHookStore{Store: memstore.New()}
			e := New(hook, Options{DisableWorkers: true, Clock: clk.Now})
			defer e.Close()
			publish(t, e, 1000, 200*time.Millisecond, execLimit)
			if res, err := e.Do(ctx, reserveCmd("rl-late", 100)); err != nil || res.Err != nil {
				t.Fatal(err, res.Err)
			}
			clk.Advance(300 * time.Millisecond) // the hold ran out, unclaimed
			started := false
			hook.afterList = func() {
				res, err := e.core.Commit(ctx, []ledger.Command{{Kind: ledger.KindStart, ReservationID: "rl-late", OperationID: "op-late"}}, clk.Now())
				if err != nil || res[0].Err != nil {
					t.Errorf("start after the listing: %v %v", err, res[0].Err)
				}
				started = true
			}
			e.runDue(ctx)
			if !started {
				t.Fatal("the worker never listed the due hold")
			}
			r, err := e.Reservation(ctx, "rl-late")
			if err != nil {
				t.Fatal(err)
			}
			if r.State != ledger.StateStarted || !r.UnknownAt.IsZero() {
				t.Fatalf("started work after a worker pass: %s (unknown at %s), want STARTED", r.State, r.UnknownAt)
			}
			if execLimit > 0 {
				clk.Advance(execLimit)
				e.runDue(ctx)
				if r, _ := e.Reservation(ctx, "rl-late"); r.State != ledger.StateUsageUnknown {
					t.Fatalf("work past its execution limit: %s, want USAGE_UNKNOWN", r.State)
				}
			}
			auditClean(t, e)
		})
	}
}

// TestWorkerCommandsCarryTheirCause checks that a stale worker batch (its
// commands computed before a Start landed) is refused by the ledger at apply
// time, while an explicit MarkUsageUnknown still marks started work.
func TestWorkerCommandsCarryTheirCause(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now})
	defer e.Close()
	publish(t, e, 1000, 200*time.Millisecond, 0)
	for _, id := range []string{"rl-a", "rl-b"} {
		if res, err := e.Do(ctx, reserveCmd(id, 100)); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	clk.Advance(time.Hour)
	// The worker's command for started work with no execution limit.
	res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "rl-a", Cause: ledger.CauseExecutionLimit})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(res.Err, ledger.ErrReservationNotDue) || res.Reservation.State != ledger.StateStarted {
		t.Fatalf("worker unknown-marking without an execution limit: %v, state %s; want RESERVATION_NOT_DUE, STARTED", res.Err, res.Reservation.State)
	}
	// An expiry caused by an execution limit is meaningless.
	if res, _ := e.Do(ctx, ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "rl-a", Cause: ledger.CauseExecutionLimit}); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("expiry claim with an execution-limit cause: %v, want INVALID_COMMAND", res.Err)
	}
	// An explicit request keeps working.
	res, err = e.Do(ctx, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "rl-b"})
	if err != nil || res.Err != nil || res.Reservation.State != ledger.StateUsageUnknown {
		t.Fatalf("explicit MarkUsageUnknown: %v %v %s", err, res.Err, res.Reservation.State)
	}
	auditClean(t, e)
}
