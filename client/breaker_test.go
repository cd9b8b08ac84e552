package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// startShardLedger is startLedger with shard signing keys, so that
// gateways can be issued emergency shards.
func startShardLedger(t *testing.T) *testLedger {
	t.Helper()
	return startShardLedgerWith(t, engine.Options{})
}

// startShardLedgerWith is startShardLedger with the engine's options opts
// (its WorkerInterval and Logger are set here); the engine is kept in the
// testLedger.
func startShardLedgerWith(t *testing.T, opts engine.Options) *testLedger {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	keys, _, err := server.EnsureShardKeys(filepath.Join(dir, "shard-keys"))
	if err != nil {
		t.Fatal(err)
	}
	opts.WorkerInterval, opts.Logger = 20*time.Millisecond, quietLogger
	eng := engine.New(st, opts)
	srv := server.New(eng, server.Config{Logger: quietLogger, Shards: &server.ShardConfig{Keys: keys, MaxTTL: time.Hour}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := server.HTTPServer(srv.Handler(), quietLogger)
	go hs.Serve(ln)
	proxy, err := faultproxy.Start(ln.Addr().String(), faultSeed(t))
	if err != nil {
		t.Fatal(err)
	}
	direct, err := New(ln.Addr().String(), noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		direct.Close()
		proxy.Close()
		hs.Close()
		eng.Close()
		st.Close()
	})
	return &testLedger{addr: ln.Addr().String(), proxy: proxy, direct: direct, engine: eng}
}

// emergencyGateway returns a gateway's Client (through the fault proxy)
// and Emergency with a provisioned shard of 100,000 tokens.
func emergencyGateway(t *testing.T, l *testLedger, opts ...Option) (*Client, *Emergency) {
	t.Helper()
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}},
	}); err != nil {
		t.Fatal(err)
	}
	gw := l.viaProxy(t, opts...)
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(gw, store, EmergencyOptions{})
	if _, err := em.Provision(withoutWatchdog(context.Background()), ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100_000}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return gw, em
}

var breakerFaults = map[string]faultproxy.Faults{
	// Every request is swallowed and its connection cut: resets.
	"reset": {DropRequest: 1},
	// Every byte is swallowed and nothing is closed: a blackhole.
	"blackhole": {Partition: true},
}

