package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// leaseTakenOver is an in-memory store whose worker lease another
// replica takes over once taken is set: from then on LeaseAcquire
// reports the other replica as the holder, as the store does when this
// replica's renewals lapsed and another one acquired the lease.
type leaseTakenOver struct {
	*memstore.Store
	taken atomic.Bool
}

func (s *leaseTakenOver) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if s.taken.Load() {
		return store.Lease{Name: name, Holder: "other-replica", Fence: 1 << 20, Expires: time.Now().Add(ttl)}, nil
	}
	return s.Store.LeaseAcquire(ctx, name, holder, ttl)
}

// laneSettings are the lane tests' scan timing: an interval of 50 ms and
// a backoff of 100 to 200 ms.
const laneSettings = `"interval": "50ms", "minBackoff": "100ms", "maxBackoff": "200ms"`

// TestResolverLaneStopsAskingWhenLeadershipIsLost: a replica's lane holds
// a route's backlog of 120 reservations, asked 8 at a time, each question
// answered "running" after 150 ms (about 2.3 s for the lot). Another
// replica takes the worker lease over a few questions in. From the moment
// this replica knows it no longer leads, its lane may finish only the
// questions already out (at most Concurrency, 8), counted at the HTTP
// server: it must not go on asking about the rest of what it was handed.
func TestResolverLaneStopsAskingWhenLeadershipIsLost(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		time.Sleep(150 * time.Millisecond)
		answer(w, r, opstatus.StatusRunning)
	}))
	defer srv.Close()
	st := &leaseTakenOver{Store: memstore.New()}
	rig := newEngineRig(t, st, laneSettings+`, "timeout": "3s"`, map[string]string{"busy.route": srv.URL},
		engine.Options{LeaseTTL: 300 * time.Millisecond}, nil)
	rig.unknown("busy.route", ids("busy", 120)...)

	waitUntil(t, 10*time.Second, func() string { return "the resolver to ask (needs the worker lease)" }, func() bool {
		return asked.Load() >= 8
	})
	st.taken.Store(true)
	// The lease loop renews every LeaseTTL/3 (0.1 s) and hears of the
	// other holder at its next renewal.
	deadline := time.Now().Add(5 * time.Second)
	for rig.e.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the replica still leads 5 s after the lease was taken over")
		}
		time.Sleep(time.Millisecond)
	}
	atLoss := asked.Load()
	time.Sleep(2500 * time.Millisecond) // the whole backlog's worth of questions
	after := asked.Load() - atLoss
	t.Logf("asked %d before the replica knew it lost the lease, %d after", atLoss, after)
	if after > 8 {
		t.Fatalf("a replica that lost the worker lease asked %d more questions (at most the 8 already out may arrive)", after)
	}
	if atLoss >= 120 {
		t.Fatalf("the whole backlog was asked (%d) before the lease was lost: the test proves nothing", atLoss)
	}
}

// TestResolverGlobalBoundAcrossRoutes: five routes' endpoints hang (every
// question fails after 1.4 s, against a 1.5 s timeout), each with a backlog of 12, and the
// resolver may make 12 status calls at once across routes (MaxInFlight),
// though each route alone may make 8. The calls in flight, measured at
// the servers, never exceed 12 (the config file's maxInFlight, loaded as
// serve loads it); and a route that answers at once, whose
// 30 reservations are marked while the hanging routes hold every slot,
// still has them all settled before four rounds of the hanging calls (48)
// have ended since they were marked, counted at the hanging server (two
// rounds seen): a
// freed slot goes to the route with the fewest calls out, so it keeps one
// as long as it has questions instead of queueing behind every hanging
// route after each answer (about two questions per round: some fifteen
// rounds for 30). Counted in rounds rather than seconds, a machine that
// stalls cannot fail it: a stall ends at most the one round out.
func TestResolverGlobalBoundAcrossRoutes(t *testing.T) {
	const maxInFlight = 12
	var inFlight, peak, hangEnded atomic.Int64
	enter := func() {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				return
			}
		}
	}
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enter()
		defer inFlight.Add(-1)
		defer hangEnded.Add(1)
		// Hangs until just before the resolver's 1.5 s timeout, then
		// fails: the server, not the client's timeout, ends each call,
		// so its count of calls out is exact (a timed-out client's
		// closed connection reaches the handler a moment late).
		select {
		case <-r.Context().Done():
		case <-release:
		case <-time.After(1400 * time.Millisecond):
			http.Error(w, "upstream stuck", http.StatusServiceUnavailable)
		}
	}))
	defer hanging.Close()
	defer close(release)
	var fastAsked atomic.Int64
	answering := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enter()
		defer inFlight.Add(-1)
		fastAsked.Add(1)
		time.Sleep(5 * time.Millisecond)
		answer(w, r, opstatus.StatusFinished)
	}))
	defer answering.Close()

	routes := map[string]string{"fast.route": answering.URL}
	for i := range 5 {
		// One server, a base path per route: each route is its own
		// endpoint to the resolver.
		routes[fmt.Sprintf("hang%d.route", i)] = hanging.URL + fmt.Sprintf("/hang%d", i)
	}
	// The bound comes from the config file, as serve reads it.
	rig := newEngineRig(t, memstore.New(), laneSettings+fmt.Sprintf(`, "timeout": "1500ms", "maxInFlight": %d`, maxInFlight),
		routes, engine.Options{}, nil)
	for i := range 5 {
		rig.unknown(fmt.Sprintf("hang%d.route", i), ids(fmt.Sprintf("hang%d", i), 12)...)
	}
	waitUntil(t, 10*time.Second, func() string {
		return fmt.Sprintf("the hanging routes to hold every slot (%d in flight)", inFlight.Load())
	}, func() bool { return inFlight.Load() >= maxInFlight })

	fast := ids("fast", 30)
	rig.unknown("fast.route", fast...)
	marked, endedAtMark := time.Now(), hangEnded.Load()
	const rounds = 4 // 2 seen (1.5-2.8 s); a first-come queue asks 7 of 30 in 5 s (3.5 rounds)
	waitUntil(t, 60*time.Second, func() string {
		return fmt.Sprintf("the answering route's 30 reservations to settle while 5 routes hang (%d asked, %v)", fastAsked.Load(), time.Since(marked))
	}, func() bool {
		if n := hangEnded.Load() - endedAtMark; n > rounds*maxInFlight {
			t.Fatalf("%d hanging calls ended since the answering route's 30 reservations were marked (%d rounds of %d) and %d of them were asked, not all settled: it queued behind the hanging routes",
				n, rounds, maxInFlight, fastAsked.Load())
		}
		for _, id := range fast {
			r, err := rig.e.Reservation(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if r.State != ledger.StateSettled {
				return false
			}
		}
		return true
	})
	t.Logf("answering route settled 30 in %v, %d hanging calls ending meanwhile; peak calls in flight %d (bound %d)",
		time.Since(marked), hangEnded.Load()-endedAtMark, peak.Load(), maxInFlight)
	// Another round of timeouts under the bound.
	time.Sleep(2 * time.Second)
	if p := peak.Load(); p > maxInFlight {
		t.Fatalf("%d status calls in flight at once across routes, bound %d", p, maxInFlight)
	}
	for i := range 5 {
		id := fmt.Sprintf("hang%d-000", i)
		if r, err := rig.e.Reservation(context.Background(), id); err != nil || r.State != ledger.StateUsageUnknown {
			t.Fatalf("%s: %v %v", id, r.State, err)
		}
	}
}
