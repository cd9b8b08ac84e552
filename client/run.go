package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// OperationReceipt identifies started work: the reservation and the
// operation id bound at Start. It is the only thing that can resolve a
// USAGE_UNKNOWN reservation (ResolveUnknown), so keep it until then.
type OperationReceipt struct {
	ReservationID    string
	OperationID      string
	Subject          string
	Route            string
	Region           string
	PolicyGeneration uint64
	// Reserved is the estimate held.
	Reserved Units
	// Actual is the usage the work reported, when it reported one (the
	// settle answer was lost); nil when the usage itself is unknown.
	Actual    Units
	StartedAt time.Time
}

// Work is the caller's function that Run executes once the reservation is
// started. It returns the actual units it used. Its result decides the
// settlement:
//   - a non-nil actual settles with it, whatever the error (work that failed
//     half way reports what it used); a reserved unit it leaves out is
//     settled at its estimate (the ledger refuses a settle that does not
//     state every reserved unit, and an unmeasured unit is no proof of
//     zero);
//   - nil actual and a nil error, or an error that is not a context error,
//     settles with zero usage of every reserved unit (the work reports that
//     it used nothing);
//   - an error wrapping ErrUsageUnknown, or nil actual with a context error
//     (context.Canceled or DeadlineExceeded: the caller's context ended, or
//     a call inside the work timed out), or a panic, marks the reservation
//     USAGE_UNKNOWN: the work may still be running somewhere, so its
//     capacity stays held and is never refunded on cancellation.
type Work func(ctx context.Context) (actual Units, err error)

// RunResult is the outcome of Run.
type RunResult struct {
	// Reservation is the reservation after settlement (SETTLED or
	// SETTLED_WITH_DEBT), or nil for a shadow run.
	Reservation *ledgerv1.Reservation
	// Receipt is the operation receipt (empty for a shadow run).
	Receipt OperationReceipt
	// Refunded is what settlement returned to available.
	Refunded Units
	// Shadow is true when a shadow-mode policy would have rejected the
	// request: the work ran without a reservation, and ShadowRejection says
	// what enforcement would have answered.
	Shadow          bool
	ShadowRejection *RejectedError
}

// gate runs between a successful Reserve and Start; the middleware uses it
// to wait for a fair-scheduler dispatch. It returns done, called once with
// the settled actual cost (or 0 when the work never ran), or an error when
// the work must not start.
type gate func(ctx context.Context, rr *ReserveResult) (done func(actual Units), err error)

// Run executes work under a reservation: Reserve, Start (binding a fresh
// operation id), work, Settle with the units work reports. It returns:
//   - the result and work's own error (nil or not) once settled;
//   - the Reserve errors (*RejectedError, *ReservationUnknownError,
//     *LedgerError) when nothing was reserved, without calling work;
//   - the Start error when the reservation could not be started (work is not
//     called; a Start whose answer was lost is undone: released, or settled
//     at zero if it landed; until the ledger answers that the reservation
//     ended, or gives a final answer (ErrReceiptRefused), its receipt is
//     kept with zero usage (PendingUnknown) and resent; a Start never
//     sent, the ledger unreachable, leaves the
//     reservation to expire after its hold TTL);
//   - a *LedgerError (Op "run") when req's id names a reservation that
//     already moved on from RESERVED (the same request run before, retried
//     after a crash): work is not called again; it matches the sentinel of
//     the reservation's state (ErrAlreadyStarted for STARTED and
//     USAGE_UNKNOWN, ErrAlreadySettled, ErrReleased, ErrExpired) and
//     carries the reservation as it is now;
//   - ctx.Err() when ctx ended before Start (the reservation is released);
//   - *UsageUnknownError when work's usage is unknown (see Work), the
//     settle answer was lost (every UNAVAILABLE answer counts as lost,
//     also the ledger's "not applied": the SDK does not read messages),
//     the ledger refused the usage work reported
//     (invalid_argument: a negative amount, a unit the policy does not
//     have; the refusal is its Err, its Receipt has no Actual), or the
//     ledger could not record the usage (ErrLifetimeExhausted: the
//     account's lifetime counters are full): the
//     reservation is marked USAGE_UNKNOWN, its receipt is kept
//     (PendingUnknown) and ResolveUnknown settles it later;
//   - an error matching ErrReceiptRefused and ErrAlreadySettled when
//     the settle answer was lost and the ledger shows the work settled
//     under this operation with another usage (the USAGE_UNKNOWN resolver
//     or an operator settled it meanwhile): nothing is kept;
//   - *UsageUnknownError (Marked false) when the settle was not sent
//     (the breaker is open, the connection was refused) or a proxy in
//     between refused it (HTTP 429, *RejectedError): the
//     reservation stays STARTED and its receipt, with the usage, is kept
//     (PendingUnknown).
//
// A kept receipt whose usage is known is resent in the background with
// the same ids until it lands or the ledger's answer is final (see
// PendingUnknown).
//
// Once work has started, cancellation of ctx does not stop the bookkeeping:
// Settle and MarkUsageUnknown run on a context detached from ctx's
// cancellation, bounded by the retry policy. A panic in work is re-raised
// after the reservation is marked USAGE_UNKNOWN.
func (c *Client) Run(ctx context.Context, req ReserveRequest, work Work) (*RunResult, error) {
	return c.run(ctx, req, work, nil)
}

