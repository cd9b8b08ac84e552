package ledger

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// ShardLocal is the gateway-side ledger of one emergency shard: the same
// reservation state machine as the central ledger (RESERVED -> STARTED ->
// SETTLED | SETTLED_WITH_DEBT, RESERVED -> RELEASED, STARTED ->
// USAGE_UNKNOWN -> SETTLED...), over four terms that always satisfy
//
//	Allocated = Available + Reserved + Spent + Retired
//
// Available is what the shard may still admit, Reserved the holds of local
// reservations (including started work and work of unknown usage), Spent the
// settled usage the shard covered, Retired what the gateway will never spend
// (handed back at Seal). Usage beyond the shard is never dropped: it is kept
// in Overdraft, outside the four terms (it is not the shard's capacity), the
// shard admits nothing while it is positive, later refunds cover it first,
// and reconciliation charges what is left of it to the central account as
// debt.
//
// ShardLocal is pure and deterministic (time arrives as an argument) and
// not safe for concurrent use; client.ShardStore wraps it with a durable
// log, the simulator uses it directly. It trusts its shard: verify it
// (VerifyShard) before NewShardLocal.
type ShardLocal struct {
	Shard     Shard
	Available Amounts
	Reserved  Amounts
	Spent     Amounts
	Retired   Amounts
	Overdraft Amounts
	// Sealed is set once the shard admits nothing more: it was handed back
	// for reconciliation, or a later boot of the gateway inherited it.
	Sealed bool
	// Units, when set, are the unit names of the amounts' positions (the
	// shard generation's dimensions, in order); errors name a dimension by
	// its unit then, as the caller wrote it, and by its index otherwise.
	Units []string

	reservations map[string]*Reservation
	order        []string
	// submitted is set once the first submission was accepted; pending
	// holds the ids it reported with unknown usage that no later
	// submission has resolved yet.
	submitted bool
	pending   map[string]bool
}

// ErrShardSealed: the shard admits nothing more: it was handed back for
// reconciliation, fenced by a newer shard, or inherited by a later boot.
var ErrShardSealed = errors.New("shard sealed")

// NewShardLocal returns the local ledger of shard s with its whole
// allocation available.
func NewShardLocal(s *Shard) *ShardLocal {
	l := &ShardLocal{Shard: *s, reservations: map[string]*Reservation{}, pending: map[string]bool{}}
	l.Shard.Signature = slices.Clone(s.Signature)
	l.Available = s.Allocated
	return l
}

// Check returns nil when the four terms add up to the allocation in every
// dimension, no term is negative, Reserved is the holds of the unfinished
// local reservations, and Spent + Overdraft is the settled usage (nothing
// used is dropped); otherwise an error naming the first broken dimension.
// It is the per-shard conservation check.
func (l *ShardLocal) Check() error {
	var held, used Amounts
	for _, r := range l.reservations {
		for d := range held {
			switch {
			case r.State.Holds():
				held[d] += r.Reserved[d]
			case r.State == StateSettled || r.State == StateSettledWithDebt:
				used[d] += r.Actual[d]
			}
		}
	}
	for d := range l.Shard.Allocated {
		if held[d] != l.Reserved[d] || used[d] != l.Spent[d]+l.Overdraft[d] {
			return fmt.Errorf("shard %s %s: reserved %d, holds %d; spent %d + overdraft %d, settled usage %d",
				l.Shard.ID, l.dimension(d), l.Reserved[d], held[d], l.Spent[d], l.Overdraft[d], used[d])
		}
		sum := l.Available[d] + l.Reserved[d] + l.Spent[d] + l.Retired[d]
		if sum != l.Shard.Allocated[d] {
			return fmt.Errorf("shard %s %s: allocated %d != available %d + reserved %d + spent %d + retired %d",
				l.Shard.ID, l.dimension(d), l.Shard.Allocated[d], l.Available[d], l.Reserved[d], l.Spent[d], l.Retired[d])
		}
		if l.Available[d] < 0 || l.Reserved[d] < 0 || l.Spent[d] < 0 || l.Retired[d] < 0 || l.Overdraft[d] < 0 {
			return fmt.Errorf("shard %s %s: negative term (available %d, reserved %d, spent %d, retired %d, overdraft %d)",
				l.Shard.ID, l.dimension(d), l.Available[d], l.Reserved[d], l.Spent[d], l.Retired[d], l.Overdraft[d])
		}
	}
	return nil
}

