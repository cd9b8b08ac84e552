package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/ledger"
)

func init() {
	register(&command{name: "bench", summary: "load generator over the real API: ops/s and p50/p99/p999 latency", help: benchHelp, run: runBench})
}

const benchHelp = `Usage: capledger bench [flags]

Bench drives a running server through the real API (the Go SDK, one shared
connection pool) from --concurrency goroutines for --duration, after a
--warmup that is not measured, and prints ops/s and latency percentiles in a
table. A progress bar goes to stderr.

Modes:
  reserve    one Reserve call per op (each a new reservation id)
  lifecycle  Reserve, Start and Settle per op (latency of all three)
  batch      one ReserveBatch of --batch-size reservations per op
  echo       baseline: POST a JSON body of the size of a reserve to
             --addr/echo and read the echo back; run the echo server with
             "capledger bench --echo-server --addr 127.0.0.1:7071"
  gubernator baseline: one GetRateLimits call (hits = --units, one key
             per subject) in JSON to the HTTP gateway of a gubernator at
             --addr (its GUBER_HTTP_ADDRESS), or with --protocol grpc to
             its gRPC API (GUBER_GRPC_ADDRESS): an in-memory limiter that
             keeps nothing durable, measured on the same machine
  redis      baseline: one EVALSHA of a Lua token bucket (one key per
             subject) to the redis-server at --addr (host:port), on one
             connection per caller; run redis-server with --appendonly yes
             --appendfsync always for decisions as durable as capledger's
  redis-batch  --batch-size such EVALSHAs pipelined in one write per op
  envoy      one ShouldRateLimit (Envoy's rate limit service, gRPC) of
             one descriptor {tenant: subject} in --envoy-domain with hits
             --units, to capledger serve --envoy-config or to the
             reference envoyproxy/ratelimit at --addr (its gRPC port;
             --setup=false there): the same client for both

To keep its own cost per call low on a machine it shares with the server,
bench runs with a GC target of 400 and, at --concurrency 1, on one
processor (one P); GOGC and GOMAXPROCS in the environment override both.

Unless --setup=false, bench first publishes a policy for subject "*" on
--route (admin role) with a burst no benchmark exhausts and a 1h hold TTL,
so every reservation is admitted and none expires during the run.

Flags:
  --mode MODE        reserve, lifecycle, batch, echo, gubernator, redis,
                     redis-batch or envoy (default reserve)
  --envoy-domain D   rate limit domain of --mode envoy (default bench)
  --concurrency N    concurrent callers (default 64; 1 to 65536)
  --duration DUR     measured time (default 10s; above 0); it goes on
                     until at least one call has finished, so a short run
                     on a loaded machine still measures one
  --warmup DUR       unmeasured time before it (default 1s; not negative)
  --rate N           pace all callers together to N ops a second (an open
                     schedule: call k is due at k/N s; one that is overdue
                     starts at once), a steady load whatever else the
                     machine runs; latency counts from the call's start.
                     0 = as fast as the callers go (default 0)
  --subjects N       subjects to spread over; 1 = one hot subject (default 1;
                     at most 1073741824)
  --prefill BOOL     before the warmup, reserve once for every subject (in
                     batches of 250, one at a time), so
                     each has its account and the measured run reads
                     existing rows, as a ledger with N tenants does
                     (default true when --subjects > 1). Each subject's
                     prefill reservation has a fixed id (prefill-ROUTE-N), so
                     a batch whose answer was lost is sent again (up to 5
                     times) and a second prefill of the same subjects only
                     replays. The 1M-tenant case is one command:
                     capledger bench --subjects 1000000
  --prefill-from N   start the prefill at subject N, 0 to --subjects (resume
                     one that was interrupted; default 0; needs a prefill)
  --epoch-length DUR accounting epoch of the bench policy (default the
                     server's, 1h; else 1s to 438300h); a short one makes an epoch rollover of
                     every prefilled account happen during the run
  --addrs A,B,...    spread the callers over several servers (replicas of
                     one store) round-robin, instead of --addr
  --batch-size N     reservations per ReserveBatch (default 100, at most 1000)
  --seed N           seed of the callers' subject choice (caller i draws
                     from seed N, stream i); default a new one per run,
                     printed in the table, so that successive runs over
                     many subjects do not revisit the same subjects in
                     the same order (a warm cache flatters them); give a
                     printed seed to repeat a run's subjects
  --route ROUTE      route of the reservations (default bench.reserve)
  --units N          tokens per reservation (default 1; at most 2^53)
  --protocol P       connect (binary protobuf, default), connect-json or grpc
                     (the SDK's connect-go client), or grpc-go: reserve,
                     lifecycle and batch with a grpc-go client (one
                     HTTP/2 connection, as gubernator's gRPC baseline and
                     --mode envoy use); gubernator takes grpc or grpc-go
  --setup BOOL       publish the bench policy first (default true)
  --progress BOOL    draw the progress bar (default true)
  --cpuprofile FILE  write a pprof CPU profile of the load generator (the
                     SDK's side of every call) to FILE
  --echo-server      serve the echo baseline on --addr instead (until Ctrl-C)
` + clientFlagsHelp + `
Exit codes: 0 when operations succeeded (errors during the run are
counted in the table), 1 for bad flags or a refused token, 5 when no
operation succeeded (server unreachable or failing).

Example:
  capledger serve --data-dir /tmp/bench &
  capledger bench --concurrency 64 --duration 10s
  capledger bench --mode batch --batch-size 100 --concurrency 8
  capledger bench --concurrency 1 --duration 5s
`

