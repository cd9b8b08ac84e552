package server

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Reasons of the RolloutService.
const (
	ReasonInvalidRollout  = "INVALID_ROLLOUT"
	ReasonRolloutNotFound = "ROLLOUT_NOT_FOUND"
	ReasonRolloutExists   = "ROLLOUT_EXISTS"
	ReasonRouteInRollout  = "ROUTE_IN_ROLLOUT"
	ReasonNothingToUndo   = "NOTHING_TO_UNDO"
	ReasonRolloutEnded    = "ROLLOUT_ENDED"
	ReasonRolloutConflict = "ROLLOUT_CONFLICT"
)

// Drains is what the RolloutService needs of the engine to follow a
// rollback (*engine.Engine implements it).
type Drains interface {
	RunDrains(ctx context.Context) (int, error)
	DrainProgress(ctx context.Context, generations []uint64) ([]engine.GenerationDrain, error)
}

var _ Drains = (*engine.Engine)(nil)

// rolloutRefresh is how old the reserve path's copy of the rollouts may
// get: a step taken on another replica decides this replica's reserves at
// most this much later (the replica that took it applies it at once).
const rolloutRefresh = time.Second

// rolloutView is the reserve path's copy of the rollouts.
type rolloutView struct {
	idx      ledger.Rollouts
	loadedAt time.Time
}

// rolloutCache keeps the rollouts for RolloutModeFor, reloading them from
// the store when its copy is older than rolloutRefresh. The reserve path
// only loads a pointer; one caller at a time reloads, the others go on
// with the copy they have.
type rolloutCache struct {
	store store.Rollouts
	// timeout bounds a reload (the server's store timeout; 0: none).
	timeout time.Duration
	view    atomic.Pointer[rolloutView]
	loading sync.Mutex
	log     interface{ Warn(string, ...any) }
}

// mode returns the mode of a reserve of subject on route whose deciding
// policy has policyMode (ledger.RolloutModeFor over the cached rollouts),
// or the error of a load that failed while the cache had no copy: then
// no mode is known, and the reserve must not be decided by the policy's
// own mode as if no rollout held its route.
func (c *rolloutCache) mode(ctx context.Context, route ledger.RouteKey, subject string, policyMode ledger.RolloutMode) (ledger.RolloutMode, error) {
	idx, err := c.index(ctx)
	if err != nil {
		return policyMode, err
	}
	mode, _ := ledger.RolloutModeFor(idx, route, subject, policyMode)
	return mode, nil
}

// policyModeNow returns the mode the reserves decided by p get now
// (ledger.PolicyModeNow over the cached rollouts), and false when they
// have no one mode or the rollouts could not be read.
func (c *rolloutCache) policyModeNow(ctx context.Context, p *ledger.Policy) (ledger.RolloutMode, bool) {
	idx, err := c.index(ctx)
	if err != nil {
		return p.Rollout, false
	}
	return ledger.PolicyModeNow(idx, p)
}

// index returns the cached rollouts, reloaded when older than
// rolloutRefresh (none without a rollout store). A failed reload keeps
// the copy it had; with no copy (before the first load, or after a change
// on this replica invalidated it) the failure is returned.
func (c *rolloutCache) index(ctx context.Context) (ledger.Rollouts, error) {
	if c == nil || c.store == nil {
		return ledger.Rollouts{}, nil
	}
	v := c.view.Load()
	if v == nil || time.Since(v.loadedAt) > rolloutRefresh {
		fresh, err := c.reload(ctx, v == nil)
		switch {
		case fresh != nil:
			v = fresh
		case v == nil:
			return ledger.Rollouts{}, err
		}
	}
	return v.idx, nil
}

// reload reads the rollouts again (waiting for a reload under way when
// wait, skipping it otherwise) and returns the new view; nil and the
// error if it failed, nil and no error if it was skipped.
//
// The read is shared: callers waiting on it (wait) take its view. So it
// runs on ctx's values without ctx's cancellation, bounded by the store
// timeout instead: a caller that hangs up mid-call (a gateway's timeout,
// a lost answer) neither fails the reload for the others nor logs a
// healthy store as unavailable.
func (c *rolloutCache) reload(ctx context.Context, wait bool) (*rolloutView, error) {
	if wait {
		c.loading.Lock()
	} else if !c.loading.TryLock() {
		return nil, nil
	}
	defer c.loading.Unlock()
	if v := c.view.Load(); v != nil && time.Since(v.loadedAt) <= rolloutRefresh {
		return v, nil
	}
	readCtx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
	if c.timeout > 0 {
		readCtx, cancel = context.WithTimeoutCause(readCtx, c.timeout, storeTimedOut{c.timeout})
	}
	defer cancel()
	started := time.Now()
	list, err := c.store.RolloutList(readCtx)
	if err != nil {
		c.log.Warn("rollouts: reload", "err", err)
		return nil, fmt.Errorf("rollouts: %w", err)
	}
	v := &rolloutView{idx: ledger.NewRollouts(list), loadedAt: started}
	c.view.Store(v)
	return v, nil
}

