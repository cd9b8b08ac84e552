package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

// clock is a settable time source, so retry-after values and expiry are
// deterministic.
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
)

type harness struct {
	t      testing.TB
	url    string
	clock  *clock
	store  store.Store
	faults *memstore.Store // set with harnessOptions.faults
	engine *engine.Engine
	http   *http.Client
	srv    *server.Server
	front  *server.Front
	// dbPath is the SQLite file the store is in ("" with faults).
	dbPath string
}

type harnessOptions struct {
	auth    bool
	workers bool
	maxBody int64
	// tokens, when set with auth, is the tokens file instead of the
	// default admin + gateway pair.
	tokens string
	// faults runs on the in-memory store, whose fault injection (a failed
	// commit, a lost commit acknowledgement) a SQLite file cannot offer;
	// otherwise the store is a SQLite file in a temporary directory.
	faults bool
	// postgres runs on PostgreSQL (a schema of its own in the database
	// CAPLEDGER_TEST_POSTGRES names; the test is skipped without it).
	postgres bool
	// resolver runs the engine's USAGE_UNKNOWN resolver and shows it
	// (server.Config.Resolver).
	resolver *engine.ResolverOptions
	// retention is the engine's retention window (0: off).
	retention time.Duration
	// statementRetention is the engine's StatementRetention (0: off).
	statementRetention time.Duration
	// compaction cuts a checkpoint every hour (engine.CompactionOptions);
	// the test runs the passes (engine.RunCompaction).
	compaction bool
	// ready is server.Config.ReadyCheck.
	ready func(ctx context.Context) (string, error)
	// wrapStore, when set, wraps the store the engine is given (to count
	// its reads); the harness's own reads use the store itself.
	wrapStore func(store.Store) store.Store
	// wrapConsole, when set, wraps the console store the server is given
	// (to count its reads).
	wrapConsole func(store.ConsoleStore) store.ConsoleStore
	// wrapRollouts, when set, wraps the rollout store the server is given.
	wrapRollouts func(store.Rollouts) store.Rollouts
	// logs, when set, receives the server's and the engine's log (text).
	logs io.Writer
	// shards serves the ShardService, with a key ring in a temporary
	// directory.
	shards bool
}

