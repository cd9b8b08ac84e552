package server

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The ConsoleService (console.proto): the cross-tenant reads the operator
// console needs beside the LedgerService and ShardService. Every number it
// answers comes from the same place the other methods take theirs from (the
// engine's reads, the Prometheus metrics), and every account passes the
// token's scope (InScope) before it is counted or shown.

// Default and largest limit of ListAccountStandings.
const (
	defaultStandings = 20
	maxStandings     = 1000
)

// consoleService implements capledgerv1connect.ConsoleServiceHandler.
type consoleService struct {
	s *Server
}

var _ capledgerv1connect.ConsoleServiceHandler = consoleService{}

func registerConsoleService(mux *http.ServeMux, s *Server, options []connect.HandlerOption) {
	path, handler := capledgerv1connect.NewConsoleServiceHandler(consoleService{s: s}, options...)
	mountProcedures(mux, path, handler, v1.File_capledger_v1_console_proto.Services().ByName("ConsoleService"))
}

// decisionKey labels one counter of consoleCounters.decisions.
type decisionKey struct {
	generation uint64
	outcome    string
}

// consoleCounters are what GetOverview reports beyond the Prometheus
// metrics: reserve decisions by deciding generation (a label the metrics do
// not carry, since generations are unbounded) and the last audit answered.
// Like the shadow comparisons (shadowCounts), the decisions are kept for
// the generations recent reports true for, each policy key's active one and
// two newest: an older generation's are forgotten when a generation not
// counted before decides and when GetOverview reads them, so they grow with
// the policy keys, not with every generation published since the start.
type consoleCounters struct {
	decisions sync.Map // decisionKey -> *atomic.Int64
	// recent is policyCache.recent; nil keeps every generation.
	recent func(generation uint64) bool
	// forgetting serializes adding a generation's first counter with
	// forgetting old ones, so a counter just added is never dropped on a
	// verdict read before its generation was published.
	forgetting sync.Mutex

	// store, when set, keeps the audit status for every replica and
	// across restarts (the fields below are then only a fallback).
	store store.ConsoleStore

	mu             sync.Mutex
	lastAudit      time.Time
	lastFound      int
	lastCleanAudit time.Time
}

func (c *consoleCounters) decision(generation uint64, outcome string) {
	key := decisionKey{generation, outcome}
	v, ok := c.decisions.Load(key)
	if !ok {
		c.forgetting.Lock()
		if c.recent != nil && !c.recent(generation) {
			// Two newer generations of its key were published and it
			// no longer decides: a late decision (a reserve decided just
			// before a publication) is not counted.
			c.forgetting.Unlock()
			return
		}
		v, _ = c.decisions.LoadOrStore(key, new(atomic.Int64))
		c.forgetOld()
		c.forgetting.Unlock()
	}
	v.(*atomic.Int64).Add(1)
}

// forgetOld drops the counters of the generations recent no longer
// reports; forgetting is held.
func (c *consoleCounters) forgetOld() {
	if c.recent == nil {
		return
	}
	verdict := map[uint64]bool{}
	c.decisions.Range(func(k, _ any) bool {
		generation := k.(decisionKey).generation
		keep, seen := verdict[generation]
		if !seen {
			keep = c.recent(generation)
			verdict[generation] = keep
		}
		if !keep {
			c.decisions.Delete(k)
		}
		return true
	})
}

// auditRecordTimeout bounds the store write of an audit's record.
const auditRecordTimeout = 5 * time.Second

// audited records an audit that found found, in memory and, with a store,
// in the store (store.AuditRecord: who ran it, the mode, the count per
// check). A failed store write is logged; the audit's answer stands.
func (c *consoleCounters) audited(ctx context.Context, log *slog.Logger, at time.Time, found []ledger.Discrepancy, mode string) {
	c.mu.Lock()
	c.lastAudit, c.lastFound = at, len(found)
	if len(found) == 0 {
		c.lastCleanAudit = at
	}
	c.mu.Unlock()
	if c.store == nil {
		return
	}
	rec := &store.AuditRecord{At: at, By: tokenName(ctx), Mode: mode, Discrepancies: int64(len(found)), Checks: map[string]int64{}}
	for _, d := range found {
		rec.Checks[d.Check]++
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), auditRecordTimeout)
	defer cancel()
	if err := c.store.AuditRecordPut(wctx, rec); err != nil {
		log.Warn("console: cannot record the audit", "err", err)
	}
}

