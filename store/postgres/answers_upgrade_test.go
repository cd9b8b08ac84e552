package postgres_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// Before schema version 15 resolver answers were keyed by reservation id
// alone. The migration keeps every row: one whose id names a
// USAGE_UNKNOWN reservation marked no later than it was asked gets that
// reservation's account; the others (a settled reservation's, a removed
// one's, and one asked before its reservation was marked, so about an
// earlier life of the id, perhaps another tenant's) get none, are never
// shown, and the next prune deletes them. The old table stays, written
// by replicas of the earlier version during a rolling upgrade. The schema
// "at version 14" is one at 15 without version 15's table.
func TestResolverAnswersUpgradeKeepsRowsByAccount(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
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
	writeChanges(t, s, &store.Changes{Reservations: []ledger.Reservation{
		row("u1", tenantA, ledger.StateUsageUnknown, 10*time.Second),
		row("u2", tenantB, ledger.StateUsageUnknown, 30*time.Second),
		row("s1", tenantA, ledger.StateSettled, 0),
	}, NewReservations: map[string]bool{"u1": true, "u2": true, "s1": true}})
	s.Close()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	asked := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	for _, q := range []string{"DROP TABLE resolver_answers_by_account", "DELETE FROM schema_migrations WHERE version = 15"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for id, at := range map[string]int64{"u1": asked(20 * time.Second), "u2": asked(25 * time.Second),
		"s1": asked(20 * time.Second), "gone": asked(20 * time.Second)} {
		if _, err := conn.Exec(ctx, "INSERT INTO resolver_answers VALUES ($1, 'running', '', $2, 3, $3)", id, at, at+int64(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}

	upgraded, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer upgraded.Close()
	for _, table := range []string{"resolver_answers_by_account", "resolver_answers"} {
		var kept int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&kept); err != nil || kept != 4 {
			t.Fatalf("%d answers in %s after the upgrade, %v; want the 4 of before", kept, table, err)
		}
	}
	// Expand-only: a replica of the earlier version still records its
	// answers, in the table it knows, during the rolling upgrade.
	if _, err := conn.Exec(ctx, `INSERT INTO resolver_answers (reservation_id, answer, detail, asked_at, attempts, next_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
		ON CONFLICT (reservation_id) DO UPDATE SET answer = excluded.answer, detail = excluded.detail,
		asked_at = excluded.asked_at, attempts = excluded.attempts, next_at = excluded.next_at`,
		[]string{"u1"}, []string{"unknown"}, []string{""}, []int64{1}, []int64{4}, []int64{1}); err != nil {
		t.Fatalf("an earlier version's answer after the upgrade: %v", err)
	}
	got, err := upgraded.ResolverAnswersGet(ctx, []string{"u1", "u2", "s1", "gone"})
	want := []store.ResolverAnswer{{Account: tenantA, ReservationID: "u1", Answer: "running", AskedAt: t0.Add(20 * time.Second),
		Attempts: 3, NextAt: t0.Add(20*time.Second + time.Minute)}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("answers after the upgrade: %+v, %v; want u1's only, of tenant-a", got, err)
	}
	if n, err := upgraded.ResolverAnswersPrune(ctx); err != nil || n != 3 {
		t.Fatalf("prune after the upgrade deleted %d, %v; want the 3 without an account", n, err)
	}
	if got, err := upgraded.ResolverAnswersGet(ctx, []string{"u1"}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("answers after the prune: %+v, %v; want u1's", got, err)
	}
	// Written from now on with their account: tenant-b's own answer
	// about u2 and a late one about another account's u2 are two rows.
	late := store.ResolverAnswer{Account: tenantA, ReservationID: "u2", Answer: "settle_refused", AskedAt: t0, NextAt: t0}
	own := store.ResolverAnswer{Account: tenantB, ReservationID: "u2", Answer: "unknown", AskedAt: t0.Add(40 * time.Second), NextAt: t0}
	if err := upgraded.ResolverAnswersPut(ctx, []store.ResolverAnswer{own, late}); err != nil {
		t.Fatal(err)
	}
	if got, err := upgraded.ResolverAnswersGet(ctx, []string{"u2"}); err != nil || !reflect.DeepEqual(got, []store.ResolverAnswer{own}) {
		t.Fatalf("u2's answers after the upgrade: %+v, %v; want tenant-b's own", got, err)
	}
}
