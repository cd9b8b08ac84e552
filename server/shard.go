package server

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
)

// ShardConfig enables issuance of emergency shards.
type ShardConfig struct {
	// Keys sign new shards and verify stored ones. Without a private key
	// the service still lists and reconciles, but issues nothing.
	Keys *ShardKeys
	// MaxTTL bounds a shard's lifetime (default DefaultMaxShardTTL).
	MaxTTL time.Duration
}

// DefaultMaxShardTTL is the longest shard lifetime a server grants unless
// configured otherwise.
const DefaultMaxShardTTL = 24 * time.Hour

// maxShardReceipts bounds one reconciliation submission.
const maxShardReceipts = 100_000

// maxShardStandings bounds the receipt ids of one GetShard.
const maxShardStandings = 10_000

func standingProto(s ledger.ShardReceiptStanding) v1.ShardReceiptStanding_Standing {
	switch s {
	case ledger.ShardReceiptPending:
		return v1.ShardReceiptStanding_STANDING_PENDING
	case ledger.ShardReceiptResolved:
		return v1.ShardReceiptStanding_STANDING_RESOLVED
	}
	return v1.ShardReceiptStanding_STANDING_NOT_PENDING
}

// Reasons of the shard service's ErrorDetail.
const (
	ReasonShardNotFound          = "SHARD_NOT_FOUND"
	ReasonShardAlreadyReconciled = "SHARD_ALREADY_RECONCILED"
	ReasonShardForeign           = "SHARD_FOREIGN"
	// ReasonShardReceiptContradicts: a later receipt releases or expires
	// work an earlier submission reported started (ledger.ErrShardReceiptContradicts).
	ReasonShardReceiptContradicts = "SHARD_RECEIPT_CONTRADICTS"
	ReasonShardIDReused           = "SHARD_ID_REUSED"
	ReasonEmergencyDisabled       = "EMERGENCY_DISABLED"
	ReasonShardsDisabled          = "SHARDS_DISABLED"
)

// shardErrors maps the shard outcomes the common table does not know.
var shardErrors = []struct {
	err    error
	code   connect.Code
	reason string
}{
	{ledger.ErrShardNotFound, connect.CodeNotFound, ReasonShardNotFound},
	{ledger.ErrShardAlreadyReconciled, connect.CodeFailedPrecondition, ReasonShardAlreadyReconciled},
	{ledger.ErrShardForeign, connect.CodeFailedPrecondition, ReasonShardForeign},
	{ledger.ErrShardReceiptContradicts, connect.CodeFailedPrecondition, ReasonShardReceiptContradicts},
	{ledger.ErrShardIDReused, connect.CodeAlreadyExists, ReasonShardIDReused},
	{ledger.ErrEmergencyDisabled, connect.CodeFailedPrecondition, ReasonEmergencyDisabled},
	{ledger.ErrLegacyWholeBlock, connect.CodeFailedPrecondition, ReasonLegacyWholeBlock},
}

// ReasonLegacyWholeBlock: a legacy budget's reconciliation would return
// its whole allocation (ledger.ErrLegacyWholeBlock).
const ReasonLegacyWholeBlock = "LEGACY_WHOLE_BLOCK"

// shardReads is what the service reads besides the Ledger interface
// (*engine.Engine has it).
type shardReads interface {
	Shards(ctx context.Context) ([]ledger.Shard, error)
	Shard(ctx context.Context, id string) (ledger.Shard, error)
	Meta(ctx context.Context, name string) (int64, error)
	Metas(ctx context.Context, names []string) ([]int64, error)
}

// shardService implements capledgerv1connect.ShardServiceHandler.
type shardService struct {
	s       *Server
	keys    *ShardKeys
	maxTTL  time.Duration
	reads   shardReads
	metrics *prometheus.CounterVec
}

var _ capledgerv1connect.ShardServiceHandler = (*shardService)(nil)

