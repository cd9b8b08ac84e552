package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// openSubjectIndexed opens a store whose flusher never runs by itself
// (the tests flush), and a plain connection to its file.
func openSubjectIndexed(t *testing.T) (*sqlite.Store, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(context.Background(), path, sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return s, db
}

// subjectRows returns the ids reservation_subjects holds for subject.
func subjectRows(t *testing.T, db *sql.DB, subject string) []string {
	t.Helper()
	rows, err := db.Query("SELECT id FROM reservation_subjects WHERE subject = ? ORDER BY id", subject)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// listedIDs pages through the subject's listing (page size 7) and returns
// the ids in listed order; it fails on a repeated id.
func listedIDs(t *testing.T, s *sqlite.Store, subject string, states ...ledger.State) []string {
	t.Helper()
	var (
		ids    []string
		cursor store.SubjectCursor
		seen   = map[string]bool{}
	)
	for {
		page, err := s.ReservationsOfSubject(context.Background(), store.SubjectFilter{Subject: subject, States: states, Before: cursor, Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page {
			if seen[r.ID] {
				t.Fatalf("%s listed twice", r.ID)
			}
			seen[r.ID] = true
			ids = append(ids, r.ID)
		}
		if len(page) < 7 {
			return ids
		}
		last := page[len(page)-1]
		cursor = store.SubjectCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}

func subjectReservation(id, subject string, created int) ledger.Reservation {
	r := reservation(id)
	r.Account.Subject = subject
	r.CreatedAt = t0.Add(time.Duration(created) * time.Millisecond)
	r.ExpiresAt = r.CreatedAt.Add(time.Minute)
	return r
}

func countOf(t *testing.T, s *sqlite.Store, subject string) int64 {
	t.Helper()
	st, err := s.ReservationStatesOfSubject(context.Background(), subject)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range st.Counts {
		n += c.Count
	}
	return n
}

// A committed reservation is listed (and counted) while its entry is
// pending, after the flush, and across pages half flushed: no commit
// writes reservation_subjects, the flush does.
func TestSubjectIndexListsPendingEntries(t *testing.T) {
	ctx := context.Background()
	s, db := openSubjectIndexed(t)
	var want []string
	add := func(from, to int) {
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := from; i < to; i++ {
			// Created out of id order, and two at the same instant.
			r := subjectReservation(fmt.Sprintf("r%03d", i), "tenant-a", (i*37)%50)
			c.Reservations = append(c.Reservations, r, subjectReservation(fmt.Sprintf("o%03d", i), "tenant-b", i))
			c.NewReservations[r.ID], c.NewReservations["o"+r.ID[1:]] = true, true
			want = append(want, r.ID)
		}
		commit(t, s, c)
	}
	wantOrder := func() []string {
		byID := map[string]int{}
		for i := range 60 {
			byID[fmt.Sprintf("r%03d", i)] = (i * 37) % 50
		}
		out := slices.Clone(want)
		slices.SortFunc(out, func(a, b string) int {
			if byID[a] != byID[b] {
				return byID[b] - byID[a]
			}
			return -cmpString(a, b)
		})
		return out
	}
	check := func(when string) {
		t.Helper()
		if got := listedIDs(t, s, "tenant-a"); !slices.Equal(got, wantOrder()) {
			t.Errorf("%s: listed %v, want %v", when, got, wantOrder())
		}
		if n := countOf(t, s, "tenant-a"); n != int64(len(want)) {
			t.Errorf("%s: counted %d, want %d", when, n, len(want))
		}
	}
	add(0, 30)
	if rows := subjectRows(t, db, "tenant-a"); len(rows) != 0 {
		t.Fatalf("a commit wrote %d entries of reservation_subjects", len(rows))
	}
	if n := s.SubjectIndexPending(); n != 60 {
		t.Fatalf("%d entries pending, want 60", n)
	}
	check("pending only")
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.SubjectIndexPending(); n != 0 {
		t.Fatalf("%d entries pending after the flush", n)
	}
	if rows := subjectRows(t, db, "tenant-a"); len(rows) != 30 {
		t.Fatalf("the flush wrote %d entries of tenant-a, want 30", len(rows))
	}
	check("flushed")
	add(30, 60)
	check("half flushed")
	// A state filter applies to pending entries too.
	if got := listedIDs(t, s, "tenant-a", ledger.StateSettled); len(got) != 0 {
		t.Errorf("settled reservations of tenant-a: %v, want none", got)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// A transaction rolled back, or whose commit is refused, leaves no
// pending entry.
func TestSubjectIndexRollbackLeavesNothingPending(t *testing.T) {
	ctx := context.Background()
	s, _ := openSubjectIndexed(t)
	commit(t, s, insert("kept"))
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, insert("rolled-back")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, insert("refused")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, insert("kept")); !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("a duplicate id: %v", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("a commit after a failed write succeeded")
	}
	if n := s.SubjectIndexPending(); n != 1 {
		t.Errorf("%d entries pending, want 1 (kept)", n)
	}
}

// Retention's removal deletes the entries of the reservations it removes,
// flushed or pending, and a flush does not write them back.
func TestSubjectIndexRetentionRemovesEntries(t *testing.T) {
	ctx := context.Background()
	s, db := openSubjectIndexed(t)
	commit(t, s, insert("flushed-1", "flushed-2"))
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	commit(t, s, insert("pending-1", "pending-2"))
	commit(t, s, &store.Changes{Retention: store.RetentionChanges{RemovedReservations: []string{"flushed-1", "pending-1"}}})
	if got := subjectRows(t, db, "tenant7"); !slices.Equal(got, []string{"flushed-2"}) {
		t.Errorf("reservation_subjects after retention: %v, want [flushed-2]", got)
	}
	if n := s.SubjectIndexPending(); n != 1 {
		t.Errorf("%d entries pending after retention, want 1 (pending-2)", n)
	}
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if got := subjectRows(t, db, "tenant7"); !slices.Equal(got, []string{"flushed-2", "pending-2"}) {
		t.Errorf("reservation_subjects after the flush: %v, want [flushed-2 pending-2]", got)
	}
	if got := listedIDs(t, s, "tenant7"); !slices.Equal(got, []string{"pending-2", "flushed-2"}) {
		t.Errorf("listed %v, want [pending-2 flushed-2]", got)
	}
}

// A flush of many chunks runs between commits; every reservation
// committed before a listing starts is listed (and counted) by it, and
// once the flush is done the table holds all it took and the watermark
// says so.
func TestSubjectIndexFlushInterleavedWithCommits(t *testing.T) {
	ctx := context.Background()
	s, db := openSubjectIndexed(t)
	var committed atomic.Int64 // reservations r0..r(committed-1) are committed
	commitNext := func(n int) {
		from := int(committed.Load())
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := from; i < from+n; i++ {
			r := subjectReservation(fmt.Sprintf("r%05d", i), "tenant-a", i)
			c.Reservations = append(c.Reservations, r)
			c.NewReservations[r.ID] = true
			c.Journal = append(c.Journal, ledger.JournalEntry{At: r.CreatedAt, Kind: ledger.KindReserve, Account: r.Account,
				ReservationID: r.ID, From: ledger.StateRequested, To: ledger.StateReserved})
		}
		commit(t, s, c)
		committed.Add(int64(n))
	}
	for range 30 {
		commitNext(100) // 3,000 pending: 6 chunks
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(2)
	go func() { // commits beside the flush
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			commitNext(10)
			time.Sleep(time.Millisecond)
		}
	}()
	go func() { // listings beside the flush
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			before := committed.Load()
			if n := countOf(t, s, "tenant-a"); n < before {
				t.Errorf("counted %d reservations, %d were committed before", n, before)
				return
			}
			page, err := s.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant-a", Before: store.SubjectCursor{
				CreatedAt: t0.Add(time.Duration(before) * time.Millisecond), ID: ""}, Limit: 1000})
			if err != nil {
				t.Error(err)
				return
			}
			// The newest 1000 committed before the listing began.
			for i, r := range page {
				if want := fmt.Sprintf("r%05d", before-1-int64(i)); r.ID != want {
					t.Errorf("listing %d: %s, want %s", i, r.ID, want)
					return
				}
			}
			if int64(len(page)) < min(before, 1000) {
				t.Errorf("listed %d, want %d", len(page), min(before, 1000))
				return
			}
		}
	}()
	for range 3 {
		if err := s.FlushSubjectIndex(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	total := committed.Load()
	if rows := subjectRows(t, db, "tenant-a"); int64(len(rows)) != total {
		t.Errorf("reservation_subjects holds %d entries, %d committed", len(rows), total)
	}
	var through, last int64
	if err := db.QueryRow("SELECT value FROM meta WHERE name = 'subject_index_through'").Scan(&through); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow("SELECT MAX(seq) FROM journal_batches").Scan(&last); err != nil {
		t.Fatal(err)
	}
	if through != last {
		t.Errorf("subject_index_through %d after the last flush, want the last batch %d", through, last)
	}
}

// Open rebuilds the entries a process had pending when it died from the
// journal batches after the watermark, and Close flushes what is pending.
func TestSubjectIndexRebuiltAtOpen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path, sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	c := insert("a", "b")
	c.Journal = []ledger.JournalEntry{{At: t0, Kind: ledger.KindReserve, Account: c.Reservations[0].Account, ReservationID: "a",
		From: ledger.StateRequested, To: ledger.StateReserved}, {At: t0, Kind: ledger.KindReserve, Account: c.Reservations[1].Account,
		ReservationID: "b", From: ledger.StateRequested, To: ledger.StateReserved}}
	commit(t, s, c)
	// A killed process: the file as it is, without Close's flush.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if rows := subjectRows(t, db, "tenant7"); len(rows) != 0 {
		t.Fatalf("entries before any flush: %v", rows)
	}
	copyDB(t, path, path+"-copy")
	s.Close()
	if got := subjectRows(t, db, "tenant7"); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("after Close: %v, want [a b]", got)
	}
	s2, err := sqlite.Open(ctx, path+"-copy")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := listedIDs(t, s2, "tenant7"); !slices.Equal(got, []string{"b", "a"}) {
		t.Errorf("listed after a rebuild: %v, want [b a]", got)
	}
	if n := s2.SubjectIndexPending(); n != 0 {
		t.Errorf("%d pending after open", n)
	}
}

// copyDB copies the committed state of the database at from to a new file
// to (VACUUM INTO): what a killed process leaves.
func copyDB(t *testing.T, from, to string) {
	t.Helper()
	db, err := sql.Open("sqlite", from)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("VACUUM INTO ?", to); err != nil {
		t.Fatal(err)
	}
}

// TestSubjectIndexFlushesByAge: a pending entry far below the count is
// written once it is the flush age old (counted in the flusher's ticks:
// the store reads no clock).
func TestSubjectIndexFlushesByAge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(context.Background(), path, sqlite.WithSubjectIndexFlush(400*time.Millisecond, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, insert("aged"))
	if n := s.SubjectIndexPending(); n != 1 {
		t.Fatalf("%d entries pending right after the commit, want 1", n)
	}
	for deadline := time.Now().Add(10 * time.Second); s.SubjectIndexPending() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an entry older than the flush age is still pending after 10 s")
		}
	}
}

