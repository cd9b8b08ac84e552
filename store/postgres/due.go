package postgres

import (
	"context"
	"fmt"
	"math"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/jackc/pgx/v5"
)

// epochSQL returns AccountsByEpoch's query: $1 generation, $2 the
// inclusive bound on epoch_start, $3 the limit, and with after the cursor
// ($4 epoch_start, $5 subject, $6 route, $7 region). The inner SELECT
// reads the index accounts_by_epoch for the ids of one page; the outer one
// reads their term rows as AccountGet does. One statement, one snapshot.
func epochSQL(after bool) string {
	cursor := ""
	if after {
		cursor = `
			AND (e.epoch_start, e.subject, e.route, e.region) > ($4::bigint, $5::text, $6::text, $7::text)`
	}
	return accountSelect + ` WHERE a.id IN (
		SELECT e.id FROM accounts e
		WHERE e.generation = $1 AND e.epoch_start <= $2` + cursor + `
		ORDER BY e.generation, e.epoch_start, e.subject, e.route, e.region LIMIT $3)
	ORDER BY a.epoch_start, a.subject, a.route, a.region, t.dim`
}

// acrossSQL returns the query across generations (EpochFilter.
// AllGenerations), on the index accounts_by_epoch_across (schema version
// 19): $1 the bound, $2 the limit, and with after the cursor ($3 epoch
// start, $4 subject, $5 route, $6 region, $7 generation).
func acrossSQL(after bool) string {
	cursor := ""
	if after {
		cursor = `
			AND (e.epoch_start, e.subject, e.route, e.region, e.generation) > ($3::bigint, $4::text, $5::text, $6::text, $7::bigint)`
	}
	return accountSelect + ` WHERE a.id IN (
		SELECT e.id FROM accounts e
		WHERE e.epoch_start <= $1` + cursor + `
		ORDER BY e.epoch_start, e.subject, e.route, e.region, e.generation LIMIT $2)
	ORDER BY a.epoch_start, a.subject, a.route, a.region, a.generation, t.dim`
}

var (
	epochFirstSQL  = epochSQL(false)
	epochAfterSQL  = epochSQL(true)
	acrossFirstSQL = acrossSQL(false)
	acrossAfterSQL = acrossSQL(true)
)

// epochRange converts f's generation, bound (math.MaxInt64 when zero) and
// cursor time for the queries above.
func epochRange(f store.EpochFilter) (generation, bound, after int64, err error) {
	if err := store.CheckEpochFilter(f); err != nil {
		return 0, 0, 0, err
	}
	var conv codecConv
	generation = conv.Int(f.Generation)
	conv.Int(f.After.Generation)
	bound = int64(math.MaxInt64)
	if !f.StartedBy.IsZero() {
		bound = conv.Nanos(f.StartedBy)
	}
	after = conv.Nanos(f.After.EpochStart)
	return generation, bound, after, conv.Err()
}

// AccountsByEpoch returns up to f.Limit accounts of generation
// f.Generation with epoch_start <= f.StartedBy (any when it is zero), in
// (epoch_start, subject, route, region) order, strictly after f.After
// unless it is the zero cursor, and the last one's position; with
// f.AllGenerations those of every generation, in (epoch_start, subject,
// route, region, generation) order (accounts_by_epoch_across). Text
// compares in the database's collation, in the order and in the cursor
// alike, so paging neither skips nor repeats an account.
//
// The index is on epoch_start itself, moved by every roll, unlike
// SQLite's (schema version 14, whose entry of a busy roll lags until the
// epoch worker moves it): here an UPDATE that changes no indexed column
// may skip its index writes (HOT), but a roll also inserts the
// statement's rows, and PostgreSQL was not measured at a million
// accounts, so the lagging column was not carried over.
func (s *Store) AccountsByEpoch(ctx context.Context, f store.EpochFilter) ([]ledger.Account, store.EpochCursor, error) {
	generation, bound, after, err := epochRange(f)
	if err != nil {
		return nil, store.EpochCursor{}, fmt.Errorf("accounts by epoch: %w", err)
	}
	var rows pgx.Rows
	first := f.After == (store.EpochCursor{})
	what := fmt.Sprintf("accounts of generation %d by epoch", f.Generation)
	switch {
	case f.AllGenerations && first:
		rows, err = s.pool.Query(ctx, acrossFirstSQL, bound, f.Limit)
	case f.AllGenerations:
		rows, err = s.pool.Query(ctx, acrossAfterSQL, bound, f.Limit, after, f.After.Subject, f.After.Route, f.After.Region, int64(f.After.Generation))
	case first:
		rows, err = s.pool.Query(ctx, epochFirstSQL, generation, bound, f.Limit)
	default:
		rows, err = s.pool.Query(ctx, epochAfterSQL, generation, bound, f.Limit, after, f.After.Subject, f.After.Route, f.After.Region)
	}
	if f.AllGenerations {
		what = "accounts of every generation by epoch"
	}
	if err != nil {
		return nil, store.EpochCursor{}, s.c.classify(what, err, false)
	}
	accounts, _, err := scanAccounts(rows)
	if err != nil {
		return nil, store.EpochCursor{}, s.c.classify(what, err, false)
	}
	return accounts, store.LastEpochCursor(accounts), nil
}

// EpochIndexCatchUp reads nothing: the index is on epoch_start itself and
// never lags (see AccountsByEpoch).
func (s *Store) EpochIndexCatchUp(ctx context.Context, f store.EpochFilter) (store.EpochCursor, bool, error) {
	if _, _, _, err := epochRange(f); err != nil {
		return store.EpochCursor{}, false, fmt.Errorf("epoch index catch-up: %w", err)
	}
	return store.EpochCursor{}, false, nil
}