// auditStatus returns the audit status GetOverview shows: from the store
// when there is one, else this replica's memory; nil when no audit is
// known.
func (c *consoleCounters) auditStatus(ctx context.Context) (*v1.AuditStatus, error) {
	if c.store == nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.lastAudit.IsZero() {
			return nil, nil
		}
		return &v1.AuditStatus{
			LastAuditAt: timestamp(c.lastAudit), LastDiscrepancies: int64(c.lastFound),
			LastCleanAuditAt: timestamp(c.lastCleanAudit),
		}, nil
	}
	last, clean, err := c.store.AuditRecordsGet(ctx)
	if err != nil || last == nil {
		return nil, err
	}
	st := &v1.AuditStatus{
		LastAuditAt: timestamp(last.At), LastDiscrepancies: last.Discrepancies, LastBy: last.By, LastMode: last.Mode,
		Persisted: true,
	}
	for _, check := range slices.Sorted(maps.Keys(last.Checks)) {
		st.LastChecks = append(st.LastChecks, &v1.AuditCheckCount{Check: check, Count: last.Checks[check]})
	}
	if clean != nil {
		st.LastCleanAuditAt, st.LastCleanBy, st.LastCleanMode = timestamp(clean.At), clean.By, clean.Mode
	}
	return st, nil
}

// observe is an interceptor that counts the answers of Reserve and
// ReserveBatch for GetOverview (count), after the handler answered. It
// decides nothing and changes no answer.
func (c *consoleCounters) observe() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			var msg any
			if err == nil {
				msg = resp.Any()
			}
			c.count(req.Spec().Procedure, msg, err)
			return resp, err
		}
	})
}

// count counts one answer of procedure (its message, or its error) for
// GetOverview: Reserve and ReserveBatch decisions (audits are counted by
// auditResponse, which the unary and the streamed audit share). The
// connect interceptor and the grpc-go path (grpcUnary) both call it.
func (c *consoleCounters) count(procedure string, msg any, err error) {
	if err != nil {
		// A capacity rejection of a single Reserve is a decision; any
		// other failure decided nothing.
		if procedure == capledgerv1connect.LedgerServiceReserveProcedure {
			if gen, ok := rejectedGeneration(err); ok {
				c.decision(gen, "rejected")
			}
		}
		return
	}
	switch procedure {
	case capledgerv1connect.LedgerServiceReserveProcedure:
		if r, ok := msg.(*v1.ReserveResponse); ok {
			c.reserved(r)
		}
	case capledgerv1connect.LedgerServiceReserveBatchProcedure:
		if r, ok := msg.(*v1.ReserveBatchResponse); ok {
			for _, o := range r.GetOutcomes() {
				if ok := o.GetOk(); ok != nil {
					c.reserved(ok)
				} else if rej := o.GetError().GetRejection(); rej != nil {
					c.decision(rej.GetPolicyGeneration(), "rejected")
				}
			}
		}
	}
}

func (c *consoleCounters) reserved(r *v1.ReserveResponse) {
	switch {
	case r.GetShadowRejected():
		c.decision(r.GetPolicyGeneration(), "shadow_rejected")
	case r.GetReplayed():
		c.decision(r.GetPolicyGeneration(), "replayed")
	default:
		c.decision(r.GetPolicyGeneration(), "admitted")
	}
}

// rejectedGeneration returns the deciding generation of a capacity
// rejection (its RejectionDetail); ok is false for any other error.
func rejectedGeneration(err error) (uint64, bool) {
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted {
		return 0, false
	}
	for _, d := range cerr.Details() {
		if msg, err := d.Value(); err == nil {
			if rej, ok := msg.(*v1.RejectionDetail); ok {
				return rej.GetPolicyGeneration(), true
			}
		}
	}
	return 0, false
}

