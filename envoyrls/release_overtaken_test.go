package envoyrls_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
func TestRefusedCheckWhoseHoldTheCallAfterTheStreamSettled(t *testing.T) {
	for name, pg := range map[string]bool{"sqlite": false, "postgres": true} {
		t.Run(name, func(t *testing.T) {
			landing := &releaseLanding{}
			h := newHarness(t, options{config: testMapping(t), auth: true, postgres: pg, wrapLedger: func(e *engine.Engine) server.Ledger {
				landing.Engine = e
				return landing
			}})
			h.publish("*", "chat", "tokens", 1000, 1, time.Hour, false)
			h.publish("beta", "chat", "tokens", 10, 1, time.Hour, false)
			const rid = "envoy:race-1/acme/chat/global"
			landing.mu.Lock()
			landing.id = rid
			landing.hook = func() {
				if resp, err := h.streamDone("acme", "race-1", 120); err != nil || resp.GetOverallCode() != OK {
					t.Errorf("the call after the stream landing meanwhile: %v %v", resp, err)
				}
			}
			landing.mu.Unlock()

			resp, err := h.check(&rlsv3.RateLimitRequest{Domain: "llm", HitsAddend: 300, Descriptors: []*rlscommon.RateLimitDescriptor{
				descriptor(nil, "tenant", "acme", "x-request-id", "race-1"),
				descriptor(nil, "tenant", "beta", "x-request-id", "race-1")}})
			landing.mu.Lock()
			ran := landing.ran
			landing.mu.Unlock()
			if !ran {
				t.Fatal("the call after the stream did not land between the reserve and the release: the test proves nothing")
			}
			if err != nil {
				t.Fatalf("the check: %v; want OVER_LIMIT", err)
			}
			if resp.GetOverallCode() != OVER || resp.GetStatuses()[1].GetCode() != OVER {
				t.Fatalf("the check: %v; want OVER_LIMIT (beta refused)", resp)
			}
			if r := h.reservation(rid); r.GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || r.GetActualUnits()["tokens"] != 120 {
				t.Fatalf("acme's reservation: %v, want settled with the 120 tokens used", r)
			}
			if b := h.balance("acme", "chat"); b.Spent != 120 || b.Reserved != 0 || b.Available != 1000-120 {
				t.Fatalf("acme's balance %+v: want 120 spent once, nothing held, 880 available", b)
			}
			if b := h.balance("beta", "chat"); b.Spent != 0 || b.Reserved != 0 {
				t.Fatalf("beta's balance %+v: want nothing spent or held", b)
			}
			// A retry of the call after the stream replays: charged once.
			h.mustCharge("retry", "acme", "race-1", 120, 120)
		})
	}
}