// newHarness serves a real server on 127.0.0.1:0 over a real engine.
func newHarness(t testing.TB, opts harnessOptions) *harness {
	t.Helper()
	h := &harness{t: t, clock: &clock{now: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)}}
	if opts.faults {
		h.faults = memstore.New()
		h.store = h.faults
	} else if opts.postgres {
		if os.Getenv("CAPLEDGER_TEST_POSTGRES") == "" {
			t.Skip("CAPLEDGER_TEST_POSTGRES not set")
		}
		st, err := postgres.Open(context.Background(), replicatest.SchemaDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		h.store = st
	} else {
		h.dbPath = filepath.Join(t.TempDir(), "ledger.db")
		st, err := sqlite.Open(context.Background(), h.dbPath)
		if err != nil {
			t.Fatal(err)
		}
		h.store = st
	}
	metrics := server.NewMetrics()
	logTo := io.Writer(io.Discard)
	if opts.logs != nil {
		logTo = opts.logs
	}
	logger := slog.New(slog.NewTextHandler(logTo, nil))
	engineStore := h.store
	if opts.wrapStore != nil {
		engineStore = opts.wrapStore(h.store)
	}
	engineOpts := engine.Options{
		Clock: h.clock.Now, DisableWorkers: !opts.workers, WorkerInterval: 5 * time.Millisecond,
		OnBatch: metrics.ObserveBatch, Logger: logger, Resolver: opts.resolver,
		Retention: opts.retention, TombstoneRetention: 10 * opts.retention, StatementRetention: opts.statementRetention,
	}
	if opts.compaction {
		engineOpts.Compaction = &engine.CompactionOptions{Every: time.Hour}
	}
	h.engine = engine.New(engineStore, engineOpts)
	cfg := server.Config{Metrics: metrics, Logger: logger, MaxBodyBytes: opts.maxBody, Clock: h.clock.Now, ReadyCheck: opts.ready}
	if opts.resolver != nil {
		cfg.Resolver = h.engine
	}
	if rollouts, ok := h.store.(store.Rollouts); ok {
		cfg.Rollouts = rollouts
		if opts.wrapRollouts != nil {
			cfg.Rollouts = opts.wrapRollouts(rollouts)
		}
	}
	cfg.Drains = h.engine
	if opts.shards {
		keys, _, err := server.EnsureShardKeys(filepath.Join(t.TempDir(), "shard-keys"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Shards = &server.ShardConfig{Keys: keys, MaxTTL: time.Hour}
	}
	if cs, ok := h.store.(store.ConsoleStore); ok {
		cfg.Console = cs
		if opts.wrapConsole != nil {
			cfg.Console = opts.wrapConsole(cs)
		}
	}
	if opts.auth {
		file := "# role per token\n" + adminToken + " admin ops\n\n" + gatewayToken + " gateway gw-1\n"
		if opts.tokens != "" {
			file = opts.tokens
		}
		tokens, err := server.ParseTokens(strings.NewReader(file))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Tokens = tokens
	}
	h.srv = server.New(h.engine, cfg)
	h.url, h.front = serveFront(t, h.srv)
	h.http = &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(func() {
		h.engine.Close()
		h.store.Close()
	})
	return h
}

// otherReplica is another server over h's engine and store, as a second
// replica on one store is: its own policy cache and counters, the same
// ledger. Its log is discarded.
func (h *harness) otherReplica() *harness {
	other := *h
	other.url = serve(h.t, server.New(h.engine, server.Config{Clock: h.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	return &other
}

func serve(t testing.TB, srv *server.Server) string {
	t.Helper()
	url, _ := serveFront(t, srv)
	return url
}

// serveFront serves srv as serve does by default (server.Front: gRPC on
// grpc-go, the rest on net/http) on 127.0.0.1:0.
func serveFront(t testing.TB, srv *server.Server) (string, *server.Front) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	front := &server.Front{HTTP: server.HTTPServer(srv.Handler(), logger), GRPC: srv.GRPCServer(server.GRPCOptions{}), Log: logger}
	go front.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		front.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String(), front
}

// serveNetHTTP serves srv as serve --grpc-transport net/http does: every
// protocol, gRPC included, on net/http (connect-go's gRPC).
func serveNetHTTP(t testing.TB, srv *server.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpServer := server.HTTPServer(srv.Handler(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	go httpServer.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		httpServer.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// response is a decoded JSON answer.
type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    []byte
}

// call POSTs a JSON body to a LedgerService method with the Connect
// protocol, as a gateway in any language would.
func (h *harness) call(method, body, token string) response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/"+method, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return h.do(req)
}

func (h *harness) do(req *http.Request) response {
	h.t.Helper()
	resp, err := h.http.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	out := response{status: resp.StatusCode, header: resp.Header, raw: raw}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			h.t.Fatalf("decode %s: %v", raw, err)
		}
	}
	return out
}

// ok asserts a 200 and returns the body.
func (h *harness) ok(method, body, token string) map[string]any {
	h.t.Helper()
	r := h.call(method, body, token)
	if r.status != http.StatusOK {
		h.t.Fatalf("%s %s: status %d: %s", method, body, r.status, r.raw)
	}
	return r.body
}

// wantError asserts an error status, Connect code and detail reason.
func (h *harness) wantError(r response, status int, code, reason string) {
	h.t.Helper()
	if r.status != status || r.body["code"] != code {
		h.t.Fatalf("want %d %s, got %d: %s", status, code, r.status, r.raw)
	}
	if reason == "" {
		return
	}
	if got := detailReason(h.t, r); got != reason {
		h.t.Fatalf("want reason %s, got %q: %s", reason, got, r.raw)
	}
}

// details decodes the error details of a Connect JSON error.
func details(t testing.TB, r response) []proto.Message {
	t.Helper()
	list, _ := r.body["details"].([]any)
	var out []proto.Message
	for _, item := range list {
		d := item.(map[string]any)
		value, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d["value"].(string), "="))
		if err != nil {
			t.Fatalf("detail value: %v", err)
		}
		var msg proto.Message
		switch d["type"] {
		case "capledger.v1.ErrorDetail":
			msg = &v1.ErrorDetail{}
		case "capledger.v1.RejectionDetail":
			msg = &v1.RejectionDetail{}
		default:
			t.Fatalf("unexpected detail type %v", d["type"])
		}
		if err := proto.Unmarshal(value, msg); err != nil {
			t.Fatal(err)
		}
		out = append(out, msg)
	}
	return out
}

func detailReason(t testing.TB, r response) string {
	for _, d := range details(t, r) {
		switch m := d.(type) {
		case *v1.ErrorDetail:
			return m.GetReason()
		case *v1.RejectionDetail:
			return m.GetReason()
		}
	}
	return ""
}

const tokensPolicy = `{"policy":{"subject":"tenant-7","route":"chat.generate",
  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"100","refillInterval":"1s","maxReservation":"900"},
                {"unit":"requests","burst":"10","refillUnits":"1","refillInterval":"1s"}],
  "holdTtl":"30s"}}`

func reserveBody(id string, tokens int) string {
	return fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-7","route":"chat.generate","units":{"tokens":%d,"requests":1}}`, id, tokens)
}

func num(v any) int64 {
	switch x := v.(type) {
	case string:
		var n int64
		fmt.Sscan(x, &n)
		return n
	case float64:
		return int64(x)
	}
	return 0
}

func field(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

func TestLifecycleOverJSON(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	pub := h.ok("PublishPolicy", tokensPolicy, "")
	if g := num(field(pub, "policy", "generation")); g != 1 {
		t.Fatalf("generation %d, want 1: %v", g, pub)
	}
	if field(pub, "policy", "active") != true || field(pub, "policy", "region") != "global" {
		t.Fatalf("published policy: %v", pub)
	}

	res := h.ok("Reserve", reserveBody("r-1", 600), "")
	if field(res, "reservation", "state") != "RESERVATION_STATE_RESERVED" || num(field(res, "reservation", "reservedUnits", "tokens")) != 600 {
		t.Fatalf("reserve: %v", res)
	}
	if !strings.HasPrefix(field(res, "reservation", "requestDigest").(string), "sha256:") {
		t.Fatalf("derived digest missing: %v", res)
	}
	// A retry returns the same receipt and debits nothing.
	again := h.ok("Reserve", reserveBody("r-1", 600), "")
	if again["replayed"] != true || field(again, "reservation", "createdAt") != field(res, "reservation", "createdAt") {
		t.Fatalf("replay: %v", again)
	}
	h.ok("Start", `{"reservationId":"r-1","operationId":"op-1"}`, "")
	settled := h.ok("Settle", `{"reservationId":"r-1","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, "")
	if field(settled, "reservation", "state") != "RESERVATION_STATE_SETTLED" ||
		num(field(settled, "refundedUnits", "tokens")) != 400 || num(field(settled, "reservation", "actualUnits", "tokens")) != 200 {
		t.Fatalf("settle: %v", settled)
	}
	// Replayed settle refunds nothing twice.
	replay := h.ok("Settle", `{"reservationId":"r-1","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, "")
	if replay["replayed"] != true || replay["refundedUnits"] != nil {
		t.Fatalf("settle replay: %v", replay)
	}

	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	accounts := acct["accounts"].([]any)
	if len(accounts) != 1 {
		t.Fatalf("accounts: %v", acct)
	}
	tokens := accounts[0].(map[string]any)["balances"].([]any)[0].(map[string]any)
	if tokens["unit"] != "tokens" || num(tokens["available"]) != 800 || num(tokens["spent"]) != 200 || num(tokens["reserved"]) != 0 {
		t.Fatalf("tokens balance: %v", tokens)
	}

	got := h.ok("GetReservation", `{"reservationId":"r-1"}`, "")
	if field(got, "reservation", "operationId") != "op-1" || field(got, "reservation", "schema") != "limitReservation.v1" {
		t.Fatalf("get: %v", got)
	}
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}

func TestCapacityRejectionIs429WithRetryAfterAndDetail(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	// Spend 700 (burst caps available + reserved, so a hold would keep
	// refill from making room).
	h.ok("Reserve", reserveBody("a", 700), "")
	h.ok("Start", `{"reservationId":"a","operationId":"op"}`, "")
	h.ok("Settle", `{"reservationId":"a","operationId":"op","actualUnits":{"tokens":700,"requests":1}}`, "")
	r := h.call("Reserve", reserveBody("b", 600), "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonInsufficientCapacity)
	// 300 tokens short at 100 per second, counted from the refill cursor
	// (now, on the fake clock): exactly 3 seconds.
	if got := r.header.Get("Retry-After"); got != "3" {
		t.Fatalf("Retry-After %q, want 3", got)
	}
	detail := details(t, r)[0].(*v1.RejectionDetail)
	if detail.GetPolicyGeneration() != 1 || detail.GetLimitingDimension() != "tokens" || detail.GetRetryAfter().AsDuration() != 3*time.Second {
		t.Fatalf("detail %v", detail)
	}
	// The rejection does not leak balances.
	if bytes.Contains(r.raw, []byte("300")) || bytes.Contains(r.raw, []byte("available")) {
		t.Fatalf("rejection exposes balances: %s", r.raw)
	}

	// Too large for the policy: 429 with no Retry-After (no wait helps).
	r = h.call("Reserve", reserveBody("c", 950), "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonReservationTooLarge)
	if got := r.header.Get("Retry-After"); got != "" {
		t.Fatalf("Retry-After %q on a reservation that can never fit", got)
	}

	// After the refill the same request fits.
	h.clock.Advance(3 * time.Second)
	h.ok("Reserve", reserveBody("b", 600), "")
}

func TestDebtFreezesAdmission(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("a", 600), "")
	h.ok("Reserve", reserveBody("b", 400), "")
	h.ok("Start", `{"reservationId":"a","operationId":"op"}`, "")
	settled := h.ok("Settle", `{"reservationId":"a","operationId":"op","actualUnits":{"tokens":900,"requests":1}}`, "")
	if field(settled, "reservation", "state") != "RESERVATION_STATE_SETTLED_WITH_DEBT" || num(field(settled, "reservation", "overdraftUnits", "tokens")) != 300 {
		t.Fatalf("settle with debt: %v", settled)
	}
	r := h.call("Reserve", reserveBody("c", 1), "")
	h.wantError(r, http.StatusTooManyRequests, "resource_exhausted", server.ReasonAdmissionFrozen)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("frozen admission without Retry-After")
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	a := acct["accounts"].([]any)[0].(map[string]any)
	if a["frozen"] != true || num(a["balances"].([]any)[0].(map[string]any)["debt"]) != 300 {
		t.Fatalf("account: %v", a)
	}
}

func TestErrorMapping(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("held", 100), "")
	h.ok("Reserve", reserveBody("released", 100), "")
	h.ok("Release", `{"reservationId":"released"}`, "")
	h.ok("Reserve", reserveBody("started", 100), "")
	h.ok("Start", `{"reservationId":"started","operationId":"op-1"}`, "")
	h.ok("Reserve", reserveBody("settled", 100), "")
	h.ok("Start", `{"reservationId":"settled","operationId":"op-2"}`, "")
	h.ok("Settle", `{"reservationId":"settled","operationId":"op-2","actualUnits":{"tokens":50,"requests":1}}`, "")

	cases := []struct {
		name, method, body string
		status             int
		code, reason       string
	}{
		{"digest mismatch", "Reserve", reserveBody("held", 101), 409, "already_exists", server.ReasonDigestMismatch},
		{"no policy", "Reserve", `{"reservationId":"x","subject":"tenant-7","route":"other","units":{"tokens":1}}`, 404, "not_found", server.ReasonNoPolicy},
		{"unknown reservation", "Start", `{"reservationId":"nope","operationId":"op"}`, 404, "not_found", server.ReasonReservationNotFound},
		{"unknown reservation settle", "Settle", `{"reservationId":"nope","operationId":"op"}`, 404, "not_found", server.ReasonReservationNotFound},
		{"unknown reservation get", "GetReservation", `{"reservationId":"nope"}`, 404, "not_found", server.ReasonReservationNotFound},
		{"unknown policy", "GetPolicy", `{"generation":"99"}`, 404, "not_found", server.ReasonPolicyNotFound},
		{"unknown policy rollback", "RollbackPolicy", `{"generation":"99"}`, 404, "not_found", server.ReasonPolicyNotFound},
		{"settle unstarted", "Settle", `{"reservationId":"held","operationId":"op","actualUnits":{"tokens":1,"requests":1}}`, 400, "failed_precondition", server.ReasonNotStarted},
		{"release started", "Release", `{"reservationId":"started"}`, 400, "failed_precondition", server.ReasonAlreadyStarted},
		// Settled work is past starting: the answer a retired one's tombstone gives too.
		{"release settled", "Release", `{"reservationId":"settled"}`, 400, "failed_precondition", server.ReasonAlreadySettled},
		{"start released", "Start", `{"reservationId":"released","operationId":"op"}`, 400, "failed_precondition", server.ReasonReleased},
		{"operation mismatch", "Start", `{"reservationId":"started","operationId":"other"}`, 400, "failed_precondition", server.ReasonOperationMismatch},
		{"settle differently", "Settle", `{"reservationId":"settled","operationId":"op-2","actualUnits":{"tokens":60,"requests":1}}`, 400, "failed_precondition", server.ReasonAlreadySettled},
		{"unknown on reserved", "MarkUsageUnknown", `{"reservationId":"held"}`, 400, "failed_precondition", server.ReasonNotStarted},
		{"negative units", "Reserve", `{"reservationId":"neg","subject":"tenant-7","route":"chat.generate","units":{"tokens":-5}}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"no units", "Reserve", `{"reservationId":"none","subject":"tenant-7","route":"chat.generate"}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"missing id", "Reserve", `{"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"long id", "GetReservation", `{"reservationId":"` + strings.Repeat("x", 300) + `"}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"any subject", "Reserve", `{"reservationId":"star","subject":"*","route":"chat.generate","units":{"tokens":1}}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"unknown unit", "Reserve", `{"reservationId":"u","subject":"tenant-7","route":"chat.generate","units":{"gpus":1}}`, 400, "invalid_argument", server.ReasonUnknownUnit},
		{"unknown unit at 0", "Reserve", `{"reservationId":"u0","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"gpus":0}}`, 400, "invalid_argument", server.ReasonUnknownUnit},
		{"unknown unit settle", "Settle", `{"reservationId":"started","operationId":"op-1","actualUnits":{"gpus":1}}`, 400, "invalid_argument", server.ReasonUnknownUnit},
		{"invalid policy", "PublishPolicy", `{"policy":{"subject":"s","route":"r","dimensions":[{"unit":"tokens","burst":"0"}]}}`, 400, "invalid_argument", server.ReasonInvalidPolicy},
		{"invalid duration", "PublishPolicy", `{"policy":{"subject":"s","route":"r","holdTtl":"-5s","dimensions":[{"unit":"tokens","burst":"5"}]}}`, 400, "invalid_argument", server.ReasonInvalidPolicy},
		{"account without subject", "GetAccount", `{"route":"chat.generate"}`, 400, "invalid_argument", server.ReasonInvalidCommand},
		{"malformed JSON", "Reserve", `{"reservationId": "x",`, 400, "invalid_argument", ""},
		{"wrong JSON type", "Reserve", `{"reservationId": 5}`, 400, "invalid_argument", ""},
		{"unknown JSON field", "Reserve", `{"reservationID":"x"}`, 400, "invalid_argument", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			h.wantError(h.call(c.method, c.body, ""), c.status, c.code, c.reason)
		})
	}
	h.t = t

	// A state error shows the reservation as it is now.
	r := h.call("Settle", `{"reservationId":"settled","operationId":"op-2","actualUnits":{"tokens":60,"requests":1}}`, "")
	detail := details(t, r)[0].(*v1.ErrorDetail)
	if detail.GetReservation().GetState() != v1.ReservationState_RESERVATION_STATE_SETTLED || detail.GetReservation().GetActualUnits()["tokens"] != 50 {
		t.Fatalf("detail: %v", detail)
	}
	// Nothing of the refused requests changed the ledger.
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
	acct := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	tokens := acct["accounts"].([]any)[0].(map[string]any)["balances"].([]any)[0].(map[string]any)
	// held 100 + started 100 reserved, settled spent 50.
	if num(tokens["reserved"]) != 200 || num(tokens["spent"]) != 50 || num(tokens["available"]) != 750 {
		t.Fatalf("tokens: %v", tokens)
	}
}

func TestExpiredReservationCannotStart(t *testing.T) {
	h := newHarness(t, harnessOptions{workers: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("late", 100), "")
	h.clock.Advance(31 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := h.ok("GetReservation", `{"reservationId":"late"}`, "")
		if field(got, "reservation", "state") == "RESERVATION_STATE_EXPIRED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expiry worker did not expire the hold: %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.wantError(h.call("Start", `{"reservationId":"late","operationId":"op"}`, ""), 400, "failed_precondition", server.ReasonExpired)
	h.wantError(h.call("Release", `{"reservationId":"late"}`, ""), 400, "failed_precondition", server.ReasonExpired)
}

func TestShadowRejectionIsNotAnError(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"embed","rollout":"ROLLOUT_MODE_SHADOW",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"1s"}]}}`, "")
	res := h.ok("Reserve", `{"reservationId":"s1","subject":"t1","route":"embed","units":{"tokens":80}}`, "")
	if field(res, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("fitting shadow reserve: %v", res)
	}
	// Spent, not held (a hold would keep refill from making room, and the
	// rejection would promise no Retry-After).
	h.ok("Start", `{"reservationId":"s1","operationId":"op"}`, "")
	h.ok("Settle", `{"reservationId":"s1","operationId":"op","actualUnits":{"tokens":80}}`, "")
	r := h.call("Reserve", `{"reservationId":"s2","subject":"t1","route":"embed","units":{"tokens":80}}`, "")
	// A 200 sends no Retry-After header: the wait is in the body alone
	// (API.md, "Retry-After").
	if r.status != http.StatusOK || r.header.Get("Retry-After") != "" {
		t.Fatalf("shadow rejection: %d, Retry-After %q: %s", r.status, r.header.Get("Retry-After"), r.raw)
	}
	res = r.body
	if res["shadowRejected"] != true || res["reservation"] != nil ||
		field(res, "shadowRejection", "reason") != server.ReasonInsufficientCapacity ||
		field(res, "shadowRejection", "limitingDimension") != "tokens" || field(res, "shadowRejection", "retryAfter") != "6s" {
		t.Fatalf("shadow rejection: %v", res)
	}
	// Nothing was reserved for it.
	h.wantError(h.call("GetReservation", `{"reservationId":"s2"}`, ""), 404, "not_found", server.ReasonReservationNotFound)
	metrics := h.get("/metrics")
	if !strings.Contains(metrics, `capledger_rejections_total{dimension="tokens",reason="INSUFFICIENT_CAPACITY",rollout="shadow"} 1`) {
		t.Fatalf("shadow rejection not counted:\n%s", grep(metrics, "rejections"))
	}
}

func (h *harness) get(path string) string {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.url+path, nil)
	return string(h.do(req).raw)
}

func grep(text, word string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, word) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func TestBodyLimit(t *testing.T) {
	h := newHarness(t, harnessOptions{maxBody: 4096})
	h.ok("PublishPolicy", tokensPolicy, "")
	big := fmt.Sprintf(`{"reservationId":"big","requestDigest":%q,"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, strings.Repeat("x", 8000))
	r := h.call("Reserve", big, "")
	if r.status != http.StatusRequestEntityTooLarge || r.body["code"] != "resource_exhausted" {
		t.Fatalf("oversized JSON: %d %s", r.status, r.raw)
	}
	// Without a Content-Length (chunked): the same 413, not a 429 a client
	// would take for a capacity rejection (issue 13).
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Content-Type", "application/json")
	r = h.do(req)
	if r.status != http.StatusRequestEntityTooLarge || r.body["code"] != "resource_exhausted" {
		t.Fatalf("oversized chunked JSON: %d %s", r.status, r.raw)
	}
	// A chunked body within the limit is served.
	small := `{"reservationId":"chunked","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`
	req, _ = http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", io.MultiReader(strings.NewReader(small)))
	req.Header.Set("Content-Type", "application/json")
	if r = h.do(req); r.status != http.StatusOK {
		t.Fatalf("chunked JSON within the limit: %d %s", r.status, r.raw)
	}
	// gRPC gets RESOURCE_EXHAUSTED in the gRPC way.
	client := h.grpcClient(connect.WithGRPC())
	_, err := client.Reserve(context.Background(), connect.NewRequest(&v1.ReserveRequest{
		ReservationId: "big", RequestDigest: strings.Repeat("x", 8000), Subject: "tenant-7", Route: "chat.generate",
		Units: map[string]int64{"tokens": 1},
	}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("oversized gRPC: %v", err)
	}
	// None of it was applied.
	h.wantError(h.call("GetReservation", `{"reservationId":"big"}`, ""), 404, "not_found", server.ReasonReservationNotFound)
}

// grpcClient returns a generated client over cleartext HTTP/2 (h2c), as a
// gRPC gateway without TLS connects.
func (h *harness) grpcClient(opts ...connect.ClientOption) capledgerv1connect.LedgerServiceClient {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	transport := &http.Transport{Protocols: protocols, TLSClientConfig: &tls.Config{}}
	h.t.Cleanup(transport.CloseIdleConnections)
	return capledgerv1connect.NewLedgerServiceClient(&http.Client{Transport: transport, Timeout: 10 * time.Second}, h.url, opts...)
}

func TestGRPCAndGRPCWeb(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := context.Background()
	for _, proto := range []struct {
		name string
		opt  connect.ClientOption
	}{{"grpc", connect.WithGRPC()}, {"grpc-web", connect.WithGRPCWeb()}} {
		t.Run(proto.name, func(t *testing.T) {
			h.t = t
			client := h.grpcClient(proto.opt)
			if _, err := client.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
				Subject: "g-" + proto.name, Route: "r",
				Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 10, RefillUnits: 1, RefillInterval: durationSeconds(2)}},
			}})); err != nil {
				t.Fatal(err)
			}
			reserve := func(id string, n int64) (*connect.Response[v1.ReserveResponse], error) {
				return client.Reserve(ctx, connect.NewRequest(&v1.ReserveRequest{
					ReservationId: proto.name + id, Subject: "g-" + proto.name, Route: "r", Units: map[string]int64{"tokens": n},
				}))
			}
			resp, err := reserve("a", 8)
			if err != nil || resp.Msg.GetReservation().GetReservedUnits()["tokens"] != 8 {
				t.Fatalf("reserve: %v %v", resp, err)
			}
			// Spent, not held: refill can make room, so a Retry-After is due.
			if _, err := client.Start(ctx, connect.NewRequest(&v1.StartRequest{ReservationId: proto.name + "a", OperationId: "op"})); err != nil {
				t.Fatal(err)
			}
			if _, err := client.Settle(ctx, connect.NewRequest(&v1.SettleRequest{ReservationId: proto.name + "a", OperationId: "op", ActualUnits: map[string]int64{"tokens": 8}})); err != nil {
				t.Fatal(err)
			}
			_, err = reserve("b", 5)
			var cerr *connect.Error
			if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted {
				t.Fatalf("want RESOURCE_EXHAUSTED, got %v", err)
			}
			// 3 short at 1 per 2s: 6 seconds.
			if got := cerr.Meta().Get("Retry-After"); got != "6" {
				t.Fatalf("Retry-After %q, want 6", got)
			}
			value, err := cerr.Details()[0].Value()
			if err != nil {
				t.Fatal(err)
			}
			if d := value.(*v1.RejectionDetail); d.GetLimitingDimension() != "tokens" || d.GetReason() != server.ReasonInsufficientCapacity {
				t.Fatalf("detail %v", d)
			}
			_, err = client.GetReservation(ctx, connect.NewRequest(&v1.GetReservationRequest{ReservationId: "missing"}))
			if connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("want NOT_FOUND, got %v", err)
			}
		})
	}
}

