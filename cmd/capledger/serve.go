package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capledger/capledger/console"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/envoyrls"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

func init() {
	register(&command{name: "serve", summary: "run the ledger server (gRPC, gRPC-Web and JSON on one port)", help: serveHelp, run: runServe})
}

const serveHelp = `Usage: capledger serve [flags]

Serve runs the ledger: the LedgerService API as gRPC, gRPC-Web and
Connect/JSON over HTTP/1.1 and cleartext HTTP/2 on one port (gRPC
connections are served by grpc-go's own transport, everything else by
net/http), plus /healthz,
/readyz, /statusz (JSON: readiness, worker lease), /metrics (Prometheus) and
the operator console at /ui (docs/CONSOLE.md). With no flags it needs no configuration:
it keeps its data in an embedded SQLite database under ./capledger-data and
listens on 127.0.0.1:7070. Several replicas share one PostgreSQL with
--store postgres://...

With --tls-cert and --tls-key the same port speaks HTTPS instead, health
and metrics included: TLS 1.2 or newer, HTTP/2 by ALPN (gRPC needs it) and
HTTP/1.1. TLS does not replace --tokens: on an address other machines can
reach, serve still wants --tokens (or --insecure).

SIGINT or SIGTERM shut it down gracefully: it stops accepting connections,
lets in-flight requests and their batches commit, then closes the store.

Flags:
  --addr HOST:PORT    listen address (default 127.0.0.1:7070)
  --data-dir DIR      data directory of the embedded store (default ./capledger-data)
  --store SPEC        store: "sqlite" (default: capledger.db in --data-dir),
                      "sqlite:PATH", "memory" (not durable: for trying
                      things out), or a postgres://user@host:5432/db URL
  --tokens FILE       bearer tokens, one "token role name" per line, role
                      gateway, viewer (read-only, e.g. for the console at
                      /ui) or admin (# comments allowed), optionally
                      scoped: "subjects=tenant-b/* routes=chat.*" (outside
                      the scope is answered as not found; docs/API.md,
                      "Authentication"). Without it auth is off and serve
                      listens on loopback addresses only.
  --shard-keys PATH   emergency-shard signing keys: a keys file or a directory
                      of them (see "capledger shard --help"); default: the
                      file shard-keys in --data-dir, created with a new key on
                      first start. Replicas on one PostgreSQL need the same keys.
  --shard-max-ttl DUR longest emergency-shard lifetime granted (default 24h;
                      1s to 2562047h47m16s, the API's longest duration,
                      9223372036s)
  --tls-cert FILE     PEM certificate (chain) to serve HTTPS with; needs
                      --tls-key. Both files are re-read when they change
                      (checked at most every 2s during handshakes): rotate by
                      replacing them, no restart. A pair that fails to load
                      is logged and the previous certificate kept.
  --tls-key FILE      PEM private key of --tls-cert
  --tls-client-ca FILE
                      require a client certificate signed by one of the PEM
                      CA certificates in FILE on every connection (mTLS),
                      probes and metrics included; needs --tls-cert.
                      Re-read when it changes, as the --tls-cert pair is:
                      rotate CAs by replacing it, no restart (a bundle that
                      fails to load is logged and the previous one kept).
                      It authenticates the connection, not a role: --tokens
                      still decides what a caller may do
  --envoy-config FILE serve Envoy's rate limit service (ShouldRateLimit) on
                      the same port, mapping domains and descriptors to
                      subjects, routes and units as FILE says (docs/ENVOY.md)
  --grpc-transport T  what serves gRPC calls (application/grpc and
                      application/grpc+proto over HTTP/2): grpc-go, its
                      own HTTP/2 transport on the same port (default; about
                      half the CPU per call), or net/http, connect-go on
                      net/http's HTTP/2 server like every other protocol
                      (docs/OPERATIONS.md, "gRPC on the serve port")
  --insecure          allow listening on a non-loopback address without
                      --tokens (anyone who can connect may publish
                      policies); refused beside --tokens
  --resolver-config FILE
                      the USAGE_UNKNOWN resolver: per route, the gateways'
                      operation-status endpoint, its shared secret and an
                      optional unknownDeadline (docs/OPERATIONS.md, "The
                      USAGE_UNKNOWN resolver"). Without it nothing resolves
                      USAGE_UNKNOWN but a settle.
  --allow-async-replication
                      with a postgres:// store, run even when the primary
                      could lose acknowledged commits on a failover
                      (asynchronous standbys, synchronous_commit off, local
                      or remote_write, fsync off). Without it serve refuses
                      to start against such a primary and /readyz reports
                      not ready while it is one. A standalone server with no
                      standbys needs no flag.
  --max-body BYTES    request body limit (default 1048576; 1024 to 1073741824)
  --max-batch N       commands per store transaction (default 512; 1 to 65536)
  --store-timeout DUR how long a call waits for the store before it answers
                      503 unavailable: each commit (store transaction), and
                      each unary call's reads and wait for its commit (an
                      audit excepted; default 10s; 1s to 10m). A write that
                      was committing when it ran out ends with that commit,
                      within twice DUR (docs/API.md, "Errors")
  --cache-rows N      SQLite row cache: the most rows of each hot table
                      (accounts, ...) kept in memory, least recently used
                      evicted first, filled with the file's tenants at
                      start; about 257 bytes per tenant (default 524288,
                      about 135 MB; 1 to 1073741824); refused with the other
                      stores, which have no row cache. Unless GOMEMLIMIT
                      is set, serve sets a soft memory limit of 320 MiB +
                      256 bytes per cached row (448 MiB at the default, and
                      with the other stores)
  --pipelined-sync    SQLite: commit a batch without its fsync and answer
                      its callers after a separate fsync of the WAL, while
                      the next batch is applied (off by default; see
                      docs/PERFORMANCE.md for why). A failed fsync makes
                      the server refuse every command, and /readyz report
                      it, until it is restarted
  --lease-ttl DUR     worker lease: with several replicas on one PostgreSQL
                      only the lease holder runs the maintenance workers
                      (expiry, execution-limit marking, epoch close,
                      drains, retention, compaction, the resolver); it
                      renews every third of DUR, and when it dies
                      another replica takes over within DUR + DUR/3
                      (default 15s; 300ms to 24h; see /statusz or
                      "capledger status")
  --retention DUR     remove finished reservations (settled, released,
                      expired) this long after they finished, and settled
                      emergency shards this long after they ended (default
                      72h; 0 keeps every row forever; not negative). See
                      docs/OPERATIONS.md, "Retention and compaction".
  --tombstone-retention DUR
                      how long a removed reservation's tombstone answers a
                      retry of its id (default 720h = 30 days; at least
                      --retention; 0 keeps tombstones forever; not negative)
  --retention-interval DUR
                      how often the retention pass runs (default 1m; 1ms
                      to 24h)
  --statement-retention DUR
                      the retention pass also removes epoch statements
                      whose epoch ended longer ago than DUR (default 0:
                      keep them forever, the billing record; else at
                      least 24h, and --retention above 0)
  --compaction DUR    cut a statement checkpoint this often (at the first
                      pass after each multiple of DUR, UTC) once an audit
                      since the last one is clean, then delete the journal
                      it summarises (default 1h, the default epoch length;
                      0 keeps the whole journal; else at least 1s)
  --compaction-interval DUR
                      how often the compaction pass runs (default 1m; 1ms
                      to 24h)
  --maintenance-share F
                      share of the time (0 < F <= 1) that retention,
                      compaction, giving disk space back and audits take
                      while gateways are being served (audits a tenth of
                      it, giving space back a quarter); they pause between
                      steps for the rest (default 0.2; at 1 audits, giving
                      space back, deleting summarised journal and a
                      retention backlog beyond the finish rate still
                      pause)
  --pprof-addr HOST:PORT
                      serve Go's profiles (net/http/pprof: /debug/pprof/heap,
                      /debug/pprof/profile, ...) on a second, loopback-only
                      listener (off by default; docs/OPERATIONS.md,
                      "Profiling serve")
  --log-level LEVEL   debug, info, warn or error (default info)
  --log-format FMT    text or json (default text)

Example:
  capledger serve
  capledger serve --addr 0.0.0.0:7070 --tokens /etc/capledger/tokens \
      --store postgres://capledger@db:5432/capledger
  capledger serve --addr 0.0.0.0:7443 --tokens /etc/capledger/tokens \
      --tls-cert /etc/capledger/tls/tls.crt --tls-key /etc/capledger/tls/tls.key
  (clients then use --addr https://ledger.example:7443, and --ca-file when a
  private CA signed the certificate)

A flag outside its range is refused at start, naming the flag, the value
and the range; nothing is opened.

Exit codes: 0 after a graceful shutdown; 1 for bad flags, an address that
cannot be opened, a TLS pair that does not load, or a store that refuses
(a schema newer than this binary, refused credentials, a startup
parameter PgBouncer refuses, replication at risk); 5 for a store that cannot be reached (PostgreSQL down or refusing
connections: retry later) and when the server fails while running.
`

