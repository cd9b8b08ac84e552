package envoyrls_test

import (
	"context"
	"sync"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// landingStore, once armed, runs hook right after the server has read
// one reservation id outside a transaction (and found none): what the
// request's own check, still committing on another connection, does
// between the call after the stream's read and its command.
type landingStore struct {
	store.Store
	mu   sync.Mutex
	id   string
	hook func()
	ran  bool
}

func (s *landingStore) ReservationGet(ctx context.Context, id string) (ledger.Reservation, error) {
	r, err := s.Store.ReservationGet(ctx, id)
	s.mu.Lock()
	hook := s.hook
	if id != s.id || hook == nil {
		s.mu.Unlock()
		return r, err
	}
	s.id, s.hook, s.ran = "", nil, true
	s.mu.Unlock()
	hook()
	return r, err
}

// A check whose answer came after Envoy's timeout may still be committing
// when the stream ends and the call after the stream arrives: that call
// reads no reservation under the request's id, and plans a record of the
// usage under it ("none" in docs/ENVOY.md, "What the call after the stream
// finds"). Should the check's reserve and start commit in between, the
// record meets the check's reservation: the call settles that reservation
// with the usage (the "started" row), as it would have a moment later. It
// was answered ALREADY_EXISTS instead, charging nothing, and the check's
// estimate stayed held (STARTED, never settled).
func TestStreamDoneSettlesACheckThatLandsMeanwhile(t *testing.T) {
	var landing *landingStore
	h := newHarness(t, options{config: testMapping(t), auth: true, wrapStore: func(st store.Store) store.Store {
		landing = &landingStore{Store: st}
		return landing
	}})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	const rid = "envoy:late-1/acme/chat/global"
	check := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(0), "tenant", "acme", "x-request-id", "late-1")}}
	landing.mu.Lock()
	landing.id = rid
	landing.hook = func() {
		if resp, err := h.check(check); err != nil || resp.GetOverallCode() != OK {
			t.Errorf("the check landing meanwhile: %v %v", resp, err)
		}
	}
	landing.mu.Unlock()

	resp, err := h.streamDone("acme", "late-1", 120)
	landing.mu.Lock()
	ran := landing.ran
	landing.mu.Unlock()
	if !ran {
		t.Fatal("the check did not land between the read and the command: the test proves nothing")
	}
	if err != nil || resp.GetOverallCode() != OK {
		t.Fatalf("stream done: %v %v", resp, err)
	}
	if r := h.reservation(rid); r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != 120 {
		t.Fatalf("the check's reservation: %v, want settled with the 120 tokens used", r)
	}
	if b := h.balance("acme", "chat"); b.Spent != 120 || b.Reserved != 0 {
		t.Fatalf("balance %+v: want 120 spent once and nothing held", b)
	}
	// A retry of the call replays: charged once.
	h.mustCharge("retry", "acme", "late-1", 120, 120)
}

// The same with two descriptors in the call after the stream (their
// settles, or records, run in one engine call): the one whose check
// landed meanwhile settles that check's reservation, the other, whose
// check never reached the ledger, records its usage under its id.
func TestStreamDoneOfTwoDescriptorsSettlesTheCheckThatLanded(t *testing.T) {
	var landing *landingStore
	h := newHarness(t, options{config: testMapping(t), auth: true, wrapStore: func(st store.Store) store.Store {
		landing = &landingStore{Store: st}
		return landing
	}})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	landing.mu.Lock()
	landing.id = "envoy:late-2/acme/chat/global"
	landing.hook = func() {
		check := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
			descriptor(hits(0), "tenant", "acme", "x-request-id", "late-2")}}
		if resp, err := h.check(check); err != nil || resp.GetOverallCode() != OK {
			t.Errorf("the check landing meanwhile: %v %v", resp, err)
		}
	}
	landing.mu.Unlock()
	resp, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(hits(120), "tenant", "acme", "x-request-id", "late-2", "capledger-phase", "settle"),
		descriptor(hits(30), "tenant", "beta", "x-request-id", "late-2", "capledger-phase", "settle")}})
	landing.mu.Lock()
	ran := landing.ran
	landing.mu.Unlock()
	if !ran {
		t.Fatal("the check did not land between the read and the command: the test proves nothing")
	}
	if err != nil || resp.GetOverallCode() != OK {
		t.Fatalf("stream done: %v %v", resp, err)
	}
	for _, c := range []struct {
		tenant string
		spent  int64
	}{{"acme", 120}, {"beta", 30}} {
		r := h.reservation("envoy:late-2/" + c.tenant + "/chat/global")
		if r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != c.spent {
			t.Errorf("%s: %v, want settled with %d tokens", c.tenant, r, c.spent)
		}
		if b := h.balance(c.tenant, "chat"); b.Spent != c.spent || b.Reserved != 0 {
			t.Errorf("%s: balance %+v, want %d spent once and nothing held", c.tenant, b, c.spent)
		}
	}
}
