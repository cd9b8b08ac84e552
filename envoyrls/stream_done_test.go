package envoyrls_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// streamDone is the call Envoy makes after the stream (the
// apply_on_stream_done rate limit of docs/ENVOY.md) for a request id, with
// the actual token count.
func (h *harness) streamDone(tenant, requestID string, tokens uint64) (*rlsv3.RateLimitResponse, error) {
	return h.check(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(tokens), "tenant", tenant, "x-request-id", requestID, "capledger-phase", "settle")}})
}

// mustCharge makes the stream-done call twice (the second a retry) and
// fails unless both answer OK and the tenant's account shows exactly
// wantSpent spent and nothing held: the usage charged once.
func (h *harness) mustCharge(what, tenant, requestID string, tokens uint64, wantSpent int64) {
	h.t.Helper()
	for attempt := range 2 {
		resp, err := h.streamDone(tenant, requestID, tokens)
		if err != nil || resp.GetOverallCode() != OK {
			h.t.Fatalf("%s, stream done (attempt %d): %v %v", what, attempt+1, resp, err)
		}
		if b := h.balance(tenant, "chat"); b.Spent != wantSpent || b.Reserved != 0 {
			h.t.Fatalf("%s, after stream done (attempt %d): %+v, want spent %d and nothing held", what, attempt+1, b, wantSpent)
		}
	}
}

