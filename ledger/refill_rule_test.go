package ledger_test

import (
	"testing"
	"time"
)

// An account made current again after the clock stepped back keeps its
// refill cursor where it refilled up to (refillFromNow never moves a
// cursor back): the seconds between the stepped-back now and that cursor
// were minted once already, before the switch away, so when the clock
// passes them again they mint nothing a second time. Before, the switch
// set the cursor to the stepped-back now and the account minted those
// seconds twice.
func TestSwitchBackAfterClockStepBackMintsNoSecondTwice(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("spent", 600))
	c.must(c.start("spent"))
	c.must(c.settle("spent", 600)) // 400 available
	c.advance(3 * time.Second)
	c.must(c.reserve("a", 1)) // refilled 300 up to now: 699 available
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switches to generation 2, which takes the 698
	c.advance(-3 * time.Second)
	c.must(c.rollback(testSubject, g2))
	c.must(c.reserve("c", 1)) // switches back to generation 1: 697 available
	before := c.account(g1).Balances[0]
	c.advance(3 * time.Second) // back where generation 1 refilled up to
	c.must(c.reserve("d", 1))
	after := c.account(g1).Balances[0]
	if after.Minted != before.Minted || after.Available != before.Available-1 {
		t.Fatalf("generation 1 minted %d when the clock passed the 3 seconds it had refilled already (available %d -> %d)",
			after.Minted-before.Minted, before.Available, after.Available)
	}
}
