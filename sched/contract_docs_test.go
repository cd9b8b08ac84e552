package sched_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/capledger/capledger/sched"
)

// docs/FAIRNESS.md read as a contract, through the package's public API
// only: five tenants of different weights, every one backlogged, wrong
// estimates corrected by settles, four in flight. The page promises
// RFE(W) <= (M + 3·c·E)·(1/w_i + 1/w_j) for every pair, e_i within the
// default budget over a long window, and Snapshot's figures computed by
// its own formulas (A_i = S_i/C, F_i = w_i/Σw when all are backlogged,
// e_i = |A_i - F_i|/F_i).
func TestContractFiveWeightedTenantsWithinBudget(t *testing.T) {
	weights := map[string]int64{"t1": 1, "t2": 2, "t3": 3, "t5": 5, "t8": 8}
	names := []string{"t1", "t2", "t3", "t5", "t8"}
	const inFlight = 4
	meter := sched.NewMeter()
	s, err := sched.New(sched.Config{MaxQueuePerTenant: 8, Meter: meter})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := s.SetTenant(n, weights[n], 0); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(8, 8))
	estimates := map[string]int64{}
	next := 0
	enqueue := func(tenant string) {
		next++
		id := fmt.Sprintf("%s-%d", tenant, next)
		g := 50 + rng.Int64N(101) // 50..150
		estimates[id] = g
		if err := s.Enqueue(sched.Request{ReservationID: id, Tenant: tenant, EstimatedCost: g}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		for range 8 {
			enqueue(n)
		}
	}
	var running []sched.Request
	var maxEst, maxErr int64
	step := func() {
		for len(running) < inFlight {
			r, ok := s.Dispatch()
			if !ok {
				t.Fatal("Dispatch returned nothing with every tenant backlogged (not work-conserving)")
			}
			running = append(running, r)
			enqueue(r.Tenant) // keep every queue full: all backlogged
		}
		i := rng.IntN(len(running))
		r := running[i]
		running = append(running[:i], running[i+1:]...)
		g := estimates[r.ReservationID]
		actual := g * (5 + rng.Int64N(11)) / 10 // 0.5x..1.5x the estimate
		maxEst = max(maxEst, g)
		maxErr = max(maxErr, absInt(g-actual))
		if err := s.Settle(r.ReservationID, actual); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 { // warm up, then measure one long window
		step()
	}
	meter.StartWindow()
	for range 20000 {
		step()
	}

	// The bound for the worst pair, the lightest two weights.
	m, e := float64(maxEst), float64(maxErr)
	bound := (m + 3*inFlight*e) * (1.0/1 + 1.0/2)
	if rfe := meter.RFE(); rfe > bound {
		t.Errorf("RFE %.1f above docs/FAIRNESS.md's bound (M + 3·c·E)·(1/w_i + 1/w_j) = %.1f", rfe, bound)
	}

	snap := meter.Snapshot()
	if len(snap) != len(names) {
		t.Fatalf("Snapshot has %d tenants, want %d", len(snap), len(names))
	}
	var total, sumW int64
	for _, f := range snap {
		total += f.Served
		sumW += f.Weight
	}
	for _, f := range snap {
		if !f.Backlogged {
			t.Errorf("%s not backlogged, though its queue was never empty", f.Tenant)
		}
		if f.Weight != weights[f.Tenant] {
			t.Errorf("%s weight %d, declared %d", f.Tenant, f.Weight, weights[f.Tenant])
		}
		share := float64(f.Served) / float64(total)
		fair := float64(f.Weight) / float64(sumW)
		ei := math.Abs(share-fair) / fair
		if math.Abs(f.Share-share) > 1e-9 || math.Abs(f.FairShare-fair) > 1e-9 || math.Abs(f.Error-ei) > 1e-9 {
			t.Errorf("%s: Snapshot share %.6f fair %.6f error %.6f; the page's formulas give %.6f %.6f %.6f",
				f.Tenant, f.Share, f.FairShare, f.Error, share, fair, ei)
		}
		if ei > sched.DefaultFairnessBudget {
			t.Errorf("%s (weight %d): e_i %.4f above the default budget %.2f (share %.4f, fair %.4f)",
				f.Tenant, f.Weight, ei, sched.DefaultFairnessBudget, share, fair)
		}
	}
}

// docs/FAIRNESS.md, "Bounded wait": with exact estimates, a request
// enqueued at position p of its tenant's queue waits at most
// p·L·W/w_i + (N − 1)·max(Q, L) of cost dispatched in its level. Four
// tenants keep two requests queued; a light one comes back now and then
// with a burst of 64 (it was idle, so it brings back at most one quantum
// of credit). Every request's wait is checked, the heavy tenants' too.
func TestContractBoundedWaitWithBursts(t *testing.T) {
	weights := map[string]int64{"light": 1, "a": 3, "b": 5, "c": 8, "d": 8}
	const burst, quantum, largest = 64, 200, 120
	s, err := sched.New(sched.Config{MaxQueuePerTenant: burst, Quantum: quantum})
	if err != nil {
		t.Fatal(err)
	}
	var sumW int64
	for n, w := range weights {
		sumW += w
		if err := s.SetTenant(n, w, 0); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(3, 5))
	type waiting struct {
		tenant   string
		pos      int64
		costSeen int64
	}
	waits := map[string]*waiting{}
	next := 0
	enqueue := func(tenant string) {
		next++
		id := fmt.Sprintf("%s-%d", tenant, next)
		cost := 10 + rng.Int64N(largest-9) // 10..largest
		if err := s.Enqueue(sched.Request{ReservationID: id, Tenant: tenant, EstimatedCost: cost}); err != nil {
			t.Fatal(err)
		}
		waits[id] = &waiting{tenant: tenant, pos: int64(s.QueueLen(tenant))}
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		enqueue(n)
		enqueue(n)
	}
	bursts := 0
	for round := range 20000 {
		if round%300 == 0 && s.QueueLen("light") == 0 {
			bursts++
			for range burst {
				enqueue("light")
			}
		}
		r, ok := s.Dispatch()
		if !ok {
			t.Fatal("nothing dispatched with work queued")
		}
		w := waits[r.ReservationID]
		delete(waits, r.ReservationID)
		bound := w.pos*largest*sumW/weights[w.tenant] + int64(len(weights)-1)*max(quantum, largest)
		if w.costSeen > bound {
			t.Errorf("%s (position %d, weight %d) waited %d cost units, above the bound p·L·W/w_i + (N−1)·max(Q, L) = %d",
				r.ReservationID, w.pos, weights[w.tenant], w.costSeen, bound)
		}
		for _, o := range waits {
			o.costSeen += r.EstimatedCost
		}
		if err := s.Settle(r.ReservationID, r.EstimatedCost); err != nil { // exact estimates
			t.Fatal(err)
		}
		if r.Tenant != "light" {
			enqueue(r.Tenant)
		}
	}
	if bursts < 5 {
		t.Fatalf("only %d bursts: the light tenant never came back idle often enough to test its credit", bursts)
	}
}

func absInt(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
