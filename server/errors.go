package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// This file is the one place where ledger outcomes and operating failures
// become wire errors. Every handler and every batch item goes through
// outcomeError (for ledger.Result.Err) or operatingError (for the engine's
// error return), so a status code means the same thing on every method.

// Reasons of ErrorDetail and RejectionDetail, documented in the .proto.
const (
	ReasonInsufficientCapacity = "INSUFFICIENT_CAPACITY"
	ReasonAdmissionFrozen      = "ADMISSION_FROZEN"
	ReasonReservationTooLarge  = "RESERVATION_TOO_LARGE"
	ReasonNoPolicy             = "NO_POLICY"
	ReasonPolicyNotFound       = "POLICY_NOT_FOUND"
	ReasonReservationNotFound  = "RESERVATION_NOT_FOUND"
	ReasonAccountNotFound      = "ACCOUNT_NOT_FOUND"
	ReasonDigestMismatch       = "DIGEST_MISMATCH"
	ReasonNotStarted           = "RESERVATION_NOT_STARTED"
	ReasonAlreadyStarted       = "RESERVATION_ALREADY_STARTED"
	ReasonAlreadySettled       = "RESERVATION_ALREADY_SETTLED"
	ReasonReleased             = "RESERVATION_RELEASED"
	ReasonExpired              = "RESERVATION_EXPIRED"
	ReasonOperationMismatch    = "OPERATION_MISMATCH"
	ReasonNotDue               = "RESERVATION_NOT_DUE"
	ReasonLifetimeExhausted    = "ACCOUNT_LIFETIME_EXHAUSTED"
	ReasonInvalidCommand       = "INVALID_COMMAND"
	ReasonInvalidPolicy        = "INVALID_POLICY"
	ReasonGenerationChanged    = "POLICY_GENERATION_CHANGED"
	ReasonUnknownUnit          = "UNKNOWN_UNIT"
	ReasonStoreUnavailable     = "STORE_UNAVAILABLE"
	ReasonStoreConflict        = "STORE_CONFLICT"
	ReasonPolicyChanging       = "POLICY_CHANGING"
	ReasonPermissionDenied     = "PERMISSION_DENIED"
	ReasonUnauthenticated      = "UNAUTHENTICATED"
)

// classification is what one ledger error means on the wire.
type classification struct {
	code   connect.Code
	reason string
	// capacity marks a rejection (RESOURCE_EXHAUSTED + RejectionDetail).
	capacity bool
	// withReservation: the current reservation is worth showing (state
	// errors), so the caller sees what happened to it.
	withReservation bool
}

// ledgerErrors is checked in order with errors.Is; the first match wins.
var ledgerErrors = []struct {
	err   error
	class classification
}{
	{ledger.ErrInsufficientCapacity, classification{code: connect.CodeResourceExhausted, reason: ReasonInsufficientCapacity, capacity: true}},
	{ledger.ErrAdmissionFrozen, classification{code: connect.CodeResourceExhausted, reason: ReasonAdmissionFrozen, capacity: true}},
	{ledger.ErrReservationTooLarge, classification{code: connect.CodeResourceExhausted, reason: ReasonReservationTooLarge, capacity: true}},
	{ledger.ErrDigestMismatch, classification{code: connect.CodeAlreadyExists, reason: ReasonDigestMismatch}},
	{ledger.ErrNoPolicy, classification{code: connect.CodeNotFound, reason: ReasonNoPolicy}},
	{ledger.ErrPolicyNotFound, classification{code: connect.CodeNotFound, reason: ReasonPolicyNotFound}},
	{ledger.ErrReservationNotFound, classification{code: connect.CodeNotFound, reason: ReasonReservationNotFound}},
	{ledger.ErrAccountNotFound, classification{code: connect.CodeNotFound, reason: ReasonAccountNotFound}},
	{ledger.ErrReservationNotStarted, classification{code: connect.CodeFailedPrecondition, reason: ReasonNotStarted, withReservation: true}},
	{ledger.ErrReservationAlreadyStarted, classification{code: connect.CodeFailedPrecondition, reason: ReasonAlreadyStarted, withReservation: true}},
	{ledger.ErrReservationAlreadySettled, classification{code: connect.CodeFailedPrecondition, reason: ReasonAlreadySettled, withReservation: true}},
	{ledger.ErrReservationReleased, classification{code: connect.CodeFailedPrecondition, reason: ReasonReleased, withReservation: true}},
	{ledger.ErrReservationExpired, classification{code: connect.CodeFailedPrecondition, reason: ReasonExpired, withReservation: true}},
	{ledger.ErrOperationMismatch, classification{code: connect.CodeFailedPrecondition, reason: ReasonOperationMismatch, withReservation: true}},
	{ledger.ErrReservationNotDue, classification{code: connect.CodeFailedPrecondition, reason: ReasonNotDue, withReservation: true}},
	{ledger.ErrLifetimeExhausted, classification{code: connect.CodeFailedPrecondition, reason: ReasonLifetimeExhausted, withReservation: true}},
	{ledger.ErrPolicyGenerationChanged, classification{code: connect.CodeFailedPrecondition, reason: ReasonGenerationChanged}},
	{ledger.ErrInvalidPolicy, classification{code: connect.CodeInvalidArgument, reason: ReasonInvalidPolicy}},
	{ledger.ErrInvalidCommand, classification{code: connect.CodeInvalidArgument, reason: ReasonInvalidCommand}},
}

