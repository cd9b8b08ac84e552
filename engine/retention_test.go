package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// A retention pass removes, in pages, exactly the finished reservations
// past the window, never live ones; the audit stays clean; a retry of a
// removed reserve is answered from its tombstone without a new hold; past
// the horizon the tombstones go too.
func TestRetentionPass(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st := memstore.New()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
		TombstoneRetention: 10 * time.Hour, RetentionBatch: 7, RetentionPause: time.Millisecond})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	const finished = 40
	for i := range finished + 3 {
		id := fmt.Sprintf("r%02d", i)
		if res, err := e.Do(ctx, reserveCmd(id, 10)); err != nil || res.Err != nil {
			t.Fatalf("reserve %s: %+v %v", id, res, err)
		}
		if i < finished {
			if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: id}); err != nil || res.Err != nil {
				t.Fatalf("release %s: %+v %v", id, res, err)
			}
		}
	}
	// Not yet past the window: nothing goes.
	clk.Advance(59 * time.Minute)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.RetentionStats(); s.Retired != 0 {
		t.Fatalf("retired %d inside the window", s.Retired)
	}
	clk.Advance(2 * time.Minute)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.RetentionStats(); s.Retired != finished || s.Failed != 0 {
		t.Fatalf("stats after a pass: %+v", s)
	}
	for i := range finished + 3 {
		id := fmt.Sprintf("r%02d", i)
		_, err := st.ReservationGet(ctx, id)
		if live := i >= finished; live != (err == nil) {
			t.Fatalf("%s: live %v, get %v", id, live, err)
		}
		r, err := e.ReservationOrTombstone(ctx, id)
		if err != nil || r.Retired == live(i, finished) {
			t.Fatalf("%s: %+v %v", id, r, err)
		}
	}
	auditClean(t, e)
	accounts, _ := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	res, err := e.Do(ctx, reserveCmd("r00", 10))
	if err != nil || res.Err != nil || !res.Replayed || !res.Reservation.Retired || res.Reservation.State != ledger.StateReleased {
		t.Fatalf("retried reserve after retention: %+v %v", res, err)
	}
	after, _ := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if after[0].Balances[0].Reserved != accounts[0].Balances[0].Reserved {
		t.Fatalf("the replay reserved again: %d -> %d", accounts[0].Balances[0].Reserved, after[0].Balances[0].Reserved)
	}
	clk.Advance(10 * time.Hour)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.RetentionStats(); s.Forgotten != finished {
		t.Fatalf("forgotten %d, want %d", s.Forgotten, finished)
	}
	if _, err := e.Tombstone(ctx, "r00"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("tombstone past the horizon: %v", err)
	}
	auditClean(t, e)
}

func live(i, finished int) bool { return i >= finished }

// A pass over reservations that finished before the tombstone horizon
// removes each with one retire and writes no tombstone for it to forget
// again; the audit stays clean.
func TestRetentionPastTheHorizonWritesNoTombstones(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
		TombstoneRetention: 2 * time.Hour, RetentionBatch: 4, RetentionPause: time.Millisecond})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	const n = 10
	for i := range n {
		id := fmt.Sprintf("old%02d", i)
		if res, err := e.DoBatch(ctx, []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindRelease, ReservationID: id}}); err != nil || res[1].Err != nil {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	clk.Advance(3 * time.Hour)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if s := e.RetentionStats(); s.Retired != n || s.Forgotten != 0 || s.Failed != 0 {
		t.Fatalf("stats %+v, want %d retired and none forgotten", s, n)
	}
	if _, err := e.Tombstone(ctx, "old00"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("tombstone of a reservation retired past the horizon: %v", err)
	}
	auditClean(t, e)
}

func TestRetentionOff(t *testing.T) {
	e := New(memstore.New(), Options{DisableWorkers: true})
	defer e.Close()
	if err := e.RunRetention(context.Background()); err == nil {
		t.Fatal("a pass without a window ran")
	}
	if _, err := e.core.RetentionDue(context.Background(), t0, 0, 0, 10); err == nil {
		t.Fatal("RetentionDue without a window answered")
	}
}

