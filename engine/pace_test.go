package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// A maintenance step is followed by a pause that leaves it
// MaintenanceShare of the time when gateways' commands were committed
// since the step before (an audit a tenth of it, giving space back a quarter), its idle share when
// none were, and the maintenance workers' own commands do not count as
// admission.
func TestPacerYieldsToAdmission(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, MaintenanceShare: 0.25,
		Retention: time.Hour, RetentionBatch: 10})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	p := e.newPacer(0.5)
	const step = 10 * time.Millisecond
	if got := p.pause(step, 0); got != step {
		t.Fatalf("idle: pause %s after a step of %s, want %s (half of the time)", got, step, step)
	}
	if got := p.pause(step, 40*time.Millisecond); got != 40*time.Millisecond {
		t.Fatalf("idle with a floor of 40ms: pause %s", got)
	}
	if res, err := e.Do(ctx, reserveCmd("gw-1", 10)); err != nil || res.Err != nil {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	if got := p.pause(step, 0); got != 3*step {
		t.Fatalf("after an admission: pause %s after a step of %s, want %s (a quarter of the time)", got, step, 3*step)
	}
	if got := p.pause(step, 0); got != step {
		t.Fatalf("no admission since: pause %s, want %s", got, step)
	}
	// A retention pass's own pages are not admission.
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: "gw-1"}); err != nil || res.Err != nil {
		t.Fatalf("release: %+v %v", res, err)
	}
	p.pause(step, 0)
	clk.Advance(2 * time.Hour)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if e.RetentionStats().Retired != 1 {
		t.Fatalf("retention stats %+v, want one retired", e.RetentionStats())
	}
	if got := p.pause(step, 0); got != step {
		t.Fatalf("after a retention page only: pause %s, want the idle %s", got, step)
	}
	// An audit pauses only while admission is busy, and then leaves
	// itself a tenth of the share.
	audit := e.newAuditPacer(1)
	if _, err := e.Do(ctx, reserveCmd("gw-2", 10)); err != nil {
		t.Fatal(err)
	}
	if got := audit.pause(step, 0); got != 39*step {
		t.Fatalf("audit after an admission: pause %s, want %s (a fortieth of the time)", got, 39*step)
	}
	if got := audit.pause(step, 0); got != 0 {
		t.Fatalf("idle share 1 when idle: pause %s, want none", got)
	}
	// A step so long (wall time, on a loaded machine) that its pause would
	// outlast a client's wait for the next progress message pauses
	// auditMaxPause.
	if _, err := e.Do(ctx, reserveCmd("gw-2b", 10)); err != nil {
		t.Fatal(err)
	}
	if got := audit.pause(time.Second, 0); got != auditMaxPause {
		t.Fatalf("audit after a step of 1s: pause %s, want %s", got, auditMaxPause)
	}
	// Giving space back and deleting a summarised journal take a quarter
	// of the share while gateways are admitted, and their idle share
	// otherwise.
	deferrable := e.newDeferrablePacer(0.5)
	if _, err := e.Do(ctx, reserveCmd("gw-4", 10)); err != nil {
		t.Fatal(err)
	}
	if got := deferrable.pause(step, 0); got != 15*step {
		t.Fatalf("reclaim or journal deletion after an admission: pause %s, want %s (a sixteenth of the time)", got, 15*step)
	}
	if got := deferrable.pause(step, 0); got != step {
		t.Fatalf("reclaim or journal deletion when idle: pause %s, want %s", got, step)
	}
}

// reclaimingStore is a memstore that gives space back like SQLite's
// ReclaimStep: free pages beyond a reserve, up to the pages asked for.
type reclaimingStore struct {
	*memstore.Store
	free, reserve int
	steps         []int // the pages each step was asked for
}

func (s *reclaimingStore) ReclaimStep(_ context.Context, pages int) (bool, error) {
	s.steps = append(s.steps, pages)
	s.free -= min(pages, s.free-s.reserve)
	return s.free > s.reserve, nil
}

// After a pass that removed rows, the retention worker gives space back a
// bounded step at a time until the store keeps only its reserve; after a
// pass that removed nothing, it does not.
func TestRetentionGivesSpaceBackInSteps(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st := &reclaimingStore{Store: memstore.New(), free: 3*reclaimStepPages + 10, reserve: 10}
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, RetentionPause: time.Millisecond})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.steps) != 0 {
		t.Fatalf("a pass that removed nothing reclaimed: %v", st.steps)
	}
	if res, err := e.Do(ctx, reserveCmd("done", 10)); err != nil || res.Err != nil {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: "done"}); err != nil || res.Err != nil {
		t.Fatalf("release: %+v %v", res, err)
	}
	clk.Advance(2 * time.Hour)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if e.RetentionStats().Retired != 1 || len(st.steps) != 3 || st.free != st.reserve {
		t.Fatalf("after removing a row: %+v, steps %v, %d pages free (reserve %d)", e.RetentionStats(), st.steps, st.free, st.reserve)
	}
	for _, pages := range st.steps {
		if pages != reclaimStepPages {
			t.Fatalf("a step of %d pages, want %d", pages, reclaimStepPages)
		}
	}
}

