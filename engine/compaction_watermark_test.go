package engine

import (
	"context"
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
