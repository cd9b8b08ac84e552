package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Debt in a dropped unit on two generations at once, through each store
// (the subject's owing set is Meta rows, ledger/owing.go): late debt in a
// unit neither the owing current account nor the deciding generation
// limits keeps the subject frozen after the current account is repaid,
// with the slowest owing account's retry-after, until both are repaid;
// then the subject is admitted on the deciding generation, the set's rows
// are gone and the audit is clean.
func TestDroppedDebtOnTwoGenerationsThroughStores(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			now := t0
			e := leadingEngine(t, st, Options{Clock: func() time.Time { return now }})
			key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
			do := func(cmd ledger.Command) ledger.Result {
				t.Helper()
				res, err := e.Do(ctx, cmd)
				if err != nil {
					t.Fatalf("%s: %v", cmd.Kind, err)
				}
				return res
			}
			must := func(cmd ledger.Command) {
				t.Helper()
				if res := do(cmd); res.Err != nil {
					t.Fatalf("%s %s: %v", cmd.Kind, cmd.ReservationID, res.Err)
				}
			}
			publish := func(dims ...ledger.Dimension) {
				p := ledger.Policy{Key: key, Dimensions: dims}.WithDefaults()
				must(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			reserve := func(id string, units ...ledger.Units) ledger.Result {
				var amounts ledger.Amounts
				copy(amounts[:], units)
				return do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: key.Subject, Route: key.Route, Region: key.Region, Units: amounts})
			}
			start := func(id string) {
				must(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
			}
			settle := func(id string, units ...ledger.Units) {
				var amounts ledger.Amounts
				copy(amounts[:], units)
				must(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: amounts})
			}
			frozen := func(id, unit string, wait time.Duration) {
				t.Helper()
				res := reserve(id, 10)
				if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Dimension != unit || res.RetryAfter != wait {
					t.Fatalf("reserve %s: err %v, dimension %q, retry after %s; want frozen by %s, %s", id, res.Err, res.Dimension, res.RetryAfter, unit, wait)
				}
			}
			tokens := ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500}
			images := ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
			requests := ledger.Dimension{Unit: "requests", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
			publish(tokens, images) // generation 1
			if res := reserve("a", 10, 1); res.Err != nil {
				t.Fatal(res.Err)
			}
			start("a")
			publish(tokens, requests) // generation 2
			if res := reserve("b", 10, 1); res.Err != nil {
				t.Fatal(res.Err)
			}
			start("b")
			publish(tokens) // generation 3
			if res := reserve("c", 10); res.Err != nil {
				t.Fatal(res.Err)
			}
			settle("b", 10, 5) // generation 2 owes 3 requests
			settle("a", 10, 6) // generation 1 owes 4 images
			frozen("d", "images", 4*time.Second)
			now = now.Add(3 * time.Second)
			frozen("e", "images", time.Second) // requests repaid, 1 image owed
			names, err := st.(store.ShardRetentionStore).MetaNames(ctx, ledger.MetaOwingPrefix, 10)
			if err != nil || len(names) == 0 {
				t.Fatalf("owing set rows while frozen: %v, %v; want some", names, err)
			}
			now = now.Add(time.Second)
			if res := reserve("f", 10); res.Err != nil || res.Reservation.Account.Generation != 3 {
				t.Fatalf("reserve once both are repaid: %v on %s; want admitted on generation 3", res.Err, res.Reservation.Account)
			}
			if names, err := st.(store.ShardRetentionStore).MetaNames(ctx, ledger.MetaOwingPrefix, 10); err != nil || len(names) != 0 {
				t.Fatalf("owing set rows after the switch: %v, %v; want none", names, err)
			}
			auditClean(t, e)
		})
	}
}
