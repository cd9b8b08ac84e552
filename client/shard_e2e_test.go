package client

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/internal/testbinary"
	"github.com/capledger/capledger/internal/testport"
	"github.com/capledger/capledger/ledger"
)

// The capledger binary the tests run as `capledger serve`, built once per
// test run.
var binaries = testbinary.New("../cmd/capledger")

func TestMain(m *testing.M) {
	code := m.Run()
	binaries.Remove()
	os.Exit(code)
}

// ledgerBinary returns the path of the capledger binary built from this
// tree.
func ledgerBinary(t *testing.T) string {
	t.Helper()
	return binaries.Path(t, "capledger")
}

// startLedgerProcess runs the capledger binary (ledgerBinary) as
// `capledger serve` on a free loopback port with its data in dir. It
// returns the address and stops the process (SIGTERM, by its pid) at
// cleanup.
func startLedgerProcess(t *testing.T, dir string) string {
	t.Helper()
	return newLedgerProcess(t, dir).addr
}

// ledgerProcess is a `capledger serve` child process that a test can
// kill (SIGKILL) and start again on the same address and data directory.
type ledgerProcess struct {
	t       *testing.T
	addr    string
	dataDir string
	serve   *exec.Cmd
	exited  chan struct{}
	logs    lockedBuffer
	// args are more flags of serve (e.g. --resolver-config).
	args []string
}

// newLedgerProcess starts a ledgerProcess (see startLedgerProcess), args
// added to serve's flags.
func newLedgerProcess(t *testing.T, dir string, args ...string) *ledgerProcess {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the capledger binary")
	}
	p := &ledgerProcess{t: t, addr: testport.Addr(t), dataDir: filepath.Join(dir, "data"), args: args}
	p.start()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("capledger serve output:\n%s", p.logs.String())
		}
	})
	return p
}

// start runs the process and waits until it is ready.
func (p *ledgerProcess) start() {
	p.t.Helper()
	p.serve = exec.Command(ledgerBinary(p.t), append([]string{"serve", "--addr", p.addr, "--data-dir", p.dataDir, "--log-level", "warn"}, p.args...)...)
	childproc.DieWithParent(p.serve)
	p.serve.Stdout, p.serve.Stderr = &p.logs, &p.logs
	if err := p.serve.Start(); err != nil {
		p.t.Fatal(err)
	}
	exited, serve := make(chan struct{}), p.serve
	p.exited = exited
	go func() { serve.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("capledger serve did not become ready: %v\n%s", err, p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends sig to the running process (if any) and waits for it to
// exit, killing it after 10 s.
func (p *ledgerProcess) stop(sig syscall.Signal) {
	if p.serve == nil {
		return
	}
	p.serve.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.serve.Process.Kill()
		<-p.exited
	}
	p.serve = nil
}

// heal lifts the proxy's faults and waits until c's circuit breaker has
// probed the ledger reachable again (calls fail fast until then).
func heal(t *testing.T, proxy *faultproxy.Proxy, c *Client) {
	t.Helper()
	proxy.SetFaults(faultproxy.Faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReachable(ctx); err != nil {
		t.Fatalf("the breaker did not close after the faults were lifted: %v (%+v)", err, c.Breaker())
	}
}

// The gateways of the end-to-end shard tests wait for every answer of a
// call that must succeed as long as mustSucceedTimeout (each attempt; the
// breaker's watchdog is as patient), so that a loaded machine (2 cores,
// -race, the ledger in another process) does not turn a slow answer into
// a failure. Only the calls made while the proxy cuts the gateway off are
// about a timeout: their context ends after offlineTimeout, and the
// Reserve goes to the shard.
const (
	mustSucceedTimeout = 10 * time.Second
	offlineTimeout     = 200 * time.Millisecond
)

// newPartitionedGateway returns a gateway's Client for the ledger at addr,
// patient as above; extra options come last (and so override).
func newPartitionedGateway(addr string, extra ...Option) (*Client, error) {
	return New(addr, append([]Option{WithTimeout(mustSucceedTimeout), WithBreaker(BreakerPolicy{DetectTimeout: mustSucceedTimeout}),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond})}, extra...)...)
}

// publishTenantPolicy publishes through c the policy the tests against the
// ledger binary run on: tenant-7 on chat.generate, a burst of 10,000
// tokens, emergency shards allowed when emergency.
func publishTenantPolicy(t *testing.T, c *Client, emergency bool) {
	t.Helper()
	if _, _, err := c.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: emergency,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 10_000}},
	}); err != nil {
		t.Fatal(err)
	}
}

