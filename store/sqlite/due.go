package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// The AccountsByEpoch queries (index accounts_by_epoch, on (generation,
// epoch_indexed) and then the key): ?1 generation, ?2 the inclusive bound
// on epoch_start, ?3 the limit; the paging one continues strictly after
// the position (?4 epoch_indexed, ?5 subject, ?6 route, ?7 region), a
// row-value comparison SQLite turns into a seek into the index. Since
// epoch_indexed <= epoch_start, the range on epoch_indexed holds every row
// within the bound; epoch_start filters out those of an entry left behind
// whose epoch is not due yet. Each row ends with its epoch_indexed (the
// cursor).
var (
	epochFirstSQL = "SELECT " + accountCols + ", epoch_indexed FROM accounts WHERE generation = ?1 AND epoch_indexed <= ?2" +
		" AND epoch_start <= ?2 ORDER BY generation, epoch_indexed, subject, route, region LIMIT ?3"
	epochAfterSQL = "SELECT " + accountCols + ", epoch_indexed FROM accounts WHERE generation = ?1 AND epoch_indexed <= ?2" +
		" AND epoch_start <= ?2 AND (epoch_indexed, subject, route, region) > (?4, ?5, ?6, ?7)" +
		" ORDER BY generation, epoch_indexed, subject, route, region LIMIT ?3"
)

// The EpochIndexCatchUp queries: the same range of the index without the
// bound on epoch_start (?1 to ?7 as above), each entry's position and
// whether it lags (epoch_indexed < epoch_start).
var (
	catchUpFirstSQL = "SELECT epoch_indexed, subject, route, region, epoch_indexed < epoch_start FROM accounts" +
		" WHERE generation = ?1 AND epoch_indexed <= ?2 ORDER BY generation, epoch_indexed, subject, route, region LIMIT ?3"
	catchUpAfterSQL = "SELECT epoch_indexed, subject, route, region, epoch_indexed < epoch_start FROM accounts" +
		" WHERE generation = ?1 AND epoch_indexed <= ?2 AND (epoch_indexed, subject, route, region) > (?4, ?5, ?6, ?7)" +
		" ORDER BY generation, epoch_indexed, subject, route, region LIMIT ?3"
)

// The queries across generations (EpochFilter.AllGenerations; index
// accounts_by_epoch_across, on (epoch_indexed, subject, route, region,
// generation), schema version 19): as above without ?1 (bound to zero and
// unused), the cursor's generation ?8, each row's generation selected
// besides. A pass of the epoch worker reads a few ranges of it, not one
// per generation.
var (
	acrossFirstSQL = "SELECT " + accountCols + ", epoch_indexed FROM accounts WHERE ?1 = 0 AND epoch_indexed <= ?2" +
		" AND epoch_start <= ?2 ORDER BY epoch_indexed, subject, route, region, generation LIMIT ?3"
	acrossAfterSQL = "SELECT " + accountCols + ", epoch_indexed FROM accounts WHERE ?1 = 0 AND epoch_indexed <= ?2" +
		" AND epoch_start <= ?2 AND (epoch_indexed, subject, route, region, generation) > (?4, ?5, ?6, ?7, ?8)" +
		" ORDER BY epoch_indexed, subject, route, region, generation LIMIT ?3"
	catchUpAcrossFirstSQL = "SELECT epoch_indexed, subject, route, region, epoch_indexed < epoch_start, generation FROM accounts" +
		" WHERE ?1 = 0 AND epoch_indexed <= ?2 ORDER BY epoch_indexed, subject, route, region, generation LIMIT ?3"
	catchUpAcrossAfterSQL = "SELECT epoch_indexed, subject, route, region, epoch_indexed < epoch_start, generation FROM accounts" +
		" WHERE ?1 = 0 AND epoch_indexed <= ?2 AND (epoch_indexed, subject, route, region, generation) > (?4, ?5, ?6, ?7, ?8)" +
		" ORDER BY epoch_indexed, subject, route, region, generation LIMIT ?3"
)