// classify returns the wire meaning of a ledger error. Errors the table
// does not know (a new ledger sentinel nobody mapped yet) are INTERNAL, so
// they are noticed rather than passed off as a client mistake.
func classify(err error) classification {
	for _, entry := range ledgerErrors {
		if errors.Is(err, entry.err) {
			return entry.class
		}
	}
	return classification{code: connect.CodeInternal, reason: "INTERNAL"}
}

// rejection builds the RejectionDetail of a capacity rejection.
func rejection(res *ledger.Result, reason string) *v1.RejectionDetail {
	detail := &v1.RejectionDetail{
		PolicyGeneration:  res.Generation,
		LimitingDimension: res.Dimension,
		Reason:            reason,
	}
	if res.RetryAfter > 0 {
		detail.RetryAfter = durationpb.New(ledger.WholeSeconds(res.RetryAfter))
	}
	return detail
}

// outcomeError turns a ledger outcome whose Err is set into a connect error
// with its detail: capacity rejections get RESOURCE_EXHAUSTED, a
// Retry-After header (whole seconds, when refill can help) and a
// RejectionDetail; everything else an ErrorDetail with the reason (and the
// reservation as it is now, for state errors). units renders the
// reservation's amounts by unit name.
func (s *Server) outcomeError(ctx context.Context, res *ledger.Result) *connect.Error {
	class := classify(res.Err)
	cerr := connect.NewError(class.code, refusal{outcomeMessage(res.Err), res.Err})
	if class.capacity {
		detail := rejection(res, class.reason)
		s.metrics.rejection(res.Dimension, class.reason)
		if res.RetryAfter > 0 {
			cerr.Meta().Set("Retry-After", strconv.FormatInt(int64(ledger.WholeSeconds(res.RetryAfter)/time.Second), 10))
		}
		attachDetail(cerr, detail)
		return cerr
	}
	detail := errorDetail(class.reason, res.Err)
	if class.withReservation && res.Reservation.ID != "" {
		if pb, err := s.reservationProto(ctx, &res.Reservation); err == nil {
			detail.Reservation = pb
		}
	}
	attachDetail(cerr, detail)
	return cerr
}

// itemError is outcomeError for one batch item: the same code and detail,
// carried in the response instead of failing the call. A refused field's
// path (ErrorDetail.field) is within the item, as its message is.
func (s *Server) itemError(ctx context.Context, res *ledger.Result) *v1.ItemError {
	class := classify(res.Err)
	item := &v1.ItemError{Code: class.code.String(), Message: outcomeMessage(res.Err)}
	if class.capacity {
		item.Rejection = rejection(res, class.reason)
		s.metrics.rejection(res.Dimension, class.reason)
		return item
	}
	item.Detail = errorDetail(class.reason, res.Err)
	if class.withReservation && res.Reservation.ID != "" {
		if pb, err := s.reservationProto(ctx, &res.Reservation); err == nil {
			item.Detail.Reservation = pb
		}
	}
	return item
}

