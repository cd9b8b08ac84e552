package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
)

// ErrSchemaTooOld is returned by OpenReadOnly for a database this binary
// would migrate before using it: a read-only store does not migrate.
var ErrSchemaTooOld = errors.New("database schema is older than this binary")

// errReadOnly answers every write to a store opened with OpenReadOnly.
var errReadOnly = errors.New("sqlite store opened read-only")

// OpenReadOnly opens the existing database file at path for reading
// only, for an audit without a server (capledger audit --data-dir): it
// creates nothing, migrates nothing and writes nothing to the file
// (SQLite's mode=ro), so a backup can be audited before it is restored
// and a data directory whose server will not start can be audited as it
// is. Its schema must be the binary's: an older one is an error wrapping
// ErrSchemaTooOld, a newer one ErrSchemaTooNew. Begin fails.
//
// A server may be writing the file meanwhile: SQLite's WAL lets a reader
// beside the writer, and each read transaction (an audit's is one) sees
// the last commit before it began, a consistent snapshot. A read-only
// store's audit reads that transaction itself rather than a copy
// (copyForAudit would need space beside a file that may sit on a
// read-only backup volume), so a live server's WAL cannot be restarted
// past it until the audit ends.
func OpenReadOnly(ctx context.Context, path string) (*Store, error) {
	if err := CheckPath(path); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("open sqlite %s read-only: a directory, not a database file", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, err)
	}
	// A file: URI, so that SQLite itself reads mode=ro (the driver passes
	// a plain path's parameters to no one but itself).
	q := url.Values{}
	q.Set("mode", "ro")
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", DefaultBusyTimeout.Milliseconds()))
	q.Add("_pragma", "query_only(1)")
	uri := (&url.URL{Scheme: "file", Path: abs}).String() + "?" + q.Encode()
	db, err := sql.Open("sqlite", uri)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, err)
	}
	db.SetMaxOpenConns(DefaultReadConns)
	db.SetMaxIdleConns(DefaultReadConns)
	if err := checkSchemaCurrent(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, err)
	}
	s := &Store{path: path, readDB: db, readOnly: true, writer: make(chan struct{}, 1), cache: newRowCache(1)}
	if err := s.r.prepare(ctx, db); err != nil {
		s.Close()
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, translate(ctx, err))
	}
	return s, nil
}

// checkSchemaCurrent returns nil when db's schema is the binary's, else
// an error saying which way it differs and what to do.
func checkSchemaCurrent(ctx context.Context, db *sql.DB) error {
	var current int
	err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&current)
	if err != nil {
		return fmt.Errorf("read the schema version (is it a capledger database?): %w", translate(ctx, err))
	}
	switch known := SchemaVersion(); {
	case current > known:
		return fmt.Errorf("%w: the file is at schema version %d, this binary knows up to %d; audit it with the capledger that wrote it (or a newer one)",
			ErrSchemaTooNew, current, known)
	case current < known:
		return fmt.Errorf("%w: the file is at schema version %d, this binary's is %d and it does not migrate what it audits; audit it with the capledger that wrote it, or migrate a copy first (capledger migrate --store sqlite:COPY)",
			ErrSchemaTooOld, current, known)
	}
	return nil
}
