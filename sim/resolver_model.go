package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// The resolver model: a self-contained run of the engine's USAGE_UNKNOWN
// resolver (engine.Resolver, the code serve runs) at simulated time, over
// the in-memory store, against a simulated operation-status endpoint whose
// executors may come back late or never, and whose answers may fail, time
// out, arrive late, or lie ("never started" without authentication,
// which a real source refuses). It does not touch the world of run.go:
// RunResolverModel is called on its own (TestResolverModel), and a world
// that wants the resolver instead of executors that always come back can
// build the same engine.NewResolver over its ledger node's store with
// modelSource as the endpoint.

// ResolverModelConfig describes one resolver-model run. Zero values pick
// the defaults noted.
type ResolverModelConfig struct {
	Seed uint64
	// Operations become USAGE_UNKNOWN, marked uniformly over MarkWindow
	// (defaults 400 and 10 minutes).
	Operations int
	MarkWindow time.Duration
	// NeverReturn is the share of operations whose executor never comes
	// back (default 0.02); the others' executors are down from the
	// marking for a time drawn from [DownMin, DownMax] (defaults 5 s and
	// 3 minutes).
	NeverReturn      float64
	DownMin, DownMax time.Duration
	// NeverStarted is the share of operations whose work was never
	// called (default 0.1); the rest used 1 to 500 tokens.
	NeverStarted float64
	// Per question of a returned executor: FailRate answers 5xx,
	// TimeoutRate times out, LieRate answers an unauthenticated "never
	// started", LateRate answers "running" although the work has ended
	// (the result not yet recorded) (defaults 0.1, 0.05, 0.05, 0.1).
	FailRate, TimeoutRate, LieRate, LateRate float64
	// Horizon is how long the model runs after the first marking
	// (default 30 minutes); the resolver scans every Resolver.Interval.
	Horizon  time.Duration
	Resolver engine.ResolverOptions
}

// ResolverModelReport is what a run found.
type ResolverModelReport struct {
	Unknown, Resolved, Unresolved int
	// NeverReturned counts operations whose executor never came back:
	// they must be exactly the unresolved ones.
	NeverReturned int
	// LiesRefused counts unauthenticated never-started answers refused.
	LiesRefused int
	// Ages of the resolved ones, marking to settle.
	P50, P99, Max time.Duration
	// Problems lists what the run's checks found (none for a sound
	// resolver): a settle other than the truth, an unresolved operation
	// whose executor came back, capacity released for unresolved work,
	// audit discrepancies.
	Problems []string
}

func (c *ResolverModelConfig) defaults() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if c.Operations == 0 {
		c.Operations = 400
	}
	defDur(&c.MarkWindow, 10*time.Minute)
	def(&c.NeverReturn, 0.02)
	defDur(&c.DownMin, 5*time.Second)
	defDur(&c.DownMax, 3*time.Minute)
	def(&c.NeverStarted, 0.1)
	def(&c.FailRate, 0.1)
	def(&c.TimeoutRate, 0.05)
	def(&c.LieRate, 0.05)
	def(&c.LateRate, 0.1)
	defDur(&c.Horizon, 30*time.Minute)
	defDur(&c.Resolver.Interval, time.Second)
}

// modelOp is the truth about one operation.
type modelOp struct {
	id, op     string
	markAt     int64 // simulated nanoseconds
	upAt       int64 // executor back; -1 never
	neverStart bool
	tokens     int64
}

// modelSource is the simulated endpoint. Its answer to the n-th question
// about an operation depends only on the seed, the operation and n, so a
// run replays from its seed whatever order the resolver asks in.
type modelSource struct {
	cfg   *ResolverModelConfig
	now   *int64
	ops   map[string]*modelOp
	mu    sync.Mutex
	asked map[string]int
	lies  int
}

var (
	errModelDown    = errors.New("connection refused (executor down)")
	errModel5xx     = errors.New("HTTP 503")
	errModelTimeout = context.DeadlineExceeded
	errModelLie     = fmt.Errorf("never_started answer is not signed with the route's secret: %w", engine.ErrUnusableStatusAnswer)
)

