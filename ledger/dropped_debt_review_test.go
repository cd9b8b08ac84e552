package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Review of 3cda4eec: how debt in a unit the deciding generation drops
// behaves across replays, republishes, rollbacks, shadow mode, shards, a
// "*" policy and a unit that never refills. The harness audits
// conservation and admission under debt (any account of the subject)
// after every command.

// owesRequests publishes generation 1 (tokens and requests) and leaves
// the subject owing 3 requests on it.
func owesRequests(c *checked) uint64 {
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))
	return g1
}

// A command replayed after the switch answers as it did before it: a
// reservation admitted after the switch replays its receipt, a record
// made while frozen (charged to the owing current account, which holds
// the subject's tokens until the switch) replays without charging again,
// and a reserve refused while frozen is not stored, so the same id is
// admitted once the debt is repaid.
func TestDroppedDebtReplayAcrossTheSwitch(t *testing.T) {
	c := newChecked(t)
	g1 := owesRequests(c)
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	rec := c.must(c.record("r", 5))
	if rec.Reservation.Account.Generation != g1 {
		t.Fatalf("record while frozen charged %s, want generation %d's account", rec.Reservation.Account, g1)
	}
	c.advance(3 * time.Second)
	first := c.must(c.reserve("b", 10)) // the id refused while frozen
	if first.Replayed || first.Reservation.Account.Generation != g2 {
		t.Fatalf("reserve after repayment: %+v", first)
	}
	spent := c.account(g1).Balances[0].Spent + c.account(g2).Balances[0].Spent
	again := c.must(c.record("r", 5))
	if now := c.account(g1).Balances[0].Spent + c.account(g2).Balances[0].Spent; !again.Replayed || again.Reservation.ID != "r" || now != spent {
		t.Fatalf("record replayed after the switch: %+v (spent %d, was %d)", again, now, spent)
	}
	replay := c.must(c.reserve("b", 10))
	if !replay.Replayed || replay.Reservation != first.Reservation {
		t.Fatalf("reserve replayed after the switch: %+v, first %+v", replay, first)
	}
	if a := c.account(g1).Balances; a[1].Debt() != 0 || a[0].Available != 0 {
		t.Fatalf("generation %d after the switch: %+v", g1, a)
	}
}

// Republishing a generation that limits the unit again takes the debt
// over (the move matches units by name): the subject is then frozen by
// the new generation's own debt, which its refill repays.
func TestDroppedDebtRepublishReaddingTheUnitTakesTheDebt(t *testing.T) {
	c := newChecked(t)
	g1 := owesRequests(c)
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	g3 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	mustFreeze(t, c.reserve("c", 10), g3, 3*time.Second)
	if d1, d3 := c.account(g1).Balances[1].Debt(), c.account(g3).Balances[1].Debt(); d1 != 0 || d3 != 3 {
		t.Fatalf("requests owed: generation %d %d, generation %d %d; want 0 and 3", g1, d1, g3, d3)
	}
	c.advance(3 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g3 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}

// Rolling back the generation that drops the unit while the subject owes
// it: the owing generation decides again, frozen by its own debt, and
// admits once its refill repays it.
func TestDroppedDebtRollbackOfTheDroppingGeneration(t *testing.T) {
	c := newChecked(t)
	g1 := owesRequests(c)
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	c.must(c.rollback(testSubject, g2))
	res := c.reserve("c", 10)
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g1 {
		t.Fatalf("reserve after the rollback: %+v", res)
	}
	c.advance(3 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g1 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}

// Under a shadow generation the frozen answer is a shadow rejection that
// reserves nothing; under an emergency-mode generation a shard is refused
// as a reserve is.
func TestDroppedDebtShadowAndShardAreFrozen(t *testing.T) {
	c := newChecked(t)
	g1 := owesRequests(c)
	shadow := policyOf(tokens(1000, 100))
	shadow.Rollout = ledger.RolloutShadow
	g2 := c.publish(shadow)
	res := c.reserve("b", 10)
	mustFreeze(t, res, g2, 3*time.Second)
	if !res.Shadow {
		t.Fatalf("frozen under a shadow generation: %+v; want Shadow", res)
	}
	if _, ok := c.m.Reservation("b"); ok {
		t.Fatal("a shadow refusal stored a reservation")
	}
	emergency := policyOf(tokens(1000, 100))
	emergency.EmergencyMode = true
	g3 := c.publish(emergency)
	sh := c.apply(issueCmd("sh-1", "gw-a", 1, 10))
	if !errors.Is(sh.Err, ledger.ErrAdmissionFrozen) || sh.Generation != g3 || sh.Dimension != "requests" {
		t.Fatalf("shard while generation %d owes requests: %+v", g1, sh)
	}
}

// A "*" policy for the route decides for the subject, which owes in a
// unit; its own policy, published next, drops the unit: frozen until the
// "*" generation's refill repays it, then the own policy admits.
func TestDroppedDebtAnySubjectPolicyThenOwnPolicy(t *testing.T) {
	c := newChecked(t)
	anyKey := testSubject
	anyKey.Subject = ledger.AnySubject
	star := ledger.Policy{Key: anyKey, Dimensions: []ledger.Dimension{tokens(1000, 100), requestsDim}, HoldTTL: 30 * time.Second}.WithDefaults()
	g1 := c.publish(&star)
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))
	g2 := c.publish(policyOf(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g2, 3*time.Second)
	c.advance(3 * time.Second)
	if res := c.must(c.reserve("c", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
	if d := c.account(g1).Balances[1].Debt(); d != 0 {
		t.Fatalf("generation %d owes %d requests", g1, d)
	}
}

// Debt in a dropped unit that never refills freezes the subject for good
// under the generation that drops it (before 3cda4eec that generation
// admitted): docs/ROLLOUT.md, Limitations, "a unit that does not refill
// stays owed". Publishing a generation that limits the unit again takes
// the debt over, and that generation's refill repays it.
func TestDroppedDebtThatNoRefillRepaysFreezesUntilTheUnitReturns(t *testing.T) {
	c := newChecked(t)
	once := requestsDim
	once.RefillUnits, once.RefillInterval = 0, 0
	g1 := c.publish(policyOf(tokens(1000, 100), once))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))
	g2 := c.publish(policyOf(tokens(1000, 100)))
	for i, wait := range []time.Duration{0, time.Hour, 1000 * time.Hour} {
		c.advance(wait)
		res := c.reserve("b", 10)
		if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g2 {
			t.Fatalf("reserve %d, %s later: %+v; want frozen", i, wait, res)
		}
	}
	if d := c.account(g1).Balances[1].Debt(); d != 3 {
		t.Fatalf("generation %d owes %d requests, want 3", g1, d)
	}
	g3 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	mustFreeze(t, c.reserve("c", 10), g3, 3*time.Second)
	c.advance(3 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g3 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}
