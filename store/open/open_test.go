package open_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

func writeAndRead(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	r := ledger.Reservation{ID: "rl-1", RequestDigest: "sha256:1", State: ledger.StateReserved,
		Account:   ledger.AccountKey{Subject: "tenant7", Route: "chat", Region: "eu", Generation: 1},
		CreatedAt: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{r}, NewReservations: map[string]bool{r.ID: true}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.ReservationGet(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != r.ID || got.State != r.State || got.Account != r.Account || !got.CreatedAt.Equal(r.CreatedAt) {
		t.Fatalf("read back %+v, wrote %+v", got, r)
	}
}

func mustOpen(t *testing.T, spec, dataDir string) store.Store {
	t.Helper()
	s, err := open.Open(context.Background(), spec, dataDir)
	if err != nil {
		t.Fatalf("open %q: %v", spec, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestDefaultIsSQLiteInDataDir(t *testing.T) {
	for _, spec := range []string{"", "sqlite"} {
		dataDir := filepath.Join(t.TempDir(), "var", "capledger")
		s := mustOpen(t, spec, dataDir)
		sq, ok := s.(*sqlite.Store)
		if !ok {
			t.Fatalf("%q opened a %T", spec, s)
		}
		if want := filepath.Join(dataDir, open.DefaultFile); sq.Path() != want {
			t.Fatalf("%q opened %s, want %s", spec, sq.Path(), want)
		}
		info, err := os.Stat(dataDir)
		if err != nil {
			t.Fatal(err)
		}
		if perm := info.Mode().Perm(); perm != 0o700 {
			t.Errorf("data directory mode %o, want 700", perm)
		}
		writeAndRead(t, s)
	}
	if _, err := open.Open(context.Background(), "", ""); err == nil || !strings.Contains(err.Error(), "data directory") {
		t.Fatalf("default store without a data directory: %v", err)
	}
}

func TestSQLitePaths(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "abs.db")
	s := mustOpen(t, "sqlite://"+abs, "/nonexistent-data-dir")
	if got := s.(*sqlite.Store).Path(); got != abs {
		t.Fatalf("sqlite://%s opened %s", abs, got)
	}
	writeAndRead(t, s)

	t.Chdir(dir)
	rel := mustOpen(t, "sqlite:rel.db", "")
	writeAndRead(t, rel)
	if _, err := os.Stat(filepath.Join(dir, "rel.db")); err != nil {
		t.Fatalf("sqlite:rel.db is not in the working directory: %v", err)
	}
}

func TestMemory(t *testing.T) {
	s := mustOpen(t, "memory", "")
	if _, ok := s.(*memstore.Store); !ok {
		t.Fatalf("memory opened a %T", s)
	}
	writeAndRead(t, s)
}

func TestRejectsUnknownSpecs(t *testing.T) {
	for _, spec := range []string{"mysql://db/x", "sqlite3:x.db", "sqlite:", "sqlite://", "sqlite://host/x.db", "mem", "SQLite"} {
		_, err := open.Open(context.Background(), spec, t.TempDir())
		if err == nil {
			t.Errorf("%q opened", spec)
			continue
		}
		if !strings.Contains(err.Error(), spec) {
			t.Errorf("%q: error %q does not name the spec", spec, err)
		}
	}
	_, err := open.Open(context.Background(), "mysql://db/x", "")
	for _, form := range []string{"sqlite:///", "memory", "postgres://"} {
		if !strings.Contains(err.Error(), form) {
			t.Errorf("error %q does not list %s", err, form)
		}
	}
}

// A PostgreSQL spec without // after its scheme (pgx would read it as
// keyword=value settings and say only that it cannot parse them) is
// refused with the URL form, without echoing what may hold a password.
func TestPostgresSpecWithoutSlashesSaysTheURLForm(t *testing.T) {
	for _, spec := range []string{"postgres:/db", "postgresql:db", "postgres:capledger:s3cret@db-host/capledger"} {
		_, err := open.Open(context.Background(), spec, "")
		if err == nil || !strings.Contains(err.Error(), "://USER@HOST:PORT/DATABASE") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v, want the URL form named and no password echoed", spec, err)
		}
	}
}

// Both PostgreSQL schemes reach the PostgreSQL store: with nothing
// listening on the port, it reports the server unreachable.
func TestPostgresSchemes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, spec := range []string{"postgres://postgres@127.0.0.1:1/test?connect_timeout=2", "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2"} {
		s, err := open.Open(ctx, spec, "")
		if err == nil {
			s.Close()
			t.Fatalf("%s opened with nothing listening", spec)
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", spec, err)
		}
	}
}

// With a PostgreSQL server (CAPLEDGER_TEST_POSTGRES, as in CI), both
// schemes open a working store on it, in a schema of the test's own.
func TestPostgresSchemesOpenAServer(t *testing.T) {
	dsn := os.Getenv("CAPLEDGER_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("CAPLEDGER_TEST_POSTGRES is not set (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("CAPLEDGER_TEST_POSTGRES=%q: want a postgres:// URL (%v)", dsn, err)
	}
	ctx := context.Background()
	var random [6]byte
	if _, err := rand.Read(random[:]); err != nil {
		t.Fatal(err)
	}
	schema := "capledger_open_" + hex.EncodeToString(random[:])
	replicatest.Admin(t, dsn, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { replicatest.Admin(t, dsn, "DROP SCHEMA "+schema+" CASCADE") })
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	for _, scheme := range []string{"postgres", "postgresql"} {
		u.Scheme = scheme
		s := mustOpen(t, u.String(), "")
		if _, ok := s.(*postgres.Store); !ok {
			t.Fatalf("%s opened a %T", scheme, s)
		}
		if scheme == "postgres" {
			writeAndRead(t, s)
		} else if _, err := s.ReservationGet(ctx, "rl-1"); err != nil {
			t.Fatalf("postgresql:// does not see what postgres:// wrote: %v", err)
		}
	}
}

// --pipelined-sync opens SQLite pipelined and is refused, with the reason,
// by the stores it does not apply to.
func TestPipelinedSyncOption(t *testing.T) {
	ctx := context.Background()
	st, err := open.OpenWith(ctx, "", t.TempDir(), open.Options{PipelinedSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if s, ok := st.(store.Syncer); !ok || !s.Pipelined() {
		t.Fatal("the SQLite store did not open pipelined")
	}
	plain, err := open.OpenWith(ctx, "", t.TempDir(), open.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if s, ok := plain.(store.Syncer); ok && s.Pipelined() {
		t.Fatal("the SQLite store opened pipelined without the option")
	}
	for _, spec := range []string{"memory", "postgres://localhost/x"} {
		if s, err := open.OpenWith(ctx, spec, "", open.Options{PipelinedSync: true}); err == nil || !strings.Contains(err.Error(), "pipelined sync") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("%s with pipelined sync: %v, want a refusal", spec, err)
		}
	}
}

// CacheRows bounds SQLite's row cache and is refused, with the reason,
// by the stores that have none (before PostgreSQL is dialled).
func TestCacheRowsOption(t *testing.T) {
	ctx := context.Background()
	st, err := open.OpenWith(ctx, "", t.TempDir(), open.Options{CacheRows: 1000})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, spec := range []string{"memory", "postgres://127.0.0.1:1/x", "postgresql://127.0.0.1:1/x"} {
		if s, err := open.OpenWith(ctx, spec, "", open.Options{CacheRows: 1000}); err == nil || !strings.Contains(err.Error(), "row cache is for SQLite") {
			if s != nil {
				s.Close()
			}
			t.Fatalf("%s with a row cache: %v, want a refusal", spec, err)
		}
	}
	mem, err := open.OpenWith(ctx, "memory", "", open.Options{})
	if err != nil {
		t.Fatalf("memory without a row cache: %v", err)
	}
	mem.Close()
}

// A sqlite: path the store refuses ('?' or '#': the driver would read
// parameters from it) took its lock first, so serve and migrate left a
// stray "x.db?_pragma=foo.lock" beside the file they refused to open.
// LockSQLite leaves such a path to Open, which refuses it, and creates
// nothing.
func TestLockSQLiteCreatesNothingForARefusedPath(t *testing.T) {
	dir := t.TempDir()
	for _, spec := range []string{"sqlite:" + dir + "/x.db?_pragma=foo", "sqlite:" + dir + "/x#y.db", "sqlite://" + dir + "/z.db?mode=ro"} {
		unlock, err := open.LockSQLite(spec, "")
		if err != nil {
			t.Fatalf("%q: lock: %v", spec, err)
		}
		unlock()
		if _, err := open.Open(context.Background(), spec, ""); err == nil || !strings.Contains(err.Error(), "plain file path") {
			t.Errorf("%q: open: %v, want the path refused", spec, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left %s in the directory", e.Name())
	}
	// A plain path is still locked: a second lock on it is refused.
	spec := "sqlite:" + filepath.Join(dir, "plain.db")
	unlock, err := open.LockSQLite(spec, "")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := open.LockSQLite(spec, ""); err == nil {
		t.Error("a second lock on one plain path was granted")
	}
}

// serve --store sqlite:PATH in a directory that does not exist was
// refused with "lock: open PATH.lock: no such file or directory": the
// error named a file the operator never wrote. It names the directory
// now, and creates nothing (a typo in the path stays a typo).
func TestLockSQLiteNamesAMissingDirectory(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "typo")
	_, err := open.LockSQLite("sqlite:"+filepath.Join(missing, "ledger.db"), "")
	if err == nil || !strings.Contains(err.Error(), "directory "+missing+" does not exist") {
		t.Fatalf("lock in a missing directory: %v, want it named", err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the missing directory was created (stat: %v)", err)
	}
}
