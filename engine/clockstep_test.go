package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// The wall clock of a replica can step: NTP corrects it back by an hour,
// a VM resumes an hour later. The ledger applies each command at the
// engine's now, so a step must neither mint capacity for time that did
// not pass (a step back, then forward again, refills the same seconds
// once) nor refund work that is still running when the clock jumps past
// its execution limit (it becomes USAGE_UNKNOWN and keeps its hold), and
// the books must audit clean across both.
func TestClockStepsMintNothingTwiceAndRefundNoRunningWork(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "clock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	core := NewCore(st)
	run := func(now time.Time, cmds ...ledger.Command) []ledger.Result {
		t.Helper()
		results, err := core.Commit(ctx, cmds, now)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range results {
			if r.Err != nil {
				t.Fatalf("%s at %s: %v", cmds[i].Kind, now, r.Err)
			}
		}
		return results
	}
	account := func() ledger.Account {
		t.Helper()
		accounts, err := st.AccountList(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
		if err != nil || len(accounts) != 1 {
			t.Fatalf("accounts: %v %v", accounts, err)
		}
		return accounts[0]
	}
	balance := func() ledger.Balance { return account().Balances[0] }
	p := ledger.Policy{
		Key:            ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions:     []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 10, RefillInterval: time.Second}},
		HoldTTL:        time.Minute,
		ExecutionLimit: 5 * time.Minute,
	}.WithDefaults()
	run(t0, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	// 200 spent leaves room for 200 of refill under the burst.
	run(t0, reserveCmd("spent", 200), ledger.Command{Kind: ledger.KindStart, ReservationID: "spent", OperationID: "op"},
		ledger.Command{Kind: ledger.KindSettle, ReservationID: "spent", OperationID: "op", Units: ledger.Amounts{200}})
	run(t0, reserveCmd("running", 600))
	run(t0, ledger.Command{Kind: ledger.KindStart, ReservationID: "running", OperationID: "op"})
	before := balance()

	// An hour back: a reserve is admitted from what is there, and nothing
	// is minted for the negative time since the last refill.
	back := t0.Add(-time.Hour)
	run(back, reserveCmd("held", 150))
	if b := balance(); b.Minted != before.Minted || b.Available != before.Available-150 {
		t.Fatalf("an hour back: minted %d available %d, want %d and %d", b.Minted, b.Available, before.Minted, before.Available-150)
	}
	if due, err := core.Due(ctx, back, 100); err != nil || len(due) != 0 {
		t.Fatalf("an hour back, due: %v %v", due, err)
	}

	// Forward again to 2 s after the start: 2 s of refill at 10 a second,
	// once, whatever the detour.
	run(t0.Add(2*time.Second), ledger.Command{Kind: ledger.KindRefill, Account: account().Key})
	if b := balance(); b.Minted != before.Minted+20 {
		t.Fatalf("back an hour and forward 2 s: minted %d more, want 20", b.Minted-before.Minted)
	}

	// Two hours on: the hold is expired and refunded; the started work
	// past its limit is USAGE_UNKNOWN and still holds its 600.
	later := t0.Add(2 * time.Hour)
	for range 4 {
		due, err := core.Due(ctx, later, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(due) == 0 {
			break
		}
		run(later, due...)
	}
	held, err := st.ReservationGet(ctx, "held")
	if err != nil || held.State != ledger.StateExpired {
		t.Fatalf("the hold two hours on: %v %v, want expired", held.State, err)
	}
	running, err := st.ReservationGet(ctx, "running")
	if err != nil || running.State != ledger.StateUsageUnknown {
		t.Fatalf("the running work two hours on: %v %v, want usage unknown", running.State, err)
	}
	if b := balance(); b.Reserved != 600 {
		t.Fatalf("two hours on: reserved %d, want the running work's 600", b.Reserved)
	}

	// The clock steps back again before the gateway reports: the late
	// settle charges what was used and refunds the rest, once.
	run(t0.Add(time.Minute), ledger.Command{Kind: ledger.KindSettle, ReservationID: "running", OperationID: "op", Units: ledger.Amounts{500}})
	if b := balance(); b.Reserved != 0 || b.Spent != before.Spent+500 {
		t.Fatalf("settled after a step back: reserved %d spent %d, want 0 and %d", b.Reserved, b.Spent, before.Spent+500)
	}
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	auditClean(t, e)
}