func durationSeconds(s int64) *durationpb.Duration {
	return durationpb.New(time.Duration(s) * time.Second)
}

func TestAuthRoles(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.wantError(h.call("GetPolicy", `{"generation":"1"}`, ""), 401, "unauthenticated", server.ReasonUnauthenticated)
	h.wantError(h.call("GetPolicy", `{"generation":"1"}`, "wrong-token-0123456789"), 401, "unauthenticated", server.ReasonUnauthenticated)
	h.wantError(h.call("PublishPolicy", tokensPolicy, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("r", 10), gatewayToken)
	h.ok("Start", `{"reservationId":"r","operationId":"op"}`, gatewayToken)
	h.ok("Settle", `{"reservationId":"r","operationId":"op","actualUnits":{"tokens":5,"requests":1}}`, gatewayToken)
	h.ok("GetReservation", `{"reservationId":"r"}`, gatewayToken)
	h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, gatewayToken)
	h.ok("ListPolicies", `{}`, gatewayToken)
	h.wantError(h.call("Audit", `{}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(h.call("RollbackPolicy", `{"generation":"1"}`, gatewayToken), 403, "permission_denied", server.ReasonPermissionDenied)
	h.ok("Audit", `{}`, adminToken)
	h.ok("Reserve", reserveBody("r2", 10), adminToken)
	h.ok("RollbackPolicy", `{"generation":"1"}`, adminToken)
	// Probes and metrics need no token.
	if got := h.get("/healthz"); got != "ok\n" {
		t.Fatalf("healthz %q", got)
	}
	if got := h.get("/readyz"); got != "ready\n" {
		t.Fatalf("readyz %q", got)
	}
}

// The Authorization header's scheme is case-insensitive (docs/API.md,
// Authentication), and a header of another scheme is 401 saying the
// header holds no bearer token, not that the token is missing (a client
// that sent "Basic ..." was told to send what it thought it had sent),
// without echoing the header.
func TestAuthSchemes(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	for header, want := range map[string]string{
		"":                          "missing bearer token",
		"Basic " + adminToken:       "the Authorization header holds no bearer token",
		adminToken:                  "the Authorization header holds no bearer token",
		"bearer " + adminToken:      "",
		"BEARER   " + adminToken:    "",
		"Bearer wrong-token-012345": "unknown",
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/ListPolicies", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		r := h.do(req)
		if want == "" {
			if r.status != http.StatusOK {
				t.Errorf("Authorization %q: %d %s, want 200", header, r.status, r.raw)
			}
			continue
		}
		h.wantError(r, http.StatusUnauthorized, "unauthenticated", server.ReasonUnauthenticated)
		if message, _ := r.body["message"].(string); !strings.Contains(message, want) || strings.Contains(message, adminToken) {
			t.Errorf("Authorization %q: want a message with %q that does not echo the token: %s", header, want, r.raw)
		}
	}
}

func TestParseTokensRejectsBadFiles(t *testing.T) {
	for _, bad := range []string{
		"",
		"# only comments\n",
		"short admin x\n",
		"abcdefghijklmnopq root x\n",
		"abcdefghijklmnopq admin\n",
		"abcdefghijklmnopq admin a\nabcdefghijklmnopq gateway b\n",
	} {
		if _, err := server.ParseTokens(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseTokens(%q) accepted", bad)
		}
	}
}

func TestUnavailableStoreAndReadiness(t *testing.T) {
	h := newHarness(t, harnessOptions{faults: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.faults.FailCommits(fmt.Errorf("disk gone: %w", store.ErrUnavailable))
	r := h.call("Reserve", reserveBody("lost", 10), "")
	h.wantError(r, http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if !strings.Contains(r.body["message"].(string), "retry with the same ids") {
		t.Fatalf("message does not teach the retry: %s", r.raw)
	}
	req, _ := http.NewRequest(http.MethodGet, h.url+"/readyz", nil)
	if ready := h.do(req); ready.status != http.StatusServiceUnavailable || !strings.Contains(string(ready.raw), "disk gone") {
		t.Fatalf("readyz while the store fails: %d %s", ready.status, ready.raw)
	}
	// The store comes back: readiness does too, without any command (a
	// replica out of rotation gets none), once its probe writes (at most
	// once a second).
	h.faults.FailCommits(nil)
	deadline := time.Now().Add(5 * time.Second)
	for {
		req, _ = http.NewRequest(http.MethodGet, h.url+"/readyz", nil)
		ready := h.do(req)
		if ready.status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz after the store recovered, without traffic: %d %s", ready.status, ready.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The retry with the same id succeeds.
	h.ok("Reserve", reserveBody("lost", 10), "")
	// A lost commit acknowledgement: applied, but the caller hears
	// UNAVAILABLE; the retry replays the receipt instead of debiting again.
	h.faults.LoseNextCommitAck()
	h.wantError(h.call("Reserve", reserveBody("ack", 10), ""), http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	if again := h.ok("Reserve", reserveBody("ack", 10), ""); again["replayed"] != true {
		t.Fatalf("retry after a lost ack: %v", again)
	}
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}

func TestBatches(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	res := h.ok("ReserveBatch", `{"requests":[`+reserveBody("b1", 500)+`,`+reserveBody("b2", 600)+`,`+
		`{"reservationId":"b3","subject":"tenant-7","route":"chat.generate","units":{"gpus":1}},`+
		`{"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}},`+reserveBody("b1", 500)+`]}`, "")
	outcomes := res["outcomes"].([]any)
	if len(outcomes) != 5 {
		t.Fatalf("outcomes: %v", res)
	}
	o := func(i int, path ...string) any { return field(outcomes[i].(map[string]any), path...) }
	if o(0, "ok", "reservation", "state") != "RESERVATION_STATE_RESERVED" ||
		o(1, "error", "code") != "resource_exhausted" || o(1, "error", "rejection", "limitingDimension") != "tokens" ||
		o(2, "error", "code") != "invalid_argument" || o(2, "error", "detail", "reason") != server.ReasonUnknownUnit ||
		o(3, "error", "code") != "invalid_argument" ||
		o(4, "ok", "replayed") != true {
		t.Fatalf("outcomes: %v", res)
	}
	h.ok("Start", `{"reservationId":"b1","operationId":"op"}`, "")
	res = h.ok("SettleBatch", `{"requests":[{"reservationId":"b1","operationId":"op","actualUnits":{"tokens":100,"requests":1}},{"reservationId":"nope","operationId":"op"},{"reservationId":"b1","operationId":"op","actualUnits":{"tokens":100,"requests":1}}]}`, "")
	outcomes = res["outcomes"].([]any)
	if o(0, "ok", "refundedUnits", "tokens") == nil || num(o(0, "ok", "refundedUnits", "tokens")) != 400 ||
		o(1, "error", "code") != "not_found" || o(2, "ok", "replayed") != true {
		t.Fatalf("settle outcomes: %v", res)
	}
	many := make([]string, server.MaxBatchItems+1)
	for i := range many {
		many[i] = reserveBody(fmt.Sprint("m", i), 1)
	}
	h.wantError(h.call("ReserveBatch", `{"requests":[`+strings.Join(many, ",")+`]}`, ""), 400, "invalid_argument", server.ReasonInvalidCommand)
}

// TestStaleUnitMapping: a second server (another replica) publishes a
// generation with the dimensions in the other order. The first server's
// cache still believes the old generation decides; the ledger refuses the
// misordered units, the server refreshes and maps again, and the amounts
// land in the right dimensions.
func TestStaleUnitMapping(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1

	other := serve(t, server.New(h.engine, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/PublishPolicy", strings.NewReader(
		`{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"requests","burst":"10"},{"unit":"tokens","burst":"1000"}]}}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "policy", "generation")) != 2 {
		t.Fatalf("publish on the other replica: %d %s", r.status, r.raw)
	}

	res := h.ok("Reserve", reserveBody("after", 7), "")
	units := field(res, "reservation", "reservedUnits").(map[string]any)
	if num(field(res, "reservation", "policyGeneration")) != 2 || num(units["tokens"]) != 7 || num(units["requests"]) != 1 {
		t.Fatalf("reserve after the switch: %v", res)
	}
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}

// TestStaleUnitMappingNewUnit: another replica publishes a generation
// with a unit the first server's cached generation lacks. A reserve
// naming it never reached the ledger (refused UNKNOWN_UNIT against the
// stale generation, for as long as only such reserves came), so the
// cache was never corrected; it is now reloaded (as for a new key, at
// most once per 100 ms) and the reserve admitted under the new generation.
func TestStaleUnitMappingNewUnit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1

	other := serve(t, server.New(h.engine, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/PublishPolicy", strings.NewReader(
		`{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"1000"},{"unit":"gpus","burst":"4"}]}}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "policy", "generation")) != 2 {
		t.Fatalf("publish on the other replica: %d %s", r.status, r.raw)
	}
	time.Sleep(150 * time.Millisecond) // past the reload interval of the warm reserve's lookup

	res := h.ok("Reserve", `{"reservationId":"gpu","subject":"tenant-7","route":"chat.generate","units":{"tokens":7,"gpus":1}}`, "")
	units := field(res, "reservation", "reservedUnits").(map[string]any)
	if num(field(res, "reservation", "policyGeneration")) != 2 || num(units["gpus"]) != 1 || num(units["tokens"]) != 7 {
		t.Fatalf("reserve naming the new generation's unit: %v", res)
	}
	// A unit no generation has is still refused, naming the new one.
	r := h.call("Reserve", `{"reservationId":"tpu","subject":"tenant-7","route":"chat.generate","units":{"tpus":1}}`, "")
	h.wantError(r, 400, "invalid_argument", server.ReasonUnknownUnit)
	if !strings.Contains(string(r.raw), "policy generation 2") {
		t.Fatalf("unknown unit answered against another generation: %s", r.raw)
	}
}

func TestAccountShowsOnlyOneSubject(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat","dimensions":[{"unit":"tokens","burst":"100"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"a","subject":"tenant-a","route":"chat","units":{"tokens":10}}`, "")
	h.ok("Reserve", `{"reservationId":"b","subject":"tenant-b","route":"chat","units":{"tokens":20}}`, "")
	acct := h.ok("GetAccount", `{"subject":"tenant-a","route":"chat"}`, "")
	accounts := acct["accounts"].([]any)
	if len(accounts) != 1 || accounts[0].(map[string]any)["subject"] != "tenant-a" {
		t.Fatalf("accounts: %v", acct)
	}
	if got := h.ok("GetAccount", `{"subject":"tenant-c","route":"chat"}`, ""); got["accounts"] != nil {
		t.Fatalf("unknown subject: %v", got)
	}
	h.wantError(h.call("GetAccount", `{"subject":"*","route":"chat"}`, ""), 400, "invalid_argument", server.ReasonInvalidCommand)
}

func TestPolicyListAndRollback(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	again := h.ok("PublishPolicy", tokensPolicy, "")
	if again["replayed"] != true || num(field(again, "policy", "generation")) != 1 {
		t.Fatalf("republish of the same terms: %v", again)
	}
	h.ok("PublishPolicy", strings.Replace(tokensPolicy, `"holdTtl":"30s"`, `"holdTtl":"45s"`, 1), "")
	list := h.ok("ListPolicies", `{"subject":"tenant-7"}`, "")["policies"].([]any)
	if len(list) != 2 || list[0].(map[string]any)["active"] == true || list[1].(map[string]any)["active"] != true {
		t.Fatalf("list: %v", list)
	}
	back := h.ok("RollbackPolicy", `{"generation":"2"}`, "")
	if num(back["activeGeneration"]) != 1 {
		t.Fatalf("rollback: %v", back)
	}
	if p := h.ok("GetPolicy", `{"generation":"2"}`, ""); field(p, "policy", "rolledBack") != true || field(p, "policy", "active") == true {
		t.Fatalf("rolled back policy: %v", p)
	}
	if back := h.ok("RollbackPolicy", `{"generation":"2"}`, ""); back["replayed"] != true {
		t.Fatalf("second rollback: %v", back)
	}
	res := h.ok("Reserve", reserveBody("after-rollback", 5), "")
	if num(field(res, "reservation", "policyGeneration")) != 1 {
		t.Fatalf("reserve after rollback: %v", res)
	}
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("a", 900), "")
	h.call("Reserve", reserveBody("b", 900), "")
	metrics := h.get("/metrics")
	for _, want := range []string{
		`capledger_commands_total{kind="reserve",outcome="ok"} 1`,
		`capledger_commands_total{kind="reserve",outcome="insufficient_capacity"} 1`,
		`capledger_commands_total{kind="publish_policy",outcome="ok"} 1`,
		`capledger_rejections_total{dimension="tokens",reason="INSUFFICIENT_CAPACITY",rollout="enforce"} 1`,
		`capledger_batch_commands_count 3`,
		`capledger_commit_seconds_count 3`,
		`capledger_conflicts_total 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "capledger_"))
		}
	}
}

// TestRetryAfterPolicyChange: a reserve retried after its policy was
// rolled back, or with units the new generation does not know, still gets
// its receipt (nothing is debited twice); a new id gets the refusal
// without touching the ledger. The ledger checks the command's shape
// (a unit above 0) before the id, so the server sends a retry it cannot
// map under the deciding generation with the units mapped under the
// reservation's own.
func TestRetryAfterPolicyChange(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("kept", 100), "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"cost","burst":"50"}]}}`, "")
	if again := h.ok("Reserve", reserveBody("kept", 100), ""); again["replayed"] != true || num(field(again, "reservation", "reservedUnits", "tokens")) != 100 {
		t.Fatalf("retry under a generation without the unit: %v", again)
	}
	h.wantError(h.call("Reserve", reserveBody("kept", 101), ""), 409, "already_exists", server.ReasonDigestMismatch)
	h.wantError(h.call("Reserve", reserveBody("fresh", 100), ""), 400, "invalid_argument", server.ReasonUnknownUnit)
	h.ok("RollbackPolicy", `{"generation":"2"}`, "")
	h.ok("RollbackPolicy", `{"generation":"1"}`, "")
	if again := h.ok("Reserve", reserveBody("kept", 100), ""); again["replayed"] != true {
		t.Fatalf("retry with no policy left: %v", again)
	}
	h.wantError(h.call("Reserve", reserveBody("fresh", 100), ""), 404, "not_found", server.ReasonNoPolicy)
	// Units no generation has: not the request that reserved kept, which
	// the id still answers (API.md, "Order of checks").
	h.wantError(h.call("Reserve", `{"reservationId":"kept","subject":"tenant-7","route":"chat.generate","units":{"bogus":1}}`, ""),
		409, "already_exists", server.ReasonDigestMismatch)
	metrics := h.get("/metrics")
	for _, want := range []string{
		`capledger_commands_total{kind="reserve",outcome="unknown_unit"} 1`,
		`capledger_commands_total{kind="reserve",outcome="no_policy"} 1`,
		`capledger_commands_total{kind="reserve",outcome="replayed"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "capledger_commands"))
		}
	}
}

// TestRecordUsageNewUnitFromOtherReplica: a RecordUsage naming a unit of
// a generation another replica just published is recorded under it, as a
// Reserve is (TestStaleUnitMappingNewUnit), not refused UNKNOWN_UNIT
// against this replica's cached generation.
func TestRecordUsageNewUnitFromOtherReplica(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1

	other := serve(t, server.New(h.engine, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/PublishPolicy", strings.NewReader(
		`{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"1000"},{"unit":"gpus","burst":"4"}]}}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "policy", "generation")) != 2 {
		t.Fatalf("publish on the other replica: %d %s", r.status, r.raw)
	}
	time.Sleep(150 * time.Millisecond) // past the reload interval of the warm reserve's lookup

	res := h.ok("RecordUsage", `{"reservationId":"rec-gpu","operationId":"op-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"gpus":1}}`, "")
	units := field(res, "reservation", "actualUnits").(map[string]any)
	if num(field(res, "policyGeneration")) != 2 || num(units["gpus"]) != 1 {
		t.Fatalf("record naming the new generation's unit: %v", res)
	}
}

// TestStaleUnitMappingRecordUsage: as TestStaleUnitMapping, for a
// RecordUsage: another replica publishes generation 2 with the same units
// in another order, the record is mapped by the cached generation 1, the
// ledger refuses it as stale, and the server reloads and maps it again
// (mapAgain) instead of answering INVALID_COMMAND.
func TestStaleUnitMappingRecordUsage(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1

	other := serve(t, server.New(h.engine, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	req, _ := http.NewRequest(http.MethodPost, other+"/capledger.v1.LedgerService/PublishPolicy", strings.NewReader(
		`{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"requests","burst":"10"},{"unit":"tokens","burst":"1000"}]}}`))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != 200 || num(field(r.body, "policy", "generation")) != 2 {
		t.Fatalf("publish on the other replica: %d %s", r.status, r.raw)
	}
	res := h.ok("RecordUsage", `{"reservationId":"rec-after","operationId":"op-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":7,"requests":1}}`, "")
	units := field(res, "reservation", "actualUnits").(map[string]any)
	if num(field(res, "policyGeneration")) != 2 || num(units["tokens"]) != 7 || num(units["requests"]) != 1 {
		t.Fatalf("record after the switch: %v", res)
	}
}
