package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/capledger/capledger/store/migration"
	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrations returns the embedded migrations in version order.
func migrations() ([]migration.Migration, error) { return migration.Read(migrationFiles, "migrations") }

// SchemaVersion is the schema version this binary writes and reads: the
// newest embedded migration.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// Migrate brings the schema named by dsn (its search_path's first schema,
// normally public) to SchemaVersion and returns the versions it applied
// (none when the schema was current). It is what `capledger migrate` runs,
// and Open runs it too, so a replica never starts on an old schema.
//
// All pending migrations apply in one transaction under a transaction-level
// advisory lock keyed by the schema name: replicas starting at once queue
// on the lock, the first applies, the others then find nothing to do. A
// failing migration rolls back whole and leaves the schema as it was.
//
// Returns an error wrapping store.ErrUnavailable when the server cannot be
// reached, and an error naming the versions when the database holds a
// migration this binary does not know (a newer binary migrated it: run
// that binary, or roll forward), and one wrapping ErrPreparedStatementsLost
// on a connection path that loses them (CheckPath, as Open). The errors say which step failed, not
// that it was a migration: the caller names that (capledger migrate names
// the command; Open says "open: migrate").
func Migrate(ctx context.Context, dsn string) ([]int, error) {
	cfg, planPerStatement, err := parseConfig(dsn)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, (&counters{}).classifyConnect("connect", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// Then the path, as Open checks it: behind a pooler that loses
	// prepared statements a migration fails with the symptom (42P05,
	// 26000) rather than the cause, and serve would refuse the path anyway.
	path := &Store{planPerStatement: planPerStatement, connConfig: cfg.ConnConfig.Copy(), relied: reliedSettings(cfg.ConnConfig)}
	if _, err := path.CheckPath(ctx); err != nil {
		return nil, err
	}
	return migrate(ctx, conn)
}

func migrate(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	var c counters
	all, err := migrations()
	if err != nil {
		return nil, err
	}
	// READ COMMITTED whatever the database's default: a migration waits
	// for its table locks behind writers, and each of its statements must
	// see what they committed meanwhile (migration 12 fills accounts.in_debt
	// from the term rows; under a snapshot taken before the wait it missed
	// a debt committed during it).
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, c.classify("begin", err, false)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// current_schema() is NULL when no schema of the search_path exists.
	var current *string
	if err := tx.QueryRow(ctx, `SELECT current_schema()`).Scan(&current); err != nil {
		return nil, c.classify("current schema", err, false)
	}
	if current == nil || *current == "" {
		var searchPath string
		_ = tx.QueryRow(ctx, `SHOW search_path`).Scan(&searchPath)
		return nil, fmt.Errorf("no schema of the search_path (%s) exists to migrate; create it first (CREATE SCHEMA ...)", searchPath)
	}
	schema := *current
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('capledger.migrate.' || $1::text, 0))`, schema); err != nil {
		return nil, c.classify("lock", err, false)
	}
	// Only create the bookkeeping table when it is missing: a replica
	// running as a role without CREATE on the schema (migrations applied
	// by `capledger migrate` as the owner) must still open a current schema.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass(format('%I.schema_migrations', $1::text)) IS NOT NULL`, schema).Scan(&exists); err != nil {
		return nil, c.classify("schema_migrations", err, false)
	}
	if !exists {
		if _, err := tx.Exec(ctx, `CREATE TABLE schema_migrations (
			version    integer PRIMARY KEY,
			name       text    NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return nil, c.classify("schema_migrations", err, false)
		}
	}
	done, unknown, err := appliedVersions(ctx, tx, len(all))
	if err != nil {
		return nil, err
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("schema %q has migrations %v that this binary (schema version %d) does not know: a newer capledger migrated it; run that version", schema, unknown, len(all))
	}
	var ran []int
	for _, m := range all {
		if done[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, c.classify("apply "+m.File, err, false)
		}
		if step := migrationSteps[m.Version]; step != nil {
			if err := step(ctx, tx); err != nil {
				return nil, c.classify("apply "+m.File, err, false)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return nil, c.classify("record version", err, false)
		}
		ran = append(ran, m.Version)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, c.classify("commit", err, true)
	}
	return ran, nil
}

// appliedVersions reads the schema's schema_migrations: the versions
// applied, and those of them a binary knowing known migrations does not
// know (a newer binary applied them). Migrate and the read-only open
// judge the two their own ways.
func appliedVersions(ctx context.Context, q querier, known int) (done map[int]bool, unknown []int, err error) {
	var c counters
	rows, err := q.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, nil, c.classify("applied versions", err, false)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, nil, c.classify("applied versions", err, false)
	}
	done = map[int]bool{}
	for _, v := range applied {
		done[int(v)] = true
		if int(v) > known {
			unknown = append(unknown, int(v))
		}
	}
	return done, unknown, nil
}
