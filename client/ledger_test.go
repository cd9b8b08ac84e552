package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// testLedger is a real capledger server (server + engine + SQLite file in
// a temporary directory, the stack `capledger serve` runs) listening on a
// real socket on 127.0.0.1, with a fault-injecting proxy in front of it.
type testLedger struct {
	addr  string // the server itself
	proxy *faultproxy.Proxy
	// direct talks to the server without faults (for setup and checks).
	direct *Client
	// engine is the server's engine (set by startShardLedgerWith).
	engine *engine.Engine
}

var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// noBreakerWatchdog is for clients that check the ledger rather than test
// the breaker: they wait for answers however slow. With the default
// breaker one answer later than DetectTimeout (1 s), nothing else
// answering, opens it (as documented), and a loaded CI machine running
// server and client in one process under -race got there once
// ("reserve ...: RESERVATION_UNKNOWN after 1 attempts: ... circuit
// breaker open"). A DetectTimeout as long as the call timeout arms no
// watchdog; the breaker still opens on failures.
var noBreakerWatchdog = WithBreaker(BreakerPolicy{DetectTimeout: DefaultTimeout})

// withoutWatchdog is for the set-up and check calls of a Client whose
// breaker watchdog is under test: calls on the returned context arm no
// watchdog (as Audit's), so one slow answer on a loaded machine cannot
// open the breaker before or after the outage the test is about.
func withoutWatchdog(ctx context.Context) context.Context {
	return context.WithValue(ctx, slowCallKey{}, true)
}

func startLedger(t *testing.T) *testLedger {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, engine.Options{WorkerInterval: 20 * time.Millisecond, Logger: quietLogger})
	srv := server.New(eng, server.Config{Logger: quietLogger})
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
	return &testLedger{addr: ln.Addr().String(), proxy: proxy, direct: direct}
}

// faultSeed returns the seed of the fault proxy's draws: $CAPLEDGER_FAULT_SEED
// if set, else the clock. It is logged, so a failed run's faults can be
// drawn again (the interleaving with the network still varies).
func faultSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAPLEDGER_FAULT_SEED"); s != "" {
		parsed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CAPLEDGER_FAULT_SEED=%q: %v", s, err)
		}
		seed = parsed
	}
	t.Logf("fault proxy seed %d (draw the same faults with CAPLEDGER_FAULT_SEED=%d)", seed, seed)
	return seed
}

// viaProxy returns a client whose calls cross the fault proxy.
func (l *testLedger) viaProxy(t *testing.T, opts ...Option) *Client {
	t.Helper()
	// No watchdog unless the test brings its own breaker policy: a test
	// about lost answers must not fail on one that was merely slow.
	c, err := New(l.proxy.Addr(), append([]Option{noBreakerWatchdog}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type policySpec struct {
	subject, route string
	burst          int64
	refill         int64
	interval       time.Duration
	holdTTL        time.Duration
	weight         int64
	priority       int32
	maxOverdraft   int64
	shadow         bool
}

func (l *testLedger) publish(t *testing.T, p policySpec) *ledgerv1.Policy {
	t.Helper()
	if p.holdTTL == 0 {
		p.holdTTL = time.Minute
	}
	dim := &ledgerv1.Dimension{Unit: "tokens", Burst: p.burst, RefillUnits: p.refill, MaxOverdraft: p.maxOverdraft}
	if p.interval > 0 {
		dim.RefillInterval = durationpb.New(p.interval)
	}
	pol := &ledgerv1.Policy{
		Subject: p.subject, Route: p.route,
		Dimensions:      []*ledgerv1.Dimension{dim, {Unit: "requests", Burst: 1 << 40}},
		EstimatorDigest: "sha256:e57",
		HoldTtl:         durationpb.New(p.holdTTL),
		FairnessWeight:  p.weight,
		Priority:        p.priority,
	}
	if p.shadow {
		pol.Rollout = ledgerv1.RolloutMode_ROLLOUT_MODE_SHADOW
	}
	got, _, err := l.direct.PublishPolicy(context.Background(), pol)
	if err != nil {
		t.Fatalf("publish %s/%s: %v", p.subject, p.route, err)
	}
	return got
}

// balance returns the tokens balance of the subject's newest account
// (zero before its first reservation).
func (l *testLedger) balance(t *testing.T, subject, route string) *ledgerv1.Balance {
	t.Helper()
	accounts, err := l.direct.GetAccount(context.Background(), subject, route, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(accounts) == 0 {
		return &ledgerv1.Balance{Unit: "tokens"} // never reserved: an empty book
	}
	for _, b := range accounts[len(accounts)-1].GetBalances() {
		if b.GetUnit() == "tokens" {
			return b
		}
	}
	t.Fatalf("no tokens balance for %s/%s", subject, route)
	return nil
}

func (l *testLedger) audit(t *testing.T) {
	t.Helper()
	ds, err := l.direct.Audit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ds {
		t.Errorf("audit: %s %s %s: %s", d.GetCheck(), d.GetAccount(), d.GetReservationId(), d.GetDetail())
	}
}

// countingTransport counts the HTTP requests a client sends, its
// breaker's probes included (they run on their own goroutine).
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

func isState(r *ledgerv1.Reservation, s ledgerv1.ReservationState) bool { return r.GetState() == s }

func mustErrAs[T error](t *testing.T, err error) T {
	t.Helper()
	var target T
	if !errors.As(err, &target) {
		t.Fatalf("error %v (%T) is not a %T", err, err, target)
	}
	return target
}

var (
	faultsNone      = faultproxy.Faults{}
	faultsPartition = faultproxy.Faults{Partition: true}
)
