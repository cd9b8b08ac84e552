// Command gateway is an example LLM gateway in front of a capledger ledger.
//
// It fronts a small fake LLM backend (included: backend.go, a model that
// runs 4 generations at once and reports the tokens it used) and puts
// every request under a reservation with the client package's middleware:
// it estimates the tokens of a chat request (prompt + max_tokens), reserves
// them, answers 429 with Retry-After and the limiting dimension when the
// tenant's budget is spent, queues admitted requests fairly by tenant weight
// in front of the backend's 4 slots, and settles the tokens the backend
// reports, refunding the difference.
//
// Run it (see README.md):
//
//	go run ./cmd/capledger serve --data-dir /tmp/capledger-gateway-demo &
//	go run ./examples/gateway --demo
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
)

// Route is the policy route of every chat request.
const Route = "chat.generate"

// defaultMaxTokens is what a request without max_tokens may generate.
const defaultMaxTokens = 256

// apiKeys maps API keys to tenants (the subjects of the ledger).
var apiKeys = map[string]string{
	"key-acme":    "acme",
	"key-globex":  "globex",
	"key-initech": "initech",
}

// tokenEstimator reserves what a request can use at most: its prompt and
// all of max_tokens. Its digest names this formula, so every reservation
// records which estimator sized it.
var tokenEstimator = client.NewEstimator(estimatorDigest("fake-llm tokens v1: words*4/3+1 + max_tokens (default 256); requests 1"),
	func(r *http.Request, body []byte) (client.Units, error) {
		var req ChatRequest
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, fmt.Errorf("chat request: %w", err)
		}
		if len(req.Messages) == 0 {
			return nil, errors.New("chat request has no messages")
		}
		maxTokens := req.MaxTokens
		if maxTokens <= 0 {
			maxTokens = defaultMaxTokens
		}
		return client.Units{"tokens": promptTokens(req.Messages) + maxTokens, "requests": 1}, nil
	})

func estimatorDigest(formula string) string {
	sum := sha256.Sum256([]byte(formula))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// subjectFromAPIKey returns the tenant of "Authorization: Bearer <key>".
func subjectFromAPIKey(r *http.Request) (string, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", errors.New("missing Authorization: Bearer <api key>")
	}
	tenant, ok := apiKeys[key]
	if !ok {
		return "", errors.New("unknown api key")
	}
	return tenant, nil
}

// usageFromBackend settles what the backend reported in its usage header;
// a backend that could not be reached used nothing (the proxy's error
// handler reports that); any other answer without usage is unknown.
func usageFromBackend(u *client.UsageInfo) (client.Units, error) {
	if u.Reported != nil {
		return u.Reported, nil
	}
	if u.Stream != nil {
		// A streamed answer ("stream": true) reports its usage in its
		// final event; a stream cut before it leaves the usage unknown.
		return streamUsage(u)
	}
	total, err := strconv.ParseInt(u.Header.Get(UsageHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("backend answered %d without %s: %w", u.Status, UsageHeader, client.ErrUsageUnknown)
	}
	return client.Units{"tokens": total, "requests": 1}, nil
}

var streamUsage = client.UsageFromStream(map[string]string{"tokens": "total_tokens"}, client.Units{"requests": 1})

// newGateway returns the gateway's handler: the middleware in front of a
// reverse proxy to the backend, with a fair queue of `slots` places.
func newGateway(c *client.Client, backend *url.URL, slots int) (http.Handler, *client.FairQueue, error) {
	queue, err := c.NewFairQueue(client.FairQueueConfig{Concurrency: slots, CostUnit: "tokens"})
	if err != nil {
		return nil, nil, err
	}
	proxy := httputil.NewSingleHostReverseProxy(backend)
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			// Nothing reached the backend: nothing was used.
			client.ReportUsage(r.Context(), client.Units{"tokens": 0, "requests": 1})
		}
		http.Error(w, "backend unavailable", http.StatusBadGateway)
	}
	mw, err := c.Middleware(client.MiddlewareConfig{
		Route: Route, Subject: subjectFromAPIKey, Estimator: tokenEstimator,
		Usage: usageFromBackend, Queue: queue,
	})
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/chat/completions", mw(proxy))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	return mux, queue, nil
}

// demoPolicies are the tenants' budgets: acme pays for three times
// globex's share of the backend; everyone else falls under "*", a small
// budget that runs out quickly.
func demoPolicies() []*ledgerv1.Policy {
	policy := func(subject string, weight, tokensPerSecond, burst int64) *ledgerv1.Policy {
		return &ledgerv1.Policy{
			Subject: subject, Route: Route,
			Dimensions: []*ledgerv1.Dimension{
				{Unit: "tokens", RefillUnits: tokensPerSecond, RefillInterval: durationpb.New(time.Second), Burst: burst},
				{Unit: "requests", RefillUnits: 1000, RefillInterval: durationpb.New(time.Second), Burst: 1000},
			},
			EstimatorDigest: tokenEstimator.Digest(),
			HoldTtl:         durationpb.New(30 * time.Second),
			ExecutionLimit:  durationpb.New(2 * time.Minute),
			FairnessWeight:  weight,
		}
	}
	return []*ledgerv1.Policy{
		policy("acme", 3, 200_000, 200_000),
		policy("globex", 1, 200_000, 200_000),
		policy("*", 1, 300, 1200),
	}
}