// startCPUProfile profiles the process into path until the returned stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

var benchModes = []string{"reserve", "lifecycle", "batch", "echo", "gubernator", "redis", "redis-batch", "envoy"}

type benchConfig struct {
	mode        string
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	subjects    int
	batchSize   int
	route       string
	units       int64
	protocol    client.Protocol
	// grpcGo drives the LedgerService with a grpc-go client (--protocol
	// grpc-go) instead of the SDK.
	grpcGo      bool
	setup       bool
	progress    bool
	prefill     bool
	prefillFrom int
	addrs       []string
	epochLength time.Duration
	// rate, when positive, paces the callers together to this many ops a
	// second (an open schedule, as a steady fleet of gateways sends): a
	// soak's load then stays the same whatever else the machine runs.
	rate        float64
	envoyDomain string
	// seed is the callers' subject choice: caller i draws from
	// PCG(seed, i).
	seed   uint64
	stderr io.Writer
	// conn is the connection flags: the SDK client for the ledger modes,
	// the address alone for the baselines.
	conn *clientFlags
}

func runBench(ctx context.Context, e *env, args []string) error {
	fs := newFlags("bench")
	var cf clientFlags
	cf.register(fs, e)
	cfg := benchConfig{}
	fs.StringVar(&cfg.mode, "mode", "reserve", "")
	fs.IntVar(&cfg.concurrency, "concurrency", 64, "")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "")
	fs.IntVar(&cfg.subjects, "subjects", 1, "")
	fs.IntVar(&cfg.batchSize, "batch-size", 100, "")
	fs.StringVar(&cfg.route, "route", "bench.reserve", "")
	fs.Int64Var(&cfg.units, "units", 1, "")
	protocol := fs.String("protocol", "connect", "")
	fs.BoolVar(&cfg.setup, "setup", true, "")
	fs.BoolVar(&cfg.progress, "progress", true, "")
	fs.StringVar(&cfg.envoyDomain, "envoy-domain", "bench", "")
	echoServer := fs.Bool("echo-server", false, "")
	prefill := fs.String("prefill", "", "")
	fs.IntVar(&cfg.prefillFrom, "prefill-from", 0, "")
	addrs := fs.String("addrs", "", "")
	fs.DurationVar(&cfg.epochLength, "epoch-length", 0, "")
	fs.Float64Var(&cfg.rate, "rate", 0, "")
	cpuProfile := fs.String("cpuprofile", "", "")
	seed := fs.String("seed", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 0, ""); err != nil {
		return err
	}
	if *echoServer {
		return serveEcho(ctx, e, cf.addr)
	}
	if *protocol == "grpc-go" {
		// The grpc-go client for the measured calls (grpcGoOp); setup
		// and prefill go through the SDK's gRPC.
		cfg.grpcGo, *protocol = true, "grpc"
	}
	if cfg.protocol, err = client.ParseProtocol(*protocol); err != nil {
		return usagef("--protocol: %v", err)
	}
	if !slices.Contains(benchModes, cfg.mode) {
		return usagef("--mode %q: want one of %s", cfg.mode, strings.Join(benchModes, ", "))
	}
	if err := firstError(
		intIn("concurrency", cfg.concurrency, 1, maxBenchConcurrency),
		durationIn("duration", cfg.duration, time.Nanosecond, time.Duration(math.MaxInt64)),
		durationIn("warmup", cfg.warmup, 0, time.Duration(math.MaxInt64)),
		intIn("subjects", cfg.subjects, 1, maxBenchSubjects),
		intIn("batch-size", cfg.batchSize, 1, client.MaxBatch),
		intIn("units", cfg.units, 1, int64(ledger.MaxUnits)),
		intIn("prefill-from", cfg.prefillFrom, 0, cfg.subjects),
		durationOffOrIn("epoch-length", cfg.epochLength, ledger.MinEpochLength, ledger.MaxEpochLength, "the server's default"),
	); err != nil {
		return err
	}
	if cfg.rate < 0 || math.IsNaN(cfg.rate) || math.IsInf(cfg.rate, 0) {
		return usagef("--rate %v: want a number of ops a second, 0 for as fast as the callers go", cfg.rate)
	}
	switch *prefill {
	case "":
		cfg.prefill = cfg.subjects > 1
	case "true", "false":
		cfg.prefill = *prefill == "true"
	default:
		return usagef("--prefill %q: want true or false", *prefill)
	}
	if cfg.prefillFrom > 0 && !cfg.prefill {
		return usagef("--prefill-from %d resumes a prefill, and there is none: give --prefill=true (or more than one --subjects)", cfg.prefillFrom)
	}
	if *addrs != "" {
		for _, a := range strings.Split(*addrs, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.addrs = append(cfg.addrs, a)
			}
		}
	}
	if *seed == "" {
		cfg.seed = rand.Uint64()
	} else if cfg.seed, err = strconv.ParseUint(*seed, 10, 64); err != nil {
		return usagef("--seed %q: want an unsigned integer", *seed)
	}
	cfg.conn = &cf
	cfg.stderr = e.stderr
	defer benchRuntime(e, cfg.concurrency)()

	var op func(ctx context.Context, w *benchWorker) (units int, err error)
	switch cfg.mode {
	case "echo":
		op, err = echoOp(&cfg)
	case "gubernator":
		if cfg.protocol == client.ProtocolGRPC {
			op, err = gubernatorGRPCOp(&cfg)
		} else {
			op, err = gubernatorOp(&cfg)
		}
	case "redis", "redis-batch":
		op, err = redisOp(ctx, &cfg)
	case "envoy":
		op, err = envoyOp(ctx, &cfg)
	default:
		if cfg.grpcGo {
			op, err = grpcGoOp(ctx, &cfg)
		} else {
			op, err = ledgerOp(ctx, &cfg)
		}
	}
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	res := drive(ctx, e, &cfg, op)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	printBench(e.stdout, &cfg, res)
	if res.ops == 0 {
		if res.firstErr == nil {
			return exitError{code: exitUnavailable, err: fmt.Errorf("no operation finished within --duration %s", cfg.duration)}
		}
		return exitError{code: exitUnavailable, err: fmt.Errorf("no operation succeeded: %w", res.firstErr)}
	}
	return nil
}

