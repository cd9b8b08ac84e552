package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// TestResolverSlowRouteDoesNotHoldBackOthers: one route's status endpoint
// hangs (its questions stay out for the whole test: they would end at the
// resolver's 60 s timeout), another's answers "finished" at once. The
// answering route's USAGE_UNKNOWN reservations, marked one after another
// while the hanging route's questions are outstanding, must each settle
// while every one of those questions is still out (counted at the hanging
// server: none has ended), so none waited for the hanging route; and
// within about one scan interval (0.1 s): half of them within 1 s, a
// bound that a machine stalling now and then cannot break but a resolver
// that makes every answer wait a round can. Real HTTP servers, the
// resolver config loaded as serve loads it, the engine's own worker on
// the wall clock.
func TestResolverSlowRouteDoesNotHoldBackOthers(t *testing.T) {
	testResolverSlowRoute(t, "")
}

// testResolverSlowRoute runs the test with extra resolver settings (a
// break-check: `"maxInFlight": 3` lets the hanging questions hold every
// slot, and the test must fail).
func testResolverSlowRoute(t *testing.T, extra string) {
	release := make(chan struct{})
	var slowAsked, slowEnded atomic.Int64
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		slowAsked.Add(1)
		defer slowEnded.Add(1)
		select { // never answers: the resolver's timeout ends the call
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hanging.Close()
	defer close(release)
	answering := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, opstatus.StatusFinished)
	}))
	defer answering.Close()
	rig := newEngineRig(t, memstore.New(), `"interval": "100ms", "minBackoff": "100ms", "maxBackoff": "200ms", "timeout": "60s"`+extra,
		map[string]string{"slow.route": hanging.URL, "fast.route": answering.URL}, engine.Options{}, nil)
	e := rig.e
	ctx := context.Background()
	// The hanging route's backlog: once asked, its three questions are
	// out until the test ends.
	slow := []string{"slow-1", "slow-2", "slow-3"}
	for _, id := range slow {
		rig.unknown("slow.route", id)
	}
	waitUntil(t, 10*time.Second, func() string {
		return fmt.Sprintf("the resolver to ask the hanging route its %d questions (%d asked)", len(slow), slowAsked.Load())
	}, func() bool { return slowAsked.Load() >= int64(len(slow)) })

	// A fast-route reservation marked every 0.25 s, 24 times: each
	// settles while the hanging questions are out (waiting at most 20 s
	// for it, a third of their timeout).
	var took []time.Duration
	for i := range 24 {
		id := "fast-" + string(rune('a'+i))
		rig.unknown("fast.route", id)
		marked := time.Now()
		waitUntil(t, 20*time.Second, func() string {
			return fmt.Sprintf("%s to settle while the hanging route's questions are out (%d asked, %d ended)", id, slowAsked.Load(), slowEnded.Load())
		}, func() bool {
			r, err := e.Reservation(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return r.State == ledger.StateSettled
		})
		took = append(took, time.Since(marked))
		if n := slowEnded.Load(); n != 0 {
			t.Fatalf("%s settled only after %d of the hanging route's questions ended: it waited for them", id, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
	slices.Sort(took)
	median, worst := took[len(took)/2], took[len(took)-1]
	t.Logf("fast route: settled %v after marked at the median, %v at worst (interval 100ms, the other route's questions out all along)", median, worst)
	if median > time.Second {
		t.Fatalf("half the fast-route reservations took over %v to settle, want about one interval (0.1 s)", median)
	}
	for _, id := range slow {
		if r, err := e.Reservation(ctx, id); err != nil || r.State != ledger.StateUsageUnknown {
			t.Fatalf("%s: %v %v", id, r.State, err)
		}
	}
	if n := slowEnded.Load(); n != 0 || slowAsked.Load() != int64(len(slow)) {
		t.Fatalf("the hanging route was asked %d questions, %d ended: want its %d questions out all along", slowAsked.Load(), n, len(slow))
	}
}
