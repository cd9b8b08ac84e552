package sched

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"pgregory.net/rapid"
)

// forgottenSeen counts, over every case of the property below, the checks
// at which the forgetting scheduler held fewer tenants than the one that
// keeps everything, so the property is known not to hold vacuously.
var forgottenSeen int

// Forgetting idle tenants never changes what the Scheduler does: the same
// random calls (weights, priorities, quantum, both modes, wrong estimates,
// policy changes, clock rebases) given to a Scheduler that forgets and to
// one that keeps every tenant give the same outcome for every call and the
// same dispatch order. With ForgetDeclarations the caller declares before
// every Enqueue, as client.FairQueue does.
func TestPropertyForgettingKeepsDispatchOrder(t *testing.T) {
	forgottenSeen = 0
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Quantum:            rapid.Int64Range(0, 300).Draw(t, "quantum"),
			MaxQueuePerTenant:  rapid.IntRange(1, 6).Draw(t, "maxQueue"),
			PriorityMode:       rapid.SampledFrom([]PriorityMode{PriorityWeighted, PriorityStrict}).Draw(t, "mode"),
			ForgetDeclarations: rapid.Bool().Draw(t, "forgetDeclarations"),
		}
		forgets, keeps := mustNew(t, cfg), mustNew(t, cfg)
		keeps.keepIdle = true
		if rapid.Bool().Draw(t, "rebaseOften") {
			forgets.rebaseAt, keeps.rebaseAt = 2000*VirtualScale, 2000*VirtualScale
		}
		both := []*Scheduler{forgets, keeps}
		capacity := rapid.IntRange(1, 4).Draw(t, "capacity")
		nTenants := rapid.IntRange(1, 12).Draw(t, "tenants")
		weight, priority := make([]int64, nTenants), make([]int, nTenants)
		declare := func(t *rapid.T, i int) {
			for _, s := range both {
				mustSetTenant(t, s, tenantName(i), weight[i], priority[i])
			}
		}
		for i := range nTenants {
			weight[i], priority[i] = rapid.Int64Range(1, 8).Draw(t, "weight"), rapid.IntRange(0, 2).Draw(t, "priority")
			declare(t, i)
		}
		var inflight []string
		nextID := 0
		t.Repeat(map[string]func(*rapid.T){
			"": func(t *rapid.T) {
				if forgets.Len() != keeps.Len() || forgets.InFlight() != keeps.InFlight() {
					t.Fatalf("Len %d/%d, InFlight %d/%d (forgetting/keeping)", forgets.Len(), keeps.Len(), forgets.InFlight(), keeps.InFlight())
				}
				if len(forgets.tenants) < len(keeps.tenants) {
					forgottenSeen++
				}
			},
			"enqueue": func(t *rapid.T) {
				i := rapid.IntRange(0, nTenants-1).Draw(t, "tenant")
				if cfg.ForgetDeclarations || rapid.Bool().Draw(t, "redeclare") {
					declare(t, i)
				}
				r := Request{ReservationID: strconv.Itoa(nextID), Tenant: tenantName(i), EstimatedCost: rapid.Int64Range(1, 300).Draw(t, "cost")}
				errF, errK := forgets.Enqueue(r), keeps.Enqueue(r)
				if errF != errK {
					t.Fatalf("Enqueue(%+v) = %v forgetting, %v keeping", r, errF, errK)
				}
				if errF == nil {
					nextID++
				}
			},
			"dispatch": func(t *rapid.T) {
				if len(inflight) >= capacity {
					t.Skip("backend full")
				}
				rF, okF := forgets.Dispatch()
				rK, okK := keeps.Dispatch()
				if okF != okK || rF.ReservationID != rK.ReservationID {
					t.Fatalf("Dispatch = %q, %v forgetting; %q, %v keeping", rF.ReservationID, okF, rK.ReservationID, okK)
				}
				if okF {
					inflight = append(inflight, rF.ReservationID)
				}
			},
			"settle": func(t *rapid.T) {
				if len(inflight) == 0 {
					t.Skip("nothing in flight")
				}
				k := rapid.IntRange(0, len(inflight)-1).Draw(t, "which")
				id := inflight[k]
				inflight = append(inflight[:k], inflight[k+1:]...)
				// Actual costs from 0 to 3x the largest estimate: some
				// tenants end up ahead of the clock.
				actual := rapid.Int64Range(0, 900).Draw(t, "actual")
				for _, s := range both {
					if err := s.Settle(id, actual); err != nil {
						t.Fatalf("Settle(%s, %d) = %v", id, actual, err)
					}
				}
			},
			"policy change": func(t *rapid.T) {
				i := rapid.IntRange(0, nTenants-1).Draw(t, "tenant")
				weight[i], priority[i] = rapid.Int64Range(1, 8).Draw(t, "weight"), rapid.IntRange(0, 2).Draw(t, "priority")
				declare(t, i)
			},
		})
	})
	if forgottenSeen == 0 {
		t.Fatal("no case forgot a tenant: the property was checked on nothing")
	}
}

