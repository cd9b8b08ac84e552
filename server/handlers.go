package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

var _ capledgerv1connect.LedgerServiceHandler = (*Server)(nil)

// staleRetries bounds how often a reserve is mapped again after the ledger
// said another generation decides than the one the units were mapped for.
const staleRetries = 3

// exec runs one command and counts nothing: the caller counts the answer
// it gives (countAnswer, metricOutcome), which may be a reserve or record
// mapped again after a stale refusal, or the server's own refusal in
// place of the ledger's. The error is the mapped operating failure (the
// command's outcome is then unknown); expected outcomes are in
// Result.Err.
func (s *Server) exec(ctx context.Context, cmd ledger.Command) (ledger.Result, *connect.Error) {
	res, err := s.ledger.Do(ctx, cmd)
	if err != nil {
		return res, operatingError(cmd.Kind.String(), err)
	}
	return res, nil
}

// execBatch runs several commands in one engine call, with the error
// contract of exec, and counts nothing: the caller counts what it answers.
func (s *Server) execBatch(ctx context.Context, kind ledger.Kind, cmds []ledger.Command) ([]ledger.Result, *connect.Error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	results, err := s.ledger.DoBatch(ctx, cmds)
	if err != nil {
		return nil, operatingError(kind.String()+" batch", err)
	}
	return results, nil
}

// refused counts a command the server refused before it reached the
// ledger (validation, unknown unit, no policy, a read that failed), under
// its outcome.
func (s *Server) refused(kind ledger.Kind, cerr *connect.Error) {
	s.metrics.command(kind, refusalOutcome(cerr))
}

// outcomeUnavailable is the outcome of a command the ledger could not
// answer (operatingFailure): one label for a single call and for every
// item of a batch that failed whole, whatever read or commit failed.
const outcomeUnavailable = "unavailable"

// operatingFailure reports whether cerr says the ledger could not answer
// (store unavailable or conflicting, shutting down, the caller's deadline
// or cancellation first) rather than what it decided: the caller retries
// with the same ids. A batch fails whole on one, as a single call does.
func operatingFailure(cerr *connect.Error) bool {
	switch cerr.Code() {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return true
	}
	return false
}

// refusalOutcome is the outcome label of an answer the server gave as an
// error: "unavailable" for an operating failure, else the reason of its
// detail in lower case ("invalid_command"); without one, "invalid" for an
// invalid argument (a body that names no reason), else the code
// ("internal").
func refusalOutcome(cerr *connect.Error) string {
	if operatingFailure(cerr) {
		return outcomeUnavailable
	}
	reason := "invalid"
	if cerr.Code() != connect.CodeInvalidArgument {
		reason = cerr.Code().String()
	}
	for _, d := range cerr.Details() {
		if msg, err := d.Value(); err == nil {
			switch detail := msg.(type) {
			case *v1.ErrorDetail:
				reason = detail.GetReason()
			case *v1.RejectionDetail:
				reason = detail.GetReason()
			}
		}
	}
	return strings.ToLower(reason)
}

// countAnswer counts one command of kind under the answer its handler
// returned (answer: nil or the error, whether the server refused before
// the ledger, the ledger refused, the store failed, or an applied
// command's answer could not be built), else under res's result.
// Handlers declare res first and defer it, so that every return counts
// once.
func (s *Server) countAnswer(kind ledger.Kind, res *ledger.Result, answer error) {
	s.metrics.command(kind, answerOutcome(res, answerError(answer)))
}

// countBatchAnswer counts a call of n commands of kind that answers as
// one (RollbackGenerations): on success each result under its own
// outcome; on an operating failure all n as unavailable, as a batch that
// fails whole; on a refusal the refusal once, the one answer the caller
// saw.
func (s *Server) countBatchAnswer(kind ledger.Kind, n int, results []ledger.Result, answer error) {
	cerr := answerError(answer)
	switch {
	case cerr == nil:
		for i := range results {
			s.metrics.command(kind, outcomeLabel(&results[i]))
		}
	case operatingFailure(cerr):
		s.metrics.commandsAs(kind, outcomeUnavailable, n)
	default:
		s.metrics.command(kind, refusalOutcome(cerr))
	}
}

// answerError is a handler's returned error as the connect error the
// caller gets (an error of another type is answered as internal).
func answerError(answer error) *connect.Error {
	var cerr *connect.Error
	if !errors.As(answer, &cerr) && answer != nil {
		cerr = connect.NewError(connect.CodeInternal, answer)
	}
	return cerr
}

// answerOutcome is the outcome label of an answer: cerr's when the server
// answered an error, else the ledger's result's.
func answerOutcome(res *ledger.Result, cerr *connect.Error) string {
	if cerr != nil {
		return refusalOutcome(cerr)
	}
	return outcomeLabel(res)
}

func outcomeLabel(res *ledger.Result) string {
	switch {
	case res.Err == nil && res.Replayed:
		return "replayed"
	case res.Err == nil:
		return "ok"
	case res.Shadow:
		return "shadow_rejected"
	}
	return strings.ToLower(classify(res.Err).reason)
}

// checkID refuses an id by ledger.IDProblem, the rule the gateway's
// shard-local ledger applies too.
func checkID(field, id string) *connect.Error {
	if p := ledger.IDProblem(id); p != "" {
		return invalidField(ReasonInvalidCommand, field, "%s", p)
	}
	return nil
}

