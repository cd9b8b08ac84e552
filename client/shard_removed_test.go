package client

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
)

// removedShardRig is a real ledger (server, engine, SQLite, real socket)
// whose engine clock a test moves forward, so that its retention removes
// a reconciled shard for real, and a gateway with one shard of 9,000
// tokens from which two requests were served and settled locally.
type removedShardRig struct {
	ledger *testLedger
	ahead  *atomic.Int64 // the engine clock's lead on time.Now, in ns
	store  *ShardStore
	em     *Emergency
	shard  string
	ids    []string
}

func newRemovedShardRig(t *testing.T) *removedShardRig {
	t.Helper()
	ahead := new(atomic.Int64)
	l := startShardLedgerWith(t, engine.Options{
		Clock:     func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) },
		Retention: time.Hour,
	})
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}},
	}); err != nil {
		t.Fatal(err)
	}
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(l.viaProxy(t), store, EmergencyOptions{})
	shard, err := em.Provision(context.Background(), ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 9000}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rig := &removedShardRig{ledger: l, ahead: ahead, store: store, em: em, shard: shard.ID}
	for i, id := range []string{"r-removed-1", "r-removed-2"} {
		if _, err := store.Reserve(id, "d-"+id, "tenant-7", "chat.generate", "", Units{"tokens": 1000}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Start(id, "op-"+id); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Settle(id, "op-"+id, Units{"tokens": int64(400 + i)}); err != nil {
			t.Fatal(err)
		}
		rig.ids = append(rig.ids, id)
	}
	return rig
}

// removeShard moves the ledger's clock past the shard's expiry and the
// retention window, runs a retention pass and checks that the ledger no
// longer knows the shard.
func (rig *removedShardRig) removeShard(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	rig.ahead.Store(int64(3 * time.Hour))
	if err := rig.ledger.engine.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := rig.em.rpc.GetShard(ctx, connect.NewRequest(&ledgerv1.GetShardRequest{ShardId: rig.shard}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("GetShard after retention: %v, want SHARD_NOT_FOUND", err)
	}
}

// checkEnded checks that the shard is over locally: nothing in flight or
// pending, and a further reconciliation sends nothing and fails nothing.
func (rig *removedShardRig) checkEnded(t *testing.T) {
	t.Helper()
	st := rig.store.Shards()[0]
	if !st.Sealed || !st.Submitted || st.Pending != 0 {
		t.Fatalf("local shard after the reconciliation: %+v", st)
	}
	if _, due, err := rig.store.DueSubmission(rig.shard); err != nil || due {
		t.Fatalf("due submission after the reconciliation: %v %v", due, err)
	}
	if r, ok, err := rig.em.ReconcileShard(context.Background(), rig.shard); err != nil || ok {
		t.Fatalf("a further reconciliation: %+v %v %v", r, ok, err)
	}
}

// A gateway logged its submission and sent it; the ledger accepted it
// but the answer was lost with the gateway (the process died). Days
// later retention removed the reconciled shard. The restarted gateway
// resends the logged submission, is answered SHARD_NOT_FOUND, and takes
// it as the success of its earlier attempt: the submission is finished
// and the shard ends, instead of failing on every reconcile forever.
func TestReconcileOfARemovedShardAfterALostAnswerIsItsSuccess(t *testing.T) {
	rig := newRemovedShardRig(t)
	ctx := context.Background()
	sub, ok, err := rig.store.BeginSubmission(rig.shard)
	if err != nil || !ok {
		t.Fatalf("begin submission: %v %v", ok, err)
	}
	if _, _, err := rig.em.submit(ctx, sub); err != nil { // its answer is "lost"
		t.Fatal(err)
	}
	rig.removeShard(t)

	res, ok, err := rig.em.ReconcileShard(ctx, rig.shard)
	if err != nil || !ok || !res.AlreadyReconciled || res.Receipts != 2 || res.Shard != nil {
		t.Fatalf("reconcile of the removed shard: %+v %v %v", res, ok, err)
	}
	rig.checkEnded(t)
}

// The shard was reconciled by another submission (an operator's, with an
// empty list of receipts) and retention then removed it. The gateway's
// own submission, never sent before, is answered SHARD_NOT_FOUND: the
// SDK finishes it (it is not resent forever) and returns a
// *ShardReceiptsError naming each of its receipts as not taken.
func TestReconcileOfAShardRemovedAfterAnotherReconciliationNamesEveryReceipt(t *testing.T) {
	rig := newRemovedShardRig(t)
	ctx := context.Background()
	if _, err := rig.em.rpc.ReconcileShard(ctx, connect.NewRequest(&ledgerv1.ReconcileShardRequest{ShardId: rig.shard, GatewayId: "gw-a"})); err != nil {
		t.Fatal(err)
	}
	rig.removeShard(t)

	res, ok, err := rig.em.ReconcileShard(ctx, rig.shard)
	var rerr *ShardReceiptsError
	if !errors.As(err, &rerr) || rerr.ShardID != rig.shard || len(rerr.Receipts) != len(rig.ids) {
		t.Fatalf("reconcile of the removed shard: want a ShardReceiptsError naming %v, got %v", rig.ids, err)
	}
	for i, r := range rerr.Receipts {
		if r.ReservationID != rig.ids[i] || r.Reason != reasonRemovedShard {
			t.Fatalf("refused receipt %d: %+v", i, r)
		}
	}
	var le *LedgerError
	if !errors.As(err, &le) || le.Reason != reasonShardNotFound {
		t.Fatalf("the error does not carry the ledger's SHARD_NOT_FOUND: %v", err)
	}
	if !ok || res.AlreadyReconciled || res.Receipts != 0 || res.Shard != nil {
		t.Fatalf("reconcile result: %+v %v", res, ok)
	}
	rig.checkEnded(t)
}
