package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// ReserveRequest asks for the estimated capacity of one request.
type ReserveRequest struct {
	// ReservationID is the idempotency key; empty: the SDK mints one with
	// NewReservationID. Set it to repeat a request whose answer was lost.
	ReservationID string
	Subject       string
	Route         string
	// Region; empty means the ledger's "global".
	Region string
	// Units is the estimate, at least one amount positive.
	Units Units
	// EstimatorDigest and BodyHash go into the request digest (see
	// DigestInput).
	EstimatorDigest string
	BodyHash        string
	// RequestDigest overrides the digest the SDK computes with
	// RequestDigest; leave it empty unless repeating a request whose
	// digest you stored.
	RequestDigest string
}

// ReserveResult is the answer to a Reserve.
type ReserveResult struct {
	// ReservationID and RequestDigest are what was sent (also when the SDK
	// minted or computed them).
	ReservationID string
	RequestDigest string
	// Reservation is the receipt: RESERVED on a first admission, or the
	// stored reservation in whatever state it is now on a replay. Nil when
	// ShadowRejected.
	Reservation *ledgerv1.Reservation
	// Replayed is true when the id was already admitted (a retry whose
	// first answer was lost, or a repeat by the caller).
	Replayed bool
	// Generation is the policy generation that decided.
	Generation uint64
	// ShadowRejected is true when a shadow-mode policy would have refused
	// the request: nothing was reserved, the caller goes on under its old
	// limiter, and ShadowRejection says what enforcement would answer.
	ShadowRejected  bool
	ShadowRejection *RejectedError
	// Attempts is the number of Reserve calls sent; Resolved is true when
	// the answer came from a GetReservation after the Reserve answers were
	// lost (RESERVATION_UNKNOWN resolved).
	Attempts int
	Resolved bool
}

// LostError says a call's answer was lost on every attempt: the ledger may
// or may not have applied it. Repeating the call with the same ids is safe.
type LostError struct {
	Op            string
	ReservationID string
	// IDs are a ReserveBatch's reservation ids in request order, the ones
	// it minted included: send the batch again with them to send it
	// unchanged (admitted items replay).
	IDs      []string
	Attempts int
	Err      error
}

func (e *LostError) Error() string {
	subject := e.Op
	if e.ReservationID != "" {
		subject += " " + e.ReservationID
	}
	return fmt.Sprintf("%s: answer lost after %d attempts: %v", subject, e.Attempts, e.Err)
}

func (e *LostError) Unwrap() error { return e.Err }

// prepare fills the id and digest of req.
func prepare(req *ReserveRequest) (id, digest string, err error) {
	id = req.ReservationID
	if id == "" {
		id = NewReservationID()
	}
	digest = req.RequestDigest
	if digest == "" {
		digest, err = RequestDigest(DigestInput{
			Subject: req.Subject, Route: req.Route, Region: req.Region, Units: req.Units,
			EstimatorDigest: req.EstimatorDigest, BodyHash: req.BodyHash,
		})
		if err != nil {
			return "", "", fmt.Errorf("reserve: %w", err)
		}
	}
	return id, digest, nil
}

// Reserve reserves the estimate of one request. It returns:
//   - the result with a RESERVED receipt (or, on a replay, the stored one);
//   - the result with ShadowRejected under a shadow-mode policy that would
//     have refused it;
//   - *RejectedError when the ledger refused for capacity (429), not retried;
//   - *LedgerError for other ledger answers (ErrDigestMismatch, ErrNoPolicy,
//     invalid arguments, permission);
//   - *ReservationUnknownError when every answer was lost and a lookup of
//     the id did not find it: the id may still be admitted later; resolve
//     with the same id, never a new one;
//   - the transport error (connect code Unavailable) when no attempt could
//     even connect: nothing was sent, nothing can have been admitted;
//   - ctx.Err() when ctx had ended before the first attempt: nothing was
//     sent either;
//   - an argument error for a request that cannot be digested.
//
// A lost answer (timeout, cut connection, UNAVAILABLE) is retried with the
// same id and digest. When the retries are used up, the SDK looks the id
// up (RESERVATION_UNKNOWN resolution) within what is left of ctx. When
// that cannot answer (ctx ended, the breaker opened), Reserve returns
// *ReservationUnknownError at once and the lookup continues in the
// background once the ledger is reachable (LostReserves,
// WithLostReserveHandler): no Reserve runs past its caller's deadline.
func (c *Client) Reserve(ctx context.Context, req ReserveRequest) (*ReserveResult, error) {
	res, err := c.reserve(ctx, req)
	var unknown *ReservationUnknownError
	if errors.As(err, &unknown) && unknown.LookingUp {
		c.lookUpLater(unknown.ReservationID, unknown.RequestDigest)
	}
	return res, err
}

