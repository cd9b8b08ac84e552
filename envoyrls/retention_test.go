package envoyrls_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// retain advances the clock by d and runs one retention pass (window 1h,
// tombstone horizon 10h in this harness).
func (h *harness) retain(d time.Duration) {
	h.t.Helper()
	h.clock.Advance(d)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		h.t.Fatal(err)
	}
}

// refuse makes a request whose descriptor for tenant fits and whose
// second does not: Envoy refuses it, and tenant's hold under requestID is
// released.
func (h *harness) refuse(tenant, requestID string) {
	h.t.Helper()
	resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(100), "tenant", tenant, "x-request-id", requestID), descriptor(hits(5000), "tenant", "huge", "x-request-id", requestID)}})
	if resp.GetOverallCode() != OVER {
		h.t.Fatalf("check with a descriptor over the burst: %v, want OVER_LIMIT", resp)
	}
}

// TestStreamDoneAfterRetention: the call after the stream finds the
// request's reservation removed by retention (a real SQLite store, a
// retention pass run) and answers as for the state it ended in
// (docs/ENVOY.md, "What the call after the stream finds"): released, its
// usage is recorded under usage:<id> once; settled, a late retry replays,
// whatever its hits, and charges nothing twice; past the tombstone
// horizon the id is unknown, and the usage is recorded under the
// reservation's own id.
func TestStreamDoneAfterRetention(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true, retention: time.Hour})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	retired := func(id string) {
		t.Helper()
		if r := h.reservation(id); !r.GetRetired() {
			t.Fatalf("%s after the retention pass: %v, want retired (its tombstone)", id, r)
		}
	}

	t.Run("settled, then removed, then retried", func(t *testing.T) {
		h.t = t
		h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(nil, "tenant", "settled", "x-request-id", "s-1")}})
		h.mustCharge("settled", "settled", "s-1", 120, 120)
		h.retain(2 * time.Hour)
		retired("envoy:s-1/settled/chat/global")
		before := h.commandCounts()
		for _, tokens := range []uint64{120, 121} { // the tombstone keeps no usage to compare
			if resp, err := h.streamDone("settled", "s-1", tokens); err != nil || resp.GetOverallCode() != OK {
				t.Fatalf("late stream done of %d after retention: %v %v, want OK (a replay)", tokens, resp, err)
			}
		}
		if b := h.balance("settled", "chat"); b.Spent != 120 || b.Reserved != 0 {
			t.Fatalf("after the late calls: %+v, want spent 120", b)
		}
		h.wantCounted(before, map[string]float64{"settle/replayed": 2})
	})

	t.Run("released, then removed, then the call", func(t *testing.T) {
		h.t = t
		h.refuse("released", "r-1")
		h.retain(2 * time.Hour)
		retired("envoy:r-1/released/chat/global")
		before := h.commandCounts()
		h.mustCharge("released", "released", "r-1", 40, 40)
		h.wantCounted(before, map[string]float64{"record/ok": 1, "record/replayed": 1})
		if r := h.reservation("usage:r-1/released/chat/global"); r.GetActualUnits()["tokens"] != 40 {
			t.Fatalf("the usage's receipt: %v, want 40 tokens", r)
		}
		// Both rows removed, a late retry replays from the usage's tombstone.
		h.retain(2 * time.Hour)
		retired("usage:r-1/released/chat/global")
		h.mustCharge("released, both removed", "released", "r-1", 40, 40)
	})

	h.t = t
	audit, err := h.ledger.Audit(context.Background(), connect.NewRequest(&v1.AuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if d := audit.Msg.GetDiscrepancies(); len(d) != 0 {
		t.Fatalf("audit: %v", d)
	}

	// After the audit: the reservation's id is used again once forgotten
	// (as a Reserve may use it, docs/API.md), and the audit, reading a
	// journal no compaction cut here, sees both endings under one id.
	t.Run("released, removed past the tombstone horizon", func(t *testing.T) {
		h.t = t
		h.refuse("forgotten", "f-1")
		h.retain(11 * time.Hour) // removed without a tombstone: the id is unknown
		if _, err := h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{
			ReservationId: "envoy:f-1/forgotten/chat/global"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("the forgotten reservation: %v, want NOT_FOUND", err)
		}
		h.mustCharge("forgotten", "forgotten", "f-1", 30, 30)
		if r := h.reservation("envoy:f-1/forgotten/chat/global"); r.GetActualUnits()["tokens"] != 30 {
			t.Fatalf("the usage's receipt: %v, want 30 tokens under the reservation's id", r)
		}
	})

	// settled, removed past the tombstone horizon: nothing is left to
	// tell a late call from one whose check never reached the ledger, so
	// it is the "none" row (docs/ENVOY.md): the hits are recorded again,
	// once (a retry replays), and the call answers OK, refusing nothing.
	t.Run("settled, removed past the tombstone horizon", func(t *testing.T) {
		h.t = t
		h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(nil, "tenant", "long-gone", "x-request-id", "g-1")}})
		h.mustCharge("settled", "long-gone", "g-1", 120, 120)
		h.retain(11 * time.Hour)
		if _, err := h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{
			ReservationId: "envoy:g-1/long-gone/chat/global"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("the forgotten reservation: %v, want NOT_FOUND", err)
		}
		before := h.commandCounts()
		h.mustCharge("settled and forgotten", "long-gone", "g-1", 120, 240)
		// The retry finds the record's reservation, settled: a replay.
		h.wantCounted(before, map[string]float64{"record/ok": 1, "settle/replayed": 1})
		// Hits 0 past the horizon record nothing.
		if resp, err := h.streamDone("long-gone", "g-0", 0); err != nil || resp.GetOverallCode() != OK {
			t.Fatalf("stream done of 0 hits for a forgotten id: %v %v, want OK", resp, err)
		}
	})

}