// TestStreamDoneChargesWhateverTheCheckLeft: the call after the stream
// charges the actual usage whatever state the request's check left its
// reservation in (docs/ENVOY.md, "What the call after the stream finds"),
// and a retry of it charges nothing more. In particular a check released
// because the call failed as a whole (Envoy then lets the request through
// under failure_mode_deny: false) no longer lets the tenant use the
// backend for free.
func TestStreamDoneChargesWhateverTheCheckLeft(t *testing.T) {
	h := newHarness(t, options{config: testMapping(t), auth: true})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	check := func(kv ...string) *rlscommon.RateLimitDescriptor { return descriptor(nil, kv...) }
	ctx := context.Background()

	t.Run("started", func(t *testing.T) {
		h.t = t
		h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
			check("tenant", "started", "x-request-id", "s-1")}})
		h.mustCharge("started", "started", "s-1", 120, 120)
	})

	t.Run("released by a failed call", func(t *testing.T) {
		h.t = t
		// beta's reserve under r-1 holds 300; a request whose second
		// descriptor reuses r-1 for beta with another estimate fails as a
		// whole (ALREADY_EXISTS), and its first descriptor's hold is
		// released. Envoy, failing open, runs the request anyway.
		h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
			check("tenant", "beta", "x-request-id", "r-1")}})
		_, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 200, Descriptors: []*rlscommon.RateLimitDescriptor{
			check("tenant", "released", "x-request-id", "r-1"), check("tenant", "beta", "x-request-id", "r-1")}})
		if status.Code(err) != codes.AlreadyExists {
			t.Fatalf("check reusing beta's id with another estimate: %v, want ALREADY_EXISTS", err)
		}
		if r := h.reservation("envoy:r-1/released/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_RELEASED {
			t.Fatalf("after the failed check: %v, want RELEASED", r)
		}
		before := h.commandCounts()
		h.mustCharge("released", "released", "r-1", 150, 150)
		h.wantCounted(before, map[string]float64{"record/ok": 1, "record/replayed": 1})
		r := h.reservation("usage:r-1/released/chat/global")
		if r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != 150 {
			t.Fatalf("the usage's receipt: %v, want SETTLED with 150 tokens", r)
		}
		// Another cost for the same request contradicts the recorded one.
		if _, err := h.streamDone("released", "r-1", 151); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("stream done again with another cost: %v, want FAILED_PRECONDITION", err)
		}
		if b := h.balance("released", "chat"); b.Spent != 150 {
			t.Fatalf("after the contradicting call: %+v, want spent 150", b)
		}
	})

	t.Run("released by a refusal, nothing used", func(t *testing.T) {
		h.t = t
		// The second descriptor does not fit: Envoy refuses the request,
		// which never runs, and its call after the stream reports 0 (with
		// the hits taken from the response, as docs/ENVOY.md configures
		// them, Envoy leaves the descriptor out of that call instead).
		resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(100), "tenant", "refused", "x-request-id", "q-1"), descriptor(hits(5000), "tenant", "huge", "x-request-id", "q-1")}})
		if resp.GetOverallCode() != OVER {
			t.Fatalf("check with a descriptor over the burst: %v, want OVER_LIMIT", resp)
		}
		resp, err := h.streamDone("refused", "q-1", 0)
		if err != nil || resp.GetOverallCode() != OK || len(resp.GetResponseHeadersToAdd()) != 0 {
			t.Fatalf("stream done of 0 after a refusal: %v %v, want OK and no headers", resp, err)
		}
		if b := h.balance("refused", "chat"); b.Spent != 0 || b.Reserved != 0 {
			t.Fatalf("after a refused request: %+v, want nothing spent or held", b)
		}
	})

	t.Run("refused, hits reported anyway", func(t *testing.T) {
		h.t = t
		// Envoy sends the call after the stream of a request it refused
		// too, with the hits its hits_addend gives (a fixed number, or
		// the request's 1 when the rate limit has none): the ledger
		// cannot tell whether Envoy ran the request (a filter not
		// enforcing, an answer past its timeout), so they are charged,
		// once (docs/ENVOY.md). Refused alone: no reservation, recorded
		// under the reservation's id.
		resp := h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(5000), "tenant", "refused-alone", "x-request-id", "q-2")}})
		if resp.GetOverallCode() != OVER {
			t.Fatalf("check over the burst: %v, want OVER_LIMIT", resp)
		}
		h.mustCharge("refused alone", "refused-alone", "q-2", 1, 1)
		if r := h.reservation("envoy:q-2/refused-alone/chat/global"); r.GetActualUnits()["tokens"] != 1 {
			t.Fatalf("the usage's receipt: %v, want 1 token", r)
		}
		// Refused with another descriptor: its hold released, recorded
		// under usage:<id>.
		resp = h.mustCheck(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(100), "tenant", "refused-with", "x-request-id", "q-3"), descriptor(hits(5000), "tenant", "huge", "x-request-id", "q-3")}})
		if resp.GetOverallCode() != OVER {
			t.Fatalf("check with a descriptor over the burst: %v, want OVER_LIMIT", resp)
		}
		h.mustCharge("refused with another", "refused-with", "q-3", 7, 7)
		if r := h.reservation("usage:q-3/refused-with/chat/global"); r.GetActualUnits()["tokens"] != 7 {
			t.Fatalf("the usage's receipt: %v, want 7 tokens", r)
		}
	})

	t.Run("held", func(t *testing.T) {
		h.t = t
		// Reserved under the request's id but never started, as a check of
		// several descriptors whose second engine call failed leaves it.
		if _, err := h.ledger.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{ReservationId: "envoy:h-1/held/chat/global",
			Subject: "held", Route: "chat", Units: map[string]int64{"tokens": 400}})); err != nil {
			t.Fatal(err)
		}
		before := h.commandCounts()
		h.mustCharge("held", "held", "h-1", 250, 250)
		h.wantCounted(before, map[string]float64{"start/ok": 1, "settle/ok": 1, "settle/replayed": 1})
		if r := h.reservation("envoy:h-1/held/chat/global"); r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED ||
			r.GetActualUnits()["tokens"] != 250 {
			t.Fatalf("the hold after stream done: %v, want SETTLED with 250 tokens", r)
		}
	})

	t.Run("expired", func(t *testing.T) {
		h.t = t
		const rid = "envoy:e-1/expired/chat/global"
		if _, err := h.ledger.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{ReservationId: rid,
			Subject: "expired", Route: "chat", Units: map[string]int64{"tokens": 400}})); err != nil {
			t.Fatal(err)
		}
		h.clock.Advance(ledger.DefaultHoldTTL + time.Second)
		for _, kind := range []ledger.Kind{ledger.KindExpireClaim, ledger.KindExpire} {
			if res, err := h.engine.Do(ctx, ledger.Command{Kind: kind, ReservationID: rid, Cause: ledger.CauseHoldExpired}); err != nil || res.Err != nil {
				t.Fatalf("%s: %+v %v", kind, res, err)
			}
		}
		h.mustCharge("expired", "expired", "e-1", 70, 70)
		if r := h.reservation("usage:e-1/expired/chat/global"); r.GetActualUnits()["tokens"] != 70 {
			t.Fatalf("the usage's receipt: %v, want 70 tokens", r)
		}
	})

	t.Run("unknown", func(t *testing.T) {
		h.t = t
		// The check never reached the ledger (capledger unreachable, Envoy
		// failing open): recorded under the reservation's own id.
		h.mustCharge("unknown", "unknown", "u-1", 40, 40)
		if r := h.reservation("envoy:u-1/unknown/chat/global"); r.GetActualUnits()["tokens"] != 40 {
			t.Fatalf("the usage's receipt: %v, want 40 tokens", r)
		}
	})

	h.t = t
	audit, err := h.ledger.Audit(ctx, connect.NewRequest(&v1.AuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if d := audit.Msg.GetDiscrepancies(); len(d) != 0 {
		t.Fatalf("audit: %v", d)
	}
}
