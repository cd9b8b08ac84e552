// Package server is capledger's network face: the LedgerService handlers
// (one definition served as gRPC, gRPC-Web and Connect/JSON on one port),
// bearer-token auth, the mapping of ledger outcomes to status codes (429 +
// Retry-After for capacity rejections), request size limits, health and
// readiness probes and Prometheus metrics.
//
// The handlers translate only: names to dimension positions, protobuf to
// ledger types and back. Every decision is the ledger's, every write goes
// through the engine.
package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Ledger is what the server needs of the engine (*engine.Engine implements
// it).
type Ledger interface {
	Do(ctx context.Context, cmd ledger.Command) (ledger.Result, error)
	DoBatch(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error)
	Reservation(ctx context.Context, id string) (ledger.Reservation, error)
	Accounts(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, error)
	AccountsView(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, store.AccountsView, error)
	AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, engine.ShownWith, ledger.AccountKey, bool, error)
	Policies(ctx context.Context) ([]ledger.Policy, error)
	PoliciesPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error)
	Policy(ctx context.Context, generation uint64) (ledger.Policy, error)
	PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error)
	DecidingGenerations(ctx context.Context, subjects []ledger.PolicyKey) (map[ledger.PolicyKey]uint64, error)
	Audit(ctx context.Context) ([]ledger.Discrepancy, error)
	ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error)
	UnknownBacklog(ctx context.Context) (store.UnknownBacklog, error)
	AccountsInDebt(ctx context.Context, f store.DebtFilter, keep func(ledger.AccountKey) bool) ([]ledger.Account, engine.ShownWith, ledger.AccountKey, bool, error)
	AccountsInDebtCount(ctx context.Context) (int64, error)
	Stats() engine.Stats
	Ready() error
}

var _ Ledger = (*engine.Engine)(nil)

// DefaultMaxBodyBytes is the default request size limit (1 MiB).
const DefaultMaxBodyBytes = 1 << 20

// refusedBodyDrain is how much of a request body the server reads and
// discards after answering without it (a 413 above all), unless
// --max-body's wire bound is larger: a client that writes its whole
// request before reading the answer reads it for a body up to this size
// (finishBody; docs/API.md, Limits).
const refusedBodyDrain = 16 << 20

// compressMinBytes is the smallest answer compressed for a client that
// accepts compression.
const compressMinBytes = 16 << 10

// MaxBatchItems bounds ReserveBatch and SettleBatch.
const MaxBatchItems = 1000

// Config configures a Server. The zero value serves without auth, with a
// 1 MiB body limit, fresh metrics and the default logger.
type Config struct {
	// Tokens enables bearer-token auth; nil turns auth off (the caller then
	// must make sure only trusted clients can connect, e.g. loopback).
	Tokens *Tokens
	// MaxBodyBytes limits a request body (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Metrics to record into; nil creates fresh ones. Pass the same
	// Metrics' ObserveBatch as the engine's OnBatch to get batch metrics.
	Metrics *Metrics
	Logger  *slog.Logger
	// Shards configures the ShardService (shard.go); nil issues no shards.
	Shards *ShardConfig
	// Clock is the time the metrics measure ages against; give it the
	// engine's clock (default time.Now).
	Clock func() time.Time
	// Resolver, when set, flags overdue USAGE_UNKNOWN reservations in
	// ListUsageUnknown and exports the resolver's metrics (resolver.go).
	Resolver ResolverView
	// ReadyCheck, if set, is asked on every /readyz after the store
	// answered: an error makes the replica not ready (503, the error as
	// the reason); a detail is shown under "ready" (e.g. the PostgreSQL
	// primary and its replication).
	ReadyCheck func(ctx context.Context) (detail string, err error)
	// Rollouts, when set, keeps the rollouts of the RolloutService and
	// decides the mode of reserves on their routes (rollout.go); without
	// it the RolloutService's rollout methods answer UNIMPLEMENTED.
	Rollouts store.Rollouts
	// Drains, when set, lets RolloutService.DrainProgress follow a
	// rollback (give it the engine).
	Drains Drains
	// WarmPolicies makes /readyz answer 503 ("loading the policy cache")
	// until WarmPolicies has read every policy into the server's cache
	// once: serve does, so that a replica takes traffic only when the
	// first reserve of each key is answered from the cache, not after a
	// read of every policy (seconds at 100,000) that reserves of keys not
	// yet cached wait for.
	WarmPolicies bool
	// Console, when set, serves the ConsoleService's reads of one
	// subject's reservations, one account's statements and the
	// resolver's answers, and keeps the audit status (console_reads.go);
	// without it those reads answer UNIMPLEMENTED and the audit status is
	// this replica's memory.
	Console store.ConsoleStore
	// StoreTimeout bounds how long one unary call waits for the store:
	// its reads, its wait for a commit, the reads that build its answer
	// (storecap.go); for the long ones (Audit, StreamAudit, drain passes,
	// the scans of every account), each of their reads. Default
	// DefaultStoreTimeout. A call it ends answers 503 unavailable.
	StoreTimeout time.Duration
}