// GetOverview implements ConsoleService.GetOverview.
func (c consoleService) GetOverview(ctx context.Context, _ *connect.Request[v1.GetOverviewRequest]) (*connect.Response[v1.GetOverviewResponse], error) {
	s := c.s
	resp := &v1.GetOverviewResponse{ServerTime: timestamp(s.clock()), WorkerLeader: s.workerLeader()}
	if _, err := s.readiness(ctx); err != nil {
		resp.ReadyError = err.Error()
	} else {
		resp.Ready = true
	}
	if scoped(ctx) {
		// Every figure below counts all tenants' traffic.
		resp.Scoped = true
		return connect.NewResponse(resp), nil
	}
	for _, m := range collect(s.metrics.commands) {
		resp.Commands = append(resp.Commands, &v1.CommandCount{
			Kind: label(m, "kind"), Outcome: label(m, "outcome"), Count: int64(m.GetCounter().GetValue()),
		})
	}
	sort.Slice(resp.Commands, func(i, j int) bool {
		a, b := resp.Commands[i], resp.Commands[j]
		return a.Kind < b.Kind || (a.Kind == b.Kind && a.Outcome < b.Outcome)
	})
	for _, m := range collect(s.metrics.rejections) {
		resp.Rejections = append(resp.Rejections, &v1.RejectionCount{
			Dimension: label(m, "dimension"), Reason: label(m, "reason"), Rollout: label(m, "rollout"),
			Count: int64(m.GetCounter().GetValue()),
		})
	}
	sort.Slice(resp.Rejections, func(i, j int) bool {
		a, b := resp.Rejections[i], resp.Rejections[j]
		return a.Dimension+"\x00"+a.Reason+"\x00"+a.Rollout < b.Dimension+"\x00"+b.Reason+"\x00"+b.Rollout
	})
	s.console.forgetting.Lock()
	s.console.forgetOld()
	s.console.forgetting.Unlock()
	s.console.decisions.Range(func(k, v any) bool {
		key := k.(decisionKey)
		resp.Decisions = append(resp.Decisions, &v1.DecisionCount{
			PolicyGeneration: key.generation, Outcome: key.outcome, Count: v.(*atomic.Int64).Load(),
		})
		return true
	})
	sort.Slice(resp.Decisions, func(i, j int) bool {
		a, b := resp.Decisions[i], resp.Decisions[j]
		return a.PolicyGeneration < b.PolicyGeneration || (a.PolicyGeneration == b.PolicyGeneration && a.Outcome < b.Outcome)
	})
	if ms := collect(s.metrics.commitTime); len(ms) == 1 {
		h := ms[0].GetHistogram()
		resp.Commit = &v1.CommitLatency{
			Batches: int64(h.GetSampleCount()), SumSeconds: h.GetSampleSum(),
			P50Seconds: bucketQuantile(h, 0.5), P99Seconds: bucketQuantile(h, 0.99),
		}
	}
	backlog, err := s.ledger.UnknownBacklog(ctx)
	if err != nil {
		return nil, readError("usage unknown backlog", ReasonStoreUnavailable, err)
	}
	resp.UsageUnknownBacklog, resp.OldestUsageUnknownAt = backlog.Count, timestamp(backlog.OldestMarkedAt)
	if resp.Audit, err = s.console.auditStatus(ctx); err != nil {
		return nil, readError("audit status", ReasonStoreUnavailable, err)
	}
	return connect.NewResponse(resp), nil
}

// collect reads the current values of one collector of the server's
// metrics (a vector: one per label set).
func collect(c prometheus.Collector) []*dto.Metric {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var out []*dto.Metric
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) == nil {
			out = append(out, &pb)
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// bucketQuantile returns the upper bound of the bucket holding the q-th
// quantile of h (the largest finite bound when it lies in +Inf), 0 for an
// empty histogram.
func bucketQuantile(h *dto.Histogram, q float64) float64 {
	total := h.GetSampleCount()
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.999999)
	var last float64
	for _, b := range h.GetBucket() {
		last = b.GetUpperBound()
		if b.GetCumulativeCount() >= rank {
			return last
		}
	}
	return last
}

// ListAccountStandings implements ConsoleService.ListAccountStandings.
func (c consoleService) ListAccountStandings(ctx context.Context, req *connect.Request[v1.ListAccountStandingsRequest]) (*connect.Response[v1.ListAccountStandingsResponse], error) {
	s, m := c.s, req.Msg
	limit := int(m.GetLimit())
	switch {
	case limit < 0 || limit > maxStandings:
		return nil, invalidField(ReasonInvalidCommand, "limit", "%d: want 1 to %d (0 for %d)", limit, maxStandings, defaultStandings)
	case limit == 0:
		limit = defaultStandings
	}
	// Uncapped (storecap.go): the shared ranking bounds its scan by the
	// store's answers to each page; every other read here is capped.
	capped, cancel := s.capStore(ctx, "")
	defer cancel()
	key := standingsKey(m)
	if !m.GetInDebt() && key == (ledger.PolicyKey{}) {
		q := standingsQuestion{scope: scopeKey(ctx), subject: m.GetSubject(), subjectContains: m.GetSubjectContains(),
			route: m.GetRoute(), region: m.GetRegion(), generation: m.GetPolicyGeneration(), limit: limit}
		ranking, err := s.standings.answer(ctx, q, s.sharedNotBefore(), func(ctx context.Context, r *standingsRanking) *connect.Error {
			return c.rankAll(ctx, m, limit, r)
		})
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(c.standingsOf(capped, ranking)), nil
	}
	ctx = capped
	asOf := s.clock()
	// The accounts with the generations deciding for them and their
	// policies (rolled back or not) as read in one snapshot with each
	// account's balances: a standing's active and rolled-back marks are
	// those its balances stood with.
	var (
		accounts []ledger.Account
		with     engine.ShownWith
		err      *connect.Error
	)
	if m.GetInDebt() {
		if accounts, with, err = c.debtors(ctx, limit); err != nil {
			return nil, err
		}
	} else {
		var view store.AccountsView
		if accounts, view, err = c.accounts(ctx, key); err != nil {
			return nil, err
		}
		with = engine.ShownWithView(&view)
	}
	now := s.clock()
	var standings []*v1.AccountStanding
	for i := range accounts {
		a := &accounts[i]
		if !standingMatches(m, a.Key) {
			continue
		}
		p, cerr := s.shownPolicy(ctx, with, a.Key)
		if cerr != nil {
			return nil, cerr
		}
		standings = append(standings, c.standingNow(ctx, a, &p, with.Decides(a.Key), now))
	}
	sort.SliceStable(standings, func(i, j int) bool {
		a, b := standings[i], standings[j]
		if a.Account.Frozen != b.Account.Frozen {
			return a.Account.Frozen
		}
		if a.Active != b.Active {
			return a.Active // rankedStanding.before's order
		}
		return a.UsedFraction > b.UsedFraction
	})
	resp := &v1.ListAccountStandingsResponse{Matched: int64(len(standings)), AsOf: timestamp(asOf)}
	resp.Accounts = standings[:min(limit, len(standings))]
	return connect.NewResponse(resp), nil
}