// invalidate makes the next reserve reload (after a change on this
// replica).
func (c *rolloutCache) invalidate() {
	c.loading.Lock()
	c.view.Store(nil)
	c.loading.Unlock()
}

// Legacy decisions a reserve may carry.
const (
	legacyAllow = "allow"
	legacyDeny  = "deny"
)

type shadowKey struct {
	route      ledger.RouteKey
	generation uint64
	mode       ledger.RolloutMode
}

// shadowCells are the four cells of one comparison: [legacy][capledger],
// 0 allow, 1 deny.
type shadowCells [2][2]atomic.Uint64

// shadowCounts counts the legacy limiter's decisions against capledger's.
// It keeps the comparisons (cells and series) of the generations recent
// reports true for, each policy key's active one and two newest: those of an older
// generation are forgotten when a comparison of a generation not counted
// before arrives, and when the report is read (forgetOld), so they grow
// with the policy keys, not with every generation ever published.
type shadowCounts struct {
	since  time.Time
	recent func(generation uint64) bool
	// mu guards cells, and the series with them: a count and the
	// forgetting of its generation never interleave, so a forgotten
	// series does not come back with a count its cells lost.
	mu     sync.RWMutex
	cells  map[shadowKey]*shadowCells
	metric *prometheus.CounterVec
}

func newShadowCounts(registry *prometheus.Registry, now time.Time, recent func(generation uint64) bool) *shadowCounts {
	c := &shadowCounts{since: now, recent: recent, cells: map[shadowKey]*shadowCells{},
		metric: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "capledger_shadow_decisions_total",
			Help: "Reserves that carried the legacy limiter's decision, by route, region, generation, mode, the legacy decision and capledger's (allow or deny).",
		}, []string{"route", "region", "generation", "mode", "legacy", "capledger"})}
	if err := registry.Register(c.metric); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			c.metric = already.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return c
}

// compare counts one reserve that carried legacy (allow|deny): capledger
// allowed it when it reserved, denied it when it rejected it or would
// have (shadow). Replays, and answers that are not a decision (no policy,
// invalid), count nothing: a retry must not count twice.
func (c *shadowCounts) compare(cmd *ledger.Command, legacy string, res *ledger.Result) {
	if legacy == "" || cmd.Kind != ledger.KindReserve || res.Replayed {
		return
	}
	var ours int
	switch {
	case res.Err == nil:
		ours = 0
	case res.Shadow || res.Rejected():
		ours = 1
	default:
		return
	}
	theirs := 0
	if legacy == legacyDeny {
		theirs = 1
	}
	mode := cmd.Rollout
	if mode == "" {
		mode = ledger.RolloutEnforce
	}
	key := shadowKey{route: ledger.RouteKey{Route: cmd.Route, Region: cmd.Region}, generation: res.Generation, mode: mode}
	c.mu.RLock()
	if cells := c.cells[key]; cells != nil {
		c.count(key, cells, theirs, ours)
		c.mu.RUnlock()
		return
	}
	c.mu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	cells := c.cells[key]
	if cells == nil {
		if !c.recent(key.generation) {
			// Two newer generations of its key were published and it
			// no longer decides: its comparisons are forgotten, a late
			// one (a reserve decided just before a publication) is not
			// counted.
			return
		}
		cells = new(shadowCells)
		c.cells[key] = cells
		c.forgetOld()
	}
	c.count(key, cells, theirs, ours)
}

var shadowDecisionNames = [2]string{legacyAllow, legacyDeny}

// count adds one comparison to cells and key's series; mu is held.
func (c *shadowCounts) count(key shadowKey, cells *shadowCells, theirs, ours int) {
	cells[theirs][ours].Add(1)
	c.metric.WithLabelValues(key.route.Route, key.route.Region, strconv.FormatUint(key.generation, 10), string(key.mode),
		shadowDecisionNames[theirs], shadowDecisionNames[ours]).Inc()
}

// forgetOld drops the cells and series of the generations recent no
// longer reports; mu is held for writing.
func (c *shadowCounts) forgetOld() {
	verdict := map[uint64]bool{}
	for key := range c.cells {
		keep, seen := verdict[key.generation]
		if !seen {
			keep = c.recent(key.generation)
			verdict[key.generation] = keep
		}
		if keep {
			continue
		}
		delete(c.cells, key)
		generation := strconv.FormatUint(key.generation, 10)
		for _, legacy := range shadowDecisionNames {
			for _, ours := range shadowDecisionNames {
				c.metric.DeleteLabelValues(key.route.Route, key.route.Region, generation, string(key.mode), legacy, ours)
			}
		}
	}
}

