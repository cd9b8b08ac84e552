package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The resolver reads a USAGE_UNKNOWN row, asks about its operation (a
// network call that may take seconds), then settles by id. Should the
// gateway settle the row meanwhile, retention forget it, and another
// tenant reserve, start and leave unknown a reservation under the same id
// and operation id (both are the clients'), the answer about the first
// tenant's operation must not settle the second tenant's reservation:
// the settle is checked against the row's account, and the other
// reservation stays USAGE_UNKNOWN.
func TestResolverNeverSettlesAReusedID(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			src := newScripted()
			e := New(open(t), Options{DisableWorkers: true, Clock: clk.Now, Resolver: &ResolverOptions{Source: src}})
			defer e.Close()
			ctx := context.Background()
			publish(t, e, 10000, time.Minute, 30*time.Second)
			unknownWork(t, e, clk, "x") // tenant-7's x, USAGE_UNKNOWN under op-x
			do := func(cmd ledger.Command) {
				t.Helper()
				if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
					t.Fatalf("%s %s: %v %v", cmd.Kind, cmd.ReservationID, err, res.Err)
				}
			}
			swapped := false
			src.mu.Lock()
			src.answers["op-x"] = func() (OperationStatus, error) {
				// While the resolver waits for this answer.
				do(ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{100}})
				clk.Advance(time.Second)
				do(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: clk.Now(), ForgetBefore: clk.Now()})
				do(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:tenant-8-x",
					Subject: "tenant-8", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{300}})
				do(ledger.Command{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"})
				do(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "x"})
				swapped = true
				return OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 250}}, nil
			}
			src.mu.Unlock()

			e.RunResolver(ctx)
			if !swapped {
				t.Fatal("the resolver did not ask about op-x: the test proves nothing")
			}
			if r := state(t, e, "x"); r.Account.Subject != "tenant-8" || r.State != ledger.StateUsageUnknown {
				t.Fatalf("tenant-8's x after the resolver's answer about tenant-7's: %s %s actual %v, want it USAGE_UNKNOWN",
					r.Account.Subject, r.State, r.Actual[0])
			}
			if s := e.ResolverStats(); s.Settled != 0 {
				t.Fatalf("resolver stats %+v: it settled something", s)
			}
			auditClean(t, e)
		})
	}
}
