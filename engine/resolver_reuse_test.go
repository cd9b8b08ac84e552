package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
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
			swapped := reuseWhileAsked(t, e, clk, src)

			e.RunResolver(ctx)
			if !*swapped {
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

// reuseWhileAsked makes op-x's next answer (finished, 250 tokens) come
// after tenant-7's x was settled by its gateway, forgotten by retention,
// and reserved, started and marked USAGE_UNKNOWN again by tenant-8 under
// the same id and operation id. It returns whether that happened.
func reuseWhileAsked(t *testing.T, e *Engine, clk *clock, src *scriptedSource) *bool {
	t.Helper()
	ctx := context.Background()
	do := func(cmd ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatalf("%s %s: %v %v", cmd.Kind, cmd.ReservationID, err, res.Err)
		}
	}
	swapped := new(bool)
	src.mu.Lock()
	defer src.mu.Unlock()
	src.answers["op-x"] = func() (OperationStatus, error) {
		// While the resolver waits for this answer.
		do(ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{100}})
		clk.Advance(time.Second)
		do(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: clk.Now(), ForgetBefore: clk.Now()})
		do(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:tenant-8-x",
			Subject: "tenant-8", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{300}})
		do(ledger.Command{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"})
		do(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "x"})
		*swapped = true
		return OperationStatus{State: OperationFinished, Units: map[string]ledger.Units{"tokens": 250}}, nil
	}
	return swapped
}

// What the resolver learnt about tenant-7's x (its settle refused as
// "reservation not found: x", since tenant-8's x holds the id now, and the
// longest backoff that follows) is tenant-7's: tenant-8's x has no stored
// answer until it is asked about, and the next scan asks about it at
// once, as about any newly USAGE_UNKNOWN reservation; its answer is then
// stored as tenant-8's. Also for a resolver that starts afresh (a new
// worker leader), which finds only the stored answers.
func TestResolverStartsAReusedIDAfresh(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		for _, restart := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/restart=%v", name, restart), func(t *testing.T) {
				clk := newClock()
				src := newScripted()
				st := open(t)
				answers := st.(store.ResolverAnswers)
				opts := Options{DisableWorkers: true, Clock: clk.Now, Resolver: &ResolverOptions{Source: src, MaxBackoff: time.Hour}}
				e := New(st, opts)
				defer e.Close()
				ctx := context.Background()
				publish(t, e, 10000, time.Minute, 30*time.Second)
				unknownWork(t, e, clk, "x")
				swapped := reuseWhileAsked(t, e, clk, src)
				e.RunResolver(ctx)
				if !*swapped || src.count("op-x") != 1 {
					t.Fatalf("op-x asked %d times, swapped %v: the test proves nothing", src.count("op-x"), *swapped)
				}
				stored := func() []store.ResolverAnswer {
					t.Helper()
					got, err := answers.ResolverAnswersGet(ctx, []string{"x"})
					if err != nil {
						t.Fatal(err)
					}
					return got
				}
				if got := stored(); len(got) != 0 {
					t.Fatalf("tenant-8's x, never asked about, has the answers %+v", got)
				}

				src.set("op-x", OperationStatus{State: OperationRunning}, nil)
				// No time passed: only a reservation never asked about is due.
				if restart {
					NewResolver(st, *opts.Resolver, clk.Now, e.DoBatch, nil).Run(ctx)
				} else {
					e.RunResolver(ctx)
				}
				if n := src.count("op-x"); n != 2 {
					t.Fatalf("op-x asked %d times: tenant-8's x waits out tenant-7's backoff", n)
				}
				got := stored()
				if len(got) != 1 || got[0].Account.Subject != "tenant-8" || got[0].Answer != "running" || got[0].Attempts != 1 {
					t.Fatalf("tenant-8's x after its first question: answers %+v, want its own running, asked once", got)
				}
			})
		}
	}
}