// Issue 23, item 1: once the breaker knows the ledger is unreachable,
// Emergency serves every request from its shard without sending anything
// to the ledger but the breaker's own probes; the first request's lost
// Reserve is looked up in the background; when the ledger returns, a
// probe closes the breaker and admission is central again.
func TestBreakerServesFromTheShardOnceTheLedgerIsKnownDown(t *testing.T) {
	for _, name := range []string{"reset", "blackhole"} {
		t.Run(name, func(t *testing.T) {
			l := startShardLedger(t)
			gw, em := emergencyGateway(t, l, WithTimeout(2*time.Second),
				WithBreaker(BreakerPolicy{DetectTimeout: 300 * time.Millisecond, ProbeBase: 50 * time.Millisecond, ProbeMax: 200 * time.Millisecond}))
			ctx := context.Background()
			reserveOn := func(ctx context.Context) *EmergencyReservation {
				t.Helper()
				r, err := em.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			reserve := func() *EmergencyReservation { t.Helper(); return reserveOn(ctx) }
			// The watchdog is armed only by the calls in the outage.
			if r := reserveOn(withoutWatchdog(ctx)); r.Central == nil {
				t.Fatalf("healthy reserve went local: %+v", r)
			}

			l.proxy.SetFaults(breakerFaults[name])
			l.proxy.CutAll()
			began := time.Now()
			var local []string
			var firstErr error
			for gw.Breaker().State == BreakerClosed {
				if len(local) == 20 {
					t.Fatalf("20 requests and the breaker is still closed: %+v", gw.Breaker())
				}
				r := reserve()
				if r.Local == nil || !Unreachable(r.LedgerErr) {
					t.Fatalf("reserve while the ledger is down: %+v", r)
				}
				if firstErr == nil {
					firstErr = r.LedgerErr
				}
				local = append(local, r.ReservationID)
			}
			t.Logf("%s: breaker opened after %s and %d requests", name, time.Since(began), len(local))
			if name == "blackhole" {
				// The abandoned attempt's Reserve may have been sent: its
				// lookup continues in the background, tracked.
				var unknown *ReservationUnknownError
				if !errors.As(firstErr, &unknown) || !unknown.LookingUp {
					t.Fatalf("the abandoned Reserve is not looked up in the background: %v", firstErr)
				}
			}

			// Known down: nothing more goes to the ledger but the probes.
			before, probes := l.proxy.Stats(), gw.Breaker().Probes
			for range 50 {
				r := reserve()
				if r.Local == nil || !errors.Is(r.LedgerErr, ErrLedgerUnreachable) {
					t.Fatalf("reserve with the breaker open: %+v", r)
				}
				local = append(local, r.ReservationID)
				if err := em.Start(ctx, r.ReservationID, "op-"+r.ReservationID); err != nil {
					t.Fatal(err)
				}
				if err := em.Settle(ctx, r.ReservationID, "op-"+r.ReservationID, Units{"tokens": 7}); err != nil {
					t.Fatal(err)
				}
			}
			after, probed := l.proxy.Stats(), gw.Breaker().Probes-probes
			sent := (after.DroppedRequests + after.Partitioned + after.Accepted) - (before.DroppedRequests + before.Partitioned + before.Accepted)
			if sent > 3*(probed+1) {
				t.Fatalf("50 requests with the breaker open reached the network %d times, with %d probes", sent, probed)
			}

			// The ledger returns: a probe closes the breaker.
			l.proxy.SetFaults(faultproxy.Faults{})
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := gw.WaitReachable(wctx); err != nil {
				t.Fatalf("breaker %+v: %v", gw.Breaker(), err)
			}
			if st := gw.Breaker(); st.Trips != 1 || st.Probes == 0 {
				t.Fatalf("breaker stats after the outage %+v", st)
			}
			// The lost reserves' lookups run on the Client's own contexts,
			// each arming the watchdog: one slow answer among them may open
			// the breaker again (as documented) and abandon a call in
			// flight, so the test's own calls wait until they are done.
			for len(gw.LostReserves()) > 0 {
				if wctx.Err() != nil {
					t.Fatalf("lost reserves never resolved: %+v", gw.LostReserves())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := gw.WaitReachable(wctx); err != nil {
				t.Fatalf("breaker %+v: %v", gw.Breaker(), err)
			}
			if r := reserveOn(withoutWatchdog(ctx)); r.Central == nil {
				t.Fatalf("reserve after recovery went local: %+v", r)
			}
			// Every offline request is in the shard, none centrally held.
			receipts, err := em.store.Receipts(em.store.Shards()[0].Shard.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range local {
				if !slices.ContainsFunc(receipts, func(r LocalReceipt) bool { return r.ReservationID == id }) {
					t.Fatalf("offline request %s is not in the shard", id)
				}
				if res, err := l.direct.GetReservation(ctx, id); err == nil && res.GetState() == ledgerv1.ReservationState_RESERVATION_STATE_RESERVED {
					t.Fatalf("offline request %s is also held centrally", id)
				}
			}
		})
	}
}

// A Reserve never runs past its caller's deadline, even when the breaker
// has not opened yet: the lookup of its lost answer moves to the
// background instead of holding the caller for twice the call timeout.
func TestLostReserveLookupDoesNotHoldTheCaller(t *testing.T) {
	l := startShardLedger(t)
	// Detection slower than the caller: only the caller's deadline ends it.
	gw, _ := emergencyGateway(t, l, WithTimeout(time.Hour), WithBreaker(BreakerPolicy{DetectTimeout: time.Hour}))
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := gw.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
	var unknown *ReservationUnknownError
	if !errors.As(err, &unknown) || !unknown.LookingUp {
		t.Fatalf("reserve past its deadline: %v", err)
	}
	if lost := gw.LostReserves(); len(lost) != 1 || lost[0].ReservationID != unknown.ReservationID {
		t.Fatalf("lost reserves %+v", lost)
	}
	if ctx.Err() == nil {
		t.Fatal("Reserve returned before its deadline with an unknown outcome")
	}
	// The partition heals; the background lookup finds out (nothing got
	// through the blackhole) and stops.
	l.proxy.SetFaults(faultproxy.Faults{})
	for deadline := time.Now().Add(30 * time.Second); len(gw.LostReserves()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the lookup never finished: %+v", gw.LostReserves())
		}
	}
}

// TestBreakerFigures measures what docs/PERFORMANCE.md reports: time to
// detect, and the latency Emergency.Reserve adds over the shard itself once
// the breaker is open. It runs only with CAPLEDGER_BREAKER_FIGURES=1.
func TestBreakerFigures(t *testing.T) {
	if os.Getenv("CAPLEDGER_BREAKER_FIGURES") == "" {
		t.Skip("set CAPLEDGER_BREAKER_FIGURES=1 to measure")
	}
	for _, name := range []string{"reset", "blackhole"} {
		l := startShardLedger(t)
		gw, em := emergencyGateway(t, l) // default timeout and breaker
		ctx := context.Background()
		req := func() ReserveRequest {
			return ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}}
		}
		if _, err := em.Reserve(ctx, req()); err != nil {
			t.Fatal(err)
		}
		l.proxy.SetFaults(breakerFaults[name])
		l.proxy.CutAll()
		began := time.Now()
		first := time.Duration(0)
		n := 0
		for gw.Breaker().State == BreakerClosed {
			s := time.Now()
			if _, err := em.Reserve(ctx, req()); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				first = time.Since(s)
			}
			n++
		}
		detect := time.Since(began)
		// Interleaved: the shard alone (baseline) and Emergency.Reserve.
		var base, open []time.Duration
		for range 2000 {
			r := req()
			id, digest, _ := prepare(&r)
			s := time.Now()
			if _, err := em.store.Reserve(id, digest, r.Subject, r.Route, r.Region, r.Units); err != nil {
				t.Fatal(err)
			}
			base = append(base, time.Since(s))
			s = time.Now()
			if _, err := em.Reserve(ctx, req()); err != nil {
				t.Fatal(err)
			}
			open = append(open, time.Since(s))
		}
		slices.Sort(base)
		slices.Sort(open)
		q := func(d []time.Duration, p float64) time.Duration { return d[int(p*float64(len(d)-1))] }
		t.Logf("%s: detected after %s (%d requests, the first took %s); shard alone p50 %s p99 %s; Emergency.Reserve with the breaker open p50 %s p99 %s (ratio p50 %.2f)",
			name, detect.Round(time.Millisecond), n, first.Round(time.Millisecond), q(base, .5), q(base, .99), q(open, .5), q(open, .99),
			float64(q(open, .5))/float64(q(base, .5)))
		if name == "reset" {
			// The same requests without a breaker: each pays its retries.
			nobreaker := l.viaProxy(t, WithBreaker(BreakerPolicy{Disabled: true}))
			em2 := NewEmergency(nobreaker, em.store, EmergencyOptions{})
			var d []time.Duration
			for range 5 {
				s := time.Now()
				if _, err := em2.Reserve(ctx, req()); err != nil {
					t.Fatal(err)
				}
				d = append(d, time.Since(s))
			}
			slices.Sort(d)
			t.Logf("reset without a breaker: Emergency.Reserve p50 %s (of 5)", d[2].Round(time.Millisecond))
		}
	}
}

