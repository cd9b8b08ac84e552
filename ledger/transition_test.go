package ledger_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The reservation commands of the transition table. Each is applied to a
// reservation "r" that was driven into one state first.
const (
	cmdReserveSame     = "reserve"                  // same id, same digest
	cmdReserveOther    = "reserve_other_digest"     // same id, another digest
	cmdStartSame       = "start"                    // operation op-r
	cmdStartOther      = "start_other_operation"    // operation op-x
	cmdSettleSame      = "settle"                   // op-r, the recorded usage when settled, else 60
	cmdSettleDifferent = "settle_different_usage"   // op-r, 70
	cmdSettleOtherOp   = "settle_other_operation"   // op-x, 60
	cmdRelease         = "release"                  //
	cmdClaimDue        = "expire_claim_after_hold"  // past the hold TTL
	cmdClaimEarly      = "expire_claim_before_hold" // at the current time
	cmdExpire          = "expire"                   //
	cmdMarkUnknown     = "mark_usage_unknown"       //
)

var tableCommands = []string{cmdReserveSame, cmdReserveOther, cmdStartSame, cmdStartOther, cmdSettleSame,
	cmdSettleDifferent, cmdSettleOtherOp, cmdRelease, cmdClaimDue, cmdClaimEarly, cmdExpire, cmdMarkUnknown}

// tableStates are every state the ledger stores, plus REQUESTED for a
// reservation id that does not exist yet. RESERVATION_UNKNOWN is the
// caller's state and never stored (see TestReservationUnknownResolvesByID).
var tableStates = []ledger.State{ledger.StateRequested, ledger.StateReserved, ledger.StateStarted,
	ledger.StateSettled, ledger.StateSettledWithDebt, ledger.StateReleased, ledger.StateExpiring,
	ledger.StateExpired, ledger.StateUsageUnknown}

// outcome is one cell of the table: the error the command returns (nil on
// success), whether it is a replay, the state after, and the refund.
type outcome struct {
	err      error
	replayed bool
	state    ledger.State
	refunded ledger.Units
}

func ok(s ledger.State) outcome                { return outcome{state: s} }
func okRefund(s ledger.State, u int64) outcome { return outcome{state: s, refunded: u} }
func replay(s ledger.State) outcome            { return outcome{state: s, replayed: true} }
func fail(s ledger.State, err error) outcome   { return outcome{state: s, err: err} }

var (
	errNotFound   = ledger.ErrReservationNotFound
	errDigest     = ledger.ErrDigestMismatch
	errOperation  = ledger.ErrOperationMismatch
	errNotStarted = ledger.ErrReservationNotStarted
	errStarted    = ledger.ErrReservationAlreadyStarted
	errSettled    = ledger.ErrReservationAlreadySettled
	errReleased   = ledger.ErrReservationReleased
	errExpired    = ledger.ErrReservationExpired
	errNotDue     = ledger.ErrReservationNotDue
)

