package server

import (
	"context"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
)

// This file is the one place where the server applies the rule for the
// text a client names things with (ledger.TextProblem: no NUL byte,
// valid UTF-8, at most the field's bound) to every request of every
// service: LedgerService, ShardService, ConsoleService, RolloutService
// and AuditService, over Connect (JSON and protobuf, POST and GET),
// gRPC-Web and gRPC (net/http, grpc-go's bridge and its direct methods),
// and Envoy's rate limit service through reserveCommand, settleCommand and
// recordCommand. A field is ruled by its name, whatever message holds it,
// so a method added later is covered by adding nothing; a string field
// or a map with a new name must be given a rule here
// (TestEveryNamingFieldIsBounded fails until it is). The keys of a units
// map are unit names, ruled by unitNameProblem.

// textRule is the bound of one kind of field: the most bytes it may hold
// (0: no bound, only NUL and UTF-8 are checked).
type textRule struct{ max int }

var (
	keyText     = textRule{ledger.MaxKeyBytes}
	idText      = textRule{ledger.MaxIDBytes}
	rolloutText = textRule{ledger.MaxRolloutNameBytes}
	// legacyIdentityText bounds a legacy limiter's identity so that its
	// budgets' gateway id, ledger.LegacyGateway(identity), is an id: a
	// longer one carved a budget no ReconcileShard could name.
	legacyIdentityText = textRule{ledger.MaxIDBytes - len(ledger.LegacyGatewayPrefix)}
	freeText           = textRule{}
)

// textFields names every string field of a request and its rule. Fields
// the server checks against a fixed set of values (hash_by, mode,
// legacy_decision, schema) or opens as its own sealed token (page_token)
// are not text a client names things with, and are left out.
var textFields = map[protoreflect.Name]textRule{
	"subject":          keyText,
	"route":            keyText,
	"region":           keyText,
	"subject_contains": keyText,
	"reservation_id":   idText,
	"reservation_ids":  idText,
	"receipt_ids":      idText,
	"operation_id":     idText,
	"shard_id":         idText,
	"gateway_id":       idText,
	"budget_id":        idText,
	"identity":         legacyIdentityText,
	"name":             rolloutText,
	"request_digest":   freeText,
	"estimator_digest": freeText,
	"unit":             freeText,
}

// unitMaps are the maps of requests keyed by unit name (units, and the
// actual and reserved units of settles, records and shard receipts), each
// with the generated getter that reads it: the Go map is walked as it is,
// where protoreflect's Range allocated for every key (the door's check
// of a Reserve took 5x as long).
var unitMaps = map[protoreflect.Name]func(proto.Message) map[string]int64{
	"units":          unitMap(unitsGetter.GetUnits),
	"actual_units":   unitMap(actualUnitsGetter.GetActualUnits),
	"reserved_units": unitMap(reservedUnitsGetter.GetReservedUnits),
}

// The generated getters of the units maps.
type (
	unitsGetter         interface{ GetUnits() map[string]int64 }
	actualUnitsGetter   interface{ GetActualUnits() map[string]int64 }
	reservedUnitsGetter interface{ GetReservedUnits() map[string]int64 }
)

// unitMap returns the reader of one units map by its generated getter
// get: the map of a message that has the getter, nil for one that has
// not (not a generated message: checkUnitValues checks its units).
func unitMap[G any](get func(G) map[string]int64) func(proto.Message) map[string]int64 {
	return func(m proto.Message) map[string]int64 {
		if g, ok := m.(G); ok {
			return get(g)
		}
		return nil
	}
}

// unitNameProblem is the door's rule for a unit name a command states (a
// key of a units map): not empty, free of NUL and valid UTF-8. It returns
// 400 INVALID_COMMAND naming field, not the name ("units: a unit name
// contains a NUL byte"); nil for a good name. The door applies it to
// every units map (textProblem), checkUnitValues to the batch items and
// adapters' requests that come without the door. Its length is ruled
// where the units are mapped (unmappedUnitName), not here: a generation
// published before the bound may hold a longer unit, and its reserves and
// settles must keep working (README, upgrade note).
func unitNameProblem(field, name string) *connect.Error {
	problem := ledger.TextProblem(name, 0)
	if name == "" {
		problem = "is empty"
	}
	if problem == "" {
		return nil
	}
	return invalidField(ReasonInvalidCommand, field, ": a unit name %s", problem)
}

// unmappedUnitName is the answer to a unit name that the generation a
// command is mapped by does not have: 400 INVALID_COMMAND without quoting
// it when it is over a policy unit's bound, ledger.MaxUnitBytes, which no
// generation published now can have ("units: a unit name is 300 bytes
// long; at most 128"; it was UNKNOWN_UNIT quoting the whole name, which
// may be as long as the request), else UNKNOWN_UNIT naming it and the
// units generation p has. Either message says what is wrong with nothing
// before it but field ("actualUnits: unknown unit ..."), whichever command
// asked (API.md, "Errors"), as the door's own check of the same map does.
func unmappedUnitName(field, name string, p *ledger.Policy) *connect.Error {
	if problem := ledger.TextProblem(name, ledger.MaxUnitBytes); problem != "" {
		return invalidField(ReasonInvalidCommand, field, ": a unit name %s", problem)
	}
	return invalidField(ReasonUnknownUnit, field, ": unknown unit %q: policy generation %d limits %s", name, p.Generation, unitList(p))
}

