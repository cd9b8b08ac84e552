package ledger_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Across a publish the subject's holds under the generation that admitted
// them count in the new current account's refill room until they end
// (Account.HeldElsewhere): the subject's holds never exceed one burst.
// Each policy here bursts to 1,000 tokens and refills them in 10 s.

// republished returns the test subject's policy with the same tokens
// dimension as first and other terms (a longer hold TTL), so that
// publishing it is a new generation, not a replay.
func republished(ttl time.Duration) *ledger.Policy {
	p := policyOf(tokens(1000, 100))
	p.HoldTTL = ttl
	return p
}

// heldTokens is what the subject's accounts of the given generations hold
// reserved in tokens.
func heldTokens(c *checked, generations ...uint64) ledger.Units {
	var held ledger.Units
	for _, g := range generations {
		held += c.account(g).Balances[0].Reserved
	}
	return held
}

// The probe: 600 held under g0, g1 published, 400 reserved under g1 (what
// g0 had available), 10 s later a reserve of 600 was admitted: 1,600 held
// on a burst of 1,000. It is refused now, with no Retry-After (only the
// holds ending make room); once g0's hold is released the room is back.
func TestHeldElsewhereCountsInRefillRoom(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("old", 600))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("new", 400)) // switches to g1
	if got := c.account(g1).HeldElsewhere[0]; got != 600 {
		t.Fatalf("g1 counts %d tokens held elsewhere after the switch, want g0's 600", got)
	}
	c.advance(10 * time.Second)
	res := c.reserve("over", 600)
	if res.Err == nil {
		t.Fatalf("600 tokens admitted while g0 holds %d and g1 %d on a burst of 1000: g1 tokens %+v",
			heldTokens(c, g0), heldTokens(c, g1), c.account(g1).Balances[0])
	}
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != 0 {
		t.Fatalf("reserve of 600 beside 1000 held: %v, retry after %v; want insufficient capacity with no Retry-After (only holds ending make room)", res.Err, res.RetryAfter)
	}
	// The old hold ends: the room comes back (its refund is forwarded to
	// g1, and g1 no longer counts it).
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "old"}))
	if got := c.account(g1).HeldElsewhere[0]; got != 0 {
		t.Fatalf("g1 counts %d tokens held elsewhere after g0's hold was released, want 0", got)
	}
	c.must(c.reserve("over", 600))
	if held := heldTokens(c, g0, g1); held > 1000 {
		t.Fatalf("the subject holds %d tokens on a burst of 1000", held)
	}
}

// A Retry-After beside holds elsewhere is a promise: 600 held under g0,
// g1 spent the 400 it took over. A reserve of 500 can never fit while
// g0's hold lasts (refill stops at 1000 - 600): no Retry-After. A reserve
// of 300 waits 3 s of refill, and a retry then is admitted.
func TestHeldElsewhereRetryAfterIsHonest(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("old", 600))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("new", 400))
	c.must(c.start("new"))
	c.must(c.settle("new", 400))
	res := c.reserve("big", 500)
	if res.Err == nil || res.RetryAfter != 0 {
		t.Fatalf("reserve of 500 with 600 held elsewhere: %v, retry after %v; want a refusal with no Retry-After", res.Err, res.RetryAfter)
	}
	res = c.reserve("small", 300)
	if res.Err == nil || res.RetryAfter != 3*time.Second {
		t.Fatalf("reserve of 300 on an empty g1: %v, retry after %v; want a refusal, retry after 3s", res.Err, res.RetryAfter)
	}
	c.advance(res.RetryAfter)
	if res := c.reserve("small", 300); res.Err != nil {
		t.Fatalf("retry of 300 after the promised 3s: %v (g1 tokens %+v, held elsewhere %d)", res.Err, c.account(g1).Balances[0], c.account(g1).HeldElsewhere[0])
	}
}

// Two switches in a row: g0 holds 300, g1 holds 300, g2 is published.
// g2 counts both; the room refill leaves is 1000 less both holds; g0's
// release, two generations back, takes its 300 out of g2's count.
func TestHeldElsewhereAcrossTwoSwitches(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("b", 300)) // g1: 400 available
	g2 := c.publish(republished(2 * time.Minute))
	c.advance(10 * time.Second)
	if res := c.reserve("c", 500); res.Err == nil {
		t.Fatalf("500 tokens admitted beside 600 held under g0 and g1: g2 tokens %+v, held elsewhere %d",
			c.account(g2).Balances[0], c.account(g2).HeldElsewhere[0])
	}
	if got := c.account(g2).HeldElsewhere[0]; got != 600 {
		t.Fatalf("g2 counts %d tokens held elsewhere, want 600 (g0's 300 and g1's 300)", got)
	}
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "a"}))
	if got := c.account(g2).HeldElsewhere[0]; got != 300 {
		t.Fatalf("g2 counts %d tokens held elsewhere after g0's release, want g1's 300", got)
	}
	c.must(c.reserve("c", 700))
	if held := heldTokens(c, g0, g1, g2); held != 1000 {
		t.Fatalf("the subject holds %d tokens, want the whole burst of 1000", held)
	}
	if res := c.reserve("d", 1); res.Err == nil {
		t.Fatalf("a token admitted beside a full burst held")
	}
}

