package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/api/opstatus"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// TestResolverBacksOffAReservationWhoseAnswerFails: one reservation's
// answers fail verification (a "finished" signed with another secret)
// while the other reservations of its route answer "running". The
// failing one must be asked on the documented backoff (1 s doubling to
// 1 min, each wait in [d/2, d)), not again each time another
// reservation of its route gets an answer. Real HTTP endpoint, resolver
// config loaded as serve loads it, simulated clock.
func TestResolverBacksOffAReservationWhoseAnswerFails(t *testing.T) {
	var mu sync.Mutex
	asked := map[string][]time.Time{}
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	advance := func(d time.Duration) { now.Add(int64(d)) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, op, ok := statusQuestion(w, r)
		if !ok {
			return
		}
		mu.Lock()
		asked[res] = append(asked[res], clock())
		mu.Unlock()
		if res == "bad" {
			answerStatus(w, r, []byte("another-secret-of-16+bytes"), res, op, opstatus.StatusFinished)
			return
		}
		answerStatus(w, r, rigSecret, res, op, opstatus.StatusRunning)
	}))
	defer srv.Close()
	rig := newEngineRig(t, memstore.New(), "", map[string]string{"chat.generate": srv.URL},
		engine.Options{DisableWorkers: true, Clock: clock}, func(o *engine.ResolverOptions) { o.Seed = 11 })
	e := rig.e
	ctx := context.Background()
	ids := []string{"bad", "run-1", "run-2", "run-3"}
	rig.unknown("chat.generate", ids...)

	// 16 minutes, one scan a second.
	for range 16 * 60 {
		e.RunResolver(ctx)
		advance(time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	bad := asked["bad"]
	t.Logf("asked in 16 min: bad %d, running %d %d %d", len(bad), len(asked["run-1"]), len(asked["run-2"]), len(asked["run-3"]))
	// Gap k follows the k-th failed answer: at least half of
	// min(1s*2^(k-1), 1m), less a scan's second of rounding.
	short := 0
	for k := 1; k < len(bad); k++ {
		d := time.Second << min(k-1, 6)
		d = min(d, time.Minute)
		if gap := bad[k].Sub(bad[k-1]); gap < d/2-time.Second {
			short++
			t.Logf("gap %d is %v, want at least %v", k, gap, d/2)
		}
	}
	// No gap is short: its answers fail on their own (they arrive, with a
	// bad signature) while its route answers, so it is never asked out of
	// turn (that is for reservations whose route could not answer).
	if short > 0 {
		t.Fatalf("the failing reservation was asked %d times (%d gaps shorter than its backoff)", len(bad), short)
	}
	if most := max(len(asked["run-1"]), len(asked["run-2"]), len(asked["run-3"])); len(bad) > most {
		t.Fatalf("the failing reservation was asked %d times, a running one at most %d", len(bad), most)
	}
	if st := rig.state("bad"); st != ledger.StateUsageUnknown {
		t.Fatalf("bad: %v", st)
	}
}