// warmWait is how long serve waits for its policy cache to load before
// it answers on its port (then /readyz answers 503 until it has loaded).
const warmWait = 2 * time.Second

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlags("serve")
	addr := fs.String("addr", "127.0.0.1:7070", "")
	dataDir := fs.String("data-dir", defaultDataDir, "")
	storeSpec := fs.String("store", "", "")
	tokensPath := fs.String("tokens", "", "")
	shardKeysPath := fs.String("shard-keys", "", "")
	shardMaxTTL := fs.Duration("shard-max-ttl", server.DefaultMaxShardTTL, "")
	insecure := fs.Bool("insecure", false, "")
	allowAsync := fs.Bool("allow-async-replication", false, "")
	tlsCert := fs.String("tls-cert", "", "")
	tlsKey := fs.String("tls-key", "", "")
	tlsClientCA := fs.String("tls-client-ca", "", "")
	maxBody := fs.Int64("max-body", server.DefaultMaxBodyBytes, "")
	maxBatch := fs.Int("max-batch", 512, "")
	storeTimeout := fs.Duration("store-timeout", server.DefaultStoreTimeout, "")
	leaseTTL := fs.Duration("lease-ttl", engine.DefaultLeaseTTL, "")
	cacheRows := fs.Int("cache-rows", sqlite.DefaultCacheRows, "")
	pipelinedSync := fs.Bool("pipelined-sync", false, "")
	retention := fs.Duration("retention", engine.DefaultRetention, "")
	tombstoneRetention := fs.Duration("tombstone-retention", engine.DefaultTombstoneRetention, "")
	retentionInterval := fs.Duration("retention-interval", time.Minute, "")
	statementRetention := fs.Duration("statement-retention", 0, "")
	compaction := fs.Duration("compaction", time.Hour, "")
	compactionInterval := fs.Duration("compaction-interval", time.Minute, "")
	maintenanceShare := fs.Float64("maintenance-share", engine.DefaultMaintenanceShare, "")
	logLevel := fs.String("log-level", "info", "")
	logFormat := fs.String("log-format", "text", "")
	resolverPath := fs.String("resolver-config", "", "")
	envoyConfigPath := fs.String("envoy-config", "", "")
	grpcTransport := fs.String("grpc-transport", "grpc-go", "")
	pprofAddr := fs.String("pprof-addr", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := checkServeFlags(serveBounds{
		maxBody: *maxBody, maxBatch: *maxBatch, cacheRows: *cacheRows, leaseTTL: *leaseTTL,
		retention: *retention, tombstoneRetention: *tombstoneRetention, retentionInterval: *retentionInterval,
		statementRetention: *statementRetention, compaction: *compaction, compactionInterval: *compactionInterval, shardMaxTTL: *shardMaxTTL,
		maintenanceShare: *maintenanceShare, storeTimeout: *storeTimeout,
	}); err != nil {
		return err
	}
	// The ledger's rows are short-lived garbage: a larger GC target trades
	// memory for fewer collections (+11-22% reserves a second at
	// concurrency 64, measured for commit fbb50ac). GOGC, when set, wins.
	cutGCPercent := 0
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
		// Not while a checkpoint is cut: it holds about 160 bytes per
		// account touched since the last one for minutes, and five times
		// that is over the 600 MB a million accounts may take
		// (docs/PERFORMANCE.md, a million tenants).
		cutGCPercent = serveCutGCPercent
	}
	log, err := newLogger(e, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		// GOMEMLIMIT, when set, wins.
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(serveMemoryLimit(*cacheRows)))
	}

	if *grpcTransport != "grpc-go" && *grpcTransport != "net/http" {
		return usagef("--grpc-transport %q: want grpc-go or net/http", *grpcTransport)
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together: give both files, or neither for cleartext")
	}
	clientCAGiven := false
	fs.Visit(func(f *flag.Flag) { clientCAGiven = clientCAGiven || f.Name == "tls-client-ca" })
	if clientCAGiven && *tlsClientCA == "" {
		// --tls-client-ca "$UNSET" must not serve without client
		// certificates.
		return usagef("--tls-client-ca: empty file name (give the PEM file of the client CAs, or leave the flag out)")
	}
	if *tlsClientCA != "" && *tlsCert == "" {
		return usagef("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for in the TLS handshake")
	}

	var resolver *resolverConfig
	if *resolverPath != "" {
		if resolver, err = loadResolverConfig(*resolverPath); err != nil {
			return usagef("%v", err)
		}
	}

	if err := checkListenAddr(*addr); err != nil {
		return err
	}
	var tokens *server.Tokens
	if *tokensPath != "" && *insecure {
		// --insecure lets serve run without auth; beside --tokens it
		// would do nothing, and whoever wrote both meant one of them.
		return usagef("--insecure allows a non-loopback --addr without --tokens, and --tokens FILE turns auth on: give one or the other")
	}
	if *tokensPath != "" {
		if tokens, err = server.LoadTokens(*tokensPath); err != nil {
			return usagef("%v", err)
		}
	} else if !*insecure {
		if err := requireLoopback(*addr); err != nil {
			return err
		}
	}

	var envoyConfig *envoyrls.Config
	if *envoyConfigPath != "" {
		if envoyConfig, err = envoyrls.LoadConfig(*envoyConfigPath); err != nil {
			return usagef("%v", err)
		}
	}

	// The pair loads before anything listens or opens, so a wrong path or
	// a key of another certificate fails at start, not at the first
	// handshake.
	var certs *certReloader
	if *tlsCert != "" {
		if certs, err = newCertReloader(*tlsCert, *tlsKey, log); err != nil {
			return usagef("%v", err)
		}
	}
	var clientCAs *clientCAReloader
	if *tlsClientCA != "" {
		if clientCAs, err = newClientCAReloader(*tlsClientCA, log); err != nil {
			return usagef("%v", err)
		}
	}

	// Listen before opening the store, so a taken port fails fast and
	// leaves the data directory untouched.
	ln, err := net.Listen("tcp", *addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return usagef("listen: %v: another process (another serve?) has the port: stop it, or give another with --addr", err)
	}
	if err != nil {
		return usagef("listen: %v", err)
	}
	defer ln.Close()
	if *pprofAddr != "" {
		stopProfiles, err := serveProfiles(*pprofAddr, log)
		if err != nil {
			return err
		}
		defer stopProfiles()
	}

	if *shardKeysPath != "" {
		// Refuse keys that do not load before the store is opened (and a
		// new one created): shardConfig below loads them again for good.
		if _, err := server.LoadShardKeys(*shardKeysPath); err != nil {
			return usagef("%v", err)
		}
	}

	newFile, created := newSQLiteFile(*storeSpec, *dataDir)
	// One serve owns a SQLite store: a second on the same file would
	// lead the workers beside the first.
	unlock, err := open.LockSQLite(*storeSpec, *dataDir)
	if err != nil {
		return lockError(err, "")
	}
	defer unlock()
	// --cache-rows given with a store that has no row cache is refused
	// (open.Options.CacheRows); its default is SQLite's anyway.
	openOpts := open.Options{PipelinedSync: *pipelinedSync}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "cache-rows" {
			openOpts.CacheRows = *cacheRows
		}
	})
	st, err := open.OpenWith(ctx, *storeSpec, *dataDir, openOpts)
	if err != nil {
		return storeError(err)
	}
	if created {
		log.Info("no database was there: created a new, empty one", "path", newFile)
	}
	if w, ok := st.(interface {
		WarmCache(context.Context) (int, error)
	}); ok {
		// Fill SQLite's row cache with the tenants' accounts beside the
		// first commands, so they do not each read two leaves first.
		go func() {
			began := time.Now()
			n, err := w.WarmCache(ctx)
			log.Debug("row cache warmed", "accounts", n, "took", time.Since(began), "err", err)
		}()
	}
	readyCheck, err := replicationCheck(ctx, st, *allowAsync, log)
	if err != nil {
		st.Close()
		return err
	}
	readyCheck = bothChecks(readyCheck, pathCheck(st, log))
	metrics := server.NewMetrics()
	engineOpts := engine.Options{MaxBatch: *maxBatch, OnBatch: metrics.ObserveBatch, Logger: log, LeaseTTL: *leaseTTL,
		Retention: *retention, TombstoneRetention: *tombstoneRetention, RetentionInterval: *retentionInterval,
		StatementRetention: *statementRetention, MaintenanceShare: *maintenanceShare,
		BatchTimeout: *storeTimeout}
	if resolver != nil {
		engineOpts.Resolver = &resolver.opts
	}
	if *compaction > 0 {
		engineOpts.Compaction = &engine.CompactionOptions{Every: *compaction, Interval: *compactionInterval, CutGCPercent: cutGCPercent}
	}
	eng := engine.New(st, engineOpts)
	shards, err := shardConfig(*shardKeysPath, *dataDir, *storeSpec, *shardMaxTTL, log)
	if err != nil {
		eng.Close()
		st.Close()
		// Every error of the keys says "shard keys" (or "shard key") first.
		return usagef("%v", err)
	}
	// A rotation is loaded and logged within shardKeysWatchInterval plus
	// the ring's one-second throttle, not at the next shard issued.
	go shards.Keys.Watch(ctx, shardKeysWatchInterval)
	srvCfg := server.Config{Tokens: tokens, MaxBodyBytes: *maxBody, Metrics: metrics, Logger: log, Shards: shards,
		ReadyCheck: readyCheck, WarmPolicies: true, StoreTimeout: *storeTimeout}
	if resolver != nil {
		srvCfg.Resolver = eng
	}
	if rollouts, ok := st.(store.Rollouts); ok {
		srvCfg.Rollouts = rollouts
	}
	srvCfg.Drains = eng
	if cs, ok := st.(store.ConsoleStore); ok {
		srvCfg.Console = cs
	}
	srv := server.New(eng, srvCfg)
	// /readyz says not ready until every policy is in the cache: a load
	// balancer sends reserves only once each key's is answered from it.
	warmed := make(chan struct{})
	go func() {
		srv.WarmPolicies(ctx)
		close(warmed)
	}()
	// The operator console: static files; every number on it comes from
	// the API above, called with the operator's token.
	ui := console.Handler()
	srv.Mount("/ui", ui)
	srv.Mount(console.Prefix, ui)
	var rls *envoyrls.Service
	if envoyConfig != nil {
		rls = envoyrls.New(srv, envoyConfig, log)
		rls.Mount()
		log.Info("serving Envoy's rate limit service", "procedure", envoyrls.Procedure, "domains", len(envoyConfig.Domains))
	}
	httpServer := server.HTTPServer(srv.Handler(), log)
	if certs != nil {
		// HTTPServer offers HTTP/1.1 and cleartext HTTP/2; over TLS,
		// HTTP/2 is offered by ALPN ("h2"), which gRPC clients need.
		protocols := new(http.Protocols)
		protocols.SetHTTP1(true)
		protocols.SetHTTP2(true)
		httpServer.Protocols = protocols
		httpServer.TLSConfig = serverTLSConfig(certs, clientCAs)
		httpServer.ErrorLog = tlsServerErrorLog(log)
		log.Info("tls certificate", certAttrs(certs.current.Load().Leaf)...)
		if clientCAs != nil {
			log.Info("tls client certificates required", append([]any{"ca", *tlsClientCA}, clientCAs.current.Load().attrs()...)...)
		}
	}
	// A small store's policies load in milliseconds: answer once they
	// have (so /readyz is ready from the first call); a large one's
	// (seconds at 100,000 policies) load while /readyz answers 503.
	select {
	case <-warmed:
	case <-time.After(warmWait):
	}
	// shutdown stops what serves the port, gracefully.
	shutdown := httpServer.Shutdown
	served := make(chan error, 1)
	switch *grpcTransport {
	case "grpc-go":
		// gRPC connections go to grpc-go's own transport, the rest to
		// net/http (server.Front).
		grpcServer := srv.GRPCServer(server.GRPCOptions{IdleTimeout: httpServer.IdleTimeout})
		if rls != nil {
			rls.RegisterGRPC(grpcServer)
		}
		front := &server.Front{HTTP: httpServer, GRPC: grpcServer, Log: log}
		srv.ObserveFront(front)
		if certs != nil {
			// Front does the handshake; the h2 connections it hands
			// net/http are decrypted already.
			front.TLS = httpServer.TLSConfig // ALPN: h2, http/1.1
			httpServer.Protocols.SetUnencryptedHTTP2(true)
		}
		shutdown = front.Shutdown
		go func() { served <- front.Serve(ln) }()
	default:
		go func() {
			if certs != nil {
				served <- httpServer.ServeTLS(ln, "", "")
				return
			}
			served <- httpServer.Serve(ln)
		}()
	}
	log.Info("listening", "addr", ln.Addr().String(), "grpc", *grpcTransport, "tls", certs != nil, "store", storeName(*storeSpec, *dataDir), "auth", tokens != nil)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests")
	case err := <-served:
		runErr = exitError{code: exitUnavailable, err: fmt.Errorf("serve: %w", err)}
	}
	// Shutdown waits for in-flight handlers, and each handler waits for its
	// batch to commit, so nothing acknowledged is lost and nothing
	// committed goes unanswered.
	deadline := time.Now().Add(30 * time.Second)
	shutdownCtx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("shutdown", "err", err)
	}
	// Closing waits for the engine's batches and the store's connections.
	// A store that hangs (packets dropped, connections left open) can hold
	// them for as long as a call in flight has no deadline: forever. Past
	// the shutdown's 30 s, and at least closeGrace, serve exits without
	// them, as a kill would: nothing acknowledged is lost, a call left
	// unanswered is retried with the same ids.
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		eng.Close()
		if err := st.Close(); err != nil {
			log.Warn("close store", "err", err)
		}
	}()
	wait := max(time.Until(deadline), closeGrace)
	select {
	case <-closed:
		log.Info("stopped")
	case <-time.After(wait):
		log.Warn("stopped without closing the store: its calls did not end (a store that hangs?); nothing acknowledged is lost, callers retry with the same ids", "waited", wait.Round(time.Millisecond))
	}
	return runErr
}