// outcomeMessage is what the answer to a refused command says: err's
// text, less the "invalid command: " or "invalid policy: " that the
// ledger's ErrInvalidCommand and ErrInvalidPolicy put first. The reason
// (INVALID_COMMAND, INVALID_POLICY) says that already, and the server's
// own checks at the door say what is wrong alone: one refusal must not
// read two ways by the layer that decided it.
func outcomeMessage(err error) string {
	for _, said := range []error{ledger.ErrInvalidCommand, ledger.ErrInvalidPolicy} {
		if errors.Is(err, said) {
			return strings.TrimPrefix(err.Error(), said.Error()+": ")
		}
	}
	return err.Error()
}

// fieldRefusal is the one answer to a refused field (a *ledger.FieldError
// in err): 400 invalid_argument with reason, the message the field's path
// in the request (rooted under parent, the request field that held the
// checked value, "policy"; "" when it is the request itself), then what is
// wrong, with nothing before it (API.md, "Errors"). An err without a
// FieldError answers outcomeMessage's text.
func fieldRefusal(reason, parent string, err error) *connect.Error {
	var fe *ledger.FieldError
	if errors.As(err, &fe) {
		return refuseField(reason, fe.Under(parent))
	}
	return invalidArgument(reason, "%s", outcomeMessage(err))
}

// refuseField is the answer to one refused request field, fe (its path
// from the request's root, or from a batch item's): 400 invalid_argument,
// the message fe's text (the path first, API.md "Field paths"), and an
// ErrorDetail with reason and field = fe's path (errorDetail).
func refuseField(reason string, fe *ledger.FieldError) *connect.Error {
	return withReason(connect.NewError(connect.CodeInvalidArgument, refusal{fe.Text(), fe}), reason)
}

// invalidField is refuseField of the field at path (from the request's
// root), the problem formatted as a phrase that follows the path (after
// a space, or starting with ":" for the field as a whole or a key of its
// map: ledger.FieldError.Text).
func invalidField(reason, path, format string, args ...any) *connect.Error {
	kind := ledger.ErrInvalidCommand
	switch reason {
	case ReasonInvalidPolicy:
		kind = ledger.ErrInvalidPolicy
	case ReasonInvalidRollout:
		kind = ledger.ErrInvalidRollout
	}
	return refuseField(reason, ledger.NewFieldError(kind, path, fmt.Sprintf(format, args...)))
}

// errorDetail is the one place an ErrorDetail is made: its reason, and
// for a refused field (a *ledger.FieldError in err, which every
// validation refusal of one field carries: refuseField, the ledger's
// Policy.Validate, NewRollout, shape and receipt checks) the field's path
// as the message starts with it; no field for anything else.
func errorDetail(reason string, err error) *v1.ErrorDetail {
	detail := &v1.ErrorDetail{Reason: reason}
	var fe *ledger.FieldError
	if errors.As(err, &fe) {
		detail.Field = fe.Path
	}
	return detail
}

// refusal is a ledger outcome's error with the text outcomeMessage gives
// it; errors.Is still finds the ledger's error under it.
type refusal struct {
	text string
	err  error
}

func (r refusal) Error() string { return r.text }
func (r refusal) Unwrap() error { return r.err }

