package server_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/capledger/capledger/ledger"
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

// ReservationGet fails as Begin does: the reads a handler makes before it
// sends its command (a Settle's reservation) reach the same database.
func (s *refusingStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	if s.refuse.Load() {
		return ledger.Reservation{}, fmt.Errorf("%w: dial tcp 127.0.0.1:5432: connect: connection refused", store.ErrUnavailable)
	}
	return s.Store.ReservationGet(ctx, id)
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

// A Settle reads its reservation before it sends the command (its usage
// is mapped by the reservation's generation): with the store refusing
// connections that read fails, nothing was sent, and the 503 says "not
// applied", which a gateway in any language keys its resend of the
// settle on (CLIENTS.md, section 4), never only "store unavailable".
func TestUnavailableSettleSaysNotApplied(t *testing.T) {
	var refusing *refusingStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		refusing = &refusingStore{Store: st}
		return refusing
	}})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("work-1", 100), "")
	h.ok("Start", `{"reservationId":"work-1","operationId":"op-1"}`, "")
	settle := `{"reservationId":"work-1","operationId":"op-1","actualUnits":{"tokens":40,"requests":1}}`
	message := func(r response) string { m, _ := r.body["message"].(string); return m }

	refusing.refuse.Store(true)
	r := h.call("Settle", settle, "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if m := message(r); !strings.Contains(m, "not applied") || strings.Contains(m, "outcome unknown") {
		t.Errorf("settle with the store refusing connections: %q, want it to say not applied", m)
	}
	refusing.refuse.Store(false)
	if again := h.ok("Settle", settle, ""); again["replayed"] != nil {
		t.Fatalf("settle after the store came back replayed: the first was applied: %v", again)
	}
}

// policyFailingStore fails committed policy reads while fail is set: the
// read a server makes to build a receipt's answer, or a publish's, after
// the command committed (a transaction's reads do not fail).
type policyFailingStore struct {
	store.Store
	fail atomic.Bool
}

// newPolicyFailingHarness is a harness whose engine's store fails policy
// reads when told to.
func newPolicyFailingHarness(t *testing.T) (*harness, *policyFailingStore) {
	var failing *policyFailingStore
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		failing = &policyFailingStore{Store: st}
		return failing
	}})
	return h, failing
}

func (s *policyFailingStore) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	if s.fail.Load() {
		return ledger.Policy{}, fmt.Errorf("%w: read policy: connection reset by peer", store.ErrUnavailable)
	}
	return s.Store.PolicyGet(ctx, generation)
}

// A failure after the command committed, while the server builds its
// answer (the receipt names units by the policy, read from the store when
// this replica has not cached the generation), says the command was
// applied: a gateway retries with the same ids and gets a replay. It said
// neither applied nor not applied (and a missing policy answered 404).
func TestAnswerFailingAfterCommitSaysApplied(t *testing.T) {
	h, failing := newPolicyFailingHarness(t)
	// Another replica over the same engine and store publishes and
	// reserves: h's server has read no policy yet.
	other := h.otherReplica()
	other.ok("PublishPolicy", tokensPolicy, "")
	other.ok("Reserve", reserveBody("work-1", 100), "")

	failing.fail.Store(true)
	r := h.call("Start", `{"reservationId":"work-1","operationId":"op-1"}`, "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if m, _ := r.body["message"].(string); !strings.Contains(m, "applied (committed)") || strings.Contains(m, "not applied") || strings.Contains(m, "outcome unknown") {
		t.Errorf("answer failing after the commit: %q, want it to say applied", m)
	}
	if got := other.ok("GetReservation", `{"reservationId":"work-1"}`, ""); field(got, "reservation", "state") != "RESERVATION_STATE_STARTED" {
		t.Fatalf("the start that answered 503 was not applied: %v", got)
	}
	failing.fail.Store(false)
	if again := h.ok("Start", `{"reservationId":"work-1","operationId":"op-1"}`, ""); again["replayed"] != true {
		t.Fatalf("retry with the same ids: %v, want a replay", again)
	}
}

// A publish that committed but whose read back failed says applied, and
// (having no id to retry by) to read the policy rather than publish again.
func TestPublishFailingAfterCommitSaysReadItBack(t *testing.T) {
	h, failing := newPolicyFailingHarness(t)
	failing.fail.Store(true)
	r := h.call("PublishPolicy", tokensPolicy, "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	m, _ := r.body["message"].(string)
	if !strings.Contains(m, "applied (committed)") || !strings.Contains(m, "GetPolicy") || strings.Contains(m, "same ids") {
		t.Errorf("publish failing after the commit: %q, want applied and GetPolicy", m)
	}
	failing.fail.Store(false)
	if got := h.ok("GetPolicy", `{"generation":"1"}`, ""); field(got, "policy", "subject") != "tenant-7" {
		t.Fatalf("the publish that answered 503 was not applied: %v", got)
	}
}
