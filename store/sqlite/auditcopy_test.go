package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/tmpfs"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"modernc.org/sqlite"
)

// smallCopySteps opens a store whose audit copy steps a few pages at a
// time, so that a small store is copied in many steps.
var smallCopySteps Option = func(c *config) { c.auditCopyPages = smallCopyPages }

const smallCopyPages = 4

// reserveMany commits n reservations of account in batches of 500, ids
// prefix-0000 on.
func reserveMany(t *testing.T, s *Store, account ledger.AccountKey, prefix string, n int, now time.Time) {
	t.Helper()
	for from := 0; from < n; from += 500 {
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := from; i < min(from+500, n); i++ {
			appendReserve(c, account, fmt.Sprintf("%s-%05d", prefix, i), now)
		}
		commitChanges(t, s, c)
	}
}

// countAudit reads every stream of a full audit of snap and audits it:
// the reservations, journal entries and accounts it read, and what the
// audit found.
func countAudit(t *testing.T, snap *ledger.Snapshot) (reservations, entries, accounts int, found []ledger.Discrepancy) {
	t.Helper()
	r, j, a := snap.ReservationStream, snap.JournalStream, snap.AccountStream
	snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
		return r(func(x *ledger.Reservation) error { reservations++; return yield(x) })
	}
	snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
		return j(func(pos int64, x *ledger.JournalEntry) error { entries++; return yield(pos, x) })
	}
	snap.AccountStream = func(yield func(*ledger.Account) error) error {
		return a(func(x *ledger.Account) error { accounts++; return yield(x) })
	}
	found, _ = ledger.AuditWith(snap, ledger.AuditOptions{})
	return reservations, entries, accounts, found
}

