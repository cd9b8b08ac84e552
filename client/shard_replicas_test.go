package client_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
)

// TestShardFallbackThroughAPartitionFromTwoReplicas runs two `capledger
// serve` replicas on one PostgreSQL schema (sharing one shard keys file,
// as OPERATIONS.md says replicas must), each behind a fault proxy, and two
// gateways whose SDK spreads its connections over both (a client-side
// load balancer: every call dials anew, alternating). While both proxies
// partition the gateways off, each keeps admitting from its own shard
// within its allocation and refuses beyond it, and the ledger (reached
// directly by an operator) sees none of it. After healing, each gateway's
// reconciliation is taken exactly once: one whose answer is lost on one
// replica and retried on the other, both gateways at once, and a late
// receipt of work that was unknown. The account's terms then equal what
// the gateways and the operator did, and the audit (through a replica and
// straight on the store) is clean.
func TestShardFallbackThroughAPartitionFromTwoReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	dsn := replicatest.SchemaDSN(t)
	bin := replicatest.BuildCapledger(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "shard-keys")
	keyLine, err := exec.Command(bin, "shard", "keygen").Output()
	if err != nil {
		t.Fatalf("capledger shard keygen: %v", err)
	}
	if err := os.WriteFile(keys, keyLine, 0o600); err != nil {
		t.Fatal(err)
	}
	replicas := []*replicatest.Replica{
		replicatest.StartReplica(t, bin, dsn, "--shard-keys", keys),
		replicatest.StartReplica(t, bin, dsn, "--shard-keys", keys),
	}
	// Per replica, one proxy carries the gateways' ReconcileShard calls
	// and another everything else, so that the answers a test drops are
	// the reconciliation's, not those of the SDK's background lookups.
	var proxies, reconcileProxies []*faultproxy.Proxy
	for i, r := range replicas {
		for _, list := range []*[]*faultproxy.Proxy{&proxies, &reconcileProxies} {
			p, err := faultproxy.Start(r.Addr, uint64(71+i))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			*list = append(*list, p)
		}
	}
	allProxies := append(append([]*faultproxy.Proxy{}, proxies...), reconcileProxies...)
	ctx := context.Background()
	// The operator's client reaches the first replica directly, never
	// partitioned.
	direct, err := client.New(replicas[0].Addr, client.NoBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	client.PublishTenantPolicy(t, direct, true)

	type gateway struct {
		id    string
		c     *client.Client
		store *client.ShardStore
		em    *client.Emergency
		shard *ledger.Shard
	}
	newGateway := func(id string, allocated int64) *gateway {
		lb := client.ByPath{Reconcile: client.Spread(reconcileProxies), Rest: client.Spread(proxies)}
		// Four attempts: a lost answer on each replica, then an answer.
		c, err := client.NewPartitionedGateway("ledger.invalid:7070", client.WithHTTPClient(&http.Client{Transport: lb}),
			client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 4, BaseDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		store, err := client.OpenShardStore(filepath.Join(dir, id), client.ShardStoreOptions{GatewayID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		em := client.NewEmergency(c, store, client.EmergencyOptions{})
		shard, err := em.Provision(ctx, client.ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: client.Units{"tokens": allocated}, TTL: time.Hour})
		if err != nil {
			t.Fatalf("provision %s: %v", id, err)
		}
		return &gateway{id: id, c: c, store: store, em: em, shard: shard}
	}
	gwA, gwB := newGateway("gw-a", 1000), newGateway("gw-b", 1500)

	tokens := func(n int64) client.Units { return client.Units{"tokens": n} }
	request := func(n int64) client.ReserveRequest {
		return client.ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: tokens(n)}
	}
	// runCentrally reserves, starts and settles used of n through c.
	runCentrally := func(c *client.Client, n, used int64) {
		t.Helper()
		r, err := c.Reserve(ctx, request(n))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Start(ctx, r.ReservationID, "op-"+r.ReservationID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Settle(ctx, r.ReservationID, "op-"+r.ReservationID, tokens(used)); err != nil {
			t.Fatal(err)
		}
	}
	balance := func() *ledgerv1.Balance {
		t.Helper()
		accounts, err := direct.GetAccount(ctx, "tenant-7", "chat.generate", "")
		if err != nil || len(accounts) != 1 {
			t.Fatalf("account: %v %v", accounts, err)
		}
		return accounts[0].GetBalances()[0]
	}

	// Healthy: gw-a's request goes to the ledger, not to its shard.
	healthy, err := gwA.em.Reserve(ctx, request(100))
	if err != nil || healthy.Central == nil || healthy.Local != nil {
		t.Fatalf("healthy reserve: %+v %v", healthy, err)
	}
	if err := gwA.em.Start(ctx, healthy.ReservationID, "op-h"); err != nil {
		t.Fatal(err)
	}
	if err := gwA.em.Settle(ctx, healthy.ReservationID, "op-h", tokens(100)); err != nil {
		t.Fatal(err)
	}
	if b := balance(); b.GetAvailable() != 10_000-1000-1500-100 || b.GetRetiredForEmergency() != 2500 {
		t.Fatalf("before the partition: %v, want 7,400 available and the shards' 2,500 retired", b)
	}

	// Both replicas are cut off from the gateways.
	for _, p := range allProxies {
		p.SetFaults(faultproxy.Faults{Partition: true})
		p.CutAll()
	}
	offline := func(g *gateway, n int64) (*client.EmergencyReservation, error) {
		octx, cancel := context.WithTimeout(ctx, client.OfflineTimeout)
		defer cancel()
		return g.em.Reserve(octx, request(n))
	}
	mustOffline := func(g *gateway, n int64) string {
		t.Helper()
		r, err := offline(g, n)
		if err != nil || r.Local == nil || !client.Unreachable(r.LedgerErr) {
			t.Fatalf("%s: offline reserve of %d: %+v %v", g.id, n, r, err)
		}
		return r.ReservationID
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// gw-a (1,000): 300 of 400 used, 500 running when the partition
	// heals, 150 held and released; 201 more do not fit.
	a1 := mustOffline(gwA, 400)
	must(gwA.em.Start(ctx, a1, "op-a1"))
	must(gwA.em.Settle(ctx, a1, "op-a1", tokens(300)))
	a2 := mustOffline(gwA, 500)
	must(gwA.em.Start(ctx, a2, "op-a2"))
	if _, err := offline(gwA, 201); !errors.Is(err, ledger.ErrInsufficientCapacity) || !client.Unreachable(err) {
		t.Fatalf("gw-a beyond its shard: %v, want insufficient capacity with the ledger unreachable", err)
	}
	a3 := mustOffline(gwA, 150)
	must(gwA.em.Release(ctx, a3))
	// gw-b (1,500): 700 and 100 of 800 used, then a hold of the 700
	// left that never starts (released when the shard is sealed).
	b1 := mustOffline(gwB, 700)
	must(gwB.em.Start(ctx, b1, "op-b1"))
	must(gwB.em.Settle(ctx, b1, "op-b1", tokens(700)))
	b2 := mustOffline(gwB, 800)
	must(gwB.em.Start(ctx, b2, "op-b2"))
	must(gwB.em.Settle(ctx, b2, "op-b2", tokens(100)))
	if _, err := offline(gwB, 701); !errors.Is(err, ledger.ErrInsufficientCapacity) || !client.Unreachable(err) {
		t.Fatalf("gw-b beyond its shard: %v, want insufficient capacity with the ledger unreachable", err)
	}
	mustOffline(gwB, 700)
	// The ledger meanwhile serves the operator (1,000 used) and knows
	// nothing of the shards' admissions.
	runCentrally(direct, 1000, 1000)
	if b := balance(); b.GetAvailable() != 6400 || b.GetSpent() != 1100 {
		t.Fatalf("during the partition: %v, want 6,400 available and 1,100 spent (offline admission touched the ledger?)", b)
	}

	// Healed.
	for _, p := range allProxies[1:] {
		p.SetFaults(faultproxy.Faults{})
	}
	for _, g := range []*gateway{gwA, gwB} {
		client.Heal(t, allProxies[0], g.c)
	}

	// gw-a's first reconciliation: the answer is lost on the replica it
	// reaches first and on the other; the third attempt is refused as
	// already reconciled, which is this submission's success.
	for _, p := range reconcileProxies {
		p.DropNextResponses(1)
	}
	res, err := gwA.em.Reconcile(ctx)
	if got := reconcileProxies[0].Stats().DroppedResponses + reconcileProxies[1].Stats().DroppedResponses; got != 2 {
		t.Fatalf("%d answers lost, want the reconciliation's 2", got)
	}
	if err != nil || len(res) != 1 || !res[0].AlreadyReconciled {
		t.Fatalf("gw-a's reconciliation with its answers lost: %+v %v", res, err)
	}
	if sh := res[0].Shard; sh.GetSpentUnits()["tokens"] != 300 || sh.GetUnknownUnits()["tokens"] != 500 || sh.GetRemintedUnits()["tokens"] != 200 {
		t.Fatalf("gw-a's shard centrally: %v, want 300 spent, 500 unknown, 200 reminted", sh)
	}
	if b := balance(); b.GetAvailable() != 6600 {
		t.Fatalf("after gw-a's reconciliation: %v, want 6,600 available (the 200 unused reminted once)", b)
	}

	// gw-b reconciles while gw-a's unknown work finishes (350 used) and
	// gw-a reports it: two gateways on one account through two replicas.
	var wg sync.WaitGroup
	var resB, resA []client.ShardReconciliation
	var errB, errA error
	wg.Add(2)
	go func() { defer wg.Done(); resB, errB = gwB.em.Reconcile(ctx) }()
	go func() {
		defer wg.Done()
		if errA = gwA.em.Settle(ctx, a2, "op-a2", tokens(350)); errA == nil {
			resA, errA = gwA.em.Reconcile(ctx)
		}
	}()
	wg.Wait()
	if errB != nil || len(resB) != 1 || resB[0].Reminted["tokens"] != 700 || resB[0].AlreadyReconciled {
		t.Fatalf("gw-b's reconciliation: %+v %v, want 700 reminted", resB, errB)
	}
	if sh := resB[0].Shard; sh.GetSpentUnits()["tokens"] != 800 || sh.GetUnknownUnits()["tokens"] != 0 {
		t.Fatalf("gw-b's shard centrally: %v, want 800 spent, nothing unknown", sh)
	}
	if errA != nil || len(resA) != 1 || resA[0].Reminted["tokens"] != 150 {
		t.Fatalf("gw-a's late receipt: %+v %v, want the other 150 of the unknown 500 reminted", resA, errA)
	}
	if sh := resA[0].Shard; sh.GetSpentUnits()["tokens"] != 650 || sh.GetUnknownUnits()["tokens"] != 0 || sh.GetRemintedUnits()["tokens"] != 350 {
		t.Fatalf("gw-a's shard centrally at the end: %v, want 650 spent, 350 reminted", sh)
	}
	// Nothing more to send, from either gateway, on either replica.
	for _, g := range []*gateway{gwA, gwB, gwA, gwB} {
		if res, err := g.em.Reconcile(ctx); err != nil || len(res) != 0 {
			t.Fatalf("%s: a further reconciliation sent %+v %v", g.id, res, err)
		}
	}

	// The account: 10,000 less the operator's 1,000, gw-a's 100 through
	// the ledger and the 650 + 800 used offline. Spent counts the central
	// usage; the shards' usage stays retired; the 350 + 700 unused were
	// minted back once each.
	b := balance()
	if b.GetAvailable() != 10_000-1000-100-650-800 || b.GetSpent() != 1100 || b.GetReserved() != 0 ||
		b.GetRetiredForEmergency() != 2500 || b.GetMinted() != 350+700 || b.GetDebt() != 0 {
		t.Fatalf("at the end: %v, want 7,450 available, 1,100 spent, 2,500 retired for the shards, 1,050 minted back", b)
	}
	for _, r := range replicas {
		shards := capledgerv1connect.NewShardServiceClient(http.DefaultClient, "http://"+r.Addr)
		list, err := shards.ListShards(ctx, connect.NewRequest(&ledgerv1.ListShardsRequest{UnreconciledOnly: true}))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Msg.GetShards() {
			t.Errorf("replica %s: shard %s is not reconciled", r.Addr, s.GetShardId())
		}
		got, err := shards.GetShard(ctx, connect.NewRequest(&ledgerv1.GetShardRequest{ShardId: gwA.shard.ID}))
		// The two retries of its submission whose first answer was
		// lost (the first retry's answer was lost too).
		if err != nil || got.Msg.GetShard().GetRefusedSubmissions() != 2 {
			t.Errorf("replica %s: gw-a's shard has %d refused submissions (%v), want its 2 retries", r.Addr, got.Msg.GetShard().GetRefusedSubmissions(), err)
		}
	}
	for _, args := range [][]string{{"audit", "--addr", "http://" + replicas[1].Addr}, {"audit", "--store", dsn}} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("capledger %v: %v\n%s", args, err, out)
		}
	}
}
