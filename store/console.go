package store

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/capledger/capledger/ledger"
)

// ConsoleStore is what the operator console reads beyond the worker
// indexes: one subject's reservations by state, one account's statements,
// the USAGE_UNKNOWN resolver's last answers and the last audits. All of it
// is committed state any replica reads alike. Every driver implements it
// (memstore, SQLite, PostgreSQL) and store/storetest checks it; it is an
// interface of its own, like Rollouts, so a wrapper around a Store that
// does not forward it only loses the console's extra reads.
type ConsoleStore interface {
	ResolverAnswers
	SubjectReservations
	StatementReads
	AuditRecords
}

// ResolverAnswer is the USAGE_UNKNOWN resolver's last answer about one
// reservation, kept so that every replica can show it and a new worker
// leader picks the backoff up where the last one left it.
//
// An answer belongs to (Account, ReservationID): ids are the clients',
// and once retention forgot a reservation another account may reserve
// under its id, so an answer about the first (a settle refused because
// the id was taken meanwhile, a backoff, an attempt count) must never
// show for, or steer the resolver on, the second.
type ResolverAnswer struct {
	Account       ledger.AccountKey
	ReservationID string
	// Answer is what the last question got: an engine.OperationState
	// name ("running", "unknown", ...), or "error", "no_endpoint",
	// "settle_refused".
	Answer string
	// Detail is the error text of an "error" or "settle_refused" answer.
	Detail string
	// AskedAt is when the question was asked; Attempts how many were
	// asked; NextAt when the next one is due.
	AskedAt  time.Time
	Attempts int64
	NextAt   time.Time
}

// ResolverAnswers keeps the resolver's last answer per USAGE_UNKNOWN
// reservation, by (account, reservation id).
type ResolverAnswers interface {
	// ResolverAnswersPut upserts answers, by (Account, ReservationID),
	// in one transaction. An answer without a reservation id or an
	// account's subject is an error, and nothing is stored.
	ResolverAnswersPut(ctx context.Context, answers []ResolverAnswer) error
	// ResolverAnswersGet returns, in the order of ids and at most one
	// per id, the stored answer about the reservation each id names now
	// when that reservation is USAGE_UNKNOWN and the answer is of its
	// account. An id without an answer, whose reservation was settled or
	// removed since, or whose answer is of another account (retention
	// forgot that account's reservation and this one reused the id) is
	// left out: such an answer is stale, or another tenant's.
	ResolverAnswersGet(ctx context.Context, ids []string) ([]ResolverAnswer, error)
	// ResolverAnswersPrune deletes every answer that is not of a
	// USAGE_UNKNOWN reservation of its account under its id (settled,
	// removed by retention, or the id reused by another account) and
	// returns how many it deleted.
	ResolverAnswersPrune(ctx context.Context) (int, error)
}

// Check returns an error when a cannot be stored: it names no
// reservation or no account. Every driver calls it on each answer before
// it writes any, so a bad batch fails alike on each store and stores
// nothing.
func (a *ResolverAnswer) Check() error {
	switch {
	case a.ReservationID == "":
		return fmt.Errorf("resolver answer without a reservation id")
	case a.Account.Subject == "":
		return fmt.Errorf("resolver answer of %s without its account", a.ReservationID)
	}
	return nil
}

// SubjectReservations lists one subject's reservations, through an index
// of reservations by (subject, state, created_at, id). Retention removes
// terminal reservations; they are not listed and not counted (their
// number per account is in SubjectStates.Retained).
type SubjectReservations interface {
	// ReservationsOfSubject returns up to f.Limit reservations of
	// f.Subject in the states f.States (every state when empty), the
	// newest first (by CreatedAt, then ID, both descending), strictly
	// before f.Before unless it is the zero cursor. f.Limit <= 0 is an
	// error.
	ReservationsOfSubject(ctx context.Context, f SubjectFilter) ([]ledger.Reservation, error)
	// ReservationStatesOfSubject counts the subject's reservations by
	// route and state (rows with a zero count are left out, ordered by
	// route then state), and returns what retention removed from each of
	// its accounts (ordered by key).
	ReservationStatesOfSubject(ctx context.Context, subject string) (SubjectStates, error)
}

// SubjectFilter selects reservations for ReservationsOfSubject.
type SubjectFilter struct {
	Subject string
	// States are the states listed; empty: every state.
	States []ledger.State
	// Before is the paging cursor: the CreatedAt and ID of the last
	// reservation of the previous page.
	Before SubjectCursor
	Limit  int
}

// SubjectCursor is a position in the newest-first order of
// ReservationsOfSubject.
type SubjectCursor struct {
	CreatedAt time.Time
	ID        string
}

// SubjectStates is ReservationStatesOfSubject's answer.
type SubjectStates struct {
	Counts   []StateCount
	Retained []RetainedCount
}