// journaled is insert(id) with the journal entry naming it, so the
// reservation is in a journal batch of its own.
func journaled(id string) *store.Changes {
	c := insert(id)
	c.Journal = []ledger.JournalEntry{{At: t0, Kind: ledger.KindReserve, Account: c.Reservations[0].Account, ReservationID: id,
		From: ledger.StateRequested, To: ledger.StateReserved}}
	return c
}

// Journal compaction deletes the batches a checkpoint summarises up to
// subject_index_through only: the batches after it name the reservations
// whose entries are still pending, and a process killed before its next
// flush rebuilds them from those batches at Open (OPERATIONS.md).
func TestJournalCompactionKeepsBatchesAfterTheSubjectWatermark(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path, sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, journaled("a")) // batch 1
	commit(t, s, journaled("b")) // batch 2
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	commit(t, s, journaled("c")) // batch 3, pending
	commit(t, s, journaled("d")) // batch 4, pending
	cp := &ledger.Checkpoint{Seq: 1, Through: 4, CutAt: t0}
	cp.Seal()
	if err := store.PutCheckpoint(ctx, s, cp); err != nil {
		t.Fatal(err)
	}
	if n, err := s.JournalCompact(ctx, 1000); err != nil || n != 2 {
		t.Fatalf("compaction deleted %d rows (%v), want batches 1 and 2", n, err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var kept []int64
	rows, err := db.Query("SELECT seq FROM journal_batches ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, seq)
	}
	rows.Close()
	if !slices.Equal(kept, []int64{3, 4}) {
		t.Errorf("journal batches kept %v, want [3 4] (after the watermark 2)", kept)
	}
	// A killed process: the copy has c and d only in the journal.
	copyDB(t, path, path+"-copy")
	s2, err := sqlite.Open(ctx, path+"-copy")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := listedIDs(t, s2, "tenant7"); !slices.Equal(got, []string{"d", "c", "b", "a"}) {
		t.Errorf("listed after a rebuild: %v, want [d c b a]", got)
	}
}

// A COMMIT that worked but answered an error (its outcome unknown to the
// caller) leaves its entry neither pending nor in the table. The next
// flush catches up from the journal: the reservation is listed, and the
// watermark moves on past it instead of staying behind until the next
// Open (which kept every later journal batch from compaction meanwhile).
func TestSubjectIndexCatchesUpAfterAnUnknownCommit(t *testing.T) {
	ctx := context.Background()
	s, _ := openSubjectIndexed(t)
	commit(t, s, journaled("a")) // batch 1
	sqlite.SetCommitFault(s, func() error { return errors.New("disk I/O error") })
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, journaled("x")); err != nil { // batch 2
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the injected COMMIT error was not answered")
	}
	sqlite.SetCommitFault(s, nil)
	commit(t, s, journaled("y")) // batch 3
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if got := listedIDs(t, s, "tenant7"); !slices.Equal(got, []string{"y", "x", "a"}) {
		t.Errorf("listed %v, want [y x a]", got)
	}
	if n := countOf(t, s, "tenant7"); n != 3 {
		t.Errorf("counted %d, want 3", n)
	}
	if through, err := s.SubjectIndexThrough(ctx); err != nil || through != 3 {
		t.Errorf("subject_index_through %d (%v), want 3", through, err)
	}
	if s.SubjectIndexCatchingUp() {
		t.Error("still catching up after a flush")
	}
}

