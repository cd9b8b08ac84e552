// Package store defines where the ledger's rows live. A store keeps rows and
// guarantees atomic, durable, isolated transactions; it never decides ledger
// semantics (that is package ledger's job) and every driver passes the same
// conformance suite, store/storetest.
package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Errors every driver reports in these terms (wrapped with context), so the
// engine can act on them without knowing the driver.
var (
	// ErrNotFound: no such row.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the transaction lost a race (serialization failure,
	// deadlock, busy database) and was rolled back; retrying it whole is safe.
	ErrConflict = errors.New("transaction conflict")
	// ErrUnavailable: the store could not be reached or the outcome of a
	// commit is unknown. The caller must not report success; a retry with
	// the same ids converges because every command is idempotent.
	ErrUnavailable = errors.New("store unavailable")
	// ErrDuplicate: an insert hit a unique constraint (reservation id, move
	// or shard receipt id). The ledger checks before it writes, so seeing
	// this means a concurrent writer won; the transaction is rolled back and
	// may be retried whole.
	ErrDuplicate = errors.New("duplicate key")
	// ErrRolledBack: a Commit that failed, but that the store knows did
	// not commit (rolled back, also after a crash and recovery), wrapped
	// beside the cause (ErrUnavailable for a full disk). Unlike
	// ErrConflict it is not retried at once: the cause must go first. A
	// retry with the same ids is right, as for every failure.
	ErrRolledBack = errors.New("rolled back")
	// ErrDamaged: the store's file is damaged (a malformed page, a file
	// that is no longer a database; PostgreSQL's own corruption errors,
	// XX001 and XX002), wrapped beside ErrUnavailable (on PostgreSQL
	// beside whatever the error was wrapped in before): a server answers
	// unavailable as for any store failure, but a command reading the
	// store (capledger audit) knows that retrying does not help.
	ErrDamaged = errors.New("store file damaged")
)

