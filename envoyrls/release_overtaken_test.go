package envoyrls_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

// releaseLanding is the engine the server is given, which, once armed,
// runs hook just before the engine call that releases reservation id: in
// between a check's reserves and its releases. It wraps the engine, not
// the store: a store call inside that batch runs while the engine holds
// its one batch at a time, so the hook's own commands could never run.
type releaseLanding struct {
	*engine.Engine
	mu   sync.Mutex
	id   string
	hook func()
	ran  bool
}

func (l *releaseLanding) DoBatch(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
	l.mu.Lock()
	hook := l.hook
	releases := false
	for i := range cmds {
		releases = releases || (cmds[i].Kind == ledger.KindRelease && cmds[i].ReservationID == l.id)
	}
	if hook != nil && releases {
		l.hook, l.ran = nil, true
	} else {
		hook = nil
	}
	l.mu.Unlock()
	if hook != nil {
		hook()
	}
	return l.Engine.DoBatch(ctx, cmds)
}

// A request of two descriptors, acme's fitting and beta's refused: the
// check reserves acme's estimate, then releases it (Envoy refuses the
// request as a whole). Should the call after the stream for the request
// (Envoy sends it for a refused request too, and before the answer when
// that came after its timeout) land between the reserve and the release,
// it starts and settles acme's hold with the usage ("held, not started"
// in docs/ENVOY.md). The check then still answers OVER_LIMIT, the hold
// stays settled and charged once, and nothing is released: the release's
// refusal (the hold already settled) was the call's error instead. Each
// store.
//
// acme's limit_remaining is its available after the request, as for the
// holds a refused request releases: what the settle gave back of the hold
// (its unused units) counted, not the hold as if still held. So too when
// expiry took the hold meanwhile (the release finds it expired: the whole
// hold is back).
func TestRefusedCheckWhoseHoldTheCallAfterTheStreamSettled(t *testing.T) {
	for name, pg := range map[string]bool{"sqlite": false, "postgres": true} {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name, requestID string
				// overtake runs between the reserves and the releases.
				overtake func(h *harness, rid string)
				state    v1.ReservationState
				// spent and held: acme's after the request.
				spent, held int64
			}{
				{name: "settled", requestID: "race-1", overtake: func(h *harness, _ string) {
					if resp, err := h.streamDone("acme", "race-1", 120); err != nil || resp.GetOverallCode() != OK {
						t.Errorf("the call after the stream landing meanwhile: %v %v", resp, err)
					}
				}, state: v1.ReservationState_RESERVATION_STATE_SETTLED, spent: 120},
				{name: "expired", requestID: "race-2", overtake: func(h *harness, rid string) {
					h.clock.Advance(ledger.DefaultHoldTTL + time.Second)
					for _, kind := range []ledger.Kind{ledger.KindExpireClaim, ledger.KindExpire} {
						if res, err := h.engine.Do(context.Background(), ledger.Command{Kind: kind, ReservationID: rid, Cause: ledger.CauseHoldExpired}); err != nil || res.Err != nil {
							t.Errorf("%s: %+v %v", kind, res, err)
						}
					}
				}, state: v1.ReservationState_RESERVATION_STATE_EXPIRED},
				// A call after the stream that started the hold and failed
				// before its settle (or a LedgerService client's start): the
				// hold stays started, held until a settle or the execution
				// limit marks its usage unknown; nothing to give back.
				{name: "started", requestID: "race-3", overtake: func(h *harness, rid string) {
					if _, err := h.ledger.Start(context.Background(), connect.NewRequest(&v1.StartRequest{ReservationId: rid, OperationId: rid})); err != nil {
						t.Errorf("start meanwhile: %v", err)
					}
				}, state: v1.ReservationState_RESERVATION_STATE_STARTED, held: 300},
			} {
				t.Run(tc.name, func(t *testing.T) {
					refusedCheckOvertaken(t, pg, tc.requestID, tc.overtake, tc.state, tc.spent, tc.held)
				})
			}
		})
	}
}

// refusedCheckOvertaken runs acme's and beta's check of requestID with
// overtake landing between its reserves and its releases, and wants it
// answered OVER_LIMIT with acme's hold left in state, spent charged once,
// held still held, and acme's limit_remaining its available after the
// request.
func refusedCheckOvertaken(t *testing.T, pg bool, requestID string, overtake func(h *harness, rid string), state v1.ReservationState, spent, held int64) {
	landing := &releaseLanding{}
	h := newHarness(t, options{config: testMapping(t), auth: true, postgres: pg, wrapLedger: func(e *engine.Engine) server.Ledger {
		landing.Engine = e
		return landing
	}})
	h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
	h.publish("beta", "chat", "tokens", 10, 1, time.Hour, false)
	rid := "envoy:" + requestID + "/acme/chat/global"
	landing.mu.Lock()
	landing.id = rid
	landing.hook = func() { overtake(h, rid) }
	landing.mu.Unlock()

	resp, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "x-request-id", requestID),
		descriptor(nil, "tenant", "beta", "x-request-id", requestID)}})
	landing.mu.Lock()
	ran := landing.ran
	landing.mu.Unlock()
	if !ran {
		t.Fatal("the overtaking command did not land between the reserve and the release: the test proves nothing")
	}
	if err != nil {
		t.Fatalf("the check: %v; want OVER_LIMIT", err)
	}
	if resp.GetOverallCode() != OVER || resp.GetStatuses()[1].GetCode() != OVER {
		t.Fatalf("the check: %v; want OVER_LIMIT (beta refused)", resp)
	}
	if r := h.reservation(rid); r.GetState() != state || r.GetActualUnits()["tokens"] != spent {
		t.Fatalf("acme's reservation: %v, want %s with %d tokens used", r, state, spent)
	}
	b := h.balance("acme", "chat")
	if b.Spent != spent || b.Reserved != held || b.Available != 1000-spent-held {
		t.Fatalf("acme's balance %+v: want %d spent once, %d held, %d available", b, spent, held, 1000-spent-held)
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); int64(got) != b.Available {
		t.Errorf("acme's limit_remaining %d; want %d, its available after the request", got, b.Available)
	}
	if b := h.balance("beta", "chat"); b.Spent != 0 || b.Reserved != 0 {
		t.Fatalf("beta's balance %+v: want nothing spent or held", b)
	}
	if spent > 0 {
		// A retry of the call after the stream replays: charged once.
		h.mustCharge("retry", "acme", requestID, uint64(spent), spent)
	}
}