// newPartitionRig starts the ledger binary on dir, a fault proxy (seed) in
// front of it, the operator's direct client (never partitioned) with the
// emergency policy published, and a gateway that reaches the ledger
// through the proxy; all are closed when the test ends. addr is the
// ledger's own address.
func newPartitionRig(t *testing.T, dir string, seed uint64) (addr string, proxy *faultproxy.Proxy, direct, gw *Client) {
	t.Helper()
	addr = startLedgerProcess(t, dir)
	proxy, err := faultproxy.Start(addr, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	direct, err = New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	publishTenantPolicy(t, direct, true)
	gw, err = newPartitionedGateway(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return addr, proxy, direct, gw
}

// availableTokens reads the subject's tokens available in its current
// account, through a direct (unproxied) connection.
func availableTokens(t *testing.T, c *Client) int64 {
	t.Helper()
	accounts, err := c.GetAccount(context.Background(), "tenant-7", "chat.generate", "")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, a := range accounts {
		for _, b := range a.GetBalances() {
			if b.GetUnit() == "tokens" {
				total += b.GetAvailable()
			}
		}
	}
	return total
}

// TestEmergencyShardEndToEnd runs a real `capledger serve` process and a
// gateway using the SDK through a TCP proxy. The proxy partitions the
// gateway from the ledger; the gateway keeps admitting from its shard
// within its bound; the partition heals; reconciliation remints exactly
// the unused units, and later the units of work that was unknown. The same
// shard presented by a second gateway, replayed after a gateway restart,
// tampered with, or used after expiry is refused, and the ledger's audit
// stays clean.
func TestEmergencyShardEndToEnd(t *testing.T) {
	dir := t.TempDir()
	// direct is the operator's view, never partitioned.
	_, proxy, direct, gw := newPartitionRig(t, dir, 7)
	ctx := context.Background()
	storeDir := filepath.Join(dir, "gw-a")
	store, err := OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	em := NewEmergency(gw, store, EmergencyOptions{})
	shard, err := em.Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if shard.GatewayID != "gw-a" || shard.BootEpoch != store.BootEpoch() || shard.Allocated[0] != 1000 {
		t.Fatalf("provisioned %+v", shard)
	}
	token := store.Shards()[0].Token

	// Healthy: admission goes through the ledger, not the shard.
	healthy, err := em.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil || healthy.Central == nil || healthy.Local != nil {
		t.Fatalf("healthy reserve: %+v %v", healthy, err)
	}
	if err := em.Start(ctx, healthy.ReservationID, "op-h"); err != nil {
		t.Fatal(err)
	}
	if err := em.Settle(ctx, healthy.ReservationID, "op-h", Units{"tokens": 100}); err != nil {
		t.Fatal(err)
	}
	before := availableTokens(t, direct)
	if before != 10_000-1000-100 {
		t.Fatalf("available before the partition: %d", before)
	}

	// The proxy cuts the gateway off.
	proxy.SetFaults(faultproxy.Faults{Partition: true})
	proxy.CutAll()
	reserve := func(tokens int64) (*EmergencyReservation, error) { // only while cut off
		octx, cancel := context.WithTimeout(ctx, offlineTimeout)
		defer cancel()
		return em.Reserve(octx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": tokens}})
	}
	r1, err := reserve(400)
	if err != nil || r1.Local == nil || !Unreachable(r1.LedgerErr) {
		t.Fatalf("offline reserve: %+v %v", r1, err)
	}
	if err := em.Start(ctx, r1.ReservationID, "op-1"); err != nil {
		t.Fatal(err)
	}
	if err := em.Settle(ctx, r1.ReservationID, "op-1", Units{"tokens": 300}); err != nil {
		t.Fatal(err)
	}
	r2, err := reserve(500)
	if err != nil || r2.Local == nil {
		t.Fatalf("second offline reserve: %+v %v", r2, err)
	}
	if err := em.Start(ctx, r2.ReservationID, "op-2"); err != nil {
		t.Fatal(err)
	}
	// 1000 - 300 - 500 = 200 left: the shard's bound holds.
	if _, err := reserve(201); !errors.Is(err, ledger.ErrInsufficientCapacity) || !Unreachable(err) {
		t.Fatalf("beyond the shard's bound: %v", err)
	}
	r3, err := reserve(150)
	if err != nil || r3.Local == nil {
		t.Fatalf("third offline reserve: %+v %v", r3, err)
	}
	if err := em.Release(ctx, r3.ReservationID); err != nil {
		t.Fatal(err)
	}
	if got := availableTokens(t, direct); got != before {
		t.Fatalf("offline admission touched the ledger: available %d, was %d", got, before)
	}

	// The connection returns; r2 is still running (its usage unknown).
	heal(t, proxy, gw)
	results, err := em.Reconcile(ctx)
	if err != nil || len(results) != 1 {
		t.Fatalf("reconcile: %+v %v", results, err)
	}
	if results[0].Reminted["tokens"] != 200 || results[0].Shard.GetUnknownUnits()["tokens"] != 500 ||
		results[0].Shard.GetSpentUnits()["tokens"] != 300 || results[0].AlreadyReconciled {
		t.Fatalf("reconciliation: %+v", results[0])
	}
	if got := availableTokens(t, direct); got != before+200 {
		t.Fatalf("available after reconciliation %d, want %d + exactly the 200 unused", got, before)
	}
	// Sealed: the shard admits nothing more, even if the ledger goes away.
	proxy.SetFaults(faultproxy.Faults{Partition: true})
	proxy.CutAll()
	if _, err := reserve(1); !errors.Is(err, ledger.ErrShardSealed) {
		t.Fatalf("reserve from a reconciled shard: %v", err)
	}
	heal(t, proxy, gw)

	// r2 finishes: 350 used. Its late receipt remints the other 150, once.
	if err := em.Settle(ctx, r2.ReservationID, "op-2", Units{"tokens": 350}); err != nil {
		t.Fatal(err)
	}
	results, err = em.Reconcile(ctx)
	if err != nil || len(results) != 1 || results[0].Reminted["tokens"] != 150 || results[0].Shard.GetUnknownUnits()["tokens"] != 0 {
		t.Fatalf("late reconciliation: %+v %v", results, err)
	}
	if got := availableTokens(t, direct); got != before+350 {
		t.Fatalf("available after the late receipt %d, want %d", got, before+350)
	}
	if results, err := em.Reconcile(ctx); err != nil || len(results) != 0 {
		t.Fatalf("a third reconciliation sent %+v %v", results, err)
	}
	// A duplicate submission straight to the API is refused and counted.
	dup := &ledgerv1.ReconcileShardRequest{ShardId: shard.ID, GatewayId: "gw-a", Receipts: []*ledgerv1.ShardReceipt{{
		ReservationId: r2.ReservationID, State: ledgerv1.ReservationState_RESERVATION_STATE_SETTLED,
		ReservedUnits: Units{"tokens": 500}, ActualUnits: Units{"tokens": 0}}}}
	_, err = em.rpc.ReconcileShard(ctx, connect.NewRequest(dup))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("duplicate recovery: %v", err)
	}

	// The same shard presented by a second gateway.
	other, err := OpenShardStore(filepath.Join(dir, "gw-b"), ShardStoreOptions{GatewayID: "gw-b"})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := em.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Install(token, []string{"tokens"}, keys); !errors.Is(err, ledger.ErrShardForeign) {
		t.Fatalf("second gateway installed gw-a's shard: %v", err)
	}
	other.Close()
	_, err = em.rpc.ReconcileShard(ctx, connect.NewRequest(&ledgerv1.ReconcileShardRequest{ShardId: shard.ID, GatewayId: "gw-b"}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("second gateway reconciled gw-a's shard: %v", err)
	}
	got, err := em.rpc.GetShard(ctx, connect.NewRequest(&ledgerv1.GetShardRequest{ShardId: shard.ID}))
	if err != nil || got.Msg.GetShard().GetRefusedSubmissions() != 2 {
		t.Fatalf("refused submissions: %v %v", got, err)
	}

	// A gateway restart: the old shard is never spent again, and replaying
	// its token into the new process is refused.
	store.Close()
	store, err = OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { store.Close() }()
	em = NewEmergency(gw, store, EmergencyOptions{})
	if _, err := store.Install(token, []string{"tokens"}, keys); !errors.Is(err, ledger.ErrShardBootEpoch) {
		t.Fatalf("old shard replayed after restart: %v", err)
	}
	fresh, err := em.Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 500}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Fence <= shard.Fence || fresh.BootEpoch <= shard.BootEpoch {
		t.Fatalf("new shard fence %d boot %d after fence %d boot %d", fresh.Fence, fresh.BootEpoch, shard.Fence, shard.BootEpoch)
	}

	// A tampered token (the allocation doubled without a new signature).
	forged, _ := ledger.DecodeShardToken(store.Shards()[1].Token)
	forged.Allocated[0] *= 2
	forged.ID = "sh-forged"
	if _, err := store.Install(ledger.EncodeShardToken(forged), []string{"tokens"}, keys); !errors.Is(err, ledger.ErrShardSignature) {
		t.Fatalf("tampered shard: %v", err)
	}

	// After its expiry the shard admits nothing, even while cut off. The
	// gateway's clock is moved past the expiry rather than waiting.
	store.Close()
	late := func() time.Time { return time.Now().Add(2 * time.Hour) }
	store, err = OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a", Clock: late})
	if err != nil {
		t.Fatal(err)
	}
	em = NewEmergency(gw, store, EmergencyOptions{})
	expiring, err := em.Provision(ctx, ProvisionRequest{ShardID: "sh-orphan", Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}, TTL: time.Hour})
	if !errors.Is(err, ledger.ErrShardExpired) || expiring != nil {
		t.Fatalf("installing a shard already expired by the gateway's clock: %v", err)
	}
	// The ledger issued it, the gateway refused it: an operator hands it
	// back with no receipts (capledger shard reconcile sh-orphan --gateway
	// gw-a), and all of it is reminted.
	orphan, err := em.rpc.ReconcileShard(ctx, connect.NewRequest(&ledgerv1.ReconcileShardRequest{ShardId: "sh-orphan", GatewayId: "gw-a"}))
	if err != nil || orphan.Msg.GetRemintedUnits()["tokens"] != 100 {
		t.Fatalf("orphan shard: %v %v", orphan, err)
	}
	store.Close()
	store, err = OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	clock := &testClock{now: time.Now()}
	em = NewEmergency(gw, store, EmergencyOptions{})
	store.clock = clock.Now // the process's own clock from here on
	if _, err := em.Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	proxy.SetFaults(faultproxy.Faults{Partition: true})
	proxy.CutAll()
	if _, err := reserve(1); !errors.Is(err, ledger.ErrShardExpired) {
		t.Fatalf("reserve from an expired shard: %v", err)
	}
	heal(t, proxy, gw)

	// Everything the gateway holds goes back; the ledger audits clean:
	// every account's conservation, retiredForEmergency against the shards,
	// and each reconciled shard's split.
	if _, err := em.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	discrepancies, err := direct.Audit(ctx)
	if err != nil || len(discrepancies) != 0 {
		t.Fatalf("audit: %v %v", discrepancies, err)
	}
	list, err := em.rpc.ListShards(ctx, connect.NewRequest(&ledgerv1.ListShardsRequest{UnreconciledOnly: true}))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Msg.GetShards() {
		t.Errorf("shard %s was not reconciled", s.GetShardId())
	}
	// The expired shard was never used: all of it came back.
	want := int64(10_000 - 100 - 300 - 350)
	if got := availableTokens(t, direct); got != want {
		t.Fatalf("available at the end %d, want %d (burst - used centrally - used offline)", got, want)
	}
}
