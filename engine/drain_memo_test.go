package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// drainScanStore counts the account rows drain scans read
// (AccountsByEpoch without an epoch bound; the epoch worker's scans have
// one) and the point reads of accounts.
type drainScanStore struct {
	store.Store
	rows, points atomic.Int64
}

func (s *drainScanStore) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	s.points.Add(1)
	return s.Store.AccountGet(ctx, key)
}

func (s *drainScanStore) AccountsByEpoch(ctx context.Context, f store.EpochFilter) ([]ledger.Account, store.EpochCursor, error) {
	out, next, err := s.Store.AccountsByEpoch(ctx, f)
	if f.StartedBy.IsZero() {
		s.rows.Add(int64(len(out)))
	}
	return out, next, err
}

// drainMemoRig is a leading engine (leadingEngine) on a test clock, with
// the commands the drain memo's tests run.
type drainMemoRig struct {
	t   *testing.T
	ctx context.Context
	clk *clock
	e   *Engine
}

func newDrainMemoRig(t *testing.T, st store.Store) *drainMemoRig {
	clk := newClock()
	return &drainMemoRig{t: t, ctx: context.Background(), clk: clk, e: leadingEngine(t, st, Options{Clock: clk.Now})}
}

// do runs cmd and fails the test on any error.
func (r *drainMemoRig) do(cmd ledger.Command) {
	r.t.Helper()
	if res, err := r.e.Do(r.ctx, cmd); err != nil || res.Err != nil {
		r.t.Fatalf("%s %s: %v, %v", cmd.Kind, cmd.ReservationID, err, res.Err)
	}
}

// publish publishes a chat.generate/eu policy for every subject with the
// one dimension d, in epochs of a day.
func (r *drainMemoRig) publish(d ledger.Dimension) {
	r.t.Helper()
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{d}, EpochLength: 24 * time.Hour}.WithDefaults()
	r.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
}

// spend reserves with reserve, starts and settles all it reserved.
func (r *drainMemoRig) spend(reserve ledger.Command) {
	r.t.Helper()
	id := reserve.ReservationID
	r.do(reserve)
	r.do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
	r.do(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: reserve.Units})
}

// waitDrained runs a drain pass (runEpochs) a minute, the clock moved on
// first, until old holds no available capacity; it fails the test when
// that takes more than DrainRecheckMax from now (when the deciding
// account got room).
func (r *drainMemoRig) waitDrained(old ledger.AccountKey) {
	r.t.Helper()
	roomAt := r.clk.Now()
	for {
		a, err := r.e.core.store.AccountGet(r.ctx, old)
		if err != nil {
			r.t.Fatal(err)
		}
		if a.Balances[0].Available == 0 {
			return
		}
		if r.clk.Now().Sub(roomAt) > DrainRecheckMax {
			r.t.Fatalf("%s still holds %+v %v after the deciding account had room", old, a.Balances[0], r.clk.Now().Sub(roomAt))
		}
		r.clk.Advance(time.Minute)
		r.e.runEpochs(r.ctx)
	}
}

// comeBackAfterIdle is tenant-7 staying away from an emptied account of
// generation 1 (refilling to 100) for 20 minutes of drain passes, then
// coming back and spending 50 under the newest generation (burst 50):
// the switch refills generation 1 and moves 50, so 50 stay behind, which
// the worker must drain within DrainRecheckMax (waitDrained).
func (r *drainMemoRig) comeBackAfterIdle(id string) {
	r.t.Helper()
	r.e.runEpochs(r.ctx) // generation 1: one empty account, no reservation
	r.clk.Advance(20 * time.Minute)
	r.e.runEpochs(r.ctx)
	r.spend(reserveCmd(id, 50))
	old := ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 1}
	if a, err := r.e.core.store.AccountGet(r.ctx, old); err != nil || a.Balances[0].Available == 0 {
		r.t.Fatalf("%s after the switch: %+v, %v; want capacity left behind", old, a.Balances[0], err)
	}
	r.waitDrained(old)
}

