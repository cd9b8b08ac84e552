package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

// When the shard store cannot record the settle of local work that ran
// (its log write fails), Emergency.Run returns *UsageUnknownError with
// the receipt and the work's usage, as Client.Run does for a settle the
// ledger could not take; after the store is reopened (a gateway restart)
// the work is USAGE_UNKNOWN there and Emergency.Settle with the receipt
// settles it. It used to return a bare error: the work stayed STARTED
// with nobody holding its operation id.
func TestEmergencyRunKeepsTheReceiptWhenTheShardStoreCannotSettle(t *testing.T) {
	l := startShardLedger(t)
	gw, em := emergencyGateway(t, l, WithTimeout(2*time.Second), WithBreaker(BreakerPolicy{DetectTimeout: 200 * time.Millisecond}))
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	res, err := em.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(ctx context.Context) (Units, error) {
			// The disk under the shard store fails while the work runs.
			em.store.mu.Lock()
			em.store.log.Close()
			em.store.mu.Unlock()
			return Units{"tokens": 7}, nil
		})
	unknown := mustErrAs[*UsageUnknownError](t, err)
	if res != nil || !errors.Is(err, ErrShardStoreBroken) || unknown.Marked {
		t.Fatalf("run: %+v, %v (marked %v): want no result and ErrShardStoreBroken, not marked", res, err, unknown.Marked)
	}
	r := unknown.Receipt
	if !em.store.Has(r.ReservationID) || r.OperationID == "" || r.Actual["tokens"] != 7 {
		t.Fatalf("receipt %+v: want the local reservation, its operation id and the 7 tokens the work used", r)
	}

	em.store.Close()
	store, err := OpenShardStore(em.store.dir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	reopened := NewEmergency(gw, store, EmergencyOptions{})
	state := func() LocalReceipt {
		t.Helper()
		receipts, err := store.Receipts(store.Shards()[0].Shard.ID)
		if err != nil || len(receipts) != 1 {
			t.Fatalf("receipts %+v, %v", receipts, err)
		}
		return receipts[0]
	}
	if got := state(); got.State != ledger.StateUsageUnknown || got.OperationID != r.OperationID {
		t.Fatalf("after the restart: %+v, want USAGE_UNKNOWN under operation %s", got, r.OperationID)
	}
	if err := reopened.Settle(context.Background(), r.ReservationID, r.OperationID, r.Actual); err != nil {
		t.Fatalf("settle with the receipt: %v", err)
	}
	if got := state(); got.State != ledger.StateSettled || got.Actual["tokens"] != 7 {
		t.Fatalf("after settling with the receipt: %+v, want SETTLED with 7 tokens", got)
	}
}
