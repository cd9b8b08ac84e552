package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Retention removes only finished reservations past the cutoff, keeps the
// audit whole through the account's retained totals, and answers every
// later command on a removed id from its tombstone without debiting or
// refunding anything.
func TestRetireAndReplayFromTombstone(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 1)))
	c.must(c.reserve("done", 100))
	c.must(c.start("done"))
	c.must(c.settle("done", 700)) // 600 of debt beyond... capped by available
	c.must(c.reserve("held", 10))
	finished := c.now
	retire := func(id string, before time.Time) ledger.Result {
		return c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: before})
	}
	if res := retire("held", c.now); !errors.Is(res.Err, ledger.ErrReservationNotFinished) {
		t.Fatalf("retire of a RESERVED hold: %+v", res)
	}
	if res := retire("done", finished.Add(-time.Nanosecond)); !errors.Is(res.Err, ledger.ErrReservationNotDue) {
		t.Fatalf("retire before the cutoff: %+v", res)
	}
	if res := retire("nobody", c.now); !errors.Is(res.Err, ledger.ErrReservationNotFound) {
		t.Fatalf("retire of an unknown id: %+v", res)
	}
	before := *c.account(g)
	res := c.must(retire("done", finished))
	if !res.Reservation.Retired || res.Reservation.State != ledger.StateSettled && res.Reservation.State != ledger.StateSettledWithDebt {
		t.Fatalf("retire answered %+v", res)
	}
	if _, ok := c.m.Reservation("done"); ok {
		t.Fatal("the row is still there")
	}
	if again := retire("done", finished); again.Err != nil || !again.Replayed {
		t.Fatalf("second retire: %+v", again)
	}
	// A retried reserve is answered from the tombstone: no new hold.
	replay := c.reserve("done", 100)
	if replay.Err != nil || !replay.Replayed || !replay.Reservation.Retired || replay.Reservation.RequestDigest != "sha256:done" {
		t.Fatalf("reserve replay after retire: %+v", replay)
	}
	other := c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: "done", RequestDigest: "sha256:other",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{5}})
	if !errors.Is(other.Err, ledger.ErrDigestMismatch) || !errors.Is(other.Err, ledger.ErrReservationRetired) {
		t.Fatalf("reserve with another digest after retire: %+v", other)
	}
	settle := c.settle("done", 700)
	if !errors.Is(settle.Err, ledger.ErrReservationAlreadySettled) || !errors.Is(settle.Err, ledger.ErrReservationRetired) || settle.Refunded != (ledger.Amounts{}) {
		t.Fatalf("settle after retire: %+v", settle)
	}
	if st := c.start("done"); !errors.Is(st.Err, ledger.ErrReservationRetired) {
		t.Fatalf("start after retire: %+v", st)
	}
	if after := c.account(g); after.Balances != before.Balances {
		t.Fatalf("retire or a replay changed balances: %+v -> %+v", before.Balances, after.Balances)
	}

	// A released one: release is a replay from its tombstone.
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "held"}))
	c.must(retire("held", c.now))
	if rel := c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "held"}); rel.Err != nil || !rel.Replayed || !rel.Reservation.Retired {
		t.Fatalf("release after retire: %+v", rel)
	}

	// Past the horizon the tombstone goes, and the id is unknown again.
	forget := func(id string, before time.Time) ledger.Result {
		return c.apply(ledger.Command{Kind: ledger.KindForget, ReservationID: id, Before: before})
	}
	if res := forget("done", finished.Add(-time.Nanosecond)); !errors.Is(res.Err, ledger.ErrReservationNotDue) {
		t.Fatalf("forget before the horizon: %+v", res)
	}
	c.must(forget("done", finished))
	if res := forget("done", finished); !errors.Is(res.Err, ledger.ErrReservationNotFound) {
		t.Fatalf("second forget: %+v", res)
	}
	c.advance(time.Hour)
	if res := c.reserve("done", 1); res.Err != nil || res.Replayed || res.Reservation.Retired {
		t.Fatalf("reserve of a forgotten id: %+v", res)
	}
}

// A reservation that finished at or before the tombstone horizon's cutoff
// (ForgetBefore) is retired without a tombstone: one later would be
// forgotten at once. One that finished after it keeps its tombstone. The
// audit holds either way.
func TestRetirePastTheHorizonLeavesNoTombstone(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 1)))
	c.must(c.reserve("old", 10))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "old"}))
	oldFinished := c.now
	c.advance(time.Minute)
	c.must(c.reserve("recent", 10))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "recent"}))
	for _, id := range []string{"old", "recent"} {
		res := c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: c.now, ForgetBefore: oldFinished}))
		if !res.Reservation.Retired || res.Reservation.State != ledger.StateReleased {
			t.Fatalf("retire %s answered %+v", id, res)
		}
		if _, ok := c.m.Reservation(id); ok {
			t.Fatalf("%s: the row is still there", id)
		}
	}
	if _, ok := c.m.Tombstone("old"); ok {
		t.Fatal("a reservation that finished before the tombstone horizon left a tombstone")
	}
	if _, ok := c.m.Tombstone("recent"); !ok {
		t.Fatal("a reservation that finished after the tombstone horizon left no tombstone")
	}
	if res := c.reserve("old", 1); res.Err != nil || res.Replayed || res.Reservation.Retired {
		t.Fatalf("reserve of an id retired past the horizon: %+v", res)
	}
}

// A book without tombstones cannot retire: removing the row would lose
// the answer to a retry.
func TestRetireNeedsATombstoneBook(t *testing.T) {
	var b ledger.Book = plainBook{ledger.NewMemory()}
	if res := ledger.Apply(b, &ledger.Command{Kind: ledger.KindRetire, ReservationID: "x"}, t0); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("retire on a plain book: %+v", res)
	}
}

// plainBook hides Memory's retention methods.
type plainBook struct{ ledger.Book }

// The audit notices a retained total that does not match the account.
func TestAuditCountsRetainedUsage(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 1)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	c.must(c.settle("a", 40))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "a", Before: c.now}))
	s := c.m.Snapshot()
	if len(s.Retained) != 1 || s.Retained[0].Spent[0] != 40 || s.Retained[0].Reservations != 1 {
		t.Fatalf("retained %+v", s.Retained)
	}
	s.Retained[0].Spent[0] = 39
	found := false
	for _, d := range ledger.Audit(s) {
		found = found || d.Check == ledger.CheckSpent
	}
	if !found {
		t.Fatalf("audit missed a retained total off by one (account %+v)", c.account(g).Balances[0])
	}
}