// The ranges of bench's --concurrency and --subjects: a caller is a
// goroutine with its own connection state, a subject a row in the store.
const (
	maxBenchConcurrency = 1 << 16
	maxBenchSubjects    = 1 << 30
)

// benchRuntime tunes the Go runtime of the load generator, which shares
// the machine with the server it measures, so that its own CPU per call
// stays small: a GC target of 400 (as serve sets; the calls' garbage is
// short-lived), and with a single caller one P, so the three goroutine
// hand-offs of each HTTP/1.1 call (caller, the transport's write loop, its
// read loop) are run queue operations instead of wake-ups of other threads
// (echo baseline at concurrency 1: p50 0.14 -> 0.08-0.09 ms). GOGC and
// GOMAXPROCS, when set, win. It returns the function that restores both.
func benchRuntime(e *env, concurrency int) (restore func()) {
	var undo []func()
	if e.getenv("GOGC") == "" {
		gcPercent := debug.SetGCPercent(400)
		undo = append(undo, func() { debug.SetGCPercent(gcPercent) })
	}
	if concurrency == 1 && e.getenv("GOMAXPROCS") == "" {
		procs := runtime.GOMAXPROCS(1)
		undo = append(undo, func() { runtime.GOMAXPROCS(procs) })
	}
	return func() {
		for _, f := range undo {
			f()
		}
	}
}