// operatingError maps an engine or store failure (not a ledger outcome).
// The message says what is known of the command's outcome: "not applied"
// when the engine knows nothing was committed (engine.ErrNotApplied: the
// transaction failed before its COMMIT was sent, or was rolled back),
// "outcome unknown" when a COMMIT may have happened; the code and reason
// are the same for both, and the caller retries with the same ids either
// way, never with new ones.
func operatingError(what string, err error) *connect.Error {
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr
	}
	var code connect.Code
	reason := ReasonStoreUnavailable
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Reads of a missing row; the handler names what was missing.
		return notFound(ReasonReservationNotFound, missingName(what, err))
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, store.ErrConflict):
		code, reason = connect.CodeUnavailable, ReasonStoreConflict
	default:
		// store.ErrUnavailable, engine.ErrClosed (shutting down) and
		// anything else the store reports: the ledger cannot answer now.
		code = connect.CodeUnavailable
	}
	msg := fmt.Errorf("%s: outcome unknown, retry with the same ids: %w", what, err)
	if errors.Is(err, engine.ErrNotApplied) {
		msg = fmt.Errorf("%s: not applied (nothing was committed), retry with the same ids: %w", what, err)
	}
	if errors.Is(err, engine.ErrClosed) {
		msg = fmt.Errorf("%s: server shutting down, retry with the same ids: %w", what, err)
	}
	return withReason(connect.NewError(code, msg), reason)
}

// staleError is the answer to a command the ledger still refused as
// stale (res: mapped for a generation that no longer decides) after it
// was mapped again staleRetries times: publishes on its policy key raced
// every attempt. Nothing was applied, and the request is not malformed: a
// retry maps it by the generation that decides then. So it is answered as
// a conflict that persisted (operatingError): 503 unavailable,
// STORE_CONFLICT, "not applied", retry with the same ids, not as the
// ledger's refusal (400 INVALID_COMMAND), which tells a client to fix a
// request that was fine.
func staleError(what string, res *ledger.Result) *connect.Error {
	return withReason(connect.NewError(connect.CodeUnavailable, fmt.Errorf(
		"%s: not applied (the deciding policy generation changed while the call ran), retry with the same ids: %s",
		what, outcomeMessage(res.Err))), ReasonStoreConflict)
}

// readError maps a failed read (nothing was changed, so no "outcome
// unknown"): store.ErrNotFound becomes notFound's answer with the given
// reason, naming the missing row (named), else what; any other error is
// unavailable, its message prefixed with "what: " (nothing when what is
// empty: the error names itself).
func readError(what, notFoundReason string, err error) *connect.Error {
	if errors.Is(err, store.ErrNotFound) {
		return notFound(notFoundReason, missingName(what, err))
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		return cerr
	}
	code := connect.CodeUnavailable
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	if what != "" {
		err = fmt.Errorf("%s: %w", what, err)
	}
	return withReason(connect.NewError(code, err), ReasonStoreUnavailable)
}

// appliedError maps a failure to build the answer of a command the
// ledger committed (rendering its receipt reads the policy, which may
// fail): 503 STORE_UNAVAILABLE (499/504 for the caller's context) whose
// message says "applied": the command took effect, and a retry with the
// same ids replays it and gets the answer (every command is idempotent).
// It was a read error that said neither applied nor not applied, and a
// missing policy answered 404 for a command that had committed.
func appliedError(what string, err error) *connect.Error {
	return appliedErrorAdvising(what, "retry with the same ids to read it", err)
}

// appliedErrorAdvising is appliedError with its own advice, for a
// command that has no id to retry by (PublishPolicy: publishing again
// replays only while the published generation is still the active one).
func appliedErrorAdvising(what, advice string, err error) *connect.Error {
	code := connect.CodeUnavailable
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	return withReason(connect.NewError(code,
		fmt.Errorf("%s: applied (committed), but the answer could not be built; %s: %w", what, advice, err)), ReasonStoreUnavailable)
}

// notSentError maps a failed read that a write method makes before it
// sends its command (the reservation a Settle maps its usage by, the
// shard a ReconcileShard checks, a policy reload): as readError, but a
// store failure says "not applied", as operatingError says of a batch
// that failed before its COMMIT, since no command was sent.
func notSentError(what, notFoundReason string, err error) *connect.Error {
	var cerr *connect.Error
	if errors.Is(err, store.ErrNotFound) || errors.As(err, &cerr) {
		return readError(what, notFoundReason, err)
	}
	return operatingError(what, fmt.Errorf("%w: %w", engine.ErrNotApplied, err))
}