// reserve is Reserve without the background lookup: a
// *ReservationUnknownError it returns with LookingUp set is one whose
// lookup could not answer, and the caller starts the background lookup
// (Emergency.Reserve decides which, once its shard has decided).
func (c *Client) reserve(ctx context.Context, req ReserveRequest) (*ReserveResult, error) {
	id, digest, err := prepare(&req)
	if err != nil {
		return nil, err
	}
	msg := &ledgerv1.ReserveRequest{
		ReservationId: id, RequestDigest: digest,
		Subject: req.Subject, Route: req.Route, Region: req.Region, Units: req.Units,
	}
	resp, attempts, lost, err := do(ctx, c, func(actx context.Context) (*connect.Response[ledgerv1.ReserveResponse], error) {
		return c.rpc.Reserve(actx, connect.NewRequest(msg))
	})
	if err == nil {
		return reserveResult(id, digest, attempts, resp.Msg), nil
	}
	if !lost {
		return nil, classify("reserve", id, err)
	}
	return c.resolveLostReserve(ctx, id, digest, attempts, err)
}

func reserveResult(id, digest string, attempts int, m *ledgerv1.ReserveResponse) *ReserveResult {
	r := &ReserveResult{
		ReservationID: id, RequestDigest: digest, Attempts: attempts,
		Reservation: m.GetReservation(), Replayed: m.GetReplayed(), Generation: m.GetPolicyGeneration(),
		ShadowRejected: m.GetShadowRejected(),
	}
	if r.ShadowRejected {
		r.ShadowRejection = &RejectedError{ReservationID: id, Reason: ReasonInsufficientCapacity}
		if d := m.GetShadowRejection(); d != nil {
			fillRejection(r.ShadowRejection, d)
		}
	}
	return r
}

// resolveLostReserve is the RESERVATION_UNKNOWN path: the Reserve answers
// were lost, so look the original id up. When the lookup cannot answer
// (ctx ended, the breaker is open, its answers were lost too) the
// *ReservationUnknownError has LookingUp set, for the caller to start the
// background lookup.
func (c *Client) resolveLostReserve(ctx context.Context, id, digest string, attempts int, lostErr error) (*ReserveResult, error) {
	if ctx.Err() == nil && c.breaker.allow() == nil {
		lctx, cancel := context.WithTimeout(ctx, 2*c.timeout)
		res, err := c.ResolveReservation(lctx, id, digest)
		cancel()
		if err == nil {
			return &ReserveResult{
				ReservationID: id, RequestDigest: digest, Attempts: attempts, Resolved: true,
				Reservation: res, Replayed: true, Generation: res.GetPolicyGeneration(),
			}, nil
		}
		if errors.Is(err, ErrDigestMismatch) {
			return nil, err
		}
		if errors.Is(err, ErrNotFound) {
			// The ledger answered: the id is not admitted (a Reserve
			// still in flight may land later; repeat it with the id).
			return nil, &ReservationUnknownError{ReservationID: id, RequestDigest: digest, Attempts: attempts, Err: lostErr}
		}
	}
	return nil, &ReservationUnknownError{ReservationID: id, RequestDigest: digest, Attempts: attempts, Err: lostErr, LookingUp: true}
}