// closeGrace is the least time serve gives the engine and the store to
// close after the shutdown of its listeners, however long that took.
const closeGrace = 10 * time.Second

// replicationCheck checks, for a PostgreSQL store, that the primary cannot
// lose a commit the ledger acknowledged (see postgres.Replication.Risk),
// and returns the readiness check that keeps checking it. It returns an
// error (exit 1) when the primary is at risk and allowAsync is false (exit
// 5 when the store cannot be reached to tell); with
// allowAsync it logs a warning and readiness reports it. For other stores
// it returns a nil check.
func replicationCheck(ctx context.Context, st store.Store, allowAsync bool, log *slog.Logger) (func(context.Context) (string, error), error) {
	pg, ok := st.(*postgres.Store)
	if !ok {
		return nil, nil
	}
	r, err := pg.Replication(ctx)
	if err != nil {
		return nil, storeError(fmt.Errorf("check replication: %w", err))
	}
	if risk := r.Risk(); risk != "" {
		if !allowAsync {
			return nil, usagef("refusing to serve: %s (%s); or pass --allow-async-replication to accept the risk", risk, r)
		}
		log.Warn("acknowledged commits could be lost on failover (--allow-async-replication)", "risk", risk, "replication", r.String())
	} else {
		log.Info("replication", "primary", r.String())
	}
	return func(ctx context.Context) (string, error) {
		r, err := pg.Replication(ctx)
		if err != nil {
			return "", err
		}
		if risk := r.Risk(); risk != "" {
			if !allowAsync {
				return "", fmt.Errorf("%s (%s)", risk, r)
			}
			return fmt.Sprintf("%s\nwarning (--allow-async-replication): %s", r, risk), nil
		}
		return r.String(), nil
	}, nil
}

