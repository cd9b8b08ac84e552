package client

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

// Issue 23, item 2: a late receipt is never dropped. Three requests run
// from a shard during a partition and are reported unknown when the ledger
// comes back. An operator resolves one of them with `capledger shard
// reconcile --receipts` (the documented path); then the gateway settles
// all three and reconciles. The ledger refuses the batch of three as
// SHARD_ALREADY_RECONCILED, which is not this gateway's earlier success:
// the SDK reads the shard's central state, resends the two still pending,
// and names the third in its error. (A refusal after a lost answer of the
// same submission, earlier in the test, is that submission's success.) Afterwards neither side holds
// anything unknown, and the audit is clean.
func TestReconcileResendsReceiptsAnOperatorDidNotResolve(t *testing.T) {
	dir := t.TempDir()
	addr, proxy, direct, _ := newPartitionRig(t, dir, 23)
	ctx := context.Background()
	// The gateway's ReconcileShard calls go through a proxy of their own, so
	// that the answer dropped below is the submission's and no other call's
	// (a background lookup's, a resend's).
	reconcileProxy, err := faultproxy.Start(addr, 24)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reconcileProxy.Close() })
	gw, err := newPartitionedGateway(proxy.Addr(), WithHTTPClient(&http.Client{
		Transport: byPath{Reconcile: spread([]*faultproxy.Proxy{reconcileProxy}), Rest: spread([]*faultproxy.Proxy{proxy})}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	store, err := OpenShardStore(filepath.Join(dir, "gw-a"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	em := NewEmergency(gw, store, EmergencyOptions{})
	shard, err := em.Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 9000}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	proxy.SetFaults(faultproxy.Faults{Partition: true})
	proxy.CutAll()
	var ids []string
	for i, tokens := range []int64{3000, 3000, 2000} {
		octx, cancel := context.WithTimeout(ctx, offlineTimeout)
		r, err := em.Reserve(octx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": tokens}})
		cancel()
		if err != nil || r.Local == nil {
			t.Fatalf("offline reserve %d: %+v %v", i, r, err)
		}
		if err := em.Start(ctx, r.ReservationID, "op-"+r.ReservationID); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ReservationID)
	}
	heal(t, proxy, gw)
	// The first submission's answer is lost; its retry is refused as
	// already reconciled, which is this very submission's success (the
	// central split is exactly the one these receipts produce).
	// (The partitioned Reserves' background lookups finish first, so the
	// dropped answer is the submission's.)
	for deadline := time.Now().Add(30 * time.Second); len(gw.LostReserves()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lost reserves still looked up: %+v", gw.LostReserves())
		}
	}
	reconcileProxy.DropNextResponses(1)
	if res, err := em.Reconcile(ctx); err != nil || len(res) != 1 || !res[0].AlreadyReconciled || res[0].Shard.GetUnknownUnits()["tokens"] != 8000 {
		t.Fatalf("first reconciliation: %+v %v", res, err)
	}
	if st := store.Shards()[0]; !st.Submitted || st.Pending != 3 {
		t.Fatalf("local state after the first reconciliation: %+v", st)
	}

	// The operator settles the first one centrally (2,000 used).
	receiptsFile := filepath.Join(dir, "receipts.json")
	if err := os.WriteFile(receiptsFile, []byte(`[{"reservation_id":"`+ids[0]+`","state":"settled","reserved_units":{"tokens":3000},"actual_units":{"tokens":2000}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cli := exec.Command(ledgerBinary(t), "shard", "reconcile", shard.ID, "--gateway", "gw-a", "--receipts", receiptsFile, "--addr", addr)
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("capledger shard reconcile: %v\n%s", err, out)
	}

	// The gateway learns all three usages and reports them.
	for i, used := range []int64{2000, 2500, 1904} {
		if err := em.Settle(ctx, ids[i], "op-"+ids[i], Units{"tokens": used}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := em.Reconcile(ctx)
	var rerr *ShardReceiptsError
	if !errors.As(err, &rerr) || len(rerr.Receipts) != 1 || rerr.Receipts[0].ReservationID != ids[0] {
		t.Fatalf("reconcile after the operator's resolution: want an error naming %s alone, got %v", ids[0], err)
	}
	if len(res) != 1 || res[0].Receipts != 2 || !slices.Equal(res[0].ResolvedElsewhere, ids[:1]) || res[0].AlreadyReconciled {
		t.Fatalf("reconcile result: %+v", res)
	}
	// 500 + 96 unused of the two resent holds are reminted.
	if got := res[0].Reminted["tokens"]; got != 500+96 {
		t.Fatalf("reminted %d, want %d", got, 500+96)
	}

	// Both sides agree: nothing pending, nothing unknown centrally.
	got, err := em.rpc.GetShard(ctx, connect.NewRequest(&ledgerv1.GetShardRequest{ShardId: shard.ID, ReceiptIds: ids}))
	if err != nil {
		t.Fatal(err)
	}
	if u := got.Msg.GetShard().GetUnknownUnits()["tokens"]; u != 0 {
		t.Fatalf("central unknown %d after reconciliation, want 0", u)
	}
	if s := got.Msg.GetShard().GetSpentUnits()["tokens"]; s != 2000+2500+1904 {
		t.Fatalf("central spent %d", s)
	}
	for _, st := range got.Msg.GetReceipts() {
		if st.GetStanding() != ledgerv1.ShardReceiptStanding_STANDING_RESOLVED {
			t.Fatalf("receipt %s stands %s centrally", st.GetReservationId(), st.GetStanding())
		}
	}
	for _, s := range store.Shards() {
		if s.Pending != 0 {
			t.Fatalf("shard %s: %d receipts pending locally", s.Shard.ID, s.Pending)
		}
	}
	if res, err := em.Reconcile(ctx); err != nil || len(res) != 0 {
		t.Fatalf("a further reconciliation: %+v %v", res, err)
	}
	if discrepancies, err := direct.Audit(ctx); err != nil || len(discrepancies) != 0 {
		t.Fatalf("audit: %v %v", discrepancies, err)
	}
}

// A shard store written by an SDK older than the id rule holds a
// reservation id over 256 bytes and one with a NUL byte. After the
// upgrade it opens (TestShardStoreOpensALogWithIDsTodaysRuleRefuses), and
// its shard reconciles: the ledger refuses a receipt with such an id, and
// with it the whole submission, so the SDK sends those receipts under
// ledgerReceiptID (the same on every submission). The ledger charges the
// old work as logged, and a later settle of the old unknown work resolves
// it under the same id.
func TestReconcileSendsOldIDsTheLedgerRefuses(t *testing.T) {
	dir := t.TempDir()
	addr := startLedgerProcess(t, dir)
	ctx := context.Background()
	c, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 10_000}},
	}); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "gw-a")
	store, err := OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	shard, err := NewEmergency(c, store, EmergencyOptions{}).Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 9000}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Reserve("r-ok", "d-ok", "tenant-7", "chat.generate", "", Units{"tokens": 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Start("r-ok", "op-ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Settle("r-ok", "op-ok", Units{"tokens": 100}); err != nil {
		t.Fatal(err)
	}
	store.Close()
	long, nul := strings.Repeat("x", 300), "old\x00id"
	at := time.Now().UnixNano()
	appendOldRecord(t, storeDir, shardRecord{Op: "reserve", At: at, Shard: shard.ID, ID: long, Digest: "d-long", Amounts: ledger.Amounts{500}})
	appendOldRecord(t, storeDir, shardRecord{Op: "start", At: at, Shard: shard.ID, ID: long, Operation: "op-long"})
	appendOldRecord(t, storeDir, shardRecord{Op: "settle", At: at, Shard: shard.ID, ID: long, Operation: "op-long", Amounts: ledger.Amounts{300}})
	appendOldRecord(t, storeDir, shardRecord{Op: "reserve", At: at, Shard: shard.ID, ID: nul, Digest: "d-nul", Amounts: ledger.Amounts{200}})
	appendOldRecord(t, storeDir, shardRecord{Op: "start", At: at, Shard: shard.ID, ID: nul, Operation: "op-nul"})

	store, err = OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatalf("the upgraded gateway cannot open its shard store: %v", err)
	}
	defer store.Close()
	em := NewEmergency(c, store, EmergencyOptions{})
	results, err := em.Reconcile(ctx)
	if err != nil || len(results) != 1 || results[0].Receipts != 3 {
		t.Fatalf("reconcile after the upgrade: %+v %v", results, err)
	}
	sh := results[0].Shard
	if sh.GetSpentUnits()["tokens"] != 400 || sh.GetUnknownUnits()["tokens"] != 200 || sh.GetRemintedUnits()["tokens"] != 8400 {
		t.Fatalf("the ledger's shard: spent %v unknown %v reminted %v; want 400, 200, 8400",
			sh.GetSpentUnits(), sh.GetUnknownUnits(), sh.GetRemintedUnits())
	}
	// The old unknown work finishes: its receipt resolves it once.
	if _, err := store.Settle(nul, "op-nul", Units{"tokens": 150}); err != nil {
		t.Fatal(err)
	}
	results, err = em.Reconcile(ctx)
	if err != nil || len(results) != 1 {
		t.Fatalf("reconcile of the settled old work: %+v %v", results, err)
	}
	if sh := results[0].Shard; sh.GetSpentUnits()["tokens"] != 550 || sh.GetUnknownUnits()["tokens"] != 0 {
		t.Fatalf("after the old work settled: spent %v unknown %v; want 550, 0", sh.GetSpentUnits(), sh.GetUnknownUnits())
	}
}