// ResolveReservation looks up a reservation whose Reserve answer was lost.
// It returns the stored reservation when the id was admitted for digest;
// a *LedgerError matching ErrDigestMismatch when the id was admitted for a
// different request; one matching ErrNotFound when the ledger has no such
// id (yet: a Reserve still in flight may land later, so repeat Reserve with
// the same id and digest to settle the question); *LostError when the
// lookup's answers were lost too. An empty digest skips the digest check.
func (c *Client) ResolveReservation(ctx context.Context, id, digest string) (*ledgerv1.Reservation, error) {
	res, err := c.GetReservation(ctx, id)
	if err != nil {
		return nil, err
	}
	if digest != "" && res.GetRequestDigest() != digest {
		return nil, &LedgerError{Op: "resolve", Code: connect.CodeAlreadyExists, Reason: ReasonDigestMismatch, Reservation: res,
			Err: fmt.Errorf("reservation %s has digest %s, the request has %s", id, res.GetRequestDigest(), digest)}
	}
	return res, nil
}

// call runs one idempotent call with retries and maps its failure: a
// *LedgerError or *RejectedError for an answer, *LostError when every answer
// was lost.
func call[T any](ctx context.Context, c *Client, op, id string, f func(context.Context) (*connect.Response[T], error)) (*T, error) {
	resp, attempts, lost, err := do(ctx, c, f)
	if err == nil {
		return resp.Msg, nil
	}
	if lost {
		return nil, &LostError{Op: op, ReservationID: id, Attempts: attempts, Err: err}
	}
	return nil, classify(op, id, err)
}

// GetReservation reads a reservation. It returns a *LedgerError matching
// ErrNotFound when the id is unknown, *LostError when every answer was lost.
func (c *Client) GetReservation(ctx context.Context, id string) (*ledgerv1.Reservation, error) {
	m, err := call(ctx, c, "get reservation", id, func(actx context.Context) (*connect.Response[ledgerv1.GetReservationResponse], error) {
		return c.rpc.GetReservation(actx, connect.NewRequest(&ledgerv1.GetReservationRequest{ReservationId: id}))
	})
	if err != nil {
		return nil, err
	}
	return m.GetReservation(), nil
}

// StartResult is the answer to Start.
type StartResult struct {
	Reservation *ledgerv1.Reservation
	// Replayed is true when it was already started with this operation id.
	Replayed bool
}

// Start moves a RESERVED reservation to STARTED and binds operationID (the
// operation receipt Settle must present). It returns a *LedgerError
// matching ErrExpired, ErrReleased, ErrOperationMismatch or ErrNotFound when
// the ledger refuses, *LostError when every answer was lost (repeat with the
// same operation id, or Release: a started reservation then answers
// ErrAlreadyStarted); the transport error (connect code Unavailable,
// ErrLedgerUnreachable while the breaker is open) when no attempt could be
// sent: nothing was applied.
func (c *Client) Start(ctx context.Context, id, operationID string) (*StartResult, error) {
	m, err := call(ctx, c, "start", id, func(actx context.Context) (*connect.Response[ledgerv1.StartResponse], error) {
		return c.rpc.Start(actx, connect.NewRequest(&ledgerv1.StartRequest{ReservationId: id, OperationId: operationID}))
	})
	if err != nil {
		return nil, err
	}
	return &StartResult{Reservation: m.GetReservation(), Replayed: m.GetReplayed()}, nil
}

// SettleResult is the answer to Settle or Release.
type SettleResult struct {
	Reservation *ledgerv1.Reservation
	// Replayed is true when this exact settle (release) was already
	// recorded; Refunded is then empty, because nothing is refunded twice.
	Replayed bool
	// Refunded is what this call returned to available, by unit.
	Refunded Units
}

