package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// TestGatewayCommandBetweenDueListingAndWorkerBatchWins checks that the
// expiry worker, which decides from ReservationsDue's listing without
// reading the rows again, never expires or marks unknown a reservation
// that a command committed between that listing and the worker's batch
// moved on: the row the worker listed is stale, and the ledger decides
// from the row it reads when the batch commits. Each case ends with the
// reservation as the gateway (or the other worker) left it, the usage
// spent once and nothing still held, on memstore and on SQLite.
func TestGatewayCommandBetweenDueListingAndWorkerBatchWins(t *testing.T) {
	const id, hold = "rl-race", 100
	start := ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-race"}
	settle := ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-race", Units: ledger.Amounts{40}}
	expire := []ledger.Command{
		{Kind: ledger.KindExpireClaim, ReservationID: id, Cause: ledger.CauseHoldExpired},
		{Kind: ledger.KindExpire, ReservationID: id, Cause: ledger.CauseHoldExpired},
	}
	cases := []struct {
		name string
		// started: the reservation is started before the clock passes
		// its execution limit, so the worker lists it as overrunning
		// work; otherwise it lists a RESERVED hold past its TTL.
		started bool
		// between commits between the listing and the worker's batch.
		between   [][]ledger.Command
		wantState ledger.State
		wantSpent int64
	}{
		{name: "release", between: [][]ledger.Command{{{Kind: ledger.KindRelease, ReservationID: id}}},
			wantState: ledger.StateReleased},
		{name: "start and settle", between: [][]ledger.Command{{start}, {settle}},
			wantState: ledger.StateSettled, wantSpent: 40},
		{name: "another worker's expiry", between: [][]ledger.Command{expire},
			wantState: ledger.StateExpired},
		{name: "settle of overrunning work", started: true, between: [][]ledger.Command{{settle}},
			wantState: ledger.StateSettled, wantSpent: 40},
	}
	for storeName, open := range memstoreAndSQLite {
		for _, tc := range cases {
			t.Run(storeName+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				clk := newClock()
				hook := &listHookStore{Store: open(t)}
				e := New(hook, Options{DisableWorkers: true, Clock: clk.Now})
				defer e.Close()
				publish(t, e, 1000, 200*time.Millisecond, 30*time.Second)
				if res, err := e.Do(ctx, reserveCmd(id, hold)); err != nil || res.Err != nil {
					t.Fatal(err, res.Err)
				}
				wantListed := ledger.StateReserved
				if tc.started {
					if res, err := e.Do(ctx, start); err != nil || res.Err != nil {
						t.Fatal(err, res.Err)
					}
					wantListed = ledger.StateStarted
					clk.Advance(time.Minute) // past the execution limit
				} else {
					clk.Advance(300 * time.Millisecond) // past the hold's TTL
				}
				listed := false
				hook.afterList = func() {
					due, err := hook.Store.ReservationsDue(ctx, clk.Now(), 10)
					if err != nil || len(due) != 1 || due[0].State != wantListed {
						t.Errorf("the listing the worker decided from: %v %v, want %s", due, err, wantListed)
					}
					for _, cmds := range tc.between {
						res, err := e.core.Commit(ctx, cmds, clk.Now())
						if err != nil {
							t.Fatalf("commit between the listing and the batch: %v", err)
						}
						for i := range res {
							if res[i].Err != nil {
								t.Fatalf("%s between the listing and the batch: %v", cmds[i].Kind, res[i].Err)
							}
						}
					}
					listed = true
				}
				e.runDue(ctx)
				if !listed {
					t.Fatal("the worker never listed the reservation")
				}
				r, err := e.Reservation(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if r.State != tc.wantState {
					t.Fatalf("after the worker's batch: %s, want %s", r.State, tc.wantState)
				}
				accounts, err := hook.Store.AccountList(ctx, ledger.PolicyKey{})
				if err != nil || len(accounts) != 1 {
					t.Fatalf("accounts: %v %v", accounts, err)
				}
				if b := accounts[0].Balances[0]; b.Reserved != 0 || b.Spent != tc.wantSpent {
					t.Errorf("account after the worker's batch: reserved %d spent %d, want 0 and %d", b.Reserved, b.Spent, tc.wantSpent)
				}
				// Nothing is due any more.
				if due, err := hook.Store.ReservationsDue(ctx, clk.Now(), 10); err != nil || len(due) != 0 {
					t.Errorf("due after the worker's batch: %v %v", due, err)
				}
				auditClean(t, e)
			})
		}
	}
}