// TestRetentionPause: while gateways are admitted, rows beyond keeping
// up are removed at an eighth of the maintenance share. Keeping up with
// what comes due now, reservations that finish so fast that
// retentionKeepUp times their rate needs more are removed at that rate
// whatever the share allows; in a backlog, at once their rate on top of
// what the share removes. Idle, the idle share, or keeping up if that is
// faster. (The first cases were named "backlog" when every page kept up
// at twice the finish rate; they are the keeping-up pages now, their
// pauses unchanged.)
func TestRetentionPause(t *testing.T) {
	const took = 10 * time.Millisecond
	for _, c := range []struct {
		name    string
		rows    int
		share   float64
		busy    bool
		backlog bool
		rate    float64
		want    time.Duration
	}{
		{"nothing finishing: an eighth of the share", 32, 0.2, true, false, 0, 390 * time.Millisecond},
		{"a slow trickle finishing: an eighth of the share", 32, 0.2, true, false, 10, 390 * time.Millisecond},
		// 32 rows at 2 x 200/s: a page every 80 ms.
		{"keeping up needs more than an eighth", 32, 0.2, true, false, 200, 70 * time.Millisecond},
		// 32 rows at 2 x 1,000/s: a page every 16 ms, more than the share's one every 50 ms.
		{"keeping up needs more than the share: keeping up", 32, 0.2, true, false, 1_000, 6 * time.Millisecond},
		{"keeping up needs more than the pages can: no pause", 32, 0.2, true, false, 100_000, 0},
		{"idle: the idle share", 32, 0.5, false, false, 0, 10 * time.Millisecond},
		{"idle, a trickle finishing: the idle share", 32, 0.5, false, false, 10, 10 * time.Millisecond},
		// The lease holder on PostgreSQL may admit nothing of what other replicas finish.
		{"idle, finishing fast: keeping up", 32, 0.5, false, false, 100_000, 0},
		// The share's pages, one every 400 ms, remove 80/s.
		{"backlog, nothing finishing: an eighth of the share", 32, 0.2, true, true, 0, 390 * time.Millisecond},
		// 32 rows at 10/s + 80/s.
		{"backlog, a trickle finishing: the trickle and the share", 32, 0.2, true, true, 10, 32*time.Second/90 - took},
		// 32 rows at 200/s + 80/s, where keeping up removed 400/s.
		{"backlog, 200 finishing: 200 and the share", 32, 0.2, true, true, 200, 32*time.Second/280 - took},
		{"backlog, 1,000 finishing: 1,000 and the share", 32, 0.2, true, true, 1_000, 32*time.Second/1_080 - took},
		{"backlog, more finishing than the pages can remove: no pause", 32, 0.2, true, true, 100_000, 0},
		// Idle, the share's pages remove 1,600/s.
		{"backlog, idle: the idle share and what finishes", 32, 0.5, false, true, 400, 32*time.Second/2_000 - took},
	} {
		if got := retentionPause(took, c.rows, c.share, c.busy, c.backlog, c.rate); (got - c.want).Abs() > time.Microsecond {
			t.Errorf("%s: pause %s, want %s", c.name, got, c.want)
		}
	}
}

// However long a loaded machine makes each page (or as fast as pages go,
// when a page alone takes longer), retention removes at least
// retentionKeepUp times the finish rate while it keeps up with what comes
// due now, and at least retentionBacklogKeepUp times it in a backlog: the
// maintenance share does not cap either, or removal falls below what
// finishes and the store grows without bound. In a backlog it removes no
// more than that rate and what the share's pace alone removes: the
// backlog goes at the share.
func TestRetentionKeepsUpWhateverAPageTakes(t *testing.T) {
	const rows = 32
	for _, backlog := range []bool{false, true} {
		keepUp := retentionKeepUp
		if backlog {
			keepUp = retentionBacklogKeepUp
		}
		for _, took := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond} {
			for _, rate := range []float64{50, 300, 1_000, 5_000} {
				for _, share := range []float64{0.05, 0.2, 1} {
					pause := retentionPause(took, rows, share, true, backlog, rate)
					removal := rows / (took + pause).Seconds()
					fastest := rows / took.Seconds()
					want := min(keepUp*rate, fastest)
					if removal < want*0.999 {
						t.Errorf("pages of %d rows taking %s, %.0f finishing a second, share %.2f, backlog %v: pause %s removes %.0f a second, want at least %.0f",
							rows, took, rate, share, backlog, pause, removal, want)
					}
					byShare := rows / (took + pauseFor(took, share/retentionBacklogDivisor)).Seconds()
					if most := min(rate+byShare, fastest); backlog && removal > most*1.001 {
						t.Errorf("backlog pages of %d rows taking %s, %.0f finishing a second, share %.2f: pause %s removes %.0f a second, want at most %.0f (the finish rate and the share's %.0f)",
							rows, took, rate, share, pause, removal, most, byShare)
					}
				}
			}
		}
	}
}

