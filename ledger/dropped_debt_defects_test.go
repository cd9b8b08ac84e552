package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Review of 3cda4eec (debt in a dropped unit freezes the subject). Each
// test here fails on that commit: see the commit message of the commit
// that adds them.

// A Record while the subject is frozen by debt in a dropped unit is
// charged to the owing current account, which holds the subject's tokens
// until the switch (on 3cda4eec it was charged to the deciding
// generation's account, which is not current: it held no tokens, so the
// record left debt on it). When that generation is rolled back before
// the switch, no debt of the subject is left on a superseded account
// nothing repays, so the generation the subject falls back to admits
// only while nothing is owed (the harness's CheckStep: no admission while
// any account of the subject owes).
func TestDroppedDebtRecordOnDecidingAccountThenRollbackKeepsFrozen(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))                // 3 requests owed on g1
	g2 := c.publish(policyOf(tokens(1000, 100))) // drops requests: frozen
	rec := c.must(c.record("r", 50))             // charged to g1, the current account
	if rec.Reservation.Account.Generation != g1 || rec.Reservation.State != ledger.StateSettled {
		t.Fatalf("record while frozen: %s on %s; want SETTLED on generation %d", rec.Reservation.State, rec.Reservation.Account, g1)
	}
	c.must(c.rollback(testSubject, g2)) // g1 decides again
	c.advance(10 * time.Second)         // g1's requests debt is long repaid
	c.must(c.reserve("b", 10))
}

// The owing account refills a unit the deciding generation drops only to
// repay (3cda4eec: "nothing beyond the debt is minted there"). That holds
// only while the debt is outstanding: once a Refill (the Refill worker)
// repays it, the account is still current, and the next Refill, or the
// switch on the next command, refills it as an ordinary current account,
// minting available capacity in the dropped unit that stays behind on a
// superseded account (DrainProgress: blockedDroppedUnit, never drained).
func TestDroppedDebtRefillWorkerMintsNothingBeyondTheDebt(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5)) // 3 requests owed
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	key := c.account(g1).Key
	c.advance(3 * time.Second)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRefill, Account: key})) // repays the 3
	c.advance(10 * time.Second)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRefill, Account: key}))
	res := c.must(c.reserve("c", 10))
	if res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
	if old := c.account(g1).Balances[1]; old.Debt() != 0 || old.Minted != 3 || old.Available != 0 {
		t.Fatalf("requests on generation %d: %+v; want the 3 owed repaid and nothing more minted", g1, old)
	}
}

// A Record while the subject is frozen by debt in a dropped unit is
// charged to the deciding generation's account, which holds none of the
// subject's tokens (they are on the owing current account until the
// switch): usage the subject's 900 available tokens cover is recorded as
// debt and, above the max overdraft, as a breach. Before 3cda4eec the
// record switched the subject and took the tokens from available.
func TestDroppedDebtRecordWhileFrozenTakesTheSubjectsAvailable(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5)) // 3 requests owed; 900 tokens available
	c.publish(policyOf(tokens(1000, 100)))
	res := c.must(c.record("r", 600))
	if res.Reservation.State != ledger.StateSettled || res.Reservation.Breach {
		t.Fatalf("record of 600 tokens while 900 are available: state %s, breach %v, overdraft %v; want SETTLED from available",
			res.Reservation.State, res.Reservation.Breach, res.Reservation.Overdraft)
	}
}

// A late refund forwarded to the owing current account that repays its
// debt switches the subject at once (as a Refill that repays it does):
// left current, the account would refill the dropped unit as an ordinary
// current account until the next command, minting capacity in a unit the
// deciding generation does not limit, which stays behind at the switch.
func TestDroppedDebtRepaidByAForwardSwitchesAtOnce(t *testing.T) {
	c := newChecked(t)
	requests5 := requestsDim
	requests5.Burst = 5
	c.publish(policyOf(tokens(1000, 100), requests5))
	c.must(c.reserve("a", 10, 2)) // on g0: 2 requests held, 3 available
	c.must(c.start("a"))
	g1 := c.publish(policyOf(tokens(1000, 50), requests5))
	c.must(c.reserve("b", 100, 1)) // switches to g1 (3 requests move beside a's 2), 1 held
	c.must(c.start("b"))
	c.must(c.settle("b", 100, 5)) // 2 requests owed on g1
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("c", 10), g2, 2*time.Second)
	c.must(c.settle("a", 10, 0)) // late refund: g0's 2 requests forwarded to g1 repay its debt
	c.advance(10 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
	if old := c.account(g1).Balances[1]; old.Debt() != 0 || old.Available != 0 {
		t.Fatalf("requests on generation %d: %+v; want the debt repaid by the forward and nothing minted after it", g1, old)
	}
}
