package envoyrls_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// forgettingStore, once armed, removes one reservation for good (no
// tombstone left) and rolls one generation back, in one transaction,
// right after the server has read that reservation outside a transaction:
// what retention and an operator on other replicas may do between the
// server's read and the ledger's.
type forgettingStore struct {
	store.Store
	mu       sync.Mutex
	id       string
	at       time.Time
	rollback ledger.PolicyKey
	gen      uint64
	forgot   bool
}

func (s *forgettingStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	r, err := s.Store.ReservationGet(ctx, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil || id != s.id {
		return r, err
	}
	s.id = ""
	tx, terr := s.Store.Begin(ctx)
	if terr != nil {
		return r, terr
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 1)
	for _, cmd := range []ledger.Command{
		{Kind: ledger.KindRetire, ReservationID: id, Before: s.at, ForgetBefore: s.at},
		{Kind: ledger.KindRollbackPolicy, PolicyKey: s.rollback, Generation: s.gen},
	} {
		if res := ledger.Apply(book, &cmd, s.at); res.Err != nil {
			return r, res.Err
		}
	}
	if terr := tx.Write(ctx, book.Changes()); terr != nil {
		return r, terr
	}
	if terr := tx.Commit(ctx); terr != nil {
		return r, terr
	}
	s.forgot = true
	return r, err
}

// A check with an id whose unit the generation the server believes
// decides lacks, retried after its reservation finished, goes to the
// ledger only to be answered from that reservation, with an amount no
// policy admits. Should the id be forgotten meanwhile while the
// reservation's generation decides again, the ledger refuses that amount
// as too large: the descriptor was OVER_LIMIT, with a
// RESERVATION_TOO_LARGE rejection counted, for a unit no policy the
// server knew has, where the LedgerService answers UNKNOWN_UNIT. It is
// unknown, answered per unknown_descriptor (here allow), and holds
// nothing; /metrics counts its reserve as the LedgerService's Reserve
// counts the same refusal, unknown_unit, not too_large (the amount no
// policy admits is the adapter's device, not the caller's request).
func TestUnmappableCheckOfAForgottenIDIsUnknown(t *testing.T) {
	var forgetting *forgettingStore
	cfg := strings.Replace(testMapping(t), "unknown_descriptor: deny", "unknown_descriptor: allow", 1)
	h := newHarness(t, options{config: cfg, auth: true, wrapStore: func(st store.Store) store.Store {
		forgetting = &forgettingStore{Store: st}
		return forgetting
	}})
	h.publish("acme", "chat", "tokens", 1000, 1, time.Hour, false)
	check := &rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 100, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "x-request-id", "q-f")}}
	done := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", "acme", "x-request-id", "q-f", "capledger-phase", "settle")}}
	if resp := h.mustCheck(check); resp.GetOverallCode() != OK {
		t.Fatalf("check: %v", resp)
	}
	if resp := h.mustCheck(done); resp.GetOverallCode() != OK {
		t.Fatalf("settle: %v", resp)
	}
	h.publish("acme", "chat", "requests", 10, 1, time.Second, false) // generation 2, no tokens

	forgetting.mu.Lock()
	forgetting.id, forgetting.at = "envoy:q-f/acme/chat/global", h.clock.Now().Add(time.Hour)
	forgetting.rollback, forgetting.gen = ledger.PolicyKey{Subject: "acme", Route: "chat", Region: "global"}, 2
	forgetting.mu.Unlock()
	before := h.commandCounts()
	resp := h.mustCheck(check)
	forgetting.mu.Lock()
	forgot := forgetting.forgot
	forgetting.mu.Unlock()
	if !forgot {
		t.Fatal("the store did not forget the id between the reads: the test proves nothing")
	}
	if resp.GetOverallCode() != OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Fatalf("want the unknown descriptor's answer (OK, code alone), got %v", resp)
	}
	h.wantCounted(before, map[string]float64{"reserve/unknown_unit": 1})
	if _, err := h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: "envoy:q-f/acme/chat/global"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("a reservation under the forgotten id: %v", err)
	}
}