// checkGeneration refuses generation 0 in field: generations count from
// 1, and 0 is what a left-out field reads as, so it names no policy and is
// a malformed request rather than an unknown generation (404).
func checkGeneration(field string, generation uint64) *connect.Error {
	if generation == 0 {
		return invalidField(ReasonInvalidCommand, field, ": 0 names no policy generation (they count from 1; a field left out reads as 0)")
	}
	return nil
}

func regionOrDefault(region string) string {
	if region == "" {
		return ledger.DefaultRegion
	}
	return region
}

// --- policies ---

// PublishPolicy implements LedgerService.PublishPolicy.
func (s *Server) PublishPolicy(ctx context.Context, req *connect.Request[v1.PublishPolicyRequest]) (_ *connect.Response[v1.PublishPolicyResponse], answer error) {
	var res ledger.Result
	defer func() { s.countAnswer(ledger.KindPublishPolicy, &res, answer) }()
	p, err := PolicyFromProto(req.Msg.GetPolicy())
	if err != nil {
		return nil, fieldRefusal(ReasonInvalidPolicy, "policy", err)
	}
	res, cerr := s.exec(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p, Generation: req.Msg.GetEditedFrom()})
	if cerr != nil {
		return nil, cerr
	}
	if errors.Is(res.Err, ledger.ErrInvalidPolicy) {
		// The ledger names the field within the policy (Validate).
		return nil, fieldRefusal(ReasonInvalidPolicy, "policy", res.Err)
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, &res)
	}
	s.policyCommitted()
	// Read back the generation and its key's head, two rows, and take the
	// generation into the cache: a reload of every policy here made
	// publishing N policies cost N^2 policy reads.
	stored, active, err := s.policyNow(ctx, res.Generation)
	if err != nil {
		return nil, appliedErrorAdvising("publish policy: read back",
			"read it with GetPolicy rather than publishing again (the same terms replay only while their generation is active)", err)
	}
	s.policies.published(stored)
	s.log.Info("policy published", "generation", res.Generation, "key", stored.Key.String(), "replayed", res.Replayed)
	return connect.NewResponse(&v1.PublishPolicyResponse{Policy: PolicyProto(&stored, active), Replayed: res.Replayed}), nil
}

// isActive reads p's key's head: whether p is its key's active generation
// now (one row, however many policies there are).
func (s *Server) isActive(ctx context.Context, p *ledger.Policy) (bool, error) {
	head, err := s.ledger.PolicyHead(ctx, p.Key)
	if err != nil {
		return false, fmt.Errorf("policy head %s: %w", p.Key, err)
	}
	return head.Active == p.Generation, nil
}

// policyNow returns generation's policy as stored and whether it is its
// key's active generation, as they stood together at one moment
// (activeNow of the policy read). store.ErrNotFound (wrapped) when the
// generation does not exist.
func (s *Server) policyNow(ctx context.Context, generation uint64) (ledger.Policy, bool, error) {
	p, err := s.ledger.Policy(ctx, generation)
	if err != nil {
		return p, false, err
	}
	return s.activeNow(ctx, p)
}

// activeNow returns p, a policy just read, and whether it is its key's
// active generation, as they stood together at one moment: its key's
// head (isActive), then, for a generation neither active nor rolled
// back, the policy again. A rollback committed between the policy's read
// and the head's would otherwise show the generation neither active nor
// rolled back when it was active before and rolled back after; read
// again it is rolled back (and stays so, never active again). Read again
// and still not rolled back, it was not at the head's read either, which
// found it inactive. An active generation is never rolled back, and a
// rolled-back one never active again, so those need no third read.
func (s *Server) activeNow(ctx context.Context, p ledger.Policy) (ledger.Policy, bool, error) {
	active, err := s.isActive(ctx, &p)
	if err != nil || active || p.RolledBack {
		return p, active, err
	}
	again, err := s.ledger.Policy(ctx, p.Generation)
	return again, false, err
}

// GetPolicy implements LedgerService.GetPolicy.
func (s *Server) GetPolicy(ctx context.Context, req *connect.Request[v1.GetPolicyRequest]) (*connect.Response[v1.GetPolicyResponse], error) {
	generation := req.Msg.GetGeneration()
	if cerr := checkGeneration("generation", generation); cerr != nil {
		return nil, cerr
	}
	p, err := s.ledger.Policy(ctx, generation)
	if errors.Is(err, store.ErrNotFound) {
		return nil, notFound(ReasonPolicyNotFound, strconv.FormatUint(generation, 10))
	}
	if err != nil {
		return nil, readError("get policy", ReasonPolicyNotFound, err)
	}
	// The scope first: the head read's error names the key, another
	// tenant's to a scoped token.
	if !inPolicyScope(ctx, p.Key) {
		s.logOutOfScope(ctx, "get policy", "generation", generation)
		return nil, notFound(ReasonPolicyNotFound, strconv.FormatUint(generation, 10))
	}
	p, active, err := s.activeNow(ctx, p)
	if err != nil {
		return nil, readError("get policy", ReasonPolicyNotFound, err)
	}
	return connect.NewResponse(&v1.GetPolicyResponse{Policy: s.policyWithModeNow(ctx, &p, active)}), nil
}