// dimension names dimension d for an error (see Units).
func (l *ShardLocal) dimension(d int) string {
	if d < len(l.Units) && l.Units[d] != "" {
		return fmt.Sprintf("%q (dimension %d)", l.Units[d], d)
	}
	return fmt.Sprintf("dimension %d", d)
}

// Reservation returns the local receipt of id.
func (l *ShardLocal) Reservation(id string) (Reservation, bool) {
	r, ok := l.reservations[id]
	if !ok {
		return Reservation{}, false
	}
	return *r, true
}

// Reservations returns every local receipt in admission order.
func (l *ShardLocal) Reservations() []Reservation {
	out := make([]Reservation, 0, len(l.order))
	for _, id := range l.order {
		out = append(out, *l.reservations[id])
	}
	return out
}

// Reserve admits units from the shard under reservation id, all
// dimensions at once or none.
//
// Returns: success with the RESERVED receipt (its ExpiresAt is the
// shard's); Replayed with the stored receipt for a known id and digest;
// ErrDigestMismatch for a known id with another digest; ErrInvalidCommand
// for an empty id or bad units; ErrShardSealed once sealed;
// ErrShardExpired at or after the shard's expiry; ErrAdmissionFrozen while
// Overdraft is positive; ErrInsufficientCapacity when a dimension lacks
// available units.
func (l *ShardLocal) Reserve(id, digest string, units Amounts, now time.Time) Result {
	if p := IDProblem(id); p != "" {
		// The server's rule for ids: ReconcileShard refuses a receipt
		// with such an id, and with it the shard's whole submission.
		return Result{Err: invalid("reservation id %s", p)}
	}
	return l.ReplayReserve(id, digest, units, now)
}

// ReplayReserve is Reserve without the id rule, for replaying a durable
// log of reservations Reserve admitted when they were written: a log
// written before the rule (or under a looser one) holds ids it refuses
// today, and is history to load, not a request to judge (their receipts
// are still refused by ReconcileShard). Returns as Reserve.
func (l *ShardLocal) ReplayReserve(id, digest string, units Amounts, now time.Time) Result {
	if existing, ok := l.reservations[id]; ok {
		if existing.RequestDigest != digest {
			return Result{Err: ErrDigestMismatch, Reservation: *existing}
		}
		return Result{Reservation: *existing, Replayed: true, Generation: l.Shard.Account.Generation}
	}
	positive := false
	for d, u := range units {
		if u < 0 || u > MaxUnits {
			return Result{Err: invalid("units in %s are outside [0, %d] (%d)", l.dimension(d), MaxUnits, u)}
		}
		positive = positive || u > 0
	}
	if !positive {
		return Result{Err: invalid("no units to reserve")}
	}
	if err := l.admits(now); err != nil {
		return Result{Err: err, Generation: l.Shard.Account.Generation}
	}
	for d, u := range units {
		if u > l.Available[d] {
			return Result{Err: fmt.Errorf("%w: shard %s has %d left in %s, %d asked",
				ErrInsufficientCapacity, l.Shard.ID, l.Available[d], l.dimension(d), u), Generation: l.Shard.Account.Generation}
		}
	}
	for d, u := range units {
		l.Available[d] -= u
		l.Reserved[d] += u
	}
	r := &Reservation{
		ID: id, RequestDigest: digest, Account: l.Shard.Account, Reserved: units,
		State: StateReserved, CreatedAt: now, ExpiresAt: l.Shard.ExpiresAt,
	}
	l.reservations[id] = r
	l.order = append(l.order, id)
	return Result{Reservation: *r, Generation: l.Shard.Account.Generation}
}

// admits returns why the shard admits nothing new at now, or nil.
func (l *ShardLocal) admits(now time.Time) error {
	switch {
	case l.Sealed:
		return fmt.Errorf("%w: %s", ErrShardSealed, l.Shard.ID)
	case !now.Before(l.Shard.ExpiresAt):
		return fmt.Errorf("%w: shard %s expired at %s", ErrShardExpired, l.Shard.ID, l.Shard.ExpiresAt.Format(time.RFC3339))
	case l.Overdraft != Amounts{}:
		return fmt.Errorf("%w: shard %s was overdrawn by %v", ErrAdmissionFrozen, l.Shard.ID, l.Overdraft)
	}
	return nil
}