// scenarioRun is what a scenario did on one Scheduler: the tenants in the
// order they were dispatched (or the part of it the test compares), and
// whatever else the test looked at on the way.
type scenarioRun[Seen any] struct {
	order []string
	seen  Seen
}

// forgettingKeepsOrder runs scenario on a Scheduler made from cfg that
// forgets idle tenants once the clock has passed them, then on one made
// from cfg that keeps every tenant, and fails the test (and goes on) unless
// both dispatched in the same order: forgetting must never change what the
// Scheduler does. It returns both runs for the checks that are each test's
// own.
func forgettingKeepsOrder[Seen any](t *testing.T, cfg Config, scenario func(s *Scheduler) scenarioRun[Seen]) (forgetting, keeping scenarioRun[Seen]) {
	t.Helper()
	run := func(keepIdle bool) scenarioRun[Seen] {
		s := mustNew(t, cfg)
		s.keepIdle = keepIdle
		return scenario(s)
	}
	forgetting, keeping = run(false), run(true)
	if !reflect.DeepEqual(forgetting.order, keeping.order) {
		t.Errorf("dispatch order with forgetting differs from the scheduler that keeps every tenant:\n forgetting %v\n keeping    %v", forgetting.order, keeping.order)
	}
	return forgetting, keeping
}

// dispatchAndSettle dispatches the next request and settles it at its
// estimate.
func dispatchAndSettle(t *testing.T, s *Scheduler) Request {
	t.Helper()
	r := mustDispatch(t, s)
	if err := s.Settle(r.ReservationID, r.EstimatedCost); err != nil {
		t.Fatal(err)
	}
	return r
}

// dispatchAll dispatches and settles (at its estimate) every queued
// request and returns their tenants in dispatch order.
func dispatchAll(t *testing.T, s *Scheduler) []string {
	t.Helper()
	var tenants []string
	for s.Len() > 0 {
		tenants = append(tenants, dispatchAndSettle(t, s).Tenant)
	}
	return tenants
}

// aheadOfTheClock is the start of the scenarios of tenant a coming back
// ahead of the clock: a and b at weight 1, and a served once with a
// request estimated at 10 that costs 1000, so its virtual time moves 990
// cost units past where it started, far ahead of the clock.
type aheadOfTheClock struct {
	t     *testing.T
	s     *Scheduler
	nextB int
	// order is the tenant of every request serve dispatched.
	order []string
}

func startAheadOfTheClock(t *testing.T, s *Scheduler) *aheadOfTheClock {
	t.Helper()
	mustSetTenant(t, s, "a", 1, 0)
	mustSetTenant(t, s, "b", 1, 0)
	mustEnqueue(t, s, "a-1", "a", 10)
	if err := s.Settle(mustDispatch(t, s).ReservationID, 1000); err != nil {
		t.Fatal(err)
	}
	return &aheadOfTheClock{t: t, s: s}
}

// serve dispatches n requests, each time first topping b's queue up to 4
// requests of cost 10, and settles each at its estimate: b alone moves
// the clock 10 per dispatch.
func (sc *aheadOfTheClock) serve(n int) {
	sc.t.Helper()
	for range n {
		for sc.s.QueueLen("b") < 4 {
			mustEnqueue(sc.t, sc.s, fmt.Sprint("b-", sc.nextB), "b", 10)
			sc.nextB++
		}
		sc.order = append(sc.order, dispatchAndSettle(sc.t, sc.s).Tenant)
	}
}