// Settle records the actual usage of started work and refunds the unused
// difference once. actual must name every unit the reservation reserved
// (0 where none was used): the ledger refuses a settle that leaves one out
// with a *LedgerError (INVALID_COMMAND), since an unstated unit is no proof
// that nothing was used. It returns a *LedgerError matching ErrNotStarted,
// ErrOperationMismatch, ErrAlreadySettled (a different settle was recorded),
// ErrReleased, ErrExpired or ErrNotFound when the ledger refuses;
// *LostError when every answer was lost (repeat it with the same values, or
// MarkUsageUnknown). When no attempt could be sent (connection refused, the
// breaker open) it returns the transport error (connect code Unavailable,
// ErrLedgerUnreachable while the breaker is open), not a *LostError: nothing
// was applied, the work stays STARTED, and the usage is known only to the
// caller, who must send the same settle again until it lands. Settle keeps
// no receipt for that; Run and Middleware do (PendingUnknown).
func (c *Client) Settle(ctx context.Context, id, operationID string, actual Units) (*SettleResult, error) {
	if actual == nil {
		actual = Units{}
	}
	m, err := call(ctx, c, "settle", id, func(actx context.Context) (*connect.Response[ledgerv1.SettleResponse], error) {
		return c.rpc.Settle(actx, connect.NewRequest(&ledgerv1.SettleRequest{ReservationId: id, OperationId: operationID, ActualUnits: actual}))
	})
	if err != nil {
		return nil, err
	}
	return &SettleResult{Reservation: m.GetReservation(), Replayed: m.GetReplayed(), Refunded: m.GetRefundedUnits()}, nil
}

// RecordUsageRequest is usage learned only after the work ran, for which
// nothing was reserved (the cost comes with the response).
type RecordUsageRequest struct {
	// ReservationID is the idempotency key; empty: the SDK mints one with
	// NewReservationID. Set it to repeat a record whose answer was lost.
	ReservationID string
	// OperationID is the operation's receipt; empty: the reservation id.
	OperationID string
	Subject     string
	Route       string
	// Region; empty means the ledger's "global".
	Region string
	// Actual is the usage, at least one amount positive.
	Actual Units
}

// RecordUsageResult is the answer to RecordUsage.
type RecordUsageResult struct {
	// ReservationID and OperationID are what was sent (also when the SDK
	// minted them): repeat them to retry.
	ReservationID string
	OperationID   string
	// Reservation is the receipt, SETTLED or SETTLED_WITH_DEBT, holding
	// nothing; its OverdraftUnits are the part recorded as debt. On a
	// replay after retention removed the record it is the tombstone's
	// (Retired set): state and ids only, no units.
	Reservation *ledgerv1.Reservation
	// Replayed is true when this exact record was already made; nothing
	// was charged again. After retention removed the record, a retry
	// with the same id, subject, route and region replays whatever its
	// usage (docs/API.md, RecordUsage).
	Replayed bool
	// Generation is the policy generation whose account was charged.
	Generation uint64
}

// RecordUsage records usage nothing was reserved for (the LedgerService's
// RecordUsage, docs/API.md). The ledger never refuses it for lack of
// capacity: what is not available becomes debt, which freezes the
// subject's route until refills repay it, so prefer Reserve and Settle
// whenever the cost can be estimated before the work. A lost answer is
// retried with the same ids (a retry replays; nothing is charged twice).
// It returns a *LedgerError matching ErrAlreadySettled (the id recorded
// other usage or another operation), ErrDigestMismatch (the id names
// another request) or ErrNoPolicy when the ledger refuses; *LostError when
// every answer was lost (repeat it with the same values). It needs the
// central ledger: no emergency shard records usage.
func (c *Client) RecordUsage(ctx context.Context, req RecordUsageRequest) (*RecordUsageResult, error) {
	id, op := req.ReservationID, req.OperationID
	if id == "" {
		id = NewReservationID()
	}
	if op == "" {
		op = id
	}
	m, err := call(ctx, c, "record usage", id, func(actx context.Context) (*connect.Response[ledgerv1.RecordUsageResponse], error) {
		return c.rpc.RecordUsage(actx, connect.NewRequest(&ledgerv1.RecordUsageRequest{
			ReservationId: id, OperationId: op, Subject: req.Subject, Route: req.Route, Region: req.Region, ActualUnits: req.Actual,
		}))
	})
	if err != nil {
		return nil, err
	}
	return &RecordUsageResult{ReservationID: id, OperationID: op, Reservation: m.GetReservation(), Replayed: m.GetReplayed(),
		Generation: m.GetPolicyGeneration()}, nil
}

