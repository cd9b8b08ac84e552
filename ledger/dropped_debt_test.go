package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// requestsDim is a second unit: 2 requests of burst, refilling 1 a second.
var requestsDim = ledger.Dimension{Unit: "requests", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}

// mustFreeze fails unless res is the refusal of an account frozen by debt
// in requests, under generation g, retrying after wait.
func mustFreeze(t *testing.T, res ledger.Result, g uint64, wait time.Duration) {
	t.Helper()
	mustFreezeIn(t, res, "requests", g, wait)
}

// mustFreezeIn is mustFreeze for debt owed in unit.
func mustFreezeIn(t *testing.T, res ledger.Result, unit string, g uint64, wait time.Duration) {
	t.Helper()
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Dimension != unit || res.Generation != g || res.RetryAfter != wait {
		t.Fatalf("reserve while %s are owed: err %v, dimension %q, generation %d, retry after %s; want %v, %s, %d, %s",
			unit, res.Err, res.Dimension, res.Generation, res.RetryAfter, ledger.ErrAdmissionFrozen, unit, g, wait)
	}
}

// A generation that drops a unit the subject owes debt in does not take
// the subject over until that debt is repaid: the owing generation's
// account stays current, its refill repays the debt at its own rate (and
// mints nothing beyond it in the dropped unit), the subject's admission
// under the new generation is frozen meanwhile, as by its own debt, and
// resumes, on the new generation's account, once it is repaid. The
// harness audits conservation on every account after each command.
func TestDroppedUnitDebtFreezesUntilRepaid(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))                // 1 held, 1 available: 3 requests owed
	g2 := c.publish(policyOf(tokens(1000, 100))) // no requests dimension
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	c.advance(2 * time.Second)
	mustFreeze(t, c.reserve("c", 10), g2, time.Second)
	c.advance(3 * time.Second) // 2 seconds more than the debt needs
	res := c.must(c.reserve("d", 10))
	if res.Generation != g2 || res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted after the debt was repaid: %+v", res)
	}
	old := c.account(g1).Balances[1]
	if old.Debt() != 0 || old.Minted != 3 || old.Available != 0 {
		t.Fatalf("requests on generation %d: %+v; want the 3 owed repaid by refill, nothing more minted", g1, old)
	}
}

// Late debt: work reserved under the old generation settles above its
// hold, in a unit the new generation dropped, after the subject switched.
// The old generation's account becomes current again: the subject's
// admission is frozen until its refill repays the debt, capacity a late
// refund brings meanwhile goes to it, and once repaid the subject switches
// back to the new generation, which admits.
func TestLateDroppedUnitDebtFreezesUntilRepaid(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	g2 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("b", 10)) // switches the subject to g2
	c.must(c.start("b"))
	c.must(c.settle("a", 100, 5)) // late: 3 requests owed on g1
	if d := c.account(g1).Balances[1].Debt(); d != 3 {
		t.Fatalf("generation %d owes %d requests, want 3", g1, d)
	}
	mustFreeze(t, c.reserve("c", 10), g2, 3*time.Second)
	c.must(c.settle("b", 4)) // a late refund of g2's hold, while g1 is current
	c.advance(3 * time.Second)
	res := c.must(c.reserve("d", 10))
	if res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s after the debt was repaid, want generation %d", res.Reservation.Account, g2)
	}
	if old := c.account(g1).Balances[1]; old.Debt() != 0 {
		t.Fatalf("requests on generation %d: %+v", g1, old)
	}
}

// A rolled-back generation that owes debt in a unit the generation it
// falls back to does not limit stays current, but mints only to repay:
// its refill repays the debt and nothing else, then the subject switches.
func TestRolledBackDroppedUnitDebtRepaysOnly(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	g2 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 500, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 500, 5)) // 3 requests owed on g2, tokens below the burst
	c.must(c.rollback(testSubject, g2))
	c.advance(time.Second)
	mustFreeze(t, c.reserve("b", 10), g1, 2*time.Second)
	tokensBefore := c.account(g2).Balances[0].Minted
	c.advance(2 * time.Second)
	c.must(c.reserve("c", 10))
	a := c.account(g2).Balances
	if a[1].Debt() != 0 || a[1].Minted != 3 || a[0].Minted != tokensBefore {
		t.Fatalf("rolled-back generation %d: %+v; want 3 requests minted to repay, no tokens", g2, a)
	}
}