// registerShardService mounts the ShardService on mux with the server's
// handler options (auth, size limit). cfg may be nil: shards are then read
// and reconciled but not issued.
func registerShardService(mux *http.ServeMux, s *Server, cfg *ShardConfig, options []connect.HandlerOption) {
	svc := &shardService{s: s, maxTTL: DefaultMaxShardTTL}
	if cfg != nil {
		svc.keys = cfg.Keys
		if cfg.MaxTTL > 0 {
			svc.maxTTL = cfg.MaxTTL
		}
	}
	svc.reads, _ = s.ledger.(shardReads)
	svc.metrics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capledger_shard_commands_total",
		Help: "Shard issuance and reconciliation commands answered, by kind and outcome: ok, replayed, unavailable, or the lower-case reason, refusals before the ledger included (shard_not_found, shards_disabled, invalid_command; refused submissions are shard_already_reconciled and shard_foreign); not 401/403 (a token refused, a gateway token acting for another gateway).",
	}, []string{"kind", "outcome"})
	if err := s.metrics.registry.Register(svc.metrics); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			svc.metrics = already.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	s.shards = svc
	path, handler := capledgerv1connect.NewShardServiceHandler(svc, options...)
	mountProcedures(mux, path, handler, v1.File_capledger_v1_shard_proto.Services().ByName("ShardService"))
}

// refused counts a refusal decided before the ledger (the command's
// shape, the token's scope, the policy's units) in
// capledger_shard_commands_total under its reason, as do counts the
// ledger's answers and Server.refused a Reserve's, and returns cerr.
func (svc *shardService) refused(kind ledger.Kind, cerr *connect.Error) *connect.Error {
	svc.metrics.WithLabelValues(kind.String(), refusalOutcome(cerr)).Inc()
	return cerr
}

// do runs one shard command whose result is the answer as it is, maps
// its outcome (exec) and counts it.
func (svc *shardService) do(ctx context.Context, cmd ledger.Command) (ledger.Result, *connect.Error) {
	res, cerr := svc.exec(ctx, cmd)
	svc.count(cmd.Kind, &res, cerr)
	return res, cerr
}

// exec runs one shard command and maps its outcome: nil error and the
// result on success; the mapped connect error otherwise. It counts
// nothing (IssueShard counts the answer after a stale refusal was mapped
// again).
func (svc *shardService) exec(ctx context.Context, cmd ledger.Command) (ledger.Result, *connect.Error) {
	res, err := svc.s.ledger.Do(ctx, cmd)
	if err != nil {
		return res, operatingError(cmd.Kind.String(), err)
	}
	if res.Err == nil {
		return res, nil
	}
	for _, e := range shardErrors {
		if errors.Is(res.Err, e.err) {
			return res, withReason(connect.NewError(e.code, res.Err), e.reason)
		}
	}
	return res, svc.s.outcomeError(ctx, &res)
}

// count counts one answered shard command of kind in
// capledger_shard_commands_total: ok or replayed, else the outcome of the
// error answered (refusalOutcome: unavailable for an operating failure).
func (svc *shardService) count(kind ledger.Kind, res *ledger.Result, cerr *connect.Error) {
	outcome := "ok"
	switch {
	case cerr != nil:
		outcome = refusalOutcome(cerr)
	case res.Replayed:
		outcome = "replayed"
	}
	svc.metrics.WithLabelValues(kind.String(), outcome).Inc()
}

// IssueShard implements ShardService.IssueShard. The door (checkText)
// checked the gateway id and the token's right to act for it: with auth
// on, a gateway token may issue shards only for the gateway id equal to
// its token name (PERMISSION_DENIED otherwise, before anything is
// carved); admin tokens may issue for any gateway.
func (svc *shardService) IssueShard(ctx context.Context, req *connect.Request[v1.IssueShardRequest]) (*connect.Response[v1.IssueShardResponse], error) {
	m := req.Msg
	if cerr := checkID("shardId", m.GetShardId()); cerr != nil {
		return nil, svc.refused(ledger.KindShardIssue, cerr)
	}
	return svc.issue(ctx, m, false)
}

