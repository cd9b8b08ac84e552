package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/sqlite"
)

// The epoch worker runs a pass as soon as an accounting epoch has ended,
// not only every EpochInterval: with an interval of an hour, a pass a
// minute into the epoch and a look half an hour later run nothing, and a
// look a second past the epoch's end closes every busy account's epoch
// then, ahead of the accounts' next commands.
func TestEpochWorkerRunsAtTheBoundary(t *testing.T) {
	clk := newClock()
	st := memstore.New()
	e := leadingEngine(t, st, Options{Clock: clk.Now, EpochInterval: time.Hour})
	ctx := context.Background()
	publish(t, e, 1000, time.Hour, time.Hour) // epochs of ledger.DefaultEpochLength, one hour from t0
	const accounts = 10
	for i := range accounts {
		cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 1)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	statements := func() int {
		t.Helper()
		snap, err := st.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(snap.Statements)
	}
	clk.Advance(time.Minute)
	e.runEpochsWhenDue(ctx) // a new leader's first pass: nothing has ended
	first := e.epochWatch.last
	clk.Advance(30 * time.Minute)
	passes := e.workerRuns.Load()
	e.runEpochsWhenDue(ctx)
	if n := statements(); n != 0 || !e.epochWatch.last.Equal(first) {
		t.Fatalf("a look within the epoch: %d statements, last pass at %s; want none, and no pass after %s", n, e.epochWatch.last, first)
	}
	clk.Advance(29*time.Minute + time.Second) // t0 + 1h + 1s: 59 minutes after the last pass
	e.runEpochsWhenDue(ctx)
	if n := statements(); n != accounts {
		t.Fatalf("a second past the epoch's end: %d statements, want %d (one per busy account)", n, accounts)
	}
	if e.workerRuns.Load() == passes {
		t.Fatal("the closes were not the worker's")
	}
	auditClean(t, e)
}

// An epoch the worker closed right after its end and the same epoch
// closed inline by the account's next command give the same statement,
// field for field, and the same account afterwards, on the in-memory
// store and on SQLite (where the worker's close writes the account alone
// and the inline one writes it in the reserve's batch, with its
// reservation and journal). The chain of statements and the audit stay
// exact either way.
func TestWorkerAndInlineClosesWriteTheSameStatement(t *testing.T) {
	for _, kind := range []string{"memstore", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			open := func() store.Store {
				if kind == "memstore" {
					return memstore.New()
				}
				st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "capledger.db"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			}
			worker, inline := run(t, open(), true), run(t, open(), false)
			if len(worker.Statements) != len(inline.Statements) {
				t.Fatalf("%d statements closed by the worker, %d inline", len(worker.Statements), len(inline.Statements))
			}
			for i := range worker.Statements {
				w, in := worker.Statements[i], inline.Statements[i]
				if fmt.Sprintf("%+v", w) != fmt.Sprintf("%+v", in) {
					t.Errorf("statement %d:\n worker %+v\n inline %+v", i, w, in)
				}
			}
			if len(worker.Accounts) != len(inline.Accounts) {
				t.Fatalf("%d accounts, %d", len(worker.Accounts), len(inline.Accounts))
			}
			for i := range worker.Accounts {
				if fmt.Sprintf("%+v", worker.Accounts[i]) != fmt.Sprintf("%+v", inline.Accounts[i]) {
					t.Errorf("account %d:\n worker %+v\n inline %+v", i, worker.Accounts[i], inline.Accounts[i])
				}
			}
			for _, snap := range []*ledger.Snapshot{worker, inline} {
				for _, d := range ledger.Audit(snap) {
					t.Errorf("audit: %s", d)
				}
			}
		})
	}
}

