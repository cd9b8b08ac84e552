package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/open"
)

func init() {
	register(&command{name: "serve", summary: "run the ledger server (gRPC, gRPC-Web and JSON on one port)", help: serveHelp, run: runServe})
}

const serveHelp = `Usage: capledger serve [flags]

Serve runs the ledger: the LedgerService API as gRPC, gRPC-Web and
Connect/JSON over HTTP/1.1 and cleartext HTTP/2 on one port, plus /healthz,
/readyz and /metrics (Prometheus). With no flags it needs no configuration:
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
                      gateway or admin (# comments allowed). Without it auth
                      is off and serve listens on loopback addresses only.
  --shard-keys PATH   emergency-shard signing keys: a keys file or a directory
                      of them (see "capledger shard --help"); default: the
                      file shard-keys in --data-dir, created with a new key on
                      first start. Replicas on one PostgreSQL need the same keys.
  --shard-max-ttl DUR longest emergency-shard lifetime granted (default 24h)
  --tls-cert FILE     PEM certificate (chain) to serve HTTPS with; needs
                      --tls-key. Both files are re-read when they change
                      (checked at most every 2s during handshakes): rotate by
                      replacing them, no restart. A pair that fails to load
                      is logged and the previous certificate kept.
  --tls-key FILE      PEM private key of --tls-cert
  --insecure          allow listening on a non-loopback address without
                      --tokens (anyone who can connect may publish policies)
  --max-body BYTES    request body limit (default 1048576)
  --max-batch N       commands per store transaction (default 512)
  --retention DUR     remove finished reservations (settled, released,
                      expired) this long after they finished (default 72h;
                      0 keeps every row forever). See docs/OPERATIONS.md,
                      "Retention and compaction".
  --tombstone-retention DUR
                      how long a removed reservation's tombstone answers a
                      retry of its id (default 720h = 30 days; at least
                      --retention; 0 keeps tombstones forever)
  --retention-interval DUR
                      how often the retention pass runs (default 1m)
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

Exit codes: 0 after a graceful shutdown, 1 for bad flags or a store or
address that cannot be opened or a TLS pair that does not load, 5 when the
server fails while running.
`

func runServe(ctx context.Context, e *env, args []string) error {
	fs := newFlags("serve")
	addr := fs.String("addr", "127.0.0.1:7070", "")
	dataDir := fs.String("data-dir", "./capledger-data", "")
	storeSpec := fs.String("store", "", "")
	tokensPath := fs.String("tokens", "", "")
	shardKeysPath := fs.String("shard-keys", "", "")
	shardMaxTTL := fs.Duration("shard-max-ttl", server.DefaultMaxShardTTL, "")
	insecure := fs.Bool("insecure", false, "")
	tlsCert := fs.String("tls-cert", "", "")
	tlsKey := fs.String("tls-key", "", "")
	maxBody := fs.Int64("max-body", server.DefaultMaxBodyBytes, "")
	maxBatch := fs.Int("max-batch", 512, "")
	retention := fs.Duration("retention", engine.DefaultRetention, "")
	tombstoneRetention := fs.Duration("tombstone-retention", engine.DefaultTombstoneRetention, "")
	retentionInterval := fs.Duration("retention-interval", time.Minute, "")
	logLevel := fs.String("log-level", "info", "")
	logFormat := fs.String("log-format", "text", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	// The ledger's rows are short-lived garbage: a larger GC target trades
	// memory for fewer collections (+11-22% at concurrency 64 in
	// docs/PERFORMANCE.md's serve path section). GOGC, when set, wins.
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	log, err := newLogger(e, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	if *maxBody <= 0 || *maxBatch <= 0 {
		return usagef("--max-body and --max-batch must be positive")
	}

	if *retention < 0 || *tombstoneRetention < 0 || *retentionInterval <= 0 {
		return usagef("--retention and --tombstone-retention may not be negative, --retention-interval must be positive")
	}
	if *retention > 0 && *tombstoneRetention > 0 && *tombstoneRetention < *retention {
		return usagef("--tombstone-retention %s is shorter than --retention %s: a tombstone must outlive the window", *tombstoneRetention, *retention)
	}

	if (*tlsCert == "") != (*tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together: give both files, or neither for cleartext")
	}

	var tokens *server.Tokens
	if *tokensPath != "" {
		if tokens, err = server.LoadTokens(*tokensPath); err != nil {
			return usagef("%v", err)
		}
	} else if !*insecure {
		if err := requireLoopback(*addr); err != nil {
			return err
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

	// Listen before opening the store, so a taken port fails fast and
	// leaves the data directory untouched.
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return usagef("listen: %v", err)
	}
	defer ln.Close()

	st, err := open.Open(ctx, *storeSpec, *dataDir)
	if err != nil {
		return usagef("open store: %v", err)
	}
	metrics := server.NewMetrics()
	eng := engine.New(st, engine.Options{MaxBatch: *maxBatch, OnBatch: metrics.ObserveBatch, Logger: log,
		Retention: *retention, TombstoneRetention: *tombstoneRetention, RetentionInterval: *retentionInterval})
	shards, err := shardConfig(*shardKeysPath, *dataDir, *storeSpec, *shardMaxTTL, log)
	if err != nil {
		eng.Close()
		st.Close()
		return usagef("shard keys: %v", err)
	}
	srv := server.New(eng, server.Config{Tokens: tokens, MaxBodyBytes: *maxBody, Metrics: metrics, Logger: log, Shards: shards})
	httpServer := server.HTTPServer(srv.Handler(), log)
	if certs != nil {
		// HTTPServer offers HTTP/1.1 and cleartext HTTP/2; over TLS,
		// HTTP/2 is offered by ALPN ("h2"), which gRPC clients need.
		protocols := new(http.Protocols)
		protocols.SetHTTP1(true)
		protocols.SetHTTP2(true)
		httpServer.Protocols = protocols
		httpServer.TLSConfig = serverTLSConfig(certs)
		httpServer.ErrorLog = tlsServerErrorLog(log)
		log.Info("tls certificate", certAttrs(certs.cert.Load().Leaf)...)
	}

	served := make(chan error, 1)
	go func() {
		if certs != nil {
			served <- httpServer.ServeTLS(ln, "", "")
			return
		}
		served <- httpServer.Serve(ln)
	}()
	log.Info("listening", "addr", ln.Addr().String(), "tls", certs != nil, "store", storeName(*storeSpec, *dataDir), "auth", tokens != nil)

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
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := httpServer.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("shutdown", "err", err)
	}
	eng.Close()
	if err := st.Close(); err != nil {
		log.Warn("close store", "err", err)
	}
	log.Info("stopped")
	return runErr
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
