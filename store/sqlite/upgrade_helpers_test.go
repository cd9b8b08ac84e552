package sqlite

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// The upgrade tests' shared steps: a file of an earlier schema, rows
// written into it as an earlier binary did, the store opened on it (which
// migrates the rest), and the account keys listed before and after.

// dbAtSchema creates at path a database of the schema an earlier binary
// left: migrations 1 to version applied and recorded, none after. The
// caller writes its rows and closes it; Open then migrates the rest.
func dbAtSchema(t *testing.T, path string, version int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if ms[version-1].Version != version {
		t.Fatalf("migration %d is numbered %d", version, ms[version-1].Version)
	}
	if _, err := db.Exec("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[:version] {
		if _, err := db.Exec(m.SQL); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", m.Version, m.File); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// insertAccountAt writes a into the accounts table of db, a file of an
// earlier schema (before version 23), as the earlier binary did:
// accountCols but held_elsewhere with extraCols (", name, ..." of columns
// it had besides) set to extra.
func insertAccountAt(t *testing.T, db *sql.DB, a *ledger.Account, extraCols string, extra ...any) {
	t.Helper()
	var conv codec.Conv
	args := accountArgs(a, &conv)[:len(strings.Split(accountColsV22, ", "))]
	if _, err := db.Exec(insertSQL("accounts", accountColsV22+extraCols), append(args, extra...)...); err != nil {
		t.Fatal(err)
	}
}

// openUpgraded closes db, the file an earlier binary left at path, and
// opens the store on it, which migrates it to the latest schema; the store
// closes when the test ends.
func openUpgraded(t *testing.T, db *sql.DB, path string) *Store {
	t.Helper()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// checkIndexMigrated fails the test unless s's file holds the index name.
func checkIndexMigrated(t *testing.T, s *Store, name string) {
	t.Helper()
	var indexes int
	if err := s.readDB.QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = ?", name).Scan(&indexes); err != nil || indexes != 1 {
		t.Fatalf("%s after the migration: %d, %v", name, indexes, err)
	}
}

// keysOf returns the keys of accounts, in their order; empty, not nil,
// for none.
func keysOf(accounts []ledger.Account) []ledger.AccountKey {
	out := []ledger.AccountKey{}
	for _, a := range accounts {
		out = append(out, a.Key)
	}
	return out
}

// keysByEpoch returns the keys of the accounts AccountsByEpoch lists
// under f, page by page (f.Limit a page) from f.After, at most 100 pages.
func keysByEpoch(t *testing.T, s *Store, f store.EpochFilter) []ledger.AccountKey {
	t.Helper()
	got := []ledger.AccountKey{}
	for range 100 {
		page, next, err := s.AccountsByEpoch(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keysOf(page)...)
		if len(page) < f.Limit {
			break
		}
		f.After = next
	}
	return got
}