// notText are the string fields of requests that textFields leaves out
// on purpose (see there).
var notText = map[protoreflect.Name]bool{"page_token": true, "hash_by": true, "mode": true, "legacy_decision": true, "schema": true}

// fieldReasons is the reason a refused field answers with, by the message
// that holds it: a policy's fields are INVALID_POLICY and a rollout's
// INVALID_ROLLOUT (as the ledger's own checks of them answer), every other
// INVALID_COMMAND.
var fieldReasons = map[protoreflect.FullName]string{
	"capledger.v1.Policy":                 ReasonInvalidPolicy,
	"capledger.v1.Dimension":              ReasonInvalidPolicy,
	"capledger.v1.CreateRolloutRequest":   ReasonInvalidRollout,
	"capledger.v1.RolloutRoute":           ReasonInvalidRollout,
	"capledger.v1.GetRolloutRequest":      ReasonInvalidRollout,
	"capledger.v1.SetRolloutShareRequest": ReasonInvalidRollout,
	"capledger.v1.UndoRolloutStepRequest": ReasonInvalidRollout,
	"capledger.v1.EndRolloutRequest":      ReasonInvalidRollout,
}

// batchItems are the fields whose items the handler checks one by one
// (reserveCommand, settleCommand), so that a bad item fails alone and the
// others proceed (API.md, "Order of checks"): the door leaves them.
var batchItems = map[protoreflect.FullName]bool{
	"capledger.v1.ReserveBatchRequest.requests": true,
	"capledger.v1.SettleBatchRequest.requests":  true,
}

// textPlan is what checking one message type reads: its ruled string
// fields and its message fields to descend into.
type textPlan struct {
	text     []protoreflect.FieldDescriptor
	rules    []textRule
	units    []protoreflect.FieldDescriptor
	unitsOf  []func(proto.Message) map[string]int64
	messages []protoreflect.FieldDescriptor
	reason   string
}

var textPlans sync.Map // protoreflect.FullName -> *textPlan

func planOf(md protoreflect.MessageDescriptor) *textPlan {
	if p, ok := textPlans.Load(md.FullName()); ok {
		return p.(*textPlan)
	}
	p := &textPlan{reason: ReasonInvalidCommand}
	if r, ok := fieldReasons[md.FullName()]; ok {
		p.reason = r
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			if get, ok := unitMaps[fd.Name()]; ok {
				p.units = append(p.units, fd)
				p.unitsOf = append(p.unitsOf, get)
			}
		case fd.Kind() == protoreflect.StringKind:
			if rule, ok := textFields[fd.Name()]; ok {
				p.text = append(p.text, fd)
				p.rules = append(p.rules, rule)
			}
		case fd.Kind() == protoreflect.MessageKind && !batchItems[fd.FullName()]:
			p.messages = append(p.messages, fd)
		}
	}
	textPlans.Store(md.FullName(), p)
	return p
}

// textProblem checks every ruled string field of m and of the messages it
// holds (but batch items) by ledger.TextProblem, and returns the first
// failure as 400 invalid_argument with the holding message's reason, the
// message naming the field's path as the JSON spells it
// (`receipts[2].reservationId contains a NUL byte`); nil when every field is good. Empty fields pass: whether a
// field is required is its handler's rule.
func textProblem(m protoreflect.Message) *connect.Error {
	return textProblemAt(m, "")
}

// textProblemAt is textProblem of m, the message at path in the request
// ("" for the request itself), naming fields by ledger.FieldPath.
func textProblemAt(m protoreflect.Message, path string) *connect.Error {
	p := planOf(m.Descriptor())
	for i, fd := range p.text {
		if fd.IsList() {
			list := m.Get(fd).List()
			for j := 0; j < list.Len(); j++ {
				if problem := ledger.TextProblem(list.Get(j).String(), p.rules[i].max); problem != "" {
					return invalidField(p.reason, ledger.ItemPath(ledger.FieldPath(path, fd.JSONName()), j), "%s", problem)
				}
			}
			continue
		}
		if problem := ledger.TextProblem(m.Get(fd).String(), p.rules[i].max); problem != "" {
			return invalidField(p.reason, ledger.FieldPath(path, fd.JSONName()), "%s", problem)
		}
	}
	for i, fd := range p.units {
		if name, bad := firstBadUnitName(p.unitsOf[i](m.Interface())); bad {
			return unitNameProblem(ledger.FieldPath(path, fd.JSONName()), name)
		}
	}
	for _, fd := range p.messages {
		if !m.Has(fd) {
			continue
		}
		if fd.IsList() {
			list := m.Get(fd).List()
			for j := 0; j < list.Len(); j++ {
				if cerr := textProblemAt(list.Get(j).Message(), ledger.ItemPath(ledger.FieldPath(path, fd.JSONName()), j)); cerr != nil {
					return cerr
				}
			}
			continue
		}
		if cerr := textProblemAt(m.Get(fd).Message(), ledger.FieldPath(path, fd.JSONName())); cerr != nil {
			return cerr
		}
	}
	return nil
}