// defaultDataDir is --data-dir when not given, for serve, migrate and
// audit --store sqlite alike.
const defaultDataDir = "./capledger-data"

// pathCheckInterval is how often readiness checks the PostgreSQL
// connection path again: each check opens two connections of its own.
const pathCheckInterval = time.Minute

// pathCheck logs a warning, for a PostgreSQL store, for each session
// setting Open found not in effect (postgres.Store.CheckPath; Open
// refused a path where prepared statements are lost), and returns the
// readiness check that checks the path again, at most every
// pathCheckInterval: lost prepared statements make the replica not
// ready, settings not in effect are shown as warnings. For other stores
// it returns a nil check.
func pathCheck(st store.Store, log *slog.Logger) func(context.Context) (string, error) {
	pg, ok := st.(*postgres.Store)
	if !ok {
		return nil
	}
	settings := pg.SettingsNotInEffect()
	for _, s := range settings {
		log.Warn("a session setting the store relies on is not in effect on its connections (a pooler dropping startup parameters?)",
			"setting", s.Name, "seen", s.Seen, "want", s.Want, "fix", s.Fix())
	}
	var mu sync.Mutex
	checked := time.Now()
	var lost error
	return func(ctx context.Context) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(checked) >= pathCheckInterval {
			report, err := pg.CheckPath(ctx)
			switch {
			case err == nil:
				settings, lost, checked = report.Settings, nil, time.Now()
			case errors.Is(err, postgres.ErrPreparedStatementsLost):
				lost, checked = err, time.Now()
			default:
				// Not reached now: not ready, and checked again at the
				// next probe.
				return "", err
			}
		}
		if lost != nil {
			return "", lost
		}
		var warnings []string
		for _, s := range settings {
			warnings = append(warnings, "warning: "+s.String())
		}
		return strings.Join(warnings, "\n"), nil
	}
}