// policyWithModeNow is PolicyProto with rolloutNow: for the active
// generation the mode its reserves get now (a staged rollout's on its
// route), where it has one.
func (s *Server) policyWithModeNow(ctx context.Context, p *ledger.Policy, active bool) *v1.Policy {
	pb := PolicyProto(p, active)
	if active {
		if mode, one := s.rollouts.policyModeNow(ctx, p); one {
			pb.RolloutNow = rolloutToProto[mode]
		}
	}
	return pb
}

// RollbackPolicy implements LedgerService.RollbackPolicy.
func (s *Server) RollbackPolicy(ctx context.Context, req *connect.Request[v1.RollbackPolicyRequest]) (_ *connect.Response[v1.RollbackPolicyResponse], answer error) {
	var res ledger.Result
	defer func() { s.countAnswer(ledger.KindRollbackPolicy, &res, answer) }()
	generation := req.Msg.GetGeneration()
	if cerr := checkGeneration("generation", generation); cerr != nil {
		return nil, cerr
	}
	p, err := s.policies.get(ctx, generation)
	if err != nil {
		return nil, readError("rollback policy", ReasonPolicyNotFound, err)
	}
	cmd := ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: generation}
	res, cerr := s.exec(ctx, cmd)
	if cerr != nil {
		return nil, cerr
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, &res)
	}
	s.policyCommitted()
	if err := s.policies.rolledBack(ctx, cmd); err != nil {
		s.log.Warn("policy cache refresh after rollback", "err", err)
	}
	s.log.Info("policy rolled back", "generation", generation, "key", p.Key.String(), "active", res.Generation, "replayed", res.Replayed)
	return connect.NewResponse(&v1.RollbackPolicyResponse{ActiveGeneration: res.Generation, Replayed: res.Replayed}), nil
}

// --- reserve ---

// outcome is one command's answer before it is put on the wire: a
// response, a ledger outcome with Err set, or an error decided by the
// server (validation, an operating failure).
type outcome[T any] struct {
	resp T
	res  *ledger.Result
	err  *connect.Error
	// label is the metrics outcome of resp (ok, replayed, shadow_rejected).
	label string
}

// metricOutcome is the capledger_commands_total outcome of the answer
// out is: its error's, its ledger refusal's, or its response's.
func (out *outcome[T]) metricOutcome() string {
	if out.err == nil && out.res == nil {
		return out.label
	}
	return answerOutcome(out.res, out.err)
}

// reserveCommand validates a reserve request and maps its units to the
// positions of the policy the server believes decides, naming that
// generation in the command. When the units cannot be mapped (no policy,
// an unknown unit) the request is refused (invalid) without reaching the
// ledger, unless its id already exists: a retry of an admitted request must
// still get its receipt (or a digest mismatch) after the policy changed, so
// the command then goes to the ledger without units, and unmapped is the
// answer should the ledger not replay it.
func (s *Server) reserveCommand(ctx context.Context, req *v1.ReserveRequest) (cmd ledger.Command, unmapped, invalid *connect.Error) {
	if cerr := checkID("reservationId", req.GetReservationId()); cerr != nil {
		return cmd, nil, cerr
	}
	if cerr := checkLegacyDecision(req.GetLegacyDecision()); cerr != nil {
		return cmd, nil, cerr
	}
	// The door checked a single Reserve's text already; a batch's items and
	// Envoy's checks come here without it.
	if cerr := textProblem(req.ProtoReflect()); cerr != nil {
		return cmd, nil, cerr
	}
	if cerr := checkUnitValues("units", req.GetUnits(), false); cerr != nil {
		return cmd, nil, cerr
	}
	// The rest of the shape, from the request alone: a concrete subject,
	// a route and something to reserve, by the ledger's own rule.
	// Checked before the id is looked up, so a malformed retry is
	// INVALID_COMMAND whatever the id names (a live reservation, a
	// tombstone) rather than DIGEST_MISMATCH or a replay, and before the
	// scope, so it is not NO_POLICY either (API.md, "Order of checks").
	region := regionOrDefault(req.GetRegion())
	if problem := ledger.ReserveShapeProblem(req.GetSubject(), req.GetRoute(), region, slices.Collect(maps.Values(req.GetUnits()))); problem != nil {
		return cmd, nil, refuseField(ReasonInvalidCommand, problem)
	}
	// A caller's digest in the records' space is refused (by the ledger's
	// rule, here so that it is INVALID_COMMAND before scope and policy).
	if problem := ledger.ReserveDigestProblem(req.GetRequestDigest()); problem != "" {
		return cmd, nil, invalidField(ReasonInvalidCommand, "requestDigest", ": %s", problem)
	}
	digest := req.GetRequestDigest()
	if digest == "" {
		digest = requestDigest(req.GetSubject(), req.GetRoute(), region, req.GetUnits())
	}
	cmd = ledger.Command{
		Kind:          ledger.KindReserve,
		ReservationID: req.GetReservationId(),
		RequestDigest: digest,
		Subject:       req.GetSubject(),
		Route:         req.GetRoute(),
		Region:        region,
	}
	key := ledger.PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
	if cerr := s.subjectOutOfScope(ctx, "reserve", key); cerr != nil {
		return cmd, nil, cerr
	}
	p, units, refusal, cerr := s.mapActive(ctx, key, "units", req.GetUnits(), "reserve")
	if cerr != nil {
		return cmd, nil, cerr
	}
	if refusal == nil {
		cmd.Units = units
		cmd.Generation = p.Generation
		mode, err := s.rollouts.mode(ctx, ledger.RouteKey{Route: cmd.Route, Region: cmd.Region}, cmd.Subject, p.Rollout)
		if err != nil {
			return cmd, nil, operatingError("reserve", fmt.Errorf("%w: %w", engine.ErrNotApplied, err))
		}
		cmd.Rollout = mode
		return cmd, nil, nil
	}
	existing, err := s.ledger.Reservation(ctx, cmd.ReservationID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return cmd, nil, refusal
		}
		return cmd, nil, notSentError("reserve "+cmd.ReservationID, ReasonReservationNotFound, err)
	}
	// The id is taken: the ledger answers from it (a replay or a digest
	// mismatch) before it reads a policy or the units, but after the
	// command's shape, which wants a unit above 0. Should the id vanish
	// before the ledger looks (retention forgetting it in between), the
	// command must admit nothing, since the server answers its own refusal:
	// an amount above MaxUnits passes the shape and no policy admits it
	// (TooLarge, answered as unmapped), in dimension 0, which every policy
	// has; under the reservation's generation, which the ledger refuses as
	// stale if another one decides by then (mapped again: the id is gone).
	// The reservation's own amounts would have admitted a new one.
	cmd.Generation = existing.Account.Generation
	cmd.Units = ledger.Amounts{}
	cmd.Units[0] = ledger.MaxUnits + 1
	return cmd, refusal, nil
}

