package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// A unit the deciding generation does not limit keeps what the old
// generation holds in it (docs/ROLLOUT.md, "Limitations"): the drain pass
// moves the other units, and DrainProgress keeps counting that capacity,
// so the old generation is never reported drained and `rollback --wait`
// on it does not reach zero.
func TestDrainProgressKeepsADroppedUnitsCapacity(t *testing.T) {
	ctx := context.Background()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: func() time.Time { return t0 }})
	t.Cleanup(func() { e.Close() })
	do := func(cmd ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatalf("%s: %+v, %v", cmd.Kind, res, err)
		}
	}
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	publish := func(dims ...ledger.Dimension) {
		p := ledger.Policy{Key: key, Dimensions: dims}.WithDefaults()
		do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	reserve := func(id string, units ledger.Amounts) {
		do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: units})
		do(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
	}
	publish(ledger.Dimension{Unit: "tokens", Burst: 100}, ledger.Dimension{Unit: "requests", Burst: 10}) // generation 1
	reserve("a", ledger.Amounts{10, 1})
	publish(ledger.Dimension{Unit: "tokens", Burst: 100}) // generation 2, without requests
	reserve("b", ledger.Amounts{10})                      // switches the subject to generation 2
	if _, err := e.RunDrains(ctx); err != nil {
		t.Fatal(err)
	}
	drains, err := e.DrainProgress(ctx, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	d := drains[0]
	if d.Available != (ledger.Amounts{0, 10}) || d.Drained() {
		t.Fatalf("generation 1 after the drain pass: available %v, drained %v; want tokens moved and the 10 requests left, not drained", d.Available, d.Drained())
	}
}