// benchWorker is one caller's state.
type benchWorker struct {
	index int
	rng   *rand.Rand
	// reasons counts the errors by the ledger's reason (STORE_CONFLICT,
	// ...; "other" without one).
	reasons   map[string]int64
	latencies []time.Duration
	ops       int64
	units     int64
	errs      int64
	rejected  int64
}

// newBenchWorker returns caller i, drawing its subjects from stream i of
// cfg.seed.
func newBenchWorker(cfg *benchConfig, i int) *benchWorker {
	return &benchWorker{index: i, rng: rand.New(rand.NewPCG(cfg.seed, uint64(i))), reasons: map[string]int64{}}
}

func (w *benchWorker) subject(cfg *benchConfig) string {
	if cfg.subjects == 1 {
		return "bench-0"
	}
	return fmt.Sprintf("bench-%d", w.rng.IntN(cfg.subjects))
}

// ledgerOp connects to the ledger, publishes the bench policy if asked, and
// returns the operation of cfg.mode.
func ledgerOp(ctx context.Context, cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	addrs := cfg.addrs
	if len(addrs) == 0 {
		addrs = []string{cfg.conn.addr}
	}
	var clients []*client.Client
	for _, addr := range addrs {
		conn := *cfg.conn
		conn.addr = addr
		c, err := conn.sdk(
			client.WithProtocol(cfg.protocol),
			// A benchmark measures single calls: a lost answer is an error, not
			// a retry.
			client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}),
			// Nor does it abandon slow calls: the breaker's detector
			// (no answer for 1 s) cancelled every call in flight when a
			// loaded server was slow to answer, at a cold start over
			// 1M subjects or an epoch rollover, and the failed-fast
			// calls then counted as thousands of errors.
			client.WithBreaker(client.BreakerPolicy{Disabled: true}),
			client.WithMaxIdleConns(max(cfg.concurrency*2, 16)),
		)
		if err != nil {
			return nil, err
		}
		clients = append(clients, c)
	}
	c := clients[0]
	if cfg.setup {
		_, _, err := c.PublishPolicy(ctx, &v1.Policy{
			Subject: "*", Route: cfg.route,
			Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1 << 40, RefillInterval: durationpb.New(time.Second)}},
			HoldTtl:    durationpb.New(time.Hour),
			EpochLength: func() *durationpb.Duration {
				if cfg.epochLength <= 0 {
					return nil
				}
				return durationpb.New(cfg.epochLength)
			}(),
		})
		if err != nil {
			return nil, fmt.Errorf("publish bench policy: %w", err)
		}
	}
	if cfg.prefill {
		if err := prefillSubjects(ctx, cfg, c); err != nil {
			return nil, err
		}
	}
	if len(clients) > 1 {
		return multiOp(cfg, clients)
	}
	return singleOp(cfg, c), nil
}