func (c *Client) run(ctx context.Context, req ReserveRequest, work Work, g gate) (*RunResult, error) {
	rr, err := c.Reserve(ctx, req)
	if err != nil {
		return nil, err
	}
	return c.runReserved(ctx, rr, work, g)
}

// runReserved is Run after a successful Reserve (Emergency.Run enters here
// for requests the ledger admitted).
func (c *Client) runReserved(ctx context.Context, rr *ReserveResult, work Work, g gate) (*RunResult, error) {
	if rr.ShadowRejected {
		_, werr := work(ctx)
		return &RunResult{Shadow: true, ShadowRejection: rr.ShadowRejection}, werr
	}
	res := rr.Reservation
	receipt := OperationReceipt{
		ReservationID: rr.ReservationID, Subject: res.GetSubject(), Route: res.GetRoute(), Region: res.GetRegion(),
		PolicyGeneration: res.GetPolicyGeneration(), Reserved: res.GetReservedUnits(),
	}
	if rr.Replayed && res.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_RESERVED {
		// The id was used before and has moved on: this request cannot run
		// under it again.
		return nil, ranAlreadyError(res)
	}

	done := func(Units) {}
	if g != nil {
		d, gerr := g(ctx, rr)
		if gerr != nil {
			c.releaseUnstarted(ctx, rr.ReservationID)
			return nil, gerr
		}
		done = d
	}
	if err := ctx.Err(); err != nil {
		c.releaseUnstarted(ctx, rr.ReservationID)
		done(nil)
		return nil, err
	}

	receipt.OperationID = NewOperationID()
	if err := c.recordOperation(ctx, receipt, OperationStarting, nil); err != nil {
		c.releaseUnstarted(ctx, rr.ReservationID)
		done(nil)
		return nil, fmt.Errorf("run: record operation: %w", err)
	}
	started, err := c.start(ctx, receipt)
	if err != nil {
		_ = c.recordOperation(ctx, receipt, OperationNeverStarted, nil) // the work is not called
		done(nil)
		return nil, fmt.Errorf("run: %w", err)
	}
	receipt.StartedAt = started.GetStartedAt().AsTime()
	if err := c.recordOperation(ctx, receipt, OperationRunning, nil); err != nil {
		// Without a record the resolver could not answer for the work:
		// do not call it. Started but never run: zero usage.
		c.abandonStart(ctx, receipt)
		_ = c.recordOperation(ctx, receipt, OperationNeverStarted, nil)
		done(nil)
		return nil, fmt.Errorf("run: record operation: %w", err)
	}

	actual, werr, panicked, panicValue := runWork(context.WithValue(ctx, receiptKey{}, receipt), work)
	unknown := panicked || errors.Is(werr, ErrUsageUnknown) || (actual == nil && isContextError(werr))
	if unknown {
		cause := werr
		if panicked {
			cause = fmt.Errorf("work panicked: %v", panicValue)
		} else if cause == nil {
			cause = ErrUsageUnknown
		}
		_ = c.recordOperation(ctx, receipt, OperationUnknown, nil)
		_, uerr := c.markUnknown(ctx, receipt, cause)
		done(receipt.Reserved)
		if panicked {
			panic(panicValue)
		}
		return nil, uerr
	}
	actual = usageToSettle(actual, receipt.Reserved)
	receipt.Actual = actual
	// Before the settle, so the resolver can settle with it if the
	// settle is lost; a failure here leaves the record running (the
	// resolver then keeps it USAGE_UNKNOWN), never wrong. A usage the
	// ledger will refuse ends USAGE_UNKNOWN (below): recorded so, since
	// a finished record is final and would answer the refused figures.
	if usageProblem(actual, receipt.Reserved) != "" {
		_ = c.recordOperation(ctx, receipt, OperationUnknown, nil)
	} else {
		_ = c.recordOperation(ctx, receipt, OperationFinished, actual)
	}
	sctx, cancel := c.detached(ctx)
	defer cancel()
	sr, serr := c.Settle(sctx, rr.ReservationID, receipt.OperationID, actual)
	done(actual)
	if serr != nil {
		var lost *LostError
		if errors.As(serr, &lost) {
			settled, uerr := c.markUnknown(ctx, receipt, serr)
			if uerr != nil {
				return nil, uerr
			}
			// The lost settle landed; what it refunded is not known here.
			return &RunResult{Reservation: settled, Receipt: receipt}, werr
		}
		if isTransportFault(serr) {
			// Not sent (the breaker is open, the connection was
			// refused), or refused by a proxy in between (HTTP 429, a
			// *RejectedError without a connect code: the ledger never
			// answers a settle so): not applied. Kept and resent in the
			// background with the same ids until it lands.
			c.keepPending(receipt)
			return nil, &UsageUnknownError{Receipt: receipt, Err: serr}
		}
		var refused *LedgerError
		if errors.As(serr, &refused) && refused.Code == connect.CodeInvalidArgument {
			// The ledger cannot take the usage the work reported (a
			// negative amount, a unit the policy does not have): what it
			// used is unknown. Marked, with the receipt kept (the only
			// thing that can settle it), rather than left STARTED with
			// nobody holding its operation id.
			receipt.Actual = nil
			_, uerr := c.markUnknown(ctx, receipt, serr)
			return nil, uerr
		}
		if errors.Is(serr, ErrLifetimeExhausted) {
			// The usage cannot be recorded on this account: left started,
			// the work would hold its capacity with nobody tracking it.
			// Marked unknown, it is in the operators' backlog, and the
			// receipt keeps the real usage.
			_, uerr := c.markUnknown(ctx, receipt, serr)
			return nil, uerr
		}
		return nil, fmt.Errorf("run: %w", serr)
	}
	return &RunResult{Reservation: sr.Reservation, Receipt: receipt, Refunded: sr.Refunded}, werr
}