// bothChecks returns the readiness check that passes when both pass,
// their details on lines of their own; a nil check passes.
func bothChecks(a, b func(context.Context) (string, error)) func(context.Context) (string, error) {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	return func(ctx context.Context) (string, error) {
		da, err := a(ctx)
		if err != nil {
			return "", err
		}
		db, err := b(ctx)
		if err != nil {
			return "", err
		}
		if da == "" || db == "" {
			return da + db, nil
		}
		return da + "\n" + db, nil
	}
}

// checkListenAddr refuses a listen address that is not HOST:PORT, saying
// what to write instead. The client commands' --addr is a URL
// (http://host:port), and that value pasted into serve's failed as "too
// many colons in address"; a port out of range was reported as reachable
// from other machines.
func checkListenAddr(addr string) error {
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		return usagef("--addr %q: serve listens on HOST:PORT, without %s:// (--addr %s); the URL form is the client commands' --addr",
			addr, scheme, strings.TrimSuffix(rest, "/"))
	}
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return usagef("--addr %q: want HOST:PORT, such as 127.0.0.1:7070 (port 0: any free one): %v", addr, err)
	}
	return nil
}

// requireLoopback refuses a listen address that other machines can reach
// while auth is off.
func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--addr %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return usagef("--addr %s is reachable from other machines but auth is off: pass --tokens FILE, or --insecure if that is really intended", addr)
}

