package envoyrls_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/envoyrls"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

const (
	adminToken   = "admin-token-0123456789"
	gatewayToken = "gateway-token-0123456789"
	viewerToken  = "viewer-token-0123456789"
	scopedToken  = "scoped-gateway-token-0123456789"
)

// harness is a real capledger server (engine, store, server, envoyrls)
// on a real socket, with the generated grpc-go RateLimitService client of
// go-control-plane — the client Envoy's own control planes use — and a
// Connect gRPC client of the LedgerService for setup and inspection.
type harness struct {
	t      testing.TB
	addr   string
	clock  *clock
	faults *memstore.Store
	engine *engine.Engine
	rls    rlsv3.RateLimitServiceClient
	front  *server.Front
	ledger capledgerv1connect.LedgerServiceClient
}

type options struct {
	config string
	auth   bool
	// faults runs on the in-memory store (commit failures on demand);
	// otherwise a SQLite file.
	faults bool
	// bridged leaves ShouldRateLimit unregistered on grpc-go, which then
	// serves it through its bridge to the connect handler.
	bridged bool
	// wrapStore, when set, wraps the store the engine is given.
	wrapStore func(store.Store) store.Store
	// wrapLedger, when set, wraps the engine the server is given.
	wrapLedger func(*engine.Engine) server.Ledger
	// postgres runs on PostgreSQL (a schema of its own in the database
	// CAPLEDGER_TEST_POSTGRES names; the test is skipped without it).
	postgres bool
	// retention, when positive, is the engine's retention window (and
	// tombstone horizon: 10 times it); the workers stay off, so a test
	// runs a pass with engine.RunRetention.
	retention time.Duration
}

func newHarness(t testing.TB, opts options) *harness {
	t.Helper()
	h := &harness{t: t, clock: &clock{now: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)}}
	var st store.Store
	if opts.faults {
		h.faults = memstore.New()
		st = h.faults
	} else if opts.postgres {
		if os.Getenv(replicatest.EnvDSN) == "" {
			t.Skip(replicatest.EnvDSN + " not set")
		}
		var err error
		if st, err = postgres.Open(context.Background(), replicatest.SchemaDSN(t)); err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if st, err = sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db")); err != nil {
			t.Fatal(err)
		}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	metrics := server.NewMetrics()
	engineStore := st
	if opts.wrapStore != nil {
		engineStore = opts.wrapStore(st)
	}
	h.engine = engine.New(engineStore, engine.Options{Clock: h.clock.Now, DisableWorkers: true, OnBatch: metrics.ObserveBatch, Logger: logger,
		Retention: opts.retention, TombstoneRetention: 10 * opts.retention})
	cfg := server.Config{Metrics: metrics, Logger: logger, Clock: h.clock.Now}
	if opts.auth {
		tokens, err := server.ParseTokens(strings.NewReader(adminToken + " admin ops\n" + gatewayToken + " gateway envoy\n" + viewerToken + " viewer watcher\n" + scopedToken + " gateway gw-a subjects=tenant-a/*\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tokens = tokens
	}
	var l server.Ledger = h.engine
	if opts.wrapLedger != nil {
		l = opts.wrapLedger(h.engine)
	}
	srv := server.New(l, cfg)
	mapping, err := envoyrls.ParseConfig([]byte(opts.config))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	rls := envoyrls.New(srv, mapping, logger)
	rls.Mount()

	// As serve does: gRPC connections on grpc-go (ShouldRateLimit
	// registered directly), the rest on net/http.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcServer := srv.GRPCServer(server.GRPCOptions{})
	if !opts.bridged {
		rls.RegisterGRPC(grpcServer)
	}
	front := &server.Front{HTTP: server.HTTPServer(srv.Handler(), logger), GRPC: grpcServer, Log: logger}
	go front.Serve(ln)
	h.addr, h.front = ln.Addr().String(), front

	conn, err := grpc.NewClient(h.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.rls = rlsv3.NewRateLimitServiceClient(conn)

	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	transport := &http.Transport{Protocols: protocols, TLSClientConfig: &tls.Config{}}
	h.ledger = capledgerv1connect.NewLedgerServiceClient(&http.Client{Transport: transport, Timeout: 10 * time.Second},
		"http://"+h.addr, connect.WithGRPC(), connect.WithInterceptors(bearer(adminToken)))
	t.Cleanup(func() {
		conn.Close()
		transport.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		front.Shutdown(ctx)
		h.engine.Close()
		st.Close()
	})
	return h
}

func bearer(token string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	})
}

// publish publishes a one-dimension policy (tokens or requests).
func (h *harness) publish(subject, route, unit string, burst, refill int64, every time.Duration, shadow bool) {
	h.t.Helper()
	p := &v1.Policy{Subject: subject, Route: route, Dimensions: []*v1.Dimension{{
		Unit: unit, Burst: burst, RefillUnits: refill, RefillInterval: durationpb.New(every),
	}}}
	if shadow {
		p.Rollout = v1.RolloutMode_ROLLOUT_MODE_SHADOW
	}
	if _, err := h.ledger.PublishPolicy(context.Background(), connect.NewRequest(&v1.PublishPolicyRequest{Policy: p})); err != nil {
		h.t.Fatalf("publish: %v", err)
	}
}

// balance returns the subject's current balance in its only dimension.
func (h *harness) balance(subject, route string) ledger.Balance {
	h.t.Helper()
	accounts, err := h.engine.Accounts(context.Background(), ledger.PolicyKey{Subject: subject, Route: route, Region: ledger.DefaultRegion})
	if err != nil || len(accounts) != 1 {
		h.t.Fatalf("accounts of %s/%s: %v %v", subject, route, accounts, err)
	}
	return accounts[0].Balances[0]
}

// reservation reads a reservation by id through the LedgerService.
func (h *harness) reservation(id string) *v1.Reservation {
	h.t.Helper()
	resp, err := h.ledger.GetReservation(context.Background(), connect.NewRequest(&v1.GetReservationRequest{ReservationId: id}))
	if err != nil {
		h.t.Fatalf("get reservation %s: %v", id, err)
	}
	return resp.Msg.GetReservation()
}

// descriptor builds an Envoy descriptor from key, value pairs.
func descriptor(hits *uint64, kv ...string) *rlscommon.RateLimitDescriptor {
	d := &rlscommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlscommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return d
}

func hits(n uint64) *uint64 { return &n }

// check calls ShouldRateLimit with the gateway token in the metadata, as
// Envoy's grpc_service initial_metadata sends it.
func (h *harness) check(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+gatewayToken)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return h.rls.ShouldRateLimit(ctx, req)
}

func (h *harness) mustCheck(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	h.t.Helper()
	resp, err := h.check(req)
	if err != nil {
		h.t.Fatalf("ShouldRateLimit %v: %v", req, err)
	}
	return resp
}

// header returns a response header Envoy would add to the client's answer.
func header(resp *rlsv3.RateLimitResponse, key string) string {
	for _, hv := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(hv.GetKey(), key) {
			return hv.GetValue()
		}
	}
	return ""
}
