package engine

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// DrainProgress never says drained of a generation that was active while
// it read: generation 1, superseded by 2, still holds its subject's
// capacity (not drained); with a rollback of 2 (1 active again) and a
// reserve and settle spending all of 1's capacity committed between its
// head read and its accounts (store.WithBetweenReads), its answer is the
// one before (inactive, holding 1000) or after (active, holding nothing),
// never inactive and holding nothing: drained, a state that never existed.
// With a publish under its key during every pass it answers
// ErrPolicyChanging after maxDrainPasses. Each store.
func TestDrainProgressNeverDrainedWhileItsKeyChanged(t *testing.T) {
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			e := leadingEngine(t, open(t), Options{Clock: func() time.Time { return t0 }})
			must := func(cmd ledger.Command) { t.Helper(); mustDo(t, e, cmd) }
			publish := func(burst ledger.Units) {
				p := ledger.Policy{Key: key, HoldTTL: time.Hour, Dimensions: []ledger.Dimension{
					{Unit: "tokens", Burst: burst, RefillUnits: 10, RefillInterval: time.Second}}}.WithDefaults()
				must(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			reserve := func(id string, units ledger.Units) {
				must(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{units}})
			}
			read := func(ctx context.Context) GenerationDrain {
				t.Helper()
				drains, err := e.DrainProgress(ctx, []uint64{1})
				if err != nil || len(drains) != 1 {
					t.Fatalf("drain progress: %v, %v", drains, err)
				}
				return drains[0]
			}
			publish(1000) // generation 1
			reserve("first", 1)
			must(ledger.Command{Kind: ledger.KindRelease, ReservationID: "first"})
			publish(2000) // generation 2: tenant-7's capacity stays on 1 until its next command
			before := read(ctx)
			if before.Active || before.Drained() || before.Available[0] != 1000 {
				t.Fatalf("before: %+v; want generation 1 inactive, holding 1000", before)
			}
			hooks := 0
			got := read(store.WithBetweenReads(ctx, func() {
				if hooks++; hooks > 1 {
					return
				}
				must(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 2})
				reserve("all", 1000)
				must(ledger.Command{Kind: ledger.KindStart, ReservationID: "all", OperationID: "op-all"})
				must(ledger.Command{Kind: ledger.KindSettle, ReservationID: "all", OperationID: "op-all", Units: ledger.Amounts{1000}})
			}))
			if hooks == 0 {
				t.Fatal("the hook between DrainProgress's reads never ran")
			}
			after := read(ctx)
			if !after.Active || after.Available[0] != 0 {
				t.Fatalf("after: %+v; want generation 1 active, holding nothing", after)
			}
			if !reflect.DeepEqual(got, before) && !reflect.DeepEqual(got, after) {
				t.Errorf("read while a rollback and a spend committed (drained %v):\n %+v\nnot before:\n %+v\nnor after:\n %+v",
					got.Drained(), got, before, after)
			}
			// A key published under during every pass: no answer, an error.
			passes := 0
			_, err := e.DrainProgress(store.WithBetweenReads(ctx, func() {
				passes++
				publish(ledger.Units(3000 + passes))
			}), []uint64{1})
			if !errors.Is(err, ErrPolicyChanging) || passes != maxDrainPasses {
				t.Errorf("a publish during each pass: %d passes, %v; want %d and ErrPolicyChanging", passes, err, maxDrainPasses)
			}
			// A rollback between the pass's read of the policy and of its
			// key's head: shown rolled back (as it then stood), never
			// neither active nor rolled back, a state it never had.
			rolled := 0
			drains, err := e.DrainProgress(context.WithValue(ctx, beforeHeadReadKey{}, func() {
				if rolled++; rolled == 1 {
					must(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 1})
				}
			}), []uint64{1})
			if err != nil || rolled == 0 || len(drains) != 1 || drains[0].Active || !drains[0].Policy.RolledBack {
				t.Errorf("a rollback between the policy and the head (hook ran %d times): %+v, %v; want rolled back, not active", rolled, drains, err)
			}
			// A generation rolled back can never decide again: its pass
			// stands while its key is published to during every pass
			// (`rollback --wait` follows such a generation).
			passes = 0
			drains, err = e.DrainProgress(store.WithBetweenReads(ctx, func() {
				passes++
				publish(ledger.Units(4000 + passes))
			}), []uint64{1})
			if err != nil || passes != 1 || len(drains) != 1 || !drains[0].Policy.RolledBack {
				t.Errorf("a rolled-back generation's key published to during its pass: %d passes, %+v, %v; want one pass answered", passes, drains, err)
			}
		})
	}
}
