package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// publishingPasses, once armed, runs publish during each DrainProgress
// pass (at its read of the generation's unreconciled shards, after its
// accounts): another operator publishing under the key all the while.
type publishingPasses struct {
	store.Store
	mu      sync.Mutex
	publish func() // nil: disarmed
	passes  int
}

func (s *publishingPasses) ShardsUnreconciled(ctx context.Context, f store.UnreconciledShardFilter) ([]ledger.Shard, error) {
	s.mu.Lock()
	publish := s.publish
	if publish != nil {
		s.passes++
	}
	s.mu.Unlock()
	if publish != nil {
		publish()
	}
	return s.Store.ShardsUnreconciled(ctx, f)
}

// DrainProgress of a superseded generation whose key is published to
// during each of its passes answers 503 with its own reason,
// POLICY_CHANGING, and a Retry-After, not STORE_UNAVAILABLE: nothing is
// wrong with the store. Once the publishes stop it answers. Each store.
func TestDrainProgressWhileItsKeyKeepsChanging(t *testing.T) {
	for name, pg := range map[string]bool{"sqlite": false, "postgres": true} {
		t.Run(name, func(t *testing.T) {
			passes := &publishingPasses{}
			h := newHarness(t, harnessOptions{postgres: pg, wrapStore: func(st store.Store) store.Store {
				passes.Store = st
				return passes
			}})
			policy := `{"policy":{"subject":"tenant-a","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d"}]}}`
			h.ok("PublishPolicy", fmt.Sprintf(policy, 1000), "")
			h.ok("Reserve", reserveFor("d1", "tenant-a", 10), "")
			h.ok("PublishPolicy", fmt.Sprintf(policy, 2000), "") // generation 2 supersedes 1
			burst := 3000
			passes.mu.Lock()
			passes.publish = func() {
				burst++
				h.ok("PublishPolicy", fmt.Sprintf(policy, burst), "")
			}
			passes.mu.Unlock()

			r := h.rollout("DrainProgress", `{"generations":["1"]}`, "")
			passes.mu.Lock()
			passes.publish = nil
			n := passes.passes
			passes.mu.Unlock()
			h.wantError(r, http.StatusServiceUnavailable, "unavailable", "POLICY_CHANGING")
			if n < 2 {
				t.Errorf("%d passes published to; want every pass, several", n)
			}
			if !strings.Contains(fmt.Sprint(r.body["message"]), "active generation changed") {
				t.Errorf("message %q: want it to say the key's active generation changed", r.body["message"])
			}
			if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("Retry-After %q: want whole seconds, at least 1", r.header.Get("Retry-After"))
			}
			got := h.rolloutOK("DrainProgress", `{"generations":["1"]}`, "")
			if g := got["generations"].([]any)[0].(map[string]any); g["active"] == true || got["drained"] == true {
				t.Errorf("once the publishes stop: %v; want generation 1 inactive, not drained", got)
			}
		})
	}
}