// A rollback makes g0, which holds 300 itself, current again: its own
// holds leave the count it takes over (g1's 200 stay), so the 500 g1 had
// available all move back and a reserve of 500 fits (300 + 200 + 500 is
// the burst).
func TestHeldElsewhereRollbackLeavesOwnHolds(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("b", 200)) // g1: 500 available, 300 held elsewhere
	c.must(c.rollback(testSubject, g1))
	c.advance(10 * time.Second)
	c.must(c.reserve("c", 500)) // switches back to g0
	if got := c.account(g0).HeldElsewhere[0]; got != 200 {
		t.Fatalf("g0 counts %d tokens held elsewhere after the rollback, want g1's 200 (its own 300 are not elsewhere)", got)
	}
	if got := c.account(g1).HeldElsewhere[0]; got != 0 {
		t.Fatalf("g1, no longer current, counts %d tokens held elsewhere", got)
	}
	if res := c.reserve("d", 1); res.Err == nil {
		t.Fatalf("a token admitted beside a full burst held (g0 tokens %+v)", c.account(g0).Balances[0])
	}
}

// The old hold expires through the expiry worker's two steps (claim,
// expire): the current account stops counting it and the room comes back.
func TestHeldElsewhereExpiry(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100))) // holds live 30 s
	c.must(c.reserve("old", 600))
	g1 := c.publish(republished(time.Hour))
	c.must(c.reserve("new", 400))
	c.advance(10 * time.Second)
	if res := c.reserve("x", 600); res.Err == nil {
		t.Fatalf("600 tokens admitted beside 1000 held")
	}
	c.advance(25 * time.Second) // the old hold ran out
	c.must(c.apply(ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "old"}))
	c.must(c.apply(ledger.Command{Kind: ledger.KindExpire, ReservationID: "old"}))
	if got := c.account(g1).HeldElsewhere[0]; got != 0 {
		t.Fatalf("g1 counts %d tokens held elsewhere after g0's hold expired, want 0", got)
	}
	c.must(c.reserve("x", 600))
}

// Capacity a switch moves fits in the new burst beside the holds
// elsewhere: g0 holds 300, g1 (same burst) takes its 700 over, g2 bursts
// to 800 and takes only 500 of them (300 are held under g0); 200 stay on
// g1 until there is room.
func TestHeldElsewhereMoveLeavesRoom(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("b", 1))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"})) // g1: 700 available
	p2 := policyOf(tokens(800, 100))
	g2 := c.publish(p2)
	c.must(c.reserve("c", 500)) // switches to g2
	if res := c.reserve("d", 1); res.Err == nil {
		t.Fatalf("a token admitted beside 300 held under g0 and 500 under g2 on a burst of 800 (g2 tokens %+v)", c.account(g2).Balances[0])
	}
	if left := c.account(g1).Balances[0].Available; left != 200 {
		t.Fatalf("g1 kept %d available, want the 200 that did not fit beside g0's hold", left)
	}
	if held := heldTokens(c, g0, g1, g2); held != 800 {
		t.Fatalf("the subject holds %d tokens, want g2's burst of 800", held)
	}
}

// A shard's remint into the current account leaves room for the holds
// elsewhere: g0 holds 500 and lends 300 to a shard; g1 takes g0's 200
// over and refills up to 1000 - 500 held under g0. The shard comes back
// unused: what its remint lifts past that is retired, not made available.
func TestHeldElsewhereRemintLeavesRoom(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.reserve("old", 500))
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 300)))
	p1 := emergencyPolicy()
	p1.HoldTTL = time.Hour
	g1 := c.publish(p1)
	c.must(c.reserve("x", 1)) // switches to g1: 200 moved, 1 held
	c.advance(30 * time.Second)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g1).Key}))
	c.must(c.apply(reconcileCmd("sh-1", "gw-a", nil)))
	a := c.account(g1)
	if bal := a.Balances[0]; bal.Available+bal.Reserved+a.HeldElsewhere[0] > 1000 {
		t.Fatalf("after the remint g1 holds %d available, %d reserved beside %d held elsewhere: above the burst of 1000",
			bal.Available, bal.Reserved, a.HeldElsewhere[0])
	}
}

