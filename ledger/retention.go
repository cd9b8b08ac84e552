package ledger

import (
	"errors"
	"fmt"
	"time"
)

// Retention: finished reservations leave the store after a window, and a
// compact tombstone answers a late retry of one for a longer horizon.
//
// What is terminal, what may be removed and what a command on a removed
// reservation answers is decided here; a store only keeps (and deletes)
// the rows. Removing a reservation changes no balance: its settled usage
// and overdraft are added to the account's Retained totals in the same
// step, so the audit's spent and debt checks still add up. The journal
// records one thing of retention: the end of a tombstone (forgetEntry),
// after which the id may be reused; the audit's refund_once check splits
// an id's lives only there.

// Tombstone is what is left of a reservation retention removed: enough to
// recognise a retry of it (id and request digest) and to say how it ended.
// About 100 bytes a row, against about 250 for the reservation and its
// index entries.
type Tombstone struct {
	ID            string
	RequestDigest string
	Account       AccountKey
	// State is the terminal state the reservation ended in.
	State State
	// FinishedAt is when it ended; the tombstone horizon counts from it.
	FinishedAt time.Time
}

// Receipt is the partial receipt a command on a removed reservation
// answers with: what the tombstone keeps, Retired set, amounts zero.
func (t *Tombstone) Receipt() Reservation {
	return Reservation{ID: t.ID, RequestDigest: t.RequestDigest, Account: t.Account, State: t.State,
		FinishedAt: t.FinishedAt, Retired: true}
}

// Retained totals what retention removed from one account: how many
// reservations, and the settled usage and overdraft they carried (what the
// audit would otherwise have read from their rows).
type Retained struct {
	Account      AccountKey
	Reservations int64
	Spent        Amounts
	Overdraft    Amounts
}

// RetentionBook is the Book extension retention needs. A book without it
// keeps every reservation forever; retire and forget are then invalid
// commands, and no command ever finds a tombstone.
type RetentionBook interface {
	Book
	// Tombstone returns the tombstone of a removed reservation.
	Tombstone(id string) (*Tombstone, bool)
	TombstonePut(t *Tombstone)
	// TombstoneRemove drops a tombstone (the horizon passed).
	TombstoneRemove(id string)
	// ReservationRemove deletes a reservation row.
	ReservationRemove(id string)
	// Retained returns an account's retention totals.
	Retained(key AccountKey) (*Retained, bool)
	RetainedPut(r *Retained)
}

// ErrReservationRetired wraps the answers given from a tombstone that are
// errors; errors.Is(err, ErrReservationRetired) tells a caller the row is
// gone, and errors.Is with the state error (ErrReservationAlreadySettled,
// ...) how it ended.
var ErrReservationRetired = errors.New("reservation removed by retention")

// tombstone looks id up among the tombstones, when b keeps them.
func tombstone(b Book, id string) (*Tombstone, bool) {
	rb, ok := b.(RetentionBook)
	if !ok {
		return nil, false
	}
	return rb.Tombstone(id)
}

// retiredError is lookup's answer for a removed reservation, turned into
// a Result by missing.
type retiredError struct{ t *Tombstone }

func (e retiredError) Error() string { return ErrReservationRetired.Error() + ": " + e.t.ID }
func (e retiredError) Unwrap() error { return ErrReservationRetired }

// missing is the answer of a reservation command whose lookup failed.
func missing(err error, kind Kind) Result {
	var re retiredError
	if errors.As(err, &re) {
		return fromTombstone(re.t, kind, re.t.RequestDigest)
	}
	return Result{Err: err}
}

// Answer is what a command of kind on the removed reservation answers
// (digest: the command's request digest, for reserve and record), as
// fromTombstone decides it. The gateway's shard store answers for the
// reservations of its ended shards with it, so a retried id gets the
// same answers there as from the ledger's own tombstones.
func (t *Tombstone) Answer(kind Kind, digest string) Result { return fromTombstone(t, kind, digest) }

