package store

import (
	"context"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
)

// DueIndexes are the reads the engine's workers page through, so a worker
// reads only the rows that may need it, never every account. Every driver
// keeps an index for each.
type DueIndexes interface {
	// AccountsByEpoch returns up to f.Limit accounts of generation
	// f.Generation whose EpochStart is at or before f.StartedBy (any
	// EpochStart when f.StartedBy is zero), in the order of the driver's
	// epoch index, strictly after f.After unless it is the zero cursor,
	// and the position of the last one returned (the cursor that
	// continues after it; the zero cursor when none is). The accounts are
	// whole rows, as AccountGet returns them. None is an empty list;
	// f.Limit <= 0, or a generation, time or cursor that no row can hold
	// (one codec.Conv refuses), is an error.
	//
	// The index orders accounts by (indexed epoch start, subject, route,
	// region). The indexed epoch start is at most EpochStart, so the
	// index never hides an account within the bound. The in-memory store
	// and PostgreSQL index EpochStart itself (the position is the
	// account's EpochCursorOf); SQLite's entry of an account whose busy
	// epoch rolled stays where it was, behind EpochStart, until
	// EpochIndexCatchUp moves it, so the roll writes no page of the index.
	//
	// The epoch worker asks, per generation, for the accounts whose epoch
	// began at least one epoch length ago; the drain worker pages through
	// the accounts of a superseded generation. Drivers keep an index on
	// (generation, indexed epoch start, key).
	//
	// With f.AllGenerations (f.Generation must then be zero) it lists the
	// accounts of every generation instead, from a second index, across
	// generations: by (indexed epoch start, subject, route, region,
	// generation), the cursor's Generation included. The epoch worker
	// reads it once per epoch length for the epoch starts its last pass
	// has not read yet, so a pass costs a few reads however many
	// generations there are (engine.EpochPager).
	AccountsByEpoch(ctx context.Context, f EpochFilter) ([]ledger.Account, EpochCursor, error)

	// EpochIndexCatchUp moves to their account's EpochStart the entries
	// of AccountsByEpoch's index that lag it, among up to f.Limit entries
	// of generation f.Generation whose indexed epoch start is at or
	// before f.StartedBy (any when zero), strictly after f.After, in index
	// order. It returns the position of the last entry it read and
	// whether there may be more (it read f.Limit). A driver whose index
	// never lags (in-memory, PostgreSQL) reads nothing and returns the
	// zero cursor and false. The epoch worker calls it over the range its
	// pass read, after the pass's closes, in bounded chunks: so lagging
	// entries move in index order, a few pages a chunk, rather than each
	// roll moving one at a random page. With f.AllGenerations it reads the
	// index across generations (as AccountsByEpoch does) and moves lagging
	// entries of every generation in the range. Errors are as
	// AccountsByEpoch's.
	EpochIndexCatchUp(ctx context.Context, f EpochFilter) (EpochCursor, bool, error)
}

// CheckEpochFilter returns an error for a filter no driver accepts: a
// limit that is not positive, or AllGenerations with a generation.
func CheckEpochFilter(f EpochFilter) error {
	if f.Limit <= 0 {
		return fmt.Errorf("limit %d is not positive", f.Limit)
	}
	if f.AllGenerations && f.Generation != 0 {
		return fmt.Errorf("generation %d with every generation", f.Generation)
	}
	return nil
}

// DueReservation is one reservation ReservationsDue lists: what the
// expiry worker needs to pick its commands.
type DueReservation struct {
	ID    string
	State ledger.State
	// DueAt is when it became due: ExpiresAt for RESERVED and EXPIRING,
	// ExecutionDeadline for STARTED (the due_at the drivers index).
	DueAt time.Time
}

// EpochFilter selects and pages AccountsByEpoch.
type EpochFilter struct {
	Generation uint64
	// AllGenerations lists every generation's accounts, in the order of
	// the index across generations; Generation must be zero.
	AllGenerations bool
	// StartedBy bounds the accounts' EpochStart from above (inclusive);
	// zero means no bound.
	StartedBy time.Time
	// After is the paging cursor: the position of the last account of the
	// previous page. The zero cursor starts at the first.
	After EpochCursor
	// Limit is the most accounts returned; it must be positive.
	Limit int
}

// EpochCursor is a position in the order of AccountsByEpoch.
type EpochCursor struct {
	// EpochStart is the indexed epoch start: the account's EpochStart,
	// or an earlier one where the driver's entry lags (SQLite).
	EpochStart time.Time
	Subject    string
	Route      string
	Region     string
	// Generation orders accounts of one key at one epoch start across
	// generations (EpochFilter.AllGenerations); the per-generation order
	// ignores it.
	Generation uint64
}

// EpochCursorOf returns the position of account a in an index of
// EpochStart itself (the in-memory store's and PostgreSQL's).
func EpochCursorOf(a *ledger.Account) EpochCursor {
	return EpochCursor{EpochStart: a.EpochStart, Subject: a.Key.Subject, Route: a.Key.Route, Region: a.Key.Region, Generation: a.Key.Generation}
}

// LastEpochCursor returns the position of page's last account in an index
// of EpochStart itself (EpochCursorOf), or the zero cursor for an empty
// page: AccountsByEpoch's cursor in such a driver.
func LastEpochCursor(page []ledger.Account) EpochCursor {
	if len(page) == 0 {
		return EpochCursor{}
	}
	return EpochCursorOf(&page[len(page)-1])
}

// Leases elect one worker leader per store: whoever holds a named lease
// runs the maintenance workers, so several replicas on one store do not
// all expire, close and drain the same rows.
type Leases interface {
	// LeaseAcquire takes or renews the lease name for holder for ttl, at
	// the store's clock. It returns the lease as held after the call:
	// Held is true when holder holds it now (it was free, expired, or
	// holder's already), false when another holder's lease is unexpired
	// (Holder and Expires then say whose, until when). Every change of
	// holder increments Fence, so a holder can tell it was replaced.
	// A store with one process per data directory (SQLite, in-memory)
	// keeps the lease in memory: the process owns it.
	LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error)
	// LeaseRelease gives the lease up if holder holds it (so another can
	// take it at once, without waiting for the expiry); a lease held by
	// another is left alone. It is not an error to release a lease not
	// held.
	LeaseRelease(ctx context.Context, name, holder string) error
}

// Lease is the state of one named lease.
type Lease struct {
	Name   string
	Holder string
	// Held reports whether the caller of LeaseAcquire holds it.
	Held bool
	// Expires is when the lease lapses unless renewed, at the store's clock.
	Expires time.Time
	// Fence counts the changes of holder since the lease was created.
	Fence int64
}

// DefaultWorkerLease is the lease name the engine's workers run under.
const DefaultWorkerLease = "workers"
