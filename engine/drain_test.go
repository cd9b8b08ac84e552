package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// After a new generation is published, capacity left on the superseded
// account must reach the current one without waiting for the subject's next
// reserve: the drain sweep finds it and moves it exactly once.
func TestDrainsDueMovesSupersededCapacity(t *testing.T) {
	ctx := context.Background()
	core := NewCore(memstore.New())
	now := t0
	run := func(cmds ...ledger.Command) []ledger.Result {
		t.Helper()
		results, err := core.Commit(ctx, cmds, now)
		if err != nil {
			t.Fatal(err)
		}
		return results
	}
	policy := func(burst int64) *ledger.Policy {
		p := ledger.Policy{
			Key:        ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}},
		}.WithDefaults()
		return &p
	}
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy(1000)})
	if res := run(reserveCmd("rl-1", 300))[0]; res.Err != nil {
		t.Fatal(res.Err)
	}
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy(2000)})

	due, err := core.DrainsDue(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 1 || due[0].Account.Generation != 1 {
		t.Fatalf("drains due: %+v, want one for generation 1", due)
	}
	run(due...)
	accounts, err := core.Store().AccountList(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil || len(accounts) != 2 {
		t.Fatalf("accounts: %v %+v", err, accounts)
	}
	if old, current := accounts[0].Balances[0], accounts[1].Balances[0]; old.Available != 0 || current.Minted != 700 {
		t.Fatalf("after the drain: old %+v, current %+v", old, current)
	}
	// Nothing left to drain: the sweep finds nothing more to do.
	if due, _ := core.DrainsDue(ctx); len(due) != 0 {
		t.Fatalf("drains due after draining: %+v", due)
	}
	now = now.Add(time.Minute)
	snapshot, err := core.Store().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ledger.Audit(snapshot) {
		t.Errorf("audit: %s", d)
	}
}
