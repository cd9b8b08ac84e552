package ledger_test

import (
	"testing"

	"github.com/capledger/capledger/ledger"
)

// Defects of a frozen subject's refill across generations, found by
// TestOwingExplore (seeds 4152, 7515 of EXPLORE_SEEDS=16000) and cut down.
// The policies share each unit's terms (exploreDims: tokens burst 1000
// +100/s, requests and images burst 2 +1/s), so one bucket per unit is
// the bound (mintBound: openings and refill mints since the unit was
// first opened).

// recordUnits records usage of units (in the deciding policy's
// dimensions) under id.
func recordUnits(c *checked, id string, units ...ledger.Units) ledger.Result {
	var a ledger.Amounts
	copy(a[:], units)
	return c.apply(ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: "rec-" + id, OperationID: "op-" + id,
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: a})
}

// Promise (docs/ROLLOUT.md Limitations: a later generation limiting a
// unit again opens it at 0 where the subject's capacity in it may be held
// elsewhere). g1 (tokens) owes tokens when g2 (requests, images) is
// published: frozen, g2's account opens with 2 images, and a record
// spends them. g3 (tokens, images) is published: g2 owes nothing and
// holds no image, so it leaves the owing set, and before the fix it left
// only requests (g3 does not limit them) behind, not images (g3 limits
// them, but the current account g1 does not, so the switch to g3 opens
// them): g3's account opened a second burst of 2 images, 4 created at
// once on a bucket of 2.
func TestOwingTurnsMemberLeavingMarksUnitsTheCurrentAccountDoesNotLimit(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(exploreDims[0]))
	c.must(c.reserve("a", 297))
	c.must(c.start("a"))
	c.must(c.reserve("b", 494))
	c.must(c.settle("a", 717)) // g1 owes tokens
	g2 := c.publish(policyOf(exploreDims[1], exploreDims[2]))
	c.must(recordUnits(c, "rec", 0, 2)) // g2's account spends its 2 images
	g3 := c.publish(policyOf(exploreDims[0], exploreDims[2]))
	c.reserve("c", 466, 2)
	if m := mintBound(c); m != "" {
		t.Fatalf("%s (generation %d %+v, generation %d %+v)", m, g2, c.account(g2).Balances, g3, c.account(g3).Balances)
	}
}