// Server implements capledgerv1connect.LedgerServiceHandler over a Ledger.
type Server struct {
	ledger   Ledger
	policies *policyCache
	metrics  *Metrics
	log      *slog.Logger
	maxBody  int64
	handler  http.Handler
	resolver ResolverView
	clock    func() time.Time
	// mux and options are kept for Mount and HandlerOptions (adapter.go).
	mux     *http.ServeMux
	options []connect.HandlerOption
	ready   func(ctx context.Context) (string, error)
	// warm is Config.WarmPolicies; warmErr the last failed load's error.
	warm    bool
	warmErr atomic.Pointer[error]
	// console counts what the ConsoleService reports beyond the metrics.
	console *consoleCounters
	// standings shares ListAccountStandings rankings of every account
	// between callers (standings.go).
	standings *sharedStandings
	// policyCommittedAt is when a publish or rollback last committed
	// through this server (policyCommitted); nil before the first.
	policyCommittedAt atomic.Pointer[time.Time]
	// fairness shares GetFairness answers between callers (fairness.go).
	fairness *sharedFairness
	// rollouts decides reserves' modes on rollout routes; shadow counts
	// the legacy limiter's decisions against the ledger's (rollout.go).
	rollouts *rolloutCache
	shadow   *shadowCounts
	// shards is the ShardService, which also carves legacy budgets.
	shards *shardService
	// gates are the seed's release gates measured at audit (gates.go).
	gates *gateMetrics
	// auth checks bearer tokens (nil with auth off), for the connect
	// interceptor and the grpc-go path alike (grpc.go).
	auth *authCheck
	// sealer seals scoped callers' page tokens (pagetokens.go; nil with
	// auth off, where no caller is scoped).
	sealer *pageSealer
	// storeTimeout is Config.StoreTimeout (storecap.go).
	storeTimeout time.Duration
}

