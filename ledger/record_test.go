package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// record is a Record of units under id, with the digest and operation a
// retry repeats.
func (c *checked) record(id string, units ...ledger.Units) ledger.Result {
	c.t.Helper()
	var amounts ledger.Amounts
	copy(amounts[:], units)
	return c.apply(ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: "record:" + id, OperationID: "op-" + id,
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: amounts})
}

// TestRecordChargesAvailableThenDebt: a record never refuses for lack of
// capacity. It spends what is available and records the rest as debt,
// exactly as a settle above its reservation does, including on an empty
// account and on one already frozen by debt; the harness audits every
// step (conservation, spent vs settled, unrecorded debt, journal replay,
// refund once, no admission under debt).
func TestRecordChargesAvailableThenDebt(t *testing.T) {
	c := newChecked(t)
	d := tokens(100, 10)
	d.MaxOverdraft = 100
	gen := c.publish(policyOf(d))
	type want struct {
		state              ledger.State
		overdraft          ledger.Units
		breach             bool
		available, debt    ledger.Units
		spent, issued      ledger.Units
		remainingAvailable ledger.Units
	}
	steps := []struct {
		name  string
		units ledger.Units
		want  want
	}{
		{"within available", 30, want{ledger.StateSettled, 0, false, 70, 0, 30, 0, 70}},
		{"above available: the rest is debt", 150, want{ledger.StateSettledWithDebt, 80, false, 0, 80, 180, 80, 0}},
		{"frozen: still recorded, all of it debt", 10, want{ledger.StateSettledWithDebt, 10, false, 0, 90, 190, 90, 0}},
		{"beyond the max overdraft: recorded in full, a breach", 110, want{ledger.StateSettledWithDebt, 110, true, 0, 200, 300, 200, 0}},
	}
	for i, step := range steps {
		id := "rec-" + string(rune('a'+i))
		res := c.must(c.record(id, step.units))
		r := res.Reservation
		if r.State != step.want.state || r.Overdraft[0] != step.want.overdraft || r.Breach != step.want.breach ||
			r.Reserved != (ledger.Amounts{}) || r.Actual[0] != step.units || res.Replayed || res.Refunded != (ledger.Amounts{}) {
			t.Fatalf("%s: receipt %+v replayed %v refunded %v; want %+v", step.name, r, res.Replayed, res.Refunded, step.want)
		}
		if res.Generation != gen || res.Available[0] != step.want.remainingAvailable {
			t.Fatalf("%s: generation %d available %d; want %d %d", step.name, res.Generation, res.Available[0], gen, step.want.remainingAvailable)
		}
		bal := c.account(gen).Balances[0]
		if bal.Available != step.want.available || bal.Debt() != step.want.debt || bal.Spent != step.want.spent ||
			bal.OverdraftIssued != step.want.issued || bal.Reserved != 0 {
			t.Fatalf("%s: balance %+v; want %+v", step.name, bal, step.want)
		}
	}
	if got := c.account(gen).Breaches; got != 1 {
		t.Fatalf("breaches %d, want 1", got)
	}
	// The debt freezes admission as a settle's does ...
	if res := c.reserve("after", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("reserve while a record's debt is owed: %v, want ErrAdmissionFrozen", res.Err)
	}
	// ... until refills repay it: 200 owed at 10/s, then 1 to reserve.
	c.advance(20 * time.Second)
	if res := c.reserve("after", 1); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("reserve once the debt is repaid, with nothing minted beyond it: %v, want ErrInsufficientCapacity", res.Err)
	}
	c.advance(time.Second)
	c.must(c.reserve("after-refill", 1))
	if bal := c.account(gen).Balances[0]; bal.Debt() != 0 || bal.OverdraftRepaid != 200 {
		t.Fatalf("after refills: %+v, want the debt of 200 repaid", bal)
	}
}

