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
// rows of one batch sharing one: 10 batches 20 ms apart of 5 rows each
// finished 250 a second, in whatever order the rows arrive. It reads no
// rate (0, unknown) from rows that span less than minRateSpan or count
// fewer than minDueRows after the earliest: two batches committed 10 µs
// apart are not 3.2 million finishing a second.
func TestDueSpan(t *testing.T) {
	var times []time.Time
	for b := range 10 {
		for range 5 {
			times = append(times, t0.Add(time.Duration(b)*20*time.Millisecond))
		}
	}
	for name, order := range map[string]func(int) int{"earliest first": func(i int) int { return i }, "latest first": func(i int) int { return len(times) - 1 - i }} {
		var s dueSpan
		for i := range times {
			s.add(times[order(i)])
		}
		if got := s.perSecond(); math.Abs(got-250) > 0.01 {
			t.Errorf("%s: %.2f a second, want 250", name, got)
		}
	}
	spanOf := func(batches, rows int, apart time.Duration) float64 {
		var s dueSpan
		for b := range batches {
			for range rows {
				s.add(t0.Add(time.Duration(b) * apart))
			}
		}
		return s.perSecond()
	}
	for _, c := range []struct {
		name          string
		batches, rows int
		apart         time.Duration
	}{
		{"rows of one batch", 1, 32, 0},
		{"two batches 10 µs apart", 2, 32, 10 * time.Microsecond},
		{"batches spanning just under minRateSpan", 2, 32, minRateSpan - time.Millisecond},
		{"too few rows over a long span", minDueRows, 1, time.Second},
	} {
		if got := spanOf(c.batches, c.rows, c.apart); got != 0 {
			t.Errorf("%s: %.2f a second, want 0 (unknown)", c.name, got)
		}
	}
	if got := spanOf(minDueRows+1, 1, minRateSpan/time.Duration(minDueRows)); math.Abs(got-float64(minDueRows)/minRateSpan.Seconds()) > 0.01 {
		t.Errorf("minDueRows rows over minRateSpan: %.2f a second, want %.2f", got, float64(minDueRows)/minRateSpan.Seconds())
	}
}

// finishEvery has e finish n reservations named prefix0000..., one every
// finishEvery on clk: 250 a second.
const finishEvery = 4 * time.Millisecond

func finishSome(t *testing.T, e *Engine, clk *clock, prefix string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s%04d", prefix, i)
		if res, err := e.DoBatch(context.Background(), []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindRelease, ReservationID: id}}); err != nil || res[1].Err != nil {
			t.Fatalf("%+v %v", res, err)
		}
		clk.Advance(finishEvery)
	}
}

// retentionReplicas returns replica a, which finishes reservations, and
// replica b, which runs retention (a window of an hour) and commits none,
// on one store, with b's pages' pacing recorded in *paced.
func retentionReplicas(t *testing.T) (a, b *Engine, clk *clock, paced *[]pagePacing) {
	t.Helper()
	st := memstore.New()
	clk = newClock()
	a = New(st, Options{Clock: clk.Now, DisableWorkers: true})
	t.Cleanup(func() { a.Close() })
	b = New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, RetentionBatch: 32, RetentionPause: time.Microsecond})
	t.Cleanup(func() { b.Close() })
	publish(t, a, 1_000_000, time.Minute, 0)
	paced = new([]pagePacing)
	b.retentionPaced = func(p pagePacing) { *paced = append(*paced, p) }
	return a, b, clk, paced
}

// This replica's finish rate is measured over the last one to two
// retention intervals, not since a pass began: a pass in a backlog runs
// for as long as the backlog lasts, and measured since it began, beside a
// load that slowed from about 800 to 330 finishing a second, it removed
// 546 a second. Here 800 a second for 10 s, then 330 a second,
// read every 100 ms with intervals of 2 s: 800, then 330 from two
// intervals after the change.
func TestFinishWindow(t *testing.T) {
	const interval = 2 * time.Second
	w := finishWindow{from: retentionRate{at: t0}, mark: retentionRate{at: t0}}
	var count uint64
	for at := 100 * time.Millisecond; at <= 20*time.Second; at += 100 * time.Millisecond {
		want := 800.0
		if at > 10*time.Second {
			want = 330
		}
		count += uint64(want / 10)
		got := w.perSecond(t0.Add(at), count, interval)
		if (at <= 10*time.Second || at >= 10*time.Second+2*interval) && math.Abs(got-want) > 0.01 {
			t.Errorf("at %s: %.2f finishing a second, want %.0f", at, got, want)
		}
	}
}

// With several replicas on one store, the one running retention keeps up
// with what every replica finishes, not only with what it commits: here
// replica a finishes 250 reservations a second and replica b, which
// commits none, runs retention: each of b's pages keeps up with 250 a
// second (before, with none: b's own commits).
// otherReplicaRetention has replica a finish 200 reservations, 250 a
// second, advances the clock by after, and returns how each of replica
// b's retention pages was paced.
func otherReplicaRetention(t *testing.T, after time.Duration) []pagePacing {
	t.Helper()
	a, b, clk, paced := retentionReplicas(t)
	const n = 200
	finishSome(t, a, clk, "r", n)
	clk.Advance(after)
	if err := b.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := b.RetentionStats(); s.Retired != n {
		t.Fatalf("retired %d, want %d", s.Retired, n)
	}
	if len(*paced) < n/32 {
		t.Fatalf("%d pages paced, want %d or more", len(*paced), n/32)
	}
	return *paced
}

