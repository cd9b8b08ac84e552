package ledger_test

import (
	"testing"
	"time"
)

// Debt settled onto a superseded account while its key admits nothing
// (every generation rolled back: forward has no current account to send it
// to) joins the subject's owing set, so the switch to the next generation
// takes it at once (releaseOwing): the subject is not admitted while it is
// owed. Before, it stayed behind for a drain to move, and the subject was
// admitted meanwhile (found by the ledger model test, seed
// 16081695316167319876).
func TestSwitchTakesDebtLeftWhileNothingAdmitted(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 0)))
	c.must(c.reserve("a", 999)) // all of generation 1 but what b takes
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 0))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switch to generation 2, carrying the 1 b takes
	c.must(c.rollback(testSubject, g2))
	c.must(c.rollback(testSubject, g1)) // the key admits nothing now
	c.must(c.settle("a", 1199))         // 200 over, on generation 1: nowhere to forward it
	if bal := c.account(g1).Balances[0]; bal.Debt() != 200 || bal.Available != 0 {
		t.Fatalf("generation 1 after the late overuse with nothing active: %+v, want 200 debt and nothing available", bal)
	}
	p3 := policyOf(tokens(1000, 100))
	p3.EstimatorDigest = "sha256:v3"
	g3 := c.publish(p3)
	if res := c.reserve("c", 1); res.Err == nil { // switches to generation 3 (from generation 2)
		t.Fatalf("admitted on %s while the subject owes 200", res.Reservation.Account)
	}
	if debt := c.account(g1).Balances[0].Debt(); debt != 0 {
		t.Fatalf("generation 1 keeps %d debt after the switch, want it moved to generation 3", debt)
	}
	if bal := c.account(g3).Balances[0]; bal.OverdraftIssued != 200 || bal.Debt() != 200 {
		t.Fatalf("generation 3 after the switch: %+v, want the 200 debt assumed and owed", bal)
	}
	c.advance(3 * time.Second) // 100 a second repays it
	c.must(c.reserve("d", 1))
}