// firstBadUnitName returns the first name of units (in sorted order,
// whatever order the map iterates in, as checkUnitValues) that
// unitNameProblem refuses; bad is false when every name is good.
func firstBadUnitName(units map[string]int64) (name string, bad bool) {
	for n := range units {
		if (!bad || n < name) && unitNameProblem("", n) != nil {
			name, bad = n, true
		}
	}
	return name, bad
}

// countedRefusals are the methods whose refusals before the ledger count
// in capledger_commands_total (as their handlers count the others).
var countedRefusals = map[string]ledger.Kind{
	capledgerv1connect.LedgerServiceReserveProcedure:          ledger.KindReserve,
	capledgerv1connect.LedgerServiceStartProcedure:            ledger.KindStart,
	capledgerv1connect.LedgerServiceSettleProcedure:           ledger.KindSettle,
	capledgerv1connect.LedgerServiceReleaseProcedure:          ledger.KindRelease,
	capledgerv1connect.LedgerServiceMarkUsageUnknownProcedure: ledger.KindMarkUsageUnknown,
	capledgerv1connect.LedgerServiceRecordUsageProcedure:      ledger.KindRecord,
}

// countedShardRefusals are the shard methods whose refusals before the
// ledger count in capledger_shard_commands_total.
var countedShardRefusals = map[string]ledger.Kind{
	capledgerv1connect.ShardServiceIssueShardProcedure:     ledger.KindShardIssue,
	capledgerv1connect.ShardServiceReconcileShardProcedure: ledger.KindShardReconcile,
}

// checkRequestText is the door's check of a request (msg) to procedure,
// after authentication (checkText), counting a refused command in the
// command metrics as its handler would.
func (s *Server) checkRequestText(ctx context.Context, procedure string, msg any) *connect.Error {
	cerr := checkText(ctx, procedure, msg)
	if cerr == nil || cerr.Code() == connect.CodePermissionDenied {
		// A 403 (a shard write for another gateway) is not a command
		// answered (API.md, Metrics: 401 and 403 are not counted).
		return cerr
	}
	if kind, ok := countedRefusals[procedure]; ok {
		s.refused(kind, cerr)
	}
	if kind, ok := countedShardRefusals[procedure]; ok && s.shards != nil {
		s.shards.refused(kind, cerr)
	}
	return cerr
}

// checkText checks msg, a request to procedure: its fields by
// textProblem. A shard write's gateway id is checked first and the
// caller's right to act for it (authorizeGateway) before the other
// fields, as API.md's order of checks has it (a gateway token's call for
// another gateway is 403 whatever else is wrong with it).
func checkText(ctx context.Context, procedure string, msg any) *connect.Error {
	pm, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	if g, ok := msg.(interface{ GetGatewayId() string }); ok && shardWrites[procedure] != "" {
		if cerr := checkID("gatewayId", g.GetGatewayId()); cerr != nil {
			return cerr
		}
		if cerr := authorizeGateway(ctx, shardWrites[procedure], g.GetGatewayId()); cerr != nil {
			return cerr
		}
	}
	return textProblem(pm.ProtoReflect())
}

// shardWrites are the methods whose gateway id authorizeGateway ties to
// the caller, with the name its message gives them.
var shardWrites = map[string]string{
	capledgerv1connect.ShardServiceIssueShardProcedure:     "issue shard",
	capledgerv1connect.ShardServiceReconcileShardProcedure: "reconcile shard",
}

// textCheck is the connect interceptor that runs checkRequestText on every
// request (each message of a client stream).
type textCheck struct{ s *Server }

func (c textCheck) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if cerr := c.s.checkRequestText(ctx, req.Spec().Procedure, req.Any()); cerr != nil {
			return nil, cerr
		}
		return next(ctx, req)
	}
}

func (c textCheck) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c textCheck) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, &textCheckedConn{StreamingHandlerConn: conn, ctx: ctx, s: c.s})
	}
}

// textCheckedConn checks each message a stream receives.
type textCheckedConn struct {
	connect.StreamingHandlerConn
	ctx context.Context
	s   *Server
}

func (c *textCheckedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	if cerr := c.s.checkRequestText(c.ctx, c.Spec().Procedure, msg); cerr != nil {
		return cerr
	}
	return nil
}
