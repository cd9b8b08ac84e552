package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A republish replays only when every term is the same: a policy that
// differs from the active generation in any one term (here each in turn)
// is a new generation carrying that term, never a replay that keeps the
// old one. (A planted break, the replay check ignoring the epoch length,
// passed every other test: a changed epochLength was silently dropped.)
func TestRepublishWithAnyTermChangedIsANewGeneration(t *testing.T) {
	edits := []struct {
		term string
		edit func(*ledger.Policy)
		kept func(*ledger.Policy) bool
	}{
		{"epochLength", func(p *ledger.Policy) { p.EpochLength = 2 * time.Hour },
			func(p *ledger.Policy) bool { return p.EpochLength == 2*time.Hour }},
		{"fairnessBudget", func(p *ledger.Policy) { p.FairnessBudget = 0.25 },
			func(p *ledger.Policy) bool { return p.FairnessBudget == 0.25 }},
		{"fairnessWeight", func(p *ledger.Policy) { p.FairnessWeight = 7 },
			func(p *ledger.Policy) bool { return p.FairnessWeight == 7 }},
		{"priority", func(p *ledger.Policy) { p.Priority = 3 },
			func(p *ledger.Policy) bool { return p.Priority == 3 }},
		{"holdTtl", func(p *ledger.Policy) { p.HoldTTL = 45 * time.Second },
			func(p *ledger.Policy) bool { return p.HoldTTL == 45*time.Second }},
		{"executionLimit", func(p *ledger.Policy) { p.ExecutionLimit = time.Minute },
			func(p *ledger.Policy) bool { return p.ExecutionLimit == time.Minute }},
		{"estimatorDigest", func(p *ledger.Policy) { p.EstimatorDigest = "sha256:est-2" },
			func(p *ledger.Policy) bool { return p.EstimatorDigest == "sha256:est-2" }},
		{"emergencyMode", func(p *ledger.Policy) { p.EmergencyMode = !p.EmergencyMode },
			func(p *ledger.Policy) bool { return p.EmergencyMode }},
		{"rollout", func(p *ledger.Policy) { p.Rollout = ledger.RolloutShadow },
			func(p *ledger.Policy) bool { return p.Rollout == ledger.RolloutShadow }},
		{"maxOverdraft", func(p *ledger.Policy) { p.Dimensions[0].MaxOverdraft++ },
			func(p *ledger.Policy) bool { return p.Dimensions[0].MaxOverdraft == 501 }},
	}
	for _, e := range edits {
		t.Run(e.term, func(t *testing.T) {
			c := newChecked(t)
			g1 := c.publish(policyOf(tokens(1000, 100)))
			edited := policyOf(tokens(1000, 100))
			e.edit(edited)
			res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: edited})
			if res.Err != nil || res.Replayed || res.Generation != g1+1 {
				t.Fatalf("republish with %s changed: generation %d, replayed %v, err %v; want generation %d, not a replay", e.term, res.Generation, res.Replayed, res.Err, g1+1)
			}
			active, ok := ledger.ActivePolicy(c.m, testSubject)
			if !ok || active.Generation != g1+1 || !e.kept(active) {
				t.Fatalf("active policy after the republish: %+v, want generation %d with the new %s", active, g1+1, e.term)
			}
		})
	}
}