// transitionTable is every state x command. The reservation holds 100
// units; a settle of 60 refunds 40, of 70 refunds 30; SETTLED_WITH_DEBT
// used 1100 of a burst of 1000.
func transitionTable() map[ledger.State]map[string]outcome {
	const (
		requested, reserved, started, settled, withDebt = ledger.StateRequested, ledger.StateReserved,
			ledger.StateStarted, ledger.StateSettled, ledger.StateSettledWithDebt
		released, expiring, expired, unknown = ledger.StateReleased, ledger.StateExpiring,
			ledger.StateExpired, ledger.StateUsageUnknown
	)
	finished := func(s ledger.State, err error) map[string]outcome {
		return map[string]outcome{
			cmdReserveSame: replay(s), cmdReserveOther: fail(s, errDigest),
			cmdStartSame: fail(s, err), cmdStartOther: fail(s, err),
			cmdSettleSame: fail(s, err), cmdSettleDifferent: fail(s, err), cmdSettleOtherOp: fail(s, err),
			cmdRelease: fail(s, err), cmdClaimDue: fail(s, err), cmdClaimEarly: fail(s, err),
			cmdExpire: fail(s, err), cmdMarkUnknown: fail(s, err),
		}
	}
	settledRow := func(s ledger.State) map[string]outcome {
		return map[string]outcome{
			cmdReserveSame: replay(s), cmdReserveOther: fail(s, errDigest),
			cmdStartSame: replay(s), cmdStartOther: fail(s, errOperation),
			cmdSettleSame: replay(s), cmdSettleDifferent: fail(s, errSettled), cmdSettleOtherOp: fail(s, errSettled),
			cmdRelease: fail(s, errSettled), cmdClaimDue: fail(s, errSettled), cmdClaimEarly: fail(s, errSettled),
			cmdExpire: fail(s, errSettled), cmdMarkUnknown: fail(s, errSettled),
		}
	}
	runningRow := func(s ledger.State) map[string]outcome {
		row := map[string]outcome{
			cmdReserveSame: replay(s), cmdReserveOther: fail(s, errDigest),
			cmdStartSame: replay(s), cmdStartOther: fail(s, errOperation),
			cmdSettleSame: okRefund(settled, 40), cmdSettleDifferent: okRefund(settled, 30),
			cmdSettleOtherOp: fail(s, errOperation),
			cmdRelease:       fail(s, errStarted), cmdClaimDue: fail(s, errStarted), cmdClaimEarly: fail(s, errStarted),
			cmdExpire: fail(s, errStarted), cmdMarkUnknown: ok(unknown),
		}
		if s == unknown {
			row[cmdMarkUnknown] = replay(unknown)
		}
		return row
	}
	expiringRow := finished(expiring, errExpired)
	expiringRow[cmdClaimDue] = replay(expiring)
	expiringRow[cmdClaimEarly] = replay(expiring)
	expiringRow[cmdExpire] = okRefund(expired, 100)
	expiredRow := finished(expired, errExpired)
	expiredRow[cmdExpire] = replay(expired)
	releasedRow := finished(released, errReleased)
	releasedRow[cmdRelease] = replay(released)

	return map[ledger.State]map[string]outcome{
		requested: {
			cmdReserveSame: ok(reserved), cmdReserveOther: ok(reserved),
			cmdStartSame: fail(requested, errNotFound), cmdStartOther: fail(requested, errNotFound),
			cmdSettleSame: fail(requested, errNotFound), cmdSettleDifferent: fail(requested, errNotFound),
			cmdSettleOtherOp: fail(requested, errNotFound), cmdRelease: fail(requested, errNotFound),
			cmdClaimDue: fail(requested, errNotFound), cmdClaimEarly: fail(requested, errNotFound),
			cmdExpire: fail(requested, errNotFound), cmdMarkUnknown: fail(requested, errNotFound),
		},
		reserved: {
			cmdReserveSame: replay(reserved), cmdReserveOther: fail(reserved, errDigest),
			cmdStartSame: ok(started), cmdStartOther: ok(started),
			cmdSettleSame: fail(reserved, errNotStarted), cmdSettleDifferent: fail(reserved, errNotStarted),
			cmdSettleOtherOp: fail(reserved, errNotStarted),
			cmdRelease:       okRefund(released, 100),
			cmdClaimDue:      ok(expiring), cmdClaimEarly: fail(reserved, errNotDue),
			cmdExpire: fail(reserved, errNotDue), cmdMarkUnknown: fail(reserved, errNotStarted),
		},
		started:  runningRow(started),
		unknown:  runningRow(unknown),
		settled:  settledRow(settled),
		withDebt: settledRow(withDebt),
		released: releasedRow,
		expiring: expiringRow,
		expired:  expiredRow,
	}
}

// driveTo puts reservation "r" (100 units) into state s and returns the
// usage it was settled with (0 unless settled).
func driveTo(t *testing.T, c *checked, s ledger.State) ledger.Units {
	t.Helper()
	if s == ledger.StateRequested {
		return 0
	}
	c.must(c.reserve("r", 100))
	switch s {
	case ledger.StateReleased:
		c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "r"}))
	case ledger.StateExpiring, ledger.StateExpired:
		c.advance(31 * time.Second)
		c.must(c.apply(ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "r"}))
		if s == ledger.StateExpired {
			c.must(c.apply(ledger.Command{Kind: ledger.KindExpire, ReservationID: "r"}))
		}
	case ledger.StateStarted, ledger.StateUsageUnknown, ledger.StateSettled, ledger.StateSettledWithDebt:
		c.must(c.start("r"))
	}
	switch s {
	case ledger.StateUsageUnknown:
		c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "r"}))
	case ledger.StateSettled:
		c.must(c.settle("r", 60))
		return 60
	case ledger.StateSettledWithDebt:
		c.must(c.settle("r", 1100))
		return 1100
	}
	if got := reservationState(c, "r"); got != s {
		t.Fatalf("driven to %s, want %s", got, s)
	}
	return 0
}

