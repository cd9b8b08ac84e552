package server_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/logcapture"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// gatedRollouts is the real rollout store with one armed read: it waits
// for its caller's context to end (at most holdAtMost), then reads, or
// fails with fail when set.
type gatedRollouts struct {
	store.Rollouts
	mu    sync.Mutex
	armed bool
	fail  error
}

// holdAtMost bounds the armed read's wait for its caller's context, which
// the reread must no longer follow.
const holdAtMost = 500 * time.Millisecond

func (g *gatedRollouts) arm(fail error) {
	g.mu.Lock()
	g.armed, g.fail = true, fail
	g.mu.Unlock()
}

func (g *gatedRollouts) RolloutList(ctx context.Context) ([]ledger.Rollout, error) {
	g.mu.Lock()
	armed, fail := g.armed, g.fail
	g.armed = false
	g.mu.Unlock()
	if armed {
		if fail != nil {
			return nil, fail
		}
		select {
		case <-ctx.Done():
		case <-time.After(holdAtMost):
		}
	}
	return g.Rollouts.RolloutList(ctx)
}

// A Reserve whose caller gives up (its Connect-Timeout-Ms passes) while
// the server rereads the rollouts does not fail that reread: it is shared
// with every reserve waiting for it, so it runs to its end, and the store,
// which answered, is not logged as unavailable.
func TestRolloutReloadOutlivesACallerThatGaveUp(t *testing.T) {
	gate := &gatedRollouts{}
	logs := &logcapture.Logs{}
	h := newHarness(t, harnessOptions{logs: logs, wrapRollouts: func(r store.Rollouts) store.Rollouts {
		gate.Rollouts = r
		return gate
	}})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), "")
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"}]}`, "")
	h.ok("Reserve", reserveOn("fill", "chat.generate", 900, ""), "")
	h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":100}`, "") // invalidates the copy

	gate.arm(nil)
	req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", strings.NewReader(reserveOn("gave-up", "chat.generate", 10, "")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Timeout-Ms", "100")
	if r := h.do(req); r.status == http.StatusOK {
		t.Fatalf("the reserve whose deadline passed was answered 200: %s", r.raw)
	}
	// Enforced at 100%: the overflow is a 429.
	if r := h.call("Reserve", reserveOn("overflow", "chat.generate", 500, ""), ""); r.status != http.StatusTooManyRequests {
		t.Fatalf("overflow at 100%%: %d %s", r.status, r.raw)
	}
	if strings.Contains(logs.String(), "rollouts: reload") {
		t.Errorf("a caller giving up was logged as a failed reread:\n%s", logs.String())
	}
}

// When the server has no copy of the rollouts (a step on this replica
// invalidated it) and cannot read them, a Reserve is not decided by its
// policy's own mode, as if no rollout held the route: it is answered 503
// unavailable, not applied. Here the policy says shadow and the rollout
// enforces the route at 100%: deciding by the policy would admit in
// shadow what the rollout refuses. The retry, once the store answers, is
// enforced.
func TestReserveWithoutReadableRolloutsIsNotApplied(t *testing.T) {
	gate := &gatedRollouts{}
	h := newHarness(t, harnessOptions{wrapRollouts: func(r store.Rollouts) store.Rollouts {
		gate.Rollouts = r
		return gate
	}})
	h.ok("PublishPolicy", shadowPolicy("chat.generate"), "")
	h.rolloutOK("CreateRollout", `{"name":"llm","hashBy":"route","routes":[{"route":"chat.generate"}]}`, "")
	h.ok("Reserve", reserveOn("fill", "chat.generate", 900, ""), "")
	h.rolloutOK("SetRolloutShare", `{"name":"llm","percent":100}`, "")

	gate.arm(errors.New("injected: rollouts unreadable"))
	r := h.call("Reserve", reserveOn("overflow", "chat.generate", 500, ""), "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if msg, _ := r.body["message"].(string); !strings.Contains(msg, "not applied") {
		t.Fatalf("message %q does not say not applied", msg)
	}
	if got := h.call("GetReservation", `{"reservationId":"overflow"}`, ""); got.status != http.StatusNotFound {
		t.Fatalf("the reserve was applied: %s", got.raw)
	}
	if r := h.call("Reserve", reserveOn("overflow", "chat.generate", 500, ""), ""); r.status != http.StatusTooManyRequests {
		t.Fatalf("retry at 100%%: %d %s", r.status, r.raw)
	}
}