// Store is a durable home for the ledger's rows.
type Store interface {
	// Begin opens a write transaction. Rows read through it are locked
	// against other writers until Commit or Rollback (SELECT ... FOR UPDATE
	// in PostgreSQL; one writer at a time in SQLite). Its errors, and
	// Tx.Commit's, name the step ("begin: ...", "commit: ..."): callers
	// add what they know (the engine: "not applied"), not the step again.
	Begin(ctx context.Context) (Tx, error)

	// Reads of committed state, outside any write transaction.
	ReservationGet(ctx context.Context, id string) (ledger.Reservation, error)
	AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error)
	// AccountList returns the accounts of a subject key (every generation),
	// ordered by generation; an empty Subject lists every account.
	AccountList(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, error)
	// AccountsOfSubjects returns the accounts of the named subject keys
	// (every generation of each, as AccountList returns one subject's),
	// in key order (subject, route, region, generation; text compared as
	// bytes). A subject named twice is read once; a key with an empty
	// Subject names no account (it is not AccountList's "every account");
	// none found, or none named, is an empty list. It reads them in one
	// query (SQLite: one statement per 128 subjects), so a page of
	// debtors costs the engine one read, not one AccountList per row.
	AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, error)
	// AccountsView returns what a view shows of subjects' accounts
	// (AccountsView: their accounts, the owing rows of those that owe,
	// the generation deciding for each and the policies of those
	// generations and the accounts'), all from one snapshot of the
	// committed rows (SQLite: one read transaction; PostgreSQL: one REPEATABLE READ, read-only
	// transaction; the in-memory store: one hold of its lock), through
	// ReadAccountsView. A read view reads this, not the heads and
	// policies on their own: a publish or rollback committed between two
	// reads made a view of numbers that never stood together.
	AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (AccountsView, error)
	// AccountsPage returns up to f.Limit accounts that f's subject, route
	// and region select, in key order (subject, route, region,
	// generation; text compared as in AccountList's order of every
	// account), strictly after f.After unless it is the zero key; none is
	// an empty list, f.Limit <= 0 or a cursor generation above
	// math.MaxInt64 an error. Each page is a read of its own (a seek into
	// the accounts' key, then limit rows), so reading every account page
	// by page holds no read open for the whole of them: in SQLite a long
	// read keeps WAL checkpoints from finishing. With f.Subject it reads
	// that subject's range of the key only, whatever the other subjects'
	// accounts (memstore excepted: it walks its map); with f.Route and no
	// subject, that route's accounts only, through the accounts' route
	// index (SQLite schema 21, PostgreSQL 20: accounts_by_route).
	AccountsPage(ctx context.Context, f AccountFilter) ([]ledger.Account, error)
	PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error)
	// PoliciesOfGenerations returns the policies of generations, as
	// PolicyGet returns each, by generation: a generation that does not
	// exist is absent, not an error; one named twice is read once; none
	// named is an empty map. It reads them in one query (SQLite: one
	// statement per 128 generations), so the generations of a page of a
	// thousand tenants' accounts, each under a policy of its own, cost
	// one read, not a PolicyGet (a round trip in PostgreSQL) per account.
	PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error)
	// PolicyHead returns a policy key's head: its active generation (0
	// when every one was rolled back) and its latest; store.ErrNotFound
	// when the key never had a policy. One row, however many policies
	// there are: what a caller reads instead of PolicyList to learn what
	// decides for one key.
	PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error)
	// PolicyHeads returns the heads of keys, as PolicyHead returns each,
	// by key: a key that never had a policy is absent, not an error; a
	// key named twice is read once; none named is an empty map. It reads
	// them in one query (SQLite: one statement per 128 keys), so the
	// heads deciding for a page of a million tenants' accounts cost one
	// read, not a PolicyHead (a round trip in PostgreSQL) per subject.
	PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error)
	// PolicyList returns every generation, oldest first.
	PolicyList(ctx context.Context) ([]ledger.Policy, error)
	// PolicyListAfter returns the generations newer than after, oldest
	// first: what was published since a reader last looked (generations
	// are numbered in publication order), a range of the primary key.
	PolicyListAfter(ctx context.Context, after uint64) ([]ledger.Policy, error)
	// PolicyChanges returns the committed count of policy changes (the
	// ledger.MetaPolicyChanges meta row: publishes and rollbacks), 0 when
	// none was counted: one row, so a reader that keeps what it derived
	// from the policies learns whether to read them again without
	// reading them.
	PolicyChanges(ctx context.Context) (uint64, error)
	// PolicyPage returns up to f.Limit generations newer than f.After,
	// oldest first, of the keys f's subject, route and region select
	// (each when not empty, matched exactly), each with whether its key's
	// head names it active, read with it; none is an empty list, as is
	// f.After above math.MaxInt64 (no store holds such a generation);
	// f.Limit <= 0 is an error. Each page is a read of its own (a range
	// of the primary key, and a head row per policy), so listing every
	// policy page by page holds no read open for the whole of them.
	PolicyPage(ctx context.Context, f PolicyFilter) ([]ListedPolicy, error)
	ShardGet(ctx context.Context, id string) (ledger.Shard, error)
	ShardList(ctx context.Context) ([]ledger.Shard, error)
	// ShardsUnreconciled returns up to f.Limit shards issued under
	// generation f.Generation (their Account's) and not reconciled, in id
	// order, with ids after f.After ("" starts at the first); none is an
	// empty list, as is a generation above math.MaxInt64 (no row can hold
	// one); f.Limit <= 0 is an error. A driver reads them through an index
	// of the unreconciled shards by generation (SQLite schema 22,
	// PostgreSQL 21: shards_unreconciled), so DrainProgress reads a
	// generation's open shards only, not every shard ever issued.
	ShardsUnreconciled(ctx context.Context, f UnreconciledShardFilter) ([]ledger.Shard, error)

	// ReservationsDue returns up to limit reservations that need a worker
	// at now: RESERVED with ExpiresAt <= now, EXPIRING, and STARTED with a
	// non-zero ExecutionDeadline <= now, each as its committed row read
	// (id, state and due time from one row, one read), ordered by DueAt,
	// ties by id; none for limit <= 0. The worker decides its commands
	// from them without reading the rows again: they may be stale by the
	// time its batch commits, and the ledger checks each again there.
	ReservationsDue(ctx context.Context, now time.Time, limit int) ([]DueReservation, error)

	// ReservationsUnknown returns up to f.Limit USAGE_UNKNOWN reservations,
	// the longest-waiting first (by UnknownAt, then ID), that come after
	// f.After in that order and match f's subject and route (each when not
	// empty). None is an empty list; f.Limit <= 0, or a cursor time that
	// no row can hold (one codec.Conv.Nanos refuses), is an error. A driver
	// keeps an index of USAGE_UNKNOWN rows so this does not read the
	// reservations of other states.
	ReservationsUnknown(ctx context.Context, f UnknownFilter) ([]ledger.Reservation, error)
	// ReservationsUnknownBacklog counts the USAGE_UNKNOWN reservations and
	// finds the earliest UnknownAt among them, from the same index.
	ReservationsUnknownBacklog(ctx context.Context) (UnknownBacklog, error)

	// AccountsInDebt returns up to f.Limit accounts whose stored row owes
	// debt in some dimension (OverdraftIssued > OverdraftRepaid), in key
	// order (subject, route, region, generation), with keys after f.After.
	// Stored rows refill lazily, so a row may still show debt that the
	// refill due since its last command would repay; the caller applies
	// that refill before it reports an account as owing.
	//
	// The accounts are whole rows, as AccountGet returns them; every
	// balance of the row counts, not only the first Dims. None is an empty
	// list; f.Limit <= 0, or a cursor generation above math.MaxInt64 (no
	// row can hold one), is an error. A driver keeps an index of the
	// accounts whose row owes (RowInDebt), written by the transaction that
	// writes the account, so a call reads debtors only: PostgreSQL a
	// partial index of the accounts flagged in_debt (the flag kept by
	// triggers on the term rows, schema 12), SQLite a table of the
	// debtors' keys (its balances are encoded), the in-memory store a set.
	AccountsInDebt(ctx context.Context, f DebtFilter) ([]ledger.Account, error)
	// AccountsInDebtCount counts the accounts AccountsInDebt pages
	// through (those whose stored row owes), from the same index, in one
	// read: its cost grows with the debtors, not with the other accounts.
	// Stored rows refill lazily, so a row refill has repaid since its
	// last command still counts until its next.
	AccountsInDebtCount(ctx context.Context) (int64, error)

	// Snapshot reads every row for an audit, in one consistent read
	// (Retained included; tombstones are not rows an audit needs), the
	// journal after the last checkpoint only (Checkpoints holds the chain,
	// as in AuditSnapshot), all in memory: tests and small ledgers.
	Snapshot(ctx context.Context) (*ledger.Snapshot, error)

	// Worker indexes and the worker lease (store/due.go).
	DueIndexes
	Leases
	RetentionStore
	ShardRetentionStore
	CheckpointStore

	Close() error
}

