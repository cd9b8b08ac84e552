package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/faultproxy"
)

// probeWatch is the HTTP transport of a Client under test: it records
// when each breaker probe is sent and how many are in flight at once.
type probeWatch struct {
	next http.RoundTripper

	mu          sync.Mutex
	probeTimes  []time.Time
	inFlight    int
	maxInFlight int
}

func (w *probeWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if bytes.Contains(body, []byte(probeID)) {
		w.mu.Lock()
		w.probeTimes = append(w.probeTimes, time.Now())
		w.inFlight++
		w.maxInFlight = max(w.maxInFlight, w.inFlight)
		w.mu.Unlock()
		defer func() {
			w.mu.Lock()
			w.inFlight--
			w.mu.Unlock()
		}()
	}
	return w.next.RoundTrip(r)
}

func (w *probeWatch) probes() (times []time.Time, maxInFlight int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.probeTimes), w.maxInFlight
}

// Exactly one probe loop runs at a time. When an answer closes the
// breaker while its probe loop sleeps and the breaker trips again before
// the loop wakes, the second trip used to start a second probe loop: both
// probed, each on its own backoff, for the rest of the outage (and one
// more per such flap). Now the second trip restarts the running loop's
// wait from ProbeBase instead, so consecutive probes stay at least
// ProbeBase/2 apart (the least jittered wait) and never overlap.
func TestBreakerRunsOneProbeLoopAfterItTripsAgain(t *testing.T) {
	l := startLedger(t)
	const probeWait = 800 * time.Millisecond
	watch := &probeWatch{next: http.DefaultTransport.(*http.Transport).Clone()}
	gw, err := New(l.proxy.Addr(), WithHTTPClient(&http.Client{Transport: watch}), WithTimeout(2*time.Second),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 1}),
		WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 50 * time.Millisecond, ProbeBase: probeWait, ProbeMax: probeWait}))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ctx := context.Background()

	// The proxy refuses every request: calls fail until the breaker trips.
	l.proxy.SetFaults(faultproxy.Faults{DropRequest: 1})
	tripWhenRefused := func(trips int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); gw.Breaker().Trips < trips; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the breaker did not trip (%+v)", gw.Breaker())
			}
			_, _ = gw.GetReservation(ctx, "refused")
		}
	}
	tripWhenRefused(1)
	tripped := gw.Breaker().OpenedAt

	// An answer closes the breaker while its probe loop sleeps, and the
	// next refused calls trip it again before that loop's first wake
	// (ProbeBase/2 at the earliest). The answer is the one an attempt
	// gets when it passed allow just before the first trip and was
	// registered just after it (so the trip could not abandon it): do has
	// no seam between the two, so the test records it as do would.
	gw.breaker.answered()
	if st := gw.Breaker(); st.State != BreakerClosed {
		t.Fatalf("breaker %+v after the late answer", st)
	}
	tripWhenRefused(2)
	trippedAgain := gw.Breaker().OpenedAt // set by the trip, before it rearms the loop
	if since := trippedAgain.Sub(tripped); since >= probeWait/2 {
		t.Skipf("the second trip came %s after the first: the first probe loop may have woken (machine too slow for this test)", since)
	}

	// Three probe waits of the outage: one loop probes every
	// [ProbeBase/2, ProbeBase); two loops probe closer together.
	time.Sleep(3 * probeWait)
	times, maxInFlight := watch.probes()
	if len(times) < 2 {
		t.Fatalf("%d probes in %s of outage", len(times), 3*probeWait)
	}
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < probeWait/2 {
			t.Fatalf("probes %d and %d were %s apart, less than the least wait of one probe loop (%s): more than one probe loop runs (%d probes, at most %d in flight)",
				i-1, i, gap, probeWait/2, len(times), maxInFlight)
		}
	}
	if maxInFlight > 1 {
		t.Fatalf("%d probes in flight at once", maxInFlight)
	}
	// The second trip started the wait again from ProbeBase.
	if first := times[0].Sub(trippedAgain); first < probeWait/2 {
		t.Fatalf("the first probe came %s after the second trip, before the least wait from ProbeBase (%s)", first, probeWait/2)
	}

	// The ledger returns: a probe closes the breaker.
	l.proxy.SetFaults(faultproxy.Faults{})
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := gw.WaitReachable(wctx); err != nil {
		t.Fatalf("breaker %+v: %v", gw.Breaker(), err)
	}
	t.Logf("%d probes over the outage, at most %d in flight", len(times), maxInFlight)

	// The loop ended with the outage; the next trip starts a new one,
	// whose probe closes the breaker when the ledger returns.
	l.proxy.SetFaults(faultproxy.Faults{DropRequest: 1})
	tripWhenRefused(3)
	l.proxy.SetFaults(faultproxy.Faults{})
	if err := gw.WaitReachable(wctx); err != nil {
		t.Fatalf("after a third trip: breaker %+v: %v", gw.Breaker(), err)
	}
}
