package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// Reasons the ledger puts in ErrorDetail.reason (see the .proto).
const (
	ReasonNoPolicy                  = "NO_POLICY"
	ReasonPolicyNotFound            = "POLICY_NOT_FOUND"
	ReasonReservationNotFound       = "RESERVATION_NOT_FOUND"
	ReasonDigestMismatch            = "DIGEST_MISMATCH"
	ReasonReservationNotStarted     = "RESERVATION_NOT_STARTED"
	ReasonReservationAlreadyStarted = "RESERVATION_ALREADY_STARTED"
	ReasonReservationAlreadySettled = "RESERVATION_ALREADY_SETTLED"
	ReasonReservationReleased       = "RESERVATION_RELEASED"
	ReasonReservationExpired        = "RESERVATION_EXPIRED"
	ReasonOperationMismatch         = "OPERATION_MISMATCH"
	ReasonLifetimeExhausted         = "ACCOUNT_LIFETIME_EXHAUSTED"
	ReasonPolicyGenerationChanged   = "POLICY_GENERATION_CHANGED"
	// ReasonInsufficientCapacity is the ledger's reason for an estimate
	// that does not fit now (a RejectedError's, and a shadow rejection's).
	ReasonInsufficientCapacity = "INSUFFICIENT_CAPACITY"
	// ReasonProxyRefused is a RejectedError's reason for an HTTP 429
	// without the ledger's RejectionDetail: something in between (a proxy,
	// a load balancer) refused the call, not the ledger.
	ReasonProxyRefused = "PROXY_REFUSED"
)

// Sentinel errors a *LedgerError matches with errors.Is, one per reason a
// gateway typically branches on.
var (
	ErrNoPolicy          = errors.New("no policy for subject, route and region")
	ErrNotFound          = errors.New("not found")
	ErrDigestMismatch    = errors.New("reservation id reused with a different request digest")
	ErrNotStarted        = errors.New("reservation not started")
	ErrAlreadyStarted    = errors.New("reservation already started")
	ErrAlreadySettled    = errors.New("reservation already settled differently")
	ErrReleased          = errors.New("reservation released")
	ErrExpired           = errors.New("reservation expired")
	ErrOperationMismatch = errors.New("operation id does not match the one bound at start")
	// ErrLifetimeExhausted: the account's lifetime counters are full (2^58
	// units spent); nothing changed, and an operator must publish a new
	// generation. A settle refused so leaves the reservation started.
	ErrLifetimeExhausted = errors.New("account lifetime counters exhausted")
	// ErrPolicyGenerationChanged: PublishPolicyEditedFrom named a
	// generation that is no longer the active one of its key; nothing was
	// published.
	ErrPolicyGenerationChanged = errors.New("policy generation changed since it was read")
	errReasonSentinelsByName   = map[string]error{
		ReasonNoPolicy:                  ErrNoPolicy,
		ReasonPolicyNotFound:            ErrNotFound,
		ReasonReservationNotFound:       ErrNotFound,
		ReasonDigestMismatch:            ErrDigestMismatch,
		ReasonReservationNotStarted:     ErrNotStarted,
		ReasonReservationAlreadyStarted: ErrAlreadyStarted,
		ReasonReservationAlreadySettled: ErrAlreadySettled,
		ReasonReservationReleased:       ErrReleased,
		ReasonReservationExpired:        ErrExpired,
		ReasonOperationMismatch:         ErrOperationMismatch,
		ReasonLifetimeExhausted:         ErrLifetimeExhausted,
		ReasonPolicyGenerationChanged:   ErrPolicyGenerationChanged,
	}
)

// ErrReceiptRefused matches (errors.Is) the error of ResolveUnknown, and
// the one WithRefusedReceipts receives, when the ledger's answer to an
// operation receipt is final: no call with the receipt can ever settle or
// release its reservation, so the receipt has left PendingUnknown. The
// error also matches the ledger's answer (a *LedgerError), one of (a
// background check of a receipt of unknown usage also reports
// ErrReleased and ErrExpired, see WithRefusedReceipts):
//   - ErrAlreadySettled: another settle of the reservation is recorded
//     (the *LedgerError's Reservation shows it; the USAGE_UNKNOWN resolver
//     or an operator settled it with other figures), or, once retention
//     removed the reservation (Reservation.Retired), it is settled and its
//     tombstone does not keep how: possibly by this receipt's own earlier
//     settle;
//   - ErrOperationMismatch: the reservation was started under another
//     operation id;
//   - ErrNotFound (reason RESERVATION_NOT_FOUND): the ledger does not
//     know the reservation. Retention removes only ended reservations and
//     forgets their tombstones after serve --tombstone-retention, so
//     started work was settled (by this receipt's settle, the resolver or
//     an operator: which, and with what usage, can no longer be learned;
//     so this is no proof that this receipt's usage was recorded), and a
//     hold whose Start never landed was settled, released or expired; or
//     the ledger was restored without it, or this Client's token no
//     longer has its subject in scope (the ledger answers the same). That
//     last one can change: the reservation still holds its capacity and
//     the receipt settles it once the token's scope covers the subject
//     again, so keep refused receipts if your tokens' scopes can change.
//
// Answers that are not final (lost answers, unavailable, a 5xx or 429 of a
// proxy, an error without the ledger's reason, invalid_argument for the
// usage given, permission) leave the receipt in PendingUnknown.
var ErrReceiptRefused = errors.New("operation receipt refused for good")

