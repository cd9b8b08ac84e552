package engine

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// policyReadStore counts the reads of every policy: PolicyList, or the
// first page of every policy (PolicyPage from the start, unfiltered),
// which a drain pass reads on to the last.
type policyReadStore struct {
	store.Store
	lists atomic.Int64
}

func (s *policyReadStore) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	s.lists.Add(1)
	return s.Store.PolicyList(ctx)
}

func (s *policyReadStore) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	if f == (store.PolicyFilter{Limit: f.Limit}) {
		s.lists.Add(1)
	}
	return s.Store.PolicyPage(ctx, f)
}

// replicaStores opens, by name, two handles on one new store, as two
// replicas have: the in-memory and SQLite stores are shared by the two
// engines of one process; with CAPLEDGER_TEST_POSTGRES set, two
// PostgreSQL stores on one fresh schema.
func replicaStores() map[string]func(t *testing.T) (store.Store, store.Store) {
	out := map[string]func(t *testing.T) (store.Store, store.Store){}
	for name, open := range memstoreAndSQLite {
		out[name] = func(t *testing.T) (store.Store, store.Store) {
			st := open(t)
			return st, st
		}
	}
	if os.Getenv(replicatest.EnvDSN) == "" {
		return out
	}
	out["postgres"] = func(t *testing.T) (store.Store, store.Store) {
		dsn := replicatest.SchemaDSN(t)
		var stores [2]store.Store
		for i := range stores {
			st, err := postgres.Open(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			stores[i] = st
		}
		return stores[0], stores[1]
	}
	return out
}

// A drain pass reads every policy only when one changed since the last
// pass that read them (store.Store.PolicyChanges moved: a publish or a
// rollback), every drainFullReadEvery passes, and at a new term as worker
// leader; otherwise it reads one meta row, however many policies there
// are (a policy per tenant cost an idle server about 1.2 s of CPU a
// minute at 100,000 reading them all every pass).
func TestDrainPassReadsPoliciesOnlyWhenTheyChanged(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			st := &policyReadStore{Store: open(t)}
			clk := newClock()
			e := leadingEngine(t, st, Options{Clock: clk.Now})
			core := e.core
			publishTenants(t, core, clk.Now(), 0, 40)
			pass := func() int64 {
				t.Helper()
				clk.Advance(time.Minute)
				e.runEpochs(context.Background())
				return st.lists.Swap(0)
			}
			// The first pass: the drain pass's read, and the epoch pass's
			// (a new leader's first reads every generation's epoch length;
			// it reads the same pages, PolicyPage from the start).
			if n := pass(); n != 2 {
				t.Fatalf("the first pass read every policy %d times, want 2 (the drain pass's and the epoch pass's first)", n)
			}
			for i := range drainFullReadEvery - 1 {
				if n := pass(); n != 0 {
					t.Fatalf("idle pass %d read every policy %d times, want 0 (nothing changed)", i+2, n)
				}
			}
			if n := pass(); n != 1 {
				t.Fatalf("pass %d read every policy %d times, want 1 (every %d passes)", drainFullReadEvery+1, n, drainFullReadEvery)
			}
			if n := pass(); n != 0 {
				t.Fatalf("the pass after a full read read every policy %d times, want 0", n)
			}
			publishTenants(t, core, clk.Now(), 40, 41)
			if n := pass(); n != 1 {
				t.Fatalf("the pass after a publish read every policy %d times, want 1", n)
			}
			key := ledger.PolicyKey{Subject: "tenant-0040", Route: "chat.generate", Region: "eu"}
			commitAlone(t, core, clk.Now(), ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 41})
			if n := pass(); n != 1 {
				t.Fatalf("the pass after a rollback read every policy %d times, want 1", n)
			}
			if n := pass(); n != 0 {
				t.Fatalf("the next pass read every policy %d times, want 0", n)
			}
			// A new term as leader: the worker's tick starts it afresh.
			e.lead.mu.Lock()
			e.lead.term++
			e.lead.mu.Unlock()
			clk.Advance(time.Minute)
			e.tick(context.Background(), e.leaderWorker("epochs"))
			if n := st.lists.Swap(0); n != 1 {
				t.Fatalf("the first pass of a new term read every policy %d times, want 1", n)
			}
		})
	}
}