// Tx is one write transaction. Getters return ErrNotFound for a missing
// row; the pointer returned is the caller's to change (it is not shared
// with the store). Nothing is visible to others before Commit returns nil.
type Tx interface {
	MetaGet(ctx context.Context, name string) (int64, error)
	PolicyGet(ctx context.Context, generation uint64) (*ledger.Policy, error)
	PolicyHeadGet(ctx context.Context, key ledger.PolicyKey) (*ledger.PolicyHead, error)
	AccountGet(ctx context.Context, key ledger.AccountKey) (*ledger.Account, error)
	AccountCurrentGet(ctx context.Context, subject ledger.PolicyKey) (uint64, error)
	ReservationGet(ctx context.Context, id string) (*ledger.Reservation, error)
	MoveGet(ctx context.Context, receiptID string) (*ledger.Move, error)
	ShardGet(ctx context.Context, id string) (*ledger.Shard, error)
	RetentionTx

	// Write applies a batch of changes inside the transaction. Rows are
	// written in a fixed order (policies, heads, meta, accounts by key,
	// currents, the reservations retention removed, reservations by id,
	// moves, shards, statements, the rest of Retention, journal).
	Write(ctx context.Context, c *Changes) error
	// Commit makes the transaction durable. It returns nil only once the
	// changes are durable; ErrConflict if it must be retried; ErrRolledBack
	// (with its cause) when it failed and is known not to have committed;
	// ErrUnavailable without ErrRolledBack if the outcome is unknown.
	Commit(ctx context.Context) error
	// Rollback discards the transaction; it is safe after Commit (no-op).
	Rollback(ctx context.Context) error
}