// TestRecordIdempotent: a record is idempotent under its id. A retry with
// the same operation and usage replays the first receipt and charges
// nothing; other usage or another operation is ErrReservationAlreadySettled
// (the first record stands); another digest, or an id a Reserve made, is
// ErrDigestMismatch; a Settle of the record with its operation and usage
// (a gateway's retry through settle) replays too.
func TestRecordIdempotent(t *testing.T) {
	c := newChecked(t)
	gen := c.publish(policyOf(tokens(100, 10)))
	first := c.must(c.record("r", 120))
	if first.Reservation.State != ledger.StateSettledWithDebt {
		t.Fatalf("first record: %s, want SETTLED_WITH_DEBT", first.Reservation.State)
	}
	balances := c.account(gen).Balances
	base := ledger.Command{Kind: ledger.KindRecord, ReservationID: "r", RequestDigest: "record:r", OperationID: "op-r",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{120}}
	with := func(f func(*ledger.Command)) ledger.Command { cmd := base; f(&cmd); return cmd }
	cases := []struct {
		name     string
		cmd      ledger.Command
		err      error
		replayed bool
	}{
		{"retry", base, nil, true},
		{"retry after time passed", base, nil, true},
		{"other usage", with(func(c *ledger.Command) { c.Units[0] = 121 }), ledger.ErrReservationAlreadySettled, false},
		{"other operation", with(func(c *ledger.Command) { c.OperationID = "op-other" }), ledger.ErrReservationAlreadySettled, false},
		{"other digest", with(func(c *ledger.Command) { c.RequestDigest = "record:other"; c.Units[0] = 5 }), ledger.ErrDigestMismatch, false},
		{"settle with the same operation and usage", ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{120}}, nil, true},
		{"settle with other usage", ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{1}}, ledger.ErrReservationAlreadySettled, false},
	}
	for _, tc := range cases {
		if tc.name == "retry after time passed" {
			c.advance(time.Minute)
		}
		res := c.apply(tc.cmd)
		if !errors.Is(res.Err, tc.err) || (tc.err == nil) != (res.Err == nil) || res.Replayed != tc.replayed {
			t.Fatalf("%s: err %v replayed %v; want %v %v", tc.name, res.Err, res.Replayed, tc.err, tc.replayed)
		}
		if res.Reservation.ID != "r" || res.Reservation.Actual != first.Reservation.Actual {
			t.Fatalf("%s: answered receipt %+v, want the first record's", tc.name, res.Reservation)
		}
	}
	// Nothing above charged twice: the account moved only by the minute's
	// refill (which repays the debt first).
	after := c.account(gen).Balances[0]
	if after.Spent != balances[0].Spent || after.OverdraftIssued != balances[0].OverdraftIssued {
		t.Fatalf("retries charged: spent %d issued %d, first record left %d %d", after.Spent, after.OverdraftIssued,
			balances[0].Spent, balances[0].OverdraftIssued)
	}

	// An id a Reserve made names another request, whatever its state.
	c.must(c.reserve("held", 10))
	res := c.apply(with(func(cmd *ledger.Command) { cmd.ReservationID, cmd.RequestDigest = "held", "sha256:held" }))
	if !errors.Is(res.Err, ledger.ErrDigestMismatch) || res.Reservation.State != ledger.StateReserved {
		t.Fatalf("record under a reserved id with its digest: %v (%s), want ErrDigestMismatch", res.Err, res.Reservation.State)
	}
}

// TestRecordRetired: a removed record answers from its tombstone as its
// first answer did, as far as the tombstone allows: its own digest
// replays (success, Replayed, the tombstone's receipt with Retired set,
// its terminal state and generation, no usage), also with other usage
// (the tombstone keeps none to compare); another digest is
// ErrDigestMismatch, also matching ErrReservationRetired. Nothing is
// charged again.
func TestRecordRetired(t *testing.T) {
	c := newChecked(t)
	gen := c.publish(policyOf(tokens(100, 10)))
	c.must(c.record("r", 140)) // beyond the burst: SETTLED_WITH_DEBT
	c.advance(time.Hour)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "r", Before: c.now}))
	for _, units := range []ledger.Units{140, 41} {
		res := c.record("r", units)
		if res.Err != nil || !res.Replayed || !res.Reservation.Retired || res.Reservation.State != ledger.StateSettledWithDebt ||
			res.Reservation.ID != "r" || res.Reservation.RequestDigest != "record:r" || res.Generation != gen ||
			res.Reservation.Actual != (ledger.Amounts{}) {
			t.Fatalf("record of a retired record with usage %d: %+v, want a replay from the tombstone", units, res)
		}
	}
	res := c.apply(ledger.Command{Kind: ledger.KindRecord, ReservationID: "r", RequestDigest: "record:other", OperationID: "op-r",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{140}})
	if !errors.Is(res.Err, ledger.ErrDigestMismatch) || !errors.Is(res.Err, ledger.ErrReservationRetired) || res.Replayed {
		t.Fatalf("record under a retired id with another digest: %v, want digest mismatch and retired", res.Err)
	}
	// A Reserve's reservation removed by retention is another request.
	c.must(c.reserve("q", 5))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "q"}))
	c.advance(time.Hour)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "q", Before: c.now}))
	if res := c.record("q", 5); !errors.Is(res.Err, ledger.ErrDigestMismatch) || res.Replayed {
		t.Fatalf("record under a retired Reserve's id: %+v, want digest mismatch", res)
	}
}

