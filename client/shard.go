package client

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
)

// Emergency admits requests through the ledger, and from the gateway's
// emergency shards only while the ledger cannot be reached.
//
// The protocol (docs/OPERATIONS.md, "Emergency shards"):
//
//  1. While the ledger is healthy, Provision asks it for a shard of a
//     subject's capacity, bound to this gateway and this process (the
//     store's boot epoch), and keeps the signed token in the ShardStore.
//     The policy's emergency mode must be on.
//  2. Reserve goes to the ledger. Only when the ledger is unreachable (every
//     answer lost, RESERVATION_UNKNOWN, UNAVAILABLE) does it admit from the
//     shard, under the same reservation id, within the shard's bound. The
//     Client's circuit breaker (BreakerPolicy) remembers unreachability,
//     so once it is open Reserve goes to the shard at once; a lost central
//     Reserve found later is released centrally. A
//     rejection, or any other answer of the ledger, is returned as is: a
//     shard is never used to overrule the ledger, and no balance read from
//     the ledger ever becomes local capacity.
//  3. Start, Settle, Release and MarkUsageUnknown follow the reservation to
//     wherever it was admitted.
//  4. When the ledger is back, Reconcile seals the shards and reports their
//     receipts, once per shard; the ledger remints the unused units.
//     Receipts of work whose usage was unknown are reported by a later
//     Reconcile once that work settles (ResolveUnknown's local equivalent
//     is Settle with the operation id).
//
// Emergency is safe for concurrent use.
type Emergency struct {
	client *Client
	rpc    capledgerv1connect.ShardServiceClient
	store  *ShardStore
	keys   ledger.ShardKeys
	logger *slog.Logger
}

// EmergencyOptions configure NewEmergency.
type EmergencyOptions struct {
	// Token is the bearer token for the ShardService (the same as the
	// Client's, when the ledger runs with tokens).
	Token string
	// Keys pins the keys shards must verify under. Nil: the keys are read
	// from the ledger (ListShardKeys) at each Provision, over the same
	// connection the shard itself comes from.
	Keys ledger.ShardKeys
	// Logger receives what Emergency does in the background and could
	// not finish: a late central hold whose release was not confirmed
	// (Client.Close cancelled it, or the ledger did not answer): it may
	// have landed, else the hold expires after its hold TTL. Nil:
	// slog.Default().
	Logger *slog.Logger
}

