package ledger_test

import (
	"errors"
	"testing"

	"github.com/capledger/capledger/ledger"
)

func carveCmd(id, identity string, units ledger.Units) ledger.Command {
	cmd := issueCmd(id, ledger.LegacyGateway(identity), 1, units)
	cmd.Shard.Legacy = true
	return cmd
}

// The legacy limiter's budget: carved without emergency mode from
// available into retiredForEmergency, bound to the limiter's identity;
// reconciled only by it, it returns exactly the units its receipts
// confirm unused and never its whole block; the harness audits
// conservation (the account's equation and the budget's own split) after
// every command.
func TestLegacyBudgetCarveSpendAndReconcile(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 0))) // emergency mode off, no refill
	// A gateway cannot take a legacy budget through shard issuance, nor
	// the carve hand one to a gateway id.
	if res := c.apply(issueCmd("sneak", ledger.LegacyGateway("legacy-limiter"), 1, 100)); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("shard issuance for a legacy gateway id: %v", res.Err)
	}
	plain := issueCmd("plain", "gw-a", 1, 100)
	plain.Shard.Legacy = true
	if res := c.apply(plain); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("legacy carve for a gateway id: %v", res.Err)
	}
	if res := c.apply(issueCmd("gw-shard", "gw-a", 1, 100)); !errors.Is(res.Err, ledger.ErrEmergencyDisabled) {
		t.Fatalf("a gateway shard under emergency mode off: %v", res.Err)
	}

	budget := c.must(c.apply(carveCmd("legacy-1", "legacy-limiter", 200))).Shard
	if !budget.IsLegacyBudget() || budget.GatewayID != "legacy:legacy-limiter" || budget.Allocated[0] != 200 {
		t.Fatalf("carved %+v", budget)
	}
	if bal := c.account(g).Balances[0]; bal.Available != 800 || bal.RetiredForEmergency != 200 {
		t.Fatalf("after the carve: %+v", bal)
	}
	if again := c.must(c.apply(carveCmd("legacy-1", "legacy-limiter", 200))); !again.Replayed {
		t.Fatalf("a retried carve moved again: %+v", again)
	}
	// The central ledger admits only what is left: 800.
	c.must(c.reserve("central", 800))
	if res := c.reserve("central-2", 1); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("the carved units were admitted centrally: %v", res.Err)
	}

	// Only the limiter's own identity reconciles it.
	if res := c.apply(reconcileCmd("legacy-1", "gw-a", nil)); !errors.Is(res.Err, ledger.ErrShardForeign) {
		t.Fatalf("reconcile by another gateway: %v", res.Err)
	}
	gw := ledger.LegacyGateway("legacy-limiter")
	// No receipts, or only releases, would give the whole block back.
	for _, receipts := range [][]ledger.ShardReceipt{nil, {{ReservationID: "l-0", State: ledger.StateReleased, Reserved: ledger.Amounts{50}}}} {
		if res := c.apply(reconcileCmd("legacy-1", gw, receipts)); !errors.Is(res.Err, ledger.ErrLegacyWholeBlock) {
			t.Fatalf("whole-block reconcile %v: %v", receipts, res.Err)
		}
	}
	res := c.must(c.apply(reconcileCmd("legacy-1", gw, []ledger.ShardReceipt{
		{ReservationID: "l-1", State: ledger.StateSettled, Reserved: ledger.Amounts{120}, Actual: ledger.Amounts{110}},
		{ReservationID: "l-2", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{50}},
	})))
	if s := res.Shard; s.Spent[0] != 110 || s.Unknown[0] != 50 || s.Reminted[0] != 40 {
		t.Fatalf("reconciled %+v", s)
	}
	// 40 confirmed unused came back; 110 spent and 50 unknown stay retired.
	if bal := c.account(g).Balances[0]; bal.Available != 40 || bal.RetiredForEmergency != 200 {
		t.Fatalf("after reconciliation: %+v", bal)
	}
	if res := c.apply(reconcileCmd("legacy-1", gw, nil)); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("second reconcile: %v", res.Err)
	}
}

// The audit flags a legacy budget that gave its whole block back (a
// store row written around the ledger's refusal).
func TestAuditFlagsLegacyWholeBlock(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 0)))
	s := c.must(c.apply(carveCmd("legacy-1", "legacy-limiter", 200))).Shard
	snap := c.m.Snapshot()
	for i := range snap.Shards {
		if snap.Shards[i].ID == s.ID {
			snap.Shards[i].Reconciled = true
			snap.Shards[i].Reminted = snap.Shards[i].Allocated
		}
	}
	found := false
	for _, d := range ledger.Audit(snap) {
		if d.Check == ledger.CheckLegacyBudget {
			found = true
		}
	}
	if !found {
		t.Fatalf("audit of a legacy budget that reminted its whole block: %v", ledger.Audit(snap))
	}
}

// A legacy budget whose first report held only unknown work gives its
// whole block back no more than one that reported nothing: settling the
// last unknown receipt with no usage is refused (nothing changes, the
// units stay unknown), while a settle with usage still resolves it.
func TestLegacyBudgetResolvingUnknownNeverReturnsWholeBlock(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 0)))
	c.must(c.apply(carveCmd("legacy-1", "legacy-limiter", 200)))
	gw := ledger.LegacyGateway("legacy-limiter")
	first := c.must(c.apply(reconcileCmd("legacy-1", gw, []ledger.ShardReceipt{
		{ReservationID: "l-1", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{50}},
		{ReservationID: "l-2", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{30}},
	}))).Shard
	if first.Spent[0] != 0 || first.Unknown[0] != 80 || first.Reminted[0] != 120 {
		t.Fatalf("first report: %+v", first)
	}
	// One of two resolved with no usage: 30 stay unknown, not the whole block.
	c.must(c.apply(reconcileCmd("legacy-1", gw, []ledger.ShardReceipt{
		{ReservationID: "l-1", State: ledger.StateSettled, Reserved: ledger.Amounts{50}},
	})))
	before := c.account(g).Balances[0]
	res := c.apply(reconcileCmd("legacy-1", gw, []ledger.ShardReceipt{
		{ReservationID: "l-2", State: ledger.StateSettled, Reserved: ledger.Amounts{30}},
	}))
	if !errors.Is(res.Err, ledger.ErrLegacyWholeBlock) {
		t.Fatalf("the last unknown work settled with no usage: %v (shard %+v)", res.Err, res.Shard)
	}
	if after := c.account(g).Balances[0]; after != before {
		t.Fatalf("a refused submission moved capacity: %+v, then %+v", before, after)
	}
	// Still pending: its real usage resolves it.
	s := c.must(c.apply(reconcileCmd("legacy-1", gw, []ledger.ShardReceipt{
		{ReservationID: "l-2", State: ledger.StateSettled, Reserved: ledger.Amounts{30}, Actual: ledger.Amounts{10}},
	}))).Shard
	if s.Spent[0] != 10 || s.Unknown[0] != 0 || s.Reminted[0] != 190 {
		t.Fatalf("resolved with usage: %+v", s)
	}
}
