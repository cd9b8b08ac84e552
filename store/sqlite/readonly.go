package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
)

// ErrSchemaTooOld is returned by OpenReadOnly for a database this binary
// would migrate before using it: a read-only store does not migrate.
var ErrSchemaTooOld = errors.New("database schema is older than this binary")

// ErrNotADatabase is returned by OpenReadOnly for a file that is not a
// SQLite database (a text file, a tarball): bad input, not a store that
// is unavailable.
var ErrNotADatabase = errors.New("not a SQLite database")

// sqliteHeader opens every SQLite database file (the file format's first
// 16 bytes).
const sqliteHeader = "SQLite format 3\x00"

// errReadOnly answers every write to a store opened with OpenReadOnly.
var errReadOnly = errors.New("sqlite store opened read-only")

// OpenReadOnly opens the existing database file at path for reading
// only, for an audit without a server (capledger audit --data-dir): it
// creates nothing, migrates nothing and writes nothing to the file
// (SQLite's mode=ro), so a backup can be audited before it is restored
// and a data directory whose server will not start can be audited as it
// is. Its schema must be the binary's: an older one is an error wrapping
// ErrSchemaTooOld, a newer one ErrSchemaTooNew; a file that does not
// begin with SQLite's header is an error wrapping ErrNotADatabase, naming
// the file. A database beside which an interrupted restore left its
// copy is refused (ErrRestoreInterrupted). Begin fails.
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
	if err := checkNoRestore(path); err != nil {
		return nil, err
	}
	db, err := openReadOnlyDB(path, DefaultReadConns)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s read-only: %w", path, err)
	}
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

// openReadOnlyDB opens the existing SQLite database file at path with
// SQLite's mode=ro and query_only, conns connections at most. A path the
// store refuses, a directory, a missing file and a file that is not a
// SQLite database (ErrNotADatabase) are errors.
func openReadOnlyDB(path string, conns int) (*sql.DB, error) {
	if err := CheckPath(path); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, errors.New("a directory, not a database file")
	}
	if err := checkHeader(path, fi); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// checkHeader returns an error wrapping ErrNotADatabase when the
// regular file at path (fi) does not begin with SQLite's header. An empty
// file passes (SQLite reads it as an empty database; the schema check
// then says it holds no capledger tables), and so does a file it cannot
// read or that is not a regular file (opening a FIFO would wait): SQLite's
// own open reports those as it always did.
func checkHeader(path string, fi os.FileInfo) error {
	if fi.Size() == 0 || !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, len(sqliteHeader))
	n, err := io.ReadFull(f, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	if string(head[:n]) != sqliteHeader {
		return fmt.Errorf("the file is %w (its first bytes are not SQLite's header): give a data directory or a SQLite database file", ErrNotADatabase)
	}
	return nil
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