// standingsKey is the one subject key a ListAccountStandings request
// names whole (subject, route and region), whose accounts alone need be
// read; the zero key (read every account) when it names less.
func standingsKey(m *v1.ListAccountStandingsRequest) ledger.PolicyKey {
	if m.GetSubject() == "" || m.GetRoute() == "" || m.GetRegion() == "" {
		return ledger.PolicyKey{}
	}
	return ledger.PolicyKey{Subject: m.GetSubject(), Route: m.GetRoute(), Region: m.GetRegion()}
}

// accounts returns the accounts of key (every account for the zero key)
// in the caller's scope (as GetAccount shows them, in key order), with
// the view they were shown from (Ledger.AccountsView). The callers filter
// the rows again: a store may return rows of other keys.
func (c consoleService) accounts(ctx context.Context, key ledger.PolicyKey) ([]ledger.Account, store.AccountsView, *connect.Error) {
	all, view, err := c.s.ledger.AccountsView(ctx, key)
	if err != nil {
		return nil, store.AccountsView{}, readError("accounts", ReasonAccountNotFound, err)
	}
	visible := all[:0]
	for i := range all {
		if InScope(ctx, all[i].Key.Subject, all[i].Key.Route) {
			visible = append(visible, all[i])
		}
	}
	return visible, view, nil
}

// debtors returns the first limit accounts owing debt in the caller's
// scope, in key order, as ListDebts's first page of limit shows them: read
// from the store's debtors (AccountsInDebt), not from every account, and
// for a scoped caller from at most the store pages ListDebts reads a call
// (so possibly fewer), with what they were shown beside (engine.ShownWith).
func (c consoleService) debtors(ctx context.Context, limit int) ([]ledger.Account, engine.ShownWith, *connect.Error) {
	accounts, with, _, _, err := c.s.ledger.AccountsInDebt(ctx, store.DebtFilter{Limit: limit}, scopeFilter(ctx))
	if err != nil {
		return nil, engine.ShownWith{}, readError("accounts in debt", ReasonStoreUnavailable, err)
	}
	return accounts, with, nil
}

// standing renders one account with its limits.
func standing(a *ledger.Account, p *ledger.Policy, active bool, now time.Time) *v1.AccountStanding {
	out := &v1.AccountStanding{
		Account: accountProto(a, p), Active: active, RolledBack: p.RolledBack,
		Rollout: rolloutToProto[p.Rollout], PolicyRollout: rolloutToProto[p.Rollout],
	}
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		d, b := &p.Dimensions[i], &a.Balances[i]
		ds := &v1.DimensionStanding{
			Unit: d.Unit, Burst: d.Burst, Available: b.Available, RefillUnits: d.RefillUnits,
			RefillInterval: duration(d.RefillInterval), Debt: b.Debt(),
		}
		ds.UsedFraction = dimensionUsed(d, b)
		if ds.Debt > 0 && d.Refills() {
			// Refill mints RefillUnits per whole interval from the refill
			// cursor on, and minting repays debt before anything else.
			// A repayment further off than ledger.MaxRetryAfter (about
			// 292 years, the longest wait the server computes) has no
			// RepaidAt: intervals × interval would overflow a Duration
			// and wrap into the past.
			intervals := (ds.Debt + d.RefillUnits - 1) / d.RefillUnits
			if intervals <= int64(ledger.MaxRetryAfter/d.RefillInterval) {
				from := now
				if t := a.RefilledTo[i]; t > 0 {
					from = time.Unix(0, t)
				}
				ds.RepaidAt = timestamp(from.Add(time.Duration(intervals) * d.RefillInterval))
			}
		}
		out.Dimensions = append(out.Dimensions, ds)
		out.UsedFraction = max(out.UsedFraction, ds.UsedFraction)
	}
	return out
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
