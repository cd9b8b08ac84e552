package ledger_test

import (
	"errors"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// A command checked against one account (CheckedAccount) does not act on
// a reservation of the same subject on another route: that is another
// account, answered as an unknown id. (A planted break, the check
// comparing subjects alone, passed every other test.)
func TestCheckedAccountIsTheWholeAccountNotItsSubject(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	embed := policyOf(tokens(1000, 100))
	embed.Key.Route = "embed.generate"
	c.publish(embed)
	res := c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:x",
		Subject: testSubject.Subject, Route: "embed.generate", Region: testSubject.Region, Units: ledger.Amounts{10}})
	c.must(res)
	chat := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: g1}
	for _, kind := range []ledger.Kind{ledger.KindRelease, ledger.KindStart} {
		res := c.apply(ledger.Command{Kind: kind, ReservationID: "x", OperationID: "op", CheckedAccount: chat})
		if !errors.Is(res.Err, ledger.ErrReservationNotFound) {
			t.Errorf("%s of another route's reservation checked against %s: %v, want ErrReservationNotFound", kind, chat, res.Err)
		}
	}
	if r, ok := c.m.Reservation("x"); !ok || r.State != ledger.StateReserved {
		t.Fatalf("x after the refused commands: %+v, want still RESERVED", r)
	}
}