// catchUpMoveSQL returns the UPDATE that moves rows lagging entries to
// their epoch: one statement, a primary-key seek per row of its VALUES
// list (subject, route, region, generation each). A statement per entry
// cost more in the driver than the move in SQLite.
func catchUpMoveSQL(rows int) string {
	return "UPDATE accounts SET epoch_indexed = epoch_start FROM (VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?), ", rows), ", ") + ") AS v" +
		" WHERE accounts.subject = v.column1 AND accounts.route = v.column2 AND accounts.region = v.column3" +
		" AND accounts.generation = v.column4 AND accounts.epoch_indexed < accounts.epoch_start"
}

// dbQuery adapts a query string on the read pool to queryAll.
type dbQuery struct {
	db    *sql.DB
	query string
}

func (q dbQuery) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return q.db.QueryContext(ctx, q.query, args...)
}

// appendScanner scans a row into dest and then into more (the columns
// selected after dest's).
type appendScanner struct {
	sc   scanner
	more []any
}

func (a appendScanner) Scan(dest ...any) error { return a.sc.Scan(append(dest, a.more...)...) }

// indexedAccount is an account as AccountsByEpoch reads it, with the
// position of its index entry.
type indexedAccount struct {
	a       ledger.Account
	indexed int64
}

func scanIndexedAccount(sc scanner) (indexedAccount, error) {
	var r indexedAccount
	a, err := scanAccount(appendScanner{sc, []any{&r.indexed}})
	r.a = a
	return r, err
}

// epochRange converts f's generation, bound (math.MaxInt64 when zero) and
// cursor time for the queries above.
func epochRange(f store.EpochFilter) (generation, bound, after int64, err error) {
	if err := store.CheckEpochFilter(f); err != nil {
		return 0, 0, 0, err
	}
	var c codec.Conv
	generation = c.Int(f.Generation)
	c.Int(f.After.Generation)
	bound = int64(math.MaxInt64)
	if !f.StartedBy.IsZero() {
		bound = c.Nanos(f.StartedBy)
	}
	after = c.Nanos(f.After.EpochStart)
	return generation, bound, after, c.Err()
}

// epochStmts returns the statements of AccountsByEpoch (or, with
// catchUp, EpochIndexCatchUp) for f: per generation or across them, from
// the start or after a cursor; and the cursor's arguments.
func (s *Store) epochStmts(f store.EpochFilter, catchUp bool, after int64) (*sql.Stmt, []any) {
	first := f.After == (store.EpochCursor{})
	var st *sql.Stmt
	switch {
	case !f.AllGenerations && !catchUp:
		st = pick(first, s.r.epochFirst, s.r.epochAfter)
	case !f.AllGenerations:
		st = pick(first, s.r.catchUpFirst, s.r.catchUpAfter)
	case !catchUp:
		st = pick(first, s.r.acrossFirst, s.r.acrossAfter)
	default:
		st = pick(first, s.r.catchUpAcrossFirst, s.r.catchUpAcrossAfter)
	}
	if first {
		return st, nil
	}
	args := []any{after, f.After.Subject, f.After.Route, f.After.Region}
	if f.AllGenerations {
		args = append(args, int64(f.After.Generation))
	}
	return st, args
}

func pick(first bool, ifFirst, ifAfter *sql.Stmt) *sql.Stmt {
	if first {
		return ifFirst
	}
	return ifAfter
}

// epochWhat names f's range in errors.
func epochWhat(f store.EpochFilter, what string) string {
	if f.AllGenerations {
		return what + " of every generation"
	}
	return fmt.Sprintf("%s of generation %d", what, f.Generation)
}

