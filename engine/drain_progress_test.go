package engine

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// drainRig is an engine on the in-memory store with one subject's
// policies published as its tests need them.
type drainRig struct {
	t   *testing.T
	ctx context.Context
	e   *Engine
}

func newDrainRig(t *testing.T) *drainRig {
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: func() time.Time { return t0 }})
	t.Cleanup(func() { e.Close() })
	return &drainRig{t: t, ctx: context.Background(), e: e}
}

func (r *drainRig) publish(burst int64, emergency bool) {
	r.t.Helper()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}, EmergencyMode: emergency}.WithDefaults()
	r.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

func (r *drainRig) do(cmd ledger.Command) ledger.Result {
	r.t.Helper()
	res, err := r.e.Do(r.ctx, cmd)
	if err != nil || res.Err != nil {
		r.t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
	}
	return res
}

func (r *drainRig) progress(generation uint64) GenerationDrain {
	r.t.Helper()
	progress, err := r.e.DrainProgress(r.ctx, []uint64{generation})
	if err != nil {
		r.t.Fatal(err)
	}
	return progress[0]
}

// Debt left on a superseded generation's account (overuse settled there
// before the switch), with no available capacity beside it, is drained
// to the subject's current account too: the new generation's account
// owes it, and the old one owes nothing (DESIGN: drains move capacity or
// debt).
func TestDrainsMoveSupersededDebt(t *testing.T) {
	r := newDrainRig(t)
	r.publish(100, false)
	r.do(reserveCmd("rl-1", 100))
	r.do(ledger.Command{Kind: ledger.KindStart, ReservationID: "rl-1", OperationID: "op-1"})
	r.do(ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-1", OperationID: "op-1", Units: ledger.Amounts{150}})
	r.publish(1000, false)
	if p := r.progress(1); p.Debt[0] != 50 || p.Available[0] != 0 {
		t.Fatalf("generation 1 before the drain: %+v, want debt 50 and nothing available", p)
	}
	ran, err := r.e.RunDrains(r.ctx)
	if err != nil || ran != 1 {
		t.Fatalf("RunDrains ran %d, %v; want 1 (the debt)", ran, err)
	}
	if p := r.progress(1); p.Debt[0] != 0 || !p.Drained() {
		t.Fatalf("generation 1 after the drain: %+v, want no debt and drained", p)
	}
	if p := r.progress(2); p.Debt[0] != 50 {
		t.Fatalf("generation 2 after the drain: %+v, want the 50 of debt", p)
	}
	auditClean(t, r.e)
}

// A rolled-back or superseded generation is not drained while a shard
// issued under it is open: its allocation may still come back as
// receipts (`capledger rollback --wait` waits for it).
func TestGenerationWithAnOpenShardIsNotDrained(t *testing.T) {
	r := newDrainRig(t)
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	r.publish(1000, true)
	r.do(ledger.Command{Kind: ledger.KindShardIssue, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
		Units: ledger.Amounts{100}, Shard: &ledger.ShardArgs{ShardID: "sh-1", GatewayID: "gw-a", BootEpoch: 1,
			TTL: time.Minute, KeyID: "k1", Sign: ledger.Ed25519ShardSigner(key)}})
	r.publish(2000, true)
	if _, err := r.e.RunDrains(r.ctx); err != nil {
		t.Fatal(err)
	}
	p := r.progress(1)
	if p.UnreconciledShards != 1 || p.ShardUnits[0] != 100 || p.Available[0] != 0 {
		t.Fatalf("generation 1 with its shard open: %+v, want one shard of 100 and nothing available", p)
	}
	if p.Drained() {
		t.Fatalf("generation 1 reported drained with its shard of 100 open: %+v", p)
	}
	r.do(ledger.Command{Kind: ledger.KindShardReconcile, Shard: &ledger.ShardArgs{ShardID: "sh-1", GatewayID: "gw-a"}})
	if _, err := r.e.RunDrains(r.ctx); err != nil {
		t.Fatal(err)
	}
	if p := r.progress(1); p.UnreconciledShards != 0 || !p.Drained() {
		t.Fatalf("generation 1 after its shard was reconciled and drained: %+v, want drained", p)
	}
	auditClean(t, r.e)
}

// DrainProgress counts an account blocked by burst when the deciding
// account's available plus reserved units, with the units the subject
// holds under other generations, fill its burst (a drain moves capacity
// only as far as the burst has room, held units included), not only when
// its available units do.
func TestDrainProgressBlockedByHeldUnits(t *testing.T) {
	r := newDrainRig(t)
	r.publish(1000, false)
	r.do(reserveCmd("rl-1", 5))
	r.publish(10, false)
	r.do(reserveCmd("rl-2", 5)) // generation 2: 0 available, 5 reserved, 5 held under generation 1
	if p := r.progress(2); p.Available[0] != 0 || p.Reserved[0] != 5 {
		t.Fatalf("generation 2: %+v, want 0 available and 5 reserved", p)
	}
	p := r.progress(1)
	if p.Available[0] == 0 || p.BlockedByBurst != 1 || p.Drained() {
		t.Fatalf("generation 1: %+v, want capacity left, blocked by burst", p)
	}
	auditClean(t, r.e)
}

// The drain worker skips a generation its last full pass found clean
// only while the active generations are those that pass saw: after a
// publish or a rollback (a generation active again, then superseded once
// more, may hold capacity) the next pass reads it again.
func TestDrainMemoForgetsOnAnotherActiveSet(t *testing.T) {
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	var m drainMemo
	before := ledger.ActiveGenerations{key: 2}
	m.update(before, &Pager{ended: []ScanEnd{{Generation: 1}}}, nil, true, t0)
	if !m.plan(ledger.ActiveGenerations{key: 2}, 1, t0).Skip {
		t.Fatal("generation 1, clean under the same active set: not skipped")
	}
	if m.plan(ledger.ActiveGenerations{key: 3}, 1, t0).Skip {
		t.Fatal("generation 1 skipped after the active generation changed")
	}
}

// An account of a superseded generation that the deciding account has
// room for is not blocked; once that account refills to its burst it is
// BlockedByBurst, with no command in between (nothing journaled, no row
// of the superseded generation changed): a pass that re-checked only the
// accounts blocked at its last pass, or changed since, would miss it.
// This pins what an incremental DrainProgress must re-check: every
// account still waiting for a drain, not only the blocked ones.
func TestDrainProgressBlockedByBurstFollowsTheClock(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	e := New(memstoreAndSQLite["memstore"](t), Options{DisableWorkers: true, Clock: clk.Now})
	t.Cleanup(func() { e.Close() })
	do := func(cmd ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
		}
	}
	publish := func(burst, refill int64) {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst, RefillUnits: refill, RefillInterval: time.Minute}}}.WithDefaults()
		do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	publish(1000, 0)
	do(reserveCmd("rl-1", 10))
	do(ledger.Command{Kind: ledger.KindRelease, ReservationID: "rl-1"}) // 1000 available on generation 1
	publish(100, 10)
	// The switch fills generation 2's account to its burst; spend it all.
	do(reserveCmd("rl-2", 100))
	do(ledger.Command{Kind: ledger.KindStart, ReservationID: "rl-2", OperationID: "op-2"})
	do(ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-2", OperationID: "op-2", Units: ledger.Amounts{100}})
	progress := func() GenerationDrain {
		t.Helper()
		got, err := e.DrainProgress(ctx, []uint64{1})
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	if d := progress(); d.Available[0] == 0 || d.BlockedByBurst != 0 {
		t.Fatalf("generation 1 with room on generation 2: %+v, want capacity left and not blocked", d)
	}
	clk.Advance(10 * time.Minute) // generation 2 refills 10 a minute to its burst of 100
	if d := progress(); d.Available[0] == 0 || d.BlockedByBurst != 1 {
		t.Fatalf("generation 1 after generation 2 refilled to its burst: %+v, want blocked by burst", d)
	}
}