// Release gives an unstarted reservation back in full. It returns a
// *LedgerError matching ErrAlreadyStarted (settle it instead),
// ErrAlreadySettled, ErrExpired or ErrNotFound when the ledger refuses,
// *LostError when every answer was lost, the transport error (connect code
// Unavailable) when no attempt could be sent: nothing was applied.
func (c *Client) Release(ctx context.Context, id string) (*SettleResult, error) {
	m, err := call(ctx, c, "release", id, func(actx context.Context) (*connect.Response[ledgerv1.ReleaseResponse], error) {
		return c.rpc.Release(actx, connect.NewRequest(&ledgerv1.ReleaseRequest{ReservationId: id}))
	})
	if err != nil {
		return nil, err
	}
	return &SettleResult{Reservation: m.GetReservation(), Replayed: m.GetReplayed(), Refunded: m.GetRefundedUnits()}, nil
}

// MarkUsageUnknown records that the outcome of started work is unknown; the
// capacity stays held until a Settle with the operation id. It returns the
// reservation (USAGE_UNKNOWN), a *LedgerError matching ErrNotStarted or
// ErrAlreadySettled (with the reservation attached) when the ledger refuses,
// *LostError when every answer was lost, the transport error (connect code
// Unavailable) when no attempt could be sent: nothing was applied.
func (c *Client) MarkUsageUnknown(ctx context.Context, id string) (*ledgerv1.Reservation, error) {
	m, err := call(ctx, c, "mark usage unknown", id, func(actx context.Context) (*connect.Response[ledgerv1.MarkUsageUnknownResponse], error) {
		return c.rpc.MarkUsageUnknown(actx, connect.NewRequest(&ledgerv1.MarkUsageUnknownRequest{ReservationId: id}))
	})
	if err != nil {
		return nil, err
	}
	return m.GetReservation(), nil
}

// ReserveOutcome is one item of ReserveBatch: exactly one of Result and Err
// is set. Err is a *RejectedError or *LedgerError, as for Reserve.
type ReserveOutcome struct {
	Result *ReserveResult
	Err    error
}

// MaxBatch is the largest batch the ledger accepts in one call.
const MaxBatch = 1000

// ReserveBatch reserves several requests in one call; each item succeeds or
// fails on its own and the outcomes come back in request order. An item
// without a ReservationID gets one minted (reqs is only read, so a slice
// sent twice is two batches). The whole batch is retried on a lost answer
// (every item keeps its id and digest, so admitted items replay). It
// returns an error only for a bad item (no digest possible), more than
// MaxBatch items, an answer the ledger gave for the whole call, or
// *LostError when every answer was lost: its IDs hold every item's id,
// minted ones included; look them up, or send the batch again with them
// (WithIDs): admitted items replay, never debited twice. No items is no
// call and no outcomes (the ledger refuses an empty batch as
// invalid_argument).
func (c *Client) ReserveBatch(ctx context.Context, reqs []ReserveRequest) ([]ReserveOutcome, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) > MaxBatch {
		return nil, fmt.Errorf("reserve batch: %d items, at most %d", len(reqs), MaxBatch)
	}
	ids := make([]string, len(reqs))
	digests := make([]string, len(reqs))
	msg := &ledgerv1.ReserveBatchRequest{Requests: make([]*ledgerv1.ReserveRequest, len(reqs))}
	for i := range reqs {
		id, digest, err := prepare(&reqs[i])
		if err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		ids[i], digests[i] = id, digest
		msg.Requests[i] = &ledgerv1.ReserveRequest{
			ReservationId: id, RequestDigest: digest,
			Subject: reqs[i].Subject, Route: reqs[i].Route, Region: reqs[i].Region, Units: reqs[i].Units,
		}
	}
	op, opID := "reserve batch", fmt.Sprintf("(%d items)", len(reqs))
	resp, attempts, lost, err := do(ctx, c, func(actx context.Context) (*connect.Response[ledgerv1.ReserveBatchResponse], error) {
		return c.rpc.ReserveBatch(actx, connect.NewRequest(msg))
	})
	if lost {
		return nil, &LostError{Op: op, ReservationID: opID, IDs: ids, Attempts: attempts, Err: err}
	}
	if err != nil {
		return nil, classify(op, opID, err)
	}
	m := resp.Msg
	if len(m.GetOutcomes()) != len(reqs) {
		return nil, fmt.Errorf("reserve batch: %d outcomes for %d items", len(m.GetOutcomes()), len(reqs))
	}
	out := make([]ReserveOutcome, len(reqs))
	for i, o := range m.GetOutcomes() {
		if ok := o.GetOk(); ok != nil {
			out[i].Result = reserveResult(ids[i], digests[i], attempts, ok)
			continue
		}
		out[i].Err = itemError("reserve", ids[i], o.GetError())
	}
	return out, nil
}