// multiOp runs the single-client op of each client, a worker always on
// the same one (worker i on client i mod n).
func multiOp(cfg *benchConfig, clients []*client.Client) (func(context.Context, *benchWorker) (int, error), error) {
	ops := make([]func(context.Context, *benchWorker) (int, error), len(clients))
	for i, c := range clients {
		ops[i] = singleOp(cfg, c)
	}
	return func(ctx context.Context, w *benchWorker) (int, error) {
		return ops[w.index%len(ops)](ctx, w)
	}, nil
}

// prefillBatch is how many subjects one prefill ReserveBatch covers: each
// creates an account, so a batch costs more than a batch of reserves on
// existing accounts, and must stay well within --timeout.
const prefillBatch = 250

// prefillAttempts is how often a prefill batch is sent when its answer
// is lost (a loaded server timing out): its fixed ids make a resend replay
// what landed.
const prefillAttempts = 5

// prefillSubjects reserves once for every subject from cfg.prefillFrom on,
// in batches of prefillBatch, one at a time, so every subject has its
// account before the measured run. One at a time is faster: concurrent
// batches that each create 250 accounts merge into commits of up to the
// server's --max-batch new accounts, which on a loaded machine outlasted
// the 10 s batch timeout at 800,000 accounts and more (8 at a time: about
// 100 accounts/s with timeouts; one at a time: 152,000 in under a minute).
func prefillSubjects(ctx context.Context, cfg *benchConfig, c *client.Client) error {
	started := time.Now()
	for from := cfg.prefillFrom; from < cfg.subjects && ctx.Err() == nil; from += prefillBatch {
		reqs := make([]client.ReserveRequest, 0, prefillBatch)
		for i := from; i < min(from+prefillBatch, cfg.subjects); i++ {
			reqs = append(reqs, client.ReserveRequest{
				ReservationID: fmt.Sprintf("prefill-%s-%d", cfg.route, i),
				Subject:       fmt.Sprintf("bench-%d", i), Route: cfg.route, Units: client.Units{"tokens": 1}})
		}
		var err error
		for attempt := 1; attempt <= prefillAttempts && ctx.Err() == nil; attempt++ {
			var outcomes []client.ReserveOutcome
			outcomes, err = c.ReserveBatch(ctx, reqs)
			if err == nil {
				for _, o := range outcomes {
					if o.Err != nil {
						err = o.Err
						break
					}
				}
				break // a rejection is an answer: sending again would not change it
			}
			fmt.Fprintf(cfg.stderr, "prefill: subjects %d-%d, attempt %d: %v\n", from, from+len(reqs)-1, attempt, err)
		}
		if err != nil {
			return fmt.Errorf("prefill %d subjects (resume with --prefill-from %d): %w", cfg.subjects, from, err)
		}
	}
	if ctx.Err() == nil {
		fmt.Fprintf(cfg.stderr, "prefilled %d subjects in %s\n", cfg.subjects-cfg.prefillFrom, time.Since(started).Round(time.Millisecond))
	}
	return ctx.Err()
}

// singleOp returns the operation of cfg.mode on client c.
func singleOp(cfg *benchConfig, c *client.Client) func(context.Context, *benchWorker) (int, error) {
	units := client.Units{"tokens": cfg.units}
	switch cfg.mode {
	case "reserve":
		return func(ctx context.Context, w *benchWorker) (int, error) {
			if _, err := c.Reserve(ctx, client.ReserveRequest{Subject: w.subject(cfg), Route: cfg.route, Units: units}); err != nil {
				return 0, err
			}
			return 1, nil
		}
	case "lifecycle":
		return func(ctx context.Context, w *benchWorker) (int, error) {
			rr, err := c.Reserve(ctx, client.ReserveRequest{Subject: w.subject(cfg), Route: cfg.route, Units: units})
			if err != nil {
				return 0, err
			}
			op := client.NewOperationID()
			if _, err := c.Start(ctx, rr.ReservationID, op); err != nil {
				return 0, err
			}
			if _, err = c.Settle(ctx, rr.ReservationID, op, client.Units{"tokens": cfg.units}); err != nil {
				return 0, err
			}
			return 1, nil
		}
	default: // batch
		return func(ctx context.Context, w *benchWorker) (int, error) {
			reqs := make([]client.ReserveRequest, cfg.batchSize)
			for i := range reqs {
				reqs[i] = client.ReserveRequest{Subject: w.subject(cfg), Route: cfg.route, Units: units}
			}
			outcomes, err := c.ReserveBatch(ctx, reqs)
			if err != nil {
				return 0, err
			}
			ok := 0
			var itemErr error
			for _, o := range outcomes {
				if o.Err == nil {
					ok++
				} else if itemErr == nil {
					itemErr = o.Err
				}
			}
			return ok, itemErr
		}
	}
}