// mapActive maps units by the cached policy that decides key. When the
// cache has no policy for key, or its generation lacks one of the units,
// it may predate a publish through another replica (a new key, or a new
// generation with other units); such a request never reaches the ledger,
// which would otherwise say the mapping is stale, so it reloads (at most
// once per missReloadInterval) and maps again. refusal is NO_POLICY or
// UNKNOWN_UNIT (its message names field, not call); cerr is a reload that
// failed (its message names call).
func (s *Server) mapActive(ctx context.Context, key ledger.PolicyKey, field string, units map[string]int64, call string) (p ledger.Policy, mapped ledger.Amounts, refusal, cerr *connect.Error) {
	p, ok := s.policies.active(key)
	var unitErr *connect.Error
	if ok {
		mapped, unitErr = amounts(&p, field, units)
	}
	if !ok || unitErr != nil {
		if err := s.policies.refreshForMiss(ctx, key); err != nil {
			return p, mapped, nil, notSentError(call+": policies", ReasonNoPolicy, err)
		}
		if p, ok = s.policies.active(key); ok {
			mapped, unitErr = amounts(&p, field, units)
		}
	}
	switch {
	case !ok:
		return p, mapped, noPolicy(key), nil
	case unitErr != nil:
		return p, mapped, unitErr, nil
	}
	return p, mapped, nil, nil
}

// stale reports whether the ledger refused a reserve because another
// generation decides than the one its units were mapped for.
func stale(cmd *ledger.Command, res *ledger.Result) bool {
	return cmd.Generation != 0 && errors.Is(res.Err, ledger.ErrInvalidCommand) &&
		res.Generation != 0 && res.Generation != cmd.Generation
}

// mapAgain is the retry rule of a command whose units the server mapped
// by its policy cache (Reserve, RecordUsage, IssueShard): when the ledger
// refused it as stale (another generation decides) and fewer than
// staleRetries attempts were made, it reloads the policy cache and
// returns true, so that the caller maps the command again; false to
// answer res as it is; or the answer instead of res (what names the
// call): the reload's error, or staleError once the retries are spent.
func (s *Server) mapAgain(ctx context.Context, what string, attempt int, cmd *ledger.Command, res *ledger.Result) (bool, *connect.Error) {
	if !stale(cmd, res) {
		return false, nil
	}
	if attempt >= staleRetries {
		return false, staleError(what, res)
	}
	if err := s.policies.refreshStale(ctx, ledger.PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}, res.Generation); err != nil {
		return false, notSentError(what+": policies", ReasonNoPolicy, err)
	}
	return true, nil
}

// reserveOutcome turns the ledger's answer to a reserve into its outcome.
func (s *Server) reserveOutcome(ctx context.Context, res *ledger.Result, unmapped *connect.Error) outcome[*v1.ReserveResponse] {
	if r := &res.Reservation; r.ID != "" && s.outOfScope(ctx, "reserve", r.Account.Subject, r.Account.Route, "reservation", r.ID) {
		// The id is another tenant's (a digest mismatch, or a replay of a
		// guessed digest).
		return outcome[*v1.ReserveResponse]{err: idTaken()}
	}
	if unmapped != nil && !(res.Err == nil && res.Replayed) && !errors.Is(res.Err, ledger.ErrDigestMismatch) {
		// Not a retry of an existing id: the server's own answer stands.
		return outcome[*v1.ReserveResponse]{err: unmapped}
	}
	if res.Err != nil && !res.Shadow {
		return outcome[*v1.ReserveResponse]{res: res}
	}
	resp := &v1.ReserveResponse{Replayed: res.Replayed, PolicyGeneration: res.Generation}
	if res.Shadow {
		reason := classify(res.Err).reason
		resp.ShadowRejected = true
		resp.ShadowRejection = rejection(res, reason)
		s.metrics.shadowRejection(res.Dimension, reason)
		return outcome[*v1.ReserveResponse]{resp: resp, label: outcomeLabel(res)}
	}
	pb, err := s.reservationProto(ctx, &res.Reservation)
	if err != nil {
		// Committed, but cannot be rendered: say so without hiding that
		// the reservation exists (a retry with the same id replays it).
		return outcome[*v1.ReserveResponse]{err: appliedError("reserve: render receipt", err)}
	}
	resp.Reservation = pb
	return outcome[*v1.ReserveResponse]{resp: resp, label: outcomeLabel(res)}
}