// ErrUsageUnknown is returned (or wrapped) by a Run function to say that it
// cannot tell how much its work used; Run then marks the reservation
// USAGE_UNKNOWN instead of settling it.
var ErrUsageUnknown = errors.New("usage unknown")

// RejectedError is a capacity rejection: the ledger answered
// RESOURCE_EXHAUSTED (HTTP 429). It is an answer, not a fault: the SDK
// never retries it on its own, because only time (refill) or debt
// repayment can change it.
type RejectedError struct {
	// ReservationID is the id that was refused; nothing was reserved.
	ReservationID string
	// Generation is the policy generation that decided.
	Generation uint64
	// Dimension is the unit that did not fit, e.g. "tokens".
	Dimension string
	// Reason is the ledger's INSUFFICIENT_CAPACITY, ADMISSION_FROZEN or
	// RESERVATION_TOO_LARGE, or ReasonProxyRefused when the 429 carried no
	// RejectionDetail (a proxy or load balancer in between answered it:
	// the ledger decided nothing, Dimension is empty and Generation 0).
	Reason string
	// RetryAfter is the ledger's conservative wait before refill alone
	// could admit the request; 0 when no wait helps (the policy never
	// refills, or the estimate is larger than it ever allows).
	RetryAfter time.Duration
	message    string
}

func (e *RejectedError) Error() string {
	s := fmt.Sprintf("capacity rejected (%s, dimension %q, generation %d", e.Reason, e.Dimension, e.Generation)
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(", retry after %s", e.RetryAfter)
	}
	return s + ")"
}

// RetryAfterSeconds returns RetryAfter rounded up to whole seconds, the
// value for an HTTP Retry-After header (0: omit the header).
func (e *RejectedError) RetryAfterSeconds() int64 {
	return int64(math.Ceil(e.RetryAfter.Seconds()))
}

// LedgerError is every other answer the ledger decided (not found, digest
// mismatch, state errors, invalid arguments, permission). errors.Is matches
// it against the sentinel of its reason (ErrNotFound, ErrExpired, ...).
type LedgerError struct {
	// Op is the method, e.g. "start".
	Op string
	// Code is the connect/gRPC code.
	Code connect.Code
	// Reason is the ErrorDetail reason, e.g. "RESERVATION_EXPIRED"; empty
	// when the server attached none.
	Reason string
	// Reservation is the reservation as it is now, for state errors.
	Reservation *ledgerv1.Reservation
	// Field is the ErrorDetail field of a validation refusal
	// (INVALID_COMMAND, INVALID_POLICY, INVALID_ROLLOUT, UNKNOWN_UNIT): the
	// path of the refused field in the request as its JSON spells it
	// ("policy.dimensions[1].burst", "receipts[2].reservationId"), the
	// words the server's message starts with; within a ReserveBatch or
	// SettleBatch item's error, relative to the item ("reservationId").
	// Empty for every other answer, and for a refusal of the request as a
	// whole (docs/API.md, "Field paths").
	Field string
	// Err is the underlying connect error.
	Err error
}

func (e *LedgerError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s: %s (%s): %v", e.Op, e.Code, e.Reason, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", e.Op, e.Code, e.Err)
}

func (e *LedgerError) Unwrap() error { return e.Err }

// Is reports whether target is the sentinel of e's reason (or ErrNotFound
// for any NOT_FOUND answer).
func (e *LedgerError) Is(target error) bool {
	if s, ok := errReasonSentinelsByName[e.Reason]; ok && s == target {
		return true
	}
	return target == ErrNotFound && e.Code == connect.CodeNotFound && e.Reason != ReasonNoPolicy
}

// ranAlreadyError is Run's answer to a request whose id already moved on
// from RESERVED (the same request run before: a retry after a crash, as
// docs/CLIENTS.md section 2 rule 2 asks): the work is not run again, and
// the answer is a *LedgerError a caller can branch on, as the ledger's own
// answer to a Start of it would be: the sentinel of res's state
// (ErrAlreadyStarted for STARTED and USAGE_UNKNOWN, ErrAlreadySettled,
// ErrReleased, ErrExpired), with the reservation as it is now.
func ranAlreadyError(res *ledgerv1.Reservation) *LedgerError {
	reason, ended := endedReason(res.GetState())
	switch {
	case res.GetState() == ledgerv1.ReservationState_RESERVATION_STATE_EXPIRING:
		reason = ReasonReservationExpired // being expired: it cannot start
	case !ended:
		reason = ReasonReservationAlreadyStarted
	}
	err := connect.NewError(connect.CodeFailedPrecondition,
		fmt.Errorf("reservation %s is %s, not RESERVED: a request already ran under this id; its work is not run again", res.GetReservationId(), res.GetState()))
	return &LedgerError{Op: "run", Code: connect.CodeFailedPrecondition, Reason: reason, Reservation: res, Err: err}
}

