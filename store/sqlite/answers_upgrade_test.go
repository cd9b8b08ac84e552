package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Before schema version 16 resolver answers were keyed by reservation id
// alone. The migration keeps every row: one whose id names a
// USAGE_UNKNOWN reservation marked no later than it was asked gets that
// reservation's account; the others (a settled reservation's, a removed
// one's, and one asked before its reservation was marked, so about an
// earlier life of the id, perhaps another tenant's) get none, are never
// shown, and the next prune deletes them. The file "of version 15" is one
// of version 16 with the table put back as version 10 created it.
func TestResolverAnswersUpgradeKeepsRowsByAccount(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "answers.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	tenantA := ledger.AccountKey{Subject: "tenant-a", Route: "chat", Region: "eu", Generation: 1}
	tenantB := ledger.AccountKey{Subject: "tenant-b", Route: "chat", Region: "eu", Generation: 2}
	row := func(id string, account ledger.AccountKey, state ledger.State, marked time.Duration) ledger.Reservation {
		r := ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: account, AccountingEpoch: t0,
			Reserved: ledger.Amounts{10}, State: state, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute),
			OperationID: "op-" + id, StartedAt: t0.Add(time.Second)}
		if state == ledger.StateUsageUnknown {
			r.UnknownAt = t0.Add(marked)
		} else {
			r.Actual, r.FinishedAt = ledger.Amounts{4}, t0.Add(2*time.Second)
		}
		return r
	}
	rows := []ledger.Reservation{
		row("u1", tenantA, ledger.StateUsageUnknown, 10*time.Second),
		row("u2", tenantB, ledger.StateUsageUnknown, 30*time.Second),
		row("s1", tenantA, ledger.StateSettled, 0),
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Reservations: rows, NewReservations: map[string]bool{"u1": true, "u2": true, "s1": true}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	asked := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	for _, q := range []string{"DROP TABLE resolver_answers",
		`CREATE TABLE resolver_answers (
		    reservation_id TEXT    PRIMARY KEY,
		    answer         TEXT    NOT NULL,
		    detail         TEXT    NOT NULL,
		    asked_at       INTEGER NOT NULL,
		    attempts       INTEGER NOT NULL,
		    next_at        INTEGER NOT NULL
		) WITHOUT ROWID`,
		"DELETE FROM schema_migrations WHERE version >= 16"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for id, at := range map[string]int64{"u1": asked(20 * time.Second), "u2": asked(25 * time.Second),
		"s1": asked(20 * time.Second), "gone": asked(20 * time.Second)} {
		if _, err := db.Exec("INSERT INTO resolver_answers VALUES (?, 'running', '', ?, 3, ?)", id, at, at+int64(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if db, err = sql.Open("sqlite", path); err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var kept int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM resolver_answers").Scan(&kept); err != nil || kept != 4 {
		t.Fatalf("%d answers after the upgrade, %v; want the 4 of before", kept, err)
	}
	got, err := s.ResolverAnswersGet(ctx, []string{"u1", "u2", "s1", "gone"})
	want := []store.ResolverAnswer{{Account: tenantA, ReservationID: "u1", Answer: "running", AskedAt: t0.Add(20 * time.Second),
		Attempts: 3, NextAt: t0.Add(20*time.Second + time.Minute)}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("answers after the upgrade: %+v, %v; want u1's only, of tenant-a", got, err)
	}
	if n, err := s.ResolverAnswersPrune(ctx); err != nil || n != 3 {
		t.Fatalf("prune after the upgrade deleted %d, %v; want the 3 without an account", n, err)
	}
	if got, err := s.ResolverAnswersGet(ctx, []string{"u1"}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("answers after the prune: %+v, %v; want u1's", got, err)
	}
}