type receiptKey struct{}

// ReceiptFrom returns the operation receipt of the work running under ctx
// (the ctx Run passes to Work), and whether there is one.
func ReceiptFrom(ctx context.Context) (OperationReceipt, bool) {
	r, ok := ctx.Value(receiptKey{}).(OperationReceipt)
	return r, ok
}

// runWork calls work and turns a panic into values, so the caller can mark
// the reservation before re-raising it.
func runWork(ctx context.Context, work Work) (actual Units, err error, panicked bool, panicValue any) {
	defer func() {
		if p := recover(); p != nil {
			panicked, panicValue = true, p
		}
	}()
	actual, err = work(ctx)
	return actual, err, false, nil
}

func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// releaseUnstarted gives back a reservation whose work never started. A
// failure is not reported: an unstarted reservation expires after the hold
// TTL anyway, so the capacity comes back either way.
func (c *Client) releaseUnstarted(ctx context.Context, id string) {
	rctx, cancel := c.detached(ctx)
	defer cancel()
	_, _ = c.Release(rctx, id)
}

// start starts the reservation under the receipt's operation id. When
// every Start answer was lost it looks the reservation up: STARTED under
// this operation id means the Start landed and the work may run. Otherwise
// (or when ctx ended) the work will not run and the Start is undone
// (abandonStart). It returns the started reservation, or the error.
func (c *Client) start(ctx context.Context, receipt OperationReceipt) (*ledgerv1.Reservation, error) {
	st, err := c.Start(ctx, receipt.ReservationID, receipt.OperationID)
	if err == nil {
		return st.Reservation, nil
	}
	var lost *LostError
	if !errors.As(err, &lost) && ctx.Err() == nil {
		return nil, err // the ledger refused: expired, released, ...
	}
	if ctx.Err() == nil {
		if got, gerr := c.GetReservation(ctx, receipt.ReservationID); gerr == nil && got.GetOperationId() == receipt.OperationID &&
			got.GetState() == ledgerv1.ReservationState_RESERVATION_STATE_STARTED {
			return got, nil
		}
	}
	c.abandonStart(ctx, receipt)
	return nil, err
}