// Flushes that keep failing (a full disk) do not grow pending without
// bound: at 4 times the flush count it is dropped, the listing answers
// ErrUnavailable instead of a page missing acknowledged reservations, and
// once a flush works the journal restores every entry, from more
// batches than one catch-up transaction reads (subjectCatchUpBatches).
func TestSubjectIndexPendingBoundedWhenFlushesFail(t *testing.T) {
	const commits = 300
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), sqlite.WithSubjectIndexFlush(time.Hour, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sqlite.SetSubjectFlushFault(s, errors.New("database or disk is full"))
	var want []string
	for i := range commits {
		id := fmt.Sprintf("r%03d", i)
		commit(t, s, journaled(id))
		want = append([]string{id}, want...)
		if n := s.SubjectIndexPending(); n >= 8 {
			t.Fatalf("%d entries pending after %d commits, want fewer than 8 (4 times the flush count)", n, i+1)
		}
	}
	if !s.SubjectIndexCatchingUp() {
		t.Fatal("pending was dropped without a catch-up due")
	}
	if _, err := s.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant7", Limit: 100}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("listing while catching up: %v, want ErrUnavailable", err)
	}
	if _, err := s.ReservationStatesOfSubject(ctx, "tenant7"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("counts while catching up: %v, want ErrUnavailable", err)
	}
	sqlite.SetSubjectFlushFault(s, nil)
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	// The reservations share one creation time: newest first is by id.
	if got := listedIDs(t, s, "tenant7"); !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
	if through, err := s.SubjectIndexThrough(ctx); err != nil || through != commits {
		t.Errorf("subject_index_through %d (%v), want %d", through, err, commits)
	}
}