// StateCount is how many reservations of one route are in one state.
type StateCount struct {
	Route string
	State ledger.State
	Count int64
}

// RetainedCount is how many reservations of an account retention removed.
type RetainedCount struct {
	Account      ledger.AccountKey
	Reservations int64
}

// StatementReads reads one account's epoch statements (kept forever, as
// the billing record).
type StatementReads interface {
	// StatementsOf returns up to f.Limit statements of f.Account, the
	// latest epoch first, with EpochStart strictly before f.Before unless
	// it is zero. f.Limit <= 0 is an error.
	StatementsOf(ctx context.Context, f StatementFilter) ([]ledger.Statement, error)
}

// StatementFilter selects statements for StatementsOf.
type StatementFilter struct {
	Account ledger.AccountKey
	Before  time.Time
	Limit   int
}

// AuditRecord is the outcome of one audit, kept so that the console shows
// the same last audit on every replica and after a restart.
type AuditRecord struct {
	At time.Time
	// By is the token name of who asked for it ("" with auth off).
	By string
	// Mode is "full" or "since_checkpoint".
	Mode string
	// Discrepancies is how many were found; Checks counts them by check
	// (ledger.Discrepancy.Check). A clean audit has none.
	Discrepancies int64
	Checks        map[string]int64
}

// Clean reports whether the audit found nothing.
func (r *AuditRecord) Clean() bool { return r.Discrepancies == 0 }

// AuditRecords keeps the last audit and the last clean audit.
type AuditRecords interface {
	// AuditRecordPut records rec as the last audit, and as the last clean
	// audit when it is clean, each only if no later audit (by At) is
	// recorded already: two replicas' audits land in time order whatever
	// order their writes arrive in.
	AuditRecordPut(ctx context.Context, rec *AuditRecord) error
	// AuditRecordsGet returns the last audit and the last clean audit,
	// each nil when none was recorded.
	AuditRecordsGet(ctx context.Context) (last, lastClean *AuditRecord, err error)
}

// The names of the two rows of the audit records.
const (
	AuditRecordLast  = "last"
	AuditRecordClean = "last_clean"
)

// NewestFirst orders reservations as ReservationsOfSubject returns them.
func NewestFirst(a, b ledger.Reservation) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(b.ID, a.ID)
}

// Admits reports whether r comes strictly after cursor c in the
// newest-first order (the zero cursor: every reservation does).
func (c SubjectCursor) Admits(r *ledger.Reservation) bool {
	if c == (SubjectCursor{}) {
		return true
	}
	if !r.CreatedAt.Equal(c.CreatedAt) {
		return r.CreatedAt.Before(c.CreatedAt)
	}
	return r.ID < c.ID
}

// MergeNewestFirst merges lists each already newest first (one per state,
// as a driver reads them from its index) into the first limit of them all.
func MergeNewestFirst(lists [][]ledger.Reservation, limit int) []ledger.Reservation {
	var out []ledger.Reservation
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.SortFunc(out, NewestFirst)
	return out[:min(limit, len(out))]
}

// StatesList returns the states ReservationsOfSubject lists for f: f's,
// or every stored state (ledger.StoredStates).
func (f SubjectFilter) StatesList() []ledger.State {
	if len(f.States) > 0 {
		return f.States
	}
	return ledger.StoredStates
}

// Check returns an error naming the field when f cannot be served: a
// limit that is not positive, or a state no reservation row is ever in
// (ledger.State.Stored). Every driver calls it first, so a filter the
// server let through fails alike on each store instead of listing
// nothing on one and something on another.
func (f SubjectFilter) Check() error {
	if f.Limit <= 0 {
		return fmt.Errorf("reservations of %s: limit %d is not positive", f.Subject, f.Limit)
	}
	for _, st := range f.States {
		if !st.Stored() {
			return fmt.Errorf("reservations of %s: states: %v is not a stored reservation state", f.Subject, st)
		}
	}
	return nil
}

// SubjectIndexReporter is implemented by a store whose subject index
// (SubjectReservations) is written behind the commits and may have to
// catch up (SQLite). The server shows its status on /statusz and
// /metrics; a store without it shows nothing there.
type SubjectIndexReporter interface {
	SubjectIndexStatus() SubjectIndexStatus
}

// SubjectIndexStatus is a subject index's state as last seen.
type SubjectIndexStatus struct {
	// CatchingUp: the index may lack committed reservations (a COMMIT
	// whose outcome was unknown, or the waiting entries dropped at their
	// cap) and is being rebuilt from the journal; meanwhile its listings
	// answer ErrUnavailable.
	CatchingUp bool
	// CatchUps counts the catch-ups begun since the store was opened.
	CatchUps uint64
	// Pending is how many committed entries wait to be written to the
	// index.
	Pending int
	// LastError is the last flush or catch-up transaction's error, ""
	// once one worked.
	LastError string
}