// reserveOne runs one reserve, mapping it again if the policy changed under
// it. The caller counts the outcome (metricOutcome): a stale refusal
// mapped again is no answer, and the server may answer its own refusal
// (unmapped) or a render failure in place of the ledger's.
func (s *Server) reserveOne(ctx context.Context, req *v1.ReserveRequest) outcome[*v1.ReserveResponse] {
	for attempt := 0; ; attempt++ {
		cmd, unmapped, invalid := s.reserveCommand(ctx, req)
		if invalid != nil {
			return outcome[*v1.ReserveResponse]{err: invalid}
		}
		res, cerr := s.exec(ctx, cmd)
		if cerr != nil {
			return outcome[*v1.ReserveResponse]{err: cerr}
		}
		if again, cerr := s.mapAgain(ctx, "reserve", attempt, &cmd, &res); cerr != nil {
			return outcome[*v1.ReserveResponse]{err: cerr}
		} else if again {
			continue
		}
		s.shadow.compare(&cmd, req.GetLegacyDecision(), &res)
		return s.reserveOutcome(ctx, &res, unmapped)
	}
}

// Reserve implements LedgerService.Reserve.
func (s *Server) Reserve(ctx context.Context, req *connect.Request[v1.ReserveRequest]) (*connect.Response[v1.ReserveResponse], error) {
	out := s.reserveOne(ctx, req.Msg)
	s.metrics.command(ledger.KindReserve, out.metricOutcome())
	switch {
	case out.err != nil:
		return nil, out.err
	case out.res != nil:
		return nil, s.outcomeError(ctx, out.res)
	}
	return connect.NewResponse(out.resp), nil
}

// ReserveBatch implements LedgerService.ReserveBatch: every item that
// validates goes to the engine in one call (one transaction when it fits a
// batch); items whose mapping went stale are run again one by one.
func (s *Server) ReserveBatch(ctx context.Context, req *connect.Request[v1.ReserveBatchRequest]) (*connect.Response[v1.ReserveBatchResponse], error) {
	items := req.Msg.GetRequests()
	if cerr := checkBatchSize(len(items)); cerr != nil {
		s.refused(ledger.KindReserve, cerr) // the one answer the caller saw
		return nil, cerr
	}
	outcomes := make([]outcome[*v1.ReserveResponse], len(items))
	unmapped := make([]*connect.Error, len(items))
	var cmds []ledger.Command
	var sent []int
	for i, item := range items {
		cmd, why, invalid := s.reserveCommand(ctx, item)
		if invalid != nil && operatingFailure(invalid) {
			// A read the item needs failed (the store, a policy reload,
			// the caller's deadline): the call fails before any item is
			// sent, as SettleBatch's and with a single Reserve's status,
			// and is retried whole with the same ids.
			return nil, s.batchFailed(ledger.KindReserve, len(items), invalid)
		}
		if invalid != nil {
			outcomes[i].err = invalid
			continue
		}
		unmapped[i] = why
		cmds = append(cmds, cmd)
		sent = append(sent, i)
	}
	results, cerr := s.execBatch(ctx, ledger.KindReserve, cmds)
	if cerr != nil {
		return nil, s.batchFailed(ledger.KindReserve, len(items), cerr)
	}
	for j, i := range sent {
		if stale(&cmds[j], &results[j]) {
			outcomes[i] = s.reserveOne(ctx, items[i])
			continue
		}
		s.shadow.compare(&cmds[j], items[i].GetLegacyDecision(), &results[j])
		outcomes[i] = s.reserveOutcome(ctx, &results[j], unmapped[i])
	}
	resp := &v1.ReserveBatchResponse{Outcomes: make([]*v1.ReserveOutcome, len(items))}
	for i, out := range outcomes {
		s.metrics.command(ledger.KindReserve, out.metricOutcome())
		switch {
		case out.err != nil:
			resp.Outcomes[i] = &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Error{Error: itemFromConnect(out.err)}}
		case out.res != nil:
			resp.Outcomes[i] = &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Error{Error: s.itemError(ctx, out.res)}}
		default:
			resp.Outcomes[i] = &v1.ReserveOutcome{Outcome: &v1.ReserveOutcome_Ok{Ok: out.resp}}
		}
	}
	return connect.NewResponse(resp), nil
}

// batchFailed counts every item of a batch of kind that fails whole
// (cerr, an operating failure) once as unavailable, those refused before
// the ledger too: the caller saw no item's answer and sends them all
// again. It returns cerr.
func (s *Server) batchFailed(kind ledger.Kind, items int, cerr *connect.Error) *connect.Error {
	s.metrics.commandsAs(kind, outcomeUnavailable, items)
	return cerr
}

