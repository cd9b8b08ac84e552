package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/capledger/capledger/store"
)

// Exported for the external tests of the query plans.
var (
	UnknownSQL        = unknownSQL
	UnknownBacklogSQL = unknownBacklogSQL
	DebtFirstSQL      = debtFirstSQL
	DebtAfterSQL      = debtAfterSQL
	// AccountsOfSubjectsSQL is AccountsOfSubjects' query.
	AccountsOfSubjectsSQL = accountsOfSubjectsSQL
	DueSQL                = dueSQL
	AcrossFirstSQL        = acrossFirstSQL
	AcrossAfterSQL        = acrossAfterSQL
	PolicyPageSQL         = policyPageSQL
	PoliciesOfSQL         = policiesOfSQL
	// AccountsPage's queries of one subject.
	PageOfSubjectFirstSQL = pageOfSubjectFirstSQL
	PageOfSubjectAfterSQL = pageOfSubjectAfterSQL
	// AccountsPage's queries of one route.
	PageOfRouteSQL     = pageOfRouteSQLText
	PageOfRoutePastSQL = pageOfRoutePastSQLText
	// ReservationStatesOfSubject's count and ReservationsOfSubject's
	// pages.
	SubjectStatesSQL = subjectStatesSQL
	SubjectFirstSQL  = subjectFirstSQL
	SubjectBeforeSQL = subjectBeforeSQL
)

// SetAccountPage sets how many rows a page of an audit's account streams
// holds, and returns a function restoring it.
func SetAccountPage(n int) (restore func()) {
	old := accountPage
	accountPage = n
	return func() { accountPage = old }
}

// The batch prefetches' statements, with the lock clause a batch's first
// lock takes.
var (
	ReservationsPrefetchSQL = reservationsPrefetchSQL + lockWait.clause("")
	TombstonesPrefetchSQL   = tombstonesPrefetchSQL
	PrefetchHeadsSQL        = prefetchHeadsSQL
	PrefetchCurrentsSQL     = prefetchCurrentsSQL
	PrefetchAccountsSQL     = prefetchAccountsSQL + lockWait.clause("a, t")
)

// PoolOf returns the store's connection pool (its connections carry the
// store's session settings).
func PoolOf(s *Store) *pgxpool.Pool { return s.pool }

// PgxTx returns the pgx transaction under a write transaction of the
// store, for reading what the transaction did (its statistics, its
// connection's prepared statements).
func PgxTx(t store.Tx) pgx.Tx { return t.(*tx).tx }

// SetCheckpointLeaseTTL sets the TTL of the lease s's checkpoint writers
// take (checkpointLeaseTTL when 0).
func SetCheckpointLeaseTTL(s *Store, ttl time.Duration) { s.checkpointTTL = ttl }

// MetaLockedOutOfOrder names the Meta rows the write transaction t
// locked out of the fixed lock order (lockMode).
func MetaLockedOutOfOrder(t store.Tx) []string { return t.(*tx).metaOutOfOrder }