// report returns the comparisons kept (forgetting those of generations
// no longer recent first), ordered by route, region, generation and mode.
func (sc *shadowCounts) report(route string) []*v1.ShadowComparison {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.forgetOld()
	keys := make([]shadowKey, 0, len(sc.cells))
	for k := range sc.cells {
		if route == "" || k.route.Route == route {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b shadowKey) int {
		return cmp.Or(a.route.Compare(b.route), cmp.Compare(a.generation, b.generation), cmp.Compare(a.mode, b.mode))
	})
	out := make([]*v1.ShadowComparison, len(keys))
	for i, k := range keys {
		cells := sc.cells[k]
		c := &v1.ShadowComparison{Route: k.route.Route, Region: k.route.Region, Generation: k.generation, Mode: string(k.mode),
			BothAllowed: cells[0][0].Load(), BothDenied: cells[1][1].Load(),
			LegacyAllowedCapledgerDenied: cells[0][1].Load(), LegacyDeniedCapledgerAllowed: cells[1][0].Load()}
		if total := c.BothAllowed + c.BothDenied + c.LegacyAllowedCapledgerDenied + c.LegacyDeniedCapledgerAllowed; total > 0 {
			c.DisagreementRate = float64(c.LegacyAllowedCapledgerDenied+c.LegacyDeniedCapledgerAllowed) / float64(total)
		}
		out[i] = c
	}
	return out
}

// checkLegacyDecision refuses a legacy_decision other than "", "allow"
// and "deny".
func checkLegacyDecision(d string) *connect.Error {
	if d != "" && d != legacyAllow && d != legacyDeny {
		return invalidField(ReasonInvalidCommand, "legacyDecision", "%q is neither %q nor %q", d, legacyAllow, legacyDeny)
	}
	return nil
}

// rolloutService implements capledgerv1connect.RolloutServiceHandler.
type rolloutService struct {
	s      *Server
	store  store.Rollouts
	drains Drains
	// progress shares DrainProgress passes between callers (shared.go).
	progress *sharedAnswers[drainQuestion, drainPass]
}

// drainQuestion is what a DrainProgress pass depends on: the generations
// asked for, in order, and a digest of what decides for them as read
// from the store before the pass: each one's rolled-back state and the
// heads (active and newest generation) of its key and of its route's "*"
// key. A rollback of a generation asked for, or of another of its key's
// or its "*" key's, or a publication under those keys since, makes a new
// question, so no caller (`rollback --wait`) is answered from a pass that
// began before such a change it may have waited for. A publication or
// rollback under another subject's key, which may change what decides
// for some of the generations' accounts, is seen when the shared pass is
// no longer reused (sharedReuseFactor times as old as it took): the
// digest reads a few rows per generation, not every policy.
type drainQuestion struct {
	generations string
	policies    uint64
}

// drainPass is one DrainProgress pass: what the generations held, read
// from asOf on.
type drainPass struct {
	drains []engine.GenerationDrain
	asOf   time.Time
}

// drainQuestionOf returns the question of gens now, reading the policies
// and heads from the store (not the cache, which may lag another
// replica's rollback).
func (svc *rolloutService) drainQuestionOf(ctx context.Context, gens []uint64) (drainQuestion, *connect.Error) {
	h := fnv.New64a()
	var b [17]byte
	for _, g := range gens {
		p, err := svc.s.ledger.Policy(ctx, g)
		if err != nil {
			return drainQuestion{}, readError("policies", ReasonPolicyNotFound, err)
		}
		binary.BigEndian.PutUint64(b[:8], p.Generation)
		b[8] = 0
		if p.RolledBack {
			b[8] = 1
		}
		h.Write(b[:9])
		for _, key := range decidingKeys(p.Key) {
			head, err := svc.s.ledger.PolicyHead(ctx, key)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return drainQuestion{}, readError("policies", ReasonPolicyNotFound, fmt.Errorf("policy head %s: %w", key, err))
			}
			binary.BigEndian.PutUint64(b[:8], head.Active)
			binary.BigEndian.PutUint64(b[8:16], head.Latest)
			b[16] = 2
			h.Write(b[:])
		}
	}
	var q strings.Builder
	for _, g := range gens {
		q.WriteString(strconv.FormatUint(g, 10))
		q.WriteByte(',')
	}
	return drainQuestion{generations: q.String(), policies: h.Sum64()}, nil
}

