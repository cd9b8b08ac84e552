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

// The limitation docs/ROLLOUT.md states ("Each handover of the subject's
// capacity loses the refill the previous account had accrued but not yet
// minted"): refill mints whole intervals of 10 s, generation 1 minted its
// interval at 10 s, and the switch at 15 s makes generation 2 refill from
// 15 s, so at 20 s, when one bucket would mint its second interval,
// nothing is minted; generation 2 mints its first at 25 s. The subject
// stays 5 s of refill behind one bucket: too little, never too much.
func TestHandoverRefillsFromTheTakeoverLosingThePartInterval(t *testing.T) {
	slow := tokens(1000, 100)
	slow.RefillInterval = 10 * time.Second
	c := newChecked(t)
	c.publish(policyOf(slow))
	c.must(c.reserve("spent", 500))
	c.must(c.start("spent"))
	c.must(c.settle("spent", 500))
	c.advance(15 * time.Second)
	c.must(c.reserve("a", 1)) // generation 1 mints 100 for 0-10 s
	p2 := policyOf(slow)
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1))                 // switches to generation 2 at 15 s
	moved := c.account(g2).Balances[0].Minted // what the switch brought
	minted := func() int64 { return int64(c.account(g2).Balances[0].Minted - moved) }
	c.advance(5 * time.Second)
	c.must(c.reserve("c", 1))
	if got := minted(); got != 0 {
		t.Fatalf("generation 2 minted %d at 20 s, 5 s after taking over; want 0 (it refills from 15 s)", got)
	}
	c.advance(5 * time.Second)
	c.must(c.reserve("d", 1))
	if got := minted(); got != 100 {
		t.Fatalf("generation 2 minted %d at 25 s; want one interval, 100", got)
	}
}