// issue carves a shard (legacy: a legacy limiter's budget, for
// RolloutService.CarveLegacyBudget) once the caller was authorized.
func (svc *shardService) issue(ctx context.Context, m *v1.IssueShardRequest, legacy bool) (*connect.Response[v1.IssueShardResponse], error) {
	if cerr := checkUnitValues("units", m.GetUnits(), false); cerr != nil {
		return nil, svc.refused(ledger.KindShardIssue, cerr)
	}
	ttl, err := durationFromProto(ledger.ErrInvalidCommand, "ttl", m.GetTtl())
	if err != nil {
		return nil, svc.refused(ledger.KindShardIssue, fieldRefusal(ReasonInvalidCommand, "", err))
	}
	// The rest of the shape, by the ledger's own rule, before the scope
	// and the shard id (API.md, "Order of checks"), as for a Reserve.
	region := regionOrDefault(m.GetRegion())
	if problem := ledger.ShardShapeProblem(m.GetSubject(), m.GetRoute(), region, m.GetBootEpoch(), ttl, slices.Collect(maps.Values(m.GetUnits()))); problem != nil {
		return nil, svc.refused(ledger.KindShardIssue, refuseField(ReasonInvalidCommand, problem))
	}
	if ttl > svc.maxTTL {
		return nil, svc.refused(ledger.KindShardIssue, invalidField(ReasonInvalidCommand, "ttl", "%s is outside (0, %s]", ledger.DurationText(ttl), ledger.DurationText(svc.maxTTL)))
	}
	key := ledger.PolicyKey{Subject: m.GetSubject(), Route: m.GetRoute(), Region: region}
	if cerr := svc.s.subjectOutOfScope(ctx, "issue shard", key); cerr != nil {
		return nil, svc.refused(ledger.KindShardIssue, cerr)
	}
	if svc.keys == nil {
		return nil, svc.refused(ledger.KindShardIssue, withReason(connect.NewError(connect.CodeFailedPrecondition, errors.New("this server has no shard signing keys")), ReasonShardsDisabled))
	}
	keyID, sign, ok := svc.keys.Signer()
	if !ok {
		return nil, svc.refused(ledger.KindShardIssue, withReason(connect.NewError(connect.CodeFailedPrecondition, errors.New("this server's shard keys hold no private key")), ReasonShardsDisabled))
	}
	for attempt := 0; ; attempt++ {
		// The units by the deciding policy, as a Reserve maps them: a
		// cache that predates a generation published through another
		// replica is reloaded (rate-limited) before NO_POLICY or
		// UNKNOWN_UNIT is answered.
		p, units, refusal, cerr := svc.s.mapActive(ctx, key, "units", m.GetUnits(), "issue shard")
		if cerr != nil {
			return nil, svc.refused(ledger.KindShardIssue, cerr)
		}
		if refusal != nil {
			return nil, svc.refused(ledger.KindShardIssue, refusal)
		}
		cmd := ledger.Command{
			Kind: ledger.KindShardIssue, Subject: key.Subject, Route: key.Route, Region: key.Region,
			Units: units, Generation: p.Generation,
			Shard: &ledger.ShardArgs{ShardID: m.GetShardId(), GatewayID: m.GetGatewayId(), BootEpoch: m.GetBootEpoch(),
				TTL: ttl, KeyID: keyID, Sign: sign, Legacy: legacy},
		}
		res, cerr := svc.exec(ctx, cmd)
		// Another generation decides than the cache said (a stale refusal
		// always comes with cerr): reload, map again. The stale refusal is
		// no answer, and is not counted; the next attempt's is.
		if again, rerr := svc.s.mapAgain(ctx, "issue shard", attempt, &cmd, &res); rerr != nil {
			return nil, svc.refused(ledger.KindShardIssue, rerr)
		} else if again {
			continue
		}
		resp, cerr := svc.issued(ctx, m.GetShardId(), &res, cerr)
		svc.count(ledger.KindShardIssue, &res, cerr)
		if cerr != nil {
			return nil, cerr
		}
		return connect.NewResponse(resp), nil
	}
}

// issued is the answer to an IssueShard of shardID whose command the
// ledger answered with res and cerr (exec).
func (svc *shardService) issued(ctx context.Context, shardID string, res *ledger.Result, cerr *connect.Error) (*v1.IssueShardResponse, *connect.Error) {
	if cerr != nil {
		if res.Shard != nil && svc.s.outOfScope(ctx, "issue shard", res.Shard.Account.Subject, res.Shard.Account.Route, "shard", shardID) {
			return nil, shardIDTaken(shardID)
		}
		return nil, cerr
	}
	if svc.s.outOfScope(ctx, "issue shard", res.Shard.Account.Subject, res.Shard.Account.Route, "shard", shardID) {
		return nil, shardIDTaken(shardID) // a replay of another tenant's shard id
	}
	pb, err := svc.shardProto(ctx, res.Shard, true)
	if err != nil {
		return nil, appliedError("issue shard: render", err)
	}
	return &v1.IssueShardResponse{Shard: pb, Replayed: res.Replayed}, nil
}