// New returns a server over l.
func New(l Ledger, cfg Config) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	s := &Server{
		storeTimeout: cfg.StoreTimeout,
		ledger:       l,
		policies:     newPolicyCache(l),
		metrics:      cfg.Metrics,
		log:          cfg.Logger,
		maxBody:      cfg.MaxBodyBytes,
		resolver:     cfg.Resolver,
		clock:        cfg.Clock,
		ready:        cfg.ReadyCheck,
		warm:         cfg.WarmPolicies,
		console:      &consoleCounters{store: cfg.Console},
		standings:    &sharedStandings{limit: cfg.StoreTimeout},
		fairness:     &sharedFairness{limit: cfg.StoreTimeout},
	}
	s.console.recent = s.policies.recent
	s.rollouts = &rolloutCache{store: cfg.Rollouts, timeout: cfg.StoreTimeout, log: s.log}
	s.shadow = newShadowCounts(s.metrics.registry, cfg.Clock(), s.policies.recent)
	s.gates = newGateMetrics(s.metrics.registry)
	s.metrics.registerEngine(l)
	s.metrics.registerLeader(l)
	s.metrics.registerMaintenance(l)
	s.metrics.registerBacklog(l, s.log, cfg.Clock)
	s.metrics.registerDebtCount(l, s.log, cfg.Clock)
	s.metrics.registerSubjectIndex(cfg.Console)
	if cfg.Resolver != nil {
		s.metrics.registerResolver(cfg.Resolver)
	}

	options := []connect.HandlerOption{
		connect.WithReadMaxBytes(int(cfg.MaxBodyBytes)),
		// A client that offers gzip gets small answers uncompressed: on a
		// single reserve the compressor's setup cost more CPU than the
		// whole rest of the call.
		connect.WithCompressMinBytes(compressMinBytes),
	}
	options = append(options, jsonCodecs()...)
	if cfg.Tokens != nil {
		s.auth = &authCheck{cfg.Tokens}
		s.sealer = newPageSealer(cfg.Tokens)
		options = append(options, connect.WithInterceptors(s.auth))
	}
	options = append(options, connect.WithInterceptors(s.console.observe(), textCheck{s}, storeCap{s}))
	path, service := capledgerv1connect.NewLedgerServiceHandler(s, options...)
	mux := http.NewServeMux()
	mountProcedures(mux, path, service, v1.File_capledger_v1_capledger_proto.Services().ByName("LedgerService"))
	registerShardService(mux, s, cfg.Shards, options)
	registerConsoleService(mux, s, options)
	registerRolloutService(mux, s, cfg.Rollouts, cfg.Drains, options)
	registerAuditService(mux, s, options)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /statusz", s.statusz)
	mux.Handle("GET /metrics", s.metrics.Handler())
	for _, endpoint := range []string{"/healthz", "/readyz", "/statusz", "/metrics"} {
		// Without these the catch-all below would answer another method
		// on an endpoint "no method or endpoint", which is false.
		mux.HandleFunc(endpoint, getOnly)
	}
	mux.HandleFunc("/", unknownPath)
	s.mux, s.options = mux, options
	// gRPC-Web's text mode is base64 on the wire: 4 bytes for every 3 of
	// the binary body limitBody bounds (its slack for framing included).
	maxTextWire := 4 * ((s.maxBody + 64<<10 + 2) / 3)
	s.handler = finishBody(grpcWebText(liveReads(s.limitBody(mux)), maxTextWire), maxTextWire, max(maxTextWire, refusedBodyDrain))
	return s
}

// Handler returns the HTTP handler of every endpoint: the LedgerService
// under /capledger.v1.LedgerService/, and /healthz, /readyz, /metrics.
func (s *Server) Handler() http.Handler { return s.handler }

// HTTPServer returns an http.Server for h that speaks HTTP/1.1 and
// cleartext HTTP/2 (h2c, which gRPC clients use without TLS), with
// timeouts that bound slow clients but not slow commits.
func HTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         protocols,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// finishBody reads what is left of a request's body, up to limit bytes
// (limitHTTP1 over HTTP/1.1), before the answer goes out.
//
// HTTP/2: an answer given without reading the body (415 for a
// Content-Type nobody serves, 404, 405) otherwise ends the stream with
// RST_STREAM while the client may still be sending it, and some clients
// then drop the answer itself: curl 7.88 fails with "stream was not
// closed cleanly" (exit 92) about one time in three instead of printing
// the 415.
//
// HTTP/1.1: net/http reads at most 256 KiB of a body the handler left
// unread and otherwise closes the connection after the answer; the bytes
// the client is still sending then meet a closed socket, and the TCP reset
// throws the answer away before a client that writes its whole request
// first (Python's http.client and urllib, Java's HttpURLConnection) reads
// it: such a client saw "Connection reset by peer" instead of the 413 for
// a body of a few MiB over the limit. A request that waits for "100
// Continue" sent no body, and one whose declared length is past limitHTTP1
// cannot be saved this way: both are left to net/http as before.
//
// Past limit bytes (HTTP/2) or limitHTTP1 bytes the rest is left unread
// (a body that large was refused already: limitBody), and the stream is
// reset or the connection closed as before.
func finishBody(next http.Handler, limit, limitHTTP1 int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := r.Body
		if r.ProtoMajor == 1 && body != nil && body != http.NoBody {
			// connect closes a body it gave up on (a gRPC-Web message
			// past the limit, after reading 4 MiB of it), which would end
			// the drain below before it began; net/http closes the body
			// itself once the answer is given.
			r.Body = keepOpen{body}
		}
		next.ServeHTTP(w, r)
		// net/http looks at the request's Body (its own type, *http.body)
		// when it writes the answer, to decide whether the connection can
		// be reused: it gets its own back. (Left a keepOpen, it reads
		// its own body instead and decides the same after the drain
		// below; the contract walk's resets once blamed on the keepOpen
		// came from a binary built without the drain.)
		r.Body = body
		if body == nil || body == http.NoBody {
			return
		}
		drain := limit
		if r.ProtoMajor == 1 {
			if r.ContentLength > limitHTTP1 || strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
				return
			}
			drain = limitHTTP1
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(body, drain))
	})
}