// Start binds an operation id to a RESERVED local reservation (STARTED).
//
// Returns: success with the STARTED receipt; Replayed for the same
// operation id on started (or later) work; ErrOperationMismatch;
// ErrShardExpired at or after the shard's expiry and ErrShardSealed once
// sealed (a hold may not start work then: release it);
// ErrReservationReleased; ErrReservationNotFound; ErrInvalidCommand.
func (l *ShardLocal) Start(id, operationID string, now time.Time) Result {
	r, res, ok := l.lookup(id)
	if !ok {
		return res
	}
	if operationID == "" {
		return Result{Err: invalid("operation id is empty"), Reservation: *r}
	}
	switch r.State {
	case StateReserved:
		if l.Sealed {
			return Result{Err: fmt.Errorf("%w: %s", ErrShardSealed, l.Shard.ID), Reservation: *r}
		}
		if !now.Before(l.Shard.ExpiresAt) {
			return Result{Err: fmt.Errorf("%w: shard %s", ErrShardExpired, l.Shard.ID), Reservation: *r}
		}
		r.State = StateStarted
		r.OperationID = operationID
		r.StartedAt = now
		return Result{Reservation: *r, Generation: l.Shard.Account.Generation}
	case StateStarted, StateUsageUnknown, StateSettled, StateSettledWithDebt:
		if r.OperationID != operationID {
			return Result{Err: ErrOperationMismatch, Reservation: *r}
		}
		return Result{Reservation: *r, Replayed: true, Generation: l.Shard.Account.Generation}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// Settle records the actual usage of started local work and refunds the
// unused difference once. Usage above the hold takes the shard's available
// units first; the rest is Overdraft (SETTLED_WITH_DEBT), and the shard
// admits nothing more until refunds cover it. Settling is allowed after
// expiry and after Seal: the work was admitted in time.
//
// Returns: success with the receipt and Refunded; Replayed for the same
// operation id and usage; ErrReservationAlreadySettled for a different
// settle; ErrReservationNotStarted; ErrOperationMismatch;
// ErrReservationReleased; ErrReservationNotFound; ErrInvalidCommand.
func (l *ShardLocal) Settle(id, operationID string, actual Amounts, now time.Time) Result {
	r, res, ok := l.lookup(id)
	if !ok {
		return res
	}
	if operationID == "" {
		return Result{Err: invalid("operation id is empty: only an operation receipt settles"), Reservation: *r}
	}
	switch r.State {
	case StateStarted, StateUsageUnknown:
	case StateSettled, StateSettledWithDebt:
		if r.OperationID == operationID && r.Actual == actual {
			return Result{Reservation: *r, Replayed: true, Generation: l.Shard.Account.Generation}
		}
		return Result{Err: ErrReservationAlreadySettled, Reservation: *r}
	case StateReserved:
		return Result{Err: ErrReservationNotStarted, Reservation: *r}
	default:
		return Result{Err: stateError(r.State), Reservation: *r}
	}
	if r.OperationID != operationID {
		return Result{Err: ErrOperationMismatch, Reservation: *r}
	}
	for d, u := range actual {
		if u < 0 || u > MaxUnits {
			return Result{Err: invalid("actual units in %s are outside [0, %d] (%d)", l.dimension(d), MaxUnits, u), Reservation: *r}
		}
	}
	var refunded Amounts
	r.State = StateSettled
	for d := range actual {
		reserved, used := r.Reserved[d], actual[d]
		l.Reserved[d] -= reserved
		if used <= reserved {
			l.Spent[d] += used
			refunded[d] = reserved - used
			l.refund(d, reserved-used)
			continue
		}
		extra := used - reserved
		fromAvailable := min(extra, l.Available[d])
		l.Available[d] -= fromAvailable
		l.Spent[d] += reserved + fromAvailable
		if over := extra - fromAvailable; over > 0 {
			l.Overdraft[d] += over
			r.Overdraft[d] = over
			r.State = StateSettledWithDebt
		}
	}
	r.Actual = actual
	r.FinishedAt = now
	return Result{Reservation: *r, Refunded: refunded, Generation: l.Shard.Account.Generation}
}

// refund returns units of dimension d to the shard: they cover overdraft
// first (that usage becomes spent within the shard), the rest becomes
// available again, or retired once the shard is sealed.
func (l *ShardLocal) refund(d int, units Units) {
	cover := min(units, l.Overdraft[d])
	l.Overdraft[d] -= cover
	l.Spent[d] += cover
	if l.Sealed {
		l.Retired[d] += units - cover
	} else {
		l.Available[d] += units - cover
	}
}

// Release gives an unstarted local hold back in full.
//
// Returns: success with the RELEASED receipt and Refunded; Replayed when
// already released; ErrReservationAlreadyStarted for started work,
// ErrReservationAlreadySettled for settled work (as the ledger's Release);
// ErrReservationNotFound; ErrInvalidCommand.
func (l *ShardLocal) Release(id string, now time.Time) Result {
	r, res, ok := l.lookup(id)
	if !ok {
		return res
	}
	switch r.State {
	case StateReserved:
		for d, u := range r.Reserved {
			l.Reserved[d] -= u
			l.refund(d, u)
		}
		r.State = StateReleased
		r.FinishedAt = now
		return Result{Reservation: *r, Refunded: r.Reserved, Generation: l.Shard.Account.Generation}
	case StateReleased:
		return Result{Reservation: *r, Replayed: true, Generation: l.Shard.Account.Generation}
	case StateStarted, StateUsageUnknown:
		return Result{Err: ErrReservationAlreadyStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// MarkUsageUnknown records that the outcome of started local work is
// unknown; its hold stays reserved until a settle resolves it.
//
// Returns: success with the USAGE_UNKNOWN receipt; Replayed when already
// unknown; ErrReservationNotStarted; ErrReservationAlreadySettled or
// ErrReservationReleased for finished work; ErrReservationNotFound.
func (l *ShardLocal) MarkUsageUnknown(id string, now time.Time) Result {
	r, res, ok := l.lookup(id)
	if !ok {
		return res
	}
	switch r.State {
	case StateStarted:
		r.State, r.UnknownAt = StateUsageUnknown, now
		return Result{Reservation: *r, Generation: l.Shard.Account.Generation}
	case StateUsageUnknown:
		return Result{Reservation: *r, Replayed: true, Generation: l.Shard.Account.Generation}
	case StateReserved:
		return Result{Err: ErrReservationNotStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// Seal stops all admission from the shard, ahead of reconciliation: every
// unstarted hold is released, and what is available moves to Retired.
// Started work goes on and may still settle. It returns the ids of the
// holds it released (none when already sealed).
func (l *ShardLocal) Seal(now time.Time) []string {
	if l.Sealed {
		return nil
	}
	l.Sealed = true
	for d := range l.Available {
		l.Retired[d] += l.Available[d]
		l.Available[d] = 0
	}
	var released []string
	for _, id := range l.order {
		if l.reservations[id].State == StateReserved {
			l.Release(id, now)
			released = append(released, id)
		}
	}
	return released
}

// Inherit is what a later boot of the gateway does with a shard of an
// earlier one: it seals it (a restart never inherits spendable capacity)
// and marks the earlier process's started work USAGE_UNKNOWN, since
// nothing can report its usage but an operation receipt.
func (l *ShardLocal) Inherit(now time.Time) {
	l.Seal(now)
	for _, id := range l.order {
		if l.reservations[id].State == StateStarted {
			l.MarkUsageUnknown(id, now)
		}
	}
}

// Submission returns the receipts to send for reconciliation now: before
// the first accepted submission, every local receipt (the shard must be
// sealed first, so none is RESERVED); after it, the receipts it reported
// unknown that have since become terminal. ok is false when there is
// nothing to send (not sealed yet, or nothing newly resolved).
func (l *ShardLocal) Submission() (receipts []ShardReceipt, ok bool) {
	if !l.Sealed {
		return nil, false
	}
	for _, id := range l.order {
		r := l.reservations[id]
		if l.submitted && (!l.pending[id] || !r.State.Terminal()) {
			continue
		}
		receipts = append(receipts, ShardReceipt{ReservationID: id, State: r.State, Reserved: r.Reserved, Actual: r.Actual})
	}
	if l.submitted && len(receipts) == 0 {
		return nil, false
	}
	return receipts, true
}

// Submitted records that the ledger accepted receipts (as returned by
// Submission), or refused them as already reconciled, which means an
// earlier attempt with the same receipts was accepted and its answer lost.
func (l *ShardLocal) Submitted(receipts []ShardReceipt) {
	for i := range receipts {
		r := &receipts[i]
		if !l.submitted && r.unknown() {
			l.pending[r.ReservationID] = true
		} else {
			delete(l.pending, r.ReservationID)
		}
	}
	l.submitted = true
}

// Reconciled reports whether the first submission was accepted, and how
// many receipts it left unknown that are still unresolved centrally.
func (l *ShardLocal) Reconciled() (done bool, pending int) {
	return l.submitted, len(l.pending)
}

func (l *ShardLocal) lookup(id string) (*Reservation, Result, bool) {
	if id == "" {
		return nil, Result{Err: invalid("reservation id is empty")}, false
	}
	r, ok := l.reservations[id]
	if !ok {
		return nil, Result{Err: fmt.Errorf("%w: %s", ErrReservationNotFound, id)}, false
	}
	return r, Result{}, true
}
