// Package migration reads the numbered schema migrations that the SQL
// drivers embed (migrations/NNNN_name.sql). Applying them is each driver's
// own business (its transaction, its locking, its bookkeeping table); the
// naming rule and its checks are shared so that both drivers refuse the
// same build mistakes.
package migration

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Migration is one embedded schema change.
type Migration struct {
	// Version is NNNN: versions run 1, 2, 3... without gaps.
	Version int
	// File is the file's name ("0003_journal_batches.sql"); Name is the
	// part between the version and ".sql" ("journal_batches").
	File, Name string
	SQL        string
}

// Read returns the migrations in dir of fsys in version order. A file
// not named NNNN_name.sql, a duplicate version or a gap is an error: a
// build mistake that must not reach a database.
func Read(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		file := e.Name()
		prefix, name, ok := strings.Cut(strings.TrimSuffix(file, ".sql"), "_")
		version, err := strconv.Atoi(prefix)
		if !ok || err != nil || version <= 0 || name == "" || !strings.HasSuffix(file, ".sql") {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", file)
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, file))
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", file, err)
		}
		out = append(out, Migration{Version: version, File: file, Name: name, SQL: string(body)})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3...: expected version %d", m.File, i+1)
		}
	}
	return out, nil
}
