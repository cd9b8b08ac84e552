package server

import "testing"

// The decision counters are forgotten as their generations leave recent
// when a generation not counted before decides, not only when GetOverview
// reads them: a server whose overview nobody reads keeps the counters of
// each key's recent generations, not of every generation that ever
// decided (consoleCounters).
func TestDecisionCountersForgetWithoutAnOverview(t *testing.T) {
	newest := uint64(0)
	c := &consoleCounters{recent: func(generation uint64) bool { return generation+2 > newest }}
	for newest = 1; newest <= 100; newest++ {
		c.decision(newest, "admitted")
		c.decision(newest, "rejected")
	}
	kept := map[uint64]int{}
	c.decisions.Range(func(k, _ any) bool {
		kept[k.(decisionKey).generation]++
		return true
	})
	if len(kept) > 2 {
		t.Fatalf("counters of %d generations kept after 100 generations decided (%v), want the 2 recent ones", len(kept), kept)
	}
}