// AccountsByEpoch returns up to f.Limit accounts of generation
// f.Generation with epoch_start <= f.StartedBy (any when it is zero), in
// the order of the index accounts_by_epoch, (epoch_indexed, subject,
// route, region), strictly after f.After unless it is the zero cursor,
// and the position of the last one. It reads the index, the rows of its
// entries in the range, and returns those within the bound: an entry left
// behind its epoch (see putAccounts) costs a row read until
// EpochIndexCatchUp moves it.
func (s *Store) AccountsByEpoch(ctx context.Context, f store.EpochFilter) (_ []ledger.Account, _ store.EpochCursor, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, store.EpochCursor{}, errClosed
	}
	generation, bound, after, err := epochRange(f)
	if err != nil {
		return nil, store.EpochCursor{}, fmt.Errorf("accounts by epoch: %w", err)
	}
	what := epochWhat(f, "accounts") + " by epoch"
	st, cursor := s.epochStmts(f, false, after)
	rows, err := queryAll(ctx, st, scanIndexedAccount, what, append([]any{generation, bound, f.Limit}, cursor...)...)
	if err != nil || len(rows) == 0 {
		return nil, store.EpochCursor{}, err
	}
	out := make([]ledger.Account, len(rows))
	for i := range rows {
		out[i] = rows[i].a
	}
	last := &rows[len(rows)-1]
	next := store.EpochCursorOf(&last.a)
	var c codec.Conv
	next.EpochStart = c.Time(last.indexed)
	return out, next, c.Err()
}

// EpochIndexCatchUp moves the entries of accounts_by_epoch that lag
// their account's epoch among up to f.Limit entries of generation
// f.Generation at positions strictly after f.After whose epoch_indexed is
// at most f.StartedBy (any when it is zero), in index order. It reads the
// entries on the read pool (the index and each entry's row) and takes the
// writer only when one lags, for one transaction that moves them
// (catchUpMoveSQL, as many a statement as the largest of chunkSizes that
// fits). It returns the position of the last entry
// read and whether there may be more (it read f.Limit).
func (s *Store) EpochIndexCatchUp(ctx context.Context, f store.EpochFilter) (_ store.EpochCursor, _ bool, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return store.EpochCursor{}, false, errClosed
	}
	generation, bound, after, err := epochRange(f)
	if err != nil {
		return store.EpochCursor{}, false, fmt.Errorf("epoch index catch-up: %w", err)
	}
	type entry struct {
		indexed int64
		cursor  store.EpochCursor
		lags    bool
	}
	scan := func(sc scanner) (entry, error) {
		var e entry
		if !f.AllGenerations {
			e.cursor.Generation = f.Generation
			return e, sc.Scan(&e.indexed, &e.cursor.Subject, &e.cursor.Route, &e.cursor.Region, &e.lags)
		}
		var g int64
		err := sc.Scan(&e.indexed, &e.cursor.Subject, &e.cursor.Route, &e.cursor.Region, &e.lags, &g)
		e.cursor.Generation = uint64(g)
		return e, err
	}
	what := epochWhat(f, "epoch index")
	st, cursor := s.epochStmts(f, true, after)
	entries, err := queryAll(ctx, st, scan, what, append([]any{generation, bound, f.Limit}, cursor...)...)
	if err != nil || len(entries) == 0 {
		return store.EpochCursor{}, false, err
	}
	var lagging []store.EpochCursor
	for _, e := range entries {
		if e.lags {
			lagging = append(lagging, e.cursor)
		}
	}
	if len(lagging) > 0 {
		err = s.withWriter(ctx, func(w *writer) error {
			return s.inWriteTx(ctx, w, what, func(tx *writeTx) error {
				for rest := lagging; len(rest) > 0; {
					n := chunkSizes[0]
					for _, size := range chunkSizes {
						if size <= len(rest) {
							n = size
							break
						}
					}
					n = min(n, len(rest))
					args := make([]any, 0, 4*n)
					for _, k := range rest[:n] {
						args = append(args, k.Subject, k.Route, k.Region, int64(k.Generation))
					}
					if _, err := tx.exec(catchUpMoveSQL(n), args...); err != nil {
						return err
					}
					rest = rest[n:]
				}
				return nil
			})
		})
		if err != nil {
			return store.EpochCursor{}, false, err
		}
	}
	last := entries[len(entries)-1]
	next := last.cursor
	var c codec.Conv
	next.EpochStart = c.Time(last.indexed)
	return next, len(entries) == f.Limit, c.Err()
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
