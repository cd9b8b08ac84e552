package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// blockedRig is an engine over the in-memory store whose clock the test
// moves (at), for the blocked-by-burst tests: the deciding account's
// refill due is what they are about.
type blockedRig struct {
	*drainRig
	clock atomic.Int64
}

func newBlockedRig(t *testing.T) *blockedRig {
	r := &blockedRig{}
	r.clock.Store(t0.UnixNano())
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: func() time.Time { return time.Unix(0, r.clock.Load()).UTC() }})
	t.Cleanup(func() { e.Close() })
	r.drainRig = &drainRig{t: t, ctx: context.Background(), e: e}
	return r
}

func (r *blockedRig) at(d time.Duration) { r.clock.Store(t0.Add(d).UnixNano()) }

// publishAny publishes a "*" policy of chat.generate of one dimension.
func (r *blockedRig) publishAny(burst, refillPerMinute int64) {
	r.t.Helper()
	d := ledger.Dimension{Unit: "tokens", Burst: burst, MaxOverdraft: 100}
	if refillPerMinute > 0 {
		d.RefillUnits, d.RefillInterval = refillPerMinute, time.Minute
	}
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{d}}.WithDefaults()
	r.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

// spend reserves units for subject and settles them (release when settle
// is false), leaving the subject's current account units lower.
func (r *blockedRig) spend(subject, id string, units int64, settle bool) {
	r.t.Helper()
	r.do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
		Subject: subject, Route: "chat.generate", Region: "eu", Units: ledger.Amounts{units}})
	if !settle {
		r.do(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
		return
	}
	r.do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
	r.do(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: ledger.Amounts{units}})
}

func (r *blockedRig) available(subject string, generation uint64) int64 {
	r.t.Helper()
	a, err := r.e.core.store.AccountGet(r.ctx, ledger.AccountKey{Subject: subject, Route: "chat.generate", Region: "eu", Generation: generation})
	if err != nil {
		r.t.Fatalf("account %s/%d: %v", subject, generation, err)
	}
	return a.Balances[0].Available
}

// The review's case: the deciding account holds 20 of its burst of 50 as
// stored, with 100 of refill due, and the superseded account 20. A drain
// refills the deciding account first (to 50) and then has no room, so
// the account counts blocked by burst; once the subject spends 10 there is
// room again and it does not, and the drain moves the 10.
func TestDrainProgressBlockedByRefillDue(t *testing.T) {
	r := newBlockedRig(t)
	r.publishAny(70, 0)                 // generation 1
	r.spend("t-idle", "rl-1", 1, false) // 70 available on generation 1
	r.publishAny(50, 10)                // generation 2: 10 a minute
	r.spend("t-idle", "rl-2", 30, true) // the switch moves 50 (20 stay), then 30 spent: 20
	if p := r.progress(1); p.Available[0] != 20 || p.BlockedByBurst != 0 {
		t.Fatalf("generation 1 with no refill due: %+v, want 20 available, not blocked", p)
	}
	r.at(10 * time.Minute) // 100 due, 30 of it fits
	if p := r.progress(1); p.Available[0] != 20 || p.BlockedByBurst != 1 {
		t.Fatalf("generation 1 with 100 of refill due on generation 2 (20 of 50 stored): %+v, want blocked by burst", p)
	}
	if ran, err := r.e.RunDrains(r.ctx); err != nil || ran != 0 {
		t.Fatalf("RunDrains ran %d, %v; want 0 (refilled, the burst has no room)", ran, err)
	}
	r.spend("t-idle", "rl-3", 10, true) // 40 of 50 now
	if p := r.progress(1); p.BlockedByBurst != 0 {
		t.Fatalf("generation 1 with room for 10 on generation 2: %+v, want not blocked", p)
	}
	if ran, err := r.e.RunDrains(r.ctx); err != nil || ran != 1 {
		t.Fatalf("RunDrains ran %d, %v; want 1", ran, err)
	}
	if got := r.available("t-idle", 1); got != 10 {
		t.Fatalf("generation 1 after the drain: %d available, want 10 (10 moved)", got)
	}
	auditClean(t, r.e)
}

