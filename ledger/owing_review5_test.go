package ledger_test

import (
	"testing"
	"time"
)

// Defects found by the fifth adversarial review of the owing set, right
// after the fourth review's fixes (2c8517d2). Each test fails on main at
// 20cbbef3 and names the promise it checks and the numbers that break it.

// Promise (DESIGN.md accounting model: "minted capacity repays debt
// first, then fills available up to burst. While debt > 0 the account
// admits nothing"; seed gates "capacity minted from nothing" and
// admission under debt). Sequence: g0 (tokens 1000 +100/s, images)
// decides; g1 (tokens, requests) is published and takes over; "a" (10
// tokens, 1 request) runs on g1; g1 is rolled back, g0 decides again and
// "c" reserves 980 tokens on it. a settles late with 400 tokens and 5
// requests: g1 owes 3 requests (a unit g0 does not limit) and tokens;
// markOwing makes g1 current and makeCurrent moves g0's token debt there:
// g1 (rolled back, current) owes 380 tokens, g0 holds 0 available. c
// settles 980. The subject, one bucket, owes 380 tokens and refills 100 a
// second: after 3 s it still owes 80 and may admit nothing. But g1, rolled
// back, refills to repay its debt (bringOwingToNow) while g0's account,
// the deciding one, refills every unit fully because the current account
// "refills only to repay" (settleOwing): the subject refills 200 tokens a
// second, and at 3 s a reserve of 10 is admitted with 220 tokens
// available on g0.
func TestOwingReview5RolledBackCurrentRepaysBesideDecidingRefill(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100), imagesDim))
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 10, 1)) // switches to g1
	c.must(c.start("a"))
	c.rollback(testSubject, g1) // g0 decides again
	c.must(c.reserve("c", 980)) // switches g1 -> g0: 10 available, 980 reserved
	c.must(c.start("c"))
	c.must(c.settle("a", 400, 5)) // late: g1 owes requests and tokens, made current
	owed := c.account(g1).Balances[0].Debt() + c.account(g0).Balances[0].Debt() - c.account(g0).Balances[0].Available
	c.must(c.settle("c", 980))
	c.advance(3 * time.Second)
	res := c.reserve("x", 10)
	if res.Err == nil && owed > 3*100 {
		t.Fatalf("10 tokens admitted 3 s after the subject owed %d tokens net at 100 a second (%d still owed by one bucket): generation %d tokens %+v, generation %d tokens %+v",
			owed, owed-300, g0, c.account(g0).Balances[0], g1, c.account(g1).Balances[0])
	}
}
