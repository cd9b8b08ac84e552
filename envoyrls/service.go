// Package envoyrls serves Envoy's rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, on the
// serve port (gRPC over h2c or h2, beside the LedgerService), so that
// Envoy, Envoy AI Gateway, Istio, Contour or Gloo call capledger unchanged.
//
// It translates only: a descriptor maps (Config) to a subject, route,
// region and unit, and each check becomes the very engine commands the
// LedgerService handlers issue (server.Server's ReserveCommand,
// SettleCommand and Run), with their unit mapping, error classification,
// metrics and bearer-token auth. There is no second accounting.
//
// Semantics per descriptor (docs/ENVOY.md):
//   - no id: a reserve-and-settle of the hits in one durable step (one
//     store transaction), Envoy's classic counter; idempotent by nothing,
//     a retried call counts twice.
//   - an id (e.g. x-request-id): the check reserves the estimate and starts
//     it; the call after the stream (apply_on_stream_done, marked by the
//     rule's phase entry) settles the actual usage for that id. A retry of
//     either with the same id and hits replays.
//   - a call after the stream with nothing to settle (no id; the check
//     failed open, was a probe, or its hold was released or expired)
//     records its cost (ledger.Record), which no lack of capacity refuses:
//     what is not free becomes debt.
package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/oklog/ulid/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

// Procedure is the gRPC path of ShouldRateLimit.
const Procedure = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// maxDescriptors bounds the descriptors of one request (Envoy sends a
// handful; a request with thousands is a mistake or an attack).
const maxDescriptors = 64

// Service answers ShouldRateLimit over a server.Server.
type Service struct {
	srv *server.Server
	cfg *Config
	log *slog.Logger
	// now is the clock of the reset durations (default time.Now).
	now func() time.Time
	// views caches what an answer needs of a policy's dimension
	// (limitView), by generation, route and unit.
	views viewCache
}

// New returns the service of cfg over srv.
func New(srv *server.Server, cfg *Config, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{srv: srv, cfg: cfg, log: log, now: time.Now}
}

// Mount serves ShouldRateLimit on srv's port (gRPC, gRPC-Web and Connect,
// with srv's auth and size limits) under Procedure.
func (s *Service) Mount() {
	s.srv.Mount(Procedure, connect.NewUnaryHandler(Procedure, s.handle, s.srv.HandlerOptions()...))
}

// RegisterGRPC serves ShouldRateLimit directly on gs, the grpc-go server
// of srv (server.Server.GRPCServer), which puts it behind the same auth,
// size limit and error mapping as every direct method: Envoy's calls skip
// connect's envelope handling. Without it gs still serves
// ShouldRateLimit, through its bridge to the mounted handler.
func (s *Service) RegisterGRPC(gs *grpc.Server) {
	// The generated registration, but for the decoding: grpc-go's answers
	// a descriptor value that is not UTF-8 INTERNAL; server.DecodeGRPC
	// INVALID_ARGUMENT, as the bridge and connect do.
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: rlsv3.RateLimitService_ServiceDesc.ServiceName,
		HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(rlsv3.RateLimitRequest)
			if err := server.DecodeGRPC(dec, in); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
			handler := func(ctx context.Context, req any) (any, error) {
				return srv.(rlsv3.RateLimitServiceServer).ShouldRateLimit(ctx, req.(*rlsv3.RateLimitRequest))
			}
			if interceptor == nil {
				return handler(ctx, in)
			}
			return interceptor(ctx, in, info, handler)
		}}},
		Metadata: rlsv3.RateLimitService_ServiceDesc.Metadata,
	}, s)
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// Handler returns the ShouldRateLimit handler alone (for a test or a
// separate listener).
func (s *Service) Handler() http.Handler {
	return connect.NewUnaryHandler(Procedure, s.handle, s.srv.HandlerOptions()...)
}