// keepOpen is a request body whose Close does nothing (finishBody).
type keepOpen struct{ io.ReadCloser }

func (keepOpen) Close() error { return nil }

// liveReads marks every answer to a Connect GET (a read of live state:
// a reservation, an account, a list) Cache-Control: no-store. Without it
// an HTTP cache between a gateway and the ledger may keep a GET's 200 or
// 404 and replay it (heuristic freshness: Varnish keeps one 2 minutes by
// default), so a GetReservation after a lost Reserve would read an old
// state.
func liveReads(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/capledger.v1.") {
			w.Header().Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// limitBody refuses a Connect-protocol request whose declared body is over
// the limit with 413 and a Connect error body (code resource_exhausted, so
// Connect clients decode it), and caps every body's wire bytes. gRPC
// requests are left to connect.WithReadMaxBytes, which answers with the
// gRPC convention (RESOURCE_EXHAUSTED in the trailers).
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType := r.Header.Get("Content-Type")
		grpc := strings.HasPrefix(contentType, "application/grpc")
		if !grpc && r.ContentLength > s.maxBody {
			s.tooLarge(w, fmt.Sprintf("request body of %d bytes is larger than the limit of %d bytes", r.ContentLength, s.maxBody))
			return
		}
		if !grpc && r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody {
			// A chunked body declares no length: read it here, up to the
			// limit, so one past it gets the same 413 as a sized one
			// (connect would answer resource_exhausted, a 429 a client
			// takes for a capacity rejection). Connect reads a unary body
			// whole anyway, so this holds no more than it would.
			// The body is not closed here: past the limit finishBody
			// reads the rest, so the client reads the 413 (net/http
			// closes the body once the answer is given).
			body, err := io.ReadAll(io.LimitReader(r.Body, s.maxBody+1))
			if err != nil {
				http.Error(w, "reading request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			if int64(len(body)) > s.maxBody {
				s.tooLarge(w, fmt.Sprintf("chunked request body is larger than the limit of %d bytes", s.maxBody))
				return
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		if q := r.URL.Query(); r.Method == http.MethodGet && q.Has("message") && strings.EqualFold(q.Get("compression"), "gzip") {
			// A Connect GET's compressed message, likewise.
			if status, message := s.gunzipGetMessage(r); status != 0 {
				if status == http.StatusRequestEntityTooLarge {
					s.tooLarge(w, message)
				} else {
					s.badBody(w, message)
				}
				return
			}
		}
		if !grpc && strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") && r.Body != nil && r.Body != http.NoBody {
			// A compressed Connect body is decompressed here, up to the
			// limit, for the same reason: one that inflates past it would
			// otherwise reach connect's read limit and answer 429.
			body, err := gunzipAtMost(r.Body, s.maxBody+1) // not closed: as for a chunked body
			if err != nil {
				s.badBody(w, "request body: gzip: "+err.Error())
				return
			}
			if int64(len(body)) > s.maxBody {
				s.tooLarge(w, fmt.Sprintf("request body is larger than the limit of %d bytes once decompressed", s.maxBody))
				return
			}
			r.Header.Del("Content-Encoding")
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		if r.Body != nil {
			// Slack for gRPC framing and compression headers: the message
			// limit proper is connect's, which answers in the protocol.
			r.Body = http.MaxBytesReader(w, r.Body, s.maxBody+64<<10)
		}
		next.ServeHTTP(w, r)
	})
}

// gunzipGetMessage decompresses a Connect GET's gzip-compressed message
// parameter in r's URL, up to the body limit, and puts it back
// uncompressed (base64, so binary messages survive): 0 when it did, or
// the status (413 past the limit, 400 for bad base64 or gzip) and the
// message to answer.
func (s *Server) gunzipGetMessage(r *http.Request) (int, string) {
	q := r.URL.Query()
	raw := []byte(q.Get("message"))
	if q.Get("base64") == "1" {
		unpadded := strings.TrimRight(string(raw), "=")
		decoded, err := base64.RawURLEncoding.DecodeString(unpadded)
		if err != nil {
			decoded, err = base64.RawStdEncoding.DecodeString(unpadded)
		}
		if err != nil {
			return http.StatusBadRequest, "message: base64: " + err.Error()
		}
		raw = decoded
	}
	body, err := gunzipAtMost(bytes.NewReader(raw), s.maxBody+1)
	if err != nil {
		return http.StatusBadRequest, "message: gzip: " + err.Error()
	}
	if int64(len(body)) > s.maxBody {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("request message is larger than the limit of %d bytes once decompressed", s.maxBody)
	}
	q.Set("message", base64.RawURLEncoding.EncodeToString(body))
	q.Set("base64", "1")
	q.Del("compression")
	r.URL.RawQuery = q.Encode()
	return 0, ""
}

// gunzipAtMost returns up to limit bytes of the gzip stream in body.
func gunzipAtMost(body io.Reader, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(body)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return io.ReadAll(io.LimitReader(zr, limit))
}

// badBody answers 400 with a Connect error body (code invalid_argument),
// as connect answers a body it cannot decode.
func (s *Server) badBody(w http.ResponseWriter, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	json.NewEncoder(w).Encode(map[string]string{"code": connect.CodeInvalidArgument.String(), "message": message})
}

// tooLarge answers 413 with a Connect error body (code
// resource_exhausted, so Connect clients decode it).
func (s *Server) tooLarge(w http.ResponseWriter, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusRequestEntityTooLarge)
	json.NewEncoder(w).Encode(map[string]string{"code": connect.CodeResourceExhausted.String(), "message": message})
}