// A tenant idle but ahead of its level's clock (a settle charged it more
// than its estimate) is kept until the clock passes it, so leaving and
// coming back gains it nothing: it waits behind the other tenant exactly as
// long as it would had it never left. Once the clock has passed it, it is
// forgotten without any call of its own.
func TestIdleTenantAheadOfTheClockIsKept(t *testing.T) {
	type seen struct{ heldWhileAhead, forgottenAfter bool }
	forgetting, _ := forgettingKeepsOrder(t, Config{MaxQueuePerTenant: 4}, func(s *Scheduler) (run scenarioRun[seen]) {
		ahead := startAheadOfTheClock(t, s)
		// b alone moves the clock 10 per dispatch, to 510: many sweeps
		// later, a is still ahead.
		ahead.serve(50)
		run.seen.heldWhileAhead = s.tenants["a"] != nil
		// a comes back: its request finishes at 1010, so b goes first
		// until its own finish times reach 1010.
		mustEnqueue(t, s, "a-2", "a", 10)
		ahead.serve(60)
		// The clock is now past a (at 1010): a few sweeps forget it.
		ahead.serve(4)
		run.seen.forgottenAfter = s.tenants["a"] == nil
		run.order = ahead.order
		return run
	})
	if !forgetting.seen.heldWhileAhead {
		t.Error("a, idle 490 cost units ahead of the clock, was forgotten")
	}
	bBeforeA := 0
	for _, tenant := range forgetting.order[50:] {
		if tenant == "a" {
			break
		}
		bBeforeA++
	}
	// b's finish times from 520 up to 1000 come before a's 1010: 49
	// dispatches (at 1010, a's request is the earlier enqueued). Had a
	// been forgotten, it would restart at the clock and come second.
	if bBeforeA != 49 {
		t.Errorf("a came back and was served after %d dispatches of b, want 49 (it had used 990 cost units more than b)", bBeforeA)
	}
	if !forgetting.seen.forgottenAfter {
		t.Error("a was still held after the clock passed it")
	}
}

// The declaration SetTenant made outlives the tenant's state by default
// (Enqueue needs no new SetTenant, and the weight still applies), and dies
// with it under ForgetDeclarations (Enqueue answers ErrUnknownTenant until
// SetTenant declares it again; the caller declares before each Enqueue).
func TestDeclarationLifetime(t *testing.T) {
	for _, forgetDeclarations := range []bool{false, true} {
		s := mustNew(t, Config{MaxQueuePerTenant: 16, ForgetDeclarations: forgetDeclarations})
		weights := map[string]int64{"heavy": 3, "light": 1}
		enqueue := func(id, tenant string) {
			t.Helper()
			if forgetDeclarations || s.tenants[tenant] == nil && id == tenant+"-0" {
				mustSetTenant(t, s, tenant, weights[tenant], 0)
			}
			mustEnqueue(t, s, id, tenant, 10)
		}
		enqueue("heavy-0", "heavy")
		if err := s.Settle(mustDispatch(t, s).ReservationID, 10); err != nil {
			t.Fatal(err)
		}
		// light's calls move the clock past heavy and sweep it away.
		for i := range 4 {
			enqueue(fmt.Sprint("light-", i), "light")
			if err := s.Settle(mustDispatch(t, s).ReservationID, 10); err != nil {
				t.Fatal(err)
			}
		}
		if s.tenants["heavy"] != nil {
			t.Fatalf("forgetDeclarations=%v: heavy, idle behind the clock, is still held", forgetDeclarations)
		}
		err := s.Enqueue(Request{ReservationID: "heavy-1", Tenant: "heavy", EstimatedCost: 10})
		if forgetDeclarations {
			if err != ErrUnknownTenant {
				t.Fatalf("Enqueue of a forgotten tenant with ForgetDeclarations = %v, want ErrUnknownTenant", err)
			}
			mustSetTenant(t, s, "heavy", 3, 0)
			err = s.Enqueue(Request{ReservationID: "heavy-1", Tenant: "heavy", EstimatedCost: 10})
		}
		if err != nil {
			t.Fatalf("forgetDeclarations=%v: Enqueue of a forgotten, declared tenant = %v", forgetDeclarations, err)
		}
		for i := 2; i < 16; i++ {
			enqueue(fmt.Sprint("heavy-", i), "heavy")
			enqueue(fmt.Sprint("light-", i+10), "light")
		}
		count := map[string]int{}
		for range 16 {
			count[mustDispatch(t, s).Tenant]++
		}
		if count["heavy"] != 12 || count["light"] != 4 {
			t.Errorf("forgetDeclarations=%v: after coming back, heavy (weight 3) and light (1) got %v of 16 dispatches, want 12:4", forgetDeclarations, count)
		}
	}
}