// abandonStart undoes a Start whose answer was lost and whose work will not
// run: Release if it did not start; if it did (ErrAlreadyStarted), settle
// zero usage, which is the truth because the work was never called. If
// the release or the zero settle cannot be confirmed (its answer lost,
// not sent because the breaker is open or the connection refused, any
// other failure), the receipt (with zero actual usage) is kept for
// ResolveUnknown: the Start may have landed, or may still land, and only
// this operation id can settle it. The ledger's answer that the
// reservation has ended (released, expired, settled) or that another
// operation started it (this Start never landed and never will) lets it
// go silently: nothing of this operation is held. RESERVATION_NOT_FOUND
// lets it go too (ErrReceiptRefused) but is reported (reportRefused):
// the ledger was restored without it, or the token's scope no longer
// covers its subject, and then a Start that landed holds its capacity,
// marked USAGE_UNKNOWN by the execution limit (ListUsageUnknown), until
// the receipt (zero usage) settles it.
func (c *Client) abandonStart(ctx context.Context, receipt OperationReceipt) {
	actx, cancel := c.detached(ctx)
	defer cancel()
	receipt.Actual = zeroUnits(receipt.Reserved)
	_, err := c.Release(actx, receipt.ReservationID)
	if errors.Is(err, ErrAlreadyStarted) {
		_, err = c.Settle(actx, receipt.ReservationID, receipt.OperationID, receipt.Actual)
	}
	switch {
	case reservationEnded(err) || errors.Is(err, ErrOperationMismatch):
		// Nothing of this operation is held.
	case refusedForGood(err): // RESERVATION_NOT_FOUND
		c.reportRefused(receipt, fmt.Errorf("abandon start %s: %w: %w", receipt.ReservationID, ErrReceiptRefused, err))
	default:
		c.keepPending(receipt)
	}
}

// reservationEnded reports whether err, the outcome of a release or a
// settle, is the ledger's word that the reservation has ended (nil: this
// call ended it, or a replay of it had): nothing is held any more and no
// Start can land on it.
func reservationEnded(err error) bool {
	return err == nil || errors.Is(err, ErrReleased) || errors.Is(err, ErrExpired) || errors.Is(err, ErrAlreadySettled)
}

// markUnknown records USAGE_UNKNOWN for started work and keeps its
// receipt. It returns the reservation and nil when the ledger answers that
// the work is already settled by the settle this Run sent (its answer was
// lost but it landed: this operation, this usage); an error matching
// ErrReceiptRefused and ErrAlreadySettled, keeping nothing, when it is
// settled with another usage (the resolver or an operator settled it
// while this Run's settle went unanswered); or nil and the
// *UsageUnknownError for the caller.
func (c *Client) markUnknown(ctx context.Context, receipt OperationReceipt, cause error) (*ledgerv1.Reservation, error) {
	mctx, cancel := c.detached(ctx)
	defer cancel()
	_, err := c.MarkUsageUnknown(mctx, receipt.ReservationID)
	var le *LedgerError
	if errors.As(err, &le) && le.Reservation != nil && isSettled(le.Reservation.GetState()) &&
		receipt.Actual != nil && le.Reservation.GetOperationId() == receipt.OperationID {
		if sameUsage(le.Reservation.GetActualUnits(), receipt.Actual) {
			return le.Reservation, nil
		}
		return nil, fmt.Errorf("run %s: settled with another usage than the %v reported: %w: %w", receipt.ReservationID, receipt.Actual, ErrReceiptRefused, err)
	}
	c.keepPending(receipt)
	return nil, &UsageUnknownError{Receipt: receipt, Marked: err == nil, Err: cause}
}

// sameUsage reports whether two usages are the same, a unit one leaves
// out counting as zero.
func sameUsage(a, b Units) bool {
	for unit, n := range a {
		if b[unit] != n {
			return false
		}
	}
	for unit, n := range b {
		if a[unit] != n {
			return false
		}
	}
	return true
}

func isSettled(s ledgerv1.ReservationState) bool {
	return s == ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || s == ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT
}