// mountProcedures mounts handler at the path of each of service's methods
// (path is the service's "/pkg.Service/" prefix), so an unknown method
// falls through to unknownPath rather than to connect's bare 404.
func mountProcedures(mux *http.ServeMux, path string, handler http.Handler, service protoreflect.ServiceDescriptor) {
	methods := service.Methods()
	for i := 0; i < methods.Len(); i++ {
		mux.Handle(path+string(methods.Get(i).Name()), handler)
	}
}

// unknownPath answers a path no service or endpoint serves (an unknown or
// misspelt method) with 404 and a Connect error body, code unimplemented,
// as the Connect protocol answers an unknown procedure.
func unknownPath(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	json.NewEncoder(w).Encode(map[string]string{
		"code":    connect.CodeUnimplemented.String(),
		"message": fmt.Sprintf("no method or endpoint at %s (%s)", r.URL.Path, methodsHint(r.URL.Path)),
	})
}

// apiServices are the capledger.v1 services a serve port answers.
var apiServices = []protoreflect.ServiceDescriptor{
	v1.File_capledger_v1_capledger_proto.Services().ByName("LedgerService"),
	v1.File_capledger_v1_shard_proto.Services().ByName("ShardService"),
	v1.File_capledger_v1_audit_proto.Services().ByName("AuditService"),
	v1.File_capledger_v1_rollout_proto.Services().ByName("RolloutService"),
	v1.File_capledger_v1_console_proto.Services().ByName("ConsoleService"),
}