// WithIDs returns a copy of reqs with the reservation ids of a lost
// ReserveBatch (LostError.IDs, in request order) filled in, to send that
// batch again unchanged.
func WithIDs(reqs []ReserveRequest, ids []string) []ReserveRequest {
	out := slices.Clone(reqs)
	for i := range out {
		if i < len(ids) {
			out[i].ReservationID = ids[i]
		}
	}
	return out
}

// SettleItem is one settle of SettleBatch.
type SettleItem struct {
	ReservationID string
	OperationID   string
	Actual        Units
}

// SettleOutcome is one item of SettleBatch: exactly one of Result and Err
// is set.
type SettleOutcome struct {
	Result *SettleResult
	Err    error
}

// SettleBatch settles several reservations in one call, each on its own,
// outcomes in request order, retried as a whole on a lost answer. Errors
// as for ReserveBatch; no items is no call.
func (c *Client) SettleBatch(ctx context.Context, items []SettleItem) ([]SettleOutcome, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > MaxBatch {
		return nil, fmt.Errorf("settle batch: %d items, at most %d", len(items), MaxBatch)
	}
	msg := &ledgerv1.SettleBatchRequest{Requests: make([]*ledgerv1.SettleRequest, len(items))}
	for i, it := range items {
		actual := it.Actual
		if actual == nil {
			actual = Units{}
		}
		msg.Requests[i] = &ledgerv1.SettleRequest{ReservationId: it.ReservationID, OperationId: it.OperationID, ActualUnits: actual}
	}
	m, err := call(ctx, c, "settle batch", fmt.Sprintf("(%d items)", len(items)), func(actx context.Context) (*connect.Response[ledgerv1.SettleBatchResponse], error) {
		return c.rpc.SettleBatch(actx, connect.NewRequest(msg))
	})
	if err != nil {
		return nil, err
	}
	if len(m.GetOutcomes()) != len(items) {
		return nil, fmt.Errorf("settle batch: %d outcomes for %d items", len(m.GetOutcomes()), len(items))
	}
	out := make([]SettleOutcome, len(items))
	for i, o := range m.GetOutcomes() {
		if ok := o.GetOk(); ok != nil {
			out[i].Result = &SettleResult{Reservation: ok.GetReservation(), Replayed: ok.GetReplayed(), Refunded: ok.GetRefundedUnits()}
			continue
		}
		out[i].Err = itemError("settle", items[i].ReservationID, o.GetError())
	}
	return out, nil
}

// itemError maps a batch item's error to the error the single call gives.
func itemError(op, id string, ie *ledgerv1.ItemError) error {
	if ie == nil {
		return &LedgerError{Op: op, Code: connect.CodeUnknown, Err: errors.New("batch item has neither outcome nor error")}
	}
	if ie.GetRejection() != nil || ie.GetCode() == "resource_exhausted" {
		rej := &RejectedError{ReservationID: id, Reason: ReasonInsufficientCapacity, message: ie.GetMessage()}
		if d := ie.GetRejection(); d != nil {
			fillRejection(rej, d)
		}
		return rej
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(ie.GetCode())); err != nil {
		code = connect.CodeUnknown
	}
	return &LedgerError{Op: op, Code: code, Reason: ie.GetDetail().GetReason(), Reservation: ie.GetDetail().GetReservation(),
		Field: ie.GetDetail().GetField(), Err: errors.New(ie.GetMessage())}
}

// GetAccount returns every generation's account of one subject on a route
// and region (empty: "global"), oldest first; empty when the subject never
// reserved. Errors: *LedgerError (invalid arguments, permission),
// *LostError.
func (c *Client) GetAccount(ctx context.Context, subject, route, region string) ([]*ledgerv1.Account, error) {
	m, err := call(ctx, c, "get account", subject, func(actx context.Context) (*connect.Response[ledgerv1.GetAccountResponse], error) {
		return c.rpc.GetAccount(actx, connect.NewRequest(&ledgerv1.GetAccountRequest{Subject: subject, Route: route, Region: region}))
	})
	if err != nil {
		return nil, err
	}
	return m.GetAccounts(), nil
}