// checkBatchSize refuses a batch without items or with more than
// MaxBatchItems. An empty batch is refused rather than answered with no
// outcomes: JSON `"requests": null`, `[]` and a missing field all decode to
// no items, and a 200 `{}` would hide a client that lost its list (a
// wrong field name inside a nested object, a serializer writing null).
func checkBatchSize(n int) *connect.Error {
	switch {
	case n == 0:
		return invalidField(ReasonInvalidCommand, "requests", ": a batch needs at least one item (the field is missing, null or empty)")
	case n > MaxBatchItems:
		return invalidField(ReasonInvalidCommand, "requests", ": %d items in one batch; at most %d", n, MaxBatchItems)
	}
	return nil
}

// itemFromConnect carries a server-decided error as a batch item.
func itemFromConnect(cerr *connect.Error) *v1.ItemError {
	item := &v1.ItemError{Code: cerr.Code().String(), Message: cerr.Message()}
	for _, d := range cerr.Details() {
		msg, err := d.Value()
		if err != nil {
			continue
		}
		switch m := msg.(type) {
		case *v1.ErrorDetail:
			item.Detail = m
		case *v1.RejectionDetail:
			item.Rejection = m
		}
	}
	return item
}

// --- start, settle, release, unknown ---

// reservationResponse renders the reservation of a successful command.
func (s *Server) reservation(ctx context.Context, what string, res *ledger.Result) (*v1.Reservation, *connect.Error) {
	pb, err := s.reservationProto(ctx, &res.Reservation)
	if err != nil {
		return nil, appliedError(what+": render receipt", err)
	}
	return pb, nil
}

// Start implements LedgerService.Start.
func (s *Server) Start(ctx context.Context, req *connect.Request[v1.StartRequest]) (_ *connect.Response[v1.StartResponse], answer error) {
	if cerr := checkID("reservationId", req.Msg.GetReservationId()); cerr != nil {
		s.refused(ledger.KindStart, cerr)
		return nil, cerr
	}
	if cerr := checkID("operationId", req.Msg.GetOperationId()); cerr != nil {
		s.refused(ledger.KindStart, cerr)
		return nil, cerr
	}
	checked, cerr := s.checkReservationScope(ctx, "start", req.Msg.GetReservationId())
	if cerr != nil {
		s.refused(ledger.KindStart, cerr)
		return nil, cerr
	}
	res, cerr := s.exec(ctx, ledger.Command{Kind: ledger.KindStart, ReservationID: req.Msg.GetReservationId(), OperationID: req.Msg.GetOperationId(), CheckedAccount: checked})
	defer func() { s.countAnswer(ledger.KindStart, &res, answer) }()
	if cerr != nil {
		return nil, cerr
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, &res)
	}
	pb, cerr := s.reservation(ctx, "start", &res)
	if cerr != nil {
		return nil, cerr
	}
	return connect.NewResponse(&v1.StartResponse{Reservation: pb, Replayed: res.Replayed}), nil
}

// settleCommand validates a settle and maps its units by the reservation's
// own generation (immutable, so this mapping cannot go stale: the command
// is checked against the reservation's account).
func (s *Server) settleCommand(ctx context.Context, req *v1.SettleRequest) (ledger.Command, *connect.Error) {
	if cerr := checkID("reservationId", req.GetReservationId()); cerr != nil {
		return ledger.Command{}, cerr
	}
	if cerr := checkID("operationId", req.GetOperationId()); cerr != nil {
		return ledger.Command{}, cerr
	}
	if cerr := checkUnitValues("actualUnits", req.GetActualUnits(), true); cerr != nil {
		return ledger.Command{}, cerr
	}
	r, err := s.ledger.Reservation(ctx, req.GetReservationId())
	if cerr := s.storedOutOfScope(ctx, "settle", "reservation", req.GetReservationId(), r.Account, err, reservationNotFound); cerr != nil {
		return ledger.Command{}, cerr
	}
	if err != nil {
		return ledger.Command{}, notSentError("settle "+req.GetReservationId(), ReasonReservationNotFound, named(err, "reservation", req.GetReservationId()))
	}
	p, err := s.policies.get(ctx, r.Account.Generation)
	if err != nil {
		return ledger.Command{}, notSentError("settle "+req.GetReservationId(), ReasonPolicyNotFound, err)
	}
	units, cerr := amounts(&p, "actualUnits", req.GetActualUnits())
	if cerr != nil {
		return ledger.Command{}, cerr
	}
	if missing := unstated(&p, &r.Reserved, req.GetActualUnits()); missing != "" {
		return ledger.Command{}, invalidField(ReasonInvalidCommand, "actualUnits",
			"must state the usage of every unit it reserved (0 when none was used); missing %s", missing)
	}
	// The units are mapped by r's generation, and a scoped caller was
	// checked against r's account: the ledger settles r or nothing
	// (ledger.Command.CheckedAccount), never a reservation that took the
	// id since.
	return ledger.Command{Kind: ledger.KindSettle, ReservationID: r.ID, OperationID: req.GetOperationId(), Units: units,
		CheckedAccount: r.Account}, nil
}

func (s *Server) settleOutcome(ctx context.Context, res *ledger.Result) outcome[*v1.SettleResponse] {
	if res.Err != nil {
		return outcome[*v1.SettleResponse]{res: res}
	}
	pb, cerr := s.reservation(ctx, "settle", res)
	if cerr != nil {
		return outcome[*v1.SettleResponse]{err: cerr}
	}
	refunded, err := s.refundedProto(ctx, res)
	if err != nil {
		return outcome[*v1.SettleResponse]{err: appliedError("settle: render refund", err)}
	}
	return outcome[*v1.SettleResponse]{resp: &v1.SettleResponse{Reservation: pb, Replayed: res.Replayed, RefundedUnits: refunded}, label: outcomeLabel(res)}
}

