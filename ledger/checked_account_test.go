package ledger_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A command naming a reservation by id alone carries the account its
// caller checked it against (CheckedAccount). When retention forgot that
// reservation and another tenant reused the id before the command was
// applied, the ledger answers exactly as for an id nobody used: not
// found, the same words, nothing changed and nothing said about the other
// tenant's reservation (live or tombstone). The owner's own commands, and
// commands without a checked account, act as before.
func TestCheckedAccountRefusesAReusedID(t *testing.T) {
	tenantA := ledger.PolicyKey{Subject: "tenant-a/u1", Route: testSubject.Route, Region: testSubject.Region}
	tenantB := ledger.PolicyKey{Subject: "tenant-b/u1", Route: testSubject.Route, Region: testSubject.Region}
	reserve := func(c *checked, key ledger.PolicyKey, id string) {
		c.t.Helper()
		c.must(c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + key.Subject + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{100}}))
	}
	// setup publishes both tenants' policies, lets tenant-a reserve and
	// release "r" and retention forget it, then tenant-b reserve "r" and
	// bring it to the state the command acts on (prepare). It returns
	// both accounts.
	setup := func(c *checked, prepare func(c *checked)) (accountA, accountB ledger.AccountKey) {
		c.t.Helper()
		for _, key := range []ledger.PolicyKey{tenantA, tenantB} {
			p := policyOf(tokens(1000, 1))
			p.Key = key
			g := c.publish(p)
			if key == tenantA {
				accountA = ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: g}
			} else {
				accountB = ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: g}
			}
		}
		reserve(c, tenantA, "r")
		c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "r"}))
		c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "r", Before: c.now, ForgetBefore: c.now}))
		reserve(c, tenantB, "r")
		prepare(c)
		return accountA, accountB
	}
	startB := func(c *checked) {
		c.must(c.apply(ledger.Command{Kind: ledger.KindStart, ReservationID: "r", OperationID: "op-r"}))
	}
	// retiredB leaves tenant-b's "r" only as a tombstone.
	retiredB := func(c *checked) {
		startB(c)
		c.must(c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{50}}))
		c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "r", Before: c.now}))
	}
	cases := []struct {
		name    string
		prepare func(c *checked)
		cmd     ledger.Command
	}{
		{"start of a RESERVED one", func(*checked) {}, ledger.Command{Kind: ledger.KindStart, OperationID: "op-r"}},
		{"settle of a STARTED one", startB, ledger.Command{Kind: ledger.KindSettle, OperationID: "op-r", Units: ledger.Amounts{40}}},
		{"settle of a USAGE_UNKNOWN one", func(c *checked) {
			startB(c)
			c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "r"}))
		}, ledger.Command{Kind: ledger.KindSettle, OperationID: "op-r", Units: ledger.Amounts{40}}},
		{"release of a RESERVED one", func(*checked) {}, ledger.Command{Kind: ledger.KindRelease}},
		{"mark unknown of a STARTED one", startB, ledger.Command{Kind: ledger.KindMarkUsageUnknown}},
		{"expiry claim of a hold past its TTL", func(c *checked) { c.advance(time.Minute) }, ledger.Command{Kind: ledger.KindExpireClaim}},
		{"expiry of an EXPIRING one", func(c *checked) {
			c.advance(time.Minute)
			c.must(c.apply(ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "r"}))
		}, ledger.Command{Kind: ledger.KindExpire}},
		{"start of a retired one", retiredB, ledger.Command{Kind: ledger.KindStart, OperationID: "op-r"}},
		{"settle of a retired one", retiredB, ledger.Command{Kind: ledger.KindSettle, OperationID: "op-r", Units: ledger.Amounts{50}}},
		{"release of a retired one", retiredB, ledger.Command{Kind: ledger.KindRelease}},
		{"mark unknown of a retired one", retiredB, ledger.Command{Kind: ledger.KindMarkUsageUnknown}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Checked against tenant-a's account: as an unknown id.
			c := newChecked(t)
			accountA, _ := setup(c, tc.prepare)
			before := c.m.Snapshot()
			cmd := tc.cmd
			cmd.ReservationID, cmd.CheckedAccount = "r", accountA
			got := c.apply(cmd)
			unknown := tc.cmd
			unknown.ReservationID, unknown.CheckedAccount = "never-used", accountA
			want := c.apply(unknown)
			if !errors.Is(want.Err, ledger.ErrReservationNotFound) {
				t.Fatalf("the unknown id answers %v", want.Err)
			}
			if !errors.Is(got.Err, ledger.ErrReservationNotFound) || errors.Is(got.Err, ledger.ErrReservationRetired) ||
				got.Err.Error() != strings.ReplaceAll(want.Err.Error(), "never-used", "r") {
				t.Fatalf("another account's reservation answers %v, want %v", got.Err, want.Err)
			}
			got.Err, want.Err = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("the answer says more than an unknown id's:\n got %+v\nwant %+v", got, want)
			}
			if after := c.m.Snapshot(); !reflect.DeepEqual(before, after) {
				t.Fatal("the refused command changed the book")
			}

			// Checked against tenant-b's own account, or not checked:
			// the command reaches the reservation, as before.
			for _, owner := range []bool{true, false} {
				c := newChecked(t)
				_, accountB := setup(c, tc.prepare)
				cmd := tc.cmd
				cmd.ReservationID = "r"
				if owner {
					cmd.CheckedAccount = accountB
				}
				if res := c.apply(cmd); errors.Is(res.Err, ledger.ErrReservationNotFound) || res.Reservation.ID != "r" {
					t.Fatalf("checked by its owner %v: %+v", owner, res)
				}
			}
		})
	}
}

// A retried command checked against the reservation's own account replays
// as an unchecked retry does: same receipt, Replayed, nothing refunded
// twice.
func TestCheckedAccountKeepsReplays(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 1)))
	own := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: g}
	c.must(c.reserve("r", 100))
	for _, cmd := range []ledger.Command{
		{Kind: ledger.KindStart, ReservationID: "r", OperationID: "op-r"},
		{Kind: ledger.KindMarkUsageUnknown, ReservationID: "r"},
		{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{60}},
	} {
		cmd.CheckedAccount = own
		first := c.must(c.apply(cmd))
		unchecked := cmd
		unchecked.CheckedAccount = ledger.AccountKey{}
		for _, retry := range []ledger.Command{cmd, unchecked} {
			again := c.must(c.apply(retry))
			if !again.Replayed || again.Reservation != first.Reservation || again.Refunded != (ledger.Amounts{}) {
				t.Fatalf("%s retried (checked %v): %+v after %+v", cmd.Kind, retry.CheckedAccount != ledger.AccountKey{}, again, first)
			}
		}
	}
}