// Prefetcher is an optional Tx capability: read and lock the named
// reservations in one round trip, so that a batch's N lookups cost one
// query. Getters then answer from what was prefetched.
type Prefetcher interface {
	ReservationsPrefetch(ctx context.Context, ids []string) error
}

// AccountsPrefetcher is an optional Tx capability: read, in a few
// statements, the current generation of each named subject and that
// generation's account, the named accounts, and the accounts of the named
// reservations (which ReservationsPrefetch read before), so that a batch's
// commands over many accounts do not each read rows of their own. Getters
// then answer them without a query. A store that locks rows locks all of
// these accounts in its lock order: a batch then takes its account locks
// in one order, and two batches of different replicas over the same
// accounts wait for each other instead of deadlocking.
type AccountsPrefetcher interface {
	AccountsPrefetch(ctx context.Context, subjects []ledger.PolicyKey, accounts []ledger.AccountKey, reservations []string) error
}

// ReservationsRechecker is an optional Tx capability of a store whose
// transaction sees, statement by statement, what others committed
// meanwhile (PostgreSQL's READ COMMITTED): a reservation id looked up
// absent may have been inserted by another replica's transaction that
// committed before this one's next lock was granted, so the account this
// one read afterwards already holds that reservation's units. The engine
// asks it about the reserves a batch rejected for capacity, once the
// batch holds its account locks. A store whose transactions run one at a
// time (SQLite, the in-memory store) needs no such capability.
type ReservationsRechecker interface {
	// ReservationsCommitted returns those of ids stored by a committed
	// transaction, read afresh (no lock, nothing written); nil when none.
	ReservationsCommitted(ctx context.Context, ids []string) ([]string, error)
}

// SubjectOwing is a subject's current pointer (HasCurrent false: none
// stored) and its owing-set Meta rows by name (the row named
// ledger.OwingMetaName and those named under it with "/"), as
// Store.AccountsView reads them.
type SubjectOwing struct {
	Current    uint64
	HasCurrent bool
	Meta       map[string]int64
}

// IsOwingMeta reports whether name is one of subject's owing-set Meta
// rows: ledger.OwingMetaName(subject), or a name under it after "/".
func IsOwingMeta(subject ledger.PolicyKey, name string) bool {
	base := ledger.OwingMetaName(subject)
	return name == base || strings.HasPrefix(name, base+"/")
}

// Current is one subject's pointer to the generation holding its capacity.
type Current struct {
	Subject    ledger.PolicyKey
	Generation uint64
}

// Changes is what one batch of commands wrote. Upserts replace the whole
// row; Moves, Statements and Journal are inserts (a move or shard receipt id
// that exists already is ErrDuplicate).
type Changes struct {
	Meta map[string]int64
	// MetaRemoved names meta rows to delete (absent ones are no error),
	// in name order; a name is never in both Meta and MetaRemoved.
	MetaRemoved  []string
	Policies     []ledger.Policy
	Heads        []ledger.PolicyHead
	Accounts     []ledger.Account
	Currents     []Current
	Reservations []ledger.Reservation
	// NewReservations marks which Reservations are inserts (the rest are
	// updates), by id, so a store can use INSERT for them and let a unique
	// constraint catch a concurrent duplicate.
	NewReservations map[string]bool
	Moves           []ledger.Move
	Shards          []ledger.Shard
	Statements      []ledger.Statement
	Journal         []ledger.JournalEntry
	// Retention is what retire and forget commands wrote.
	Retention RetentionChanges
	// RemovedShards names shard rows retention removed
	// (ledger.RemoveShards), in id order; a driver deletes them after it
	// writes Shards (an id is never in both).
	RemovedShards []string
}

