package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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
	secret := []byte("0123456789abcdef-route-secret")
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
		op := strings.TrimPrefix(r.URL.Path, "/operations/")
		res := r.URL.Query().Get("reservationId")
		if err := opstatus.VerifyRequest(secret, r, res, op, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		opstatus.WriteAnswer(w, r, secret, opstatus.Answer{Status: opstatus.StatusFinished, OperationID: op, ReservationID: res,
			ActualUnits: map[string]int64{"tokens": 7}})
	}))
	defer answering.Close()

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "route.secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(cfgPath, []byte(`{"interval": "100ms", "minBackoff": "100ms", "maxBackoff": "200ms", "timeout": "3s", "routes": {
		"slow.route": {"statusUrl": "`+hanging.URL+`", "secretFile": "route.secret"},
		"fast.route": {"statusUrl": "`+answering.URL+`", "secretFile": "route.secret"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadResolverConfig(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	opts := cfg.opts
	e := engine.New(memstore.New(), engine.Options{Resolver: &opts})
	defer e.Close()
	ctx := context.Background()
	do := func(c ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, c); err != nil || res.Err != nil {
			t.Fatalf("%v %s: %v %v", c.Kind, c.ReservationID, err, res.Err)
		}
	}
	for _, route := range []string{"slow.route", "fast.route"} {
		p := ledger.Policy{
			Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: route, Region: "eu"},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 30, RefillUnits: 10, RefillInterval: time.Second}},
			HoldTTL:    time.Hour,
		}.WithDefaults()
		do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	unknown := func(id, route string) {
		do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: "tenant-7", Route: route, Region: "eu", Units: ledger.Amounts{300}})
		do(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
		do(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id})
	}
	// The hanging route's backlog, asked about again after every 0.2 s
	// backoff: its questions are outstanding nearly all the time.
	for _, id := range []string{"slow-1", "slow-2", "slow-3"} {
		unknown(id, "slow.route")
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
		unknown(id, "fast.route")
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