func main() {
	ledgerAddr := flag.String("ledger", "http://127.0.0.1:7070", "capledger server address")
	token := flag.String("token", os.Getenv("CAPLEDGER_TOKEN"), "bearer token for the ledger (admin, to publish the demo policies)")
	listen := flag.String("listen", "127.0.0.1:8080", "gateway listen address")
	slots := flag.Int("backend-slots", 4, "generations the fake LLM runs at once")
	demo := flag.Bool("demo", false, "send demo traffic for three tenants and print a report")
	demoDuration := flag.Duration("demo-duration", 5*time.Second, "how long the demo traffic runs")
	opsDir := flag.String("ops-dir", filepath.Join(os.TempDir(), "capledger-gateway-ops"), "directory of the durable operation records")
	opsSecret := flag.String("ops-secret-file", "", "shared secret of the route in the ledger's --resolver-config: serve GET /operations/{id} for its USAGE_UNKNOWN resolver")
	flag.Parse()
	log.SetFlags(0)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ops, secret, err := openOperations(*opsDir, *opsSecret)
	if err != nil {
		log.Fatalf("gateway: %v", err)
	}
	if err := run(ctx, *ledgerAddr, *token, *listen, *slots, *demo, *demoDuration, ops, secret); err != nil {
		log.Fatalf("gateway: %v", err)
	}
}

func run(ctx context.Context, ledgerAddr, token, listen string, slots int, demo bool, demoDuration time.Duration, ops *client.FileOperationStore, secret []byte) error {
	opts := []client.Option{client.WithTimeout(2 * time.Second), client.WithOperationStore(ops)}
	if token != "" {
		opts = append(opts, client.WithBearerToken(token))
	}
	c, err := client.New(ledgerAddr, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, p := range demoPolicies() {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, _, err := c.PublishPolicy(pctx, p)
		cancel()
		if err != nil {
			return fmt.Errorf("publish policy for %s (is `capledger serve` running at %s?): %w", p.GetSubject(), ledgerAddr, err)
		}
		log.Printf("policy %-8s generation %d: %d tokens/s, burst %d, weight %d", got.GetSubject(), got.GetGeneration(),
			got.GetDimensions()[0].GetRefillUnits(), got.GetDimensions()[0].GetBurst(), got.GetFairnessWeight())
	}

	logUnknown(ctx, c, ops)

	backendLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	llm := newFakeLLM(slots, 50*time.Microsecond, 1)
	go http.Serve(backendLn, llm)
	backendURL := &url.URL{Scheme: "http", Host: backendLn.Addr().String()}

	handler, queue, err := newGateway(c, backendURL, slots)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: withOperations(handler, ops, secret), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	gatewayURL := "http://" + ln.Addr().String()
	log.Printf("gateway on %s, fake LLM backend on %s (%d slots)", gatewayURL, backendURL.Host, slots)
	log.Printf(`try: curl -i %s/v1/chat/completions -H 'Authorization: Bearer key-initech' -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":300}'`, gatewayURL)

	if demo {
		// A demo whose report cannot be read (the ledger down, its audit
		// failing on a full disk) is logged; the gateway keeps serving.
		report, err := runDemo(ctx, gatewayURL, c, demoDuration)
		switch {
		case ctx.Err() != nil: // Ctrl-C during the demo: shut down below
		case err != nil:
			log.Printf("demo: %v (the gateway keeps serving)", err)
		default:
			queued, running := queue.Stats()
			report.print(os.Stdout, llm, queued, running)
		}
	}
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// openOperations opens the gateway's durable record of its operations
// and reads the endpoint's secret (nil without a file: the endpoint is
// then not served).
func openOperations(dir, secretFile string) (*client.FileOperationStore, []byte, error) {
	ops, err := client.OpenOperationStore(dir)
	if err != nil {
		return nil, nil, err
	}
	// Final records older than a day are no longer needed by the
	// resolver (longer than any unknownDeadline this demo configures);
	// without pruning the directory grows by a file per operation.
	if n, err := ops.Prune(time.Now().Add(-24 * time.Hour)); err != nil {
		return nil, nil, err
	} else if n > 0 {
		log.Printf("pruned %d finished operation records older than 24h", n)
	}
	if secretFile == "" {
		return ops, nil, nil
	}
	raw, err := os.ReadFile(secretFile)
	if err != nil {
		return nil, nil, err
	}
	secret := []byte(strings.TrimSpace(string(raw)))
	if len(secret) < 16 {
		return nil, nil, fmt.Errorf("%s: secret shorter than 16 bytes", secretFile)
	}
	return ops, secret, nil
}

// withOperations serves the operation-status endpoint beside the
// gateway when there is a secret.
func withOperations(gateway http.Handler, ops client.OperationStore, secret []byte) http.Handler {
	if secret == nil {
		return gateway
	}
	mux := http.NewServeMux()
	mux.Handle("/operations/", client.OperationStatusHandler(ops, secret))
	mux.Handle("/", gateway)
	return mux
}

// logUnknown logs the operations a previous process left running: the
// fake LLM ran in that process, so their usage is lost and they stay
// USAGE_UNKNOWN for an operator (a backend with its own billing record
// would call client.Finish here instead). Records whose reservation the
// ledger says has ended (an operator settled it) are removed first, so
// each is logged until it is resolved, not on every restart for good.
func logUnknown(ctx context.Context, c *client.Client, ops *client.FileOperationStore) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := ops.PruneResolved(pctx, c)
	cancel()
	if err != nil {
		log.Printf("operation records: %v (kept; looked up again at the next start)", err)
	}
	if n > 0 {
		log.Printf("removed %d unknown operation records whose reservations have since been settled", n)
	}
	unknown, err := ops.Unknown()
	if err != nil {
		log.Printf("operation records: %v", err)
		return
	}
	for _, rec := range unknown {
		log.Printf("operation %s of reservation %s: usage unknown (it ran in an earlier process)", rec.OperationID, rec.ReservationID)
	}
}
