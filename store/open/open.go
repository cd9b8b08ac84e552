// Package open turns an operator's --store spec into a store.Store, so the
// binary, the simulator and tests name stores the same way.
package open

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

// DefaultFile is the SQLite file's name inside the data directory.
const DefaultFile = "capledger.db"

// Forms lists the accepted specs, for errors and --help.
const Forms = `"" or "sqlite" (` + DefaultFile + ` in the data directory), "sqlite:///abs/path.db", ` +
	`"sqlite:relative/path.db", "memory" (not durable), "postgres://..." or "postgresql://..."`

// Open returns the store named by spec:
//   - "" or "sqlite": the SQLite file DefaultFile in dataDir, which is
//     created (mode 0700) if missing;
//   - "sqlite:///abs/path.db": that SQLite file; "sqlite:relative.db": that
//     file relative to the working directory (its directory must exist);
//   - "memory": an empty in-memory store (nothing survives the process);
//   - "postgres://..." or "postgresql://...": the PostgreSQL store at that
//     URL.
//
// It returns an error naming the accepted forms for any other spec, an
// error for "" or "sqlite" without a dataDir, and the store's own error
// when it cannot be opened (see sqlite.Open and postgres.Open).
func Open(ctx context.Context, spec, dataDir string) (store.Store, error) {
	return OpenWith(ctx, spec, dataDir, Options{})
}

// Options tune the store Open makes; zero values pick the drivers'
// defaults.
type Options struct {
	// CacheRows bounds the SQLite row cache, rows per cached table
	// (sqlite.WithCacheRows; default sqlite.DefaultCacheRows). The other
	// stores, which have no row cache, refuse it.
	CacheRows int
	// PipelinedSync opens SQLite for pipelined durability
	// (sqlite.WithPipelinedSync). The other stores refuse it: PostgreSQL's
	// COMMIT waits for its own WAL flush (the server group-commits
	// concurrent transactions itself), and the memory store is not
	// durable.
	PipelinedSync bool
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, spec, dataDir string, opts Options) (store.Store, error) {
	loc, err := parseSpec(spec, dataDir)
	if err != nil {
		return nil, err
	}
	switch loc.kind {
	case kindSQLiteDataDir:
		if err := os.MkdirAll(loc.path, 0o700); err != nil {
			return nil, fmt.Errorf("open store: data directory: %w", err)
		}
		return openSQLite(ctx, filepath.Join(loc.path, DefaultFile), opts)

	case kindMemory:
		if opts.CacheRows != 0 {
			return nil, errors.New("open store: a row cache is for SQLite; the memory store holds every row in memory")
		}
		if opts.PipelinedSync {
			return nil, errors.New("open store: pipelined sync needs a durable store; the memory store has no fsync to pipeline")
		}
		return memstore.New(), nil

	case kindSQLiteFile:
		return openSQLite(ctx, loc.path, opts)
	}
	// PostgreSQL: the store for several `capledger serve` replicas.
	if opts.CacheRows != 0 {
		return nil, errors.New("open store: a row cache is for SQLite; the PostgreSQL store has none (its server caches pages: shared_buffers)")
	}
	if opts.PipelinedSync {
		return nil, errors.New("open store: pipelined sync is for SQLite; a PostgreSQL COMMIT waits for its own WAL flush (keep synchronous_commit on)")
	}
	s, err := postgres.Open(ctx, loc.path)
	if err != nil {
		return nil, fmt.Errorf("open store postgres: %w", err)
	}
	return s, nil
}

// kind is the sort of store a spec names.
type kind int

const (
	kindSQLiteDataDir kind = iota // "" or "sqlite": DefaultFile in the data directory
	kindSQLiteFile                // "sqlite:PATH"
	kindMemory                    // "memory"
	kindPostgres                  // "postgres://..." or "postgresql://..."
)

// location is a parsed spec: its kind and its path (the data directory,
// the SQLite file, or the PostgreSQL URL; empty for memory).
type location struct {
	kind kind
	path string
}

