package ledger_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// lifecycles runs n lifecycles of the whole burst (reserve, start, settle
// at the estimate), a refill interval apart, with ids prefix-0, prefix-1...
func lifecycles(c *checked, prefix string, n int, units ledger.Units) {
	c.t.Helper()
	for k := range n {
		id := prefix + "-" + string(rune('a'+k%26)) + string(rune('a'+k/26))
		c.must(c.reserve(id, units))
		c.must(c.start(id))
		c.must(c.settle(id, units))
		c.advance(time.Second)
	}
}

// The lifetime bound: 32 lifecycles of 2^53 units spend exactly
// MaxLifetimeUnits; then a reserve that a settle at its estimate could not
// record is refused, a started reservation's settle that would pass the
// bound is refused and leaves it started, and a settle within the bound
// still goes through. The harness audits after every command, so the
// refusals change nothing the audit would see.
func TestLifetimeBoundRefusesWhatCouldOverflow(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(ledger.MaxUnits, ledger.MaxUnits)))
	lifecycles(c, "full", 30, ledger.MaxUnits)
	if spent := c.account(g).Balances[0].Spent; spent != 30*ledger.MaxUnits {
		t.Fatalf("spent %d after 30 lifecycles", spent)
	}
	// Three small reservations while there is room; two settles of 2^53
	// each (mostly debt) then fill the bound exactly.
	for _, id := range []string{"x", "y", "z"} {
		c.must(c.reserve(id, 1))
		c.must(c.start(id))
	}
	c.must(c.settle("x", ledger.MaxUnits))
	c.must(c.settle("y", ledger.MaxUnits))
	a := c.account(g)
	if a.Balances[0].Spent != ledger.MaxLifetimeUnits {
		t.Fatalf("spent %d, want the bound %d", a.Balances[0].Spent, ledger.MaxLifetimeUnits)
	}
	before := *a

	res := c.settle("z", 2)
	if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) || res.Reservation.State != ledger.StateStarted {
		t.Fatalf("settle past the bound: %v, state %v", res.Err, res.Reservation.State)
	}
	// The refusal names the unit, as every other message of the API does,
	// not only the dimension's index, which callers never see.
	if !strings.Contains(res.Err.Error(), `"tokens"`) {
		t.Fatalf("settle past the bound names no unit: %v", res.Err)
	}
	if after := c.account(g); after.Balances != before.Balances {
		t.Fatalf("a refused settle changed the account:\n%+v\n%+v", before.Balances[0], after.Balances[0])
	}
	c.advance(time.Hour) // refill repays the debt; spent stays
	if res := c.reserve("next", 1); !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("reserve on a full account: %v", res.Err)
	}
	// Usage within the bound is still recorded: z used nothing after all.
	if res := c.must(c.settle("z", 0)); res.Refunded[0] != 1 || res.Reservation.State != ledger.StateSettled {
		t.Fatalf("settle of z at 0: %+v", res)
	}

	// A new generation is a fresh account: the subject admits again.
	g2 := c.publish(policyOf(tokens(ledger.MaxUnits, ledger.MaxUnits-1)))
	if g2 == g {
		t.Fatal("no new generation")
	}
	c.must(c.reserve("fresh", 1))
	if spent := c.account(g2).Balances[0].Spent; spent != 0 {
		t.Fatalf("the new generation's account starts with spent %d", spent)
	}
}

// Shard cycles retire and remint the whole burst; after 32 of them the
// retired-for-emergency term is at the bound and the next issuance is
// refused without touching the account.
func TestLifetimeBoundRefusesShardIssuance(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(ledger.MaxUnits, ledger.MaxUnits))
	p.EmergencyMode = true
	g := c.publish(p)
	for k := range 32 {
		id := "sh-" + string(rune('a'+k%26)) + string(rune('a'+k/26))
		c.must(c.apply(issueCmd(id, "gw-a", uint64(k+1), ledger.MaxUnits)))
		c.must(c.apply(reconcileCmd(id, "gw-a", nil)))
	}
	a := c.account(g)
	if a.Balances[0].RetiredForEmergency != ledger.MaxLifetimeUnits {
		t.Fatalf("retired for emergency %d, want the bound", a.Balances[0].RetiredForEmergency)
	}
	before := *a
	res := c.apply(issueCmd("sh-over", "gw-a", 99, 1))
	if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("issuance past the bound: %v", res.Err)
	}
	if after := c.account(g); after.Balances != before.Balances || len(c.m.Shards()) != 32 {
		t.Fatalf("a refused issuance changed the ledger")
	}
}

