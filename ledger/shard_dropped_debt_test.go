package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Emergency shards and a unit the deciding generation drops: a shard
// issued under a generation that limits requests is reconciled after a
// generation without requests took over. Its usage beyond the shard in
// requests is charged to the shard's own account (which limits them),
// recorded in the remint move and journaled there, and that account is
// made current: the subject is frozen until its refill repays the debt.
// The harness audits the whole ledger (move_both_ends, unrecorded_debt,
// shard_remint_once, journal replay) and checks every step.

// droppedShardPolicy is testSubject's policy with emergency mode on and
// dims.
func droppedShardPolicy(dims ...ledger.Dimension) *ledger.Policy {
	p := policyOf(dims...)
	p.EmergencyMode = true
	return p
}

// issueUnits issues shard id to gw-a with units in the deciding
// generation's dimensions.
func issueUnits(c *checked, id string, units ...ledger.Units) *ledger.Shard {
	c.t.Helper()
	cmd := issueCmd(id, "gw-a", 1, 0)
	cmd.Units = ledger.Amounts{}
	copy(cmd.Units[:], units)
	return c.must(c.apply(cmd)).Shard
}

// settledReceipt is one settled shard receipt holding reserved and using
// actual.
func settledReceipt(id string, reserved, actual ledger.Amounts) ledger.ShardReceipt {
	return ledger.ShardReceipt{ReservationID: id, State: ledger.StateSettledWithDebt, Reserved: reserved, Actual: actual}
}

// isCurrent reports whether generation g's account is the subject's
// current one.
func isCurrentGen(c *checked, g uint64) bool {
	cur, ok := c.m.AccountCurrent(testSubject)
	return ok && cur == g
}

func TestShardDroppedUnitDebt(t *testing.T) {
	// requests: burst 2, refilling 1 a second (requestsDim).
	cases := []struct {
		name string
		// setup publishes and issues; it returns the shard's generation
		// and the deciding one.
		setup func(c *checked) (shardGen, deciding uint64)
		// receipts of the first submission.
		receipts []ledger.ShardReceipt
		// wantTo is the generation the move goes to (0: deciding),
		// wantOwed the requests the shard's account owes after, wantWait
		// the freeze's Retry-After (0: not frozen by requests).
		wantTo   func(shardGen, deciding uint64) uint64
		wantOwed ledger.Units
		wantWait time.Duration
	}{
		{
			// The subject switched to g2 before the reconciliation: g1's
			// 1 available request (left behind) repays 1 of the 3 owed.
			name: "switched before",
			setup: func(c *checked) (uint64, uint64) {
				g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
				issueUnits(c, "sh", 100, 1)
				g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
				c.must(c.reserve("switch", 10))
				return g1, g2
			},
			receipts: []ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1}, ledger.Amounts{100, 4})},
			wantOwed: 2, wantWait: 2 * time.Second,
		},
		{
			// The shard's account is still current (no command since g2):
			// the reconciliation switches the subject to g2, then the
			// debt makes g1 current again.
			name: "shard account current, owing nothing",
			setup: func(c *checked) (uint64, uint64) {
				g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
				issueUnits(c, "sh", 100, 1)
				g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
				return g1, g2
			},
			receipts: []ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1}, ledger.Amounts{100, 5})},
			wantOwed: 3, wantWait: 3 * time.Second,
		},
		{
			// The shard's account is current because it already owes
			// requests g2 drops: it takes the remint and the charge
			// itself (the move goes to it), and owes more.
			name: "shard account current, owing already",
			setup: func(c *checked) (uint64, uint64) {
				g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
				issueUnits(c, "sh", 100, 1)
				c.must(c.reserve("r", 10, 1))
				c.must(c.start("r"))
				c.must(c.settle("r", 10, 3)) // 1 held, 0 available: 2 owed
				g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
				mustFreeze(t, c.reserve("frozen", 10), g2, 2*time.Second)
				return g1, g2
			},
			receipts: []ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1}, ledger.Amounts{100, 4})},
			wantTo:   func(shardGen, _ uint64) uint64 { return shardGen },
			wantOwed: 5, wantWait: 5 * time.Second,
		},
		{
			// g1 was rolled back after g2 took over: g1's account, made
			// current, refills only to repay (tokens included).
			name: "shard generation rolled back",
			setup: func(c *checked) (uint64, uint64) {
				g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
				issueUnits(c, "sh", 100, 1)
				g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
				c.must(c.reserve("switch", 10))
				c.must(c.rollback(testSubject, g1))
				return g1, g2
			},
			receipts: []ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1}, ledger.Amounts{100, 4})},
			wantOwed: 2, wantWait: 2 * time.Second,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecked(t)
			g1, g2 := tc.setup(c)
			rec := c.must(c.apply(reconcileCmd("sh", "gw-a", tc.receipts)))
			var used ledger.Units
			for _, r := range tc.receipts {
				used += r.Actual[1]
			}
			wantTo := g2
			if tc.wantTo != nil {
				wantTo = tc.wantTo(g1, g2)
			}
			if rec.Move == nil || rec.Move.From.Generation != g1 || rec.Move.To.Generation != wantTo || rec.Move.Debt[1] != used-1 {
				t.Fatalf("remint move %+v; want %d requests charged, from %d to %d", rec.Move, used-1, g1, wantTo)
			}
			if rec.Shard.Spent[1] != 1 || rec.Shard.Reminted[1] != 0 {
				t.Fatalf("shard %+v", rec.Shard)
			}
			if owed := c.account(g1).Balances[1].Debt(); owed != tc.wantOwed {
				t.Fatalf("generation %d owes %d requests, want %d: %+v", g1, owed, tc.wantOwed, c.account(g1).Balances[1])
			}
			if !isCurrentGen(c, g1) {
				t.Fatalf("generation %d, which owes, is not current", g1)
			}
			mustFreeze(t, c.reserve("b", 10), g2, tc.wantWait)
			tokensBefore := c.account(g1).Balances[0]
			c.advance(tc.wantWait)
			res := c.must(c.reserve("d", 10))
			if res.Reservation.Account.Generation != g2 {
				t.Fatalf("admitted on %s once the debt was repaid, want generation %d", res.Reservation.Account, g2)
			}
			old := c.account(g1).Balances
			if old[1].Debt() != 0 || old[1].Available != 0 {
				t.Fatalf("requests on generation %d: %+v; want the debt repaid and nothing more minted", g1, old[1])
			}
			if p, _ := c.m.Policy(g1); p.RolledBack && old[0].Minted != tokensBefore.Minted {
				t.Fatalf("rolled-back generation %d minted tokens while it repaid: %+v -> %+v", g1, tokensBefore, old[0])
			}
		})
	}
}