// A listing during which the index was catching up answers
// ErrUnavailable even when the catch-up ends before the listing answers:
// catching up when the listing began (what it read predates the
// catch-up's entries), or falling behind and catching up while it ran
// (pending dropped after the listing read it, the table read before the
// catch-up). A page without the dropped (acknowledged) entries, and no
// error, would say the subject has no such reservations.
func TestSubjectIndexCatchUpDuringAListing(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), sqlite.WithSubjectIndexFlush(time.Hour, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fault := errors.New("database or disk is full")
	sqlite.SetSubjectFlushFault(s, fault)
	n := 0
	// fallBehind commits reservations while flushes fail until pending
	// is dropped at its cap.
	fallBehind := func() {
		for i := 0; !s.SubjectIndexCatchingUp(); i++ {
			if i == 20 {
				t.Fatal("pending never reached its cap")
			}
			commit(t, s, journaled(fmt.Sprintf("r%03d", n)))
			n++
		}
	}
	catchUp := func() {
		sqlite.SetSubjectFlushFault(s, nil)
		if err := s.FlushSubjectIndex(ctx); err != nil {
			t.Error(err)
		}
		sqlite.SetSubjectFlushFault(s, fault)
	}
	reads := []struct {
		name string
		read func() (int, error)
	}{
		{"listing", func() (int, error) {
			page, err := s.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant7", Limit: 1000})
			return len(page), err
		}},
		{"counts", func() (int, error) {
			st, err := s.ReservationStatesOfSubject(ctx, "tenant7")
			var n int64
			for _, c := range st.Counts {
				n += c.Count
			}
			return int(n), err
		}},
	}
	for _, read := range reads {
		for _, c := range []struct {
			name   string
			before func()
			during func()
		}{
			{"begun catching up", fallBehind, catchUp},
			{"fell behind and caught up meanwhile", catchUp, func() { fallBehind(); catchUp() }},
		} {
			c.before()
			var once sync.Once
			sqlite.SetSubjectReadDone(s, func() { once.Do(c.during) })
			got, err := read.read()
			sqlite.SetSubjectReadDone(s, nil)
			if s.SubjectIndexCatchingUp() {
				t.Fatalf("%s, %s: the catch-up did not end", read.name, c.name)
			}
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s, %s: %d of %d reservations, %v; want ErrUnavailable", read.name, c.name, got, n, err)
			}
		}
	}
	sqlite.SetSubjectFlushFault(s, nil)
}