// invalidArgument is a malformed request caught before the ledger that
// names no one field (invalidField names one).
func invalidArgument(reason string, format string, args ...any) *connect.Error {
	return withReason(connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...)), reason)
}

// policyChangingError is DrainProgress's answer when the active
// generation of a generation's key moved during each of its passes
// (engine.ErrPolicyChanging): 503 unavailable, an answer to ask again,
// with a reason of its own, POLICY_CHANGING, so that nobody reads a store
// outage into it, and a Retry-After of as long as the passes took (whole
// seconds, at least 1), by when the publishes racing them may have paused.
func policyChangingError(err error, took time.Duration) *connect.Error {
	cerr := withReason(connect.NewError(connect.CodeUnavailable, err), ReasonPolicyChanging)
	cerr.Meta().Set("Retry-After", strconv.FormatInt(int64(RetryAfterSeconds(max(took, time.Second))/time.Second), 10))
	return cerr
}

// withReason attaches cerr's ErrorDetail (errorDetail of the error under
// it: a refused field's path comes with it whoever made cerr).
func withReason(cerr *connect.Error, reason string) *connect.Error {
	attachDetail(cerr, errorDetail(reason, cerr.Unwrap()))
	return cerr
}

func attachDetail(cerr *connect.Error, msg proto.Message) {
	if detail, err := connect.NewErrorDetail(msg); err == nil {
		cerr.AddDetail(detail)
	}
}

// noPolicy is the answer for a key no policy admits, and for one outside
// the caller's token scope (which, for that caller, is the same thing):
// 404 NO_POLICY naming the key.
func noPolicy(key ledger.PolicyKey) *connect.Error {
	return notFound(ReasonNoPolicy, key.String())
}

// notFoundWhat is, per not-found reason, the ledger error whose text
// begins the message: the words the ledger's own not-found outcomes use
// ("reservation not found: r-1"), so that an answer reads the same
// whether the server or the ledger found the row missing.
var notFoundWhat = map[string]error{
	ReasonNoPolicy:            ledger.ErrNoPolicy,
	ReasonPolicyNotFound:      ledger.ErrPolicyNotFound,
	ReasonReservationNotFound: ledger.ErrReservationNotFound,
	ReasonAccountNotFound:     ledger.ErrAccountNotFound,
	ReasonShardNotFound:       ledger.ErrShardNotFound,
	ReasonRolloutNotFound:     ledger.ErrRolloutNotFound,
}

// notFound is every not_found (404) answer the server decides itself
// (API.md, "Not found"): the message "<what> not found: <name>" (name is
// the id, generation, rollout name or subject/route@region asked for),
// one ErrorDetail with the reason alone. A scoped caller's refusal of
// something outside its scope is this same answer.
func notFound(reason, name string) *connect.Error {
	what, ok := notFoundWhat[reason]
	if !ok {
		what = errors.New(strings.ToLower(strings.ReplaceAll(reason, "_", " ")))
	}
	return withReason(connect.NewError(connect.CodeNotFound, fmt.Errorf("%w: %s", what, name)), reason)
}

// missing is a read of a named row that found none: it matches
// store.ErrNotFound, and readError, notSentError and operatingError answer
// it with notFound naming name. kind says what was read, for its text.
type missing struct{ kind, name string }

func (m *missing) Error() string        { return m.kind + " " + m.name + ": not found" }
func (m *missing) Is(target error) bool { return target == store.ErrNotFound }

// named returns err as the missing row kind name when it is a store
// not-found, else err as it is.
func named(err error, kind, name string) error {
	if errors.Is(err, store.ErrNotFound) {
		return &missing{kind: kind, name: name}
	}
	return err
}

// missingName is the name of the row err says is missing (named), else
// what.
func missingName(what string, err error) string {
	var m *missing
	if errors.As(err, &m) {
		return m.name
	}
	return what
}