// GetShard implements ShardService.GetShard.
func (svc *shardService) GetShard(ctx context.Context, req *connect.Request[v1.GetShardRequest]) (*connect.Response[v1.GetShardResponse], error) {
	if cerr := checkID("shardId", req.Msg.GetShardId()); cerr != nil {
		return nil, cerr
	}
	ids := req.Msg.GetReceiptIds()
	if len(ids) > maxShardStandings {
		return nil, invalidField(ReasonInvalidCommand, "receiptIds", ": %d given; at most %d per call", len(ids), maxShardStandings)
	}
	// An empty id names no receipt: refused, not answered NOT_PENDING.
	for i, id := range ids {
		if cerr := checkID(ledger.ItemPath("receiptIds", i), id); cerr != nil {
			return nil, cerr
		}
	}
	if svc.reads == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this ledger cannot read shards"))
	}
	sh, err := svc.reads.Shard(ctx, req.Msg.GetShardId())
	if cerr := svc.s.storedOutOfScope(ctx, "get shard", "shard", req.Msg.GetShardId(), sh.Account, err, shardNotFound); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		return nil, readError("get shard "+req.Msg.GetShardId(), ReasonShardNotFound, named(err, "shard", req.Msg.GetShardId()))
	}
	pb, err := svc.shardProto(ctx, &sh, true)
	if err != nil {
		return nil, readError("get shard: render", ReasonPolicyNotFound, err)
	}
	resp := &v1.GetShardResponse{Shard: pb}
	if len(ids) > 0 {
		for _, id := range ids {
			v, err := svc.reads.Meta(ctx, ledger.MetaShardReceipt(sh.ID, id))
			if err != nil {
				return nil, readError("get shard "+sh.ID+": receipt "+id, ReasonShardNotFound, err)
			}
			resp.Receipts = append(resp.Receipts, &v1.ShardReceiptStanding{ReservationId: id, Standing: standingProto(ledger.ShardReceiptStandingOf(v))})
		}
	}
	return connect.NewResponse(resp), nil
}

