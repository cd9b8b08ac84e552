package open

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

// OpenReadOnly returns the existing store spec names opened for reading
// only, without migrating it (sqlite.OpenReadOnly, postgres.OpenReadOnly):
// for a spec of "" or "sqlite", dataDir is a data directory (its
// DefaultFile) or a SQLite database file itself, such as a backup; it
// creates nothing. A schema older or newer than the binary's is an error
// saying so; "memory" is refused (there is nothing to read).
func OpenReadOnly(ctx context.Context, spec, dataDir string) (store.Store, error) {
	scheme, rest, hasScheme := strings.Cut(spec, ":")
	switch {
	case spec == "" || spec == "sqlite":
		if dataDir == "" {
			return nil, errors.New("open store: no data directory or database file to read")
		}
		path := dataDir
		if isDir(dataDir) {
			path = filepath.Join(dataDir, DefaultFile)
		}
		return sqliteReadOnly(ctx, path)
	case hasScheme && scheme == "sqlite":
		path, err := sqliteURLPath(spec, rest)
		if err != nil {
			return nil, err
		}
		return sqliteReadOnly(ctx, path)
	case hasScheme && (scheme == "postgres" || scheme == "postgresql"):
		s, err := postgres.OpenReadOnly(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("open store postgres: %w", err)
		}
		return s, nil
	case spec == "memory":
		return nil, errors.New("open store: the memory store holds nothing outside the process that made it; nothing to read")
	}
	return nil, fmt.Errorf("open store: unknown store %q; accepted forms: %s", spec, Forms)
}

func sqliteReadOnly(ctx context.Context, path string) (store.Store, error) {
	s, err := sqlite.OpenReadOnly(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}
