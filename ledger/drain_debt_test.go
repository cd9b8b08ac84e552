package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Debt settled onto a superseded account while its key admits nothing
// (every generation rolled back: forward has no current account to send it
// to) stays there until the drain moves it: a drain of an account holding
// debt and no available capacity moves the debt to the current account
// (drainable's debt case), instead of ErrNothingToDrain leaving it behind.
func TestDrainMovesDebtLeftWhileNothingAdmitted(t *testing.T) {
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
	c.reserve("c", 1) // switches to generation 3 (from generation 2), refused or not
	c.advance(time.Minute)
	if c.account(g3).Balances[0].Debt() != 0 || c.account(g1).Balances[0].Debt() != 200 {
		t.Fatalf("the switch to generation 3 moved generation 1's debt: want it left for the drain")
	}
	c.must(c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key}))
	if debt := c.account(g1).Balances[0].Debt(); debt != 0 {
		t.Fatalf("generation 1 keeps %d debt after the drain, want it moved to generation 3", debt)
	}
	if bal := c.account(g3).Balances[0]; bal.OverdraftIssued != 200 {
		t.Fatalf("generation 3 after the drain: %+v, want the 200 debt assumed", bal)
	}
}
