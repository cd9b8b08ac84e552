package client

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

// Contract tests of docs/CLIENTS.md and the shard part of
// docs/OPERATIONS.md, run against the real `capledger serve` binary over
// real sockets, with faultproxy where the network fails.

// A shard id is Provision's idempotency key, and the ledger answers an
// IssueShard with a known id by replaying its token, also once the shard
// is reconciled. A shard that has ended and been compacted out of the
// store must not come back from that replay: its capacity was spent and
// the rest reminted to the account, so admitting from it again would
// spend the same capacity twice.
func TestProvisionAgainAfterTheShardEndedAndWasCompactedIsRefused(t *testing.T) {
	dir := t.TempDir()
	addr := startLedgerProcess(t, dir)
	proxy, err := faultproxy.Start(addr, 11)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx := context.Background()
	direct, err := New(addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, _, err := direct.PublishPolicy(ctx, &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 10_000}},
	}); err != nil {
		t.Fatal(err)
	}
	gw, err := newPartitionedGateway(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	// Compacts as soon as an ended shard's records outweigh the rest.
	store, err := OpenShardStore(filepath.Join(dir, "gw-a"), ShardStoreOptions{GatewayID: "gw-a", compactAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	em := NewEmergency(gw, store, EmergencyOptions{})
	provision := ProvisionRequest{ShardID: "sh-gw-a-tenant-7", Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}, TTL: time.Hour}
	if _, err := em.Provision(ctx, provision); err != nil {
		t.Fatal(err)
	}
	offlineReserve := func() (*EmergencyReservation, error) {
		proxy.SetFaults(faultproxy.Faults{Partition: true})
		proxy.CutAll()
		octx, cancel := context.WithTimeout(ctx, offlineTimeout)
		defer cancel()
		return em.Reserve(octx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	}
	r, err := offlineReserve()
	if err != nil || r.Local == nil {
		t.Fatalf("offline reserve: %+v %v", r, err)
	}
	if err := em.Start(ctx, r.ReservationID, "op-1"); err != nil {
		t.Fatal(err)
	}
	if err := em.Settle(ctx, r.ReservationID, "op-1", Units{"tokens": 60}); err != nil {
		t.Fatal(err)
	}
	heal(t, proxy, gw)
	if _, err := em.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if shards := store.Shards(); len(shards) != 0 {
		t.Fatalf("the ended shard was not compacted away: %+v", shards)
	}
	after := availableTokens(t, direct)
	if after != 10_000-60 {
		t.Fatalf("available after reconciliation %d, want %d", after, 10_000-60)
	}

	_, err = em.Provision(ctx, provision)
	if !errors.Is(err, ledger.ErrShardIDReused) {
		t.Fatalf("provision of the ended shard's id again: %v, want ErrShardIDReused", err)
	}
	if r, err := offlineReserve(); !errors.Is(err, ErrNoShard) {
		t.Fatalf("offline reserve after the shard ended: %+v %v, want ErrNoShard", r, err)
	}
	heal(t, proxy, gw)
	if got := availableTokens(t, direct); got != after {
		t.Fatalf("available %d, was %d", got, after)
	}
}