// SubjectIndexStatus (store.SubjectIndexReporter, shown on /statusz and
// /metrics) tells an operator why the console's listings answer 503: a
// catch-up from the journal is under way after an unknown COMMIT, and a
// flush keeps failing (its error); both clear once a flush works, and the
// catch-up stays counted.
func TestSubjectIndexStatusShowsTheCatchUp(t *testing.T) {
	ctx := context.Background()
	s, _ := openSubjectIndexed(t)
	if got := s.SubjectIndexStatus(); got != (store.SubjectIndexStatus{}) {
		t.Fatalf("fresh store: %+v, want zero", got)
	}
	commit(t, s, journaled("a"))
	if got := s.SubjectIndexStatus(); got != (store.SubjectIndexStatus{Pending: 1}) {
		t.Fatalf("one commit: %+v, want 1 pending", got)
	}
	// The flush fault first: the unknown COMMIT wakes the flusher, whose
	// catch-up would otherwise clear CatchingUp before the test looks.
	sqlite.SetSubjectFlushFault(s, errors.New("database or disk is full"))
	sqlite.SetCommitFault(s, func() error { return errors.New("disk I/O error") })
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, journaled("x")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the injected COMMIT error was not answered")
	}
	sqlite.SetCommitFault(s, nil)
	if err := s.FlushSubjectIndex(ctx); err == nil {
		t.Fatal("the injected flush error was not answered")
	}
	got := s.SubjectIndexStatus()
	if !got.CatchingUp || got.CatchUps != 1 || !strings.Contains(got.LastError, "database or disk is full") {
		t.Fatalf("catching up with flushes failing: %+v, want CatchingUp, 1 catch-up and the flush's error", got)
	}
	sqlite.SetSubjectFlushFault(s, nil)
	if err := s.FlushSubjectIndex(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.SubjectIndexStatus(); got != (store.SubjectIndexStatus{CatchUps: 1}) {
		t.Fatalf("after a flush that worked: %+v, want only the 1 catch-up counted", got)
	}
}