// echoBody is about the size of a reserve request in JSON.
type echoBody struct {
	ReservationID string           `json:"reservationId"`
	RequestDigest string           `json:"requestDigest"`
	Subject       string           `json:"subject"`
	Route         string           `json:"route"`
	Units         map[string]int64 `json:"units"`
}

// baselineClient is an http.Client tuned like the SDK's (keep-alive pool
// of the same size), for the baselines that are not capledger.
func baselineClient(cfg *benchConfig) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy: nil, MaxIdleConns: max(cfg.concurrency*2, 16), MaxIdleConnsPerHost: max(cfg.concurrency*2, 16),
		IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}}
}

// postJSON posts body as JSON to url and decodes a 200 answer into out.
func postJSON(ctx context.Context, hc *http.Client, url string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("POST %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func baselineURL(addr, path string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/") + path
}

// echoOp posts JSON to the echo server and reads the echo back.
func echoOp(cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	url := baselineURL(cfg.conn.addr, "/echo")
	hc := baselineClient(cfg)
	return func(ctx context.Context, w *benchWorker) (int, error) {
		body, _ := json.Marshal(echoBody{
			ReservationID: client.NewReservationID(), RequestDigest: "sha256:71a0000000000000000000000000000000000000000000000000000000000000",
			Subject: w.subject(cfg), Route: cfg.route, Units: map[string]int64{"tokens": cfg.units},
		})
		var back echoBody
		if err := postJSON(ctx, hc, url, body, &back); err != nil {
			return 0, err
		}
		if back.ReservationID == "" {
			return 0, errors.New("echo: empty answer")
		}
		return 1, nil
	}, nil
}

// gubernatorRequest and gubernatorResponse are the JSON of gubernator's
// V1/GetRateLimits through its HTTP gateway (int64 fields as strings, as
// protobuf's JSON mapping writes them).
type gubernatorRequest struct {
	Requests []gubernatorRateLimit `json:"requests"`
}

type gubernatorRateLimit struct {
	Name      string `json:"name"`
	UniqueKey string `json:"unique_key"`
	Hits      int64  `json:"hits,string"`
	Limit     int64  `json:"limit,string"`
	Duration  int64  `json:"duration,string"` // milliseconds
}

type gubernatorResponse struct {
	Responses []struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	} `json:"responses"`
}

// gubernatorOp asks a gubernator for --units hits of a limit no run
// exhausts, on the subject's key, so every call is admitted as a reserve
// of the bench policy is.
func gubernatorOp(cfg *benchConfig) (func(context.Context, *benchWorker) (int, error), error) {
	url := baselineURL(cfg.conn.addr, "/v1/GetRateLimits")
	hc := baselineClient(cfg)
	return func(ctx context.Context, w *benchWorker) (int, error) {
		body, _ := json.Marshal(gubernatorRequest{Requests: []gubernatorRateLimit{{
			Name: cfg.route, UniqueKey: w.subject(cfg), Hits: cfg.units, Limit: 1 << 50, Duration: time.Hour.Milliseconds(),
		}}})
		var back gubernatorResponse
		if err := postJSON(ctx, hc, url, body, &back); err != nil {
			return 0, err
		}
		if len(back.Responses) != 1 || back.Responses[0].Error != "" || back.Responses[0].Status != "UNDER_LIMIT" {
			return 0, fmt.Errorf("gubernator: unexpected answer %+v", back.Responses)
		}
		return 1, nil
	}, nil
}