// NewEmergency returns an Emergency over a Client and a ShardStore.
func NewEmergency(c *Client, st *ShardStore, opts EmergencyOptions) *Emergency {
	var options []connect.ClientOption
	switch c.protocol {
	case ProtocolConnectJSON:
		options = append(options, connect.WithProtoJSON())
	case ProtocolGRPC:
		options = append(options, connect.WithGRPC())
	}
	if opts.Token != "" {
		options = append(options, connect.WithInterceptors(bearer(opts.Token)))
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Emergency{
		logger: logger,
		client: c,
		rpc:    capledgerv1connect.NewShardServiceClient(c.http, c.baseURL, options...),
		store:  st,
		keys:   opts.Keys,
	}
}

// Store returns the shard store.
func (e *Emergency) Store() *ShardStore { return e.store }

// Unreachable reports whether err means the ledger could not be reached:
// every answer was lost (*LostError, *ReservationUnknownError) or the
// ledger said UNAVAILABLE or timed out. Any answer the ledger decided (a
// rejection, a state error) is not unreachability.
func Unreachable(err error) bool {
	var lost *LostError
	var unknown *ReservationUnknownError
	if errors.As(err, &lost) || errors.As(err, &unknown) {
		return true
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded:
		return true
	}
	return false
}

// ProvisionRequest asks for a shard.
type ProvisionRequest struct {
	// ShardID is the idempotency key; empty: a fresh "sh-" ULID.
	ShardID string
	Subject string
	Route   string
	// Region; empty means "global".
	Region string
	// Units is the capacity to carve out, by unit name.
	Units Units
	// TTL is how long the shard may be spent.
	TTL time.Duration
}

// Provision obtains a shard from the ledger and installs it. A lost answer
// is retried with the same shard id, so the ledger carves it once.
//
// Returns the installed shard; *RejectedError when the capacity does not
// fit (or the account carries debt); a *LedgerError for other refusals
// (reason EMERGENCY_DISABLED when the policy's emergency mode is off,
// SHARDS_DISABLED when the ledger has no signing key); *LostError when
// every answer was lost; or the store's Install error (a shard that does
// not verify is never installed).
func (e *Emergency) Provision(ctx context.Context, req ProvisionRequest) (*ledger.Shard, error) {
	id := req.ShardID
	if id == "" {
		id = "sh-" + defaultIDs.next().String()
	}
	keys := e.keys
	if keys == nil {
		fetched, err := e.Keys(ctx)
		if err != nil {
			return nil, err
		}
		keys = fetched
	}
	msg := &ledgerv1.IssueShardRequest{
		ShardId: id, Subject: req.Subject, Route: req.Route, Region: req.Region, Units: req.Units,
		GatewayId: e.store.GatewayID(), BootEpoch: e.store.BootEpoch(), Ttl: durationpb.New(req.TTL),
	}
	m, err := call(ctx, e.client, "issue shard", id, func(actx context.Context) (*connect.Response[ledgerv1.IssueShardResponse], error) {
		return e.rpc.IssueShard(actx, connect.NewRequest(msg))
	})
	if err != nil {
		return nil, err
	}
	sh, err := e.store.Install(m.GetShard().GetToken(), m.GetShard().GetUnits(), keys)
	if err != nil {
		return nil, err
	}
	return sh, nil
}

// Keys reads the ledger's shard verification keys.
func (e *Emergency) Keys(ctx context.Context) (ledger.ShardKeyRing, error) {
	m, err := call(ctx, e.client, "list shard keys", "", func(actx context.Context) (*connect.Response[ledgerv1.ListShardKeysResponse], error) {
		return e.rpc.ListShardKeys(actx, connect.NewRequest(&ledgerv1.ListShardKeysRequest{}))
	})
	if err != nil {
		return nil, err
	}
	ring := ledger.ShardKeyRing{}
	for _, k := range m.GetKeys() {
		ring[k.GetKeyId()] = ed25519.PublicKey(k.GetPublicKey())
	}
	return ring, nil
}

// EmergencyReservation is the outcome of Emergency.Reserve: exactly one of
// Central and Local is set.
type EmergencyReservation struct {
	ReservationID string
	RequestDigest string
	Central       *ReserveResult
	Local         *LocalReceipt
	// LedgerErr is why the ledger was not used (set with Local).
	LedgerErr error
}

// Reserve reserves through the ledger and, only when the ledger is
// unreachable, from the subject's shard under the same reservation id.
// When it serves a lost central Reserve from the shard, the id is looked
// up in the background (also after a not-found answer, for
// DefaultLostReserveLookup: a Reserve in flight may land later) and a
// central hold found is released. A lost central Reserve no shard admits
// either is looked up as Client.Reserve does (in the background only when
// its lookup could not answer); nothing is watched for it.
//
// Returns the outcome; the ledger's own error when it answered (a
// *RejectedError is never overruled by a shard) or when it is unreachable
// and no shard admits (then joined with the shard's refusal: ErrNoShard,
// ledger.ErrInsufficientCapacity, ErrShardExpired, ErrShardSealed, ...).
func (e *Emergency) Reserve(ctx context.Context, req ReserveRequest) (*EmergencyReservation, error) {
	id, digest, err := prepare(&req)
	if err != nil {
		return nil, err
	}
	req.ReservationID, req.RequestDigest = id, digest
	if e.store.Has(id) {
		// A repeat of a request that was admitted locally stays local.
		local, err := e.store.Reserve(id, digest, req.Subject, req.Route, req.Region, req.Units)
		if err != nil {
			return nil, err
		}
		return &EmergencyReservation{ReservationID: id, RequestDigest: digest, Local: local}, nil
	}
	central, err := e.client.reserve(ctx, req)
	if err == nil {
		return &EmergencyReservation{ReservationID: id, RequestDigest: digest, Central: central}, nil
	}
	if !Unreachable(err) {
		return nil, err
	}
	var unknown *ReservationUnknownError
	errors.As(err, &unknown)
	local, lerr := e.store.Reserve(id, digest, req.Subject, req.Route, req.Region, req.Units)
	if lerr != nil {
		// Not served: the lost central Reserve is looked up as
		// Client.Reserve does, in the background only if its lookup
		// could not answer.
		if unknown != nil && unknown.LookingUp {
			e.client.lookUpLater(id, digest)
		}
		return nil, errors.Join(err, lerr)
	}
	if unknown != nil {
		// Served from the shard while the central Reserve may still
		// land (also after a not-found answer): its id is watched, and
		// a central hold found is released.
		unknown.LookingUp = true
		e.client.watchLostReserve(id, digest, func(res *ledgerv1.Reservation) {
			if res.GetState() == ledgerv1.ReservationState_RESERVATION_STATE_RESERVED {
				e.releaseLateHold(id)
			}
		})
	}
	return &EmergencyReservation{ReservationID: id, RequestDigest: digest, Local: local, LedgerErr: err}, nil
}

// releaseLateHold releases the central hold of a request served from the
// shard, on the lookups' goroutine. Client.Close cancels it (Close does
// not wait for the ledger); a release not confirmed, cancelled or not
// answered, is logged: it may have landed, else its hold expires after its
// hold TTL.
func (e *Emergency) releaseLateHold(id string) {
	rctx, cancel := e.client.background()
	defer cancel()
	_, err := e.client.Release(rctx, id)
	if err != nil && isTransportFault(err) {
		e.logger.Warn("capledger: release of a late central hold (its request was served from the shard) not confirmed; it may have landed, else the hold stays RESERVED until its hold TTL expires",
			"reservation", id, "client_closing", e.client.lookups.ctx.Err() != nil, "err", err)
	}
}

// Start starts a reservation wherever it was admitted. Errors as
// Client.Start, or ShardStore.Start for a local one.
func (e *Emergency) Start(ctx context.Context, id, operationID string) error {
	if e.store.Has(id) {
		_, err := e.store.Start(id, operationID)
		return err
	}
	_, err := e.client.Start(ctx, id, operationID)
	return err
}

// Settle settles a reservation wherever it was admitted. Errors as
// Client.Settle, or ShardStore.Settle for a local one.
func (e *Emergency) Settle(ctx context.Context, id, operationID string, actual Units) error {
	if e.store.Has(id) {
		_, err := e.store.Settle(id, operationID, actual)
		return err
	}
	_, err := e.client.Settle(ctx, id, operationID, actual)
	return err
}

// Release releases an unstarted reservation wherever it was admitted.
func (e *Emergency) Release(ctx context.Context, id string) error {
	if e.store.Has(id) {
		_, err := e.store.Release(id)
		return err
	}
	_, err := e.client.Release(ctx, id)
	return err
}

// MarkUsageUnknown marks started work's usage unknown wherever it was
// admitted.
func (e *Emergency) MarkUsageUnknown(ctx context.Context, id string) error {
	if e.store.Has(id) {
		_, err := e.store.MarkUsageUnknown(id)
		return err
	}
	_, err := e.client.MarkUsageUnknown(ctx, id)
	return err
}

// ShardReconciliation is the ledger's answer to one shard's submission.
type ShardReconciliation struct {
	ShardID string
	// Shard is the ledger's record after the submission (nil when the
	// ledger answered SHARD_NOT_FOUND: its retention removed the shard).
	Shard *ledgerv1.Shard
	// Reminted and Debt are what this call's accepted submissions reminted
	// into the active generation and charged there as debt;
	// AlreadyReconciled is set when an earlier attempt had been accepted
	// (its answer lost), in which case they are empty.
	Reminted          Units
	Debt              Units
	AlreadyReconciled bool
	// Receipts is how many receipts the ledger took from this call.
	Receipts int
	// ResolvedElsewhere lists receipts the ledger had already resolved
	// from another submission (an operator's `capledger shard reconcile
	// --receipts`): this gateway's values for them were not applied, and
	// the *ShardReceiptsError returned with this result names them.
	ResolvedElsewhere []string
}

// RefusedReceipt is one receipt the ledger did not take, and why.
type RefusedReceipt struct {
	ReservationID string
	State         ledger.State
	Reason        string
}

// ShardReceiptsError names the receipts of one shard whose values the
// ledger did not take: receipts resolved centrally by another submission,
// receipts it refused (e.g. SHARD_RECEIPT_CONTRADICTS), or a first
// submission refused because the ledger holds a different reconciliation
// of the shard, or a submission for a shard another submission reconciled
// and the ledger's retention then removed (SHARD_NOT_FOUND). Err is the
// ledger's refusal when there was one.
type ShardReceiptsError struct {
	ShardID  string
	Receipts []RefusedReceipt
	Err      error
}

func (e *ShardReceiptsError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "reconcile shard %s: %d receipts not taken by the ledger:", e.ShardID, len(e.Receipts))
	for i, r := range e.Receipts {
		if i == 10 {
			fmt.Fprintf(&b, " ... and %d more", len(e.Receipts)-i)
			break
		}
		fmt.Fprintf(&b, " %s (%s: %s);", r.ReservationID, r.State, r.Reason)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " ledger: %v", e.Err)
	}
	return b.String()
}

