package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// countedPasses counts DrainProgress passes (each reads the unreconciled
// shards of its one generation once, where the generation has fewer than
// a page)
// and holds each until release is closed, when set, and then for hold
// (so that it is reused for 9 times as long).
type countedPasses struct {
	store.Store
	mu      sync.Mutex
	passes  int
	release chan struct{}
	hold    time.Duration
}

func (s *countedPasses) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	s.mu.Lock()
	s.passes++
	release, hold := s.release, s.hold
	s.mu.Unlock()
	if release != nil {
		<-release
	}
	time.Sleep(hold)
	return s.Store.ShardsUnreconciled(ctx, f)
}

func (s *countedPasses) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.passes
}

func asOfOf(t *testing.T, m map[string]any) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m["asOf"]))
	if err != nil {
		t.Fatalf("asOf of %v: %v", m, err)
	}
	return at
}

// Callers polling the drain of the same generations share one pass
// (saying when it read the accounts) and get it again for a while; a
// call with runDrains gets a pass begun after its drain, and a rollback
// since makes a new pass at once.
func TestDrainProgressSharesOnePass(t *testing.T) {
	passes := &countedPasses{release: make(chan struct{})}
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		passes.Store = st
		return passes
	}})
	policy := `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d"}]}}`
	h.ok("PublishPolicy", fmt.Sprintf(policy, 1000), "")
	h.ok("Reserve", reserveFor("d1", "tenant-a", 10), "")
	h.ok("PublishPolicy", fmt.Sprintf(policy, 2000), "") // generation 2 supersedes 1, whose 990 are left to drain
	const progress = `{"generations":["1"]}`

	readAt := h.clock.Now()
	answers := callersDuringOneComputation(h, passes.count, passes.release, 500*time.Millisecond, func() map[string]any {
		return h.rolloutOK("DrainProgress", progress, "")
	})
	if got := passes.count(); got != 1 {
		t.Fatalf("%d passes for three callers, want one", got)
	}
	for i, a := range answers {
		g := a["generations"].([]any)[0].(map[string]any)
		if !asOfOf(t, a).Equal(readAt) || num(field(g, "available", "tokens")) != 990 || a["drained"] == true {
			t.Errorf("caller %d: %v; want asOf %v and 990 tokens available", i, a, readAt)
		}
	}
	if again := h.rolloutOK("DrainProgress", progress, ""); !asOfOf(t, again).Equal(readAt) || passes.count() != 1 {
		t.Errorf("a poll right after: asOf %v after %d passes; want the shared pass of %v", again["asOf"], passes.count(), readAt)
	}

	passes.mu.Lock()
	passes.hold = 300 * time.Millisecond // the next passes are reused for 2.7 s
	passes.mu.Unlock()
	drainedAt := h.clock.Now()
	drained := h.rolloutOK("DrainProgress", `{"generations":["1"],"runDrains":true}`, "")
	g := drained["generations"].([]any)[0].(map[string]any)
	if passes.count() != 2 || !asOfOf(t, drained).Equal(drainedAt) || num(field(g, "available", "tokens")) != 0 || num(drained["drainCommands"]) != 1 {
		t.Errorf("with runDrains: %v after %d passes; want a pass of its own at %v showing the 990 moved", drained, passes.count(), drainedAt)
	}
	if again := h.rolloutOK("DrainProgress", progress, ""); !asOfOf(t, again).Equal(drainedAt) || passes.count() != 2 {
		t.Errorf("a poll right after the drain: asOf %v after %d passes; want the drain's pass of %v", again["asOf"], passes.count(), drainedAt)
	}

	h.clock.Advance(time.Minute)
	h.rolloutOK("RollbackGenerations", `{"generations":["2"]}`, "")
	rolledBackAt := h.clock.Now()
	after := h.rolloutOK("DrainProgress", progress, "")
	g = after["generations"].([]any)[0].(map[string]any)
	if passes.count() != 3 || !asOfOf(t, after).Equal(rolledBackAt) || g["active"] != true {
		t.Errorf("after rolling generation 2 back: %v after %d passes; want a new pass at %v with generation 1 active", after, passes.count(), rolledBackAt)
	}
}