// ListShards implements ShardService.ListShards.
func (svc *shardService) ListShards(ctx context.Context, req *connect.Request[v1.ListShardsRequest]) (*connect.Response[v1.ListShardsResponse], error) {
	if svc.reads == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this ledger cannot read shards"))
	}
	if problem := subjectFilterProblem(req.Msg.GetSubject()); problem != "" {
		return nil, invalidField(ReasonInvalidCommand, "subject", "%s", problem)
	}
	all, err := svc.reads.Shards(ctx)
	if err != nil {
		return nil, readError("list shards", ReasonShardNotFound, err)
	}
	m := req.Msg
	slices.SortFunc(all, func(a, b ledger.Shard) int {
		if c := a.IssuedAt.Compare(b.IssuedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	resp := &v1.ListShardsResponse{}
	for i := range all {
		sh := &all[i]
		if (m.GetSubject() != "" && sh.Account.Subject != m.GetSubject()) ||
			(m.GetRoute() != "" && sh.Account.Route != m.GetRoute()) ||
			(m.GetRegion() != "" && sh.Account.Region != m.GetRegion()) ||
			(m.GetGatewayId() != "" && sh.GatewayID != m.GetGatewayId()) ||
			(m.GetUnreconciledOnly() && sh.Reconciled) || !InScope(ctx, sh.Account.Subject, sh.Account.Route) {
			continue
		}
		pb, err := svc.shardProto(ctx, sh, false)
		if err != nil {
			return nil, readError("list shards: render", ReasonPolicyNotFound, err)
		}
		resp.Shards = append(resp.Shards, pb)
	}
	// Each listed shard's refused submissions, read in one transaction
	// (the console's Shards page sums them).
	names := make([]string, len(resp.Shards))
	for i, pb := range resp.Shards {
		names[i] = ledger.MetaShardRefusedFor(pb.GetShardId())
	}
	refused, err := svc.reads.Metas(ctx, names)
	if err != nil {
		return nil, readError("list shards: refusals", ReasonShardNotFound, err)
	}
	for i, pb := range resp.Shards {
		pb.RefusedSubmissions = refused[i]
	}
	return connect.NewResponse(resp), nil
}

// ReconcileShard implements ShardService.ReconcileShard. With auth on, a
// gateway token may reconcile only as the gateway id equal to its token
// name (PERMISSION_DENIED otherwise, before anything is read or applied);
// the ledger then refuses a shard of another gateway (SHARD_FOREIGN).
// Admin tokens may reconcile for any gateway.
func (svc *shardService) ReconcileShard(ctx context.Context, req *connect.Request[v1.ReconcileShardRequest]) (*connect.Response[v1.ReconcileShardResponse], error) {
	m := req.Msg
	// The door (checkText) checked the gateway id and the token's right
	// to act for it.
	if cerr := checkID("shardId", m.GetShardId()); cerr != nil {
		return nil, svc.refused(ledger.KindShardReconcile, cerr)
	}
	if len(m.GetReceipts()) > maxShardReceipts {
		return nil, svc.refused(ledger.KindShardReconcile, invalidField(ReasonInvalidCommand, "receipts", ": %d given; at most %d per submission", len(m.GetReceipts()), maxShardReceipts))
	}
	shapes := make([]ledger.ShardReceipt, len(m.GetReceipts()))
	for i, r := range m.GetReceipts() {
		// A receipt id is a reservation id, checked as GetShard checks
		// its receipt_ids (present, at most 256 bytes, no NUL byte, which
		// the PostgreSQL store cannot keep and answers unavailable).
		if cerr := checkID(ledger.FieldPath(ledger.ItemPath("receipts", i), "reservationId"), r.GetReservationId()); cerr != nil {
			return nil, svc.refused(ledger.KindShardReconcile, cerr)
		}
		state, ok := stateFromProto(r.GetState())
		if !ok {
			return nil, svc.refused(ledger.KindShardReconcile, receiptStateProblem(i, r.GetState()))
		}
		shapes[i] = ledger.ShardReceipt{ReservationID: r.GetReservationId(), State: state}
		if cerr := checkUnitValues(ledger.FieldPath(ledger.ItemPath("receipts", i), "reservedUnits"), r.GetReservedUnits(), true); cerr != nil {
			return nil, svc.refused(ledger.KindShardReconcile, cerr)
		}
		if cerr := checkUnitValues(ledger.FieldPath(ledger.ItemPath("receipts", i), "actualUnits"), r.GetActualUnits(), true); cerr != nil {
			return nil, svc.refused(ledger.KindShardReconcile, cerr)
		}
	}
	// The ids and states by the ledger's own rule, before the shard is
	// read: a malformed submission is INVALID_COMMAND whatever the shard
	// id names (unknown, another gateway's, reconciled), never a refusal
	// counted against the shard.
	if err := ledger.CheckShardReceipts(shapes, nil); err != nil {
		return nil, svc.refused(ledger.KindShardReconcile, fieldRefusal(ReasonInvalidCommand, "", err))
	}
	if svc.reads == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this ledger cannot read shards"))
	}
	// The receipts' units are named by the shard's own generation.
	sh, err := svc.reads.Shard(ctx, m.GetShardId())
	if cerr := svc.s.storedOutOfScope(ctx, "reconcile shard", "shard", m.GetShardId(), sh.Account, err, shardNotFound); cerr != nil {
		return nil, svc.refused(ledger.KindShardReconcile, cerr)
	}
	if err != nil {
		// SHARD_NOT_FOUND (never issued, or retention removed it after
		// its reconciliation) or the read's failure: answered, so counted.
		return nil, svc.refused(ledger.KindShardReconcile, notSentError("reconcile shard "+m.GetShardId(), ReasonShardNotFound, named(err, "shard", m.GetShardId())))
	}
	p, err := svc.s.policies.get(ctx, sh.Account.Generation)
	if err != nil {
		return nil, svc.refused(ledger.KindShardReconcile, notSentError("reconcile shard: policy", ReasonPolicyNotFound, err))
	}
	receipts := make([]ledger.ShardReceipt, len(m.GetReceipts()))
	for i, r := range m.GetReceipts() {
		state, ok := stateFromProto(r.GetState())
		if !ok {
			return nil, svc.refused(ledger.KindShardReconcile, receiptStateProblem(i, r.GetState()))
		}
		reserved, cerr := amounts(&p, ledger.FieldPath(ledger.ItemPath("receipts", i), "reservedUnits"), r.GetReservedUnits())
		if cerr != nil {
			return nil, svc.refused(ledger.KindShardReconcile, cerr)
		}
		actual, cerr := amounts(&p, ledger.FieldPath(ledger.ItemPath("receipts", i), "actualUnits"), r.GetActualUnits())
		if cerr != nil {
			return nil, svc.refused(ledger.KindShardReconcile, cerr)
		}
		receipts[i] = ledger.ShardReceipt{ReservationID: r.GetReservationId(), State: state, Reserved: reserved, Actual: actual}
	}
	res, cerr := svc.do(ctx, ledger.Command{Kind: ledger.KindShardReconcile,
		Shard: &ledger.ShardArgs{ShardID: m.GetShardId(), GatewayID: m.GetGatewayId(), Receipts: receipts}})
	if cerr != nil {
		return nil, cerr
	}
	pb, err := svc.shardProto(ctx, res.Shard, true)
	if err != nil {
		return nil, appliedError("reconcile shard: render", err)
	}
	resp := &v1.ReconcileShardResponse{Shard: pb}
	if mv := res.Move; mv != nil {
		// Move amounts are in the shard generation's dimension order.
		resp.RemintedUnits = unitsMap(&p, &mv.Units)
		resp.DebtUnits = unitsMap(&p, &mv.Debt)
		resp.MoveReceiptId = mv.ReceiptID
		resp.RemintGeneration = mv.To.Generation
	}
	return connect.NewResponse(resp), nil
}

// ListShardKeys implements ShardService.ListShardKeys.
func (svc *shardService) ListShardKeys(ctx context.Context, req *connect.Request[v1.ListShardKeysRequest]) (*connect.Response[v1.ListShardKeysResponse], error) {
	resp := &v1.ListShardKeysResponse{}
	if svc.keys != nil {
		for _, k := range svc.keys.Keys() {
			resp.Keys = append(resp.Keys, &v1.ShardKey{KeyId: k.KeyID, PublicKey: k.PublicKey, Signing: k.Signing})
		}
	}
	return connect.NewResponse(resp), nil
}

// shardProto renders a shard with its units by name, whether its signature
// verifies under the server's keys now and, with withRefusals, its count of
// refused submissions (one counter read; ListShards reads the list's
// counters in one transaction instead).
func (svc *shardService) shardProto(ctx context.Context, sh *ledger.Shard, withRefusals bool) (*v1.Shard, error) {
	p, err := svc.s.policies.get(ctx, sh.Account.Generation)
	if err != nil {
		return nil, err
	}
	units := make([]string, len(p.Dimensions))
	for i := range p.Dimensions {
		units[i] = p.Dimensions[i].Unit
	}
	pb := &v1.Shard{
		Schema:           ledger.SchemaShard,
		ShardId:          sh.ID,
		Subject:          sh.Account.Subject,
		Route:            sh.Account.Route,
		Region:           sh.Account.Region,
		PolicyGeneration: sh.Account.Generation,
		GatewayId:        sh.GatewayID,
		BootEpoch:        sh.BootEpoch,
		Fence:            sh.Fence,
		AllocatedUnits:   unitsMap(&p, &sh.Allocated),
		IssuedAt:         timestamp(sh.IssuedAt),
		ExpiresAt:        timestamp(sh.ExpiresAt),
		KeyId:            sh.KeyID,
		Signature:        sh.Signature,
		Token:            ledger.EncodeShardToken(sh),
		Units:            units,
		Reconciled:       sh.Reconciled,
	}
	if sh.Reconciled {
		pb.SpentUnits = unitsMap(&p, &sh.Spent)
		pb.UnknownUnits = unitsMap(&p, &sh.Unknown)
		pb.RemintedUnits = unitsMap(&p, &sh.Reminted)
	}
	if svc.keys != nil {
		pb.SignatureValid = ledger.VerifyShardSignature(sh, svc.keys) == nil
	}
	if svc.reads != nil && withRefusals {
		refused, err := svc.reads.Meta(ctx, ledger.MetaShardRefusedFor(sh.ID))
		if err != nil {
			return nil, err
		}
		pb.RefusedSubmissions = refused
	}
	return pb, nil
}

// receiptStateProblem is the refusal of receipt i's state when
// stateFromProto knows none for it: 400 INVALID_COMMAND naming the field
// by its path, as every other check of a receipt does
// ("receipts[0].state is required").
func receiptStateProblem(i int, s v1.ReservationState) *connect.Error {
	if s == v1.ReservationState_RESERVATION_STATE_UNSPECIFIED {
		return invalidField(ReasonInvalidCommand, ledger.FieldPath(ledger.ItemPath("receipts", i), "state"), "is required")
	}
	return invalidField(ReasonInvalidCommand, ledger.FieldPath(ledger.ItemPath("receipts", i), "state"), "%s is no reservation state", s)
}

// stateFromProto is the inverse of stateToProto for the states a receipt
// may carry.
func stateFromProto(s v1.ReservationState) (ledger.State, bool) {
	for state, pb := range stateToProto {
		if pb == s && s != v1.ReservationState_RESERVATION_STATE_UNSPECIFIED {
			return state, true
		}
	}
	return 0, false
}
