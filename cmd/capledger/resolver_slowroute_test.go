package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// TestResolverSlowRouteDoesNotHoldBackOthers: one route's status endpoint
// hangs (every question times out, after 3 s), another's answers
// "finished" at once. The answering route's USAGE_UNKNOWN reservations,
// marked one after another while the hanging route's questions are
// outstanding, must each settle within about one scan interval (0.1 s),
// not wait for the hanging route's timeout. Real HTTP servers, the
// resolver config loaded as serve loads it, the engine's own worker on
// the wall clock.
func TestResolverSlowRouteDoesNotHoldBackOthers(t *testing.T) {
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	rig := newEngineRig(t, memstore.New(), `"interval": "100ms", "minBackoff": "100ms", "maxBackoff": "200ms", "timeout": "3s"`,
		map[string]string{"slow.route": hanging.URL, "fast.route": answering.URL}, engine.Options{}, nil)
	e := rig.e
	ctx := context.Background()
	// The hanging route's backlog, asked about again after every 0.2 s
	// backoff: its questions are outstanding nearly all the time.
	for _, id := range []string{"slow-1", "slow-2", "slow-3"} {
		rig.unknown("slow.route", id)
	}
	waitUntil(t, 10*time.Second, func() string { return "the resolver to run (needs the worker lease)" }, func() bool {
		return e.ResolverStats().Scanned
	})

	// Over 6 s (two of the hanging route's timeouts), a fast-route
	// reservation marked every 0.25 s settles within 1 s each (10 scan
	// intervals: slack for a loaded machine, still a third of the timeout).
	var worst time.Duration
	for i := range 24 {
		id := "fast-" + string(rune('a'+i))
		rig.unknown("fast.route", id)
		marked := time.Now()
		for {
			r, err := e.Reservation(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if r.State == ledger.StateSettled {
				break
			}
			if time.Since(marked) > 2500*time.Millisecond {
				t.Fatalf("%s still %v %v after marked: the hanging route's 3 s timeout holds it back", id, r.State, time.Since(marked))
			}
			time.Sleep(5 * time.Millisecond)
		}
		worst = max(worst, time.Since(marked))
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("fast route: slowest settle %v after marked (interval 100ms, the other route's timeout 3s)", worst)
	if worst > time.Second {
		t.Fatalf("a fast-route reservation took %v to settle, want about one interval (at most 1s)", worst)
	}
	for _, id := range []string{"slow-1", "slow-2", "slow-3"} {
		if r, err := e.Reservation(ctx, id); err != nil || r.State != ledger.StateUsageUnknown {
			t.Fatalf("%s: %v %v", id, r.State, err)
		}
	}
}