// Superseded generations whose accounts hold capacity the deciding
// account's burst has no room for are not read and drained again every
// pass: the drain worker's reads and commands over idle passes stop
// growing with the passes (after the first, only the rechecks, one
// minute apart and doubling up to DrainRecheckMax), and a recheck reads
// the blocked accounts alone, not the generations' other accounts. Once
// the subject spends under the deciding generation, the blocked capacity
// moves at the latest DrainRecheckMax later.
func TestDrainWorkerLeavesBlockedGenerationsAlone(t *testing.T) {
	st := &drainScanStore{Store: memstore.New()}
	r := newDrainMemoRig(t, st)
	ctx, clk, e, do := r.ctx, r.clk, r.e, r.do
	// Each generation bursts 10 below the one before and never refills:
	// a switch moves all the new burst has room for and leaves 10 behind,
	// blocked: the deciding account is full.
	const generations, tenants, spent = 8, 3, 20
	burst := func(g int) int64 { return 1000 - 10*int64(g-1) }
	reserved := 0
	touch := func(tenant int) { // a reserve and release: switches the tenant
		reserved++
		cmd := reserveCmd(fmt.Sprintf("touch-%d", reserved), 1)
		cmd.Subject = fmt.Sprintf("tenant-%d", tenant)
		do(cmd)
		do(ledger.Command{Kind: ledger.KindRelease, ReservationID: cmd.ReservationID})
	}
	for g := 1; g <= generations+1; g++ {
		r.publish(ledger.Dimension{Unit: "tokens", Burst: burst(g)})
		for tenant := range tenants {
			touch(tenant)
		}
		if g == 1 {
			// Generation 1 also gets empty accounts: tenants that spent
			// their whole burst and went away. A full read of it reads
			// them too.
			for i := range spent {
				id := fmt.Sprintf("spent-%d", i)
				cmd := reserveCmd(id, burst(1))
				cmd.Subject = id
				r.spend(cmd)
			}
		}
	}
	blocked := generations * tenants

	// One pass a minute for half an hour: every pass drains nothing.
	var rows, cmds []int64
	pass := func() {
		t.Helper()
		st.rows.Store(0)
		st.points.Store(0)
		before := e.workerCmds.Load()
		e.runEpochs(ctx)
		rows = append(rows, st.rows.Load()+st.points.Load())
		cmds = append(cmds, int64(e.workerCmds.Load()-before))
		if len(rows) > 1 && st.rows.Load() != 0 {
			t.Errorf("pass %d read %d rows of whole generations, want only the blocked accounts", len(rows), st.rows.Load())
		}
		clk.Advance(time.Minute)
	}
	for range 31 {
		pass()
	}
	// Read at minutes 0 (every account), then 1, 3, 7 and 15 (waits of
	// 1, 2, 4, 8 and 16 minutes: the blocked accounts), each a drain of
	// every blocked account; never again in the last 15 passes. The
	// worker used to read every account and drain the blocked ones on
	// each of the 31 passes.
	if rows[0] != int64(blocked+spent) || cmds[0] != int64(blocked) {
		t.Fatalf("first pass: %d rows, %d drains; want %d and %d", rows[0], cmds[0], blocked+spent, blocked)
	}
	var totalRows, totalCmds int64
	for minute := range rows {
		totalRows += rows[minute]
		totalCmds += cmds[minute]
		if minute > 15 && (rows[minute] != 0 || cmds[minute] != 0) {
			t.Errorf("pass at minute %d read %d rows and sent %d drains, want none", minute, rows[minute], cmds[minute])
		}
	}
	if totalCmds != 5*int64(blocked) || totalRows != 5*int64(blocked)+spent {
		t.Fatalf("31 idle passes read %d rows and sent %d drains (by pass: %v, %v); want %d and %d (5 reads of %d blocked accounts, and the empty ones once)",
			totalRows, totalCmds, rows, cmds, 5*blocked+spent, 5*blocked, blocked)
	}
	t.Logf("31 idle passes over %d blocked and %d empty accounts: rows read %v, drains %v", blocked, spent, rows, cmds)
	pass() // minute 31: a recheck; the next waits DrainRecheckMax

	// tenant-0 spends 50 under the deciding generation: room for five
	// blocked accounts' 10.
	clk.Advance(30 * time.Second)
	roomAt := clk.Now()
	spend := reserveCmd("spend", 50)
	spend.Subject = "tenant-0"
	r.spend(spend)
	deciding := ledger.AccountKey{Subject: "tenant-0", Route: "chat.generate", Region: "eu", Generation: generations + 1}
	clk.Advance(30 * time.Second)
	for {
		e.runEpochs(ctx)
		a, err := st.Store.AccountGet(ctx, deciding)
		if err != nil {
			t.Fatal(err)
		}
		if a.Balances[0].Available == burst(generations+1) {
			break
		}
		if clk.Now().Sub(roomAt) > DrainRecheckMax {
			t.Fatalf("%s still has room %v after the spend: %+v", deciding, clk.Now().Sub(roomAt), a.Balances[0])
		}
		clk.Advance(time.Minute)
	}
	t.Logf("the blocked capacity moved %v after the spend", clk.Now().Sub(roomAt))
	if waited := clk.Now().Sub(roomAt); waited < 10*time.Minute {
		t.Fatalf("the room was filled %v after the spend, before the recheck due 16 minutes after the last one", waited)
	}
	auditClean(t, e)
}