// heapBytes is the live heap after a collection.
func heapBytes() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// A million distinct tenants, each declared, enqueued, dispatched and
// settled once (weights 1..8, actual costs 0..3x the estimate, so some end
// ahead of the clock for a while), leave the Scheduler holding a bounded
// number of tenants; the bytes left behind per tenant are logged (go test
// -run TestMillionOneShotTenants -v ./sched/). Without ForgetDeclarations
// only the declarations remain.
func TestMillionOneShotTenants(t *testing.T) {
	n := 1_000_000
	if raceEnabled {
		n = 100_000 // the race detector makes each call ~10x slower
	}
	for _, forgetDeclarations := range []bool{true, false} {
		t.Run(fmt.Sprint("ForgetDeclarations=", forgetDeclarations), func(t *testing.T) {
			before := heapBytes()
			s := mustNew(t, Config{ForgetDeclarations: forgetDeclarations})
			maxHeld := 0
			for i := range n {
				name := "tenant-" + strconv.Itoa(i)
				mustSetTenant(t, s, name, int64(1+i%8), 0)
				estimate := int64(50 + (i*31)%200)
				mustEnqueue(t, s, name, name, estimate)
				r := mustDispatch(t, s)
				if err := s.Settle(r.ReservationID, estimate*int64(i%31)/10); err != nil {
					t.Fatal(err)
				}
				maxHeld = max(maxHeld, len(s.tenants))
			}
			perTenant := float64(heapBytes()-before) / float64(n)
			runtime.KeepAlive(s)
			t.Logf("%d tenants: at most %d held at once, %d at the end; %.1f bytes per tenant left on the heap", n, maxHeld, len(s.tenants), perTenant)
			// A tenant ends at most 2x249/1 cost units ahead; the clock
			// moves at least 50/8 per dispatch: it passes within 80
			// tenants, and the sweep finds it within a few more calls.
			if maxHeld > 200 {
				t.Errorf("held up to %d tenants at once, want at most 200", maxHeld)
			}
			limit := 8.0
			if !forgetDeclarations {
				limit = 120 // a declaration: 16 bytes, the map's slot and the name
			}
			if perTenant > limit {
				t.Errorf("%.1f bytes per tenant left after %d one-shot tenants, want at most %.0f", perTenant, n, limit)
			}
		})
	}
}