// TestAuditCopyIsOneTransactionsView: commits and WAL checkpoints between
// the steps of a full audit's copy do not reach it: the audit reads
// exactly what was committed before it began (the backup steps inside the
// audit's read transaction; outside one, SQLite restarts a backup whose
// source another connection changed and the copy holds later commits).
func TestAuditCopyIsOneTransactionsView(t *testing.T) {
	ctx := context.Background()
	s := openWithoutCheckpointer(t, smallCopySteps)
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}
	const before = 2000
	reserveMany(t, s, account, "before", before, now)
	pauses := 0
	paced := store.WithPause(ctx, func(int64) {
		pauses++
		if pauses > 5 {
			return
		}
		reserveMany(t, s, account, fmt.Sprintf("during%d", pauses), 50, now)
		// Copy the new commits into the database file, where the copy
		// reads the pages it has not copied yet.
		var busy, frames, copied int
		if err := s.checkpointer.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied); err != nil {
			t.Error(err)
		}
	})
	var reservations, entries int
	var found []ledger.Discrepancy
	err := s.AuditSnapshot(paced, false, func(snap *ledger.Snapshot, _ int64) error {
		reservations, entries, _, found = countAudit(t, snap)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if pauses < 6 {
		t.Fatalf("the copy paused %d times; the test needs more steps", pauses)
	}
	if reservations != before || entries != before || len(found) > 0 {
		t.Fatalf("the audit read %d reservations and %d journal entries and found %v; want the %d of each committed before it began, sound",
			reservations, entries, found, before)
	}
}

// TestAuditCopyIsPaced: a full audit's copy offers a pause (store.Pause)
// after every step of pages (smallCopyPages here), with its progress in rows growing to
// the estimate, and pauses as often before the audit reads its first
// reservation.
func TestAuditCopyIsPaced(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ledger.db"), smallCopySteps)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	const n = 2000
	reserveMany(t, s, ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}, "r", n, now)
	var pages int
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	var progress []int64
	paced := store.WithPause(ctx, func(copied int64) { progress = append(progress, copied) })
	var pausesAtFirst, read int
	var estimate int64
	err = s.AuditSnapshot(paced, false, func(snap *ledger.Snapshot, _ int64) error {
		if estimate, err = snap.Estimate(true); err != nil {
			return err
		}
		return snap.ReservationStream(func(*ledger.Reservation) error {
			if read == 0 {
				pausesAtFirst = len(progress)
			}
			read++
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := (pages - 1) / smallCopyPages; pausesAtFirst < want {
		t.Errorf("the copy of %d pages paused %d times before the first reservation was read, want at least %d", pages, pausesAtFirst, want)
	}
	for i := 1; i < len(progress); i++ {
		if progress[i] < progress[i-1] || progress[i] > estimate {
			t.Fatalf("the copy's progress went %v, estimate %d", progress, estimate)
		}
	}
	if len(progress) == 0 || progress[len(progress)-1] < estimate*9/10 {
		t.Errorf("the copy's progress %v ends short of the estimate %d", progress, estimate)
	}
	if read != n {
		t.Fatalf("read %d reservations, want %d", read, n)
	}
}

// openAuditFiles lists this process's open files named like an audit's
// copy.
func openAuditFiles(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("needs /proc to see the open files")
	}
	var out []string
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(target, ".capledger-audit-") {
			out = append(out, target)
		}
	}
	return out
}

// auditFilesIn lists dir's files named like an audit's copy.
func auditFilesIn(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".capledger-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// allUnlinked reports whether files (as /proc/self/fd names them) are
// some, and every one unlinked.
func allUnlinked(files []string) bool {
	for _, f := range files {
		if !strings.HasSuffix(f, " (deleted)") {
			return false
		}
	}
	return len(files) > 0
}

// TestAuditCopyIsUnlinkedAndClosed: while a full audit reads its copy
// the copy is open but has no name in the directory (a crash leaves
// nothing), and an audit cancelled in the middle of its copy, like one
// that finished, leaves no file open and none behind.
func TestAuditCopyIsUnlinkedAndClosed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(ctx, filepath.Join(dir, "ledger.db"), smallCopySteps)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	reserveMany(t, s, ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}, "r", 2000, now)
	var whileCopying, whileReading []string
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		return snap.ReservationStream(func(*ledger.Reservation) error {
			if whileReading == nil {
				whileReading = append(openAuditFiles(t), auditFilesIn(t, dir)...)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if !allUnlinked(whileReading) {
		t.Errorf("while the audit read its copy: %q; want open files, every one unlinked", whileReading)
	}
	cancelled, cancel := context.WithCancel(ctx)
	defer cancel()
	pauses := 0
	paced := store.WithPause(cancelled, func(int64) {
		if pauses++; pauses == 3 {
			whileCopying = append(openAuditFiles(t), auditFilesIn(t, dir)...)
			cancel()
		}
	})
	err = s.AuditSnapshot(paced, false, func(snap *ledger.Snapshot, _ int64) error {
		return snap.ReservationStream(func(*ledger.Reservation) error { return nil })
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("an audit cancelled during its copy: %v", err)
	}
	if !allUnlinked(whileCopying) {
		t.Errorf("while copying: %q; want open files, every one unlinked", whileCopying)
	}
	if left := append(openAuditFiles(t), auditFilesIn(t, dir)...); len(left) > 0 {
		t.Errorf("after the audits: %q open or left in the directory", left)
	}
}

// TestAuditCopyOnAFullDisk: a full audit on a disk without room for its
// copy fails with a store-unavailable error that names the copy and the
// full disk (ENOSPC), frees what the copy took, and loses nothing: the store
// still commits, and once there is room an audit reads every reservation
// and finds the ledger sound. Needs root to mount a size-limited tmpfs;
// skipped otherwise.
func TestAuditCopyOnAFullDisk(t *testing.T) {
	dir := tmpfs.Mount(t, "16m")
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The test checkpoints itself: the database file's size stays put.
	s.checkpointer.stop()
	<-s.checkpointer.done
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	account := ledger.AccountKey{Subject: "s", Route: "r", Region: "eu", Generation: 1}
	const n = 6000
	reserveMany(t, s, account, "r", n, now)
	if _, err := s.checkpointer.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	var pages, pageSize int64
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if err := s.readDB.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	// Fill the disk but for half the database's size and 256 KiB for
	// the WAL: room for small commits, not for the copy.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	room := pages*pageSize/2 + 256<<10
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(fi.Size() - room); err != nil {
		t.Fatal(err)
	}
	f.Close()
	free := func() uint64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		return st.Bavail * uint64(st.Bsize)
	}
	freeBefore := free()
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		_, _, _, found := countAudit(t, snap)
		if len(found) == 0 {
			t.Error("an audit that could not copy found nothing wrong: a reader cannot tell it from a sound ledger")
		}
		return nil
	})
	_ = err // the audit's own stream errors are its discrepancies here; the store's are checked below
	var streamErr error
	// After a failed copy the ledger goes on to the journal and the
	// accounts: they must answer the copy's error, not hold the live read
	// open to read them (the WAL growing into what is left of the disk).
	var afterErrs []error
	read := 0
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		streamErr = snap.ReservationStream(func(*ledger.Reservation) error { return nil })
		afterErrs = append(afterErrs,
			snap.JournalStream(func(int64, *ledger.JournalEntry) error { read++; return nil }),
			snap.AccountStream(func(*ledger.Account) error { read++; return nil }),
			snap.AccountKeyStream(func(*ledger.AccountKey) error { read++; return nil }))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the copy on a full disk: %v", streamErr)
	if !errors.Is(streamErr, store.ErrUnavailable) || !errors.Is(streamErr, syscall.ENOSPC) || !strings.Contains(streamErr.Error(), "audit copy") {
		t.Fatalf("a copy on a full disk: %v; want a store-unavailable error naming the audit copy and the full disk", streamErr)
	}
	for i, e := range afterErrs {
		if !errors.Is(e, syscall.ENOSPC) {
			t.Errorf("stream %d after the failed copy answered %v, want the copy's error", i, e)
		}
	}
	if read > 0 {
		t.Errorf("the audit read %d journal entries and accounts after its copy failed", read)
	}
	if got := free(); got < freeBefore {
		t.Errorf("free space %d bytes after the failed copy, %d before: it kept what it wrote", got, freeBefore)
	}
	if left := append(openAuditFiles(t), auditFilesIn(t, dir)...); len(left) > 0 {
		t.Errorf("after the failed copy: %q open or left in the directory", left)
	}
	reserveMany(t, s, account, "after", 10, now)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var reservations, entries int
	var found []ledger.Discrepancy
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		reservations, entries, _, found = countAudit(t, snap)
		return nil
	})
	if err != nil || reservations != n+10 || entries != n+10 || len(found) > 0 {
		t.Fatalf("with room again the audit read %d reservations and %d journal entries, found %v, %v; want %d of each, sound", reservations, entries, found, err, n+10)
	}
}

// closeCounting is a driver connection that counts its closes.
type closeCounting struct {
	driver.Conn
	closed *int
}

func (c closeCounting) Close() error { *c.closed++; return c.Conn.Close() }

// TestAuditCopyConnectionClosedWhenNeverTaken: a copy whose read could not
// begin (its ctx ended between the backup's commit and BeginTx, before
// database/sql asked for the connection) still closes the copy's
// connection with its DB, which holds the unlinked copy open.
func TestAuditCopyConnectionClosedWhenNeverTaken(t *testing.T) {
	conn, err := (&sqlite.Driver{}).Open(filepath.Join(t.TempDir(), "copy.db"))
	if err != nil {
		t.Fatal(err)
	}
	closed := 0
	db := sql.OpenDB(&oneConn{conn: closeCounting{conn, &closed}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tx, err := db.BeginTx(ctx, nil); err == nil {
		tx.Rollback()
		t.Fatal("BeginTx with an ended ctx began")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if closed != 1 {
		t.Fatalf("the copy's connection was closed %d times with its DB, want 1", closed)
	}
}
