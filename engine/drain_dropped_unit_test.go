package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// A unit the deciding generation does not limit keeps the available
// capacity the old generation holds in it (docs/ROLLOUT.md, "Limitations"):
// the drain pass moves the other units, and DrainProgress keeps counting
// that capacity, so the old generation is never reported drained, and
// counts the account as BlockedDroppedUnit, so `rollback --wait` can say why it
// does not reach zero. A generation that keeps the unit counts none, also
// while what is left waits for its burst's room.
func TestDrainProgressKeepsADroppedUnitsCapacity(t *testing.T) {
	cases := []struct {
		name string
		// next is generation 2's dimensions; debt settles the request
		// reservation above its hold (debt in requests) instead of
		// releasing it.
		next          []ledger.Dimension
		debt          bool
		wantAvailable ledger.Amounts
		wantDebt      ledger.Amounts
		wantBlocked   int64
		wantByBurst   int64
	}{
		{name: "capacity in a dropped unit", next: []ledger.Dimension{{Unit: "tokens", Burst: 100}},
			wantAvailable: ledger.Amounts{0, 10}, wantBlocked: 1},
		// Debt in a dropped unit keeps generation 1 current (the reserve
		// under generation 2 is frozen): its refill repays it, so it is
		// debt still to drain, not a dropped unit's capacity no drain
		// moves. (Requests do not refill here: it stays owed.)
		{name: "debt in a dropped unit", next: []ledger.Dimension{{Unit: "tokens", Burst: 100}}, debt: true,
			wantAvailable: ledger.Amounts{90, 0}, wantDebt: ledger.Amounts{0, 5}, wantBlocked: 0},
		// Generation 2's burst takes 50 of the 100 tokens: the account
		// counts in both, blocked by burst in tokens and by the dropped
		// requests.
		{name: "a dropped unit and a kept unit's burst full", next: []ledger.Dimension{{Unit: "tokens", Burst: 50}},
			wantAvailable: ledger.Amounts{50, 10}, wantBlocked: 1, wantByBurst: 1},
		{name: "the unit kept", next: []ledger.Dimension{{Unit: "tokens", Burst: 100}, {Unit: "requests", Burst: 20}},
			wantBlocked: 0},
		// Generation 2's burst takes 5 of the 10 requests: the rest waits
		// for room in a unit both limit, which is not a dropped unit.
		{name: "the unit kept, its burst full", next: []ledger.Dimension{{Unit: "tokens", Burst: 100}, {Unit: "requests", Burst: 5}},
			wantAvailable: ledger.Amounts{0, 5}, wantBlocked: 0, wantByBurst: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			e := New(memstore.New(), Options{DisableWorkers: true, Clock: func() time.Time { return t0 }})
			t.Cleanup(func() { e.Close() })
			do := func(cmd ledger.Command) {
				t.Helper()
				if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
					t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
				}
			}
			key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
			publish := func(dims ...ledger.Dimension) {
				p := ledger.Policy{Key: key, Dimensions: dims}.WithDefaults()
				do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			reserve := func(id string, units ledger.Amounts, settle *ledger.Amounts) {
				do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: key.Subject, Route: key.Route, Region: key.Region, Units: units})
				if settle == nil {
					do(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
					return
				}
				do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
				do(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: *settle})
			}
			// Generation 1: 10 requests, 5 of overdraft.
			publish(ledger.Dimension{Unit: "tokens", Burst: 100}, ledger.Dimension{Unit: "requests", Burst: 10, MaxOverdraft: 5})
			if c.debt {
				reserve("a", ledger.Amounts{10, 10}, &ledger.Amounts{10, 15}) // 0 requests left, 5 owed
			} else {
				reserve("a", ledger.Amounts{10, 1}, nil)
			}
			publish(c.next...) // generation 2
			if c.debt {
				res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindReserve, ReservationID: "b", RequestDigest: "sha256:b",
					Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{10}})
				if err != nil || !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != 2 || res.Dimension != "requests" {
					t.Fatalf("reserve under generation 2 while generation 1 owes requests: %+v, %v; want frozen (requests)", res, err)
				}
			} else {
				reserve("b", ledger.Amounts{10}, nil) // switches the subject to generation 2
			}
			if _, err := e.RunDrains(ctx); err != nil {
				t.Fatal(err)
			}
			drains, err := e.DrainProgress(ctx, []uint64{1})
			if err != nil {
				t.Fatal(err)
			}
			d := drains[0]
			if d.BlockedDroppedUnit != c.wantBlocked {
				t.Errorf("generation 1 after the drain pass: %d account(s) blocked by a dropped unit, want %d", d.BlockedDroppedUnit, c.wantBlocked)
			}
			if d.BlockedByBurst != c.wantByBurst {
				t.Errorf("generation 1 after the drain pass: %d account(s) blocked by burst, want %d", d.BlockedByBurst, c.wantByBurst)
			}
			if d.BlockedNoPolicy != 0 {
				t.Errorf("generation 1 after the drain pass: %d blocked with no policy, want 0 (generation 2 decides)", d.BlockedNoPolicy)
			}
			if d.Available != c.wantAvailable || d.Debt != c.wantDebt {
				t.Errorf("generation 1 after the drain pass: available %v, debt %v; want available %v, debt %v",
					d.Available, d.Debt, c.wantAvailable, c.wantDebt)
			}
			if wantDrained := c.wantAvailable == (ledger.Amounts{}) && c.wantDebt == (ledger.Amounts{}); d.Drained() != wantDrained {
				t.Errorf("generation 1 after the drain pass: drained %v, want %v", d.Drained(), wantDrained)
			}
		})
	}
}
