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
	l := newTwoTenants(t, s)
	run, accounts := l.run, l.accounts
	lifeOf := func(subject string) {
		a := accounts[subject]
		run(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:" + subject,
			Subject: a.Subject, Route: a.Route, Region: a.Region, Units: ledger.Amounts{100}})
		run(ledger.Command{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"})
	}
	// tenant-a's life of x ends and is forgotten; tenant-b's begins.
	lifeOf("tenant-a")
	run(ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{10}})
	run(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: l.now, ForgetBefore: l.now})
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
			res, err := apply(ctx, s, &checkedByA[i], l.now)
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
		return results
	}
	refused("one by one", oneByOne())
	refused("prefetched batch", applyPrefetched(t, s, checkedByA, l.now))
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
	run(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: l.now})
	res, err := apply(ctx, s, &settle, l.now)
	if err != nil || !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) || !errors.Is(res.Err, ledger.ErrReservationRetired) {
		t.Fatalf("tenant-b's retried settle of its tombstone: %+v, %v", res, err)
	}
	refused("tombstone", oneByOne())
	refused("tombstone, prefetched batch", applyPrefetched(t, s, checkedByA, l.now))
	auditClean(t, s)
}

// testResolverAnswersAfterIDReuse: the resolver's answers belong to
// (account, reservation id). tenant-a's x is USAGE_UNKNOWN and has an
// answer; retention forgets x once settled, and tenant-b's x reaches
// USAGE_UNKNOWN. A late answer about tenant-a's x (the resolver's settle,
// checked against tenant-a, refused as "reservation not found: x") is
// stored under tenant-a's key: it never shows for tenant-b's x, never
// replaces tenant-b's own answer, and prune deletes it and tenant-a's
// earlier one while tenant-b's stays.
func testResolverAnswersAfterIDReuse(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	l := newTwoTenants(t, s)
	run, accounts := l.run, l.accounts
	unknown := func(subject string) {
		a := accounts[subject]
		run(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:" + subject,
			Subject: a.Subject, Route: a.Route, Region: a.Region, Units: ledger.Amounts{100}})
		run(ledger.Command{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x"})
		run(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "x"})
	}
	put := func(a store.ResolverAnswer) store.ResolverAnswer {
		t.Helper()
		a.ReservationID, a.AskedAt, a.NextAt = "x", l.now, l.now.Add(time.Hour)
		if err := cs.ResolverAnswersPut(ctx, []store.ResolverAnswer{a}); err != nil {
			t.Fatal(err)
		}
		a.AskedAt, a.NextAt = a.AskedAt.UTC(), a.NextAt.UTC()
		return a
	}
	get := func(what string, want ...store.ResolverAnswer) {
		t.Helper()
		got, err := cs.ResolverAnswersGet(ctx, []string{"x"})
		if err != nil {
			t.Fatal(err)
		}
		same(t, what, got, want)
	}

	unknown("tenant-a")
	first := put(store.ResolverAnswer{Account: accounts["tenant-a"], Answer: "running", Attempts: 1})
	get("tenant-a's x", first)
	run(ledger.Command{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x", Units: ledger.Amounts{10}})
	run(ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: l.now, ForgetBefore: l.now})
	unknown("tenant-b")
	late := put(store.ResolverAnswer{Account: accounts["tenant-a"], Answer: "settle_refused",
		Detail: "reservation not found: x", Attempts: 9})
	get("tenant-b's x, with answers of tenant-a's only")
	theirs := put(store.ResolverAnswer{Account: accounts["tenant-b"], Answer: "running", Attempts: 1})
	get("tenant-b's x with its own answer", theirs)
	late.Attempts++
	put(late)
	get("tenant-b's x after another late answer about tenant-a's", theirs)
	// tenant-a's answers are one row (the late ones replaced the first).
	n, err := cs.ResolverAnswersPrune(ctx)
	if err != nil || n != 1 {
		t.Fatalf("prune deleted %d, %v; want tenant-a's answer", n, err)
	}
	get("tenant-b's x after prune", theirs)
}

// twoTenants is a store with a policy each for tenant-a and tenant-b
// (route chat, region eu, burst 1000) and a clock that run advances a
// second a command: the set-up of the id-reuse cases.
type twoTenants struct {
	t        *testing.T
	s        store.Store
	now      time.Time
	accounts map[string]ledger.AccountKey
}

func newTwoTenants(t *testing.T, s store.Store) *twoTenants {
	l := &twoTenants{t: t, s: s, now: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC), accounts: map[string]ledger.AccountKey{}}
	for _, subject := range []string{"tenant-a", "tenant-b"} {
		key := ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}
		policy := ledger.Policy{Key: key, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, HoldTTL: time.Minute}.WithDefaults()
		g := l.run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}).Generation
		l.accounts[subject] = ledger.AccountKey{Subject: subject, Route: key.Route, Region: key.Region, Generation: g}
	}
	return l
}

// run applies cmd at the clock, fails the test unless it succeeds, and
// advances the clock a second.
func (l *twoTenants) run(cmd ledger.Command) ledger.Result {
	l.t.Helper()
	res, err := apply(context.Background(), l.s, &cmd, l.now)
	if err != nil || res.Err != nil {
		l.t.Fatalf("%s %s: %+v, %v", cmd.Kind, cmd.ReservationID, res, err)
	}
	l.now = l.now.Add(time.Second)
	return res
}
