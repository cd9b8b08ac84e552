package ledger_test

import (
	"testing"
	"time"

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

// twoDebtorsOfRequests leaves the subject frozen under g3 (tokens) with
// two accounts owing requests, a unit g3 does not limit: g1 (tokens,
// requests, images), current, owes 3 requests it charged at 2.093 s after
// refilling up to 2 s; g2 (requests), the account of an earlier freeze,
// owes the 2 requests a record charged to it at 0 s, and its refill
// cursor is still at 0 s.
func twoDebtorsOfRequests(t *testing.T) (c *checked, g1, g2 uint64) {
	c = newChecked(t)
	g1 = c.publish(policyOf(exploreDims...))
	c.must(c.reserve("a", 199, 0, 1))
	c.must(recordUnits(c, "rec1", 273, 1, 2)) // g1 owes an image
	g2 = c.publish(policyOf(exploreDims[1]))  // requests only: frozen on g1
	c.must(recordUnits(c, "rec2", 2))         // charged to g2's account, which owes 2 requests
	c.must(c.start("a"))
	c.advance(2093 * time.Millisecond)
	c.must(c.settle("a", 655, 5, 1)) // g1 owes 3 requests
	c.publish(policyOf(exploreDims[0]))
	return c, g1, g2
}

// Promise (README: capacity never beyond the limit; DESIGN: refill mints
// lazily from the refill rule). g1 and g2 both owe requests, which the
// deciding g3 does not limit. Before the fix both repaid their own debt
// at once: g2 from its cursor at 0 s, for the time g1 had refilled
// requests already, so 7 requests were created in 2 s on a bucket of 2
// +1/s (bound 4). They repay in turns: the current account g1 first,
// then g2 from where g1 is repaid.
func TestOwingTurnsTwoDebtorsOfOneUnitDoNotRepayAtOnce(t *testing.T) {
	c, g1, g2 := twoDebtorsOfRequests(t)
	c.must(recordUnits(c, "rec3", 264))
	if m := mintBound(c); m != "" {
		t.Fatalf("%s (generation %d requests %+v, generation %d requests %+v)", m, g1, c.account(g1).Balances[1], g2, c.account(g2).Balances[0])
	}
	for range 8 {
		c.advance(time.Second)
		c.reserve("x", 1)
		if m := mintBound(c); m != "" {
			t.Fatalf("after %v: %s", c.now.Sub(t0), m)
		}
	}
}

// Promise (docs/API.md, Retry-After: a retry after it is not refused
// for the same debt). The frozen refusal's Retry-After counts g2's turn
// after g1's: g1's 3 requests (3 s from its cursor at 2 s), then g2's 2.
// Counted as if both repaid at once (before the fix, slowestOwing) it
// said 3 s, and a retry then is refused again: g2 has not repaid yet.
func TestOwingTurnsRetryAfterWaitsForEveryTurn(t *testing.T) {
	c, g1, g2 := twoDebtorsOfRequests(t)
	first := c.reserve("x", 10)
	if first.Err == nil || first.RetryAfter == 0 {
		t.Fatalf("reserve while two accounts owe requests: %v, retry after %v", first.Err, first.RetryAfter)
	}
	c.advance(first.RetryAfter)
	if res := c.reserve("y", 10); res.Err != nil {
		t.Fatalf("retry after the promised %s refused again: %v (%s, retry after %s); generation %d requests %+v, generation %d requests %+v",
			first.RetryAfter, res.Err, res.Dimension, res.RetryAfter, g1, c.account(g1).Balances[1], g2, c.account(g2).Balances[0])
	}
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

// Promise (the same as TestOwingTurnsTwoDebtorsOfOneUnitDoNotRepayAtOnce).
// A settle (or release) of a hold on the frozen subject's current
// account refilled that account under its own rule, fully, not as an
// owing current account takes its turn (settleOwing): g1 repaid its 3
// requests and minted 2 available beside them for time from 2 s to 7 s,
// and the next command let g2 repay its 2 for the same time from its
// cursor: 10 requests created in 7 s on a bucket of 2 +1/s (bound 9).
func TestOwingTurnsSettleOnTheFrozenCurrentAccountTakesItsTurn(t *testing.T) {
	for _, end := range []string{"settle", "release"} {
		t.Run(end, func(t *testing.T) {
			c := newChecked(t)
			g1 := c.publish(policyOf(exploreDims...))
			c.must(c.reserve("a", 199, 0, 1))
			c.must(c.reserve("b", 10))
			if end == "settle" {
				c.must(c.start("b"))
			}
			c.must(recordUnits(c, "rec1", 273, 1, 2)) // g1 owes an image
			g2 := c.publish(policyOf(exploreDims[1])) // requests only: frozen on g1
			c.must(recordUnits(c, "rec2", 2))         // g2's account owes 2 requests
			c.must(c.start("a"))
			c.advance(2093 * time.Millisecond)
			c.must(c.settle("a", 655, 5, 1)) // g1 owes 3 requests
			c.publish(policyOf(exploreDims[0]))
			c.reserve("x", 10) // frozen: g2 waits for g1's turn
			c.advance(5 * time.Second)
			if end == "settle" {
				c.must(c.settle("b", 10))
			} else {
				c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"}))
			}
			c.reserve("y", 10)
			if m := mintBound(c); m != "" {
				t.Fatalf("%s (generation %d requests %+v, generation %d requests %+v)", m, g1, c.account(g1).Balances[1], g2, c.account(g2).Balances[0])
			}
		})
	}
}

// Promise (docs/API.md PublishPolicy: RecordUsage while frozen is
// charged to the subject's current account from its available first;
// when that account's generation was rolled back, its capacity in the
// units the deciding generation limits has moved to the deciding
// generation's account). g1 (tokens, requests, images) owes images when
// it is rolled back: g0 (tokens, requests) decides, the subject is frozen
// on g1, and g1's tokens move to g0's account. A record of 100 tokens was
// charged to g1, which held none any more: 100 tokens of debt (SETTLED_WITH_DEBT,
// and a breach beyond a smaller max overdraft) while g0's account held
// 900 for the subject. It is charged to g0's account, from its available.
func TestOwingTurnsRecordOnARolledBackCurrentAccountUsesTheMovedCapacity(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(exploreDims[0], exploreDims[1]))
	c.must(c.reserve("a", 100))
	g1 := c.publish(policyOf(exploreDims...))
	c.must(c.reserve("b", 10, 0, 1))
	c.must(c.start("b"))
	c.must(c.settle("b", 10, 0, 4)) // g1 owes images
	c.rollback(testSubject, g1)
	if res := c.reserve("x", 1); res.Err == nil {
		t.Fatalf("reserve while g1 owes images: admitted")
	}
	held := c.account(g0).Balances[0].Available
	res := c.must(recordUnits(c, "rec", 100))
	if res.Reservation.State != ledger.StateSettled || c.account(g0).Balances[0].Available != held-100 {
		t.Fatalf("record of 100 tokens while the subject holds %d on generation %d: %s, generation %d tokens %+v, generation %d tokens %+v",
			held, g0, res.Reservation.State, g0, c.account(g0).Balances[0], g1, c.account(g1).Balances[0])
	}
}