// A submission sent again is refused and charges nothing twice; a later
// submission resolving unknown work charges only its own usage beyond
// the hold in the dropped unit, to the shard's account again.
func TestShardDroppedUnitDebtChargedOnce(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
	issueUnits(c, "sh", 100, 2)
	g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
	c.must(c.reserve("switch", 10))
	first := []ledger.ShardReceipt{
		settledReceipt("a", ledger.Amounts{50, 1}, ledger.Amounts{50, 3}),
		{ReservationID: "u", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{50, 1}},
	}
	rec := c.must(c.apply(reconcileCmd("sh", "gw-a", first)))
	if rec.Move == nil || rec.Move.Debt[1] != 2 {
		t.Fatalf("first remint %+v", rec.Move)
	}
	owed := c.account(g1).Balances[1].Debt() // 2 charged, 0 available: 2
	if owed != 2 || !isCurrentGen(c, g1) {
		t.Fatalf("generation %d owes %d requests (current %v), want 2", g1, owed, isCurrentGen(c, g1))
	}
	again := c.apply(reconcileCmd("sh", "gw-a", first))
	if !errors.Is(again.Err, ledger.ErrShardAlreadyReconciled) || again.Move != nil {
		t.Fatalf("resent submission: %v, move %+v", again.Err, again.Move)
	}
	if d := c.account(g1).Balances[1].Debt(); d != owed {
		t.Fatalf("a refused resend changed the debt: %d -> %d", owed, d)
	}
	second := []ledger.ShardReceipt{settledReceipt("u", ledger.Amounts{50, 1}, ledger.Amounts{50, 4})}
	rec = c.must(c.apply(reconcileCmd("sh", "gw-a", second)))
	if rec.Move == nil || rec.Move.Debt[1] != 3 || rec.Move.To.Generation != g1 || rec.Shard.Spent[1] != 2 {
		t.Fatalf("second remint %+v, shard %+v; want 3 requests charged on the owing generation %d", rec.Move, rec.Shard, g1)
	}
	if d := c.account(g1).Balances[1].Debt(); d != owed+3 {
		t.Fatalf("generation %d owes %d requests, want %d", g1, d, owed+3)
	}
	if again := c.apply(reconcileCmd("sh", "gw-a", second)); !errors.Is(again.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("resent second submission: %v", again.Err)
	}
	mustFreeze(t, c.reserve("b", 10), g2, 5*time.Second)
	c.advance(5 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}

// The deciding account also owes: g2 owes requests that g3 drops, so g2
// stays current. A g1 shard's overuse in requests is charged to g2 (it
// limits them); its overuse in images, which neither g2 nor g3 limits, is
// charged to g1, which joins the subject's owing accounts (g2 stays
// current): the subject stays frozen until both are repaid, its
// retry-after the slower one's (g1's images, 5 at one a second).
func TestShardDroppedUnitDebtWhileAnotherOwes(t *testing.T) {
	images := ledger.Dimension{Unit: "images", Burst: 4, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
	c := newChecked(t)
	g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim, images))
	issueUnits(c, "sh", 100, 1, 1)
	g2 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
	c.must(c.reserve("r", 10, 1)) // switches to g2
	c.must(c.start("r"))
	c.must(c.settle("r", 10, 3)) // g2 owes 2 requests
	g3 := c.publish(droppedShardPolicy(tokens(1000, 100)))
	mustFreeze(t, c.reserve("frozen", 10), g3, 2*time.Second)
	rec := c.must(c.apply(reconcileCmd("sh", "gw-a",
		[]ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1, 1}, ledger.Amounts{100, 2, 9})})))
	if rec.Move == nil || rec.Move.To.Generation != g2 || rec.Move.Debt != (ledger.Amounts{0, 1, 8}) {
		t.Fatalf("remint move %+v; want 1 request and 8 images charged, to %d", rec.Move, g2)
	}
	if d := c.account(g2).Balances[1].Debt(); d != 3 || !isCurrentGen(c, g2) {
		t.Fatalf("generation %d owes %d requests (current %v), want 3, current", g2, d, isCurrentGen(c, g2))
	}
	// images: 4 burst, 1 carved, 3 left behind at the switch repay 3 of 8.
	if d := c.account(g1).Balances[2].Debt(); d != 5 {
		t.Fatalf("generation %d owes %d images, want 5", g1, d)
	}
	mustFreezeIn(t, c.reserve("b", 10), "images", g3, 5*time.Second)
	c.advance(3 * time.Second) // g2's requests repaid, g1's images not
	mustFreezeIn(t, c.reserve("c", 10), "images", g3, 2*time.Second)
	c.advance(2 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g3 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}