// serveEcho is the baseline server: decode the JSON body, encode it back.
func serveEcho(ctx context.Context, e *env, addr string) error {
	addr = strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	return serveEchoOn(ctx, e, ln)
}

func serveEchoOn(ctx context.Context, e *env, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		var b echoBody
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(&b)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(slog.NewTextHandler(e.stderr, nil), slog.LevelWarn)}
	fmt.Fprintf(e.stderr, "echo server listening on %s\n", ln.Addr())
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type benchResult struct {
	reasons map[string]int64
	elapsed time.Duration
	// cpu is the CPU time (user and system) bench itself used while it
	// measured: on a machine where client and server share the cores,
	// the client's cost per call bounds the server's share.
	cpu       time.Duration
	ops       int64
	units     int64
	errs      int64
	rejected  int64
	latencies []time.Duration
	firstErr  error
}

// drive runs op from cfg.concurrency goroutines: warmup first (not
// recorded), then the measured duration, which goes on past
// cfg.duration until a call begun in it has finished (succeeded, been
// rejected or failed): on a loaded machine the first calls, which also
// open the connections, can take longer than a short --duration, and a
// window in which nothing finished measured nothing. A call that never
// finishes is ended by the client's timeout.
func drive(ctx context.Context, e *env, cfg *benchConfig, op func(context.Context, *benchWorker) (int, error)) *benchResult {
	var measuring atomic.Bool
	var finished atomic.Int64 // calls finished while measuring
	var stop atomic.Bool
	var done atomic.Int64
	var firstErr atomic.Pointer[error]
	workers := make([]*benchWorker, cfg.concurrency)
	var wg sync.WaitGroup
	// With --rate, call k (counted over all callers) is due at
	// paceStart + k/rate; a caller that finds its call overdue starts it
	// at once, so a server slower than the rate sees every caller busy,
	// as a closed loop would.
	var slots atomic.Int64
	paceStart := time.Now()
	for i := range workers {
		w := newBenchWorker(cfg, i)
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				if cfg.rate > 0 {
					due := paceStart.Add(time.Duration(float64(slots.Add(1)-1) / cfg.rate * float64(time.Second)))
					if wait := time.Until(due); wait > 0 {
						select {
						case <-time.After(wait):
						case <-ctx.Done():
							return
						}
					}
				}
				t0 := time.Now()
				n, err := op(ctx, w)
				lat := time.Since(t0)
				if !measuring.Load() {
					continue
				}
				finished.Add(1)
				if err != nil {
					var rej *client.RejectedError
					if errors.As(err, &rej) {
						w.rejected++
					} else {
						w.errs++
						w.reasons[errorReason(err)]++
					}
					firstErr.CompareAndSwap(nil, &err)
					if n == 0 {
						continue
					}
				}
				w.ops++
				w.units += int64(n)
				w.latencies = append(w.latencies, lat)
				done.Add(int64(n))
			}
		}()
	}

	var bar *progressbar.ProgressBar
	total := cfg.warmup + cfg.duration
	if cfg.progress {
		bar = progressbar.NewOptions64(total.Milliseconds(),
			progressbar.OptionSetWriter(e.stderr),
			progressbar.OptionSetWidth(30),
			progressbar.OptionSetDescription("warmup"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionSetRenderBlankState(true),
		)
	}
	start := time.Now()
	var measureStart time.Time
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var cpuStart time.Duration
	if cfg.warmup == 0 {
		measuring.Store(true)
		measureStart = start
		cpuStart = processCPU()
	}
	for ctx.Err() == nil {
		<-ticker.C
		elapsed := time.Since(start)
		if !measuring.Load() && elapsed >= cfg.warmup {
			measuring.Store(true)
			measureStart = time.Now()
			cpuStart = processCPU()
		}
		if bar != nil {
			if measuring.Load() {
				rate := float64(done.Load()) / max(time.Since(measureStart).Seconds(), 1e-3)
				bar.Describe(fmt.Sprintf("%s %8.0f/s", cfg.mode, rate))
			}
			bar.Set64(min(elapsed.Milliseconds(), total.Milliseconds()))
		}
		if measuring.Load() && time.Since(measureStart) >= cfg.duration && finished.Load() > 0 {
			break
		}
	}
	measuring.Store(false)
	elapsed := time.Since(measureStart)
	cpu := processCPU() - cpuStart
	stop.Store(true)
	wg.Wait()
	if bar != nil {
		bar.Finish()
	}
	res := &benchResult{elapsed: elapsed, cpu: cpu, reasons: map[string]int64{}}
	for _, w := range workers {
		for reason, n := range w.reasons {
			res.reasons[reason] += n
		}
		res.ops += w.ops
		res.units += w.units
		res.errs += w.errs
		res.rejected += w.rejected
		res.latencies = append(res.latencies, w.latencies...)
	}
	if p := firstErr.Load(); p != nil {
		res.firstErr = *p
	}
	slices.Sort(res.latencies)
	return res
}