// Settle implements LedgerService.Settle.
func (s *Server) Settle(ctx context.Context, req *connect.Request[v1.SettleRequest]) (*connect.Response[v1.SettleResponse], error) {
	cmd, cerr := s.settleCommand(ctx, req.Msg)
	if cerr != nil {
		s.refused(ledger.KindSettle, cerr)
		return nil, cerr
	}
	res, cerr := s.exec(ctx, cmd)
	if cerr != nil {
		s.metrics.command(ledger.KindSettle, outcomeUnavailable)
		return nil, cerr
	}
	out := s.settleOutcome(ctx, &res)
	s.metrics.command(ledger.KindSettle, out.metricOutcome())
	switch {
	case out.err != nil:
		return nil, out.err
	case out.res != nil:
		return nil, s.outcomeError(ctx, out.res)
	}
	if res.Reservation.State == ledger.StateSettledWithDebt && !res.Replayed {
		s.log.Info("settled with debt, admission frozen", "reservation", res.Reservation.ID,
			"account", res.Reservation.Account.String(), "breach", res.Reservation.Breach)
	}
	return connect.NewResponse(out.resp), nil
}

// SettleBatch implements LedgerService.SettleBatch.
func (s *Server) SettleBatch(ctx context.Context, req *connect.Request[v1.SettleBatchRequest]) (*connect.Response[v1.SettleBatchResponse], error) {
	items := req.Msg.GetRequests()
	if cerr := checkBatchSize(len(items)); cerr != nil {
		s.refused(ledger.KindSettle, cerr) // the one answer the caller saw
		return nil, cerr
	}
	outcomes := make([]outcome[*v1.SettleResponse], len(items))
	var cmds []ledger.Command
	var sent []int
	for i, item := range items {
		cmd, cerr := s.settleCommand(ctx, item)
		if cerr != nil {
			if operatingFailure(cerr) {
				// The item's reservation or policy could not be read (the
				// store, the caller's deadline): the call fails before
				// any item is sent, with a single Settle's status.
				return nil, s.batchFailed(ledger.KindSettle, len(items), cerr)
			}
			outcomes[i].err = cerr
			continue
		}
		cmds = append(cmds, cmd)
		sent = append(sent, i)
	}
	results, cerr := s.execBatch(ctx, ledger.KindSettle, cmds)
	if cerr != nil {
		return nil, s.batchFailed(ledger.KindSettle, len(items), cerr)
	}
	for j, i := range sent {
		outcomes[i] = s.settleOutcome(ctx, &results[j])
	}
	resp := &v1.SettleBatchResponse{Outcomes: make([]*v1.SettleOutcome, len(items))}
	for i, out := range outcomes {
		s.metrics.command(ledger.KindSettle, out.metricOutcome())
		switch {
		case out.err != nil:
			resp.Outcomes[i] = &v1.SettleOutcome{Outcome: &v1.SettleOutcome_Error{Error: itemFromConnect(out.err)}}
		case out.res != nil:
			resp.Outcomes[i] = &v1.SettleOutcome{Outcome: &v1.SettleOutcome_Error{Error: s.itemError(ctx, out.res)}}
		default:
			resp.Outcomes[i] = &v1.SettleOutcome{Outcome: &v1.SettleOutcome_Ok{Ok: out.resp}}
		}
	}
	return connect.NewResponse(resp), nil
}

// Release implements LedgerService.Release.
func (s *Server) Release(ctx context.Context, req *connect.Request[v1.ReleaseRequest]) (_ *connect.Response[v1.ReleaseResponse], answer error) {
	if cerr := checkID("reservationId", req.Msg.GetReservationId()); cerr != nil {
		s.refused(ledger.KindRelease, cerr)
		return nil, cerr
	}
	checked, cerr := s.checkReservationScope(ctx, "release", req.Msg.GetReservationId())
	if cerr != nil {
		s.refused(ledger.KindRelease, cerr)
		return nil, cerr
	}
	res, cerr := s.exec(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: req.Msg.GetReservationId(), CheckedAccount: checked})
	defer func() { s.countAnswer(ledger.KindRelease, &res, answer) }()
	if cerr != nil {
		return nil, cerr
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, &res)
	}
	pb, cerr := s.reservation(ctx, "release", &res)
	if cerr != nil {
		return nil, cerr
	}
	refunded, err := s.refundedProto(ctx, &res)
	if err != nil {
		return nil, appliedError("release: render refund", err)
	}
	return connect.NewResponse(&v1.ReleaseResponse{Reservation: pb, Replayed: res.Replayed, RefundedUnits: refunded}), nil
}

// MarkUsageUnknown implements LedgerService.MarkUsageUnknown.
func (s *Server) MarkUsageUnknown(ctx context.Context, req *connect.Request[v1.MarkUsageUnknownRequest]) (_ *connect.Response[v1.MarkUsageUnknownResponse], answer error) {
	if cerr := checkID("reservationId", req.Msg.GetReservationId()); cerr != nil {
		s.refused(ledger.KindMarkUsageUnknown, cerr)
		return nil, cerr
	}
	checked, cerr := s.checkReservationScope(ctx, "mark usage unknown", req.Msg.GetReservationId())
	if cerr != nil {
		s.refused(ledger.KindMarkUsageUnknown, cerr)
		return nil, cerr
	}
	res, cerr := s.exec(ctx, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: req.Msg.GetReservationId(), CheckedAccount: checked})
	defer func() { s.countAnswer(ledger.KindMarkUsageUnknown, &res, answer) }()
	if cerr != nil {
		return nil, cerr
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, &res)
	}
	pb, cerr := s.reservation(ctx, "mark usage unknown", &res)
	if cerr != nil {
		return nil, cerr
	}
	return connect.NewResponse(&v1.MarkUsageUnknownResponse{Reservation: pb, Replayed: res.Replayed}), nil
}

