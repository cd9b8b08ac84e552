package sqlite

import (
	"context"
	"database/sql/driver"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// The writer never checkpoints, and Close stops the checkpointer.
func TestWriterNeverCheckpoints(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	check, err := s.w.conn.(driver.ConnPrepareContext).PrepareContext(ctx, "PRAGMA wal_autocheckpoint")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := queryOneRow(ctx, s.w, check, nil, scanInt)
	check.Close()
	if err != nil || pages != 0 {
		t.Fatalf("writer wal_autocheckpoint %d, %v; want 0", pages, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.checkpointer.done:
	default:
		t.Fatal("Close left the checkpointer running")
	}
}

// TestNoCommitCopiesTheWAL: a commit never copies the WAL into the
// database file, however large the WAL grew behind a long read (an
// audit's snapshot): that copy ran inside the committing batch, holding
// the one writer for seconds, and the batches queued behind it failed at
// "begin" after the engine's batch timeout. With the checkpointer
// stopped, the database file must not change size across commits that
// write more than SQLite's autocheckpoint size (and more than the 8,000
// pages the writer used to copy at), before and after the read ends; the
// checkpointer's connection then copies it.
func TestNoCommitCopiesTheWAL(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.checkpointer.stop()
	<-s.checkpointer.done
	write := func(q string) {
		t.Helper()
		err := s.withWriter(ctx, func(w *writer) error {
			return s.inWriteTx(ctx, w, "filler", func(tx *writeTx) error { _, err := tx.exec(q); return err })
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	write("CREATE TABLE filler (b BLOB)")
	if _, err := s.checkpointer.db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		t.Fatal(err)
	}
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(s.path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := size()
	read, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := read.QueryRow("SELECT count(*) FROM filler").Scan(&n); err != nil {
		t.Fatal(err)
	}
	for range 9 { // 9 x 4 MiB: 9,216 pages
		write("INSERT INTO filler VALUES (randomblob(4 << 20))")
	}
	if err := read.Rollback(); err != nil {
		t.Fatal(err)
	}
	write("INSERT INTO filler VALUES (randomblob(100))")
	if got := size(); got != before {
		t.Fatalf("database file went from %d to %d bytes across commits: a commit copied the WAL", before, got)
	}
	if _, err := s.checkpointer.db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		t.Fatal(err)
	}
	if got := size(); got < before+36<<20 {
		t.Fatalf("database file %d bytes after the checkpointer's checkpoint, want at least %d", got, before+36<<20)
	}
}

// TestAuditReleaseEndsTheRead: once a cut calls its snapshot's Release,
// the WAL written after it can be copied whole (and so restarted) while
// the cut goes on writing; while the read is held, it cannot.
func TestAuditReleaseEndsTheRead(t *testing.T) {
	for _, release := range []bool{true, false} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			ctx := context.Background()
			s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.checkpointer.stop()
			<-s.checkpointer.done
			write := func(q string) {
				t.Helper()
				err := s.withWriter(ctx, func(w *writer) error {
					return s.inWriteTx(ctx, w, "filler", func(tx *writeTx) error { _, err := tx.exec(q); return err })
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			write("CREATE TABLE filler (b BLOB)")
			err = s.AuditSnapshot(ctx, true, func(snap *ledger.Snapshot, _ int64) error {
				if err := snap.AccountStream(func(*ledger.Account) error { return nil }); err != nil {
					return err
				}
				if snap.TempDir != filepath.Dir(s.path) {
					t.Errorf("TempDir %q, want the store's directory", snap.TempDir)
				}
				if release {
					snap.Release()
				}
				write("INSERT INTO filler VALUES (randomblob(1 << 20))")
				var busy, log, copied int
				if err := s.checkpointer.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &copied); err != nil {
					return err
				}
				if whole := copied == log; whole != release {
					t.Errorf("%d of %d WAL frames copied with the audit's read released %v", copied, log, release)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
