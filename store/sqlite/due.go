package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// The AccountsByEpoch queries (index accounts_by_epoch): ?1 generation,
// ?2 the inclusive bound on epoch_start, ?3 the limit; the paging one
// continues strictly after the position (?4 epoch_start, ?5 subject,
// ?6 route, ?7 region), a row-value comparison SQLite turns into a seek
// into the index.
var (
	epochFirstSQL = "SELECT " + accountCols + " FROM accounts WHERE generation = ?1 AND epoch_start <= ?2" +
		" ORDER BY generation, epoch_start, subject, route, region LIMIT ?3"
	epochAfterSQL = "SELECT " + accountCols + " FROM accounts WHERE generation = ?1 AND epoch_start <= ?2" +
		" AND (epoch_start, subject, route, region) > (?4, ?5, ?6, ?7)" +
		" ORDER BY generation, epoch_start, subject, route, region LIMIT ?3"
)

// dbQuery adapts a query string on the read pool to queryAll.
type dbQuery struct {
	db    *sql.DB
	query string
}

func (q dbQuery) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return q.db.QueryContext(ctx, q.query, args...)
}

// AccountsByEpoch returns up to f.Limit accounts of generation
// f.Generation with epoch_start <= f.StartedBy (any when it is zero), in
// (epoch_start, subject, route, region) order, strictly after f.After
// unless it is the zero cursor. It reads the index accounts_by_epoch and
// only the rows it returns.
func (s *Store) AccountsByEpoch(ctx context.Context, f store.EpochFilter) (_ []ledger.Account, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("accounts by epoch: limit %d is not positive", f.Limit)
	}
	var c codec.Conv
	generation := c.Int(f.Generation)
	bound := int64(math.MaxInt64)
	if !f.StartedBy.IsZero() {
		bound = c.Nanos(f.StartedBy)
	}
	after := c.Nanos(f.After.EpochStart)
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("accounts by epoch: %w", err)
	}
	what := fmt.Sprintf("accounts of generation %d by epoch", f.Generation)
	if f.After == (store.EpochCursor{}) {
		return queryAll(ctx, dbQuery{s.readDB, epochFirstSQL}, scanAccount, what, generation, bound, f.Limit)
	}
	return queryAll(ctx, dbQuery{s.readDB, epochAfterSQL}, scanAccount, what, generation, bound, f.Limit,
		after, f.After.Subject, f.After.Route, f.After.Region)
}

// LeaseAcquire grants the lease to every holder: one process owns a
// SQLite data directory (the file is locked against a second writer), so
// it owns the leases too. The lease never expires.
func (s *Store) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if s.closed.Load() {
		return store.Lease{}, errClosed
	}
	if name == "" || holder == "" || ttl <= 0 {
		return store.Lease{}, fmt.Errorf("lease: name, holder and a positive ttl are required (name %q, holder %q, ttl %v)", name, holder, ttl)
	}
	return store.Lease{Name: name, Holder: holder, Held: true, Fence: 1}, nil
}

// LeaseRelease does nothing: the process keeps owning its leases.
func (s *Store) LeaseRelease(ctx context.Context, name, holder string) error {
	if s.closed.Load() {
		return errClosed
	}
	return nil
}