// TestBreakerOverheadFigures measures what the breaker costs a healthy
// ledger's Reserve: the same calls through a Client with the breaker and
// one without, interleaved. Only with CAPLEDGER_BREAKER_FIGURES=1.
func TestBreakerOverheadFigures(t *testing.T) {
	if os.Getenv("CAPLEDGER_BREAKER_FIGURES") == "" {
		t.Skip("set CAPLEDGER_BREAKER_FIGURES=1 to measure")
	}
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1 << 40})
	on, err := New(l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer on.Close()
	off, err := New(l.addr, WithBreaker(BreakerPolicy{Disabled: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	ctx := context.Background()
	var withB, without []time.Duration
	for i := range 4000 {
		c, into := on, &withB
		if i%2 == 1 {
			c, into = off, &without
		}
		s := time.Now()
		if _, err := c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}}); err != nil {
			t.Fatal(err)
		}
		*into = append(*into, time.Since(s))
	}
	slices.Sort(withB)
	slices.Sort(without)
	q := func(d []time.Duration, p float64) time.Duration { return d[int(p*float64(len(d)-1))] }
	t.Logf("healthy Reserve: breaker on p50 %s p99 %s; off p50 %s p99 %s (ratio p50 %.2f)",
		q(withB, .5), q(withB, .99), q(without, .5), q(without, .99), float64(q(withB, .5))/float64(q(without, .5)))
}