// fromTombstone answers a command on a removed reservation. The receipt is
// the tombstone's (Retired set); nothing is debited, refunded or changed.
//   - reserve with the stored digest: Replayed, as for a live row (a retry
//     never debits twice); with another digest: ErrDigestMismatch;
//   - release of a RELEASED one, expiry (claim or completion) of an EXPIRED
//     one: Replayed;
//   - record with the stored digest of a settled one: Replayed, as its
//     first answer was a success (the digest names the subject, route and
//     region; the tombstone keeps neither the operation id nor the usage,
//     so a record of other usage under the id replays too, where a live
//     row answers ErrReservationAlreadySettled: either way nothing is
//     charged and the first record stands);
//   - record with another digest: ErrDigestMismatch;
//   - anything else: the error the terminal state gives (settle:
//     ErrReservationAlreadySettled, since the tombstone keeps neither the
//     operation id nor the usage a replayed settle would be compared with),
//     wrapped so that it also matches ErrReservationRetired.
func fromTombstone(t *Tombstone, kind Kind, digest string) Result {
	res := Result{Reservation: t.Receipt(), Generation: t.Account.Generation}
	switch {
	case kind == KindReserve && digest == t.RequestDigest,
		kind == KindRecord && digest == t.RequestDigest && (t.State == StateSettled || t.State == StateSettledWithDebt),
		kind == KindRelease && t.State == StateReleased,
		(kind == KindExpire || kind == KindExpireClaim) && t.State == StateExpired:
		res.Replayed = true
	case kind == KindReserve, kind == KindRecord && digest != t.RequestDigest:
		res.Err = fmt.Errorf("%w (%w)", ErrDigestMismatch, ErrReservationRetired)
	default:
		res.Err = fmt.Errorf("%w (%w)", stateError(t.State), ErrReservationRetired)
	}
	return res
}

// Retire removes a finished reservation, leaving its tombstone: the
// retention worker's command. before is the retention cutoff;
// forgetBefore, when not zero, the tombstone horizon's: a reservation that
// finished at or before it leaves no tombstone, since Forget would drop it
// at once (a backlog older than the horizon: retention switched on over an
// old store, a pass after a long outage), and so costs one removal, not
// a tombstone written and then deleted. A retry of its id is then
// unknown, as it would be a moment later, and the retire journals the
// forget entry a Forget would (forgetEntry).
//
// Returns: success (Reservation is the tombstone's receipt, or what it
// would have been) once removed;
// Replayed when it was removed already; ErrReservationNotFound when there
// is neither a row nor a tombstone (a second retire of one removed past
// the horizon, too: the retention worker counts it failed); ErrReservationNotFinished for a
// reservation that is not terminal (it holds capacity or awaits a
// receipt, and is never removed); ErrReservationNotDue when it finished
// after before; ErrInvalidCommand for an empty id or a book that keeps no
// tombstones.
func Retire(b Book, id string, before, forgetBefore, now time.Time) Result {
	rb, ok := b.(RetentionBook)
	if !ok {
		return Result{Err: invalid("this book keeps no tombstones")}
	}
	if id == "" {
		return Result{Err: invalid("reservation id is empty")}
	}
	r, ok := rb.Reservation(id)
	if !ok {
		if t, ok := rb.Tombstone(id); ok {
			return Result{Reservation: t.Receipt(), Replayed: true, Generation: t.Account.Generation}
		}
		return Result{Err: fmt.Errorf("%w: %s", ErrReservationNotFound, id)}
	}
	if !r.State.Terminal() {
		return Result{Err: fmt.Errorf("%w: %s is %s", ErrReservationNotFinished, id, r.State), Reservation: *r}
	}
	if r.FinishedAt.After(before) {
		return Result{Err: fmt.Errorf("%w: %s finished at %s, after the cutoff %s", ErrReservationNotDue, id, r.FinishedAt, before), Reservation: *r}
	}
	totals, ok := rb.Retained(r.Account)
	if !ok {
		totals = &Retained{Account: r.Account}
	} else {
		copied := *totals
		totals = &copied
	}
	totals.Reservations++
	if r.State == StateSettled || r.State == StateSettledWithDebt {
		for d := range totals.Spent {
			totals.Spent[d] += r.Actual[d]
			totals.Overdraft[d] += r.Overdraft[d]
		}
	}
	t := &Tombstone{ID: r.ID, RequestDigest: r.RequestDigest, Account: r.Account, State: r.State, FinishedAt: r.FinishedAt}
	rb.RetainedPut(totals)
	if forgetBefore.IsZero() || r.FinishedAt.After(forgetBefore) {
		rb.TombstonePut(t)
	} else {
		forgetEntry(b, t, now)
	}
	rb.ReservationRemove(id)
	return Result{Reservation: t.Receipt(), Generation: t.Account.Generation}
}