// settledReceipts returns n SETTLED receipts of prefix-k each using units.
func settledReceipts(prefix string, n int, state ledger.State, units ledger.Units) []ledger.ShardReceipt {
	out := make([]ledger.ShardReceipt, n)
	for k := range out {
		out[k] = ledger.ShardReceipt{ReservationID: fmt.Sprintf("%s-%d", prefix, k), State: state, Actual: ledger.Amounts{units}}
	}
	return out
}

// Usage a shard could not cover is charged to the destination as debt
// that is not spent there, so the spent bound does not cover it: a
// gateway could report thousands of receipts of MaxUnits against a
// one-unit shard and overflow the destination's OverdraftIssued and
// RetiredForMove (or the submission's own sum). Such a submission is
// refused with nothing changed, on the first submission, across shards,
// and on receipts left unknown (which may hold nothing) resolved later.
func TestLifetimeBoundRefusesShardCharges(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 10))
	p.EmergencyMode = true
	g := c.publish(p)
	for k, id := range []string{"a", "b", "c"} {
		c.must(c.apply(issueCmd(id, "gw-a", uint64(k+1), 1)))
	}

	// 33 receipts of 2^53: more usage than the bound in one submission.
	before := *c.account(g)
	res := c.apply(reconcileCmd("a", "gw-a", settledReceipts("a", 33, ledger.StateSettled, ledger.MaxUnits)))
	if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("a submission charging 33 × 2^53: %v", res.Err)
	}
	if sh, _ := c.m.Shard("a"); sh.Reconciled || c.account(g).Balances != before.Balances {
		t.Fatalf("a refused submission changed the ledger: reconciled %v", sh.Reconciled)
	}

	// 31 receipts fit; a second shard's 31 would take the destination's
	// RetiredForMove past the bound.
	c.must(c.apply(reconcileCmd("a", "gw-a", settledReceipts("a", 31, ledger.StateSettled, ledger.MaxUnits))))
	before = *c.account(g)
	res = c.apply(reconcileCmd("b", "gw-a", settledReceipts("b", 31, ledger.StateSettled, ledger.MaxUnits)))
	if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("a second charge past the bound: %v", res.Err)
	}
	if sh, _ := c.m.Shard("b"); sh.Reconciled || c.account(g).Balances != before.Balances {
		t.Fatal("a refused charge changed the ledger")
	}
	if rfm := c.account(g).Balances[0].RetiredForMove; rfm > ledger.MaxLifetimeUnits {
		t.Fatalf("retired for move %d past the bound", rfm)
	}

	// Receipts left unknown holding nothing, resolved later with 2^53 each.
	c.must(c.apply(reconcileCmd("c", "gw-a", settledReceipts("c", 33, ledger.StateUsageUnknown, 0))))
	res = c.apply(reconcileCmd("c", "gw-a", settledReceipts("c", 33, ledger.StateSettled, ledger.MaxUnits)))
	if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("resolving 33 empty unknown holds with 2^53 each: %v", res.Err)
	}
	// Nothing was resolved: the same receipts resolve with real usage.
	c.must(c.apply(reconcileCmd("c", "gw-a", settledReceipts("c", 33, ledger.StateSettled, 0))))
}

// A reserve counts the holds already outstanding: holds admitted together
// can all be settled at their estimates, and the one that would not fit
// is refused at admission instead of at its settle.
func TestLifetimeBoundCountsOutstandingHolds(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(ledger.MaxUnits, ledger.MaxUnits)))
	lifecycles(c, "full", 31, ledger.MaxUnits)  // spent = bound − 2^53
	lifecycles(c, "half", 1, ledger.MaxUnits/2) // spent = bound − 2^52
	c.must(c.reserve("a", ledger.MaxUnits/4))
	c.must(c.reserve("b", ledger.MaxUnits/4))
	// Capacity has room for c (half the burst is free), the lifetime has
	// none once a and b settle at their estimates.
	if res := c.reserve("c", 1); !errors.Is(res.Err, ledger.ErrLifetimeExhausted) {
		t.Fatalf("a hold beyond what the bound leaves after a and b: %v", res.Err)
	}
	for _, id := range []string{"a", "b"} {
		c.must(c.start(id))
		c.must(c.settle(id, ledger.MaxUnits/4))
	}
	if spent := c.account(g).Balances[0].Spent; spent != ledger.MaxLifetimeUnits {
		t.Fatalf("spent %d, want the bound", spent)
	}
}

