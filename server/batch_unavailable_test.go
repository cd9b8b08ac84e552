package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// unreadableStore fails the reads of one reservation id, as a store that
// went away between two calls does.
type unreadableStore struct {
	store.Store
	mu sync.Mutex
	id string
}

func (s *unreadableStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	s.mu.Lock()
	failing := id == s.id
	s.mu.Unlock()
	if failing {
		return ledger.Reservation{}, fmt.Errorf("reservation %s: %w", id, store.ErrUnavailable)
	}
	return s.Store.ReservationGet(ctx, id)
}

// A ReserveBatch whose item needs a read the store cannot answer (the
// existing reservation an unmappable retry is answered from) fails as a
// whole with 503, as API.md says and as SettleBatch does, before any item
// is sent: it answered 200 with that item "unavailable" and admitted the
// others, so the Go SDK, which retries a whole call that was unavailable,
// left the item to its caller.
func TestReserveBatchUnavailableReadFailsTheCall(t *testing.T) {
	var unreadable *unreadableStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		unreadable = &unreadableStore{Store: st}
		return unreadable
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("earlier", 100), "")
	unreadable.mu.Lock()
	unreadable.id = "earlier"
	unreadable.mu.Unlock()
	// "images" is a unit the policy lacks: the server reads the id to let
	// the ledger answer a retry of it.
	batch := `{"requests":[` + reserveBody("fresh", 100) + `,
	  {"reservationId":"earlier","subject":"tenant-7","route":"chat.generate","units":{"tokens":100,"images":1}}]}`
	r := h.call("ReserveBatch", batch, "")
	h.wantError(r, 503, "unavailable", "STORE_UNAVAILABLE")
	if got := h.call("GetReservation", `{"reservationId":"fresh"}`, ""); got.status != 404 {
		t.Fatalf("an item of the failed batch was admitted: %s", got.raw)
	}
}