// Empty reports whether the batch changed nothing.
func (c *Changes) Empty() bool {
	return len(c.Meta) == 0 && len(c.MetaRemoved) == 0 && len(c.Policies) == 0 && len(c.Heads) == 0 && len(c.Accounts) == 0 &&
		len(c.Currents) == 0 && len(c.Reservations) == 0 && len(c.Moves) == 0 && len(c.Shards) == 0 &&
		len(c.Statements) == 0 && len(c.Journal) == 0 && c.Retention.Empty() && len(c.RemovedShards) == 0
}

// UnknownFilter selects USAGE_UNKNOWN reservations for ReservationsUnknown.
type UnknownFilter struct {
	// Subject and Route, when not empty, must equal the reservation's.
	Subject, Route string
	// After is the paging cursor: only reservations after it in the order
	// (UnknownAt, ID) are returned. The zero cursor starts at the first.
	After UnknownCursor
	// Limit is the most reservations returned; it must be positive.
	Limit int
}

// UnknownCursor is a position in the order of ReservationsUnknown: the
// UnknownAt and ID of the last reservation of the previous page.
type UnknownCursor struct {
	// MarkedAt is the reservation's UnknownAt: when it was marked
	// USAGE_UNKNOWN.
	MarkedAt time.Time
	ID       string
}

// UnknownBacklog is the USAGE_UNKNOWN backlog: started work whose usage
// nobody has reported. Its capacity stays reserved until an operation
// receipt settles it.
type UnknownBacklog struct {
	Count int64
	// OldestMarkedAt is the earliest UnknownAt of them (when the
	// longest-waiting one was marked USAGE_UNKNOWN); zero when Count is 0.
	OldestMarkedAt time.Time
}

// RowInDebt reports whether a stored account row owes debt in any of its
// balances, those past Dims included (a row holds them all): the test
// AccountsInDebt applies, and the one rule by which every driver keeps
// its index of debtors (PostgreSQL's accounts.in_debt triggers and its
// index account_terms_in_debt repeat it in SQL: overdraft_issued >
// overdraft_repaid).
func RowInDebt(a *ledger.Account) bool {
	for i := range a.Balances {
		if a.Balances[i].OverdraftIssued > a.Balances[i].OverdraftRepaid {
			return true
		}
	}
	return false
}

// ListedPolicy is a generation as PolicyPage lists it.
type ListedPolicy struct {
	Policy ledger.Policy
	// Active reports whether the generation is its key's active one (its
	// PolicyHead's Active) in the same read.
	Active bool
}

// PolicyFilter pages through PolicyPage.
type PolicyFilter struct {
	// Subject, Route and Region select the policies of matching keys,
	// each when not empty (exactly: "*" is the wildcard subject's own
	// policies, not every subject's).
	Subject, Route, Region string
	// After is the paging cursor, the generation of the last policy of
	// the previous page: only newer generations are returned; 0 starts
	// at the first.
	After uint64
	// Limit is the most policies returned; it must be positive.
	Limit int
}

// AccountFilter pages through AccountsPage.
type AccountFilter struct {
	// Subject, Route and Region select the accounts of matching subject
	// keys, each when not empty, matched exactly ("*" is no pattern: no
	// account has that subject). A Route without a Subject reads that
	// route's accounts by the route index; a Region goes with a Subject
	// or a Route only (else AccountsPage refuses the filter, Problem):
	// without one, a page of a region that few accounts have would read
	// every account in one read, where a caller reading every account
	// filters each page.
	Subject, Route, Region string
	// After is the paging cursor, normally the key of the last account of
	// the previous page: only accounts with a greater key are returned.
	// The zero key starts at the first.
	After ledger.AccountKey
	// Limit is the most accounts returned; it must be positive.
	Limit int
}