// Random histories of holds, settles, releases and publishes (every
// generation with the same tokens dimension): the subject's holds under
// all its generations never exceed the burst, and a Retry-After is a
// promise (TestRetryAfterIsAPromise) across publishes too: the same
// request retried after it is admitted.
func TestHeldElsewhereRetryAfterIsAPromiseAcrossPublishes(t *testing.T) {
	promised := 0
	for seed := uint64(0); seed < 1500; seed++ {
		rng := &splitmix{state: seed*0x9e3779b97f4a7c15 + 29}
		c := newChecked(t)
		burst := 50 + rng.Int64N(200)
		d := tokens(burst, 1+rng.Int64N(30))
		d.RefillInterval = time.Duration(1+rng.IntN(3)) * 500 * time.Millisecond
		publish := func(ttl time.Duration) uint64 {
			p := policyOf(d)
			p.HoldTTL = ttl // nothing expires: "nothing else happens"
			return c.publish(p)
		}
		generations := []uint64{publish(time.Hour)}
		var live []string
		for step := 0; step < 4+rng.IntN(16); step++ {
			c.advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			id := fmt.Sprintf("h%d", step)
			switch k := rng.IntN(6); {
			case k < 2 || len(live) == 0:
				if res := c.reserve(id, 1+rng.Int64N(burst/2)); res.Err == nil {
					live = append(live, id)
				}
			case k == 2:
				generations = append(generations, publish(time.Hour+time.Duration(step+1)*time.Second))
			case k == 3:
				r := live[0]
				live = live[1:]
				c.must(c.start(r))
				c.must(c.settle(r, rng.Int64N(burst/2)))
			default:
				r := live[rng.IntN(len(live))]
				live = slices.DeleteFunc(live, func(s string) bool { return s == r })
				c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: r}))
			}
			if held := heldTokens(c, existing(c, generations)...); held > burst {
				t.Fatalf("seed %d: the subject holds %d tokens on a burst of %d", seed, held, burst)
			}
		}
		probe := 1 + rng.Int64N(burst)
		res := c.reserve("probe", probe)
		if res.Err == nil || !res.Rejected() || res.RetryAfter == 0 {
			continue
		}
		promised++
		c.advance(res.RetryAfter)
		if again := c.reserve("probe", probe); again.Err != nil {
			t.Fatalf("seed %d: rejected with Retry-After %v (%v); the same request after it: %v", seed, res.RetryAfter, res.Err, again.Err)
		}
	}
	if promised < 100 {
		t.Fatalf("only %d rejections with a retry-after: the test did not test much", promised)
	}
}

// existing returns the generations of gs that have an account of the
// test subject.
func existing(c *checked, gs []uint64) []uint64 {
	var out []uint64
	for _, g := range gs {
		if _, ok := c.m.Account(ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: g}); ok {
			out = append(out, g)
		}
	}
	return out
}

// A store upgraded to the schema that counts holds elsewhere without the
// migration that counts the holds outstanding then (or an account a
// replica of an earlier version switched) has a current account that did
// not count a hold it should have: when that hold ends the count stays
// at 0, never below (dropHeld), and the room comes back as for a hold
// that was counted.
func TestHeldElsewhereUncountedHoldEndsAtZero(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("old", 300))
	g1 := c.publish(republished(time.Minute))
	c.must(c.reserve("new", 100))
	uncounted := c.account(g1)
	uncounted.HeldElsewhere = ledger.Amounts{}
	c.m.AccountPut(uncounted)
	// Applied around the harness, which would find the count below the
	// holds before the release.
	if res := ledger.Apply(c.book, &ledger.Command{Kind: ledger.KindRelease, ReservationID: "old"}, c.now); res.Err != nil {
		t.Fatalf("release: %v", res.Err)
	}
	if got := c.account(g1).HeldElsewhere; got != (ledger.Amounts{}) {
		t.Fatalf("g1 counts %v held elsewhere after an uncounted hold of 300 ended, want 0", got)
	}
	c.prev = c.m.Snapshot()
	c.advance(10 * time.Second)
	c.must(c.reserve("all", 900))
	if res := c.reserve("more", 1); res.Err == nil {
		t.Fatalf("a token admitted beside a full burst held (g1 tokens %+v)", c.account(g1).Balances[0])
	}
}

// In a unit a generation in between did not limit, the ledger does not
// count the holds from before the gap (ROLLOUT.md, Limitations), and
// HeldElsewhereOf, the count a store's migration sets, counts every hold
// of the subject's other accounts: g0 holds 300 tokens, g1 limits only
// requests, g2 tokens again. The ledger's count on g2 is 0; the
// migration's is g0's 300.
func TestHeldElsewhereOfCountsAcrossAGap(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("old", 300))
	g1 := c.publish(policyOf(ledger.Dimension{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Second}))
	c.must(c.reserve("r", 1))
	g2 := c.publish(republished(time.Minute))
	// The switch: g2's tokens open at 0 (left behind), then refill.
	if res := c.reserve("t0", 1); res.Err == nil {
		t.Fatalf("a token admitted from a unit opened at 0")
	}
	c.advance(time.Second)
	c.must(c.reserve("t", 1))
	cur := c.account(g2)
	if cur.HeldElsewhere[0] != 0 {
		t.Fatalf("the ledger counts %d tokens held elsewhere across the gap; this test expects the gap (0)", cur.HeldElsewhere[0])
	}
	var others []ledger.Holding
	for _, g := range []uint64{g0, g1} {
		p, _ := c.m.Policy(g)
		others = append(others, ledger.Holding{Account: c.account(g), Policy: p})
	}
	p2, _ := c.m.Policy(g2)
	if got := ledger.HeldElsewhereOf(cur, p2, others); got != (ledger.Amounts{300}) {
		t.Fatalf("HeldElsewhereOf across the gap: %v, want g0's 300 tokens", got)
	}
}