func registerRolloutService(mux *http.ServeMux, s *Server, rollouts store.Rollouts, drains Drains, options []connect.HandlerOption) {
	svc := &rolloutService{s: s, store: rollouts, drains: drains, progress: &sharedAnswers[drainQuestion, drainPass]{limit: s.storeTimeout}}
	path, handler := capledgerv1connect.NewRolloutServiceHandler(svc, options...)
	mountProcedures(mux, path, handler, v1.File_capledger_v1_rollout_proto.Services().ByName("RolloutService"))
}

func (svc *rolloutService) ready() *connect.Error {
	if svc.store == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this server keeps no rollouts (its store has no rollout table)"))
	}
	return nil
}

// who is the identity recorded with a step: the token's name, "" when
// auth is off.
func who(ctx context.Context) string {
	id, _ := IdentityFrom(ctx)
	return id.Name
}

func rolloutError(what string, err error) *connect.Error {
	switch {
	case errors.As(err, new(*ledger.FieldError)):
		// A field of the request (NewRollout): named by its path alone.
		return fieldRefusal(ReasonInvalidRollout, "", err)
	case errors.Is(err, ledger.ErrInvalidRollout):
		return invalidArgument(ReasonInvalidRollout, "%s: %v", what, err)
	case errors.Is(err, ledger.ErrRolloutExists), errors.Is(err, store.ErrDuplicate):
		return withReason(connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s: %w", what, err)), ReasonRolloutExists)
	case errors.Is(err, ledger.ErrRouteInRollout):
		return withReason(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", what, err)), ReasonRouteInRollout)
	case errors.Is(err, ledger.ErrNothingToUndo):
		return withReason(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", what, err)), ReasonNothingToUndo)
	case errors.Is(err, ledger.ErrRolloutEnded):
		return withReason(connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s: %w", what, err)), ReasonRolloutEnded)
	case errors.Is(err, store.ErrConflict):
		return withReason(connect.NewError(connect.CodeAborted, fmt.Errorf("%s: changed concurrently, read it again and retry: %w", what, err)), ReasonRolloutConflict)
	}
	return readError(what, ReasonRolloutNotFound, err)
}

// CreateRollout implements RolloutService.CreateRollout.
func (svc *rolloutService) CreateRollout(ctx context.Context, req *connect.Request[v1.CreateRolloutRequest]) (*connect.Response[v1.CreateRolloutResponse], error) {
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	routes := make([]ledger.RouteKey, len(req.Msg.GetRoutes()))
	for i, r := range req.Msg.GetRoutes() {
		routes[i] = ledger.RouteKey{Route: r.GetRoute(), Region: r.GetRegion()}
	}
	others, err := svc.store.RolloutList(ctx)
	if err != nil {
		return nil, readError("create rollout: rollouts", ReasonRolloutNotFound, err)
	}
	r, err := ledger.NewRollout(req.Msg.GetName(), ledger.RolloutHash(req.Msg.GetHashBy()), routes, others, who(ctx), svc.s.clock().UTC())
	if err != nil {
		return nil, rolloutError("create rollout", err)
	}
	if err := svc.store.RolloutPut(ctx, &r); err != nil {
		return nil, rolloutError("create rollout "+r.Name, err)
	}
	svc.s.rollouts.invalidate()
	svc.s.log.Info("rollout created", "rollout", r.Name, "by", r.By, "routes", len(r.Routes), "who", who(ctx))
	return connect.NewResponse(&v1.CreateRolloutResponse{Rollout: rolloutProto(&r)}), nil
}

// refuseScoped is the answer of the RolloutService's reads to a token
// scoped to some subjects or routes: rollouts, shadow counts and drain
// progress are figures over every tenant of a route or generation, so a
// tenant-scoped token may not read them (nil for an unscoped caller).
func refuseScoped(ctx context.Context, what string) *connect.Error {
	if !scoped(ctx) {
		return nil
	}
	id, _ := IdentityFrom(ctx)
	return withReason(connect.NewError(connect.CodePermissionDenied,
		fmt.Errorf("%s spans tenants: token %q is scoped (%s)", what, id.Name, id.Scope)), ReasonPermissionDenied)
}

// GetRollout implements RolloutService.GetRollout.
func (svc *rolloutService) GetRollout(ctx context.Context, req *connect.Request[v1.GetRolloutRequest]) (*connect.Response[v1.GetRolloutResponse], error) {
	if cerr := refuseScoped(ctx, "a rollout"); cerr != nil {
		return nil, cerr
	}
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	if cerr := checkRolloutName(req.Msg.GetName()); cerr != nil {
		return nil, cerr
	}
	r, err := svc.store.RolloutGet(ctx, req.Msg.GetName())
	if err != nil {
		return nil, rolloutError("rollout "+req.Msg.GetName(), named(err, "rollout", req.Msg.GetName()))
	}
	return connect.NewResponse(&v1.GetRolloutResponse{Rollout: rolloutProto(&r)}), nil
}

// ListRollouts implements RolloutService.ListRollouts.
func (svc *rolloutService) ListRollouts(ctx context.Context, req *connect.Request[v1.ListRolloutsRequest]) (*connect.Response[v1.ListRolloutsResponse], error) {
	if cerr := refuseScoped(ctx, "the rollout list"); cerr != nil {
		return nil, cerr
	}
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	list, err := svc.store.RolloutList(ctx)
	if err != nil {
		return nil, readError("rollouts", ReasonRolloutNotFound, err)
	}
	resp := &v1.ListRolloutsResponse{}
	for i := range list {
		resp.Rollouts = append(resp.Rollouts, rolloutProto(&list[i]))
	}
	return connect.NewResponse(resp), nil
}

// checkRolloutName answers a call naming a rollout by a name no rollout
// can have (ledger.RolloutNameProblem) with 400 INVALID_ROLLOUT before the
// store is asked (PostgreSQL refuses a NUL byte in a query: it was 503),
// naming the request's field "name" as every validation refusal names its
// field (API.md, "Field paths").
func checkRolloutName(name string) *connect.Error {
	if problem := ledger.RolloutNameProblem(name); problem != "" {
		return fieldRefusal(ReasonInvalidRollout, "", ledger.NewFieldError(ledger.ErrInvalidRollout, "name", problem))
	}
	return nil
}

// share converts a percent to basis points (ledger.BasisPoints, the
// rollout's granularity): INVALID_ROLLOUT outside [0, 100] or off the 0.01
// grid. On the grid means exactly the number a decimal with at most two
// places decodes to: bp/100 is correctly rounded, so it equals the
// float64 that "12.34" (JSON, the CLI's flag) decodes to, and nothing
// else. A tolerance would take some values off the grid and refuse others
// (it took 1e-9 as 0 and refused 0.005); exactness takes none.
func share(percent float64) (ledger.BasisPoints, *connect.Error) {
	bp := math.Round(percent * 100)
	if math.IsNaN(percent) || percent < 0 || percent > 100 || bp/100 != percent {
		return 0, invalidField(ReasonInvalidRollout, "percent", "%v: want 0 to 100 in steps of 0.01 (at most two decimals)", percent)
	}
	return ledger.BasisPoints(bp), nil
}

// changeRollout reads the rollout named name, applies change to it (with
// the caller's identity and the time) and, when change reports that it
// changed, writes it over the version it read (a concurrent change makes
// this ROLLOUT_CONFLICT) and makes this replica's reserves see it at
// once. It returns the rollout as it stands after the change.
func (svc *rolloutService) changeRollout(ctx context.Context, name string,
	change func(r *ledger.Rollout, who string, now time.Time) (bool, error)) (ledger.Rollout, bool, *connect.Error) {
	if cerr := checkRolloutName(name); cerr != nil {
		return ledger.Rollout{}, false, cerr
	}
	r, err := svc.store.RolloutGet(ctx, name)
	if err != nil {
		return ledger.Rollout{}, false, rolloutError("rollout "+name, named(err, "rollout", name))
	}
	changed, err := change(&r, who(ctx), svc.s.clock().UTC())
	if err != nil {
		return ledger.Rollout{}, false, rolloutError("rollout "+name, err)
	}
	if changed {
		if err := svc.store.RolloutPut(ctx, &r); err != nil {
			return ledger.Rollout{}, false, rolloutError("rollout "+name, err)
		}
		svc.s.rollouts.invalidate()
	}
	return r, changed, nil
}

// SetRolloutShare implements RolloutService.SetRolloutShare.
func (svc *rolloutService) SetRolloutShare(ctx context.Context, req *connect.Request[v1.SetRolloutShareRequest]) (*connect.Response[v1.SetRolloutShareResponse], error) {
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	bp, cerr := share(req.Msg.GetPercent())
	if cerr != nil {
		return nil, cerr
	}
	var prior ledger.BasisPoints
	r, changed, cerr := svc.changeRollout(ctx, req.Msg.GetName(), func(r *ledger.Rollout, who string, now time.Time) (bool, error) {
		prior = r.Share
		return r.SetShare(bp, who, now)
	})
	if cerr != nil {
		return nil, cerr
	}
	if changed {
		svc.s.log.Info("rollout step", "rollout", r.Name, "from", prior.String(), "to", bp.String(), "who", who(ctx))
	}
	return connect.NewResponse(&v1.SetRolloutShareResponse{Rollout: rolloutProto(&r), Changed: changed}), nil
}

// UndoRolloutStep implements RolloutService.UndoRolloutStep.
func (svc *rolloutService) UndoRolloutStep(ctx context.Context, req *connect.Request[v1.UndoRolloutStepRequest]) (*connect.Response[v1.UndoRolloutStepResponse], error) {
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	var undone ledger.RolloutStep
	r, _, cerr := svc.changeRollout(ctx, req.Msg.GetName(), func(r *ledger.Rollout, who string, now time.Time) (bool, error) {
		var err error
		undone, err = r.Undo(who, now)
		return err == nil, err
	})
	if cerr != nil {
		return nil, cerr
	}
	svc.s.log.Info("rollout step undone", "rollout", r.Name, "step", undone.Seq, "share", r.Share.String(), "who", who(ctx))
	return connect.NewResponse(&v1.UndoRolloutStepResponse{Rollout: rolloutProto(&r), Undone: stepProto(&undone)}), nil
}

// EndRollout implements RolloutService.EndRollout.
func (svc *rolloutService) EndRollout(ctx context.Context, req *connect.Request[v1.EndRolloutRequest]) (*connect.Response[v1.EndRolloutResponse], error) {
	if cerr := svc.ready(); cerr != nil {
		return nil, cerr
	}
	r, changed, cerr := svc.changeRollout(ctx, req.Msg.GetName(), func(r *ledger.Rollout, who string, now time.Time) (bool, error) {
		return r.End(who, now), nil
	})
	if cerr != nil {
		return nil, cerr
	}
	if changed {
		svc.s.log.Info("rollout ended", "rollout", r.Name, "share", r.Share.String(), "who", who(ctx))
	}
	return connect.NewResponse(&v1.EndRolloutResponse{Rollout: rolloutProto(&r), Changed: changed}), nil
}

// ShadowReport implements RolloutService.ShadowReport.
func (svc *rolloutService) ShadowReport(ctx context.Context, req *connect.Request[v1.ShadowReportRequest]) (*connect.Response[v1.ShadowReportResponse], error) {
	if cerr := refuseScoped(ctx, "the shadow report"); cerr != nil {
		return nil, cerr
	}
	sc := svc.s.shadow
	return connect.NewResponse(&v1.ShadowReportResponse{Comparisons: sc.report(req.Msg.GetRoute()), Since: timestamppb.New(sc.since)}), nil
}

// MaxRollbackGenerations bounds RollbackGenerations.
const MaxRollbackGenerations = 1000

// RollbackGenerations implements RolloutService.RollbackGenerations. The
// call answers as one: every generation rolled back, or one error and
// (unless a ledger refusal came after others applied) none rolled back.
// It counts as it answers (countBatchAnswer): each generation under its
// own outcome when it succeeds, the refusal once when it is refused.
func (svc *rolloutService) RollbackGenerations(ctx context.Context, req *connect.Request[v1.RollbackGenerationsRequest]) (_ *connect.Response[v1.RollbackGenerationsResponse], answer error) {
	gens := req.Msg.GetGenerations()
	var results []ledger.Result
	defer func() { svc.s.countBatchAnswer(ledger.KindRollbackPolicy, len(gens), results, answer) }()
	if cerr := checkGenerations(gens); cerr != nil {
		return nil, cerr
	}
	cmds := make([]ledger.Command, len(gens))
	for i, g := range gens {
		p, err := svc.s.policies.get(ctx, g)
		if err != nil {
			return nil, readError(fmt.Sprintf("rollback generation %d", g), ReasonPolicyNotFound, err)
		}
		cmds[i] = ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: g}
	}
	results, cerr := svc.s.execBatch(ctx, ledger.KindRollbackPolicy, cmds)
	if cerr != nil {
		return nil, cerr
	}
	done := make([]ledger.Command, 0, len(cmds))
	for i := range cmds {
		if results[i].Err == nil {
			done = append(done, cmds[i])
		}
	}
	if len(done) > 0 {
		svc.s.policyCommitted()
	}
	if err := svc.s.policies.rolledBack(ctx, done...); err != nil {
		svc.s.log.Warn("policy cache refresh after rollback", "err", err)
	}
	resp := &v1.RollbackGenerationsResponse{}
	for i := range results {
		if results[i].Err != nil {
			return nil, svc.s.outcomeError(ctx, &results[i])
		}
		k := cmds[i].PolicyKey
		resp.Rollbacks = append(resp.Rollbacks, &v1.GenerationRollback{Generation: gens[i], Subject: k.Subject, Route: k.Route, Region: k.Region,
			ActiveGeneration: results[i].Generation, Replayed: results[i].Replayed})
		svc.s.log.Info("policy rolled back", "generation", gens[i], "key", k.String(), "active", results[i].Generation, "replayed", results[i].Replayed, "who", who(ctx))
	}
	return connect.NewResponse(resp), nil
}

// drainsError is the answer of a drain pass (RunDrains) that failed
// with err after applied drain moves had committed, ctx being the pass's
// (scanBound): the code and reason operatingError gives err (503
// STORE_UNAVAILABLE when ctx's store did not answer a read in time),
// saying how many moves were applied, whether the page at hand was not
// applied or its outcome is unknown, and that running the drains again
// is safe (a drain moves only what is still there).
func drainsError(ctx context.Context, applied int, err error) *connect.Error {
	base := operatingError("drains", err)
	inFlight := "outcome unknown"
	if errors.Is(err, engine.ErrNotApplied) {
		inFlight = "not applied"
	}
	msg := fmt.Sprintf("drains: %d drain moves applied before this failure; the rest: %s; run the drains again (a drain moves only what is still there): %v", applied, inFlight, err)
	code := base.Code()
	var timedOut storeTimedOut
	if errors.As(context.Cause(ctx), &timedOut) {
		code, msg = connect.CodeUnavailable, msg+"; "+timedOut.Error()
	}
	out := connect.NewError(code, errors.New(msg))
	for _, d := range base.Details() {
		out.AddDetail(d)
	}
	return out
}

// checkGenerations is the shape of RollbackGenerations' and
// DrainProgress's generations: 1 to MaxRollbackGenerations of them, none 0.
func checkGenerations(gens []uint64) *connect.Error {
	if len(gens) == 0 || len(gens) > MaxRollbackGenerations {
		return invalidField(ReasonInvalidCommand, "generations", ": %d given; give 1 to %d", len(gens), MaxRollbackGenerations)
	}
	for i, g := range gens {
		if cerr := checkGeneration(ledger.ItemPath("generations", i), g); cerr != nil {
			return cerr
		}
	}
	return nil
}

// DrainProgress implements RolloutService.DrainProgress.
func (svc *rolloutService) DrainProgress(ctx context.Context, req *connect.Request[v1.DrainProgressRequest]) (*connect.Response[v1.DrainProgressResponse], error) {
	if cerr := refuseScoped(ctx, "drain progress"); cerr != nil {
		return nil, cerr
	}
	if svc.drains == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server cannot report drains"))
	}
	gens := req.Msg.GetGenerations()
	if cerr := checkGenerations(gens); cerr != nil {
		return nil, cerr
	}
	// Uncapped (storecap.go): drain passes (runDrains) run as long as
	// they take, and the shared progress pass bounds its scan by the
	// store's answers to each page; the other reads here are capped.
	capped, cancel := svc.s.capStore(ctx, "")
	defer cancel()
	for _, g := range gens {
		// An unknown generation is answered by name (notFound), before
		// any drain runs.
		if _, err := svc.s.policies.get(capped, g); err != nil {
			return nil, readError("drain progress", ReasonPolicyNotFound, err)
		}
	}
	resp := &v1.DrainProgressResponse{}
	// Without runDrains any pass of the same question will do; with it,
	// only one begun after this call's drain pass ended (`rollback
	// --wait` must not see the drain it waited for undone).
	var notBefore time.Time
	if req.Msg.GetRunDrains() {
		if id, ok := IdentityFrom(ctx); ok && id.Role != RoleAdmin {
			return nil, withReason(connect.NewError(connect.CodePermissionDenied,
				fmt.Errorf("runDrains writes: token %q (role %s) may only read the progress", id.Name, id.Role)), ReasonPermissionDenied)
		}
		// Each of the pass's reads ends once the store has not answered
		// it for the store timeout; each of its batches at the engine's
		// batch timeout (the same --store-timeout).
		drainCtx, cancelDrains := scanBound(ctx, svc.s.storeTimeout)
		n, err := svc.drains.RunDrains(drainCtx)
		cancelDrains()
		resp.DrainCommands = int64(n)
		if err != nil {
			return nil, drainsError(drainCtx, n, err)
		}
		notBefore = time.Now()
	}
	capped, cancel = svc.s.capStore(ctx, "") // anew: the drain passes took their time
	defer cancel()
	q, cerr := svc.drainQuestionOf(capped, gens)
	if cerr != nil {
		return nil, cerr
	}
	pass, cerr := svc.progress.answer(ctx, q, notBefore, func(ctx context.Context, pass *drainPass) *connect.Error {
		pass.asOf = svc.s.clock()
		began := time.Now()
		var err error
		if pass.drains, err = svc.drains.DrainProgress(ctx, gens); err != nil {
			if errors.Is(err, engine.ErrPolicyChanging) {
				return policyChangingError(err, time.Since(began))
			}
			return readError("drain progress", ReasonPolicyNotFound, err)
		}
		return nil
	})
	if cerr != nil {
		return nil, cerr
	}
	resp.Drained = true
	for i := range pass.drains {
		d := &pass.drains[i]
		p := &d.Policy
		resp.Generations = append(resp.Generations, &v1.GenerationDrain{
			Generation: p.Generation, Subject: p.Key.Subject, Route: p.Key.Route, Region: p.Key.Region,
			RolledBack: p.RolledBack, Active: d.Active, Accounts: d.Accounts,
			Reserved: unitsMap(p, &d.Reserved), Debt: unitsMap(p, &d.Debt), Available: unitsMap(p, &d.Available),
			BlockedByBurst: d.BlockedByBurst, BlockedNoPolicy: d.BlockedNoPolicy, BlockedDroppedUnit: d.BlockedDroppedUnit,
			UnreconciledShards: d.UnreconciledShards, UnreconciledShardUnits: unitsMap(p, &d.ShardUnits),
			UnreconciledLegacyBudgets: d.LegacyBudgets, UnreconciledLegacyUnits: unitsMap(p, &d.LegacyUnits),
			Drained: d.Drained(),
		})
		resp.Drained = resp.Drained && d.Drained()
	}
	resp.At = timestamppb.New(svc.s.clock())
	resp.AsOf = timestamppb.New(pass.asOf)
	return connect.NewResponse(resp), nil
}

func percent(s ledger.BasisPoints) float64 { return float64(s) / 100 }

func rolloutProto(r *ledger.Rollout) *v1.Rollout {
	out := &v1.Rollout{Name: r.Name, HashBy: string(r.By), Percent: percent(r.Share), Version: r.Version, Ended: r.Ended()}
	idx := ledger.NewRollouts([]ledger.Rollout{*r})
	for _, rk := range r.Routes {
		// The route's mode for a subject outside any share: under subject
		// hashing the route is "enforce" while some subjects are.
		mode, _ := ledger.RolloutModeFor(idx, rk, "", ledger.RolloutShadow)
		switch {
		case r.Ended():
			mode = endedRouteMode
		case r.By == ledger.RolloutBySubject && r.Share > 0:
			mode = ledger.RolloutEnforce
		}
		out.Routes = append(out.Routes, &v1.RolloutRoute{Route: rk.Route, Region: rk.Region, Mode: string(mode)})
	}
	for i := range r.Steps {
		out.Steps = append(out.Steps, stepProto(&r.Steps[i]))
	}
	return out
}

// endedRouteMode is the mode an ended rollout shows for its routes: their
// deciding policies' own, which the rollout no longer overrides.
const endedRouteMode ledger.RolloutMode = "policy"

func stepProto(s *ledger.RolloutStep) *v1.RolloutStep {
	return &v1.RolloutStep{Seq: int32(s.Seq), Action: string(s.Action), Percent: percent(s.Share), PriorPercent: percent(s.Prior),
		Who: s.Who, At: timestamppb.New(s.At), Undoes: int32(s.Undoes), UndoneBy: int32(s.UndoneBy)}
}

// CarveLegacyBudget implements RolloutService.CarveLegacyBudget: the
// ShardService's issuance for gateway id ledger.LegacyGateway(identity),
// with ShardArgs.Legacy set (the admin role alone may call it).
func (svc *rolloutService) CarveLegacyBudget(ctx context.Context, req *connect.Request[v1.CarveLegacyBudgetRequest]) (*connect.Response[v1.CarveLegacyBudgetResponse], error) {
	m := req.Msg
	if cerr := checkID("budgetId", m.GetBudgetId()); cerr != nil {
		return nil, cerr
	}
	if cerr := checkID("identity", m.GetIdentity()); cerr != nil {
		return nil, cerr
	}
	if svc.s.shards == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server issues no shards"))
	}
	gateway := ledger.LegacyGateway(m.GetIdentity())
	resp, err := svc.s.shards.issue(ctx, &v1.IssueShardRequest{ShardId: m.GetBudgetId(), GatewayId: gateway, BootEpoch: 1,
		Subject: m.GetSubject(), Route: m.GetRoute(), Region: m.GetRegion(), Units: m.GetUnits(), Ttl: m.GetTtl()}, true)
	if err != nil {
		return nil, err
	}
	svc.s.log.Info("legacy budget carved", "budget", m.GetBudgetId(), "identity", m.GetIdentity(), "subject", m.GetSubject(),
		"route", m.GetRoute(), "replayed", resp.Msg.GetReplayed(), "who", who(ctx))
	return connect.NewResponse(&v1.CarveLegacyBudgetResponse{Budget: resp.Msg.GetShard(), Replayed: resp.Msg.GetReplayed()}), nil
}