// BlockedByBurst agrees with the ledger's drain account by account, over
// a mix under a refilling policy: an account counted blocked keeps all
// its available capacity through a drain pass, one not counted gives some
// up (accounts of one dimension, no debt, so the drain's "any dimension"
// and the count's agree). The mix: a deciding account full as stored,
// one that its refill due fills, one the refill due leaves room in, one
// with room and nothing due, a subject with no account of the deciding
// generation yet.
func TestDrainProgressBlockedMatchesDrain(t *testing.T) {
	r := newBlockedRig(t)
	r.publishAny(100, 0)         // generation 1
	subjects := map[string]bool{ // subject: want blocked
		"t-full": true, "t-filled-by-refill": true, "t-room-after-refill": false, "t-room": false, "t-not-switched": false,
	}
	for s := range subjects {
		r.spend(s, "rl-"+s+"-1", 1, false) // 100 available on generation 1
	}
	r.publishAny(50, 10) // generation 2: the switch moves 50, 50 stay
	r.spend("t-full", "rl-t-full-2", 1, false)
	r.spend("t-filled-by-refill", "rl-t-filled-2", 10, true)  // 40: 20 due fills it
	r.spend("t-room-after-refill", "rl-t-room-a-2", 30, true) // 20: 20 due leaves 10
	r.at(2 * time.Minute)                                     // 20 due on the accounts above
	r.spend("t-room", "rl-t-room-2", 5, true)                 // switched now: 45, nothing due
	want := 0
	for _, blocked := range subjects {
		if blocked {
			want++
		}
	}
	if p := r.progress(1); p.BlockedByBurst != int64(want) {
		t.Fatalf("generation 1: %+v, want %d blocked by burst", p, want)
	}
	before := map[string]int64{}
	for s := range subjects {
		before[s] = r.available(s, 1)
	}
	if _, err := r.e.RunDrains(r.ctx); err != nil {
		t.Fatal(err)
	}
	for s, blocked := range subjects {
		if after := r.available(s, 1); before[s] == 0 || (after == before[s]) != blocked {
			t.Errorf("%s: generation 1 held %d before the drain pass, %d after; counted blocked %v", s, before[s], after, blocked)
		}
	}
	auditClean(t, r.e)
}

// After a rollback, the rolled-back generation's account may still be
// its subject's current one: its drain is then the switch back, which
// brings the deciding account to now without minting its refill due (it
// did not hold the subject's capacity meanwhile). So the refill due of a
// deciding account whose subject has a newer account does not count, and
// the account is not blocked while the stored burst has room.
func TestDrainProgressRollbackSwitchRefillsNothing(t *testing.T) {
	r := newBlockedRig(t)
	r.publishAny(50, 10)                // generation 1: 10 a minute
	r.spend("t-back", "rl-1", 30, true) // 20 of 50 on generation 1
	r.publishAny(100, 0)                // generation 2
	r.spend("t-back", "rl-2", 1, false) // switched: the 20 move, generation 1 holds 0
	r.at(10 * time.Minute)              // generation 1 would have 100 due if it refilled
	r.do(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"}, Generation: 2})
	if p := r.progress(2); p.Available[0] != 20 || p.BlockedByBurst != 0 {
		t.Fatalf("rolled-back generation 2, still current: %+v, want 20 available, not blocked", p)
	}
	if ran, err := r.e.RunDrains(r.ctx); err != nil || ran != 1 {
		t.Fatalf("RunDrains ran %d, %v; want 1 (the switch back)", ran, err)
	}
	if got := r.available("t-back", 1); got != 20 {
		t.Fatalf("generation 1 after the switch back: %d available, want 20 (nothing minted for the 10 minutes)", got)
	}
	auditClean(t, r.e)
}
