package postgres_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// partitionable is one replica's connection to the shared database:
// while cut is set its lease renewals fail (as across a network
// partition), and while held is set its backlog reads wait until it is
// cleared (its resolver's scan cannot complete).
type partitionable struct {
	*postgres.Store
	cut     atomic.Bool
	held    atomic.Bool
	waiting atomic.Int64 // backlog reads waiting on held
}

func (s *partitionable) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if s.cut.Load() {
		return store.Lease{}, errors.New("lease renewal: connection refused (partitioned by the test)")
	}
	return s.Store.LeaseAcquire(ctx, name, holder, ttl)
}

func (s *partitionable) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	if s.held.Load() {
		s.waiting.Add(1)
		defer s.waiting.Add(-1)
		for s.held.Load() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}
	return s.Store.ReservationsUnknown(ctx, f)
}

// stillRunning says of every operation that it is still running.
type stillRunning struct{}

func (stillRunning) OperationStatus(context.Context, *ledger.Reservation) (engine.OperationStatus, error) {
	return engine.OperationStatus{State: engine.OperationRunning}, nil
}

// Two replicas on one PostgreSQL: the overdue count (ResolverStats: the
// metric capledger_usage_unknown_overdue, ListUsageUnknown's overdue and
// resolverScanned) is the worker leader's. The replica that loses the
// lease stops reporting the count it had while the new leader reports
// its own; when it takes the lease back it reports none until it has
// scanned the backlog again (the other replica led meanwhile).
func TestResolverOverdueIsReportedByTheLeaderOnly(t *testing.T) {
	first, dsn := openStore(t)
	second, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	ctx := context.Background()
	p := seedPolicy()
	p.HoldTTL = time.Hour
	if res := commitCmds(t, first, time.Now(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	replica := func(st store.Store, holder string) *engine.Engine {
		return engine.New(st, engine.Options{LeaseTTL: 600 * time.Millisecond, LeaseHolder: holder, WorkerInterval: 20 * time.Millisecond,
			EpochInterval: time.Hour, Resolver: &engine.ResolverOptions{Source: stillRunning{}, Interval: 20 * time.Millisecond,
				Deadline: func(*ledger.Reservation) time.Duration { return time.Nanosecond }}})
	}
	aStore := &partitionable{Store: first}
	defer aStore.held.Store(false)
	a := replica(aStore, "replica-a")
	defer a.Close()
	for _, c := range []ledger.Command{reserveCmd("late", 100), {Kind: ledger.KindStart, ReservationID: "late", OperationID: "op-late"},
		{Kind: ledger.KindMarkUsageUnknown, ReservationID: "late"}} {
		if res, err := a.Do(ctx, c); err != nil || res.Err != nil {
			t.Fatalf("%v: %v %v", c.Kind, err, res.Err)
		}
	}
	overdueOne := func(e *engine.Engine) func() bool {
		return func() bool { s := e.ResolverStats(); return s.Scanned && s.Overdue == 1 }
	}
	waitFor(t, "replica a to lead and count the overdue reservation", overdueOne(a))
	b := replica(second, "replica-b")
	bClosed := false
	defer func() {
		if !bClosed {
			b.Close()
		}
	}()
	time.Sleep(100 * time.Millisecond) // a few of b's lease attempts
	if s := b.ResolverStats(); s.Scanned || s.Overdue != 0 || b.IsLeader() {
		t.Fatalf("replica b, not leading, reports %+v (leader %v)", s, b.IsLeader())
	}

	// a's renewals fail: it leads until its last one lapses, then b takes
	// the lease over.
	aStore.cut.Store(true)
	waitFor(t, "replica a to know it lost the lease", func() bool { return !a.IsLeader() })
	if s := a.ResolverStats(); s.Scanned || s.Overdue != 0 {
		t.Fatalf("replica a, no longer leading, still reports scanned %v overdue %d", s.Scanned, s.Overdue)
	}
	waitFor(t, "replica b to lead and count the overdue reservation", overdueOne(b))
	if s := a.ResolverStats(); s.Scanned || s.Overdue != 0 {
		t.Fatalf("replica a, not leading, reports scanned %v overdue %d next to the leader's", s.Scanned, s.Overdue)
	}

	// a takes the lease back (b stops and releases it) while a's scans
	// cannot complete: a reports nothing, not the count of its earlier term.
	aStore.held.Store(true)
	b.Close()
	bClosed = true
	aStore.cut.Store(false)
	waitFor(t, "replica a to lead again and begin a scan", func() bool { return a.IsLeader() && aStore.waiting.Load() > 0 })
	if s := a.ResolverStats(); s.Scanned || s.Overdue != 0 {
		t.Fatalf("replica a, leading again before a scan of its new term completed, reports scanned %v overdue %d", s.Scanned, s.Overdue)
	}
	aStore.held.Store(false)
	waitFor(t, "replica a to count the overdue reservation again", overdueOne(a))
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
