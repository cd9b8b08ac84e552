package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

func init() {
	register(&command{name: "migrate", summary: "bring the store's schema up to this binary's version", help: migrateHelp, run: runMigrate})
}

const migrateHelp = `Usage: capledger migrate [--store SPEC] [--data-dir DIR] [--auto-vacuum]

Migrate applies the schema migrations embedded in this binary to the store
and reports the schema version. serve migrates on start too; run migrate
ahead of a rolling upgrade of PostgreSQL replicas, so that the replicas
start on a current schema and the migration runs exactly once (replicas
migrating at once queue on an advisory lock). Migrations apply in one
transaction: a failure leaves the schema as it was. A schema newer than the
binary is refused: run the newer binary. A SQLite database that is not
there is created, and migrate says so (check --data-dir if you expected one).

Flags:
  --store SPEC        "sqlite" (default, in --data-dir), "sqlite:PATH", or a
                      postgres://user@host:5432/db URL
  --data-dir DIR      data directory of the embedded store (default ./capledger-data)
  --auto-vacuum       SQLite: convert a file created before capledger set
                      auto_vacuum=INCREMENTAL, so that the space retention
                      frees goes back to the filesystem. Rewrites the file
                      once (VACUUM): stop serve first, and have free disk
                      space of about the file's size. Files created by this
                      version are INCREMENTAL already. Refused with the
                      PostgreSQL and memory stores, which have no such file.

Example:
  capledger migrate --store postgres://capledger@db:5432/capledger

Exit codes: 0 migrated (or already current); 1 bad flags, or a store that
refuses the migration (a schema newer than this binary, a migration that
failed, refused credentials, a startup parameter PgBouncer refuses); 5 a store that cannot be reached (PostgreSQL
down or refusing connections: retry later), as for every command.
`

func runMigrate(ctx context.Context, e *env, args []string) error {
	fs := newFlags("migrate")
	storeSpec := fs.String("store", "", "")
	dataDir := fs.String("data-dir", defaultDataDir, "")
	autoVacuum := fs.Bool("auto-vacuum", false, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	pg := strings.HasPrefix(*storeSpec, "postgres://") || strings.HasPrefix(*storeSpec, "postgresql://")
	if *autoVacuum && (pg || *storeSpec == "memory") {
		// Refused before anything is migrated: an operator who asked for
		// space back must not read a clean exit as having got it.
		if pg {
			return usagef("--auto-vacuum converts a SQLite file; PostgreSQL has none to convert (its autovacuum reclaims removed rows for reuse, docs/OPERATIONS.md \"Retention and compaction\")")
		}
		return usagef("--auto-vacuum converts a SQLite file; the in-memory store has none")
	}
	if pg {
		applied, err := postgres.Migrate(ctx, *storeSpec)
		if err != nil {
			return storeError(err)
		}
		if len(applied) == 0 {
			fmt.Fprintf(e.stdout, "postgres schema already at version %d\n", postgres.SchemaVersion())
		} else {
			fmt.Fprintf(e.stdout, "postgres schema migrated to version %d (applied %v)\n", postgres.SchemaVersion(), applied)
		}
		return nil
	}
	if *storeSpec == "memory" {
		fmt.Fprintln(e.stdout, "the in-memory store has no schema to migrate")
		return nil
	}
	// The SQLite store migrates when it opens; opening is migrating. Not
	// under a running serve: the file is its (and --auto-vacuum rewrites
	// it).
	// A database that was not there is made anew: say so, so that a
	// mistyped --data-dir does not read as the migration of the real one.
	_, created := newSQLiteFile(*storeSpec, *dataDir)
	unlock, err := open.LockSQLite(*storeSpec, *dataDir)
	if err != nil {
		return lockError(err, ": stop serve first")
	}
	defer unlock()
	st, err := open.Open(ctx, *storeSpec, *dataDir)
	if err != nil {
		return storeError(err)
	}
	if err := st.Close(); err != nil {
		return usagef("close: %v", err)
	}
	if sq, ok := st.(*sqlite.Store); ok && *autoVacuum {
		converted, err := sqlite.Open(ctx, sq.Path(), sqlite.WithAutoVacuumConversion())
		if err != nil {
			return usagef("auto_vacuum: %v", err)
		}
		mode, err := converted.AutoVacuum(ctx)
		converted.Close()
		if err != nil {
			return usagef("auto_vacuum: %v", err)
		}
		fmt.Fprintf(e.stdout, "%s auto_vacuum mode %d (2 = incremental)\n", sq.Path(), mode)
	}
	if created {
		fmt.Fprintf(e.stdout, "%s: no database was there: created a new one; schema at version %d\n", storeName(*storeSpec, *dataDir), sqlite.SchemaVersion())
		return nil
	}
	fmt.Fprintf(e.stdout, "%s schema at version %d\n", storeName(*storeSpec, *dataDir), sqlite.SchemaVersion())
	return nil
}

// lockError is the exit for a SQLite store whose lock could not be taken
// (migrate, serve): another process owning it is the store's refusal, 1
// without the pointer to --help (the flags are not the problem; hint says
// what to do); anything else is the path the flags named, a usage error.
func lockError(err error, hint string) error {
	if errors.Is(err, open.ErrStoreLocked) {
		return exitError{code: exitUsage, err: fmt.Errorf("%w%s", err, hint)}
	}
	return usagef("%v", err)
}

// storeError is the exit for a store that could not be opened, checked or
// migrated (migrate, serve): 5 (exitUnavailable) when it could not be
// reached (store.ErrUnavailable), the general rule a deploy script or a
// supervisor retries on; otherwise 1, for a store that refuses (a schema
// newer than this binary, a failed migration, refused credentials, a
// startup parameter PgBouncer refuses) and for a damaged file
// (store.ErrDamaged: a malformed page), which no retry repairs.
func storeError(err error) error {
	if errors.Is(err, store.ErrDamaged) {
		return exitError{code: exitUsage, err: err} // no retry repairs the file
	}
	if errors.Is(err, store.ErrUnavailable) {
		return exitError{code: exitUnavailable, err: err}
	}
	return exitError{code: exitUsage, err: err}
}

// newSQLiteFile returns the database file of a SQLite store (spec and
// dataDir as serve and migrate take them) and whether it is not there
// yet, so that opening the store creates it empty. A mistyped --data-dir,
// or serve started from another directory, then reads as an empty ledger
// rather than the real one: migrate and serve say so.
func newSQLiteFile(spec, dataDir string) (string, bool) {
	path, ok := open.SQLitePath(spec, dataDir)
	if !ok {
		return "", false
	}
	_, err := os.Stat(path)
	return path, errors.Is(err, os.ErrNotExist)
}