// Giving space back after a retention pass and deleting the journal a
// checkpoint summarises pace at a quarter of the maintenance share while
// gateways are admitted (newDeferrablePacer), not the whole share: no
// steady state waits for either. The retention pages keep the whole.
func TestDeferrableMaintenanceYields(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st := &reclaimingStore{Store: memstore.New(), free: reclaimStepPages + 10, reserve: 10}
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour, RetentionPause: time.Millisecond,
		MaintenanceShare: 0.2})
	defer e.Close()
	var shares []float64
	e.pacerMade = func(p *pacer) { shares = append(shares, p.busy) }
	publish(t, e, 1_000_000, time.Minute, 0)
	if res, err := e.DoBatch(ctx, []ledger.Command{reserveCmd("done", 10), {Kind: ledger.KindRelease, ReservationID: "done"}}); err != nil || res[1].Err != nil {
		t.Fatalf("%+v %v", res, err)
	}
	clk.Advance(2 * time.Hour)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if len(st.steps) == 0 || len(shares) != 2 || shares[0] != 0.2 || shares[1] != 0.2/deferrableShareDivisor {
		t.Fatalf("retention pass: pacers with busy shares %v (reclaim steps %v), want the pages' 0.2 and the reclaim's %v", shares, st.steps, 0.2/deferrableShareDivisor)
	}
	shares = nil
	if _, err := e.CompactJournal(ctx); err != nil {
		t.Fatal(err)
	}
	if len(shares) != 1 || shares[0] != 0.2/deferrableShareDivisor {
		t.Fatalf("journal compaction: pacers with busy shares %v, want %v", shares, 0.2/deferrableShareDivisor)
	}
}

// A retention page's rows for pacing are those of its more numerous
// kind: retires and forgets each keep up with what finishes on their own,
// so a page of 32 of each paces like 32 rows, not 64.
func TestPageRows(t *testing.T) {
	page := func(retires, forgets int) []ledger.Command {
		var cmds []ledger.Command
		for range retires {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindRetire})
		}
		for range forgets {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindForget})
		}
		return cmds
	}
	for _, c := range []struct{ retires, forgets, want int }{{32, 32, 32}, {32, 0, 32}, {0, 20, 20}, {5, 32, 32}} {
		if got := pageRows(page(c.retires, c.forgets)); got != c.want {
			t.Errorf("a page of %d retires and %d forgets: %d rows, want %d", c.retires, c.forgets, got, c.want)
		}
	}
}

// TestFinishedBy counts the reservations a batch made terminal, and no
// replay, failure or non-terminal step.
func TestFinishedBy(t *testing.T) {
	cmds := []ledger.Command{{Kind: ledger.KindSettle}, {Kind: ledger.KindSettle}, {Kind: ledger.KindRelease},
		{Kind: ledger.KindStart}, {Kind: ledger.KindExpire}, {Kind: ledger.KindExpireClaim}, {Kind: ledger.KindRetire}, {Kind: ledger.KindRelease}}
	results := []ledger.Result{
		{Reservation: ledger.Reservation{State: ledger.StateSettled}},
		{Reservation: ledger.Reservation{State: ledger.StateSettled}, Replayed: true},
		{Reservation: ledger.Reservation{State: ledger.StateReleased}},
		{Reservation: ledger.Reservation{State: ledger.StateStarted}},
		{Reservation: ledger.Reservation{State: ledger.StateExpired}},
		{Reservation: ledger.Reservation{State: ledger.StateExpiring}},
		{Reservation: ledger.Reservation{State: ledger.StateSettled}},
		{Err: ledger.ErrReservationNotFound},
	}
	if got := finishedBy(cmds, results); got != 3 {
		t.Fatalf("finishedBy = %d, want 3 (a settle, a release, an expiry)", got)
	}
}

