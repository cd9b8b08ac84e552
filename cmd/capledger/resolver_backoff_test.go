package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
	secret := []byte("0123456789abcdef-route-secret")
	var mu sync.Mutex
	asked := map[string][]time.Time{}
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
	advance := func(d time.Duration) { now.Add(int64(d)) }

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.URL.Path, "/operations/")
		res := r.URL.Query().Get("reservationId")
		if err := opstatus.VerifyRequest(secret, r, res, op, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		mu.Lock()
		asked[res] = append(asked[res], clock())
		mu.Unlock()
		if res == "bad" {
			opstatus.WriteAnswer(w, r, []byte("another-secret-of-16+bytes"),
				opstatus.Answer{Status: opstatus.StatusFinished, OperationID: op, ReservationID: res, ActualUnits: map[string]int64{"tokens": 10}})
			return
		}
		opstatus.WriteAnswer(w, r, secret, opstatus.Answer{Status: opstatus.StatusRunning, OperationID: op, ReservationID: res})
	}))
	defer srv.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "route.secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(cfgPath, []byte(`{"routes": {"chat.generate": {"statusUrl": "`+srv.URL+`", "secretFile": "route.secret"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadResolverConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := cfg.opts
	opts.Seed = 11
	e := engine.New(memstore.New(), engine.Options{DisableWorkers: true, Clock: clock, Resolver: &opts})
	defer e.Close()
	ctx := context.Background()
	do := func(c ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, c); err != nil || res.Err != nil {
			t.Fatalf("%v %s: %v %v", c.Kind, c.ReservationID, err, res.Err)
		}
	}
	p := ledger.Policy{
		Key:            ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions:     []ledger.Dimension{{Unit: "tokens", Burst: 10000, RefillUnits: 10, RefillInterval: time.Second}},
		HoldTTL:        time.Minute,
		ExecutionLimit: 30 * time.Second,
	}.WithDefaults()
	do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	ids := []string{"bad", "run-1", "run-2", "run-3"}
	for _, id := range ids {
		do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-7", Route: "chat.generate", Region: "eu", Units: ledger.Amounts{300}})
		do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
	}
	advance(31 * time.Second)
	for _, id := range ids {
		do(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id})
	}

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
	if r, err := e.Reservation(ctx, "bad"); err != nil || r.State != ledger.StateUsageUnknown {
		t.Fatalf("bad: %v %v", r.State, err)
	}
}