// methodsHint names what a path could have been: the methods of its
// service when the path names one (a misspelt method), else the services.
func methodsHint(path string) string {
	var names []string
	for _, svc := range apiServices {
		if strings.HasPrefix(path, "/"+string(svc.FullName())+"/") {
			methods := svc.Methods()
			list := make([]string, methods.Len())
			for i := range list {
				list[i] = string(methods.Get(i).Name())
			}
			return fmt.Sprintf("%s's methods: %s; POST /%s/<Method>", svc.Name(), strings.Join(list, ", "), svc.FullName())
		}
		names = append(names, string(svc.Name()))
	}
	return "methods are POST /capledger.v1.<Service>/<Method>, services " + strings.Join(names, ", ")
}

// getOnly answers a method other than GET or HEAD on an endpoint: 405,
// Allow: GET, HEAD (as the console's files answer).
func getOnly(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, "method not allowed: "+r.Method+" "+r.URL.Path+" answers GET and HEAD", http.StatusMethodNotAllowed)
}

// healthz answers 200 while the process is alive.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// readyz answers 200 when the engine's last store access worked and a read
// of the store works now, 503 with the error otherwise. A load balancer
// takes a replica whose store is unreachable out of rotation.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	detail, err := s.readiness(r.Context())
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ready")
	if detail != "" {
		fmt.Fprintln(w, detail)
	}
}

// warmRetry is how long WarmPolicies waits after a failed load.
const warmRetry = time.Second

// WarmPolicies reads every policy into the server's policy cache once, a
// page at a time (policyCache.catchUpLocked), retrying a failed read
// every warmRetry from the page it stopped at, and returns nil when it is done
// or ctx's error when ctx ends first. With Config.WarmPolicies, /readyz
// answers 503 until then. Reserves do not wait for it unless their key is
// not cached yet (they then wait for the load, as for the first miss).
// It logs when the load begins and when it ends (the generations read
// and the time taken): a replica answering 503 after a start says why.
func (s *Server) WarmPolicies(ctx context.Context) error {
	s.log.Info("loading the policy cache (every policy, once after a start)")
	for {
		started := time.Now()
		read, err := s.policies.load(ctx)
		if err == nil {
			s.warmErr.Store(nil)
			s.log.Info("policy cache loaded", "policies", read, "took", time.Since(started).Round(time.Millisecond))
			return nil
		}
		s.warmErr.Store(&err)
		s.log.Warn("policy cache load failed; retrying", "error", err, "in", warmRetry)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(warmRetry):
		}
	}
}

// readiness is the check of /readyz (and of the console's overview): nil
// when the engine's last store access worked, a read of the store works
// now, the policy cache is loaded (with Config.WarmPolicies) and the
// ReadyCheck, if any, passes; detail is the ReadyCheck's.
func (s *Server) readiness(ctx context.Context) (detail string, err error) {
	err = s.ledger.Ready()
	if err == nil {
		readCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		// Generation 0 never exists: the read proves the store answers,
		// whatever it holds, at the cost of one indexed lookup.
		_, err = s.ledger.Policy(readCtx, 0)
		cancel()
		if errors.Is(err, store.ErrNotFound) {
			err = nil
		}
	}
	if err == nil && s.warm && !s.policies.loaded.Load() {
		err = errors.New("loading the policy cache (every policy, once after a start)")
		if last := s.warmErr.Load(); last != nil {
			err = fmt.Errorf("loading the policy cache (every policy, once after a start): retrying every %s after: %w", warmRetry, *last)
		}
	}
	if err == nil && s.ready != nil {
		checkCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		detail, err = s.ready(checkCtx)
		cancel()
	}
	return detail, err
}
