package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// A pass under way shows in the stats before it ends (RunningSince), so
// that /statusz tells an operator the worker is behind while the long
// pass that proves it still runs; the last finished pass is reported by
// its start and length, and the stats say whether retention is on.
func TestRetentionStatsShowAPassUnderWay(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	// One row a page and an hour's pause after it: the pass stays under
	// way after its first removal until it is cancelled.
	e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
		RetentionBatch: 1, RetentionPause: time.Hour})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	for i := range 3 {
		id := fmt.Sprintf("r%d", i)
		if res, err := e.Do(ctx, reserveCmd(id, 10)); err != nil || res.Err != nil {
			t.Fatalf("reserve %s: %+v %v", id, res, err)
		}
		if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: id}); err != nil || res.Err != nil {
			t.Fatalf("release %s: %+v %v", id, res, err)
		}
	}
	clk.Advance(2 * time.Hour)
	if s := e.RetentionStats(); !s.On || !s.RunningSince.IsZero() || s.Passes != 0 {
		t.Fatalf("before any pass: %+v, want on, none running", s)
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- e.RunRetention(pctx) }()
	s := e.RetentionStats()
	for giveUp := time.Now().Add(30 * time.Second); s.Retired == 0; s = e.RetentionStats() {
		if time.Now().After(giveUp) {
			cancel()
			t.Fatalf("the pass removed nothing: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	if s.RunningSince.IsZero() || s.RunningSince.Before(started) || s.Passes != 0 {
		t.Fatalf("while the pass pauses after its first page: %+v, want RunningSince set to its start and no pass finished", s)
	}
	seen := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s = e.RetentionStats()
	if !s.RunningSince.IsZero() || s.Passes != 1 || s.LastPass <= 0 {
		t.Fatalf("after the pass: %+v, want none running and one pass", s)
	}
	if !s.LastPassAt.Before(seen) || s.LastPassAt.Before(started) {
		t.Fatalf("LastPassAt %s, want the pass's start (between %s and %s), not its end",
			s.LastPassAt.Format(time.RFC3339Nano), started.Format(time.RFC3339Nano), seen.Format(time.RFC3339Nano))
	}

	off := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true})
	defer off.Close()
	if off.RetentionStats().On || off.CompactionStats().On {
		t.Fatalf("retention and compaction off, stats say on: %+v %+v", off.RetentionStats(), off.CompactionStats())
	}
	on := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour}})
	defer on.Close()
	if !on.CompactionStats().On {
		t.Fatal("compaction on, stats say off")
	}
}