// The rows are 4 ms apart so that a page of 32 spans minRateSpan (at
// 1,000 a second, before minRateSpan, the first page read a rate from
// 31 ms).
func TestRetentionKeepsUpWithOtherReplicas(t *testing.T) {
	for i, p := range otherReplicaRetention(t, time.Hour+100*time.Millisecond) {
		if math.Abs(p.finishRate-250) > 1 || p.backlog {
			t.Errorf("page %d kept up with %.1f finishing a second (backlog %v), want 250 (replica a's), not a backlog", i, p.finishRate, p.backlog)
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
	for i, p := range otherReplicaRetention(t, 2*time.Hour) {
		if p.finishRate != 0 || !p.backlog {
			t.Errorf("page %d of a backlog due for an hour paced by %.1f finishing a second (backlog %v), want 0, a backlog", i, p.finishRate, p.backlog)
		}
	}
}

// A pass in a backlog while reservations finish now paces its pages as a
// backlog (retentionPause: once the finish rate, the rest at the share),
// not at the keep-up rate of twice the finish rate, which drained the
// seed's 300,000 old rows at 1,200-2,000 a second beside a lifecycle load
// finishing 600-900 (reserves 0.87x their rate, 1.22x their p99); the pages
// of recent rows after it keep up at twice. Here b's first pass measures
// 250 finishing a second; then 200 rows due for two hours precede 200
// due now: b's second pass paces the 7 pages holding old rows as a
// backlog and the rest as keeping up, all at 250 a second.
func TestRetentionBacklogKeepsUpOnceRecentRowsTwice(t *testing.T) {
	a, b, clk, paced := retentionReplicas(t)
	ctx := context.Background()
	finishSome(t, a, clk, "first", 100)
	clk.Advance(time.Hour + 100*time.Millisecond)
	if err := b.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	finishSome(t, a, clk, "old", 200)
	clk.Advance(3 * time.Hour)
	finishSome(t, a, clk, "new", 200)
	clk.Advance(time.Hour + 100*time.Millisecond)
	*paced = nil
	if err := b.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := b.RetentionStats(); s.Retired != 500 {
		t.Fatalf("retired %d, want 500", s.Retired)
	}
	const backlogPages = (200 + 31) / 32
	if len(*paced) < backlogPages+200/32 {
		t.Fatalf("%d pages paced, want %d or more", len(*paced), backlogPages+200/32)
	}
	for i, p := range *paced {
		if want := i < backlogPages; p.backlog != want || math.Abs(p.finishRate-250) > 1 {
			t.Errorf("page %d paced as backlog %v at %.1f finishing a second, want backlog %v at 250", i, p.backlog, p.finishRate, want)
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

// A replica that holds the lease while another replica's cut lands paces
// the deletion of the journal that cut made deletable by the rate it was
// written at, read at its compaction pass from the two checkpoints'
// headers: before, only a cut of its own set the rate, and here b would
// have deleted a's journal at the deferrable share alone. The first
// checkpoint b sees gives no rate.
func TestJournalRateFollowsOtherReplicasCuts(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	clk := newClock()
	a := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour}})
	defer a.Close()
	b := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour}})
	defer b.Close()
	publish(t, a, 1_000_000, time.Minute, 0)
	lifecycle(t, a, "x", 10)
	cp, found, err := a.CutCheckpoint(ctx, clk.Now())
	if err != nil || len(found) > 0 || cp == nil {
		t.Fatalf("first cut: %v %v %v", cp, found, err)
	}
	b.runCompaction(ctx)
	if s := b.CompactionStats(); s.Checkpoints != 0 || s.LastSeq != cp.Seq {
		t.Fatalf("b's first pass: %+v, want no cut of its own and checkpoint %d seen", s, cp.Seq)
	}
	if got := math.Float64frombits(b.compaction.written.Load()); got != 0 {
		t.Fatalf("journal written at %.2f rows a second from one checkpoint, want 0 (unknown)", got)
	}
	lifecycle(t, a, "y", 50)
	clk.Advance(10 * time.Second)
	cp2, found, err := a.CutCheckpoint(ctx, clk.Now())
	if err != nil || len(found) > 0 || cp2 == nil {
		t.Fatalf("second cut: %v %v %v", cp2, found, err)
	}
	b.runCompaction(ctx)
	want := float64(cp2.Through-cp.Through) / 10
	if got := math.Float64frombits(b.compaction.written.Load()); want <= 0 || math.Abs(got-want) > 1e-9 {
		t.Fatalf("b paced a's journal by %.2f rows written a second, want %.2f", got, want)
	}
	if s := b.CompactionStats(); s.Checkpoints != 0 || s.Deleted == 0 {
		t.Fatalf("b's second pass: %+v, want no cut of its own and a's journal deleted", s)
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
			for _, share := range []float64{0.05 / deferrableShareDivisor, 0.2 / deferrableShareDivisor, 0.5} {
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