func reservationState(c *checked, id string) ledger.State {
	r, found := c.m.Reservation(id)
	if !found {
		return ledger.StateRequested
	}
	return r.State
}

// tableCommand builds the command of the table named name for reservation
// "r" settled with usage (if settled).
func tableCommand(c *checked, name string, usage ledger.Units) ledger.Command {
	reserve := ledger.Command{Kind: ledger.KindReserve, ReservationID: "r", RequestDigest: "sha256:r",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{100}}
	if usage == 0 {
		usage = 60
	}
	switch name {
	case cmdReserveSame:
		return reserve
	case cmdReserveOther:
		reserve.RequestDigest = "sha256:other"
		return reserve
	case cmdStartSame:
		return ledger.Command{Kind: ledger.KindStart, ReservationID: "r", OperationID: "op-r"}
	case cmdStartOther:
		return ledger.Command{Kind: ledger.KindStart, ReservationID: "r", OperationID: "op-x"}
	case cmdSettleSame:
		return ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{usage}}
	case cmdSettleDifferent:
		return ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-r", Units: ledger.Amounts{70}}
	case cmdSettleOtherOp:
		return ledger.Command{Kind: ledger.KindSettle, ReservationID: "r", OperationID: "op-x", Units: ledger.Amounts{60}}
	case cmdRelease:
		return ledger.Command{Kind: ledger.KindRelease, ReservationID: "r"}
	case cmdClaimDue:
		c.advance(31 * time.Second)
		return ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "r"}
	case cmdClaimEarly:
		return ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "r"}
	case cmdExpire:
		return ledger.Command{Kind: ledger.KindExpire, ReservationID: "r"}
	case cmdMarkUnknown:
		return ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "r"}
	}
	panic("unknown table command " + name)
}

// TestTransitionTable applies every command to a reservation in every state
// and checks the answer, the state after, the refund, and (through the
// harness) conservation, the audit and the step check; then it applies the
// same command again and checks that the retry changes nothing.
func TestTransitionTable(t *testing.T) {
	table := transitionTable()
	for _, s := range tableStates {
		row, found := table[s]
		if !found {
			t.Fatalf("the table has no row for %s", s)
		}
		if len(row) != len(tableCommands) {
			t.Fatalf("row %s has %d cells, want %d", s, len(row), len(tableCommands))
		}
		for _, name := range tableCommands {
			want, found := row[name]
			if !found {
				t.Fatalf("row %s has no cell for %s", s, name)
			}
			t.Run(fmt.Sprintf("%s/%s", s, name), func(t *testing.T) {
				c := newChecked(t)
				c.publish(policyOf(tokens(1000, 100)))
				usage := driveTo(t, c, s)
				cmd := tableCommand(c, name, usage)
				before, _ := c.m.Reservation("r")
				var held ledger.Reservation
				if before != nil {
					held = *before
				}
				res := c.apply(cmd)
				checkOutcome(t, c, res, want, held)

				// A retry of a command that succeeded is a replay with no
				// refund; a retry of a failed one fails the same way.
				again := c.apply(cmd)
				retry := want
				if want.err == nil {
					retry = outcome{state: want.state, replayed: true}
				}
				var now ledger.Reservation
				if after, found := c.m.Reservation("r"); found {
					now = *after
				}
				checkOutcome(t, c, again, retry, now)
			})
		}
	}
}

func checkOutcome(t *testing.T, c *checked, res ledger.Result, want outcome, before ledger.Reservation) {
	t.Helper()
	switch {
	case want.err == nil && res.Err != nil:
		t.Fatalf("got error %v, want success", res.Err)
	case want.err != nil && !errors.Is(res.Err, want.err):
		t.Fatalf("got error %v, want %v", res.Err, want.err)
	}
	if res.Replayed != want.replayed {
		t.Fatalf("replayed = %v, want %v", res.Replayed, want.replayed)
	}
	if got := reservationState(c, "r"); got != want.state {
		t.Fatalf("state after = %s, want %s", got, want.state)
	}
	if res.Refunded != (ledger.Amounts{want.refunded}) {
		t.Fatalf("refunded %v, want %d", res.Refunded, want.refunded)
	}
	if res.Err != nil || res.Replayed {
		if after, found := c.m.Reservation("r"); found && *after != before {
			t.Fatalf("a failed or replayed command changed the reservation:\n%+v\n%+v", before, *after)
		}
	}
	if res.Err == nil && want.state != ledger.StateRequested && res.Reservation.State != want.state {
		t.Fatalf("receipt says %s, want %s", res.Reservation.State, want.state)
	}
}
