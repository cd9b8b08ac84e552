package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Planning in write transactions.
//
// pgx prepares each statement once per connection, and PostgreSQL, under
// plan_cache_mode auto, keeps a generic plan of a prepared statement after
// five runs for as long as the connection lives (until ANALYZE changes the
// table's statistics). For a statement that reads one row by its key
// (the getters of tx.go and rows.go) or writes the rows of arrays (the
// INSERTs and upserts of write.go, which read nothing but unique keys),
// the generic plan is the plan at every table size: an index lookup or
// none. Planning those at each run, as the session default
// force_custom_plan does, costs PostgreSQL CPU for nothing (hot single
// reserves: median 0.90x of it without, planning 13-18 µs against 39-55;
// docs/PERFORMANCE.md).
//
// The statements that look rows up by arrays of keys are different: their
// best plan depends on the number of keys and on the tables' sizes, and a
// generic plan made while a table was young reads the whole table on every
// batch once it has grown (the batch prefetches of 0.1-4 s in
// docs/PERFORMANCE.md, never re-planned with autovacuum off). Those are
// planned at each run: queued between sqlPlanEachRun and sqlPlanCached.
//
// So a write transaction begins with plan_cache_mode force_generic_plan
// (beginWrite, in BEGIN's own round trip), turns planning at each run on
// and off again around each batch lookup (both SETs travel in the lookup's
// round trip), and everything outside write transactions (workers' scans,
// audits, the console) keeps the session default, force_custom_plan.
// Generic rather than auto: under auto PostgreSQL went on planning the
// term upsert at every run (its generic estimate of unnest, 100 rows,
// costs more than the custom one of the array's length), for the same
// plan. When the DSN sets
// plan_cache_mode, or a query exec mode other than cache_statement (whose
// unnamed statements are planned at each run anyway), the store leaves
// planning to that setting everywhere and sends none of these SETs.
const (
	sqlPlanEachRun = `SET LOCAL plan_cache_mode = force_custom_plan`
	sqlPlanCached  = `SET LOCAL plan_cache_mode = force_generic_plan`
	beginWrite     = `BEGIN ISOLATION LEVEL READ COMMITTED; ` + sqlPlanCached
)

// plansPerStatement reports whether the store chooses plan_cache_mode per
// statement in write transactions on connections configured by cfg: when
// the DSN left plan_cache_mode to the store (dsnPlanMode false) and pgx
// prepares named statements.
func plansPerStatement(cfg *pgxpool.Config, dsnPlanMode bool) bool {
	return !dsnPlanMode && cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
}

// lookupBatch is a batch of lookups by arrays of keys, planned at each run
// when the store plans per statement.
type lookupBatch struct {
	pgx.Batch
	wrapped bool
}

func (t *tx) lookupBatch() *lookupBatch {
	b := &lookupBatch{wrapped: t.s.planPerStatement}
	if b.wrapped {
		b.Queue(sqlPlanEachRun)
	}
	return b
}

// send sends the batch in one round trip and returns its results at the
// first lookup queued, or the error of the SET before it (the results are
// then closed). Closing the results reads the SET after the lookups.
func (b *lookupBatch) send(ctx context.Context, tx pgx.Tx) (pgx.BatchResults, error) {
	if b.wrapped {
		b.Queue(sqlPlanCached)
	}
	br := tx.SendBatch(ctx, &b.Batch)
	if b.wrapped {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	return br, nil
}

// queryLookup runs one lookup by arrays of keys (see lookupBatch) and
// calls each for its rows; it returns the first error of the round trip,
// the rows or each.
func (t *tx) queryLookup(ctx context.Context, each func(pgx.Rows) error, sql string, args ...any) error {
	b := t.lookupBatch()
	b.Queue(sql, args...)
	br, err := b.send(ctx, t.tx)
	if err != nil {
		return err
	}
	rows, err := br.Query()
	if err == nil {
		err = each(rows)
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return err
}

// queueLookup queues on w a statement that looks rows up by arrays of
// keys, planned at each run when the store plans per statement.
func (w *batchWriter) queueLookup(op, sql string, args ...any) {
	if w.planEachRun {
		w.queue("plan at each run", sqlPlanEachRun)
	}
	w.queue(op, sql, args...)
	if w.planEachRun {
		w.queue("plan cached", sqlPlanCached)
	}
}
