package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// countingStore counts the account rows the workers read, to show they
// read only what their indexes say is due.
type countingStore struct {
	store.Store
	listed, byEpoch, points atomic.Int64
}

func (s *countingStore) AccountList(ctx context.Context, k ledger.PolicyKey) ([]ledger.Account, error) {
	out, err := s.Store.AccountList(ctx, k)
	s.listed.Add(int64(len(out)) + 1)
	return out, err
}

func (s *countingStore) AccountsByEpoch(ctx context.Context, f store.EpochFilter) ([]ledger.Account, store.EpochCursor, error) {
	out, next, err := s.Store.AccountsByEpoch(ctx, f)
	s.byEpoch.Add(int64(len(out)))
	return out, next, err
}

func (s *countingStore) AccountGet(ctx context.Context, k ledger.AccountKey) (ledger.Account, error) {
	s.points.Add(1)
	return s.Store.AccountGet(ctx, k)
}

func (s *countingStore) reset() { s.listed.Store(0); s.byEpoch.Store(0); s.points.Store(0) }

// pages runs a pager to its end, committing each page at now, and returns
// the commands and the largest page.
func pages(t *testing.T, core *Core, p *Pager, now time.Time) (cmds []ledger.Command, largest int) {
	t.Helper()
	for {
		page, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return cmds, largest
		}
		largest = max(largest, len(page))
		if _, err := core.Commit(context.Background(), page, now); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, page...)
	}
}

// The epoch and drain workers read only the accounts that are due, a
// bounded page at a time: nothing at all while nothing is due, every due
// account once when an epoch ends or a generation is superseded, and,
// once a superseded generation is drained, not even its accounts again.
func TestWorkersReadOnlyWhatIsDue(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: memstore.New()}
	core := NewCore(st)
	now := t0
	policy := func(subject string, burst int64) *ledger.Policy {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
		return &p
	}
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
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy(ledger.AnySubject, 1000)})
	const accounts, pageSize = 300, 64
	for i := range accounts {
		cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 10)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		run(cmd)
	}

	// Ten minutes into the hour-long epoch nothing is due: no row read.
	now = t0.Add(10 * time.Minute)
	st.reset()
	epochs, err := core.EpochPager(ctx, now, pageSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cmds, _ := pages(t, core, epochs, now); len(cmds) != 0 {
		t.Fatalf("epochs due mid-epoch: %d", len(cmds))
	}
	drains, _, err := core.DrainPager(ctx, pageSize, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cmds, _ := pages(t, core, drains, now); len(cmds) != 0 {
		t.Fatalf("drains due with one generation: %d", len(cmds))
	}
	if n := st.listed.Load() + st.byEpoch.Load() + st.points.Load(); n != 0 {
		t.Fatalf("idle workers read %d account rows (listed %d, by epoch %d, points %d), want none",
			n, st.listed.Load(), st.byEpoch.Load(), st.points.Load())
	}

	// The epoch ends: every account closes once, in bounded pages, and
	// then none is due.
	now = t0.Add(time.Hour + time.Minute)
	epochs, err = core.EpochPager(ctx, now, pageSize, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmds, largest := pages(t, core, epochs, now)
	if len(cmds) != accounts || largest > pageSize {
		t.Fatalf("epoch close: %d commands, largest page %d; want %d in pages of at most %d", len(cmds), largest, accounts, pageSize)
	}
	if due, err := core.EpochsDue(ctx, now); err != nil || len(due) != 0 {
		t.Fatalf("epochs due after the close: %d, %v", len(due), err)
	}

	// A new AnySubject generation supersedes the first: each old account
	// still holds capacity and drains once; a tenant with a policy of its
	// own drains its account of the new AnySubject generation too.
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy(ledger.AnySubject, 2000)})
	own := reserveCmd("rl-own", 10)
	own.Subject = "tenant-000"
	run(own) // tenant-000 switches to generation 2
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policy("tenant-000", 5000)})
	var memo drainMemo
	plan := func(active activeDigest, g uint64) DrainPlan { return memo.planDigest(active, g, now) }
	drains, active, err := core.DrainPager(ctx, pageSize, plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmds, largest = pages(t, core, drains, now)
	memo.updateDigest(active, drains, drainOutcomes{1: true, 2: true}, true, now)
	gen2 := 0
	for _, c := range cmds {
		if c.Account.Generation == 2 {
			gen2++
		}
	}
	if len(cmds) != accounts || gen2 != 1 || largest > pageSize {
		t.Fatalf("drains: %d commands (%d of generation 2), largest page %d; want %d (1) in pages of at most %d",
			len(cmds), gen2, largest, accounts, pageSize)
	}
	// The second pass finds generation 1 drained; the third does not read
	// it at all while the active generations stay the same.
	for pass := 2; pass <= 3; pass++ {
		st.reset()
		drains, active, err = core.DrainPager(ctx, pageSize, plan, nil)
		if err != nil {
			t.Fatal(err)
		}
		if cmds, _ := pages(t, core, drains, now); len(cmds) != 0 {
			t.Fatalf("pass %d: %d drains after draining", pass, len(cmds))
		}
		memo.updateDigest(active, drains, nil, true, now)
		if pass == 3 && st.byEpoch.Load() != 0 {
			t.Fatalf("pass 3 read %d rows of drained generations", st.byEpoch.Load())
		}
	}
	if st.listed.Load() != 0 {
		t.Fatalf("the workers listed every account")
	}
	snapshot, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ledger.Audit(snapshot) {
		t.Errorf("audit: %s", d)
	}
}