// keepPending keeps a copy of r for PendingUnknown; a receipt whose usage
// is known (r.Actual set: a settle or an abandoned start whose outcome is
// not known) is also resent in the background (settleLater). The copy has
// maps of its own: the work's map (r.Actual) may be reused once Run
// returned, and the resend must send the usage reported. The oldest
// receipts past the limit (WithPendingLimit) are dropped, from the resends
// too.
func (c *Client) keepPending(r OperationReceipt) {
	r = r.clone()
	dropped := c.pending.keep(r)
	if r.Actual != nil {
		c.settleLater(r)
	} else {
		c.checkLater(r)
	}
	if len(dropped) == 0 {
		return
	}
	c.lookups.mu.Lock()
	for _, d := range dropped {
		delete(c.resends.due, d.ReservationID)
	}
	c.lookups.mu.Unlock()
	for _, d := range dropped {
		c.pending.dropped.Add(1)
		if c.pending.onDrop != nil {
			c.pending.onDrop(d)
		}
	}
}

// PendingDropped returns how many receipts were dropped from
// PendingUnknown to stay within its limit (WithPendingLimit). No answer
// the Client got for any of them was final: each is USAGE_UNKNOWN (or
// STARTED) at the ledger (ListUsageUnknown) unless the resolver or an
// operator settled it since the Client last asked.
func (c *Client) PendingDropped() uint64 { return c.pending.dropped.Load() }

// PendingRefused returns how many receipts the Client dropped (or, for an
// abandoned Start, did not keep) because the ledger's answer to them was
// final, with no caller to tell (ErrReceiptRefused; WithRefusedReceipts
// receives them).
func (c *Client) PendingRefused() uint64 { return c.pending.refused.Load() }

// PendingUnknown returns the receipts of work this Client left
// USAGE_UNKNOWN (or could not settle or release), by reservation id. A
// receipt stays until the ledger's answer to it is final: ResolveUnknown
// (or the background resend, below) settled or released its reservation,
// or got an answer that no call with the receipt can change
// (ErrReceiptRefused: another settle is recorded, another operation
// started it, the ledger no longer knows it or this Client's token no
// longer has its subject in scope, which can change: see ErrNotFound
// there); or until newer ones push the
// oldest past the limit (WithPendingLimit, DefaultPendingLimit; see
// PendingDropped). One whose usage is known (Actual set) the Client
// resends itself in the background, with the same ids, once the ledger is
// reachable, until it lands, the answer is final (the receipt leaves,
// PendingRefused counts it, WithRefusedReceipts receives it), or the
// ledger refuses the call without a final answer (invalid_argument,
// permission, an exhausted account: it stays here, no longer resent). A
// receipt of unknown usage is never sent: the Client reads its
// reservation in the same loop (at most resendParallel reads per
// resendFirstWait for all receipts, each backing off like a resend) and
// drops it when the ledger shows it ended (settled, released, expired),
// started under another operation id, or answers RESERVATION_NOT_FOUND
// (PendingRefused counts it, WithRefusedReceipts receives it), unless a
// ResolveUnknown of it is in flight. Lost answers, an unreachable ledger
// and 5xx answers never drop a receipt. The list lives in memory only: a gateway that must
// survive restarts should persist the receipts from UsageUnknownError
// itself.
func (c *Client) PendingUnknown() []OperationReceipt { return c.pending.list() }

// clone returns r with maps of its own.
func (r OperationReceipt) clone() OperationReceipt {
	r.Reserved, r.Actual = maps.Clone(r.Reserved), maps.Clone(r.Actual)
	return r
}

// ResolveUnknown settles USAGE_UNKNOWN (or unsettled STARTED) work from its
// operation receipt with the actual usage learned later (from the backend's
// billing record, a log, ...), and forgets the receipt. It returns:
//   - the settle result (Replayed when this exact settle was already
//     recorded, e.g. a settle whose answer was lost did land);
//   - for a receipt whose Start never took effect (kept after a lost Start
//     answer), the result of releasing the reservation (or of the settle,
//     when the Start lands before the release), or the reservation as it
//     is when it already ended released or expired (nothing is held);
//   - an error matching ErrReceiptRefused when the ledger's answer is
//     final but not this settle: another settle is recorded
//     (ErrAlreadySettled), the reservation was started under another
//     operation id (ErrOperationMismatch), or the ledger does not know it
//     (ErrNotFound); the receipt kept for this operation leaves
//     PendingUnknown (see ErrReceiptRefused for what each means);
//   - any other error with the receipt still kept: *LostError when every
//     answer was lost, ErrLedgerUnreachable, a 5xx, a refusal of the usage
//     given (invalid_argument: call it again with a usage the ledger
//     takes). Call it again.
func (c *Client) ResolveUnknown(ctx context.Context, receipt OperationReceipt, actual Units) (*SettleResult, error) {
	sr, _, err := c.resolveUnknown(ctx, receipt, actual)
	return sr, err
}