// Nothing admits for the subject when the shard is reconciled (every
// generation rolled back) and the subject's current account, g2's, does
// not limit requests: the debt is charged to g1's account, which joins
// the subject's owing accounts, so a generation published later that does
// not limit requests either is frozen until g1's refill repays it (repay
// only: g1 was rolled back). Untracked, g1's debt would have frozen
// nothing: g2 would have switched to g3.
func TestShardDroppedUnitDebtWhileNothingAdmits(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(droppedShardPolicy(tokens(1000, 100), requestsDim))
	issueUnits(c, "sh", 100, 1)
	g2 := c.publish(droppedShardPolicy(tokens(1000, 100)))
	c.must(c.reserve("switch", 10))
	c.must(c.rollback(testSubject, g2))
	c.must(c.rollback(testSubject, g1))
	if !isCurrentGen(c, g2) {
		t.Fatalf("generation %d is not current after the rollbacks", g2)
	}
	rec := c.must(c.apply(reconcileCmd("sh", "gw-a",
		[]ledger.ShardReceipt{settledReceipt("a", ledger.Amounts{100, 1}, ledger.Amounts{100, 4})})))
	if rec.Move == nil || rec.Move.To.Generation != g2 || rec.Move.Debt[1] != 3 {
		t.Fatalf("remint move %+v", rec.Move)
	}
	if d := c.account(g1).Balances[1].Debt(); d != 2 {
		t.Fatalf("generation %d owes %d requests, want 2", g1, d)
	}
	g3 := c.publish(droppedShardPolicy(tokens(1000, 100)))
	mustFreeze(t, c.reserve("b", 10), g3, 2*time.Second)
	c.advance(2 * time.Second)
	// Frozen, the subject's current account is the owing one (g1): g2's
	// tokens moved to it when it became current (settleOwing), so nothing
	// stays behind on g2. Repaid: the subject switches to g3 from g1.
	if b := c.account(g2).Balances[0]; b.Available != 0 || b.Debt() != 0 {
		t.Fatalf("tokens left on generation %d: %+v", g2, b)
	}
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g3 {
		t.Fatalf("admitted on %s", res.Reservation.Account)
	}
}