// An account whose balances did not change in an epoch gets no close from
// the epoch worker: its next command closes the idle epochs in one
// statement that opens and closes on the same vector, so the chain stays
// unbroken and the audit clean. A full pass is remembered (EpochScans):
// the next one does not read the idle accounts again.
func TestIdleEpochsFoldIntoTheNextStatement(t *testing.T) {
	ctx := context.Background()
	st := &countingStore{Store: memstore.New()}
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
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}}.WithDefaults()
	run(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	const accounts, pageSize = 100, 16
	for i := range accounts {
		cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 10)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		run(cmd)
	}
	var scans EpochScans
	pass := func(at time.Time) []ledger.Command {
		t.Helper()
		now = at
		st.reset()
		epochs, err := core.EpochPager(ctx, now, pageSize, &scans)
		if err != nil {
			t.Fatal(err)
		}
		cmds, _ := pages(t, core, epochs, now)
		scans.Update(epochs, true)
		return cmds
	}

	// Epoch 0 saw every account reserve: each closes once.
	if cmds := pass(t0.Add(time.Hour + 10*time.Minute)); len(cmds) != accounts {
		t.Fatalf("epoch 0: %d closes, want %d", len(cmds), accounts)
	}
	// Epoch 1 was idle: nothing closes, and the pass after that reads no
	// account at all.
	if cmds := pass(t0.Add(2*time.Hour + 10*time.Minute)); len(cmds) != 0 {
		t.Fatalf("idle epoch 1: %d closes, want none", len(cmds))
	}
	if cmds := pass(t0.Add(2*time.Hour + 11*time.Minute)); len(cmds) != 0 || st.byEpoch.Load() != 0 {
		t.Fatalf("second pass over idle accounts: %d closes, %d rows read; want none", len(cmds), st.byEpoch.Load())
	}

	// One tenant comes back in epoch 3: its command closes epochs 1-2 in
	// one statement, and the worker closes its epoch 3, reading only it.
	now = t0.Add(3*time.Hour + 20*time.Minute)
	back := reserveCmd("rl-back", 5)
	back.Subject = "tenant-007"
	run(back)
	cmds := pass(t0.Add(4*time.Hour + 10*time.Minute))
	if len(cmds) != 1 || cmds[0].Account.Subject != "tenant-007" || st.byEpoch.Load() != 1 {
		t.Fatalf("after the return: %v, %d rows read; want tenant-007's close alone, one row", cmds, st.byEpoch.Load())
	}

	snapshot, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var spans []ledger.Statement
	for _, s := range snapshot.Statements {
		if s.Account.Subject == "tenant-007" {
			spans = append(spans, s)
		}
	}
	slices.SortFunc(spans, func(a, b ledger.Statement) int { return a.EpochStart.Compare(b.EpochStart) })
	want := [][2]time.Time{{t0, t0.Add(time.Hour)}, {t0.Add(time.Hour), t0.Add(3 * time.Hour)}, {t0.Add(3 * time.Hour), t0.Add(4 * time.Hour)}}
	if len(spans) != len(want) {
		t.Fatalf("tenant-007 has %d statements, want %d: %+v", len(spans), len(want), spans)
	}
	for i, w := range want {
		if !spans[i].EpochStart.Equal(w[0]) || !spans[i].EpochEnd.Equal(w[1]) {
			t.Errorf("statement %d spans %s-%s, want %s-%s", i, spans[i].EpochStart, spans[i].EpochEnd, w[0], w[1])
		}
	}
	if spans[1].Opening != spans[1].Closing {
		t.Errorf("the idle span's statement changes balances: %v -> %v", spans[1].Opening, spans[1].Closing)
	}
	if n := len(snapshot.Statements); n != accounts+2 {
		t.Errorf("%d statements, want %d (one per account for epoch 0, two more for tenant-007)", n, accounts+2)
	}
	for _, d := range ledger.Audit(snapshot) {
		t.Errorf("audit: %s", d)
	}
}