// run drives three accounts through two epochs (reserves, a settle with
// refill between), closing the first epoch with the epoch worker a second
// after its end when byWorker is set, and otherwise leaving it to the
// accounts' next commands five minutes later; it returns the snapshot.
func run(t *testing.T, st store.Store, byWorker bool) *ledger.Snapshot {
	t.Helper()
	ctx := context.Background()
	core := NewCore(st)
	do := func(now time.Time, cmds ...ledger.Command) {
		t.Helper()
		results, err := core.Commit(ctx, cmds, now)
		if err != nil {
			t.Fatal(err)
		}
		for i := range results {
			if results[i].Err != nil {
				t.Fatalf("%s: %v", cmds[i].Kind, results[i].Err)
			}
		}
	}
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 7, RefillInterval: time.Minute}},
		HoldTTL:    2 * time.Hour}.WithDefaults()
	do(t0, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	reserve := func(id, subject string, units int64) ledger.Command {
		cmd := reserveCmd(id, units)
		cmd.Subject = subject
		return cmd
	}
	subjects := []string{"tenant-a", "tenant-b", "tenant-c"}
	for i, s := range subjects {
		do(t0.Add(time.Duration(10+i)*time.Minute), reserve("rl-1-"+s, s, int64(100+i)))
	}
	do(t0.Add(20*time.Minute), ledger.Command{Kind: ledger.KindStart, ReservationID: "rl-1-tenant-a", OperationID: "op-a"})
	do(t0.Add(30*time.Minute), ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-1-tenant-a", OperationID: "op-a", Units: ledger.Amounts{40}})
	end := t0.Add(ledger.DefaultEpochLength)
	if byWorker {
		at := end.Add(time.Second)
		pager, err := core.EpochPager(ctx, at, DefaultPageSize, nil)
		if err != nil {
			t.Fatal(err)
		}
		cmds, err := pager.all(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) != len(subjects) {
			t.Fatalf("the worker closes %d epochs, want %d", len(cmds), len(subjects))
		}
		do(at, cmds...)
	}
	for i, s := range subjects {
		do(end.Add(time.Duration(5+i)*time.Minute), reserve("rl-2-"+s, s, 5))
	}
	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// Passes that remember what they read (EpochScans) still close every busy
// epoch when the accounts' rolls write no index entry (SQLite leaves the
// entry of a busy roll behind its epoch): an account rolled inline before
// the worker reached it, and one rolled inline from an idle epoch long
// after the passes left that epoch behind, are both closed by the pass
// after their next epoch ends.
func TestPassesFindAccountsRolledInline(t *testing.T) {
	for _, kind := range []string{"memstore", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			var st store.Store = memstore.New()
			if kind == "sqlite" {
				s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				st = s
			}
			core := NewCore(st)
			now := t0
			run := func(cmds ...ledger.Command) {
				t.Helper()
				results, err := core.Commit(ctx, cmds, now)
				if err != nil {
					t.Fatal(err)
				}
				for i, r := range results {
					if r.Err != nil {
						t.Fatalf("%s: %v", cmds[i].Kind, r.Err)
					}
				}
			}
			reserve := func(id, subject string) {
				t.Helper()
				cmd := reserveCmd(id, 5)
				cmd.Subject = subject
				run(cmd)
			}
			p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
				Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}}.WithDefaults()
			run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			const accounts = 10
			for i := range accounts {
				reserve(fmt.Sprintf("rl-%d", i), fmt.Sprintf("tenant-%03d", i))
			}
			var scans EpochScans
			pass := func(at time.Time) []string {
				t.Helper()
				now = at
				epochs, err := core.EpochPager(ctx, now, 4, &scans)
				if err != nil {
					t.Fatal(err)
				}
				cmds, _ := pages(t, core, epochs, now)
				if err := epochs.CatchUp(ctx, func() bool { return true }, func(time.Duration) {}); err != nil {
					t.Fatal(err)
				}
				scans.Update(epochs, true)
				var subjects []string
				for _, c := range cmds {
					subjects = append(subjects, c.Account.Subject)
				}
				return subjects
			}
			if got := pass(t0.Add(10 * time.Minute)); len(got) != 0 {
				t.Fatalf("mid-epoch: %v closes", got)
			}
			// Epoch 1 begins: tenant-000 reserves before the worker's pass
			// (its command closes epoch 0 inline); the pass closes the rest.
			now = t0.Add(time.Hour + time.Minute)
			reserve("rl-early", "tenant-000")
			if got := pass(t0.Add(time.Hour + 2*time.Minute)); len(got) != accounts-1 || got[0] != "tenant-001" {
				t.Fatalf("epoch 0's pass closed %v; want tenant-001 to 009", got)
			}
			if got := pass(t0.Add(time.Hour + 30*time.Minute)); len(got) != 0 {
				t.Fatalf("mid-epoch 1: %v closes", got)
			}
			// Epoch 1 ends: tenant-000 was busy in it, the others idle.
			if got := pass(t0.Add(2*time.Hour + 2*time.Minute)); len(got) != 1 || got[0] != "tenant-000" {
				t.Fatalf("epoch 1's pass closed %v; want tenant-000", got)
			}
			// tenant-005, idle since epoch 1, reserves in epoch 3 (its command
			// closes epochs 1-2 inline), long after the passes left epoch 1.
			if got := pass(t0.Add(3*time.Hour + 2*time.Minute)); len(got) != 0 {
				t.Fatalf("epoch 2's pass: %v closes", got)
			}
			now = t0.Add(3*time.Hour + 20*time.Minute)
			reserve("rl-back", "tenant-005")
			if got := pass(t0.Add(3*time.Hour + 30*time.Minute)); len(got) != 0 {
				t.Fatalf("mid-epoch 3: %v closes", got)
			}
			if got := pass(t0.Add(4*time.Hour + 2*time.Minute)); len(got) != 1 || got[0] != "tenant-005" {
				t.Fatalf("epoch 3's pass closed %v; want tenant-005", got)
			}
			snapshot, err := st.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ledger.Audit(snapshot) {
				t.Errorf("audit: %s", d)
			}
		})
	}
}

