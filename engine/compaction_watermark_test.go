package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// snapshotCountingStore counts the audit snapshots taken.
type snapshotCountingStore struct {
	store.Store
	snapshots atomic.Int64
}

func (s *snapshotCountingStore) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	s.snapshots.Add(1)
	return s.Store.AuditSnapshot(ctx, cut, f)
}

// A store without a checkpoint whose journal holds nothing (policies
// published, no command yet) takes no audit snapshot at a compaction
// pass: the snapshot reads every policy, and with no checkpoint to
// compare with the cut was due at every pass. The first command's
// entry makes the next pass cut.
func TestCompactionWithNothingJournaledTakesNoSnapshot(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := &snapshotCountingStore{Store: open(t)}
			clk := newClock()
			e := leadingEngine(t, st, Options{Clock: clk.Now, Compaction: &CompactionOptions{Every: time.Hour}})
			publishTenants(t, e.core, clk.Now(), 0, 20)
			for range 3 {
				clk.Advance(time.Minute)
				if err := e.RunCompaction(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n := st.snapshots.Load(); n != 0 {
				t.Fatalf("3 compaction passes over only published policies took %d snapshots, want none", n)
			}
			reserveFor(t, e.core, clk.Now(), 3, "rl-1")
			clk.Advance(time.Minute)
			if err := e.RunCompaction(ctx); err != nil {
				t.Fatal(err)
			}
			if n := st.snapshots.Load(); n != 1 {
				t.Fatalf("the pass after the first command took %d snapshots, want 1", n)
			}
			if _, ok, err := st.CheckpointLast(ctx); err != nil || !ok {
				t.Fatalf("no checkpoint after the first command's pass: %v, %v", ok, err)
			}
		})
	}
}

// policyCountingStore counts the policies an audit snapshot holds
// (Snapshot.Policies) and the most it read at once (PoliciesOf).
type policyCountingStore struct {
	store.Store
	held, mostAtOnce, read atomic.Int64
}

func (s *policyCountingStore) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	return s.Store.AuditSnapshot(ctx, cut, func(snap *ledger.Snapshot, through int64) error {
		s.held.Store(max(s.held.Load(), int64(len(snap.Policies))))
		if of := snap.PoliciesOf; of != nil {
			snap.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
				found, err := of(generations)
				s.mostAtOnce.Store(max(s.mostAtOnce.Load(), int64(len(found))))
				s.read.Add(int64(len(found)))
				return found, err
			}
		}
		return f(snap, through)
	})
}

// A compaction cut over a policy per tenant, each with an account, holds
// no policy list: it reads the policies of a page of accounts at a time
// (at most 256 at once), each account's once, and cuts its checkpoint.
func TestCompactionCutReadsPoliciesAPageAtATime(t *testing.T) {
	const tenants = 600
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := &policyCountingStore{Store: open(t)}
			clk := newClock()
			e := leadingEngine(t, st, Options{Clock: clk.Now, Compaction: &CompactionOptions{Every: time.Hour}})
			publishTenants(t, e.core, clk.Now(), 0, tenants)
			for i := range tenants {
				reserveFor(t, e.core, clk.Now(), i, fmt.Sprintf("rl-%d", i))
			}
			clk.Advance(time.Minute)
			cp, found, err := e.CutCheckpoint(ctx, clk.Now())
			if err != nil || len(found) > 0 || cp == nil {
				t.Fatalf("cut: %v, %v, %v", cp, found, err)
			}
			if n := st.held.Load(); n != 0 {
				t.Errorf("the cut's snapshot held %d policies at once, want none (read a page at a time)", n)
			}
			if n := st.mostAtOnce.Load(); n == 0 || n > 256 {
				t.Errorf("the cut read %d policies at once, want 1 to 256", n)
			}
			if n := st.read.Load(); n != tenants {
				t.Errorf("the cut read %d policies, want each account's once: %d", n, tenants)
			}
		})
	}
}
