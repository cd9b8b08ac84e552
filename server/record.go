package server

import (
	"context"
	"errors"
	"maps"
	"slices"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// RecordDigest is the request digest of a RecordUsage,
// ledger.RecordDigestPrefix + the canonical digest: what names the
// request beside its id (subject, route and region; the usage is
// compared by the ledger itself, so that a retry with other usage is
// RESERVATION_ALREADY_SETTLED, as for a settle).
func RecordDigest(subject, route, region string) string {
	return ledger.RecordDigestPrefix + requestDigest(subject, route, regionOrDefault(region), nil)
}

// recordCommand validates a RecordUsage and maps its units by the policy
// the server believes decides, as reserveCommand does. invalid is a
// refusal decided before the ledger. When the units cannot be mapped (no
// policy, an unknown unit) but the id exists, the command goes to the
// ledger mapped by the existing reservation's generation, so that a retry
// after the policy changed still gets its receipt (or the conflict), and
// unmapped is the answer should the ledger neither answer from the id nor
// record the usage (recordOutcome).
func (s *Server) recordCommand(ctx context.Context, req *v1.RecordUsageRequest) (cmd ledger.Command, unmapped, invalid *connect.Error) {
	if cerr := checkID("reservationId", req.GetReservationId()); cerr != nil {
		return cmd, nil, cerr
	}
	if cerr := checkID("operationId", req.GetOperationId()); cerr != nil {
		return cmd, nil, cerr
	}
	if cerr := textProblem(req.ProtoReflect()); cerr != nil { // as in reserveCommand
		return cmd, nil, cerr
	}
	if cerr := checkUnitValues("actualUnits", req.GetActualUnits(), true); cerr != nil {
		return cmd, nil, cerr
	}
	region := regionOrDefault(req.GetRegion())
	if problem := ledger.RecordShapeProblem(req.GetSubject(), req.GetRoute(), region, slices.Collect(maps.Values(req.GetActualUnits()))); problem != nil {
		return cmd, nil, refuseField(ReasonInvalidCommand, problem)
	}
	cmd = ledger.Command{
		Kind:          ledger.KindRecord,
		ReservationID: req.GetReservationId(),
		RequestDigest: RecordDigest(req.GetSubject(), req.GetRoute(), region),
		OperationID:   req.GetOperationId(),
		Subject:       req.GetSubject(),
		Route:         req.GetRoute(),
		Region:        region,
	}
	key := ledger.PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
	if cerr := s.subjectOutOfScope(ctx, "record usage", key); cerr != nil {
		return cmd, nil, cerr
	}
	p, units, refusal, cerr := s.mapActive(ctx, key, "actualUnits", req.GetActualUnits(), "record usage")
	if cerr != nil {
		return cmd, nil, cerr
	}
	if refusal == nil {
		cmd.Units, cmd.Generation = units, p.Generation
		return cmd, nil, nil
	}
	existing, err := s.ledger.Reservation(ctx, cmd.ReservationID)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return cmd, nil, refusal
		}
		return cmd, nil, notSentError("record usage "+cmd.ReservationID, ReasonReservationNotFound, err)
	}
	// The id is taken: the ledger answers from it before it reads a
	// policy. The usage goes in the order of the reservation's own
	// generation; usage that generation cannot place is not what was
	// recorded, and the server's refusal stands. Should the id vanish
	// before the ledger looks (retention forgetting it in between), the
	// ledger records these units, the request's own, only if that
	// generation decides by then (else it refuses them as stale, and the
	// command is mapped again); recordOutcome then answers that record,
	// as for any other: one read, the ledger's, decides the answer.
	ep, err := s.policies.get(ctx, existing.Account.Generation)
	if err != nil {
		return cmd, nil, refusal
	}
	if units, cerr = amounts(&ep, "actualUnits", req.GetActualUnits()); cerr != nil {
		return cmd, nil, refusal
	}
	cmd.Units, cmd.Generation = units, existing.Account.Generation
	return cmd, refusal, nil
}

// RecordCommand validates req and maps its usage as RecordUsage does, for
// protocol adapters (see ReserveCommand for unmapped and invalid).
func (s *Server) RecordCommand(ctx context.Context, req *v1.RecordUsageRequest) (cmd ledger.Command, unmapped, invalid *connect.Error) {
	return s.recordCommand(ctx, req)
}

// recordOutcome turns the ledger's answer to a record into the response
// or the error.
func (s *Server) recordOutcome(ctx context.Context, res *ledger.Result, unmapped *connect.Error) (*v1.RecordUsageResponse, *connect.Error) {
	if r := &res.Reservation; r.ID != "" && s.outOfScope(ctx, "record usage", r.Account.Subject, r.Account.Route, "reservation", r.ID) {
		return nil, idTaken() // the id is another tenant's
	}
	// The server's refusal (unmapped) stands unless the ledger answered
	// from the id (a replay, a mismatch, another record there) or
	// recorded the request's usage under the generation that decides
	// (the id was forgotten meanwhile): the answer is what the ledger did.
	if unmapped != nil && res.Err != nil && !errors.Is(res.Err, ledger.ErrDigestMismatch) &&
		!errors.Is(res.Err, ledger.ErrReservationAlreadySettled) {
		return nil, unmapped
	}
	if res.Err != nil {
		return nil, s.outcomeError(ctx, res)
	}
	pb, cerr := s.reservation(ctx, "record usage", res)
	if cerr != nil {
		return nil, cerr
	}
	if res.Reservation.State == ledger.StateSettledWithDebt && !res.Replayed {
		s.log.Info("usage recorded with debt, admission frozen", "reservation", res.Reservation.ID,
			"account", res.Reservation.Account.String(), "breach", res.Reservation.Breach)
	}
	return &v1.RecordUsageResponse{Reservation: pb, Replayed: res.Replayed, PolicyGeneration: res.Generation}, nil
}

// RecordUsage implements LedgerService.RecordUsage.
func (s *Server) RecordUsage(ctx context.Context, req *connect.Request[v1.RecordUsageRequest]) (*connect.Response[v1.RecordUsageResponse], error) {
	resp, res, cerr := s.recordOne(ctx, req.Msg)
	s.metrics.command(ledger.KindRecord, answerOutcome(res, cerr))
	if cerr != nil {
		return nil, cerr
	}
	return connect.NewResponse(resp), nil
}

// recordOne runs one record, mapping it again if the policy changed under
// it, and returns the answer and the ledger's last result (nil when none
// came) for the caller to count: a stale refusal mapped again is no
// answer, and the server may answer its own refusal (unmapped) in place
// of the ledger's.
func (s *Server) recordOne(ctx context.Context, req *v1.RecordUsageRequest) (*v1.RecordUsageResponse, *ledger.Result, *connect.Error) {
	for attempt := 0; ; attempt++ {
		cmd, unmapped, invalid := s.recordCommand(ctx, req)
		if invalid != nil {
			return nil, nil, invalid
		}
		res, cerr := s.exec(ctx, cmd)
		if cerr != nil {
			return nil, nil, cerr
		}
		if again, cerr := s.mapAgain(ctx, "record usage", attempt, &cmd, &res); cerr != nil {
			return nil, &res, cerr
		} else if again {
			continue
		}
		resp, cerr := s.recordOutcome(ctx, &res, unmapped)
		return resp, &res, cerr
	}
}