// resolveUnknown is ResolveUnknown, also reporting whether this call
// dropped the receipt from PendingUnknown on a final refusal.
func (c *Client) resolveUnknown(ctx context.Context, receipt OperationReceipt, actual Units) (*SettleResult, bool, error) {
	if receipt.ReservationID == "" || receipt.OperationID == "" {
		return nil, false, errors.New("resolve unknown: receipt has no reservation or operation id")
	}
	c.pending.resolveBegins(receipt.ReservationID)
	defer c.pending.resolveEnds(receipt.ReservationID)
	sr, err := c.Settle(ctx, receipt.ReservationID, receipt.OperationID, actual)
	if errors.Is(err, ErrNotStarted) {
		// The Start whose answer was lost never landed: the work did not
		// run under this reservation; give it back.
		sr, err = c.Release(ctx, receipt.ReservationID)
		if errors.Is(err, ErrAlreadyStarted) {
			// It landed in between (a delayed copy): settle it after all.
			sr, err = c.Settle(ctx, receipt.ReservationID, receipt.OperationID, actual)
		}
	}
	var le *LedgerError
	if errors.As(err, &le) && (errors.Is(err, ErrReleased) || errors.Is(err, ErrExpired)) {
		// Ended unstarted: nothing was spent and nothing is held.
		sr, err = &SettleResult{Reservation: le.Reservation, Replayed: true}, nil
	}
	if refusedForGood(err) {
		// Only the receipt of this operation goes: a receipt of another
		// operation kept for the same reservation is not answered by it.
		removed := c.pending.removeOperation(receipt.ReservationID, receipt.OperationID)
		return nil, removed, fmt.Errorf("resolve unknown: %w: %w", ErrReceiptRefused, err)
	}
	if err != nil {
		return nil, false, fmt.Errorf("resolve unknown: %w", err)
	}
	c.pending.remove(receipt.ReservationID)
	return sr, false, nil
}

// refusedForGood reports whether err, the outcome of a settle or release
// with an operation receipt, is the ledger's final answer that the
// receipt cannot settle its reservation (ErrReceiptRefused). Only the
// ledger's own answer counts, with its reason: a not_found without one
// (e.g. from a proxy in between) proves nothing.
func refusedForGood(err error) bool {
	var le *LedgerError
	if !errors.As(err, &le) {
		return false
	}
	switch le.Reason {
	case ReasonReservationAlreadySettled, ReasonOperationMismatch, ReasonReservationNotFound:
		return true
	}
	return false
}

// usageToSettle is the usage a Run settles for work that reported actual
// (the rules of Work): nil is "used nothing", said of every reserved
// unit; a reserved unit actual leaves out is settled at its estimate.
// Client.Run and Emergency.Run (central or from a shard) both settle
// with it.
func usageToSettle(actual, reserved Units) Units {
	if actual == nil {
		return zeroUnits(reserved)
	}
	return statedForEvery(actual, reserved)
}

// usageProblem is the ledger's check of a settle's usage, made on the
// client before the settle is sent: "" when the ledger can take actual,
// else what is wrong. Its amounts pass ledger.AmountShapeProblem (the
// rule the server and the ledger apply), and every unit is one of the
// reservation's (a reservation's units name every unit of its policy).
func usageProblem(actual, reserved Units) string {
	for _, unit := range slices.Sorted(maps.Keys(actual)) {
		if _, ok := reserved[unit]; !ok {
			return fmt.Sprintf("unit %q is not one of the reservation's", unit)
		}
		if problem := ledger.AmountShapeProblem(actual[unit], true); problem != "" {
			return fmt.Sprintf("unit %q %s", unit, problem)
		}
	}
	return ""
}

// zeroUnits states zero usage of every unit of reserved.
func zeroUnits(reserved Units) Units {
	out := make(Units, len(reserved))
	for unit := range reserved {
		out[unit] = 0
	}
	return out
}
