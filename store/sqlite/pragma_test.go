package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

// A pragma that takes effect only before the file's first page is written
// cannot go in a DSN: the driver runs a DSN's pragmas sorted by name, not
// in the order given, so page_size runs after journal_mode(WAL) and
// changes nothing, without an error (the premise is checked on the driver
// below). dsn refuses them; setup sets auto_vacuum itself.
func TestFileFormatPragmasStayOutOfDSNs(t *testing.T) {
	for _, p := range []string{"page_size(8192)", "auto_vacuum(2)", " PAGE_SIZE = 8192", "encoding('UTF-16')"} {
		if _, err := dsn("x.db", p); err == nil {
			t.Errorf("dsn with pragma %q: no error", p)
		}
	}
	if _, err := dsn("x.db", "busy_timeout(5000)", "journal_mode(WAL)", "cache_size(-2000)"); err != nil {
		t.Errorf("dsn with connection pragmas: %v", err)
	}

	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "sorted.db")+"?_pragma=page_size(8192)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (x)"); err != nil {
		t.Fatal(err)
	}
	var size int
	if err := db.QueryRowContext(ctx, "PRAGMA page_size").Scan(&size); err != nil {
		t.Fatal(err)
	}
	if size == 8192 {
		t.Errorf("page_size(8192) in a DSN took effect: the driver now keeps the DSN's order, and fileFormatPragmas may be allowed again")
	}
}
