package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// TestReservationWriteAfterReadKeepsEveryColumn checks the short UPDATE of
// a reservation this transaction read (reservationwrite.go): a lifecycle
// step stores its state, usage and times, and a write that also changes a
// column the short form leaves alone (what the ledger never does) still
// stores the whole row, so Write keeps replacing rows whole.
func TestReservationWriteAfterReadKeepsEveryColumn(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	commit(t, s, insert("rl-a", "rl-b"))
	step := func(id string, change func(r *ledger.Reservation)) ledger.Reservation {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		r, err := tx.ReservationGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		change(r)
		if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{*r}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return *r
	}
	check := func(want ledger.Reservation) {
		t.Helper()
		got, err := s.ReservationGet(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("stored\n%+v\nwant\n%+v", got, want)
		}
	}
	started := step("rl-a", func(r *ledger.Reservation) {
		r.State, r.OperationID, r.StartedAt, r.ExecutionDeadline = ledger.StateStarted, "op-1", t0.Add(time.Second), t0.Add(time.Hour)
	})
	check(started)
	check(step("rl-a", func(r *ledger.Reservation) {
		r.State, r.Actual, r.Overdraft, r.FinishedAt, r.Breach = ledger.StateSettled, ledger.Amounts{700}, ledger.Amounts{100},
			t0.Add(2*time.Second), true
	}))
	// Every fixed column changed at once, with the state.
	check(step("rl-b", func(r *ledger.Reservation) {
		r.RequestDigest, r.Account.Region, r.AccountingEpoch = "sha256:other", "us", t0.Add(-time.Hour)
		r.Reserved, r.CreatedAt, r.ExpiresAt = ledger.Amounts{5}, t0.Add(time.Millisecond), t0.Add(2*time.Minute)
		r.State, r.UnknownAt = ledger.StateUsageUnknown, t0.Add(time.Second)
	}))

	// Many rows in one Write take the multi-row statements (71 = 64 + 4 +
	// 2 + 1 rows): each row gets its own values, a row with a changed fixed
	// column is written whole, and an id given twice ends as its last
	// copy. (For the last, putReservations sends both copies through the
	// upsert in order: SQLite documents that an UPDATE ... FROM joining a
	// row twice uses one of the two, arbitrarily. Today's SQLite uses the
	// last, so this check passes without that rule too.)
	var ids []string
	for i := range 70 {
		ids = append(ids, fmt.Sprintf("rl-many-%02d", i))
	}
	commit(t, s, insert(ids...))
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var want []ledger.Reservation
	for i, id := range ids {
		r, err := tx.ReservationGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		r.State, r.OperationID, r.StartedAt = ledger.StateStarted, fmt.Sprintf("op-%d", i), t0.Add(time.Duration(i)*time.Second)
		r.ExecutionDeadline = r.StartedAt.Add(time.Minute)
		if i == 33 {
			r.Reserved = ledger.Amounts{1}
		}
		want = append(want, *r)
	}
	twice := want[50]
	twice.State, twice.Actual, twice.FinishedAt = ledger.StateSettled, ledger.Amounts{9}, t0.Add(time.Hour)
	rows := append(append(append([]ledger.Reservation(nil), want[:51]...), twice), want[51:]...)
	if err := tx.Write(ctx, &store.Changes{Reservations: rows}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want[50] = twice
	for _, r := range want {
		check(r)
	}
}

// TestReservationStepKeepsTheSubjectIndex checks that neither a lifecycle
// step (start, settle) of a reservation the transaction read nor a
// reserve writes a page of the console's index reservation_subjects (the
// short UPDATE names none of its columns; a reserve's entry waits in
// pending, schema version 12), while a flush does, and the console lists
// the reservation under its new state.
func TestReservationStepKeepsTheSubjectIndex(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Enough reservations over enough subjects that the index spans many
	// pages.
	fill := &store.Changes{NewReservations: map[string]bool{}}
	for i := range 3000 {
		r := reservation(fmt.Sprintf("rl-%05d", i))
		r.Account.Subject = fmt.Sprintf("tenant-%04d", i%500)
		fill.Reservations = append(fill.Reservations, r)
		fill.NewReservations[r.ID] = true
	}
	commit(t, s, fill)
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	var pageSize int
	if err := db.QueryRow("PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	// indexPagesWritten empties the WAL, runs write in one commit (or
	// flushes the index when write is nil) and reports whether its frames
	// hold a page of the index.
	indexPagesWritten := func(write func(tx store.Tx)) bool {
		t.Helper()
		for busy, tries := 1, 0; busy != 0; tries++ {
			if tries == 1000 {
				t.Fatal("the WAL checkpoint stayed busy")
			}
			var log, done int
			if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &log, &done); err != nil {
				t.Fatal(err)
			}
			if busy != 0 {
				time.Sleep(10 * time.Millisecond) // the store's checkpointer runs one
			}
		}
		if write == nil {
			if err := s.FlushSubjectIndex(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			tx, err := s.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			write(tx)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := db.Query("SELECT pageno FROM dbstat WHERE name = 'reservation_subjects'")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var index []uint32
		for rows.Next() {
			var p uint32
			if err := rows.Scan(&p); err != nil {
				t.Fatal(err)
			}
			index = append(index, p)
		}
		if len(index) < 3 {
			t.Fatalf("the index has %d pages; the test needs more", len(index))
		}
		written := walPages(t, path, pageSize)
		if len(written) == 0 {
			t.Fatal("the commit wrote no WAL frame")
		}
		for _, p := range written {
			if slices.Contains(index, p) {
				return true
			}
		}
		return false
	}
	step := func(id string, change func(r *ledger.Reservation)) func(store.Tx) {
		return func(tx store.Tx) {
			r, err := tx.ReservationGet(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			change(r)
			if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{*r}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if indexPagesWritten(step("rl-01234", func(r *ledger.Reservation) {
		r.State, r.OperationID, r.StartedAt = ledger.StateStarted, "op", t0.Add(time.Second)
	})) {
		t.Error("starting a reservation wrote a page of reservation_subjects")
	}
	if indexPagesWritten(step("rl-01234", func(r *ledger.Reservation) {
		r.State, r.Actual, r.FinishedAt = ledger.StateSettled, ledger.Amounts{300}, t0.Add(2*time.Second)
	})) {
		t.Error("settling a reservation wrote a page of reservation_subjects")
	}
	if n := s.SubjectIndexPending(); n != 0 {
		t.Errorf("a start and a settle of a reservation read first left %d subject index entries pending", n)
	}
	if indexPagesWritten(func(tx store.Tx) {
		r := reservation("rl-new")
		r.Account.Subject = "tenant-0234"
		if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{r}, NewReservations: map[string]bool{r.ID: true}}); err != nil {
			t.Fatal(err)
		}
	}) {
		t.Error("a reserve wrote a page of reservation_subjects")
	}
	if !indexPagesWritten(nil) {
		t.Error("the flush of a reserve's entry wrote no page of reservation_subjects: the checks above prove nothing")
	}
	got, err := s.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant-0234", States: []ledger.State{ledger.StateSettled}, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "rl-01234" || got[0].State != ledger.StateSettled {
		t.Errorf("settled reservations of tenant-0234: %+v, want rl-01234 alone", got)
	}
}