// ReservationUnknownError says a Reserve answer was lost and the SDK could
// not find out, within its retries and the lookup after them, whether the
// ledger admitted the reservation (RESERVATION_UNKNOWN). The id may still be
// admitted by a request in flight. Resolve it with the SAME id: call
// ResolveReservation, or Reserve again with ReservationID and the same
// digest; never mint a new id for the same request. An admitted but never
// started reservation is returned to available by expiry after the hold TTL.
type ReservationUnknownError struct {
	ReservationID string
	RequestDigest string
	// Attempts is how many Reserve calls were sent.
	Attempts int
	// Err is the last transport error.
	Err error
	// LookingUp is set when the lookup of the id continues in the
	// background (Client.LostReserves).
	LookingUp bool
}

func (e *ReservationUnknownError) Error() string {
	return fmt.Sprintf("reserve %s: RESERVATION_UNKNOWN after %d attempts: %v", e.ReservationID, e.Attempts, e.Err)
}

func (e *ReservationUnknownError) Unwrap() error { return e.Err }

// UsageUnknownError says started work ended without a known usage (it
// panicked, was cancelled without reporting usage, returned
// ErrUsageUnknown, or the settle answer was lost). The reservation is
// USAGE_UNKNOWN on the ledger (or, if even MarkUsageUnknown could not be
// confirmed, STARTED): its capacity stays held, never refunded, until
// ResolveUnknown settles it with the Receipt.
type UsageUnknownError struct {
	Receipt OperationReceipt
	// Marked is true when the ledger confirmed the USAGE_UNKNOWN state.
	Marked bool
	// Err is the cause.
	Err error
}

func (e *UsageUnknownError) Error() string {
	return fmt.Sprintf("reservation %s operation %s: USAGE_UNKNOWN: %v", e.Receipt.ReservationID, e.Receipt.OperationID, e.Err)
}

func (e *UsageUnknownError) Unwrap() error { return e.Err }

// classify turns a connect error into the SDK's typed error for op and
// id. Transport faults (no answer was received) are returned unchanged.
func classify(op, id string, err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	switch ce.Code() {
	case connect.CodeResourceExhausted:
		// Without a RejectionDetail the ledger did not answer: a proxy or
		// load balancer in between refused the call (ReasonProxyRefused).
		rej := &RejectedError{ReservationID: id, Reason: ReasonProxyRefused, message: ce.Message()}
		found := false
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if rd, ok := v.(*ledgerv1.RejectionDetail); ok {
					fillRejection(rej, rd)
					found = true
				}
			}
		}
		// Without a detail (an intermediary answered 429) the header is
		// all there is; with one the header and the detail agree.
		if !found || rej.RetryAfter == 0 {
			if secs, perr := strconv.ParseInt(ce.Meta().Get("Retry-After"), 10, 64); perr == nil && secs > 0 {
				rej.RetryAfter = time.Duration(secs) * time.Second
			}
		}
		return rej
	case connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodeFailedPrecondition,
		connect.CodeInvalidArgument, connect.CodePermissionDenied, connect.CodeUnauthenticated,
		connect.CodeOutOfRange, connect.CodeUnimplemented:
		le := &LedgerError{Op: op, Code: ce.Code(), Err: err}
		for _, d := range ce.Details() {
			if v, derr := d.Value(); derr == nil {
				if ed, ok := v.(*ledgerv1.ErrorDetail); ok {
					le.Reason = ed.GetReason()
					le.Reservation = ed.GetReservation()
					le.Field = ed.GetField()
				}
			}
		}
		if le.Reason == "" && ce.Code() == connect.CodeAlreadyExists && op == "reserve" {
			// ALREADY_EXISTS on Reserve means only one thing.
			le.Reason = ReasonDigestMismatch
		}
		return le
	}
	return err
}

func fillRejection(rej *RejectedError, rd *ledgerv1.RejectionDetail) {
	rej.Generation = rd.GetPolicyGeneration()
	rej.Dimension = rd.GetLimitingDimension()
	rej.Reason = rd.GetReason()
	if rej.Reason == "" {
		rej.Reason = ReasonInsufficientCapacity // the ledger's detail before it carried a reason
	}
	if ra := rd.GetRetryAfter(); ra != nil {
		rej.RetryAfter = ra.AsDuration()
	}
}

// retryable reports whether err is a fault after which the answer is
// unknown and the same call may be sent again: the request may or may not
// have been applied, and every mutating call is idempotent on its id, so a
// retry with the same ids either applies it once or repeats the recorded
// answer. A context error of the caller's own ctx is not retryable (the
// caller gave up); a per-attempt timeout is.
func retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var cert *tls.CertificateVerificationError
	if errors.As(err, &cert) {
		return false // a repeat meets the same certificate
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown,
		connect.CodeInternal, connect.CodeAborted, connect.CodeCanceled, connect.CodeDataLoss:
		return true
	}
	return false
}
