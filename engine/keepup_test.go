package engine

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// dueSpan reads the rate at which rows came due from their finish times,
// rows of one batch sharing one: 10 batches 10 ms apart of 5 rows each
// finished 500 a second, in whatever order the rows arrive.
func TestDueSpan(t *testing.T) {
	var times []time.Time
	for b := range 10 {
		for range 5 {
			times = append(times, t0.Add(time.Duration(b)*10*time.Millisecond))
		}
	}
	for name, order := range map[string]func(int) int{"earliest first": func(i int) int { return i }, "latest first": func(i int) int { return len(times) - 1 - i }} {
		var s dueSpan
		for i := range times {
			s.add(times[order(i)])
		}
		if got := s.perSecond(); math.Abs(got-500) > 0.01 {
			t.Errorf("%s: %.2f a second, want 500", name, got)
		}
	}
	var one dueSpan
	for range 32 {
		one.add(t0)
	}
	if got := one.perSecond(); got != 0 {
		t.Errorf("rows of one batch: %.2f a second, want 0 (unknown)", got)
	}
}

// With several replicas on one store, the one running retention keeps up
// with what every replica finishes, not only with what it commits: here
// replica a finishes 1,000 reservations a second and replica b, which
// commits none, runs retention: each of b's pages keeps up with 1,000 a
// second (before, with none: b's own commits).
// otherReplicaRetention has replica a finish 200 reservations, 1,000 a
// second, advances the clock by after, and returns the finish rate each
// of replica b's retention pages paced by.
func otherReplicaRetention(t *testing.T, after time.Duration) []float64 {
	t.Helper()
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	a := New(st, Options{Clock: clk.Now, DisableWorkers: true})
	defer a.Close()
	b := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, RetentionBatch: 32, RetentionPause: time.Microsecond})
	defer b.Close()
	publish(t, a, 1_000_000, time.Minute, 0)
	const n = 200
	for i := range n {
		id := fmt.Sprintf("r%04d", i)
		if res, err := a.DoBatch(ctx, []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindRelease, ReservationID: id}}); err != nil || res[1].Err != nil {
			t.Fatalf("%+v %v", res, err)
		}
		clk.Advance(time.Millisecond)
	}
	clk.Advance(after)
	var rates []float64
	b.retentionPaced = func(r float64) { rates = append(rates, r) }
	if err := b.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := b.RetentionStats(); s.Retired != n {
		t.Fatalf("retired %d, want %d", s.Retired, n)
	}
	if len(rates) < n/32 {
		t.Fatalf("%d pages paced, want %d or more", len(rates), n/32)
	}
	return rates
}

func TestRetentionKeepsUpWithOtherReplicas(t *testing.T) {
	for i, r := range otherReplicaRetention(t, time.Hour+100*time.Millisecond) {
		if math.Abs(r-1_000) > 1 {
			t.Errorf("page %d kept up with %.1f finishing a second, want 1000 (replica a's)", i, r)
		}
	}
}

// Rows that came due long ago are a backlog: how fast they were once
// finished is not how fast rows finish now, and pacing by it drained a
// backlog written at 25,000 a second at that rate beside gateways
// (reserves 0.90x their rate, 1.26x their p99). Here the same rows, due
// for an hour, give b's pages no finish rate: the backlog goes at the
// share.
func TestRetentionBacklogDoesNotPaceByItsPastRate(t *testing.T) {
	for i, r := range otherReplicaRetention(t, 2*time.Hour) {
		if r != 0 {
			t.Errorf("page %d of a backlog due for an hour paced by %.1f finishing a second, want 0", i, r)
		}
	}
}

// Journal deletion keeps up with the rate at which every replica writes
// journal rows, from the positions between the last checkpoint and the
// audit's read: replica b, which writes none, reads replica a's rate.
func TestJournalRateIsEveryReplicas(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	a := New(st, Options{Clock: clk.Now, DisableWorkers: true})
	defer a.Close()
	b := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour}})
	defer b.Close()
	publish(t, a, 1_000_000, time.Minute, 0)
	lifecycle(t, a, "x", 10)
	cp, found, err := b.CutCheckpoint(ctx, clk.Now())
	if err != nil || len(found) > 0 || cp == nil {
		t.Fatalf("first cut: %v %v %v", cp, found, err)
	}
	lifecycle(t, a, "y", 50)
	clk.Advance(10 * time.Second)
	cp2, found, err := b.CutCheckpoint(ctx, clk.Now())
	if err != nil || len(found) > 0 || cp2 == nil {
		t.Fatalf("second cut: %v %v %v", cp2, found, err)
	}
	want := float64(cp2.Through-cp.Through) / 10
	if got := math.Float64frombits(b.compaction.written.Load()); want <= 0 || math.Abs(got-want) > 1e-9 {
		t.Fatalf("journal written at %.2f rows a second, want %.2f", got, want)
	}
}

// Journal deletion removes at least journalKeepUp times the rate at which
// journal rows are written however long a step takes (or as fast as
// steps go), whatever the deferrable pacer's share and its 1 s cap on a
// pause allow; beyond that, the share's pause.
func TestJournalDeletionKeepsUpWhateverAStepTakes(t *testing.T) {
	const rows = defaultCompactionBatch
	for _, took := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second} {
		for _, rate := range []float64{0, 50, 1_000, 5_000} {
			for _, share := range []float64{0.05 / auditShareDivisor, 0.2 / auditShareDivisor, 0.5} {
				paced := min(pauseFor(took, share), auditMaxPause)
				pause := keepUpPause(paced, took, rows, journalKeepUp, rate)
				removal := rows / (took + pause).Seconds()
				want := min(journalKeepUp*rate, rows/took.Seconds())
				if removal < want*0.999 || pause > paced {
					t.Errorf("steps of %d rows taking %s, %.0f written a second, share %.3f: pause %s (the share's %s) removes %.0f a second, want at least %.0f",
						rows, took, rate, share, pause, paced, removal, want)
				}
			}
		}
	}
}
