package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// leaseHeldElsewhere is an in-memory store whose worker lease another
// replica holds: LeaseAcquire never grants it.
type leaseHeldElsewhere struct{ *memstore.Store }

func (s leaseHeldElsewhere) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	return store.Lease{Name: name, Holder: "other-replica", Fence: 1, Expires: time.Now().Add(ttl)}, nil
}

// The USAGE_UNKNOWN resolver is a leader worker (docs/OPERATIONS.md, "The
// USAGE_UNKNOWN resolver", "One replica"): a replica started with the
// resolver's file asks nobody while another replica holds the worker
// lease, and the holder asks.
func TestResolverRunsOnlyOnTheWorkerLeader(t *testing.T) {
	for _, leader := range []bool{false, true} {
		clk := newClock()
		src := newScripted()
		src.set("op-a", OperationStatus{State: OperationRunning}, nil)
		var st store.Store = memstore.New()
		if !leader {
			st = leaseHeldElsewhere{st.(*memstore.Store)}
		}
		e := New(st, Options{Clock: clk.Now, LeaseTTL: time.Second, WorkerInterval: 10 * time.Millisecond,
			Resolver: &ResolverOptions{Source: src, Interval: 10 * time.Millisecond}})
		publish(t, e, 10000, time.Minute, 30*time.Second)
		unknownWork(t, e, clk, "a")
		if r := state(t, e, "a"); r.State != ledger.StateUsageUnknown {
			t.Fatalf("leader %v: a is %s, want USAGE_UNKNOWN", leader, r.State)
		}
		// Long enough for dozens of resolver ticks on the leader.
		deadline := time.Now().Add(2 * time.Second)
		for src.count("op-a") == 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		asked := src.count("op-a")
		e.Close()
		if leader && asked == 0 {
			t.Fatal("the lease holder's resolver asked nobody")
		}
		if !leader && asked != 0 {
			t.Fatalf("a replica without the worker lease asked %d times", asked)
		}
	}
}
