package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// A hold under a superseded generation counts in the new generation's
// burst until the expiry worker ends it: then the room comes back
// (ledger.Account.HeldElsewhere drops as the refund is forwarded).
func TestExpiryWorkerEndsAHoldCountedElsewhere(t *testing.T) {
	clk := newClock()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, 30*time.Second, 0)
	mustDo(t, e, reserveCmd("old", 600))
	publish(t, e, 1000, time.Hour, 0) // same burst, another hold TTL: a new generation
	mustDo(t, e, reserveCmd("new", 400))
	clk.Advance(31 * time.Second)
	if res, err := e.Do(ctx, reserveCmd("x", 600)); err != nil || res.Err == nil {
		t.Fatalf("600 tokens beside 1000 held: %+v, %v; want a refusal", res.Err, err)
	}
	e.runDue(ctx)
	if r, _ := e.Reservation(ctx, "old"); r.State != ledger.StateExpired {
		t.Fatalf("old hold past its TTL: %s, want EXPIRED", r.State)
	}
	accounts, err := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts {
		if a.HeldElsewhere != (ledger.Amounts{}) {
			t.Fatalf("%s counts %v held elsewhere after the old hold expired", a.Key, a.HeldElsewhere)
		}
	}
	mustDo(t, e, reserveCmd("x", 600))
	auditClean(t, e)
}