// The drain worker and DrainProgress page through the same index as the
// epoch worker: on SQLite, entries that busy rolls left behind their
// epoch are still read once each, in pages smaller than the run of them.
func TestDrainPagesCrossEntriesLeftBehind(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	core := NewCore(st)
	now := t0
	run := func(cmds ...ledger.Command) {
		t.Helper()
		results, err := core.Commit(ctx, cmds, now)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range results {
			if r.Err != nil {
				t.Fatalf("%s: %v", cmds[i].Kind, r.Err)
			}
		}
	}
	publish := func(burst int64) {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
		run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	publish(1000)
	const accounts = 12
	for i := range accounts {
		cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 5)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		run(cmd)
	}
	// The next epoch: every other account reserves again, rolling its
	// busy epoch inline (its entry stays at epoch 0), so each page of two
	// ends on one of them.
	now = t0.Add(time.Hour + time.Minute)
	for i := 1; i < accounts; i += 2 {
		cmd := reserveCmd(fmt.Sprintf("rl-again-%d", i), 5)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		run(cmd)
	}
	if due, _, err := st.AccountsByEpoch(ctx, store.EpochFilter{Generation: 1, StartedBy: t0, Limit: 100}); err != nil || len(due) != accounts/2 {
		t.Fatalf("accounts of epoch 0 still due: %d, %v; want %d", len(due), err, accounts/2)
	}
	publish(2000) // supersedes generation 1
	e := New(st, Options{DisableWorkers: true, PageSize: 2, Clock: func() time.Time { return now }})
	progress, err := e.DrainProgress(ctx, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	if progress[0].Accounts != accounts {
		t.Fatalf("DrainProgress counted %d accounts of generation 1, want %d", progress[0].Accounts, accounts)
	}
	ran, err := e.RunDrains(ctx)
	if err != nil || ran != accounts {
		t.Fatalf("RunDrains ran %d drains, %v; want %d", ran, err, accounts)
	}
	// Drains are worker commands (capledger_worker_commands_total,
	// /statusz workerCommands; docs/API.md, "Metrics").
	if got := e.Stats().WorkerCmds; got != accounts {
		t.Fatalf("worker commands after the drains: %d, want %d", got, accounts)
	}
}

// RunDrains counts only drains that moved something: a superseded
// account whose capacity cannot move because the deciding account is at
// its burst gets a drain command on every pass, which moves nothing (an
// operator following a rollback saw "1 drain command" on every poll while
// nothing moved).
func TestRunDrainsCountsOnlyDrainsThatMove(t *testing.T) {
	ctx := context.Background()
	st := memstore.New()
	now := t0
	e := New(st, Options{DisableWorkers: true, Clock: func() time.Time { return now }})
	defer e.Close()
	publish := func(burst int64) {
		t.Helper()
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
		if _, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil {
			t.Fatal(err)
		}
	}
	publish(1000)
	if res, err := e.Do(ctx, reserveCmd("rl-1", 5)); err != nil || res.Err != nil {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	publish(10) // generation 2 starts at its burst: no room for generation 1's 995
	// The subject's next command switches it to generation 2 (the switch
	// is a move of its own); then nothing of generation 1 can move.
	if res, err := e.Do(ctx, reserveCmd("rl-2", 1)); err != nil || res.Err != nil {
		t.Fatalf("reserve under generation 2: %+v, %v", res, err)
	}
	progress, err := e.DrainProgress(ctx, []uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	if progress[0].Available == (ledger.Amounts{}) {
		t.Fatalf("generation 1 holds no available capacity: %+v", progress[0])
	}
	for pass := range 2 {
		if ran, err := e.RunDrains(ctx); err != nil || ran != 0 {
			t.Fatalf("pass %d: RunDrains counted %d drains, %v; want 0 (nothing can move)", pass, ran, err)
		}
	}
	auditClean(t, e)
}

// slowCatchUpStore stands for a store whose epoch index catch-up takes a
// while (a million entries left behind by a rollover): every call
// reports more to do until it has been called calls times, and step runs
// at each call.
type slowCatchUpStore struct {
	store.Store
	calls, made int
	step        func(call int)
}

func (s *slowCatchUpStore) EpochIndexCatchUp(ctx context.Context, f store.EpochFilter) (store.EpochCursor, bool, error) {
	next, _, err := s.Store.EpochIndexCatchUp(ctx, f)
	s.made++
	if s.step != nil {
		s.step(s.made)
	}
	return next, s.made < s.calls, err
}

// An epoch that ends while the epoch worker is still catching its index
// up after the previous rollover does not wait for that catch-up: the
// catch-up stops, the watch's next look starts the new pass, which closes
// the new epoch's busy accounts and then catches up both passes' range;
// what the passes before remembered (EpochScans) is kept, not forgotten.
// The catch-up stops only once in a row: the next one runs to its end
// even if another epoch ends meanwhile.
func TestNewEpochPassDoesNotWaitForCatchUp(t *testing.T) {
	clk := newClock()
	st := &slowCatchUpStore{Store: memstore.New()}
	e := leadingEngine(t, st, Options{Clock: clk.Now, EpochInterval: time.Hour})
	ctx := context.Background()
	publish(t, e, 1000, 3*time.Hour, 3*time.Hour) // epochs of an hour from t0
	statements := func(epoch time.Time) int {
		t.Helper()
		snap, err := st.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range snap.Statements {
			if s.EpochStart.Equal(epoch) {
				n++
			}
		}
		return n
	}
	reserve := func(id string, i int) {
		t.Helper()
		cmd := reserveCmd(id, 1)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	const accounts, busy = 10, 5
	for i := range accounts {
		reserve(fmt.Sprintf("rl-0-%d", i), i)
	}
	clk.Advance(10 * time.Minute)
	e.runEpochsWhenDue(ctx) // mid-epoch 0: nothing to close, a complete pass remembered
	rememberedAt, rememberedKnown := e.epochScans.last(), e.epochScans.known
	if rememberedAt.IsZero() {
		t.Fatal("a complete pass left no EpochScans")
	}
	// Epoch 1: half the accounts reserve again (closing epoch 0 inline),
	// so they are busy in it; the worker's pass closes the rest.
	clk.Advance(50*time.Minute + time.Second)
	for i := range busy {
		reserve(fmt.Sprintf("rl-1-%d", i), i)
	}
	// The pass's catch-up is long: epoch 1 ends during its first chunk.
	epoch1 := t0.Add(time.Hour)
	waited := 0
	st.calls, st.made = 50, 0
	st.step = func(call int) {
		if call <= 2 {
			// Epoch 1 ends during the first chunk; epoch 2 during the
			// next pass's first, which may not stop that catch-up again.
			clk.Advance(time.Hour)
			return
		}
		if statements(epoch1) < busy {
			waited++
		}
	}
	e.runEpochsWhenDue(ctx)
	if waited > 0 {
		t.Fatalf("epoch 1 ended during a catch-up's first chunk; %d more chunks of it ran before epoch 1's closes", waited)
	}
	if n := statements(t0); n != accounts {
		t.Fatalf("epoch 0: %d statements, want %d", n, accounts)
	}
	if at, known := e.epochScans.last(), e.epochScans.known; !at.Equal(rememberedAt) || known != rememberedKnown {
		t.Fatalf("after a catch-up cut short EpochScans remember a pass at %s with generations up to %d, want what they remembered before the pass, at %s up to %d",
			at, known, rememberedAt, rememberedKnown)
	}
	e.runEpochsWhenDue(ctx) // the watch's next look
	if waited > 0 {
		t.Fatalf("%d chunks of the catch-up ran before epoch 1's closes", waited)
	}
	if n := statements(epoch1); n != busy {
		t.Fatalf("epoch 1: %d statements, want %d (its busy accounts)", n, busy)
	}
	if st.made != st.calls {
		t.Fatalf("the catch-up ran %d chunks, want all %d by the end of the next pass (stopped only once in a row)", st.made, st.calls)
	}
	if at, newest := e.epochScans.last(), e.epochScans.known; !at.Equal(t0.Add(2*time.Hour+time.Second)) || newest != 1 {
		t.Fatalf("after the next pass EpochScans remember a pass at %s up to generation %d, want the pass that started at epoch 1's end + 1h (%s), up to 1",
			at, newest, t0.Add(2*time.Hour+time.Second))
	}
	auditClean(t, e)
}

// A policy published after the epoch worker's last pass, with an epoch
// length no earlier policy had, is watched from its publish on: its busy
// account's epoch is closed a second past its end, in a statement of that
// epoch alone, not up to an EpochInterval later in one statement that
// spans every epoch since.
func TestEpochWorkerWatchesAPolicyPublishedSinceItsLastPass(t *testing.T) {
	clk := newClock()
	st := memstore.New()
	e := leadingEngine(t, st, Options{Clock: clk.Now, EpochInterval: time.Hour})
	ctx := context.Background()
	publish(t, e, 1000, time.Hour, time.Hour) // epochs of one hour
	mustDo(t, e, reserveCmd("rl-hour", 1))
	clk.Advance(time.Minute)
	e.runEpochsWhenDue(ctx) // the last pass: it knows only the one-hour epochs

	short := ledger.Policy{
		Key:         ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.short", Region: "eu"},
		Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 10, RefillInterval: time.Second}},
		HoldTTL:     time.Hour,
		EpochLength: 10 * time.Second,
	}.WithDefaults()
	mustDo(t, e, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &short})
	cmd := reserveCmd("rl-short", 5)
	cmd.Route = "chat.short"
	mustDo(t, e, cmd)
	start := ledger.EpochStartOf(clk.Now(), short.EpochLength)
	clk.Advance(start.Add(short.EpochLength + time.Second).Sub(clk.Now())) // a second past its epoch's end
	e.runEpochsWhenDue(ctx)

	snap, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var closed []ledger.Statement
	for _, s := range snap.Statements {
		if s.Account.Route == "chat.short" {
			closed = append(closed, s)
		}
	}
	if len(closed) != 1 || !closed[0].EpochStart.Equal(start) || !closed[0].EpochEnd.Equal(start.Add(short.EpochLength)) {
		t.Fatalf("a second past the end of the new policy's first epoch (%s): statements %+v; want one, of that epoch", start, closed)
	}
	auditClean(t, e)
}