func (e *ShardReceiptsError) Unwrap() error { return e.Err }

// Reconcile reports every shard of the store that has something to report:
// each is sealed first (it admits nothing more), then its receipts go to
// the ledger once. Call it when the ledger is reachable again, then
// Provision fresh shards.
//
// Returns the outcome per reported shard, and the errors of the shards
// that failed, joined (every shard is attempted; calling Reconcile again
// resumes, sending exactly the receipts that were logged for a shard in
// flight). A *ShardReceiptsError among them names receipts the ledger did
// not take.
func (e *Emergency) Reconcile(ctx context.Context) ([]ShardReconciliation, error) {
	var out []ShardReconciliation
	var errs []error
	for _, status := range e.store.Shards() {
		r, ok, err := e.ReconcileShard(ctx, status.Shard.ID)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			out = append(out, r)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return out, errors.Join(errs...)
}

// maxReconcileRounds bounds the resubmissions of one ReconcileShard: a
// round only repeats when another submission resolved receipts meanwhile.
const maxReconcileRounds = 4

// ReconcileShard reports one shard (sealing it first). ok is false when it
// had nothing to report.
//
// A SHARD_ALREADY_RECONCILED refusal is taken as the success of an earlier
// attempt only for the submission that was really in flight (logged before
// this call, or an attempt of this call whose answer was lost), and only
// when the ledger's record of the shard agrees with it. Otherwise the SDK
// reads the shard's central state (GetShard with the receipt ids), records
// the receipts the ledger no longer waits for, resends those still pending
// there, and returns a *ShardReceiptsError naming every receipt whose
// values the ledger did not take. No receipt is dropped silently.
//
// A SHARD_NOT_FOUND refusal means the ledger reconciled the shard and its
// retention then removed it (the store holds the shard: it was issued to
// this gateway). The submission is finished either way, so it is not sent
// again and the shard can end locally. For the submission really in
// flight it is the success of the earlier attempt (AlreadyReconciled);
// otherwise another submission reconciled the shard, and the call returns
// a *ShardReceiptsError naming every receipt of this one as not taken.
//
// Errors: *ShardReceiptsError (with ok true when something was reported);
// a *LedgerError (reason SHARD_FOREIGN, INVALID_COMMAND)
// when the ledger refused; *LostError when every answer was lost; or a
// store error.
func (e *Emergency) ReconcileShard(ctx context.Context, shardID string) (ShardReconciliation, bool, error) {
	out := ShardReconciliation{ShardID: shardID}
	var refused []RefusedReceipt
	reported := false
	for round := 0; ; round++ {
		sub, ok, err := e.store.BeginSubmission(shardID)
		if err != nil {
			return out, reported, err
		}
		if !ok {
			break
		}
		if round == maxReconcileRounds {
			return out, reported, fmt.Errorf("reconcile shard %s: receipts still refused after %d rounds", shardID, round)
		}
		m, maybeApplied, err := e.submit(ctx, sub)
		if err == nil {
			out.Shard = m.GetShard()
			out.Reminted = addUnits(out.Reminted, m.GetRemintedUnits())
			out.Debt = addUnits(out.Debt, m.GetDebtUnits())
			out.Receipts += len(sub.Receipts)
			if err := e.store.FinishSubmission(shardID); err != nil {
				return out, reported, err
			}
			reported = true
			continue // a settle may have made more receipts due meanwhile
		}
		var le *LedgerError
		if errors.As(err, &le) && le.Reason == reasonShardNotFound {
			// The store holds this shard (issued to this gateway, its
			// token verified), so the ledger reconciled it and then
			// retention removed it: it waits for nothing from it.
			out.Shard = nil
			if err := e.store.FinishSubmission(shardID); err != nil {
				return out, reported, err
			}
			reported = true
			if sub.Resumed || maybeApplied {
				// The submission in flight: its earlier attempt's success.
				out.AlreadyReconciled = true
				out.Receipts += len(sub.Receipts)
				continue
			}
			refused = append(refused, refuseAll(sub.Receipts, reasonRemovedShard)...)
			return out, reported, &ShardReceiptsError{ShardID: shardID, Receipts: refused, Err: err}
		}
		if !errors.As(err, &le) || le.Reason != reasonShardAlreadyReconciled {
			if le != nil && le.Code == connect.CodeFailedPrecondition && le.Reason != reasonShardForeign {
				// A refusal of these receipts (SHARD_RECEIPT_CONTRADICTS):
				// they stay in flight, to be resolved by an operator.
				refused = append(refused, refuseAll(sub.Receipts, le.Reason)...)
				return out, reported, &ShardReceiptsError{ShardID: shardID, Receipts: refused, Err: err}
			}
			return out, reported, fmt.Errorf("reconcile shard %s: %w", shardID, err)
		}
		inFlight := sub.Resumed || maybeApplied
		central, standings, gerr := e.centralShard(ctx, shardID, sub.Receipts)
		if gerr != nil {
			return out, reported, fmt.Errorf("reconcile shard %s: refused as already reconciled (%v), then reading its central state: %w", shardID, err, gerr)
		}
		out.Shard = central
		if sub.First {
			if inFlight && firstMatches(sub, central, standings) {
				out.AlreadyReconciled = true
				out.Receipts += len(sub.Receipts)
				if err := e.store.FinishSubmission(shardID); err != nil {
					return out, reported, err
				}
				reported = true
				continue
			}
			// Someone else reconciled this shard first (an operator with
			// an admin token): the ledger took none of these receipts.
			refused = append(refused, refuseAll(sub.Receipts, "the ledger holds another first reconciliation of this shard")...)
			return out, reported, &ShardReceiptsError{ShardID: shardID, Receipts: refused, Err: err}
		}
		var elsewhere []string
		for i, r := range sub.Receipts {
			if standings[i] != ledgerv1.ShardReceiptStanding_STANDING_PENDING {
				elsewhere = append(elsewhere, r.ReservationID)
			}
		}
		if len(elsewhere) == len(sub.Receipts) && inFlight {
			// Every receipt is resolved and an earlier attempt of exactly
			// this submission may have done it: its success.
			out.AlreadyReconciled = true
			out.Receipts += len(sub.Receipts)
			if err := e.store.FinishSubmission(shardID); err != nil {
				return out, reported, err
			}
			reported = true
			continue
		}
		if len(elsewhere) == 0 {
			// All still pending there, yet refused: nothing to learn.
			return out, reported, fmt.Errorf("reconcile shard %s: %w", shardID, err)
		}
		for _, r := range sub.Receipts {
			if slices.Contains(elsewhere, r.ReservationID) {
				refused = append(refused, RefusedReceipt{ReservationID: r.ReservationID, State: r.State,
					Reason: "already resolved centrally by another submission; this gateway's receipt was not applied"})
			}
		}
		out.ResolvedElsewhere = append(out.ResolvedElsewhere, elsewhere...)
		// Record them, then resend the rest (the next round).
		if err := e.store.FinishReceipts(shardID, elsewhere); err != nil {
			return out, reported, err
		}
		reported = true
	}
	if len(refused) > 0 {
		return out, reported, &ShardReceiptsError{ShardID: shardID, Receipts: refused}
	}
	return out, reported, nil
}

// submit sends one submission with retries. maybeApplied is set when an
// attempt's answer was lost after it may have reached the ledger.
func (e *Emergency) submit(ctx context.Context, sub ShardSubmission) (*ledgerv1.ReconcileShardResponse, bool, error) {
	msg := &ledgerv1.ReconcileShardRequest{ShardId: sub.ShardID, GatewayId: e.store.GatewayID(), Receipts: wireReceipts(sub.Units, sub.Receipts)}
	maybeApplied := false
	resp, attempts, lost, err := do(ctx, e.client, func(actx context.Context) (*connect.Response[ledgerv1.ReconcileShardResponse], error) {
		r, err := e.rpc.ReconcileShard(actx, connect.NewRequest(msg))
		if err != nil && isTransportFault(err) && !isDialError(err) {
			maybeApplied = true
		}
		return r, err
	})
	if err == nil {
		return resp.Msg, maybeApplied, nil
	}
	if lost {
		return nil, true, &LostError{Op: "reconcile shard", ReservationID: sub.ShardID, Attempts: attempts, Err: err}
	}
	return nil, maybeApplied, classify("reconcile shard", sub.ShardID, err)
}

// wireReceipts are local receipts as the ledger receives them: by unit
// name, under ledgerReceiptID.
func wireReceipts(units []string, receipts []ledger.ShardReceipt) []*ledgerv1.ShardReceipt {
	out := make([]*ledgerv1.ShardReceipt, 0, len(receipts))
	for _, r := range receipts {
		out = append(out, &ledgerv1.ShardReceipt{
			ReservationId: ledgerReceiptID(r.ReservationID), State: stateProto(r.State),
			ReservedUnits: fromAmounts(units, r.Reserved), ActualUnits: fromAmounts(units, r.Actual),
		})
	}
	return out
}

// ledgerReceiptID is the id a local reservation's receipt goes to the
// ledger under: its own, or for an id the ledger's rule refuses
// (ledger.IDProblem; one an SDK older than the rule admitted, which the
// shard store still holds) "sdk-legacy:" and the id's SHA-256 in hex.
// The ledger refuses a receipt with such an id, and with it the shard's
// whole submission, so the shard could never be reconciled; the derived
// id is the same on every submission and every GetShard, so resubmission
// and resolution work as for any receipt.
func ledgerReceiptID(id string) string {
	if ledger.IDProblem(id) == "" {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return legacyReceiptPrefix + hex.EncodeToString(sum[:])
}

// legacyReceiptPrefix starts the ledger's id of a receipt whose own id
// the ledger refuses (ledgerReceiptID).
const legacyReceiptPrefix = "sdk-legacy:"

// centralShard reads the ledger's record of a shard and the standing of
// each receipt there, in the receipts' order.
func (e *Emergency) centralShard(ctx context.Context, shardID string, receipts []ledger.ShardReceipt) (*ledgerv1.Shard, []ledgerv1.ShardReceiptStanding_Standing, error) {
	req := &ledgerv1.GetShardRequest{ShardId: shardID}
	for _, r := range receipts {
		req.ReceiptIds = append(req.ReceiptIds, ledgerReceiptID(r.ReservationID))
	}
	m, err := call(ctx, e.client, "get shard", shardID, func(actx context.Context) (*connect.Response[ledgerv1.GetShardResponse], error) {
		return e.rpc.GetShard(actx, connect.NewRequest(req))
	})
	if err != nil {
		return nil, nil, err
	}
	if len(m.GetReceipts()) != len(receipts) {
		return nil, nil, fmt.Errorf("get shard %s: %d receipt standings for %d ids (a ledger older than this SDK?)", shardID, len(m.GetReceipts()), len(receipts))
	}
	out := make([]ledgerv1.ShardReceiptStanding_Standing, len(receipts))
	for i, st := range m.GetReceipts() {
		if st.GetReservationId() != ledgerReceiptID(receipts[i].ReservationID) {
			return nil, nil, fmt.Errorf("get shard %s: standing %d is for %q, not %q", shardID, i, st.GetReservationId(), ledgerReceiptID(receipts[i].ReservationID))
		}
		out[i] = st.GetStanding()
	}
	return m.GetShard(), out, nil
}

// firstMatches reports whether the ledger's reconciliation of a shard is
// the one a first submission of these receipts produces: every receipt it
// reports unknown is (or was) pending there, none it reports terminal is,
// and, while none was resolved since, the split is exactly theirs.
func firstMatches(sub ShardSubmission, central *ledgerv1.Shard, standings []ledgerv1.ShardReceiptStanding_Standing) bool {
	if !central.GetReconciled() {
		return false
	}
	var used, unknown ledger.Amounts
	resolvedSince := false
	for i := range sub.Receipts {
		r := &sub.Receipts[i]
		isUnknown := r.State == ledger.StateStarted || r.State == ledger.StateUsageUnknown
		switch standings[i] {
		case ledgerv1.ShardReceiptStanding_STANDING_PENDING:
			if !isUnknown {
				return false
			}
		case ledgerv1.ShardReceiptStanding_STANDING_RESOLVED:
			if !isUnknown {
				return false
			}
			resolvedSince = true
		default:
			if isUnknown {
				return false
			}
		}
		for d := range used {
			if isUnknown {
				unknown[d] += r.Reserved[d]
			} else if r.State == ledger.StateSettled || r.State == ledger.StateSettledWithDebt {
				used[d] += r.Actual[d]
			}
		}
	}
	if resolvedSince {
		return true
	}
	alloc, err := toAmounts(sub.Units, central.GetAllocatedUnits())
	if err != nil {
		return false
	}
	var spent ledger.Amounts
	for d := range spent {
		spent[d] = min(used[d], alloc[d]-unknown[d])
	}
	gotSpent, err1 := toAmounts(sub.Units, central.GetSpentUnits())
	gotUnknown, err2 := toAmounts(sub.Units, central.GetUnknownUnits())
	return err1 == nil && err2 == nil && gotSpent == spent && gotUnknown == unknown
}

func refuseAll(receipts []ledger.ShardReceipt, reason string) []RefusedReceipt {
	out := make([]RefusedReceipt, len(receipts))
	for i, r := range receipts {
		out[i] = RefusedReceipt{ReservationID: r.ReservationID, State: r.State, Reason: reason}
	}
	return out
}

func addUnits(sum, more Units) Units {
	if sum == nil {
		sum = Units{}
	}
	for k, v := range more {
		sum[k] += v
	}
	return sum
}

// reasonShardAlreadyReconciled is the server's ErrorDetail reason.
const (
	reasonShardAlreadyReconciled = "SHARD_ALREADY_RECONCILED"
	reasonShardForeign           = "SHARD_FOREIGN"
	reasonShardNotFound          = "SHARD_NOT_FOUND"
)

// reasonRemovedShard is a RefusedReceipt's reason when the ledger no
// longer knows a shard this store holds and this submission was not in
// flight before.
const reasonRemovedShard = "the shard was reconciled by another submission and removed by the ledger's retention; the ledger did not take this receipt"

func stateProto(s ledger.State) ledgerv1.ReservationState {
	switch s {
	case ledger.StateReserved:
		return ledgerv1.ReservationState_RESERVATION_STATE_RESERVED
	case ledger.StateStarted:
		return ledgerv1.ReservationState_RESERVATION_STATE_STARTED
	case ledger.StateSettled:
		return ledgerv1.ReservationState_RESERVATION_STATE_SETTLED
	case ledger.StateSettledWithDebt:
		return ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT
	case ledger.StateReleased:
		return ledgerv1.ReservationState_RESERVATION_STATE_RELEASED
	case ledger.StateExpired:
		return ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED
	case ledger.StateUsageUnknown:
		return ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN
	}
	return ledgerv1.ReservationState_RESERVATION_STATE_UNSPECIFIED
}