// errorReason returns the ledger's reason for a failed call
// (STORE_CONFLICT, ...), "other" when it names none.
func errorReason(err error) string {
	var le *client.LedgerError
	if errors.As(err, &le) && le.Reason != "" {
		return le.Reason
	}
	if strings.Contains(err.Error(), "STORE_CONFLICT") {
		return "STORE_CONFLICT"
	}
	return "other"
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func printBench(w io.Writer, cfg *benchConfig, r *benchResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	secs := max(r.elapsed.Seconds(), 1e-9)
	fmt.Fprintf(tw, "mode\t%s\n", cfg.mode)
	switch cfg.mode {
	case "echo", "redis", "redis-batch":
	default:
		if cfg.grpcGo || cfg.mode == "envoy" {
			// --mode envoy always calls with go-control-plane's grpc-go client.
			fmt.Fprintf(tw, "protocol\tgrpc-go\n")
		} else {
			fmt.Fprintf(tw, "protocol\t%s\n", cfg.protocol)
		}
	}
	fmt.Fprintf(tw, "concurrency\t%d\n", cfg.concurrency)
	fmt.Fprintf(tw, "subjects\t%d\n", cfg.subjects)
	fmt.Fprintf(tw, "seed\t%d\n", cfg.seed)
	if cfg.mode == "batch" || cfg.mode == "redis-batch" {
		fmt.Fprintf(tw, "batch size\t%d\n", cfg.batchSize)
	}
	fmt.Fprintf(tw, "duration\t%s\n", r.elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "ops\t%d\n", r.ops)
	fmt.Fprintf(tw, "ops/s\t%.0f\n", float64(r.ops)/secs)
	switch cfg.mode {
	case "batch", "redis-batch":
		fmt.Fprintf(tw, "reservations/s\t%.0f\n", float64(r.units)/secs)
	case "lifecycle":
		fmt.Fprintf(tw, "calls/s\t%.0f\n", 3*float64(r.ops)/secs)
	}
	fmt.Fprintf(tw, "p50\t%s\n", fmtLatency(percentile(r.latencies, 0.50)))
	fmt.Fprintf(tw, "p99\t%s\n", fmtLatency(percentile(r.latencies, 0.99)))
	fmt.Fprintf(tw, "p999\t%s\n", fmtLatency(percentile(r.latencies, 0.999)))
	if len(r.latencies) > 0 {
		fmt.Fprintf(tw, "max\t%s\n", fmtLatency(r.latencies[len(r.latencies)-1]))
	}
	if r.ops > 0 && r.cpu > 0 {
		fmt.Fprintf(tw, "client cpu/op\t%.1f µs\n", float64(r.cpu.Microseconds())/float64(r.ops))
	}
	fmt.Fprintf(tw, "rejected\t%d\n", r.rejected)
	fmt.Fprintf(tw, "errors\t%d\n", r.errs)
	for _, reason := range slices.Sorted(maps.Keys(r.reasons)) {
		fmt.Fprintf(tw, "errors %s\t%d\n", reason, r.reasons[reason])
	}
	if r.firstErr != nil {
		fmt.Fprintf(tw, "first error\t%v\n", r.firstErr)
	}
	tw.Flush()
}

func fmtLatency(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}