// parseSpec is the one reading of a --store spec and a data directory,
// for OpenWith, OpenReadOnly and SQLitePath alike. It returns an error
// naming the accepted forms for an unknown spec, and one for "" or
// "sqlite" without a dataDir.
func parseSpec(spec, dataDir string) (location, error) {
	scheme, rest, hasScheme := strings.Cut(spec, ":")
	switch {
	case spec == "" || spec == "sqlite":
		if dataDir == "" {
			return location{}, errors.New("open store: no data directory for the default SQLite store (give one, or a sqlite:PATH store)")
		}
		return location{kindSQLiteDataDir, dataDir}, nil
	case spec == "memory":
		return location{kind: kindMemory}, nil
	case hasScheme && scheme == "sqlite":
		path, err := sqliteURLPath(spec, rest)
		if err != nil {
			return location{}, err
		}
		return location{kindSQLiteFile, path}, nil
	case hasScheme && (scheme == "postgres" || scheme == "postgresql"):
		if !strings.HasPrefix(rest, "//") {
			// Not echoed: what follows the scheme may hold a password.
			return location{}, fmt.Errorf("open store: a %s store is a URL with // after %s: (%s://USER@HOST:PORT/DATABASE)", scheme, scheme, scheme)
		}
		return location{kindPostgres, spec}, nil
	}
	return location{}, fmt.Errorf("open store: unknown store %q; accepted forms: %s", spec, Forms)
}

// sqliteURLPath returns the file a "sqlite:REST" spec names.
func sqliteURLPath(spec, rest string) (string, error) {
	path := rest
	if strings.HasPrefix(rest, "//") {
		// URL form: sqlite:///abs/path has an empty host.
		host, p, _ := strings.Cut(strings.TrimPrefix(rest, "//"), "/")
		if host != "" {
			return "", fmt.Errorf("open store %q: a sqlite URL has no host; write sqlite:///%s/%s for an absolute path", spec, host, p)
		}
		path = "/" + p
	}
	if path == "" || path == "/" {
		return "", fmt.Errorf("open store %q: no file path; accepted forms: %s", spec, Forms)
	}
	return path, nil
}

// ErrStoreLocked is LockSQLite's error when another process owns the file.
var ErrStoreLocked = errors.New("is locked")

// LockSQLite takes the lock that makes one serve process the owner of the
// SQLite file spec names (in dataDir for "" and "sqlite"): an exclusive
// lock on the file PATH.lock beside it, held until unlock is called or the
// process ends. Another process holding it is an error naming the file,
// so a second serve on one data directory refuses to start instead of
// running the workers beside the first. For other stores it does
// nothing; a malformed spec is left to OpenWith to report.
func LockSQLite(spec, dataDir string) (unlock func(), err error) {
	path, ok := SQLitePath(spec, dataDir)
	if !ok {
		return func() {}, nil
	}
	if spec == "" || spec == "sqlite" {
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return nil, fmt.Errorf("open store: data directory: %w", err)
		}
	} else if dir := filepath.Dir(path); !isDir(dir) {
		// Only --data-dir is created: a directory named in the path may
		// be a typo. Said here, or the error names the lock file, which
		// the operator never wrote.
		return nil, fmt.Errorf("open store %q: directory %s does not exist: create it first (only --data-dir is created)", spec, dir)
	}
	return lockFile(path + ".lock")
}

func isDir(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.IsDir()
}

// SQLitePath returns the database file a SQLite spec names (in dataDir for
// "" and "sqlite"), and false for another store or a spec OpenWith refuses.
func SQLitePath(spec, dataDir string) (string, bool) {
	loc, err := parseSpec(spec, dataDir)
	switch {
	case err != nil:
		return "", false
	case loc.kind == kindSQLiteDataDir:
		return filepath.Join(loc.path, DefaultFile), true
	case loc.kind == kindSQLiteFile && sqlite.CheckPath(loc.path) == nil:
		return loc.path, true
	}
	return "", false
}

func openSQLite(ctx context.Context, path string, opts Options) (store.Store, error) {
	var sqliteOpts []sqlite.Option
	if opts.CacheRows != 0 {
		sqliteOpts = append(sqliteOpts, sqlite.WithCacheRows(opts.CacheRows))
	}
	if opts.PipelinedSync {
		sqliteOpts = append(sqliteOpts, sqlite.WithPipelinedSync())
	}
	s, err := sqlite.Open(ctx, path, sqliteOpts...)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}
