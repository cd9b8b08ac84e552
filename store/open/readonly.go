package open

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

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
	loc, err := parseSpec(spec, dataDir)
	if err != nil {
		return nil, err
	}
	switch loc.kind {
	case kindSQLiteDataDir:
		path := loc.path
		if isDir(path) {
			path = filepath.Join(path, DefaultFile)
		}
		return sqliteReadOnly(ctx, path)
	case kindSQLiteFile:
		return sqliteReadOnly(ctx, loc.path)
	case kindMemory:
		return nil, errors.New("open store: the memory store holds nothing outside the process that made it; nothing to read")
	}
	s, err := postgres.OpenReadOnly(ctx, loc.path)
	if err != nil {
		return nil, fmt.Errorf("open store postgres: %w", err)
	}
	return s, nil
}

func sqliteReadOnly(ctx context.Context, path string) (store.Store, error) {
	s, err := sqlite.OpenReadOnly(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}