func newLogger(e *env, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// storeName describes the store for the log without a password.
func storeName(spec, dataDir string) string {
	if strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://") {
		if i := strings.Index(spec, "@"); i >= 0 {
			return "postgres://…" + spec[i:]
		}
		return spec
	}
	if spec == "" {
		return "sqlite in " + dataDir
	}
	return spec
}

// shardKeysWatchInterval is how often serve looks at the shard keys'
// files for a rotation (the ring reads them at most once a second), so
// an appended key is picked up within about 1.5 s (docs/OPERATIONS.md).
const shardKeysWatchInterval = 500 * time.Millisecond

// serveCutGCPercent is serve's GC target while a checkpoint is cut.
const serveCutGCPercent = 100

// serveMemoryLimit is serve's soft memory limit for a row cache of
// cacheRows rows: 320 MiB plus 256 bytes a row (448 MiB at the default).
// With a GC target of 400 the heap would otherwise grow to five times its
// live data (1.15 GB RSS with a million accounts); near the limit the GC
// runs more often instead, and the live data (about 257 bytes per cached
// tenant) stays below it. It is soft: past it the GC works
// harder, it does not fail allocations. The limit counts the Go runtime's
// memory only: serve's RSS is about 70 MiB more (SQLite's page caches
// and the binary), and the heap sits at the limit whenever its
// live data and garbage would pass it (the expiry of a million holds
// beside a cut), so the limit is what keeps a million accounts within
// 600 MB (docs/PERFORMANCE.md, "RSS and the checkpoint cut"; with 256 MiB
// plus 2 KiB a row, VmHWM reached 605 MB, measured for commit 1362202).
func serveMemoryLimit(cacheRows int) int64 {
	return 320<<20 + int64(cacheRows)*256
}