// --- reads ---

// GetReservation implements LedgerService.GetReservation.
func (s *Server) GetReservation(ctx context.Context, req *connect.Request[v1.GetReservationRequest]) (*connect.Response[v1.GetReservationResponse], error) {
	id := req.Msg.GetReservationId()
	if cerr := checkID("reservationId", id); cerr != nil {
		return nil, cerr
	}
	r, err := s.ledger.Reservation(ctx, id)
	if cerr := s.storedOutOfScope(ctx, "get reservation", "reservation", id, r.Account, err, reservationNotFound); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, readError("get reservation "+id, ReasonReservationNotFound, named(err, "reservation", id))
	}
	pb, err := s.reservationProto(ctx, &r)
	if err != nil {
		return nil, readError("get reservation "+id, ReasonPolicyNotFound, err)
	}
	return connect.NewResponse(&v1.GetReservationResponse{Reservation: pb}), nil
}

// GetAccount implements LedgerService.GetAccount. It reads one subject's
// accounts only: the subject and route are required, and rows of any other
// key are dropped even if a store returned them.
func (s *Server) GetAccount(ctx context.Context, req *connect.Request[v1.GetAccountRequest]) (*connect.Response[v1.GetAccountResponse], error) {
	key := ledger.PolicyKey{Subject: req.Msg.GetSubject(), Route: req.Msg.GetRoute(), Region: regionOrDefault(req.Msg.GetRegion())}
	if problem := oneSubjectProblem(key.Subject); problem != "" {
		return nil, invalidField(ReasonInvalidCommand, "subject", "%s", problem)
	}
	if key.Route == "" {
		return nil, invalidField(ReasonInvalidCommand, "route", "is required")
	}
	if s.outOfScope(ctx, "get account", key.Subject, key.Route, "", "") {
		// Answered as a subject that never reserved.
		return connect.NewResponse(&v1.GetAccountResponse{}), nil
	}
	// Each account with its generation's policy as read with it (one
	// snapshot: Ledger.AccountsView).
	accounts, view, err := s.ledger.AccountsView(ctx, key)
	if err != nil {
		return nil, readError("get account "+key.String(), ReasonAccountNotFound, err)
	}
	policies := pagePolicies{s: s, byGeneration: view.Policies}
	resp := &v1.GetAccountResponse{}
	for i := range accounts {
		a := &accounts[i]
		if a.Key.SubjectKey() != key {
			continue
		}
		p, cerr := policies.get(ctx, a.Key.Generation)
		if cerr != nil {
			return nil, cerr
		}
		resp.Accounts = append(resp.Accounts, accountProto(a, &p))
	}
	return connect.NewResponse(resp), nil
}

// Audit implements LedgerService.Audit.
//
// Uncapped (storecap.go): the audit takes as long as its rows need, but
// ends with 503 STORE_UNAVAILABLE, nothing changed, once its store has
// not answered one of its reads for the store timeout (scanBound).
func (s *Server) Audit(ctx context.Context, req *connect.Request[v1.AuditRequest]) (*connect.Response[v1.AuditResponse], error) {
	ctx, cancel := scanBound(ctx, s.storeTimeout)
	defer cancel()
	found, err := s.ledger.Audit(ctx)
	if err != nil {
		return nil, scanTimedOut(ctx, auditError(err))
	}
	return connect.NewResponse(s.auditResponse(ctx, found, auditModeFull)), nil
}

// The modes of an audit, as the console's audit status names them.
const (
	auditModeFull            = "full"
	auditModeSinceCheckpoint = "since_checkpoint"
)

// AuditReport is the answer of an audit that found found at checkedAt:
// what the server sends and `capledger audit --data-dir/--store` prints
// without one.
func AuditReport(found []ledger.Discrepancy, checkedAt time.Time) *v1.AuditResponse {
	resp := &v1.AuditResponse{CheckedAt: timestamp(checkedAt)}
	for _, d := range found {
		resp.Discrepancies = append(resp.Discrepancies, &v1.Discrepancy{
			Check: d.Check, Account: d.Account, ReservationId: d.Reservation, Detail: d.Detail,
		})
	}
	return resp
}

// auditResponse is the answer of an audit in mode that found found,
// logged when it is not empty.
func (s *Server) auditResponse(ctx context.Context, found []ledger.Discrepancy, mode string) *v1.AuditResponse {
	resp := AuditReport(found, time.Now())
	if len(found) > 0 {
		s.log.Warn("audit found discrepancies", "count", len(found), "first", found[0].String())
	}
	// Every audit answered, unary or streamed, feeds the seed's gate
	// metrics and the console's audit status: one place for both.
	s.recordGates(ctx, found, mode)
	s.console.audited(ctx, s.log, resp.GetCheckedAt().AsTime(), found, mode)
	return resp
}