// TestRecordRefusals: what a record refuses, none of it for capacity.
func TestRecordRefusals(t *testing.T) {
	c := newChecked(t)
	gen := c.publish(policyOf(tokens(100, 10)))
	ok := ledger.Command{Kind: ledger.KindRecord, ReservationID: "x", RequestDigest: "record:x", OperationID: "op-x",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{5}}
	with := func(f func(*ledger.Command)) ledger.Command { cmd := ok; f(&cmd); return cmd }
	cases := []struct {
		name string
		cmd  ledger.Command
		err  error
	}{
		{"no id", with(func(c *ledger.Command) { c.ReservationID = "" }), ledger.ErrInvalidCommand},
		{"no operation", with(func(c *ledger.Command) { c.OperationID = "" }), ledger.ErrInvalidCommand},
		{"negative", with(func(c *ledger.Command) { c.Units[0] = -1 }), ledger.ErrInvalidCommand},
		{"above MaxUnits", with(func(c *ledger.Command) { c.Units[0] = ledger.MaxUnits + 1 }), ledger.ErrInvalidCommand},
		{"nothing used", with(func(c *ledger.Command) { c.Units[0] = 0 }), ledger.ErrInvalidCommand},
		{"every subject", with(func(c *ledger.Command) { c.Subject = ledger.AnySubject }), ledger.ErrInvalidCommand},
		{"no region", with(func(c *ledger.Command) { c.Region = "" }), ledger.ErrInvalidCommand},
		{"a dimension the policy lacks", with(func(c *ledger.Command) { c.Units[1] = 3 }), ledger.ErrInvalidCommand},
		{"units ordered for another generation", with(func(c *ledger.Command) { c.Generation = gen + 7 }), ledger.ErrInvalidCommand},
		{"no policy", with(func(c *ledger.Command) { c.Subject = "nobody" }), ledger.ErrNoPolicy},
		// Larger than the max reservation and the burst: still recorded.
		{"larger than any reservation", with(func(c *ledger.Command) { c.Units[0] = 10_000 }), nil},
	}
	for _, tc := range cases {
		res := c.apply(tc.cmd)
		if !errors.Is(res.Err, tc.err) || (tc.err == nil) != (res.Err == nil) {
			t.Fatalf("%s: %v, want %v", tc.name, res.Err, tc.err)
		}
	}
	if n := len(c.m.Reservations()); n != 1 {
		t.Fatalf("%d reservations, want only the one recorded", n)
	}
}

// TestRecordRetryAcrossReorderedPolicy: a retry mapped by a republished
// generation whose units are in another order still replays (the usage
// is compared by unit name), and other usage is still a conflict.
func TestRecordRetryAcrossReorderedPolicy(t *testing.T) {
	c := newChecked(t)
	requests := ledger.Dimension{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Second}
	first := c.publish(policyOf(tokens(100, 10), requests))
	cmd := ledger.Command{Kind: ledger.KindRecord, ReservationID: "r", RequestDigest: "record:r", OperationID: "op-r",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{50, 1}, Generation: first}
	c.must(c.apply(cmd))
	second := c.publish(policyOf(requests, tokens(100, 10)))
	retry := cmd
	retry.Units, retry.Generation = ledger.Amounts{1, 50}, second
	if res := c.apply(retry); res.Err != nil || !res.Replayed {
		t.Fatalf("retry mapped by the reordered generation: %v, replayed %v; want a replay", res.Err, res.Replayed)
	}
	retry.Units = ledger.Amounts{1, 51}
	if res := c.apply(retry); !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) {
		t.Fatalf("other usage mapped by the reordered generation: %v, want ErrReservationAlreadySettled", res.Err)
	}
	retry.Units = ledger.Amounts{50, 1}
	if res := c.apply(retry); !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) {
		t.Fatalf("the first order under the reordered generation (other usage): %v, want ErrReservationAlreadySettled", res.Err)
	}
}

// TestReserveRefusesARecordDigest: a Reserve whose digest starts with
// RecordDigestPrefix is refused (ErrInvalidCommand) before its id is
// looked up, so a record's digest is never a reservation's: a Reserve
// under a forged record digest would, once settled and removed by
// retention, let a record retry under its id replay its tombstone
// instead of DIGEST_MISMATCH.
func TestReserveRefusesARecordDigest(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(100, 10)))
	forged := ledger.Command{Kind: ledger.KindReserve, ReservationID: "f", RequestDigest: ledger.RecordDigestPrefix + "f",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{5}}
	if res := c.apply(forged); !errors.Is(res.Err, ledger.ErrInvalidCommand) || res.Reservation.ID != "" {
		t.Fatalf("reserve with a record digest: %+v", res)
	}
	// The id stays free for the record it belongs to.
	if res := c.record("f", 5); res.Err != nil || res.Replayed {
		t.Fatalf("record after the refused reserve: %+v", res)
	}
	if res := c.apply(forged); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("reserve with a record digest under a record's id: %+v, want invalid before the lookup", res)
	}
}