// Under a shadow policy the lifetime refusal, like a capacity rejection,
// is answered as what enforcement would have done (Shadow set, nothing
// reserved), so shadow mode never stops a caller.
func TestLifetimeBoundInShadowMode(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(ledger.MaxUnits, ledger.MaxUnits))
	p.Rollout = ledger.RolloutShadow
	g := c.publish(p)
	lifecycles(c, "full", 32, ledger.MaxUnits)
	res := c.reserve("over", 1)
	if !res.Shadow || !errors.Is(res.Err, ledger.ErrLifetimeExhausted) || res.Dimension != "tokens" || res.Generation != g {
		t.Fatalf("shadow reserve on a full account: %+v", res)
	}
	if _, ok := c.m.Reservation("over"); ok {
		t.Fatal("a shadow refusal reserved something")
	}
}

// Debt that generation switches carry is bounded with the debt an account
// issues: a subject frozen by debt in a unit that never refills records
// usage of 2^53 under each newly published generation until the lifetime
// bound refuses it. Each switch moved the whole debt into the next
// account's OverdraftIssued, so after about 32 generations that term
// wrapped negative (the audit's conservation check) and the debt was lost.
// Now a record whose debt would take OverdraftIssued past MaxLifetimeUnits
// is refused ErrLifetimeExhausted naming the unit, changing nothing, and
// no account's term passes the bound, however many generations follow.
func TestLifetimeBoundCountsDebtMovedBetweenGenerations(t *testing.T) {
	c := newChecked(t)
	var generations []uint64
	debtRefusals := 0
	for g := range 40 {
		generation := c.publish(policyOf(tokens(ledger.Units(10+g), 0)))
		generations = append(generations, generation)
		for k := range 40 {
			res := c.record(fmt.Sprintf("g%d-%d", g, k), ledger.MaxUnits)
			if res.Err == nil {
				continue
			}
			if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) || res.Dimension != "tokens" {
				t.Fatalf("generation %d, record %d: %v (dimension %q)", generation, k, res.Err, res.Dimension)
			}
			if strings.Contains(res.Err.Error(), "debt") {
				debtRefusals++
			}
			break
		}
	}
	if debtRefusals == 0 {
		t.Fatal("no record was refused for the debt it would issue")
	}
	termsWithinLifetime(t, c, generations)
}

// Debt that late settles forward from superseded generations is bounded
// too: work started under each of 34 generations (32 holds of one token
// each) and settled after the next publishes at 2^53 forwards its debt to
// the current account. Each old account stays within the bound, but the
// forwards added up in the current account's OverdraftIssued, which
// wrapped after about 1,024 of them. A settle whose forwarded debt could
// pass the bound there is refused ErrLifetimeExhausted and leaves its
// reservation STARTED; no account's term leaves [0, MaxLifetimeUnits].
func TestLifetimeBoundCountsDebtForwardedByLateSettles(t *testing.T) {
	c := newChecked(t)
	var generations []uint64
	var started []string
	for g := range 34 {
		generations = append(generations, c.publish(policyOf(tokens(ledger.Units(2000+g), 0))))
		for k := range 32 {
			id := fmt.Sprintf("g%d-%d", g, k)
			c.must(c.reserve(id, 1))
			c.must(c.start(id))
			started = append(started, id)
		}
	}
	generations = append(generations, c.publish(policyOf(tokens(3000, 0))))
	refused := 0
	for _, id := range started {
		res := c.settle(id, ledger.MaxUnits)
		if res.Err == nil {
			continue
		}
		if !errors.Is(res.Err, ledger.ErrLifetimeExhausted) || res.Reservation.State != ledger.StateStarted {
			t.Fatalf("settle %s: %v (state %v)", id, res.Err, res.Reservation.State)
		}
		refused++
	}
	if refused == 0 {
		t.Fatal("no late settle was refused for the debt it would forward")
	}
	termsWithinLifetime(t, c, generations)
}

// termsWithinLifetime fails t unless every term that moves and forwards
// add to, in the first unit of each of generations' accounts, is within
// [0, MaxLifetimeUnits].
func termsWithinLifetime(t *testing.T, c *checked, generations []uint64) {
	t.Helper()
	for _, generation := range generations {
		b := c.account(generation).Balances[0]
		for name, term := range map[string]ledger.Units{"overdraftIssued": b.OverdraftIssued, "retiredForMove": b.RetiredForMove,
			"minted": b.Minted, "overdraftRepaid": b.OverdraftRepaid} {
			if term < 0 || term > ledger.MaxLifetimeUnits {
				t.Errorf("generation %d: %s %d is outside [0, %d]", generation, name, term, ledger.MaxLifetimeUnits)
			}
		}
	}
}