// Forget drops the tombstone of a reservation that finished at or before
// before (the tombstone horizon's cutoff) and journals that it did
// (forgetEntry). After it, the id is unknown: a reserve with it admits a
// new reservation.
//
// Returns: success; ErrReservationNotFound when there is no tombstone (a
// replay of a forget); ErrReservationNotDue when it finished after before;
// ErrInvalidCommand for an empty id, a live reservation of that id (not a
// tombstone), or a book that keeps no tombstones.
func Forget(b Book, id string, before, now time.Time) Result {
	rb, ok := b.(RetentionBook)
	if !ok {
		return Result{Err: invalid("this book keeps no tombstones")}
	}
	if id == "" {
		return Result{Err: invalid("reservation id is empty")}
	}
	t, ok := rb.Tombstone(id)
	if !ok {
		return Result{Err: fmt.Errorf("%w: no tombstone %s", ErrReservationNotFound, id)}
	}
	if t.FinishedAt.After(before) {
		return Result{Err: fmt.Errorf("%w: %s finished at %s, after the cutoff %s", ErrReservationNotDue, id, t.FinishedAt, before), Reservation: t.Receipt()}
	}
	rb.TombstoneRemove(id)
	forgetEntry(b, t, now)
	return Result{Reservation: t.Receipt(), Generation: t.Account.Generation}
}

// forgetEntry journals the end of t: from now on its id is unknown and
// may be admitted again. The audit (refund_once) accepts a second life of
// an id only after such an entry, so an id admitted again while its
// tombstone lived (a reserve or record that ignored it) is reported, not
// taken for a reuse. The entry moves nothing (zero delta) and neither
// begins nor ends a life (From = To = the state it ended in).
func forgetEntry(b Book, t *Tombstone, now time.Time) {
	b.JournalAppend(JournalEntry{At: now, Kind: KindForget, Account: t.Account, ReservationID: t.ID, From: t.State, To: t.State})
}

// Memory's retention rows.

func (m *Memory) Tombstone(id string) (*Tombstone, bool) { t, ok := m.tombstones[id]; return t, ok }
func (m *Memory) TombstonePut(t *Tombstone) {
	if m.tombstones == nil {
		m.tombstones = map[string]*Tombstone{}
	}
	m.tombstones[t.ID] = t
}
func (m *Memory) TombstoneRemove(id string) { delete(m.tombstones, id) }
func (m *Memory) ReservationRemove(id string) {
	if m.lastReservation != nil && m.lastReservation.ID == id {
		m.lastReservation = nil
	}
	delete(m.reservations, id)
}
func (m *Memory) Retained(key AccountKey) (*Retained, bool) { r, ok := m.retained[key]; return r, ok }
func (m *Memory) RetainedPut(r *Retained) {
	if m.retained == nil {
		m.retained = map[AccountKey]*Retained{}
	}
	m.retained[r.Account] = r
}

// Tombstones returns every tombstone (tests).
func (m *Memory) Tombstones() map[string]*Tombstone { return m.tombstones }