// downStore fails the next Begin calls while failBegins is positive.
type downStore struct {
	store.Store
	failBegins atomic.Int32
}

func (s *downStore) Begin(ctx context.Context) (store.Tx, error) {
	if s.failBegins.Add(-1) >= 0 {
		return nil, errors.New("store down")
	}
	return s.Store.Begin(ctx)
}

// An epoch pass whose chunk failed is not remembered as done: the next
// pass reads those accounts again and closes their epochs.
func TestFailedEpochChunkIsClosedByTheNextPass(t *testing.T) {
	clk := newClock()
	st := &downStore{Store: memstore.New()}
	e := leadingEngine(t, st, Options{Clock: clk.Now})
	ctx := context.Background()
	publish(t, e, 1000, time.Hour, time.Hour)
	const accounts = 100
	for i := range accounts {
		cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 1)
		cmd.Subject = fmt.Sprintf("tenant-%03d", i)
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatal(err, res.Err)
		}
	}
	clk.Advance(time.Hour + 10*time.Minute)
	st.failBegins.Store(1)
	e.runEpochs(ctx)
	clk.Advance(time.Minute)
	e.runEpochs(ctx)
	snapshot, err := st.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(snapshot.Statements); n != accounts {
		t.Fatalf("%d statements after a failed chunk and one more pass, want %d", n, accounts)
	}
}

// A batch that keeps losing races is rerun past MaxConflictRetries while
// ConflictRetryBudget lasts, and fails with store.ErrConflict only once
// both are spent.
func TestConflictRetriesLastTheBudget(t *testing.T) {
	gated := &gatedStore{Store: memstore.New(), gate: make(chan struct{})}
	close(gated.gate)
	e := New(gated, Options{DisableWorkers: true, MaxConflictRetries: 3, ConflictRetryBudget: time.Hour})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	gated.conflicts.Store(12) // more than MaxConflictRetries, well within the budget
	res, err := e.Do(context.Background(), reserveCmd("rl-retried", 10))
	if err != nil || res.Err != nil {
		t.Fatalf("reserve after 12 lost races: %v %v", err, res.Err)
	}
	if st := e.Stats(); st.Conflicts != 12 {
		t.Fatalf("conflicts %d, want 12", st.Conflicts)
	}

	short := New(gated, Options{DisableWorkers: true, MaxConflictRetries: 3, ConflictRetryBudget: time.Nanosecond})
	defer short.Close()
	gated.conflicts.Store(1 << 20)
	if _, err := short.Do(context.Background(), reserveCmd("rl-exhausted", 10)); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("reserve with retries and budget spent: %v, want store.ErrConflict", err)
	}
	if st := short.Stats(); st.Conflicts != 3 {
		t.Fatalf("conflicts %d, want the 3 retries", st.Conflicts)
	}
}

// commitAlone commits cmd in a batch of its own on core at now and fails
// the test on any error.
func commitAlone(t *testing.T, core *Core, now time.Time, cmd ledger.Command) {
	t.Helper()
	results, err := core.Commit(context.Background(), []ledger.Command{cmd}, now)
	if err != nil || results[0].Err != nil {
		t.Fatalf("%s: %v, %v", cmd.Kind, err, results[0].Err)
	}
}

