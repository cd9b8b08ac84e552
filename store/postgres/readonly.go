package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// OpenReadOnly connects to the database named by dsn (as Open) for
// reading only, for an audit without a running replica (capledger audit
// --store): it migrates nothing, and every session it opens is
// default_transaction_read_only, so a write fails in the database. The
// schema must be the binary's: an older or a newer one is an error
// saying which and what to do. Replicas may be writing meanwhile: an
// audit's read (AuditSnapshot) is one REPEATABLE READ READ ONLY
// transaction, a consistent snapshot of what was committed when it
// began.
func OpenReadOnly(ctx context.Context, dsn string) (*Store, error) {
	cfg, planPerStatement, err := parseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	// Open's check for a server that accepts writes asks whether the
	// session is read-only, which this one is by design; a read needs
	// no primary.
	cfg.ConnConfig.ValidateConnect = nil
	s := &Store{planPerStatement: planPerStatement}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, s.c.classifyConnect("open read-only: connect", err)
	}
	err = checkSchemaCurrent(ctx, conn)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil {
		return nil, fmt.Errorf("open read-only: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, s.c.classify("open read-only: pool", err, false)
	}
	s.pool = pool
	s.c.onLost = s.resetOnLostServer
	return s, nil
}

// checkSchemaCurrent returns nil when the schema of conn's search_path
// holds exactly this binary's migrations, else an error saying which
// way it differs and what to do.
func checkSchemaCurrent(ctx context.Context, conn *pgx.Conn) error {
	var c counters
	all, err := migrations()
	if err != nil {
		return err
	}
	var schema *string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return c.classify("current schema", err, false)
	}
	if schema == nil || *schema == "" {
		return fmt.Errorf("no schema of the search_path exists: nothing to read")
	}
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass(format('%I.schema_migrations', $1::text)) IS NOT NULL`, *schema).Scan(&exists); err != nil {
		return c.classify("schema_migrations", err, false)
	}
	if !exists {
		return fmt.Errorf("schema %q has no capledger tables (no schema_migrations): check the DSN's database and search_path", *schema)
	}
	done, unknown, err := appliedVersions(ctx, conn, len(all))
	if err != nil {
		return err
	}
	if len(unknown) > 0 {
		return fmt.Errorf("schema %q has migrations %v that this binary (schema version %d) does not know: a newer capledger migrated it; audit it with that version",
			*schema, unknown, len(all))
	}
	for _, m := range all {
		if !done[m.Version] {
			return fmt.Errorf("schema %q lacks migration %d (%s) of this binary, which does not migrate what it audits: audit it with the capledger that wrote it, or run capledger migrate first",
				*schema, m.Version, m.File)
		}
	}
	return nil
}