// The expiry worker's chunks are not admission to a pacer sampled while
// they commit: a mass expiry beside a checkpoint cut made the cut's
// audit yield as if gateways were busy (a twentieth of the time instead
// of a half), so it held its read, its replays and the WAL for many
// times as long (docs/PERFORMANCE.md, "RSS and the checkpoint cut").
func TestExpiryIsNotAdmission(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	var (
		p     *pacer
		busy  int
		ticks int
	)
	e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, MaintenanceShare: 0.2,
		OnBatch: func(BatchInfo) {
			if p != nil {
				ticks++
				if _, b := p.share(); b {
					busy++
				}
			}
		}})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	const holds = 3*workerChunk + 10
	cmds := make([]ledger.Command, holds)
	for i := range cmds {
		cmds[i] = reserveCmd(fmt.Sprintf("gw-%d", i), 1)
	}
	if _, err := e.DoBatch(ctx, cmds); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	p = e.newAuditPacer(0.5)
	e.runDue(ctx)
	if ticks < 2*holds/workerChunk {
		t.Fatalf("%d batches seen; want the expiry's chunks", ticks)
	}
	if busy > 0 {
		t.Fatalf("the expiry's chunks read as admission at %d of %d batches", busy, ticks)
	}
	if _, b := p.share(); b {
		t.Fatal("the expiry's pass read as admission")
	}
	// Whereas a gateway's command is admission.
	if _, err := e.Do(ctx, reserveCmd("gw-late", 1)); err != nil {
		t.Fatal(err)
	}
	if _, b := p.share(); !b {
		t.Fatal("a reserve after the expiry did not read as admission")
	}
}

// copyingStore is a memstore whose full audit first copies inside its
// read, as SQLite's audit copy does: the first call of ReservationStream takes
// steps of copyStep while gateways' commands are committed, offering the
// caller a pause after each (store.Pause), then ends the read and yields
// the reservations.
type copyingStore struct {
	*memstore.Store
	steps int
	// admit commits a gateway's command.
	admit    func()
	readOpen bool
	// copyTime is the copy's own time: its steps, without the pauses
	// the caller took in store.Pause.
	copyTime time.Duration
}

func (s *copyingStore) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	return s.Store.AuditSnapshot(ctx, cut, func(snap *ledger.Snapshot, through int64) error {
		reservations := snap.ReservationStream
		snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
			s.readOpen = true
			for i := range s.steps {
				start := time.Now()
				s.admit()
				time.Sleep(copyStep)
				s.copyTime += time.Since(start)
				store.Pause(ctx, int64(i+1))
			}
			s.readOpen = false
			return reservations(yield)
		}
		return f(snap, through)
	})
}

// TestAuditCopyPausesAfterItsRead: a store's copy inside an audit's read
// (SQLite's audit copy, whose open read keeps the WAL from being restarted)
// pauses while the read is open at most as long as it worked (it copies
// at least at half speed), however busy admission is; the rest of the
// pauses an audit's share owes for it are taken once the read has ended,
// before the audit reads the copy.
func TestAuditCopyPausesAfterItsRead(t *testing.T) {
	ctx := context.Background()
	st := &copyingStore{Store: memstore.New(), steps: 3}
	e := New(st, Options{Clock: newClock().Now, DisableWorkers: true, MaintenanceShare: 0.4})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	for i := range 10 {
		if res, err := e.Do(ctx, reserveCmd(fmt.Sprintf("r%d", i), 1)); err != nil || res.Err != nil {
			t.Fatalf("reserve: %+v %v", res, err)
		}
	}
	admitted := 0
	st.admit = func() {
		admitted++
		if res, err := e.Do(ctx, reserveCmd(fmt.Sprintf("during-%d", admitted), 1)); err != nil || res.Err != nil {
			t.Fatalf("reserve during the copy: %+v %v", res, err)
		}
	}
	var duringRead, afterRead time.Duration
	e.pacerMade = func(p *pacer) {
		p.sleep = func(ctx context.Context, d time.Duration) bool {
			if st.readOpen {
				duringRead += d
			} else {
				afterRead += d
			}
			return ctx.Err() == nil
		}
	}
	var read int64
	found, err := e.AuditWith(ctx, AuditOptions{Progress: func(p AuditProgress) { read = p.Rows }})
	if err != nil || len(found) > 0 {
		t.Fatalf("audit: %v %v", found, err)
	}
	if read < 10 {
		t.Fatalf("the audit read %d rows, want the 10 reservations at least", read)
	}
	// The engine times a step from the end of the last pause to the next,
	// the store its own work: they differ by the calls in between.
	// Half of it again covers those calls on a loaded machine; a pause of
	// twice the work (or the whole share's) inside the read still fails.
	if slack := st.copyTime / 2; duringRead <= 0 || duringRead > st.copyTime+slack {
		t.Errorf("the copy paused %s while its read was open, want more than 0 and at most its own %s", duringRead, st.copyTime)
	}
	// Each step of at least copyStep owes at least what a tenth of the
	// share leaves it (0.04 of the time: 24 times the step), not capped
	// at auditMaxPause as a reading step's pause is (the debt is spread
	// over the reading anyway); what the read did not take, the audit
	// takes after it.
	if want := time.Duration(st.steps) * pauseFor(copyStep, 0.4/auditShareDivisor); duringRead+afterRead < want || afterRead <= 0 {
		t.Errorf("the audit paused %s during and %s after the read, want at least %s in all for %d steps of the copy beside admission, the rest after", duringRead, afterRead, want, st.steps)
	}
}