// Audit checks the whole ledger (role admin) and returns its discrepancies:
// empty when the ledger is sound.
func (c *Client) Audit(ctx context.Context) ([]*ledgerv1.Discrepancy, error) {
	ctx = context.WithValue(ctx, slowCallKey{}, true) // may take long: no breaker watchdog
	m, err := call(ctx, c, "audit", "", func(actx context.Context) (*connect.Response[ledgerv1.AuditResponse], error) {
		return c.rpc.Audit(actx, connect.NewRequest(&ledgerv1.AuditRequest{}))
	})
	if err != nil {
		return nil, err
	}
	return m.GetDiscrepancies(), nil
}

// PublishPolicy publishes a policy generation (role admin) and returns the
// stored policy and whether it equalled the active one (replayed). A lost
// answer is retried: publishing the same terms again is recognised.
func (c *Client) PublishPolicy(ctx context.Context, p *ledgerv1.Policy) (*ledgerv1.Policy, bool, error) {
	return c.PublishPolicyEditedFrom(ctx, p, 0)
}

// PublishPolicyEditedFrom publishes p as an edit of generation editedFrom
// (as read with GetPolicy): unless that generation is still the active
// one of p's key, nothing is published and the error is a *LedgerError
// matching ErrPolicyGenerationChanged, so an edit of a stale copy never
// undoes what another operator published since. A lost answer is retried
// as PublishPolicy's: the same terms replay. editedFrom 0 checks nothing.
func (c *Client) PublishPolicyEditedFrom(ctx context.Context, p *ledgerv1.Policy, editedFrom uint64) (*ledgerv1.Policy, bool, error) {
	m, err := call(ctx, c, "publish policy", p.GetSubject(), func(actx context.Context) (*connect.Response[ledgerv1.PublishPolicyResponse], error) {
		return c.rpc.PublishPolicy(actx, connect.NewRequest(&ledgerv1.PublishPolicyRequest{Policy: p, EditedFrom: editedFrom}))
	})
	if err != nil {
		return nil, false, err
	}
	return m.GetPolicy(), m.GetReplayed(), nil
}

// GetPolicy returns one policy generation, a *LedgerError matching
// ErrNotFound, or *LostError.
func (c *Client) GetPolicy(ctx context.Context, generation uint64) (*ledgerv1.Policy, error) {
	m, err := call(ctx, c, "get policy", fmt.Sprint(generation), func(actx context.Context) (*connect.Response[ledgerv1.GetPolicyResponse], error) {
		return c.rpc.GetPolicy(actx, connect.NewRequest(&ledgerv1.GetPolicyRequest{Generation: generation}))
	})
	if err != nil {
		return nil, err
	}
	return m.GetPolicy(), nil
}

// background returns the context of a call the Client makes on its own
// (not for a caller): bounded as detached, and cancelled by Close, which
// does not wait for the ledger.
func (c *Client) background() (context.Context, context.CancelFunc) {
	budget := time.Duration(c.retry.MaxAttempts) * c.timeout
	return context.WithTimeout(c.lookups.ctx, budget)
}

// goBackground runs f on its own goroutine with the background context
// (background), counted in the lookups' wait group so that Close waits
// for it; false, and f not run, once Close has begun.
func (c *Client) goBackground(f func(ctx context.Context)) bool {
	ls := c.lookups
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.ctx.Err() != nil {
		return false
	}
	ls.wg.Add(1)
	go func() {
		defer ls.wg.Done()
		ctx, cancel := c.background()
		defer cancel()
		f(ctx)
	}()
	return true
}

// detached returns a context that outlives the caller's cancellation but is
// bounded, for bookkeeping that must finish after the caller gave up
// (settling started work, releasing unstarted work).
func (c *Client) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	budget := time.Duration(c.retry.MaxAttempts) * c.timeout
	return context.WithTimeout(context.WithoutCancel(ctx), budget)
}