// A rollback committed on another replica (the leader's engine did not
// run it) is drained by the leader's next pass: the generation rolled
// back holds capacity, which moves to the generation active again, though
// the leader's last pass kept the policies as they were.
func TestDrainPassDrainsARollbackOnAnotherReplica(t *testing.T) {
	for name, open := range replicaStores() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			stLeader, stOther := open(t)
			clk := newClock()
			leader := leadingEngine(t, stLeader, Options{Clock: clk.Now})
			other := New(stOther, Options{DisableWorkers: true, Clock: clk.Now})
			t.Cleanup(func() { other.Close() })
			key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
			for _, burst := range []int64{2000, 1000} {
				p := ledger.Policy{Key: key, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
				mustDo(t, leader, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			mustDo(t, leader, reserveCmd("rl-1", 300))
			rolledBack := ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: 2}
			// Two passes: the second takes the policies the first read.
			for range 2 {
				clk.Advance(time.Minute)
				leader.runEpochs(ctx)
			}
			if a, err := stLeader.AccountGet(ctx, rolledBack); err != nil || a.Balances[0].Available != 700 {
				t.Fatalf("generation 2 before the rollback: %+v, %v; want 700 available", a.Balances[0], err)
			}
			mustDo(t, other, ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 2})
			clk.Advance(time.Minute)
			leader.runEpochs(ctx)
			a, err := stLeader.AccountGet(ctx, rolledBack)
			if err != nil || a.Balances[0].Available != 0 || a.Balances[0].Reserved != 300 {
				t.Fatalf("generation 2 after the rollback on another replica and one pass: %+v, %v; want its 700 available drained, 300 still reserved",
					a.Balances[0], err)
			}
			back, err := stLeader.AccountGet(ctx, ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: 1})
			if err != nil || back.Balances[0].Available != 700 {
				t.Fatalf("generation 1 after the drain: %+v, %v; want the 700 drained", back.Balances[0], err)
			}
		})
	}
}

// The drain pass keeps no active generation of a key whose only one is
// active: what decides for the subjects of the accounts it reads it reads
// with them (their keys' heads and their route's AnySubject head). A
// tenant on a route with a "*" policy that gets a policy of its own on
// another replica (a key that gains its first generation between passes)
// has its "*" account drained; when that policy is rolled back on the
// other replica, the "*" policy decides again and the rolled-back
// generation's capacity drains back to it.
func TestDrainPassFollowsAnotherReplicasPolicyOfATenantUnderAStarPolicy(t *testing.T) {
	for name, open := range replicaStores() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			stLeader, stOther := open(t)
			clk := newClock()
			leader := leadingEngine(t, stLeader, Options{Clock: clk.Now})
			other := New(stOther, Options{DisableWorkers: true, Clock: clk.Now})
			t.Cleanup(func() { other.Close() })
			publish := func(e *Engine, subject string, burst int64) uint64 {
				t.Helper()
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat.generate", Region: "eu"},
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
				return mustDo(t, e, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}).Generation
			}
			available := func(g uint64) int64 {
				t.Helper()
				a, err := stLeader.AccountGet(ctx, ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: g})
				if errors.Is(err, store.ErrNotFound) {
					return 0
				}
				if err != nil {
					t.Fatal(err)
				}
				return a.Balances[0].Available
			}
			pass := func() {
				clk.Advance(time.Minute)
				leader.runEpochs(ctx)
			}
			star := publish(leader, ledger.AnySubject, 2000)
			publishTenants(t, leader.core, clk.Now(), 0, 3) // keys with one generation each
			mustDo(t, leader, reserveCmd("star-1", 300))
			for range 2 {
				pass()
			}
			if got := available(star); got != 1700 {
				t.Fatalf("tenant-7 under the * policy: %d available, want 1700", got)
			}
			own := publish(other, "tenant-7", 5000)
			pass()
			if got := available(star); got != 0 {
				t.Fatalf("tenant-7's * account after its own policy was published on another replica and one pass: %d available, want 0 (drained)", got)
			}
			moved := available(own)
			if moved == 0 {
				t.Fatalf("tenant-7's own account after the drain: nothing available, want what fits of the 1700")
			}
			pass()
			mustDo(t, other, ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}, Generation: own})
			pass()
			if got := available(own); got != 0 {
				t.Fatalf("tenant-7's own account after its rollback on another replica and one pass: %d available, want 0 (drained back to the * policy)", got)
			}
			if got := available(star); got != moved {
				t.Fatalf("tenant-7's * account after the drain back: %d available, want %d", got, moved)
			}
			auditClean(t, leader)
		})
	}
}