// Problem returns why AccountsPage refuses f's subject, route and
// region (a region without a subject or a route), or nil.
func (f AccountFilter) Problem() error {
	if f.Subject == "" && f.Route == "" && f.Region != "" {
		return errors.New("a region filter needs a subject or a route")
	}
	return nil
}

// Selects reports whether f's subject, route and region select the
// account of key (the cursor aside).
func (f AccountFilter) Selects(key ledger.AccountKey) bool {
	return (f.Subject == "" || f.Subject == key.Subject) && (f.Route == "" || f.Route == key.Route) &&
		(f.Region == "" || f.Region == key.Region)
}

// OfRoute reports whether AccountsPage reads f by the route index: a
// route and no subject.
func (f AccountFilter) OfRoute() bool { return f.Subject == "" && f.Route != "" }

// RouteSeek returns where a page of f.Route's accounts (OfRoute) starts,
// in the route index's order (subject, region, generation), which is
// key order within one route: strictly after (subject, region,
// generation), generation -1 being before every account of (subject,
// region); or, when pastSubject is set, at the first account of a
// subject greater than subject. A cursor of another route compares as a
// key does: one of an earlier route starts at its subject's accounts of
// f.Route, one of a later route after them.
func (f AccountFilter) RouteSeek() (subject, region string, generation int64, pastSubject bool) {
	switch a := f.After; {
	case a == (ledger.AccountKey{}):
		return "", "", -1, false
	case a.Route < f.Route:
		return a.Subject, "", -1, false
	case a.Route > f.Route:
		return a.Subject, "", -1, true
	default:
		// AccountsPage checked the generation fits an int64.
		return a.Subject, a.Region, int64(a.Generation), false
	}
}

// UnreconciledShardFilter pages through ShardsUnreconciled.
type UnreconciledShardFilter struct {
	// Generation is the generation the shards were issued under.
	Generation uint64
	// After is the paging cursor, the id of the last shard of the
	// previous page; "" starts at the first.
	After string
	// Limit is the most shards returned; it must be positive.
	Limit int
}

// DebtFilter pages through AccountsInDebt.
type DebtFilter struct {
	// After is the paging cursor, normally the key of the last account of
	// the previous page: only accounts with a greater key (in the order
	// of AccountsInDebt) are returned. The zero key starts at the first.
	After ledger.AccountKey
	// Limit is the most accounts returned; it must be positive.
	Limit int
}

// Syncer is an optional Store capability: pipelined durability. A store
// opened for it commits without waiting for its log to reach the disk
// when asked to (DeferredCommitter), and Sync then makes those commits
// durable, so that a caller may apply and write its next batch while the
// previous one's fsync is in flight, and answer that batch's callers only
// once Sync has returned nil.
//
// Whatever the mode, Tx.Commit keeps its contract (durable when it returns
// nil), and the Store's read methods never return a deferred commit that
// is not durable yet: they sync before they answer. After a failed sync
// the store is failed for good (a failed fsync may have dropped the dirty
// pages it was to write, so retrying it could report success for data that
// is gone): Sync, Begin and every read return the error until the process
// opens the store again.
type Syncer interface {
	// Pipelined reports whether the store was opened for deferred commits;
	// when it is false, DeferredCommitter commits are durable at once and
	// Sync does nothing.
	Pipelined() bool
	// Sync makes every transaction whose CommitDeferred returned before
	// Sync was called durable, and returns nil; or the permanent error.
	Sync(ctx context.Context) error
}

// DeferredCommitter is the Tx capability of a Syncer store: CommitDeferred
// is Commit except that, in a Pipelined store, the commit is durable only
// once a later Sync returns nil. A crash before that may lose it, and every
// commit after it with it (never a commit without the ones before).
type DeferredCommitter interface {
	CommitDeferred(ctx context.Context) error
}
