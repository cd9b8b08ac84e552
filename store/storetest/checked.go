package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testCheckedAccountAfterIDReuse: a command checked against one account
// (ledger.Command.CheckedAccount, what a scoped token's id-only call
// carries) never reaches a reservation another account took the id with
// after retention forgot the checked one, live or as a tombstone, read by
// the store one id at a time or prefetched for a batch (the engine's
// path): each is answered as an unknown id, and the other account's row
// stays as it was. Its owner's commands reach it.
func testCheckedAccountAfterIDReuse(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	run := func(cmd ledger.Command) ledger.Result {
		t.Helper()
		res, err := apply(ctx, s, &cmd, now)
		if err != nil || res.Err != nil {
			t.Fatalf("%s %s: %+v, %v", cmd.Kind, cmd.ReservationID, res, err)
		}
		now = now.Add(time.Second)
		return res
	}
	accounts := map[string]ledger.AccountKey{}
	for _, subject := range []string{"tenant-a", "tenant-b"} {
		key := ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}
		policy := ledger.Policy{Key: key, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, HoldTTL: time.Minute}.WithDefaults()
		g := run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}).Generation
		accounts[subject] = ledger.AccountKey{Subject: subject, Route: key.Route, Region: key.Region, Generation: g}
	}
	lifeOf := func(subject string) {
		a := accounts[subject]
		run(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:" + subject,
			Subject: a.Subject, Route: a.Route, Region: a.Region, Units: ledger.Amounts{100}})
		run(ledger.Command{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"})
	}
	// tenant-a's life of x ends and is forgotten; tenant-b's begins.
	lifeOf("tenant-a")
	run(ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{10}})
	run(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: now, ForgetBefore: now})
	lifeOf("tenant-b")
	theirs, err := s.ReservationGet(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}

	checkedByA := []ledger.Command{
		{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"},
		{Kind: ledger.KindMarkUsageUnknown, ReservationID: "x"},
		{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{10}},
		{Kind: ledger.KindRelease, ReservationID: "x"},
	}
	for i := range checkedByA {
		checkedByA[i].CheckedAccount = accounts["tenant-a"]
	}
	refused := func(how string, results []ledger.Result) {
		t.Helper()
		for i, res := range results {
			if !errors.Is(res.Err, ledger.ErrReservationNotFound) || res.Err.Error() != "reservation not found: x" ||
				res.Reservation != (ledger.Reservation{}) || res.Replayed {
				t.Errorf("%s: %s checked against tenant-a on tenant-b's x: %+v", how, checkedByA[i].Kind, res)
			}
		}
	}
	oneByOne := func() []ledger.Result {
		t.Helper()
		var results []ledger.Result
		for i := range checkedByA {
			res, err := apply(ctx, s, &checkedByA[i], now)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
		return results
	}
	refused("one by one", oneByOne())
	refused("prefetched batch", applyPrefetched(t, s, checkedByA, now))
	if after, err := s.ReservationGet(ctx, "x"); err != nil || after != theirs {
		t.Fatalf("tenant-b's x after tenant-a's commands: %+v, %v; was %+v", after, err, theirs)
	}

	// Its owner's commands reach it; then, retired, its tombstone answers
	// its owner, and tenant-a as an unknown id.
	settle := ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{20},
		CheckedAccount: accounts["tenant-b"]}
	if res := run(settle); res.Reservation.State != ledger.StateSettled {
		t.Fatalf("tenant-b's own settle: %+v", res)
	}
	run(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: now})
	res, err := apply(ctx, s, &settle, now)
	if err != nil || !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) || !errors.Is(res.Err, ledger.ErrReservationRetired) {
		t.Fatalf("tenant-b's retried settle of its tombstone: %+v, %v", res, err)
	}
	refused("tombstone", oneByOne())
	refused("tombstone, prefetched batch", applyPrefetched(t, s, checkedByA, now))
	auditClean(t, s)
}
