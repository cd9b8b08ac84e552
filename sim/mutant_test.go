//go:build capledger_mutants

package sim

import (
	"context"
	"testing"
)

// Each deliberately broken ledger (ledger/mutant_on.go, selected by
// CAPLEDGER_MUTANT in a binary built with -tags capledger_mutants) is caught
// within 10,000 interleavings, by the gate that names its bug, and the
// failing seed replays to the same report. Run it with
//
//	go test -tags capledger_mutants -run TestMutants ./sim/
func TestMutants(t *testing.T) {
	mutants := []struct {
		name string
		gate Gate
	}{
		{"refund_twice", GateDuplicateRefund},
		{"expire_started", GateUnknownAsUnconsumed},
		{"debt_admits", GateAdmissionWhileDebt},
		{"shard_unknown_reminted", GateUnknownAsUnconsumed},
		{"worker_marks_started_unknown", GateUnknownWithoutCause},
		{"refill_half_debt", GateDebtRepaidFirst},
	}
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv("CAPLEDGER_MUTANT", m.name)
			cfg := DefaultConfig()
			var found *Violation
			tried := uint64(0)
			for seed := uint64(1); seed <= 10000 && found == nil; seed++ {
				tried++
				found = RunOne(&cfg, seed).Violation
			}
			if found == nil {
				t.Fatalf("mutant %s survived 10,000 interleavings", m.name)
			}
			if found.Gate != m.gate {
				t.Errorf("mutant %s caught by gate %s, want %s:\n%s", m.name, found.Gate, m.gate, found.Report())
			}
			again := RunOne(&cfg, found.Seed).Violation
			if again == nil || again.Report() != found.Report() {
				t.Fatalf("seed %d does not replay to the same report", found.Seed)
			}
			t.Logf("mutant %s caught after %d interleavings (seed %d, gate %s); replay: %s", m.name, tried, found.Seed, found.Gate, found.Replay)
		})
	}
	// A scheduler given the wrong weight for one tenant is unfair only in
	// the aggregate: each interleaving serves too little to tell (see
	// docs/SIMULATOR.md), so the fairness gate judges it over the run, by
	// weight class, as capledger sim does.
	t.Run("fairness_weight_ignored", func(t *testing.T) {
		t.Setenv("CAPLEDGER_MUTANT", "fairness_weight_ignored")
		cfg := DefaultConfig()
		rep := Run(context.Background(), &cfg, Options{Seed: 1, Interleavings: 3000, MinFires: 0})
		for g := Gate(0); g < numGates; g++ {
			if rep.Gates[g] > 0 {
				t.Errorf("mutant fairness_weight_ignored caught by gate %s (%d interleavings), want only the fairness aggregate", g, rep.Gates[g])
			}
		}
		failures := rep.Fairness.Failures()
		if len(failures) == 0 {
			t.Fatalf("mutant fairness_weight_ignored survived 3,000 interleavings")
		}
		t.Logf("mutant fairness_weight_ignored caught over 3,000 interleavings: %s", failures[0])
	})
	t.Setenv("CAPLEDGER_MUTANT", "")
	cfg := DefaultConfig()
	for seed := uint64(1); seed <= 200; seed++ {
		if v := RunOne(&cfg, seed).Violation; v != nil {
			t.Fatalf("with no mutant selected, the mutant build fails seed %d:\n%s", seed, v.Report())
		}
	}
}
