package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func reservation(id string) ledger.Reservation {
	return ledger.Reservation{ID: id, RequestDigest: "sha256:" + id,
		Account:  ledger.AccountKey{Subject: "tenant7", Route: "chat", Region: "eu", Generation: 1},
		Reserved: ledger.Amounts{600}, State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
}

func insert(ids ...string) *store.Changes {
	c := &store.Changes{NewReservations: map[string]bool{}}
	for _, id := range ids {
		c.Reservations = append(c.Reservations, reservation(id))
		c.NewReservations[id] = true
	}
	return c
}

func commit(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func schemaVersions(t *testing.T, path string) []int {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SELECT version FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func TestReopenKeepsDataAndMigratesOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, insert("rl-1"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		s, err = sqlite.Open(ctx, path)
		if err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		if _, err := s.ReservationGet(ctx, "rl-1"); err != nil {
			t.Fatalf("reopen %d: %v", i, err)
		}
		s.Close()
	}
	got := schemaVersions(t, path)
	if len(got) != sqlite.SchemaVersion() || got[len(got)-1] != sqlite.SchemaVersion() {
		t.Fatalf("schema_migrations holds %v, want 1..%d once each", got, sqlite.SchemaVersion())
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, insert("rl-1"))
	s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	future := sqlite.SchemaVersion() + 1
	if _, err := db.Exec("INSERT INTO schema_migrations (version, name) VALUES (?, 'from_the_future.sql')", future); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = sqlite.Open(ctx, path)
	if !errors.Is(err, sqlite.ErrSchemaTooNew) {
		t.Fatalf("open: %v, want ErrSchemaTooNew", err)
	}
	for _, want := range []string{path, "newer", "version"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// The refusal changed nothing: the newer binary's data is intact.
	if got := schemaVersions(t, path); got[len(got)-1] != future {
		t.Fatalf("schema versions after refusal: %v", got)
	}
}

func TestRejectsBadFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlite.Open(ctx, garbage); err == nil {
		t.Error("opened a file that is not a database")
	}
	for _, p := range []string{"", ":memory:", filepath.Join(dir, "a.db?mode=memory"), "file:x.db"} {
		if _, err := sqlite.Open(ctx, p); err == nil {
			t.Errorf("opened %q", p)
		}
	}
	if _, err := sqlite.Open(ctx, filepath.Join(dir, "missing-dir", "x.db")); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("open in a missing directory: %v, want ErrUnavailable", err)
	}
}

// A second process on the same file waits for the busy timeout and then
// reports ErrConflict: the caller may retry the whole transaction.
func TestOtherProcessLockIsConflict(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	a, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := sqlite.Open(ctx, path, sqlite.WithBusyTimeout(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	txA, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if txB, err := b.Begin(ctx); !errors.Is(err, store.ErrConflict) {
		if err == nil {
			txB.Rollback(ctx)
		}
		t.Fatalf("begin while another store holds the write lock: %v, want ErrConflict", err)
	}
	// The other store's committed reads go on meanwhile (WAL).
	if _, err := b.ReservationGet(ctx, "rl-none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read during the other writer's transaction: %v", err)
	}
	if err := txA.Write(ctx, insert("rl-a")); err != nil {
		t.Fatal(err)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	commit(t, b, insert("rl-b"))
	if _, err := a.ReservationGet(ctx, "rl-b"); err != nil {
		t.Fatalf("first store does not see the second one's commit: %v", err)
	}
}

// Within one store, Begin waits for the write connection, honouring ctx.
func TestBeginWaitsForWriter(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	first, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		tx, err := s.Begin(waitCtx)
		if err == nil {
			tx.Rollback(ctx)
		}
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("begin while the writer is busy: %v, want context.Canceled", err)
	}
	second := make(chan error, 1)
	go func() {
		tx, err := s.Begin(ctx)
		if err == nil {
			_, err = tx.ReservationGet(ctx, "rl-1")
			tx.Rollback(ctx)
		}
		second <- err
	}()
	if err := first.Write(ctx, insert("rl-1")); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatalf("waiting writer after the first committed: %v", err)
	}
}

func TestClosedIsUnavailable(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, insert("rl-1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	for name, err := range map[string]error{
		"commit": tx.Commit(ctx),
		"begin":  func() error { _, err := s.Begin(ctx); return err }(),
		"get":    func() error { _, err := s.ReservationGet(ctx, "rl-1"); return err }(),
		"list":   func() error { _, err := s.AccountList(ctx, ledger.PolicyKey{}); return err }(),
		"due":    func() error { _, err := s.ReservationsDue(ctx, t0, 10); return err }(),
		"unknown": func() error {
			_, err := s.ReservationsUnknown(ctx, store.UnknownFilter{Limit: 10})
			return err
		}(),
		"backlog": func() error { _, err := s.ReservationsUnknownBacklog(ctx); return err }(),
		"debt": func() error {
			_, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 10})
			return err
		}(),
		"snap": func() error { _, err := s.Snapshot(ctx); return err }(),
	} {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s after close: %v, want ErrUnavailable", name, err)
		}
	}
}

// The file on disk is in WAL mode with synchronous=FULL on every
// connection the store opens (the writer is checked by Open itself).
func TestDurabilitySettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v; want wal (persistent in the file)", mode, err)
	}
}