// The ranges of serve's numeric flags (serveHelp, docs/OPERATIONS.md).
const (
	minMaxBody   = 1 << 10 // a policy or a batch of a few items fits
	maxMaxBody   = 1 << 30 // a body is read whole into memory
	maxMaxBatch  = 1 << 16 // the engine's queue holds 4 batches
	maxCacheRows = 1 << 30 // 256 GiB of memory limit (serveMemoryLimit)
	// The worker lease is renewed every third of --lease-ttl; a dead
	// holder's work waits for it to run out.
	minLeaseTTL = 300 * time.Millisecond
	maxLeaseTTL = 24 * time.Hour
	// How often a maintenance pass runs: not in a loop, at least daily.
	minPassInterval = time.Millisecond
	maxPassInterval = 24 * time.Hour
	// A checkpoint is cut at most once a second.
	minCompaction = time.Second
	// Statements are the billing record: one kept less than a day after
	// its epoch ended is more likely a mistaken unit (30m meant as 30
	// months) than a wish, and a daily export would miss it.
	minStatementRetention = 24 * time.Hour
	// A shard shorter than a second could not be used; the API grants
	// none longer than its longest duration.
	minShardMaxTTL = time.Second
	// A store that answers a transaction in less than a second is busy,
	// not hung; a call that waits ten minutes for one has been given up
	// by its caller long before.
	minStoreTimeout = time.Second
	maxStoreTimeout = 10 * time.Minute
)

