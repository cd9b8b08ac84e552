package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// refusingStore is a store whose Begin fails while refuse is set: a
// database that refuses the connection before any statement is sent.
type refusingStore struct {
	store.Store
	refuse atomic.Bool
}

func (s *refusingStore) Begin(ctx context.Context) (store.Tx, error) {
	if s.refuse.Load() {
		return nil, fmt.Errorf("%w: dial tcp 127.0.0.1:5432: connect: connection refused", store.ErrUnavailable)
	}
	return s.Store.Begin(ctx)
}

// A 503 says what is known of the outcome, with the same code and reason
// either way (the client retries with the same ids): "not applied" when
// the transaction never reached its COMMIT (the retry is then a first
// admission, not a replay), "outcome unknown" when the COMMIT's answer was
// lost (the retry replays).
func TestUnavailableSaysWhetherApplied(t *testing.T) {
	var refusing *refusingStore
	h := newHarness(t, harnessOptions{faults: true, wrapStore: func(st store.Store) store.Store {
		refusing = &refusingStore{Store: st}
		return refusing
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	message := func(r response) string { m, _ := r.body["message"].(string); return m }

	refusing.refuse.Store(true)
	r := h.call("Reserve", reserveBody("refused", 10), "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if m := message(r); !strings.Contains(m, "not applied") || strings.Contains(m, "outcome unknown") {
		t.Errorf("BEGIN refused: %q, want it to say not applied, not outcome unknown", m)
	}
	refusing.refuse.Store(false)
	if again := h.ok("Reserve", reserveBody("refused", 10), ""); again["replayed"] != nil {
		t.Fatalf("retry after a refused BEGIN replayed: the first was applied: %v", again)
	}

	h.faults.LoseNextCommitAck()
	r = h.call("Reserve", reserveBody("lost-ack", 10), "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if m := message(r); !strings.Contains(m, "outcome unknown") || strings.Contains(m, "not applied") {
		t.Errorf("COMMIT answer lost: %q, want outcome unknown", m)
	}
	if again := h.ok("Reserve", reserveBody("lost-ack", 10), ""); again["replayed"] != true {
		t.Fatalf("retry after a lost commit answer: %v, want a replay", again)
	}
}