// publishOnCore publishes on core at now a chat.generate/eu policy for
// every subject that bursts to burst tokens.
func publishOnCore(t *testing.T, core *Core, now time.Time, burst int64) {
	t.Helper()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}}.WithDefaults()
	commitAlone(t, core, now, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

// A drain pass that found one command in a generation does not report
// the generation's scan without commands (Pager.Ended): the drain memo
// would skip it for good.
func TestDrainPassWithOneCommandIsNotClean(t *testing.T) {
	ctx := context.Background()
	core := NewCore(memstore.New())
	now := t0
	publishOnCore(t, core, now, 1000)
	commitAlone(t, core, now, reserveCmd("rl-1", 10))
	publishOnCore(t, core, now, 2000) // generation 1's one account now drains
	drains, _, err := core.DrainPager(ctx, 64, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cmds, _ := pages(t, core, drains, now); len(cmds) != 1 || cmds[0].Account.Generation != 1 {
		t.Fatalf("drains: %+v, want generation 1's account", cmds)
	}
	if ended := drains.Ended(); !slices.ContainsFunc(ended, func(s ScanEnd) bool { return s.Generation == 1 && s.Commands == 1 }) {
		t.Fatalf("generation 1's scan after a drain: %+v, want one command", ended)
	}
}

// A command stamped up to EpochLateness before the epoch worker's clock
// may commit after the worker's pass read its epoch's accounts: the next
// pass, which resumes where that one ended (EpochScans), still reads back
// far enough to close that account's epoch.
func TestEpochPassReadsBackTheLateness(t *testing.T) {
	ctx := context.Background()
	core := NewCore(memstore.New())
	nine := time.Date(2026, 7, 20, 9, 0, 0, 0, time.UTC)
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, EpochLength: time.Hour}.WithDefaults()
	commitAlone(t, core, nine, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	var scans EpochScans
	pass := func(now time.Time) []ledger.Command {
		t.Helper()
		pager, err := core.EpochPager(ctx, now, 64, &scans)
		if err != nil {
			t.Fatal(err)
		}
		cmds, _ := pages(t, core, pager, now)
		scans.Update(pager, true)
		return cmds
	}
	if cmds := pass(nine.Add(time.Hour + 30*time.Second)); len(cmds) != 0 {
		t.Fatalf("first pass, no account: %+v", cmds)
	}
	// Stamped 40 s before that pass, committed after it: an account in
	// the 09:00 epoch the pass did not see.
	late := reserveCmd("rl-late", 10)
	commitAlone(t, core, nine.Add(time.Hour-10*time.Second), late)
	cmds := pass(nine.Add(2*time.Hour + 30*time.Second))
	if len(cmds) != 1 || cmds[0].Kind != ledger.KindCloseEpoch || cmds[0].Account.Subject != late.Subject {
		t.Fatalf("the next pass closes the late account's 09:00 epoch: %+v", cmds)
	}
}

// A drain scan lists the accounts that got a command or held
// reservations (the drain memo reads only those again), and says it
// overflowed, listing none, when there were more than it keeps.
func TestDrainScanListsWaitingAccountsUpToItsBound(t *testing.T) {
	ctx := context.Background()
	for _, collect := range []int{3, 2} {
		core := NewCore(memstore.New())
		publishOnCore(t, core, t0, 1000)
		for i := range 3 {
			cmd := reserveCmd(fmt.Sprintf("rl-%d", i), 10)
			cmd.Subject = fmt.Sprintf("tenant-%d", i)
			commitAlone(t, core, t0, cmd)
		}
		publishOnCore(t, core, t0, 2000)
		drains, _, err := core.DrainPager(ctx, 64, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		drains.collect = collect
		pages(t, core, drains, t0)
		ended := drains.Ended()
		if len(ended) != 1 || ended[0].Generation != 1 {
			t.Fatalf("collect %d: scans %+v, want generation 1's", collect, ended)
		}
		if got := ended[0]; collect == 3 && (got.Overflow || len(got.Waiting) != 3) || collect == 2 && (!got.Overflow || got.Waiting != nil) {
			t.Fatalf("collect %d: %+v", collect, got)
		}
	}
}