func (s *modelSource) OperationStatus(ctx context.Context, r *ledger.Reservation) (engine.OperationStatus, error) {
	op := s.ops[r.ID]
	s.mu.Lock()
	s.asked[r.ID]++
	n := s.asked[r.ID]
	s.mu.Unlock()
	if op == nil {
		return engine.OperationStatus{}, engine.ErrNoStatusEndpoint
	}
	if op.upAt < 0 || *s.now < op.upAt {
		return engine.OperationStatus{}, errModelDown
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", r.ID, n)
	rng := rand.New(rand.NewPCG(s.cfg.Seed, h.Sum64()))
	x := rng.Float64()
	switch c := s.cfg; {
	case x < c.FailRate:
		return engine.OperationStatus{}, errModel5xx
	case x < c.FailRate+c.TimeoutRate:
		return engine.OperationStatus{}, errModelTimeout
	case x < c.FailRate+c.TimeoutRate+c.LieRate:
		// What the HTTP source does with an unsigned never-started
		// answer: refuses it (opstatus.ErrUnsigned).
		s.mu.Lock()
		s.lies++
		s.mu.Unlock()
		return engine.OperationStatus{}, errModelLie
	case x < c.FailRate+c.TimeoutRate+c.LieRate+c.LateRate:
		return engine.OperationStatus{State: engine.OperationRunning}, nil
	}
	if op.neverStart {
		return engine.OperationStatus{State: engine.OperationNeverStarted}, nil
	}
	return engine.OperationStatus{State: engine.OperationFinished, Units: map[string]ledger.Units{"tokens": op.tokens}}, nil
}

// RunResolverModel runs the model and checks it. The error is for a run
// that could not be set up or whose store failed, not for what the checks
// find (Problems).
func RunResolverModel(cfg ResolverModelConfig) (ResolverModelReport, error) {
	cfg.defaults()
	ctx := context.Background()
	st := memstore.New()
	core := engine.NewCore(st)
	var now int64
	at := func() time.Time { return epoch0.Add(time.Duration(now)) }
	commit := func(ctx context.Context, cmds []ledger.Command) ([]ledger.Result, error) {
		return core.Commit(ctx, cmds, at())
	}
	do := func(cmd ledger.Command) error {
		res, err := commit(ctx, []ledger.Command{cmd})
		if err != nil {
			return err
		}
		return res[0].Err
	}
	policy := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "jobs.run", Region: ledger.DefaultRegion},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 40}},
	}.WithDefaults()
	if err := do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}); err != nil {
		return ResolverModelReport{}, fmt.Errorf("publish: %w", err)
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	ops := map[string]*modelOp{}
	order := make([]*modelOp, cfg.Operations)
	report := ResolverModelReport{Unknown: cfg.Operations}
	for i := range order {
		op := &modelOp{id: fmt.Sprintf("rsv-%05d", i), op: fmt.Sprintf("op-%05d", i),
			markAt: rng.Int64N(int64(cfg.MarkWindow)), tokens: 1 + rng.Int64N(500)}
		op.neverStart = rng.Float64() < cfg.NeverStarted
		if rng.Float64() < cfg.NeverReturn {
			op.upAt = -1
			report.NeverReturned++
		} else {
			op.upAt = op.markAt + int64(cfg.DownMin) + rng.Int64N(int64(cfg.DownMax-cfg.DownMin)+1)
		}
		ops[op.id], order[i] = op, op
	}
	slices.SortFunc(order, func(a, b *modelOp) int { return int(a.markAt - b.markAt) })

	src := &modelSource{cfg: &cfg, now: &now, ops: ops, asked: map[string]int{}}
	ropts := cfg.Resolver
	ropts.Source = src
	if ropts.Seed == 0 {
		ropts.Seed = cfg.Seed
	}
	resolver := engine.NewResolver(st, ropts, at, commit, slog.New(slog.NewTextHandler(io.Discard, nil)))

	next := 0
	step := int64(cfg.Resolver.Interval)
	for now = 0; now <= int64(cfg.Horizon); now += step {
		for ; next < len(order) && order[next].markAt <= now; next++ {
			op := order[next]
			for _, cmd := range []ledger.Command{
				{Kind: ledger.KindReserve, ReservationID: op.id, RequestDigest: "sha256:" + op.id, Subject: "tenant-1", Route: "jobs.run",
					Region: ledger.DefaultRegion, Units: ledger.Amounts{500}},
				{Kind: ledger.KindStart, ReservationID: op.id, OperationID: op.op},
				{Kind: ledger.KindMarkUsageUnknown, ReservationID: op.id},
			} {
				if err := do(cmd); err != nil {
					return report, fmt.Errorf("%s %s: %w", cmd.Kind, op.id, err)
				}
			}
		}
		resolver.Run(ctx)
	}

	var ages []time.Duration
	var held int64
	for _, op := range order {
		r, err := st.ReservationGet(ctx, op.id)
		if err != nil {
			return report, err
		}
		switch r.State {
		case ledger.StateSettled, ledger.StateSettledWithDebt:
			report.Resolved++
			ages = append(ages, r.FinishedAt.Sub(r.UnknownAt))
			want := op.tokens
			if op.neverStart {
				want = 0
			}
			if r.Actual[0] != want {
				report.Problems = append(report.Problems, fmt.Sprintf("%s settled with %d tokens, its operation used %d", op.id, r.Actual[0], want))
			}
		case ledger.StateUsageUnknown:
			report.Unresolved++
			held += r.Reserved[0]
			if op.upAt >= 0 {
				report.Problems = append(report.Problems, fmt.Sprintf("%s unresolved after %v although its executor came back at %v",
					op.id, cfg.Horizon, time.Duration(op.upAt)))
			}
		default:
			report.Problems = append(report.Problems, fmt.Sprintf("%s ended %s", op.id, r.State))
		}
	}
	if report.Unresolved != report.NeverReturned {
		report.Problems = append(report.Problems, fmt.Sprintf("%d unresolved, %d executors never returned", report.Unresolved, report.NeverReturned))
	}
	accounts, err := st.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		return report, err
	}
	var reserved int64
	for i := range accounts {
		reserved += accounts[i].Balances[0].Reserved
	}
	if reserved != held {
		report.Problems = append(report.Problems, fmt.Sprintf("accounts hold %d tokens, the unresolved reservations %d: UNKNOWN treated as unconsumed", reserved, held))
	}
	snapshot, err := st.Snapshot(ctx)
	if err != nil {
		return report, err
	}
	for _, d := range ledger.Audit(snapshot) {
		report.Problems = append(report.Problems, "audit: "+d.String())
	}
	report.LiesRefused = src.lies
	slices.Sort(ages)
	if n := len(ages); n > 0 {
		report.P50, report.P99, report.Max = ages[n/2], ages[min(n-1, n*99/100)], ages[n-1]
	}
	return report, nil
}