func (s *Service) handle(ctx context.Context, req *connect.Request[rlsv3.RateLimitRequest]) (*connect.Response[rlsv3.RateLimitResponse], error) {
	resp, err := s.ShouldRateLimit(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// item is one descriptor on its way through.
type item struct {
	mapped Mapped
	hits   int64
	// unknown: maps to no rule or no policy; answered per UnknownDescriptor.
	unknown bool
	// rid is the reservation id: derived from the request id, or random.
	rid string
	// generation decided and view is its policy's dimension (set once
	// the reserve or settle was decided; 0 and nil when none decided).
	generation uint64
	view       *limitView
	// cmds are this descriptor's commands, in order; first is the reserve
	// or the settle whose result decides.
	cmds    []ledger.Command
	results []ledger.Result
	// over: a capacity rejection under an enforced policy.
	over       bool
	retryAfter time.Duration
	// released: admitted, then released because another descriptor of
	// the request refused. releasedBefore: its reserve replays a
	// reservation released so, in the first call of a retried request.
	released, releasedBefore bool
	// overtaken: the release of such a hold found it taken over
	// (releaseOvertaken); nothing was released.
	overtaken bool
	// left, when leftSet, is limit_remaining as the request's other
	// descriptors on the same account and unit left it (leftAfterRelease).
	left    int64
	leftSet bool
	// unmapped: the server could not map the reserve (no policy, no such
	// unit) and sent it only to be answered from its existing id; it is
	// the server's refusal (NO_POLICY, UNKNOWN_UNIT), which stands when
	// the ledger did not answer from the id (answeredFromID).
	unmapped *connect.Error
	// cmdBuf backs cmds: plan makes at most three commands (reserve,
	// start, settle), so a check allocates none of its own.
	cmdBuf [3]ledger.Command
}

// ShouldRateLimit answers one request. It returns a connect error (the
// gRPC status Envoy sees, which then applies failure_mode_deny) when the
// ledger cannot answer: UNAVAILABLE while the store is unavailable,
// DEADLINE_EXCEEDED past the caller's deadline, INVALID_ARGUMENT for a
// malformed request, and the LedgerService's code for an outcome that is
// neither admission nor rejection (e.g. ALREADY_EXISTS when an id is
// reused for another estimate, FAILED_PRECONDITION for a settle that
// contradicts the recorded one).
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	items, unmapped, cerr := s.mapRequest(req)
	if cerr != nil {
		// A malformed request is refused whole before any command runs,
		// and counted once as a refused reserve (invalid_command), as a
		// descriptor the server's command checks refuse (a NUL byte in
		// a subject) is: every INVALID_ARGUMENT Envoy sees shows there.
		var answers server.Answers
		answers.Refused(ledger.KindReserve, cerr)
		s.srv.CountAnswers(&answers, cerr)
		return nil, cerr
	}
	// An unknown domain or a descriptor no rule matches maps to no policy:
	// counted as such (once the request is known to be well formed, and
	// with the rest once the answer is known: unavailable when the call
	// fails), so that a mistyped domain or key shows on a dashboard
	// whatever unknown_descriptor answers.
	var answers server.Answers
	for range unmapped {
		answers.RefusedNoPolicy(ledger.KindReserve)
	}
	err := s.run(ctx, items, &answers)
	var resp *rlsv3.RateLimitResponse
	if err == nil {
		resp, err = s.respond(ctx, items)
	}
	if err == nil && ctx.Err() != nil {
		// Several descriptors' commands run on past the caller's deadline
		// (run): the caller stopped waiting first, so what it saw is
		// DEADLINE_EXCEEDED (or CANCELLED), and the commands count as
		// unavailable, as a failed check's do, not as the answer nobody read.
		resp, err = nil, connect.NewError(contextCode(ctx.Err()), ctx.Err())
	}
	s.srv.CountAnswers(&answers, err)
	return resp, err
}

// mapRequest maps req's descriptors to items (an unknown one marked
// unknown, counted in unmapped), or returns the INVALID_ARGUMENT that
// refuses a malformed request: no descriptors or too many, negative or
// too many hits, a reservation id the ledger refuses, one id for two
// units.
func (s *Service) mapRequest(req *rlsv3.RateLimitRequest) (items []item, unmapped int, _ *connect.Error) {
	if len(req.GetDescriptors()) == 0 {
		return nil, 0, invalid("no descriptors")
	}
	if len(req.GetDescriptors()) > maxDescriptors {
		return nil, 0, invalid("%d descriptors; at most %d", len(req.GetDescriptors()), maxDescriptors)
	}
	requestHits := int64(req.GetHitsAddend())
	if requestHits == 0 {
		requestHits = 1
	}
	items = make([]item, len(req.GetDescriptors()))
	// Descriptors have a handful of entries: map them from a buffer on
	// the stack (Map keeps none of them).
	var entryBuf [8]Entry
	entries := entryBuf[:0]
	for i, d := range req.GetDescriptors() {
		it := &items[i]
		if d.GetIsNegativeHits() {
			return nil, 0, invalid("descriptor %d: negative hits are not supported; capacity returns through a settle below the reservation", i)
		}
		it.hits = requestHits
		if h := d.GetHitsAddend(); h != nil {
			if h.GetValue() > uint64(ledger.MaxUnits) {
				return nil, 0, invalid("descriptor %d: hits_addend %d exceeds %d", i, h.GetValue(), ledger.MaxUnits)
			}
			it.hits = int64(h.GetValue())
		}
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		m, ok := s.cfg.Map(req.GetDomain(), entries)
		if !ok {
			unmapped++
			it.unknown = true
			continue
		}
		if m.Rule.SettleOnHits && it.hits > 0 {
			m.Settle = true // the call after the stream, told by its cost
		}
		it.mapped = m
		if m.ID != "" {
			it.rid = reservationID(m.ID, m.Key)
			if p := ledger.IDProblem(it.rid); p != "" {
				return nil, 0, invalid("descriptor %d: reservation id %q %s", i, it.rid, p)
			}
			for j := range items[:i] {
				if other := &items[j]; other.rid == it.rid && other.mapped.Rule.Unit != m.Rule.Unit {
					// One id names one reservation, of one unit: the
					// second reserve would be refused as a reused id
					// (ALREADY_EXISTS), at every retry.
					return nil, 0, invalid("descriptors %d and %d: units %q and %q under one reservation id %q (the request id, subject, route and region); map them to different routes",
						j, i, other.mapped.Rule.Unit, m.Rule.Unit, it.rid)
				}
			}
		} else {
			it.rid = randomID()
		}
	}
	return items, unmapped, nil
}

// reservationID is the reservation id of a request id for one capacity:
// readable (an operator looks the request up by its x-request-id), and
// distinct per descriptor, since one request may be checked against
// several subjects or routes.
func reservationID(id string, key ledger.PolicyKey) string {
	return "envoy:" + id + "/" + key.Subject + "/" + key.Route + "/" + key.Region
}

// randomID is the reservation id of a check without a request id: a ULID
// (oklog/ulid's process-wide monotonic source), so that ids minted one
// after the other sort one after the other and SQLite inserts them at the
// end of the reservations index instead of at random pages of it.
func randomID() string {
	const prefix = "envoy:"
	var b [len(prefix) + ulid.EncodedSize]byte
	copy(b[:], prefix)
	_ = ulid.Make().MarshalTextTo(b[len(prefix):]) // cannot fail: the size is right
	return string(b[:])
}

// run plans and runs every descriptor's commands. A check's reserve and
// its follow-up (start, settle, release) go in one engine call when the
// request has one descriptor; with several, the reserves go first and the
// follow-ups second, so that a request refused by one descriptor keeps no
// capacity of the others (Envoy refuses the request as a whole). Every
// command run or refused is added to answers once, with the result the
// answer is made of.
//
// Several descriptors' calls run detached from the caller's deadline once
// started: their reserves may commit although the caller stopped waiting
// (Envoy's timeout), and then their follow-ups must run too, or a check
// keeps a hold nobody settles or releases (with an id, the settle after
// the stream would find it never started). A single descriptor's commands
// go in one engine call, committed together or not at all.
func (s *Service) run(ctx context.Context, items []item, answers *server.Answers) error {
	if len(items) > 1 {
		if err := ctx.Err(); err != nil {
			return connect.NewError(contextCode(err), err) // nothing started
		}
		ctx = context.WithoutCancel(ctx)
	}
	err := s.runFirstCurrent(ctx, items, answers)
	// The first call's results, stale ones mapped again replaced by their
	// last: added once whether or not the call goes on to fail.
	for i := range items {
		it := &items[i]
		switch {
		case it.results == nil:
		case it.unmapped != nil && !answeredFromID(&it.results[0]):
			// The server's refusal stands (decide), so the reserve
			// counts as Reserve counts it (no_policy, unknown_unit),
			// not by the amount no policy admits that the ledger refused.
			answers.Refused(ledger.KindReserve, it.unmapped)
		default:
			answers.Results(it.cmds[:len(it.results)], it.results)
		}
	}
	if err != nil {
		return err
	}
	if len(items) == 1 {
		return s.decide(ctx, &items[0], answers)
	}
	return s.runSecond(ctx, items, answers)
}

// runFirstCurrent runs the first engine call (runFirst), and again for
// the descriptors whose reserve or record the ledger refused as mapped
// for a generation that no longer decides, up to server.StaleRetries
// times.
func (s *Service) runFirstCurrent(ctx context.Context, items []item, answers *server.Answers) error {
	for attempt := 0; ; attempt++ {
		if err := s.runFirst(ctx, items, answers); err != nil {
			return err
		}
		if err := s.settleUnclosed(ctx, items, answers); err != nil {
			return err
		}
		stale := false
		for i := range items {
			it := &items[i]
			if checkLanded(it, attempt) {
				stale = true
				continue
			}
			if staleFirst(it, attempt) {
				stale = true
				if cerr := s.srv.RefreshPolicies(ctx, &it.cmds[0], &it.results[0]); cerr != nil {
					return cerr
				}
			}
		}
		if !stale {
			return nil
		}
		for i := range items {
			if it := &items[i]; staleFirst(it, attempt) || checkLanded(it, attempt) {
				// Map again. The reservation id stays, so a reserve (or a
				// record) that did commit meanwhile replays, and a call
				// after the stream whose check landed meanwhile now finds
				// the check's reservation and settles it.
				it.results, it.cmds = nil, nil
			}
		}
	}
}

// settleUnclosed finishes the calls after the stream whose settle found
// the request's reservation unable to take the usage, so that the usage
// the gateway reports is charged whatever became of the check
// (docs/ENVOY.md, "What the call after the stream finds"):
//   - held (RESERVED: the check's start never committed, the call that
//     would have run it having failed): started now and settled, as the
//     check would have left it;
//   - released or expired (the hold was given back: the request was
//     refused, or failed as a whole and Envoy let it through anyway under
//     failure_mode_deny: false; or its hold TTL passed before the start):
//     the usage recorded under usageID, as RecordUsage records it, so
//     that a retry of the call replays; 0 hits record nothing. Retention
//     removing the reservation changes nothing: its tombstone answers
//     the settle as the state it ended in;
//   - settled and removed by retention: a replay (a late retry of the
//     call), whatever the hits, since the tombstone keeps no usage to
//     compare them with.
//
// The settle's refusal is replaced by what ran instead, the result the
// answer and the metrics go by. A settle that found no reservation at all
// was planned as a record already (plan).
func (s *Service) settleUnclosed(ctx context.Context, items []item, answers *server.Answers) error {
	for i := range items {
		it := &items[i]
		if it.unknown || len(it.results) == 0 || it.cmds[0].Kind != ledger.KindSettle || it.results[0].Err == nil {
			continue
		}
		// The settle was answered: what replaces it runs even if the
		// caller stops waiting, or the usage it reports is lost (Envoy
		// does not retry a call after the stream).
		ctx := context.WithoutCancel(ctx)
		if errors.Is(it.results[0].Err, ledger.ErrReservationNotStarted) {
			cmds := []ledger.Command{{Kind: ledger.KindStart, ReservationID: it.rid, OperationID: it.rid}, it.cmds[0]}
			results, cerr := s.srv.Run(ctx, cmds)
			if cerr != nil {
				answers.Failed(cmds)
				return cerr
			}
			if results[0].Err == nil {
				// A start that failed (the hold expired meanwhile) is no
				// command of the answer: the record below is.
				answers.Results(cmds[:1], results[:1])
			}
			it.results[0] = results[1]
		}
		if err := it.results[0].Err; errors.Is(err, ledger.ErrReservationRetired) && errors.Is(err, ledger.ErrReservationAlreadySettled) {
			// Retention removed the settled reservation: its tombstone
			// keeps neither the operation id nor the usage a replay is
			// compared with, so a late call (a retry) replays, charging
			// nothing twice, as a record's tombstone answers
			// (docs/API.md, "Retention: removed reservations").
			it.results[0].Err, it.results[0].Replayed = nil, true
			continue
		}
		if err := it.results[0].Err; !errors.Is(err, ledger.ErrReservationReleased) && !errors.Is(err, ledger.ErrReservationExpired) {
			continue
		}
		it.cmds, it.results = nil, nil
		if it.hits == 0 {
			continue // nothing used, nothing to record
		}
		it.rid = usageID(it.rid)
		if err := s.planRecord(ctx, it, answers); err != nil || it.unknown {
			return err
		}
		results, cerr := s.srv.Run(ctx, it.cmds)
		if cerr != nil {
			answers.Failed(it.cmds)
			return cerr
		}
		it.results = results
	}
	return nil
}

// usageID is the id of the usage recorded for a request whose reservation
// (rid, "envoy:<id>/...") was released or expired: "usage:<id>/...", as
// long as rid, so that it is a valid id whenever rid is, and derived from
// the request id alone, so that a retried call after the stream replays
// the record instead of charging again.
func usageID(rid string) string { return "usage:" + strings.TrimPrefix(rid, "envoy:") }

// checkLanded reports whether a call after the stream, planned as a
// record under the request's reservation id because no reservation was
// there when it read (plan), met the reservation of the request's check,
// committed in between (a check Envoy stopped waiting for, still
// committing when the stream ended): it is to be planned again, and then
// settles that reservation as the "started" row of docs/ENVOY.md says,
// instead of failing the call with ALREADY_EXISTS and leaving the check's
// estimate held (fewer than server.StaleRetries attempts were made).
func checkLanded(it *item, attempt int) bool {
	if !it.mapped.Settle || it.mapped.ID == "" || len(it.results) == 0 || it.cmds[0].Kind != ledger.KindRecord ||
		it.rid != reservationID(it.mapped.ID, it.mapped.Key) || attempt >= server.StaleRetries {
		return false
	}
	res := &it.results[0]
	return errors.Is(res.Err, ledger.ErrDigestMismatch) && !errors.Is(res.Err, ledger.ErrReservationRetired) &&
		!strings.HasPrefix(res.Reservation.RequestDigest, ledger.RecordDigestPrefix)
}

// staleFirst reports whether the descriptor's reserve or record was
// refused as mapped for a generation that no longer decides, and is to be
// mapped again (fewer than server.StaleRetries attempts were made).
func staleFirst(it *item, attempt int) bool {
	if it.results == nil || (it.cmds[0].Kind != ledger.KindReserve && it.cmds[0].Kind != ledger.KindRecord) {
		return false
	}
	return server.Stale(&it.cmds[0], &it.results[0]) && attempt < server.StaleRetries
}

// runFirst plans every descriptor not yet run and runs, in one engine
// call, a single descriptor's commands or several descriptors' reserves.
func (s *Service) runFirst(ctx context.Context, items []item, answers *server.Answers) error {
	if len(items) == 1 {
		// The common case: the commands go as planned and the results
		// come back as they are, with no copy of either.
		it := &items[0]
		if it.unknown || it.results != nil {
			return nil
		}
		if err := s.plan(ctx, it, answers); err != nil || it.unknown || len(it.cmds) == 0 {
			return err
		}
		results, cerr := s.srv.Run(ctx, it.cmds)
		if cerr != nil {
			answers.Failed(it.cmds)
			return cerr
		}
		it.results = results
		return nil
	}
	return s.runFirstSeveral(ctx, items, answers)
}

// runFirstSeveral is runFirst of several descriptors: their reserves (or
// settles) in one engine call.
func (s *Service) runFirstSeveral(ctx context.Context, items []item, answers *server.Answers) error {
	first := make([]ledger.Command, 0, len(items))
	owners := make([]int, 0, len(items))
	for i := range items {
		it := &items[i]
		if it.unknown || it.results != nil {
			continue
		}
		if err := s.plan(ctx, it, answers); err != nil {
			return err
		}
		if it.unknown || len(it.cmds) == 0 {
			continue
		}
		first = append(first, it.cmds[0])
		owners = append(owners, i)
	}
	results, cerr := s.srv.Run(ctx, first)
	if cerr != nil {
		answers.Failed(first)
		return cerr
	}
	for j, i := range owners {
		it := &items[i]
		it.results = append(make([]ledger.Result, 0, len(it.cmds)), results[j])
	}
	return nil
}

// runSecond decides several descriptors' reserves, then runs either all
// their follow-ups or, if any enforced policy refused or a descriptor's
// outcome is an error of the whole call (e.g. its id reused for another
// estimate), releases of those admitted: Envoy refuses the request as a
// whole, or, failing open on the error, sends no settle for holds it was
// never told of, so a kept hold would be capacity nobody uses until it
// expires. The call's error is then the first such outcome.
func (s *Service) runSecond(ctx context.Context, items []item, answers *server.Answers) error {
	refused := false
	var failed error
	for i := range items {
		if err := s.decide(ctx, &items[i], answers); err != nil {
			if failed == nil {
				failed = err
			}
			continue
		}
		// A check refused for capacity, or one that maps to no policy
		// under unknown_descriptor: deny, makes Envoy refuse the request.
		it := &items[i]
		refused = refused || ((it.over || it.unknown && s.deniesUnknown()) && !it.mapped.Settle)
	}
	refused = refused || failed != nil
	retryOfRefused(items)
	var second []ledger.Command
	var owners []int
	for i := range items {
		it := &items[i]
		if it.unknown || len(it.results) == 0 || it.results[0].Err != nil || it.cmds[0].Kind != ledger.KindReserve {
			continue
		}
		if first := &it.results[0]; first.Replayed && first.Reservation.State != ledger.StateReserved && refused {
			// A retry: its follow-ups ran in the first call (a started
			// reservation cannot be released, a released one is done).
			continue
		}
		if refused && !it.mapped.Settle && len(it.cmds) > 1 {
			it.released = true
		}
		for _, c := range it.followUps() {
			second = append(second, c)
			owners = append(owners, i)
		}
	}
	results, cerr := s.srv.Run(ctx, second)
	if cerr != nil {
		answers.Failed(second)
		return cerr
	}
	answers.Results(second, results)
	if failed != nil {
		return failed
	}
	for j, i := range owners {
		items[i].results = append(items[i].results, results[j])
	}
	for i := range items {
		if it := &items[i]; releaseOvertaken(it) {
			it.released, it.overtaken = false, true
		}
	}
	for i := range items {
		if err := followErr(&items[i]); err != nil {
			return err
		}
	}
	leftAfterRelease(items)
	return nil
}

// releaseOvertaken reports whether the release of a refused request's
// hold (runSecond) found it no longer held: between the request's
// reserves and its releases the call after the stream for the request id
// started and settled it (Envoy sends that call for a refused request
// too, and sooner than the answer when the answer came after its
// timeout: docs/ENVOY.md, "What the call after the stream finds"), or
// expiry claimed it. Nothing is left to give back and the hold keeps what
// was done with it (settled, charged once); the request is refused all
// the same, so the check answers OVER_LIMIT, not the release's refusal.
func releaseOvertaken(it *item) bool {
	if !it.released || len(it.results) < 2 {
		return false
	}
	err := it.results[len(it.results)-1].Err
	return errors.Is(err, ledger.ErrReservationAlreadySettled) || errors.Is(err, ledger.ErrReservationAlreadyStarted) ||
		errors.Is(err, ledger.ErrReservationExpired)
}

// deniesUnknown reports whether a descriptor that maps to no policy is
// answered OVER_LIMIT (unknown_descriptor: deny), which refuses the whole
// request as any OVER_LIMIT descriptor does.
func (s *Service) deniesUnknown() bool { return s.cfg.UnknownDescriptor == "deny" }

// retryOfRefused gives a retried request that was refused as a whole
// (some descriptor's reserve replays a reservation released in the first
// call) its first answer's codes. Then every descriptor with an id that
// was admitted was released, and one that was refused left nothing. So a
// replayed released one answers OK again (it fitted), and one with an id
// whose reserve is admitted only now was the refusal then: OVER_LIMIT,
// and its new hold is released with the rest. Descriptors without an id
// are checked afresh, as always.
func retryOfRefused(items []item) {
	retried := false
	for i := range items {
		retried = retried || items[i].releasedBefore
	}
	if !retried {
		return
	}
	for i := range items {
		it := &items[i]
		switch {
		case it.releasedBefore:
			it.over = false
		case it.mapped.ID != "" && freshReserve(it) && it.results[0].Err == nil && !probe(it):
			it.over = true
		}
	}
}

// freshReserve reports whether the descriptor's deciding command is a
// check's reserve that ran now (not a replay) and was decided (admitted or
// refused for capacity).
func freshReserve(it *item) bool {
	if it.unknown || len(it.results) == 0 || it.cmds[0].Kind != ledger.KindReserve || it.mapped.Settle {
		return false
	}
	res := &it.results[0]
	return !res.Replayed && (res.Err == nil || server.Classify(res.Err).Capacity)
}

// leftAfterRelease sets limit_remaining of the descriptors of several
// whose reserves ran now, by account and unit: what the request's last
// reserve there left, plus every unit the request's holds there gave back
// (givenBack: a refused request's holds, probes, and what became of a hold
// the release found overtaken), never below 0. A descriptor's own reserve
// result predates the reserves after it and the releases.
func leftAfterRelease(items []item) {
	// At most maxDescriptors, usually two or three: pairwise, with no
	// allocation.
	for i := range items {
		it := &items[i]
		if !hasLeft(it) {
			continue
		}
		last, back := i, int64(0)
		for j := range items {
			other := &items[j]
			if !hasLeft(other) || other.mapped.Key != it.mapped.Key || other.generation != it.generation ||
				other.mapped.Rule.Unit != it.mapped.Rule.Unit {
				continue
			}
			last = max(last, j)
			back += givenBack(other)
		}
		it.left, it.leftSet = max(items[last].results[0].Available[it.view.dim]+back, 0), true
	}
}

// givenBack is what a descriptor's hold, reserved now, gave back to its
// account by the time the request was answered: the whole hold when the
// request released it (releasedNow), or, when the release found it
// overtaken (releaseOvertaken), what that left there: the whole hold once
// expiry took it, the hold less the usage once the call after the stream
// settled it (less than nothing when the usage went beyond the hold: it
// took more), nothing while it is started. A replayed reserve (a second
// descriptor under the same id) gave nothing of its own.
func givenBack(it *item) int64 {
	dim := it.view.dim
	if releasedNow(it) {
		return it.cmds[0].Units[dim]
	}
	if !it.overtaken || it.results[0].Err != nil || it.results[0].Replayed {
		return 0
	}
	r := &it.results[len(it.results)-1].Reservation
	switch r.State {
	case ledger.StateExpired:
		return r.Reserved[dim]
	case ledger.StateSettled, ledger.StateSettledWithDebt:
		return r.Reserved[dim] - r.Actual[dim]
	}
	return 0
}

// hasLeft reports whether a descriptor's limit_remaining comes from its
// reserve's result (a fresh reserve of a known dimension).
func hasLeft(it *item) bool { return freshReserve(it) && it.view != nil && it.view.dim >= 0 }

// probe reports whether the descriptor is a probe: a reserve of 1 under
// a fresh id, released at once (plan).
func probe(it *item) bool { return len(it.cmds) == 2 && it.cmds[1].Kind == ledger.KindRelease }

// releasedNow reports whether a descriptor's reserve, admitted now, was
// released by the same call: a probe, or a hold of a refused request.
func releasedNow(it *item) bool {
	return it.results[0].Err == nil && !it.results[0].Replayed &&
		(it.released || probe(it))
}

// plan maps one descriptor to its commands:
//
//	check, no id, hits > 0:  reserve(hits), start, settle(hits)
//	check with an id:        reserve(hits, or the rule's estimate when hits is 0), start
//	check, hits = 0, no id or no estimate: reserve(1), release — a probe
//	                         that holds nothing
//	settle with an id:       settle(hits) of the id's reservation; if there
//	                         is none (the check failed open or was a probe),
//	                         record(hits) under the id (settleUnclosed
//	                         handles one the settle finds held, released
//	                         or expired)
//	settle without an id:    record(hits)
//
// A record is usage after the fact: never refused for lack of capacity,
// what is not free becomes debt (ledger.Record). A settle of 0 hits
// without a reservation records nothing. plan sets unknown when the
// descriptor maps to no policy or unit.
func (s *Service) plan(ctx context.Context, it *item, answers *server.Answers) error {
	m := &it.mapped
	if m.Settle {
		if m.ID != "" {
			cmd, cerr := s.srv.SettleCommand(ctx, &v1.SettleRequest{
				ReservationId: it.rid, OperationId: it.rid, ActualUnits: map[string]int64{m.Rule.Unit: it.hits},
			})
			switch {
			case cerr == nil:
				it.cmdBuf[0] = cmd
				it.cmds = it.cmdBuf[:1]
				return nil
			case reasonOf(cerr) == server.ReasonUnknownUnit:
				answers.Refused(ledger.KindSettle, cerr)
				it.unknown = true
				return nil
			case reasonOf(cerr) != server.ReasonReservationNotFound:
				answers.Refused(ledger.KindSettle, cerr) // the call's error, as a Settle's
				return cerr
			}
		}
		if it.hits == 0 {
			return nil // nothing used, nothing to record
		}
		return s.planRecord(ctx, it, answers)
	}
	switch {
	case m.ID == "" && it.hits > 0:
		return s.planReserve(ctx, it, answers, it.hits, true, it.hits)
	case m.ID != "" && it.hits > 0:
		return s.planReserve(ctx, it, answers, it.hits, true, -1)
	case m.ID != "" && m.Rule.Estimate > 0:
		return s.planReserve(ctx, it, answers, m.Rule.Estimate, true, -1)
	}
	it.rid = randomID() // a probe holds nothing, under the request's id least of all
	if err := s.planReserve(ctx, it, answers, 1, false, -1); err != nil || it.unknown {
		return err
	}
	it.cmdBuf[1] = ledger.Command{Kind: ledger.KindRelease, ReservationID: it.rid}
	it.cmds = it.cmdBuf[:2]
	return nil
}

// planReserve sets it.cmds to a reserve of units under it.rid, then a
// start when start is set, then a settle of settle units when settle >= 0.
// A reserve the server cannot map (no policy, no such unit) makes the
// descriptor unknown.
func (s *Service) planReserve(ctx context.Context, it *item, answers *server.Answers, units int64, start bool, settle int64) error {
	m := &it.mapped
	// unmapped: the id exists but its policy no longer maps; the ledger
	// replays the reserve, the retry of an admitted check, or says the id
	// is another request's, else the descriptor is unknown (decide).
	cmd, unmapped, refused := s.srv.ReserveCommand(ctx, &v1.ReserveRequest{
		ReservationId: it.rid, Subject: m.Key.Subject, Route: m.Key.Route, Region: m.Key.Region,
		Units: map[string]int64{m.Rule.Unit: units},
	})
	if refused != nil {
		return s.refusedBeforeLedger(it, answers, ledger.KindReserve, refused)
	}
	it.cmdBuf[0] = cmd
	it.unmapped = unmapped
	clear(it.cmdBuf[1:]) // in place: no command-sized temporaries on the stack
	n := 1
	if start {
		startCmd := &it.cmdBuf[n]
		startCmd.Kind, startCmd.ReservationID, startCmd.OperationID = ledger.KindStart, it.rid, it.rid
		n++
	}
	if settle >= 0 {
		settleCmd := &it.cmdBuf[n]
		settleCmd.Kind, settleCmd.ReservationID, settleCmd.OperationID = ledger.KindSettle, it.rid, it.rid
		// The settle's units go in the positions the reserve's were mapped
		// to (the same generation, since both run in one transaction, or the
		// stale check refuses the reserve and the whole plan is redone).
		for i, u := range cmd.Units {
			if u > 0 {
				settleCmd.Units[i] = settle
			}
		}
		n++
	}
	it.cmds = it.cmdBuf[:n]
	return nil
}

// planRecord sets it.cmds to a record of the hits under it.rid (its own
// operation id, so that a retry with the same hits replays), made by the
// server's RecordCommand, as RecordUsage makes it. A record the server
// cannot map (no policy, no such unit) makes the descriptor unknown.
func (s *Service) planRecord(ctx context.Context, it *item, answers *server.Answers) error {
	m := &it.mapped
	// unmapped (the id exists but its policy no longer maps) needs nothing
	// here, as in planReserve: the ledger replays the record or answers
	// why not.
	cmd, _, refused := s.srv.RecordCommand(ctx, &v1.RecordUsageRequest{
		ReservationId: it.rid, OperationId: it.rid, Subject: m.Key.Subject, Route: m.Key.Route, Region: m.Key.Region,
		ActualUnits: map[string]int64{m.Rule.Unit: it.hits},
	})
	if refused != nil {
		return s.refusedBeforeLedger(it, answers, ledger.KindRecord, refused)
	}
	it.cmdBuf[0] = cmd
	it.cmds = it.cmdBuf[:1]
	return nil
}

// refusedBeforeLedger answers a reserve or record (kind) the server
// refused before the ledger, added to answers as refused under kind: one
// that maps to no policy or no unit of it (NO_POLICY, UNKNOWN_UNIT) makes
// the descriptor unknown (nil: the descriptor is answered per
// unknown_descriptor); any other refusal is returned, an error of the
// whole call.
func (s *Service) refusedBeforeLedger(it *item, answers *server.Answers, kind ledger.Kind, refused *connect.Error) error {
	answers.Refused(kind, refused)
	switch reasonOf(refused) {
	case server.ReasonNoPolicy, server.ReasonUnknownUnit:
		it.unknown = true
		return nil
	}
	return refused
}

// setView remembers the policy dimension that decided res, for the status.
func (s *Service) setView(ctx context.Context, it *item, res *ledger.Result) error {
	gen := res.Generation
	if gen == 0 {
		gen = res.Reservation.Account.Generation
	}
	if gen == 0 {
		return nil
	}
	v, cerr := s.view(ctx, gen, it.mapped.Key.Route, it.mapped.Rule.Unit)
	if cerr != nil {
		return cerr
	}
	it.generation, it.view = gen, v
	return nil
}

// limitView is what an answer says of one dimension of one policy
// generation, on one route: its dimension and the parts of the status and
// headers that follow from the policy alone. A generation never changes
// once published, so a view is computed once and kept (viewCache).
type limitView struct {
	// dim is the dimension's index in the policy, -1 when the policy has
	// no dimension of the unit (then d is zero and the rest unset).
	dim int
	d   ledger.Dimension
	// name is route-unit, the RateLimit header's and the status's name.
	name string
	// policyHeader is this dimension's RateLimit-Policy item.
	policyHeader string
	// quoted is name as a structured-field string.
	quoted string
	// refills is false for a dimension without refill: it never resets,
	// so the headers name no reset (t) and no window (w).
	refills      bool
	limitUnit    rlsv3.RateLimitResponse_RateLimit_Unit
	limitPerUnit uint32
}

type viewKey struct {
	generation  uint64
	route, unit string
}

// viewCache holds limitViews by generation, route and unit. It is
// bounded: past maxViews entries (many generations published over a long
// run) it starts again empty.
type viewCache struct {
	m sync.Map // viewKey -> *limitView
	n atomic.Int64
}

const maxViews = 4096

// view returns the limitView of the policy generation for route and unit,
// reading the policy (server.Server's cache, or the store) only the first
// time.
func (s *Service) view(ctx context.Context, generation uint64, route, unit string) (*limitView, *connect.Error) {
	key := viewKey{generation: generation, route: route, unit: unit}
	if v, ok := s.views.get(key); ok {
		return v, nil
	}
	p, cerr := s.srv.Policy(ctx, generation)
	if cerr != nil {
		return nil, cerr
	}
	v := newLimitView(&p, route, unit)
	s.views.put(key, v)
	return v, nil
}

func (c *viewCache) get(key viewKey) (*limitView, bool) {
	v, ok := c.m.Load(key)
	if !ok {
		return nil, false
	}
	return v.(*limitView), true
}

// put stores v under key, first emptying the cache when it holds
// maxViews views.
func (c *viewCache) put(key viewKey, v *limitView) {
	if c.n.Add(1) > maxViews {
		c.m.Clear()
		c.n.Store(1)
	}
	c.m.Store(key, v)
}

func newLimitView(p *ledger.Policy, route, unit string) *limitView {
	v := &limitView{dim: p.DimensionIndex(unit)}
	if v.dim < 0 {
		return v
	}
	v.d = p.Dimensions[v.dim]
	v.name = route + "-" + v.d.Unit
	v.quoted = quote(v.name)
	v.refills = v.d.Refills()
	v.policyHeader = v.quoted + ";q=" + strconv.FormatInt(v.d.Burst, 10)
	if v.refills {
		v.policyHeader += ";w=" + strconv.FormatInt(seconds(untilFull(&v.d, 0)), 10)
	}
	v.limitUnit, v.limitPerUnit = currentLimit(&v.d)
	return v
}

// decide reads the deciding result of one descriptor: admitted, refused
// by capacity (over), admitted under a shadow policy's would-be refusal
// (counted with the call's answer), unknown (no policy), or an outcome
// that is an error of the whole call.
func (s *Service) decide(ctx context.Context, it *item, answers *server.Answers) error {
	if it.unknown || len(it.results) == 0 {
		return nil
	}
	res := &it.results[0]
	if it.unmapped != nil && !answeredFromID(res) {
		// Not answered from the id (it was forgotten before the ledger
		// read it): the server's refusal stands, NO_POLICY or
		// UNKNOWN_UNIT, as Reserve answers it (the amount sent admits
		// nothing).
		it.unknown = true
		return nil
	}
	if err := s.setView(ctx, it, res); err != nil {
		return err
	}
	if res.Err == nil {
		if it.cmds[0].Kind == ledger.KindReserve && res.Replayed && res.Reservation.State == ledger.StateReleased {
			// A retry of a check that was refused (its reservation was
			// released because another descriptor refused): refused again
			// (runSecond answers the descriptors of a retried request
			// with their first answer's codes).
			it.over, it.releasedBefore = true, true
			return nil
		}
		if it.cmds[0].Kind == ledger.KindReserve && !it.mapped.Settle && res.Replayed &&
			(res.Reservation.State == ledger.StateSettled || res.Reservation.State == ledger.StateSettledWithDebt) {
			// The check of a request whose call after the stream came
			// already: Envoy never checks a request again after its
			// stream, so this is another request reusing the id (e.g. a
			// client's own x-request-id). Replayed, it would be admitted
			// and charged nothing.
			it.over = true
			return nil
		}
		if expiredHold(it) {
			// The check of an id whose hold expired unstarted (its first
			// check's start never committed and the hold TTL passed, or
			// another request reusing the id): the hold is final, as a
			// released one is, and its start fails (followErr ignores
			// that, see finalHold). Refused, charged nothing; the call after the stream
			// records what the request used.
			it.over = true
			return nil
		}
		if kind := it.cmds[0].Kind; (kind == ledger.KindSettle || kind == ledger.KindRecord) &&
			res.Reservation.State == ledger.StateSettledWithDebt {
			// The usage was recorded, beyond what was free: the account is
			// frozen until refills repay the debt, so say OVER_LIMIT (Envoy
			// does not enforce an answer after the stream; it tells).
			it.over = true
		}
		return nil
	}
	if it.cmds[0].Kind == ledger.KindReserve && !it.mapped.Settle && errors.Is(res.Err, ledger.ErrDigestMismatch) &&
		strings.HasPrefix(res.Reservation.RequestDigest, ledger.RecordDigestPrefix) {
		// The check of an id under which the call after the stream
		// recorded the request's cost (its check never reached the
		// ledger, was refused, or was a probe): the request is over, so
		// this is another request reusing the id, as a settled replay
		// above. Refused, charged nothing, rather than ALREADY_EXISTS (a
		// record has no estimate to differ from), an error of the call
		// that a failing-open Envoy lets through.
		it.over = true
		return nil
	}
	if server.Stale(&it.cmds[0], res) {
		// Still mapped for a generation that no longer decides after
		// server.StaleRetries remappings (runFirstCurrent): publishes on
		// the key raced the check. Nothing was applied; the call fails
		// UNAVAILABLE as Reserve answers it, not INVALID_ARGUMENT.
		return server.StaleError(fmt.Sprintf("%s %s", it.cmds[0].Kind, it.rid), res)
	}
	out := server.Classify(res.Err)
	if out.Capacity {
		answers.Rejected(res)
		if res.Shadow {
			return nil // a shadow policy lets everything through
		}
		it.over = true
		it.retryAfter = res.RetryAfter
		return nil
	}
	if out.Reason == server.ReasonNoPolicy {
		it.unknown = true
		return nil
	}
	return connect.NewError(out.Code, fmt.Errorf("%s %s: %w", it.cmds[0].Kind, it.rid, res.Err))
}

// answeredFromID reports whether the ledger answered a reserve from its
// existing id (a replay or a digest mismatch): for an unmapped reserve,
// the only answers that are not the server's own refusal.
func answeredFromID(res *ledger.Result) bool {
	return (res.Err == nil && res.Replayed) || errors.Is(res.Err, ledger.ErrDigestMismatch)
}

// followUps are the commands run after a check's reserve, whose results
// follow the reserve's in it.results: the planned start (and settle), or,
// once another descriptor refused the request (released; overtaken when
// that release found the hold taken over), the release of its hold
// instead.
func (it *item) followUps() []ledger.Command {
	if it.released || it.overtaken {
		return []ledger.Command{{Kind: ledger.KindRelease, ReservationID: it.rid}}
	}
	return it.cmds[1:]
}

// followErr returns the error of a follow-up command that failed for a
// reason other than its reserve having been refused, having replayed a
// reservation that is over (finalHold), or its release having found the
// hold taken over (releaseOvertaken), named by the command that failed
// (followUps: a release, not the start it replaced).
func followErr(it *item) error {
	if len(it.results) < 2 || it.results[0].Err != nil || finalHold(it) || it.overtaken {
		return nil
	}
	follow := it.followUps()
	for j := 1; j < len(it.results); j++ {
		if err := it.results[j].Err; err != nil {
			return connect.NewError(server.Classify(err).Code, fmt.Errorf("%s %s: %w", follow[min(j-1, len(follow)-1)].Kind, it.rid, err))
		}
	}
	return nil
}

// finalHold reports whether a check's reserve replayed a reservation that
// is over: released, settled or expired, from its row or, once retention
// removed it, from its tombstone (whose start fails where a live settled
// row's start replays). decide refuses such a check, charged nothing, so
// its start's failure is no error of the call.
func finalHold(it *item) bool {
	if len(it.results) == 0 || it.cmds[0].Kind != ledger.KindReserve || it.mapped.Settle {
		return false
	}
	res := &it.results[0]
	if res.Err != nil || !res.Replayed {
		return false
	}
	switch res.Reservation.State {
	case ledger.StateReleased, ledger.StateSettled, ledger.StateSettledWithDebt, ledger.StateExpiring, ledger.StateExpired:
		return true
	}
	return false
}

// expiredHold reports whether a check's reserve replayed a hold that
// expiry claimed before any start (EXPIRING or EXPIRED): final, so the
// check is refused.
func expiredHold(it *item) bool {
	if len(it.results) == 0 || it.cmds[0].Kind != ledger.KindReserve || it.mapped.Settle {
		return false
	}
	res := &it.results[0]
	return res.Err == nil && res.Replayed &&
		(res.Reservation.State == ledger.StateExpiring || res.Reservation.State == ledger.StateExpired)
}

// respond builds the answer: one status per descriptor, the overall code,
// and the RateLimit / RateLimit-Policy headers (Retry-After on OVER_LIMIT).
func (s *Service) respond(ctx context.Context, items []item) (*rlsv3.RateLimitResponse, error) {
	if len(items) == 1 {
		if err := followErr(&items[0]); err != nil {
			return nil, err
		}
	}
	statuses := make([]status, len(items))
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	var retryAfter time.Duration
	for i := range items {
		it := &items[i]
		st := &statuses[i].st
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		switch {
		case it.unknown:
			if s.deniesUnknown() {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		case it.over:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			retryAfter = max(retryAfter, it.retryAfter)
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		v := it.view
		if it.unknown || v == nil || v.dim < 0 {
			continue
		}
		nameLimit(items, statuses, i)
		limit := &statuses[i].limit
		limit.Unit, limit.RequestsPerUnit = v.limitUnit, v.limitPerUnit
		st.CurrentLimit = limit
		remaining, reset, cerr := s.remaining(ctx, it, v)
		if cerr != nil {
			return nil, cerr
		}
		switch {
		case it.over && it.retryAfter > 0:
			reset = it.retryAfter
		case it.over && reset == 0 && v.refills:
			// Refused with the bucket full: no refill wait helps (an
			// estimate above the maximum, a refused request's final
			// answer). An absent reset reads as 0 to Envoy, "now", so
			// every refusal names one: the window, refills' time to fill
			// the burst (RateLimit-Policy's w).
			reset = untilFull(&v.d, 0)
		}
		statuses[i].remaining, statuses[i].until = remaining, reset
		st.LimitRemaining = uint32(min(remaining, int64(^uint32(0))))
		if reset > 0 {
			statuses[i].reset.Seconds = seconds(reset)
			st.DurationUntilReset = &statuses[i].reset
		}
	}
	policies, limits := rateLimitHeaders(items, statuses)
	var headers *[3]corev3.HeaderValue
	if policies != "" {
		headers = new([3]corev3.HeaderValue)
		headers[0].Key, headers[0].Value = "RateLimit-Policy", policies
		headers[1].Key, headers[1].Value = "RateLimit", limits
		resp.ResponseHeadersToAdd = append(make([]*corev3.HeaderValue, 0, 3), &headers[0], &headers[1])
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && retryAfter > 0 {
		if headers == nil {
			headers = new([3]corev3.HeaderValue)
		}
		headers[2].Key, headers[2].Value = "Retry-After", strconv.FormatInt(seconds(retryAfter), 10)
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &headers[2])
	}
	return resp, nil
}

// status is one descriptor's part of the answer: its status with its
// limit and reset (one allocation holds every descriptor's), and what the
// RateLimit headers say of its limit.
type status struct {
	st    rlsv3.RateLimitResponse_DescriptorStatus
	limit rlsv3.RateLimitResponse_RateLimit
	reset durationpb.Duration
	// same is the first descriptor of the answer on the same limit (its
	// own index when it is the first), whose header members stand for
	// both; quoted and policy are the first's members' name and
	// RateLimit-Policy item.
	same           int
	quoted, policy string
	remaining      int64
	until          time.Duration
}

// nameLimit names descriptor i's limit (statuses[i]) so that a name
// stands for one limit within the answer: a descriptor on the account and
// unit of an earlier one takes that one's name, and its limit is listed
// once in the headers; otherwise the name is <route>-<unit>, or, when an
// earlier descriptor's limit has that name already (another subject or
// region on the same route and unit), <route>-<unit>-2, -3, and so on:
// the first free. Subjects are not named: a header goes to the client.
func nameLimit(items []item, statuses []status, i int) {
	it, v, sti := &items[i], items[i].view, &statuses[i]
	for j := range i {
		other := &items[j]
		if statuses[j].st.CurrentLimit != nil && other.mapped.Key == it.mapped.Key &&
			other.generation == it.generation && other.mapped.Rule.Unit == it.mapped.Rule.Unit {
			sti.same, sti.limit.Name = j, statuses[j].limit.Name
			return
		}
	}
	sti.same, sti.limit.Name, sti.quoted, sti.policy = i, v.name, v.quoted, v.policyHeader
	for n := 2; nameTaken(statuses[:i], sti.limit.Name); n++ {
		sti.limit.Name = v.name + "-" + strconv.Itoa(n)
	}
	if sti.limit.Name != v.name {
		sti.quoted = quote(sti.limit.Name)
		sti.policy = sti.quoted + strings.TrimPrefix(v.policyHeader, v.quoted)
	}
}

// nameTaken reports whether one of statuses names its limit name.
func nameTaken(statuses []status, name string) bool {
	for j := range statuses {
		if statuses[j].st.CurrentLimit != nil && statuses[j].limit.Name == name {
			return true
		}
	}
	return false
}

// rateLimitHeaders returns the RateLimit-Policy and RateLimit fields of
// the answer ("" when no descriptor has a limit): one member per limit,
// in the order of their first descriptors. A limit several descriptors
// are on reports the least remaining and the longest reset of them.
func rateLimitHeaders(items []item, statuses []status) (policies, limits string) {
	var l []byte
	for i := range statuses {
		first := &statuses[i]
		if first.st.CurrentLimit == nil || first.same != i {
			continue
		}
		remaining, until := first.remaining, first.until
		for j := i + 1; j < len(statuses); j++ {
			if other := &statuses[j]; other.st.CurrentLimit != nil && other.same == i {
				remaining, until = min(remaining, other.remaining), max(until, other.until)
			}
		}
		if policies == "" {
			policies = first.policy // one limit, the common case: the cached item itself
			l = make([]byte, 0, len(first.quoted)+32)
		} else {
			policies += ", " + first.policy
			l = append(l, ", "...)
		}
		l = append(l, first.quoted...)
		l = append(l, ";r="...)
		l = strconv.AppendInt(l, remaining, 10)
		if items[i].view.refills {
			l = append(l, ";t="...)
			l = strconv.AppendInt(l, seconds(until), 10)
		}
	}
	return policies, string(l)
}

// remaining returns what is left of the descriptor's dimension after its
// commands, and how long refills take to fill it to the burst. A check's
// reserve reports its account's available units (Result.Available), so the
// common paths need no second read; a replay, a settle after the stream,
// or a record read the account as committed (accountRemaining), which
// says 0 while it owes debt.
func (s *Service) remaining(ctx context.Context, it *item, v *limitView) (int64, time.Duration, *connect.Error) {
	res := &it.results[0]
	if it.cmds[0].Kind == ledger.KindReserve && !it.mapped.Settle && !res.Replayed &&
		(res.Err == nil || server.Classify(res.Err).Capacity) {
		if errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
			return 0, untilFull(&v.d, 0), nil
		}
		if it.leftSet {
			return it.left, untilFull(&v.d, it.left), nil // one of several (leftAfterRelease)
		}
		left := res.Available[v.dim]
		if releasedNow(it) {
			left += it.cmds[0].Units[v.dim] // a probe, or a refused request, gives its units back
		}
		return left, untilFull(&v.d, left), nil
	}
	return s.accountRemaining(ctx, it.mapped.Key, it.generation, v)
}

// accountRemaining is remaining read from the account as committed. It is
// a function of its own so that the account (a large value) is on the
// stack only on this path.
//
//go:noinline
func (s *Service) accountRemaining(ctx context.Context, key ledger.PolicyKey, generation uint64, v *limitView) (int64, time.Duration, *connect.Error) {
	a, ok, cerr := s.srv.Account(ctx, key, generation)
	if cerr != nil || !ok {
		return 0, 0, cerr
	}
	bal := &a.Balances[v.dim]
	if bal.Debt() > 0 {
		return 0, untilFull(&v.d, -bal.Debt()), nil
	}
	return bal.Available, untilFull(&v.d, bal.Available), nil
}

// envoyUnits are Envoy's units of a current_limit that have a fixed
// length, shortest first (MONTH has none). A year is taken as 365 days,
// the shortest, so that a rate per year never claims a leap day's refill.
var envoyUnits = [...]struct {
	unit rlsv3.RateLimitResponse_RateLimit_Unit
	dur  time.Duration
}{
	{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 24 * time.Hour},
	{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * 24 * time.Hour},
}

// currentLimit expresses a token bucket's refill as Envoy's
// requests_per_unit: over the shortest unit that holds a whole refill
// interval (the longest, a year, when none does), the refill that unit
// sees, rounded down, so that it never claims more than the policy
// refills (1 per 7 s, 8.57 per minute, is 8 per MINUTE); with no refill,
// the burst per year (it never refills). The rate is computed in integers:
// in floating point a rate just under a whole number can round up to it.
func currentLimit(d *ledger.Dimension) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	if !d.Refills() {
		return rlsv3.RateLimitResponse_RateLimit_YEAR, clamp32(d.Burst)
	}
	u := envoyUnits[len(envoyUnits)-1]
	for _, shorter := range envoyUnits {
		if d.RefillInterval <= shorter.dur {
			u = shorter
			break
		}
	}
	hi, lo := bits.Mul64(uint64(d.RefillUnits), uint64(u.dur))
	if hi >= uint64(d.RefillInterval) {
		return u.unit, ^uint32(0) // the quotient exceeds 64 bits, and so any uint32
	}
	perUnit, _ := bits.Div64(hi, lo, uint64(d.RefillInterval))
	return u.unit, uint32(min(perUnit, uint64(^uint32(0))))
}

// untilFull is how long refills take from level to the burst (0 without
// refill or when full); a negative level is debt, repaid first. Units held
// by reservations are not counted: it is the wait until the bucket would
// be full if nothing were held. A wait that does not fit in a Duration (a
// burst or a debt near ledger.MaxUnits, refilled slowly) is
// ledger.MaxRetryAfter, as the ledger's Retry-After.
func untilFull(d *ledger.Dimension, level int64) time.Duration {
	missing := d.Burst - level
	if missing <= 0 || !d.Refills() {
		return 0
	}
	intervals := (missing + d.RefillUnits - 1) / d.RefillUnits
	if intervals > int64(ledger.MaxRetryAfter/d.RefillInterval) {
		return ledger.MaxRetryAfter
	}
	return time.Duration(intervals) * d.RefillInterval
}

func seconds(d time.Duration) int64 { return int64(server.RetryAfterSeconds(d) / time.Second) }

func clamp32(v int64) uint32 { return uint32(max(0, min(v, int64(^uint32(0))))) }

// quote renders a structured-field string (RFC 8941): printable ASCII,
// with " and \ escaped; anything else becomes '_'.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r > 0x7e:
			b.WriteByte('_')
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func reasonOf(cerr *connect.Error) string {
	for _, d := range cerr.Details() {
		if msg, err := d.Value(); err == nil {
			if detail, ok := msg.(*v1.ErrorDetail); ok {
				return detail.GetReason()
			}
		}
	}
	return ""
}

// contextCode is the gRPC code of a context's error.
func contextCode(err error) connect.Code {
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.CodeDeadlineExceeded
	}
	return connect.CodeCanceled
}

// invalid is the refusal of a malformed request: INVALID_ARGUMENT with
// the INVALID_COMMAND detail the server's own command checks answer.
func invalid(format string, args ...any) *connect.Error {
	cerr := connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
	if detail, err := connect.NewErrorDetail(&v1.ErrorDetail{Reason: server.ReasonInvalidCommand}); err == nil {
		cerr.AddDetail(detail)
	}
	return cerr
}
