package ledger_test

import (
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// TestDecidingGeneration checks the one rule for which generation decides
// for a subject, twice per case: through the policy heads the ledger's
// commands keep (ActivePolicy) and through ActiveGenerations built from the
// policy rows alone (what the engine, server and simulator read). Each
// step publishes (a key) or rolls back (a generation); generations are
// numbered from 1 in publication order.
func TestDecidingGeneration(t *testing.T) {
	own := ledger.PolicyKey{Subject: "tenant-1", Route: "chat", Region: "eu"}
	other := ledger.PolicyKey{Subject: "tenant-2", Route: "chat", Region: "eu"}
	anyChat := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat", Region: "eu"}
	anyOtherRoute := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "embed", Region: "eu"}
	anyOtherRegion := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat", Region: "us"}
	type step struct {
		publish  ledger.PolicyKey
		rollback uint64
	}
	pub := func(k ledger.PolicyKey) step { return step{publish: k} }
	rb := func(g uint64) step { return step{rollback: g} }
	cases := []struct {
		name    string
		steps   []step
		subject ledger.PolicyKey
		want    uint64 // 0: none decides
	}{
		{"nothing published", nil, own, 0},
		{"own key", []step{pub(own)}, own, 1},
		{"newest own generation", []step{pub(own), pub(own)}, own, 2},
		{"star fallback", []step{pub(anyChat)}, own, 1},
		{"own beats star published later", []step{pub(own), pub(anyChat)}, own, 1},
		{"own beats star published earlier", []step{pub(anyChat), pub(own)}, own, 2},
		{"another subject's policy does not decide", []step{pub(other)}, own, 0},
		{"another subject's policy, star decides", []step{pub(other), pub(anyChat)}, own, 2},
		{"star of another route does not decide", []step{pub(anyOtherRoute)}, own, 0},
		{"star of another region does not decide", []step{pub(anyOtherRegion)}, own, 0},
		{"rolled back newest: the earlier live one", []step{pub(own), pub(own), rb(2)}, own, 1},
		{"rolled back older: newest stays", []step{pub(own), pub(own), rb(1)}, own, 2},
		{"all own rolled back: star", []step{pub(anyChat), pub(own), rb(2)}, own, 1},
		{"all own rolled back, no star: none", []step{pub(own), rb(1)}, own, 0},
		{"star rolled back to its earlier generation", []step{pub(anyChat), pub(anyChat), rb(2)}, own, 1},
		{"star all rolled back: none", []step{pub(anyChat), rb(1)}, own, 0},
		{"republished after rollback", []step{pub(own), rb(1), pub(own)}, own, 2},
		{"star key itself", []step{pub(own), pub(anyChat)}, anyChat, 2},
		{"star key itself has no fallback", []step{pub(own)}, anyChat, 0},
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := ledger.NewMemory()
			published := 0
			for _, s := range tc.steps {
				var res ledger.Result
				if s.rollback != 0 {
					p, ok := m.Policy(s.rollback)
					if !ok {
						t.Fatalf("no generation %d to roll back", s.rollback)
					}
					res = ledger.Apply(m, &ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: s.rollback}, now)
				} else {
					// Distinct terms each time, so every publish is a new generation.
					published++
					p := ledger.Policy{Key: s.publish, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: ledger.Units(100 + published)}}}.WithDefaults()
					res = ledger.Apply(m, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}, now)
				}
				if res.Err != nil {
					t.Fatalf("step %+v: %v", s, res.Err)
				}
			}
			var rows []ledger.Policy
			for g := uint64(1); ; g++ {
				p, ok := m.Policy(g)
				if !ok {
					break
				}
				rows = append(rows, *p)
			}
			got, ok := ledger.NewActiveGenerations(rows).Deciding(tc.subject)
			if ok != (tc.want != 0) || got != tc.want {
				t.Errorf("from the policy rows: generation %d (%v), want %d", got, ok, tc.want)
			}
			// The rows in any order (a cache takes them in as they come).
			slices.Reverse(rows)
			if got, ok := ledger.NewActiveGenerations(rows).Deciding(tc.subject); ok != (tc.want != 0) || got != tc.want {
				t.Errorf("from the policy rows newest first: generation %d (%v), want %d", got, ok, tc.want)
			}
			p, ok := ledger.ActivePolicy(m, tc.subject)
			var fromHeads uint64
			if ok {
				fromHeads = p.Generation
			}
			if fromHeads != tc.want {
				t.Errorf("from the policy heads: generation %d, want %d", fromHeads, tc.want)
			}
		})
	}
}