// A superseded generation whose accounts hold only reservations is not
// left alone for good: a late release lands there, and what the
// deciding account's burst has no room for stays (the ledger forwards
// what fits). The worker reads it again within DrainRecheckMax, so once
// the subject spends, the capacity moves.
func TestDrainWorkerRechecksGenerationsHoldingReservations(t *testing.T) {
	r := newDrainMemoRig(t, memstore.New())
	ctx, clk, e, do := r.ctx, r.clk, r.e, r.do
	publish := func(burst int64) {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: burst}}, EpochLength: 24 * time.Hour, HoldTTL: 24 * time.Hour}.WithDefaults()
		do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	publish(100)
	do(reserveCmd("held", 10)) // generation 1: 90 available, 10 reserved
	publish(90)
	do(reserveCmd("touch", 1)) // switches: generation 2 gets the 90, full
	do(ledger.Command{Kind: ledger.KindRelease, ReservationID: "touch"})
	e.runEpochs(ctx) // generation 1 holds a reservation and nothing to drain
	clk.Advance(time.Minute)
	do(ledger.Command{Kind: ledger.KindRelease, ReservationID: "held"}) // 10 land on generation 1 and stay
	r.spend(reserveCmd("spend", 10))
	r.waitDrained(ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 1})
	auditClean(t, e)
}

// A generation whose scan listed more accounts than the pager keeps
// (ScanEnd.Overflow) is read in full at its recheck, not by points: the
// accounts left out of the list could need a drain.
func TestDrainMemoReadsAnOverflowedGenerationInFull(t *testing.T) {
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	active := ledger.ActiveGenerations{key: 3}
	listed := []ledger.AccountKey{{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 2}}
	var m drainMemo
	m.update(active, &Pager{ended: []ScanEnd{{Generation: 1, Commands: 5, Overflow: true}, {Generation: 2, Commands: 1, Waiting: listed}}}, nil, true, t0)
	if plan := m.plan(active, 1, t0.Add(30*time.Second)); !plan.Skip {
		t.Fatalf("generation 1 read %+v before its recheck", plan)
	}
	if plan := m.plan(active, 1, t0.Add(drainRecheckFirst)); plan.Skip || plan.ByPoints {
		t.Fatalf("generation 1, overflowed, at its recheck: %+v, want a full read", plan)
	}
	if plan := m.plan(active, 2, t0.Add(drainRecheckFirst)); plan.Skip || !plan.ByPoints || len(plan.Points) != 1 || plan.Points[0] != listed[0] {
		t.Fatalf("generation 2 at its recheck: %+v, want its one listed account", plan)
	}
}

// A superseded account that still holds its subject's capacity (the
// subject has not come back since the publish) refills lazily under its
// own rule: it reads empty to the drain worker's scan, yet when the
// subject comes back the switch refills it up to its own burst and moves
// only what the new, smaller burst has room for. The rest stays on the
// superseded account, though it held no reservation. The worker must
// still find it: once the subject spends under the deciding generation,
// that capacity moves within DrainRecheckMax.
func TestDrainWorkerFindsCapacityASwitchLeftOnAnEmptyCurrentAccount(t *testing.T) {
	for name, open := range memstoreAndSQLite {
		t.Run(name, func(t *testing.T) {
			r := newDrainMemoRig(t, open(t))
			ctx, clk, e, publish := r.ctx, r.clk, r.e, r.publish
			// Generation 1 refills 10 a minute up to 100; tenant-7 spends it all.
			publish(ledger.Dimension{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: time.Minute})
			r.spend(reserveCmd("all", 100))
			// Generation 2 bursts 50 and never refills; tenant-7 stays away.
			publish(ledger.Dimension{Unit: "tokens", Burst: 50})
			r.comeBackAfterIdle("back") // 50 left behind on generation 1, then drained
			// Now that tenant-7 has moved on, generation 1 holds nothing that can
			// grow: it settles and is not read again.
			clk.Advance(time.Minute)
			e.runEpochs(ctx)
			if v := e.drains.gens[1]; !v.settled {
				t.Fatalf("generation 1, emptied and its subject moved on: %+v, want settled", v)
			}
			auditClean(t, e)
		})
	}
}