// What grows with what, logged for docs/FAIRNESS.md (go test -run
// TestMemoryFollowsTenantsInUse -v ./sched/): bytes per tenant with one
// request queued, per further queued request, and what is left once all
// are dispatched and settled: the tenants are forgotten and their memory,
// the map's included, is given back.
func TestMemoryFollowsTenantsInUse(t *testing.T) {
	const perTenant = 4
	n := int64(100_000)
	if raceEnabled {
		n = 20_000
	}
	before := heapBytes()
	s := mustNew(t, Config{MaxQueuePerTenant: perTenant, ForgetDeclarations: true})
	names := make([]string, n)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
	}
	namesBytes := heapBytes() - before
	enqueue := func(k int) {
		for i, name := range names {
			mustSetTenant(t, s, name, int64(1+i%8), 0)
			if err := s.Enqueue(Request{ReservationID: name + "/" + strconv.Itoa(k), Tenant: name, EstimatedCost: 100}); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := heapBytes()
	enqueue(0)
	oneQueued := heapBytes()
	for k := 1; k < perTenant; k++ {
		enqueue(k)
	}
	allQueued := heapBytes()
	if int64(len(s.tenants)) != n {
		t.Fatalf("%d tenants held with requests queued, want %d", len(s.tenants), n)
	}
	for s.Len() > 0 {
		r := mustDispatch(t, s)
		if err := s.Settle(r.ReservationID, r.EstimatedCost); err != nil {
			t.Fatal(err)
		}
	}
	drained := heapBytes()
	runtime.KeepAlive(names)
	runtime.KeepAlive(s)
	t.Logf("names %d bytes each (the caller's, not counted below)", namesBytes/n)
	t.Logf("tenant with 1 request queued: %d bytes (request ids included)", (oneQueued-base)/n)
	t.Logf("each further queued request: %d bytes (request ids included)", (allQueued-oneQueued)/(n*(perTenant-1)))
	t.Logf("after dispatching and settling all: %d tenants held, %d bytes left per tenant", len(s.tenants), (drained-base)/n)
	if len(s.tenants) > sweepPerCall {
		t.Errorf("%d tenants held after all settled behind the clock, want at most %d", len(s.tenants), sweepPerCall)
	}
	if left := (drained - base) / n; left > 8 {
		t.Errorf("%d bytes per tenant left after all were forgotten, want at most 8", left)
	}
}

// A tenant the scheduler forgot and one it kept must come back alike after
// a policy moves them to another priority and then changes their weight
// (rapid seed 15949225870294582765 of the property above). x is served once
// at priority 0, goes idle and falls behind that level's clock, so the
// forgetting scheduler drops it. The policy then moves x to priority 1 at
// weight 3 and changes it to weight 1 there; x comes back with 10 requests
// of cost 10 while b, weight 1, has 10 of its own queued at priority 1.
// x has its whole credit at every step, so to the scheduler it is a new
// tenant: it returns one quantum (100) behind the clock at weight 1, and its
// requests finishing at the clock - 90 … clock all come before b's next,
// at the clock + 10. An x that carried the credit of weight 3 (a third of
// a quantum) would come back only 4 requests ahead of b. Both
// ForgetDeclarations settings, the first with the declarations kept, the
// second declaring right before each Enqueue.
func TestRedeclaredIdleTenantGetsANewTenantsCredit(t *testing.T) {
	type seen struct{ xForgotten bool }
	for _, forgetDeclarations := range []bool{false, true} {
		t.Run(fmt.Sprint("ForgetDeclarations=", forgetDeclarations), func(t *testing.T) {
			cfg := Config{Quantum: 100, MaxQueuePerTenant: 16, PriorityMode: PriorityStrict, ForgetDeclarations: forgetDeclarations}
			forgetting, keeping := forgettingKeepsOrder(t, cfg, func(s *Scheduler) (run scenarioRun[seen]) {
				mustSetTenant(t, s, "x", 1, 0)
				mustEnqueue(t, s, "x-0", "x", 10)
				dispatchAndSettle(t, s)
				// a moves priority 0's clock far past x (and its sweeps
				// forget x); b sets priority 1's clock.
				for i := range 6 {
					mustSetTenant(t, s, "a", 1, 0)
					mustEnqueue(t, s, fmt.Sprint("a-", i), "a", 100)
					dispatchAndSettle(t, s)
				}
				for i := range 3 {
					mustSetTenant(t, s, "b", 1, 1)
					mustEnqueue(t, s, fmt.Sprint("b-", i), "b", 50)
					dispatchAndSettle(t, s)
				}
				run.seen.xForgotten = s.tenants["x"] == nil
				mustSetTenant(t, s, "x", 3, 1)
				mustSetTenant(t, s, "x", 1, 1)
				for i := range 10 {
					mustSetTenant(t, s, "b", 1, 1)
					mustEnqueue(t, s, fmt.Sprint("b-", 3+i), "b", 10)
				}
				for i := range 10 {
					mustSetTenant(t, s, "x", 1, 1)
					mustEnqueue(t, s, fmt.Sprint("x-", 1+i), "x", 10)
				}
				run.order = dispatchAll(t, s)
				return run
			})
			if !forgetting.seen.xForgotten || keeping.seen.xForgotten {
				t.Fatalf("x forgotten: %v by the forgetting scheduler (want true), %v by the keeping one (want false)", forgetting.seen.xForgotten, keeping.seen.xForgotten)
			}
			for name, order := range map[string][]string{"forgetting": forgetting.order, "keeping": keeping.order} {
				xFirst := 0
				for _, tenant := range order {
					if tenant != "x" {
						break
					}
					xFirst++
				}
				if xFirst != 10 {
					t.Errorf("%s: x came back with %d dispatches before b's next, want 10 (a new tenant's quantum of 100 at weight 1): %v", name, xFirst, order)
				}
			}
		})
	}
}

// A new weight does not wipe what an idle tenant was charged: only an idle
// tenant with its whole credit is a new tenant to SetTenant. a starts as a
// new tenant (one quantum, 100, behind the clock at 0) and its request
// estimated at 10 costs 1000: it ends at 900, ahead of the clock. b, new
// too, moves the clock to 400 in 50 dispatches; a goes to weight 2 while
// idle and comes back: its request finishes at 900 + 10/2, so b's requests
// finishing at 410 … 900 (50) still come first, with or without forgetting.
// Had the weight change made a a new tenant, it would go first.
func TestWeightChangeKeepsAnIdleTenantsCharge(t *testing.T) {
	forgetting, _ := forgettingKeepsOrder(t, Config{Quantum: 100, MaxQueuePerTenant: 4}, func(s *Scheduler) scenarioRun[struct{}] {
		ahead := startAheadOfTheClock(t, s)
		ahead.serve(50)
		mustSetTenant(t, s, "a", 2, 0)
		mustEnqueue(t, s, "a-2", "a", 10)
		ahead.serve(60)
		return scenarioRun[struct{}]{order: ahead.order[50:]}
	})
	bBeforeA := slices.Index(forgetting.order, "a")
	if bBeforeA != 50 {
		t.Errorf("a, 900 cost units ahead, went to weight 2 and came back after %d dispatches of b, want 50 (its charge kept)", bBeforeA)
	}
}

// The same defect by way of a clock rebase: rebaseLevel raises an idle
// tenant far behind the clock to a new tenant's credit at its weight (3
// here), and a weight change right after (to 1) must then give it a new
// tenant's credit at weight 1, as the forgetting scheduler, which dropped
// x before the rebase, gives it when x comes back. b's 22nd request moves
// the clock past rebaseAt (2000), so the level is rebased to 0; x then
// comes back with 10 requests of cost 10 behind 10 of b's, and goes first
// with all of them (finishing at -90 … 0, b's next at 10).
func TestRebasedIdleTenantGetsANewTenantsCredit(t *testing.T) {
	type seen struct{ xForgotten bool }
	cfg := Config{Quantum: 100, MaxQueuePerTenant: 16, PriorityMode: PriorityStrict}
	forgetting, keeping := forgettingKeepsOrder(t, cfg, func(s *Scheduler) (run scenarioRun[seen]) {
		s.rebaseAt = 2000 * VirtualScale
		mustSetTenant(t, s, "x", 3, 0)
		mustSetTenant(t, s, "b", 1, 0)
		mustEnqueue(t, s, "x-0", "x", 10)
		dispatchAndSettle(t, s)
		for i := range 22 {
			mustEnqueue(t, s, fmt.Sprint("b-", i), "b", 100)
			dispatchAndSettle(t, s)
		}
		if s.levels[0].clock != 0 {
			t.Fatalf("clock at %d after b's 22nd dispatch, want 0 (rebased)", s.levels[0].clock)
		}
		run.seen.xForgotten = s.tenants["x"] == nil
		mustSetTenant(t, s, "x", 1, 0)
		for i := range 10 {
			mustEnqueue(t, s, fmt.Sprint("b-", 22+i), "b", 10)
		}
		for i := range 10 {
			mustEnqueue(t, s, fmt.Sprint("x-", 1+i), "x", 10)
		}
		run.order = dispatchAll(t, s)
		return run
	})
	if !forgetting.seen.xForgotten || keeping.seen.xForgotten {
		t.Fatalf("x forgotten: %v by the forgetting scheduler (want true), %v by the keeping one (want false)", forgetting.seen.xForgotten, keeping.seen.xForgotten)
	}
	if xFirst := slices.Index(keeping.order, "b"); xFirst != 10 {
		t.Errorf("kept x came back with %d dispatches before b's next, want 10 (a new tenant's quantum of 100 at weight 1): %v", xFirst, keeping.order)
	}
}