// serveBounds is what checkServeFlags checks.
type serveBounds struct {
	maxBody                                 int64
	maxBatch, cacheRows                     int
	leaseTTL, retention, tombstoneRetention time.Duration
	retentionInterval, compaction           time.Duration
	statementRetention                      time.Duration
	compactionInterval, shardMaxTTL         time.Duration
	maintenanceShare                        float64
	storeTimeout                            time.Duration
}

// checkServeFlags returns the usage error naming the first of serve's
// numeric flags outside its range, its value and the range; nil when
// all are in range.
func checkServeFlags(b serveBounds) error {
	const forever = time.Duration(math.MaxInt64)
	if err := firstError(
		intIn("max-body", b.maxBody, minMaxBody, maxMaxBody),
		intIn("max-batch", b.maxBatch, 1, maxMaxBatch),
		intIn("cache-rows", b.cacheRows, 1, maxCacheRows),
		durationIn("lease-ttl", b.leaseTTL, minLeaseTTL, maxLeaseTTL),
		durationIn("retention", b.retention, 0, forever),
		durationIn("tombstone-retention", b.tombstoneRetention, 0, forever),
		durationIn("retention-interval", b.retentionInterval, minPassInterval, maxPassInterval),
		durationOffOrIn("statement-retention", b.statementRetention, minStatementRetention, forever, "keep statements forever"),
		durationOffOrIn("compaction", b.compaction, minCompaction, forever, "keep the whole journal"),
		durationIn("compaction-interval", b.compactionInterval, minPassInterval, maxPassInterval),
		durationIn("shard-max-ttl", b.shardMaxTTL, minShardMaxTTL, maxAPIDuration),
		durationIn("store-timeout", b.storeTimeout, minStoreTimeout, maxStoreTimeout),
	); err != nil {
		return err
	}
	if !(b.maintenanceShare > 0 && b.maintenanceShare <= 1) {
		return usagef("--maintenance-share %v: want a share above 0 and at most 1", b.maintenanceShare)
	}
	if b.retention > 0 && b.tombstoneRetention > 0 && b.tombstoneRetention < b.retention {
		return usagef("--tombstone-retention %s is shorter than --retention %s: a tombstone must outlive the window", b.tombstoneRetention, b.retention)
	}
	if b.statementRetention > 0 && b.retention == 0 {
		return usagef("--statement-retention %s needs the retention pass, which --retention 0 turns off", b.statementRetention)
	}
	return nil
}