// subjectsHookStore runs hook (once) when the drain pager reads the
// accounts of subjects, before the read.
type subjectsHookStore struct {
	store.Store
	hook func()
}

func (s *subjectsHookStore) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, error) {
	if hook := s.hook; hook != nil {
		s.hook = nil
		hook()
	}
	return s.Store.AccountsOfSubjects(ctx, subjects)
}

// The subject may come back between the drain scan's read of its empty
// account and the read that tells whether it moved on: the switch then
// left capacity on the account the scan read empty. The worker must not
// take the account for settled because the subject has moved on.
func TestDrainWorkerFindsCapacityASwitchLeftDuringTheScan(t *testing.T) {
	st := &subjectsHookStore{Store: memstore.New()}
	r := newDrainMemoRig(t, st)
	ctx, clk, e := r.ctx, r.clk, r.e
	r.publish(ledger.Dimension{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: time.Minute})
	r.spend(reserveCmd("all", 100))
	r.publish(ledger.Dimension{Unit: "tokens", Burst: 50})
	clk.Advance(20 * time.Minute)
	// tenant-7 comes back (and spends: room) while the first pass is
	// between its two reads.
	st.hook = func() { r.spend(reserveCmd("back", 50)) }
	e.runEpochs(ctx)
	if st.hook != nil {
		t.Fatal("the pass did not read the subjects' accounts")
	}
	r.waitDrained(ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 1})
	auditClean(t, e)
}

// A key whose only generation was rolled back leaves its subject with
// no deciding policy: the drain worker finds nothing to drain there and
// takes the generation for settled. Publishing the key again adds a key
// to the active generations (none of the others change); the worker
// must read the generation again then, and drain what it holds into the
// new generation without waiting for the subject to come back.
func TestDrainWorkerReadsAgainWhenARolledBackKeyIsPublished(t *testing.T) {
	r := newDrainMemoRig(t, memstore.New())
	ctx, e := r.ctx, r.e
	// Another key stays active throughout: the active set is never empty.
	other := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "embed", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 10}}}.WithDefaults()
	r.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &other})
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	publish := func() {
		p := ledger.Policy{Key: key, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100}}}.WithDefaults()
		r.do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	publish()                       // generation 2
	r.spend(reserveCmd("some", 40)) // 60 stay available
	r.do(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 2})
	e.runEpochs(ctx) // nothing decides for tenant-7: nothing to drain
	r.clk.Advance(time.Minute)
	e.runEpochs(ctx)
	publish() // generation 3 decides again, with room for the 60
	r.waitDrained(ledger.AccountKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu", Generation: 2})
	auditClean(t, e)
}

// A subject's account under a newer generation that was rolled back does
// not mean the subject moved on: the rollback sent it back to the older
// generation's account, which is current again and refills lazily. Once
// a newer generation supersedes that one and the subject comes back, the
// switch leaves there what the new burst has no room for; the worker
// must find it (the account read empty while the subject stayed away).
func TestDrainWorkerFindsCapacityLeftAfterTheSubjectCameBackFromARollback(t *testing.T) {
	r := newDrainMemoRig(t, memstore.New())
	touch := func(id string) { // a reserve and release: switches tenant-7
		r.do(reserveCmd(id, 1))
		r.do(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
	}
	// Generation 1 refills up to 100, one unit every 6 seconds (a refill
	// of a single unit refills too).
	r.publish(ledger.Dimension{Unit: "tokens", Burst: 100, RefillUnits: 1, RefillInterval: 6 * time.Second})
	touch("g1")
	r.publish(ledger.Dimension{Unit: "tokens", Burst: 100}) // generation 2
	touch("g2")                                             // tenant-7 switches to generation 2
	r.do(ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"}, Generation: 2})
	touch("back") // and back to generation 1, which decides again
	r.spend(reserveCmd("all", 100))
	// Generation 3 bursts 50 and never refills; tenant-7 stays away.
	r.publish(ledger.Dimension{Unit: "tokens", Burst: 50})
	r.comeBackAfterIdle("later") // 50 left behind on generation 1, then drained
	auditClean(t, r.e)
}