// spinningStore's copy inside the audit's read is CPU alone: pages of
// busy work, each followed by store.Pause, as SQLite's audit copy calls it
// after every step of its pages.
type spinningStore struct {
	*memstore.Store
	pages, spins int
	sink         uint64
}

func (s *spinningStore) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	return s.Store.AuditSnapshot(ctx, cut, func(snap *ledger.Snapshot, through int64) error {
		for page := range s.pages {
			for i := range s.spins {
				s.sink = s.sink*31 + uint64(i)
			}
			store.Pause(ctx, int64(page+1))
		}
		return f(snap, through)
	})
}

// TestAuditCopyYieldsBetweenPages: between its pauses (one per copyStep
// of work), the copy inside an audit's read gives the processor up after
// every page, so a gateway's request that becomes runnable meanwhile
// waits for a page, not for Go's preemption of a goroutine that runs on
// (10 ms, beyond a reserve's p99). With one P, a goroutine that asks for
// the processor in a loop gets it about once per page; without the
// yield, only when the copy is preempted or pauses.
func TestAuditCopyYieldsBetweenPages(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ctx := context.Background()
	// 200 pages of some 0.2 ms each: 40 ms of copy, under one copyStep
	// in all, so no pause of the pacer's lets the other goroutine in.
	st := &spinningStore{Store: memstore.New(), pages: 200, spins: 200_000}
	e := New(st, Options{Clock: newClock().Now, DisableWorkers: true})
	defer e.Close()
	var turns atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			turns.Add(1)
			runtime.Gosched()
		}
	}()
	runtime.Gosched() // let it start
	before := turns.Load()
	if _, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: true}); err != nil {
		t.Fatal(err)
	}
	during := turns.Load() - before
	close(stop)
	<-done
	if during < int64(st.pages)/2 {
		t.Errorf("another goroutine ran %d times during a copy of %d pages, want at least once every other page", during, st.pages)
	}
}

// TestOwedPausesSpreadOverTheSteps: what a copy owes (pacer.owe) is not
// taken before its read has ended (repaying), then in parts of at most
// twice each step's own pause, so the steps after it go on at a third of
// their speed instead of standing still for the whole debt; repay takes
// what is left.
func TestOwedPausesSpreadOverTheSteps(t *testing.T) {
	ctx := context.Background()
	e := New(memstore.New(), Options{Clock: newClock().Now, DisableWorkers: true})
	defer e.Close()
	var slept []time.Duration
	p := e.makePacer(0.5, 0.5) // a pause as long as the step, busy or idle
	p.sleep = func(ctx context.Context, d time.Duration) bool { slept = append(slept, d); return true }
	const step = 10 * time.Millisecond
	p.owed = 100 * time.Millisecond
	p.wait(ctx, step, 0)
	if slept[0] != step || p.owed != 100*time.Millisecond {
		t.Fatalf("before repaying: paused %s and owes %s, want %s and all of 100ms", slept[0], p.owed, step)
	}
	p.repaying = true
	slept = nil
	for range 3 {
		p.wait(ctx, step, 0)
	}
	for i, d := range slept {
		if d != 3*step {
			t.Errorf("step %d repaying: paused %s, want its own %s and twice that of the debt", i, d, 3*step)
		}
	}
	if p.owed != 40*time.Millisecond {
		t.Errorf("after three steps owes %s, want 40ms", p.owed)
	}
	p.wait(ctx, 2*time.Millisecond, 0) // takes 4 ms of it
	slept = nil
	p.repay(ctx)
	if len(slept) != 1 || slept[0] != 36*time.Millisecond || p.owed != 0 {
		t.Errorf("repay paused %v and left %s, want one pause of 36ms and nothing left", slept, p.owed)
	}
}