// The tombstone horizon's edge: a pass writes no tombstone for a
// reservation that finished at the cutoff (now - TombstoneRetention, as a
// forget takes those at or before it) and keeps one for a reservation that
// finished just after it, which a retry must still find; with no horizon
// (TombstoneRetention 0) every tombstone is kept however old.
func TestRetentionTombstoneHorizonEdge(t *testing.T) {
	ctx := context.Background()
	finish := func(t *testing.T, e *Engine, id string) {
		t.Helper()
		if res, err := e.DoBatch(ctx, []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindRelease, ReservationID: id}}); err != nil || res[1].Err != nil {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	tombstoned := func(t *testing.T, e *Engine, id string, want bool) {
		t.Helper()
		_, err := e.Tombstone(ctx, id)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		if got := err == nil; got != want {
			t.Fatalf("%s has a tombstone: %v, want %v", id, got, want)
		}
		if !want {
			return
		}
		res, err := e.Do(ctx, reserveCmd(id, 10))
		if err != nil || res.Err != nil || !res.Replayed || !res.Reservation.Retired {
			t.Fatalf("retried reserve of %s: %+v %v, want the tombstone's answer", id, res, err)
		}
	}
	t.Run("at and just after the cutoff", func(t *testing.T) {
		clk := newClock()
		e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
			TombstoneRetention: 2 * time.Hour, RetentionBatch: 10, RetentionPause: time.Millisecond})
		defer e.Close()
		publish(t, e, 1_000_000, time.Minute, 0)
		finish(t, e, "at-cutoff")
		clk.Advance(time.Millisecond)
		finish(t, e, "after-cutoff")
		clk.Advance(2*time.Hour - time.Millisecond)
		if err := e.RunRetention(ctx); err != nil {
			t.Fatal(err)
		}
		if s := e.RetentionStats(); s.Retired != 2 || s.Failed != 0 {
			t.Fatalf("stats %+v, want 2 retired", s)
		}
		tombstoned(t, e, "at-cutoff", false)
		tombstoned(t, e, "after-cutoff", true)
		auditClean(t, e)
	})
	t.Run("no horizon", func(t *testing.T) {
		clk := newClock()
		e := New(memstore.New(), Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
			RetentionBatch: 10, RetentionPause: time.Millisecond})
		defer e.Close()
		publish(t, e, 1_000_000, time.Minute, 0)
		finish(t, e, "old")
		clk.Advance(10_000 * time.Hour)
		if err := e.RunRetention(ctx); err != nil {
			t.Fatal(err)
		}
		if s := e.RetentionStats(); s.Retired != 1 || s.Forgotten != 0 || s.Failed != 0 {
			t.Fatalf("stats %+v, want 1 retired and none forgotten", s)
		}
		tombstoned(t, e, "old", true)
		auditClean(t, e)
	})
}

// A retention page commits in one batch with the gateways' commands beside
// it (DoBatch), and a gateway may reuse an id the page ends: forgotten
// ("a"), or retired past the horizon with no tombstone ("b"). The batch
// commits whole: the page's commands, the reserves of the reused ids and
// an unrelated release all succeed, the new holds are the rows stored,
// and the audit is clean.
func TestRetentionPageAndReusedIDsInOneBatch(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st := memstore.New()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Retention: time.Hour,
		TombstoneRetention: 2 * time.Hour, RetentionBatch: 8, RetentionPause: time.Millisecond})
	defer e.Close()
	publish(t, e, 1_000_000, time.Minute, 0)
	for _, id := range []string{"a", "c"} {
		if res, err := e.Do(ctx, reserveCmd(id, 10)); err != nil || res.Err != nil {
			t.Fatalf("reserve %s: %+v %v", id, res, err)
		}
	}
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: "a"}); err != nil || res.Err != nil {
		t.Fatalf("release a: %+v %v", res, err)
	}
	clk.Advance(61 * time.Minute)
	if err := e.RunRetention(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := e.DoBatch(ctx, []ledger.Command{reserveCmd("b", 10), {Kind: ledger.KindRelease, ReservationID: "b"}}); err != nil || res[1].Err != nil {
		t.Fatalf("b: %+v %v", res, err)
	}
	clk.Advance(3 * time.Hour)
	page, err := e.core.RetentionDue(ctx, clk.Now(), time.Hour, 2*time.Hour, 8)
	if err != nil || len(page) != 2 || page[0].Kind != ledger.KindRetire || page[0].ReservationID != "b" ||
		page[1].Kind != ledger.KindForget || page[1].ReservationID != "a" {
		t.Fatalf("retention page: %+v, %v; want a retire of b and a forget of a", page, err)
	}
	cmds := append(page, reserveCmd("a", 20), reserveCmd("b", 30), ledger.Command{Kind: ledger.KindRelease, ReservationID: "c"})
	cmds[2].RequestDigest, cmds[3].RequestDigest = "sha256:a-again", "sha256:b-again"
	results, err := e.DoBatch(ctx, cmds)
	if err != nil {
		t.Fatalf("a retention page with reserves of the ids it ends: %v", err)
	}
	for i, res := range results {
		if res.Err != nil || res.Replayed {
			t.Errorf("%s %s: %+v", cmds[i].Kind, cmds[i].ReservationID, res)
		}
	}
	for id, units := range map[string]ledger.Units{"a": 20, "b": 30} {
		r, err := st.ReservationGet(ctx, id)
		if err != nil || r.State != ledger.StateReserved || r.RequestDigest != "sha256:"+id+"-again" || r.Reserved[0] != units {
			t.Errorf("reused %s: %+v, %v", id, r, err)
		}
		if _, err := e.Tombstone(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("tombstone of reused %s: %v", id, err)
		}
	}
	auditClean(t, e)
}
