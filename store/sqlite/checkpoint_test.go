package sqlite

import (
	"context"
	"database/sql"
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
	s := openWithoutCheckpointer(t)
	write := func(q string) { t.Helper(); execWrite(t, s, q, nil) }
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

// TestCheckpointerRestartsTheWAL: under back-to-back commits and
// overlapping reads the WAL stays bounded, because the checkpointer's
// pass restarts it (RESTART) once it is past walRestartFrames and wholly
// copied. A writer restarts the WAL itself only when the WAL was wholly
// copied as its transaction began; under load a commit always lands
// between the checkpointer's copy and the committer's next BEGIN, so
// that never happens and, without the RESTART, the WAL grows by
// everything written. Each round here: a reader reads while the writer's
// transaction is open (its snapshot taken with the WAL not wholly
// copied), the reader ends, the pass copies everything, the writer
// commits between the copy and the pass's restart (afterCopy), as the
// committer does under load. 48 rounds write 48 MiB; the WAL file must
// stay near walRestartFrames' 16 MiB.
func TestCheckpointerRestartsTheWAL(t *testing.T) {
	ctx := context.Background()
	s := openWithoutCheckpointer(t)
	write := func(q string, inside func()) { execWrite(t, s, q, inside) }
	write("CREATE TABLE filler (b BLOB)", func() {})
	// The checkpointer's connection sets its pragmas as it opens, which
	// waits for an open write transaction: open it now.
	if err := s.checkpointer.checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	walSize := func() int64 {
		t.Helper()
		fi, err := os.Stat(s.path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	var largest int64
	for i := range 48 {
		// The writer's transaction is open when the pass starts, and
		// commits after its PASSIVE copy.
		inTx, commit, committed := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			defer close(committed)
			write("INSERT INTO filler VALUES (randomblob(1 << 20))", func() {
				close(inTx)
				<-commit
			})
		}()
		<-inTx
		read, err := s.readDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := read.QueryRow("SELECT count(*) FROM filler").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if err := read.Rollback(); err != nil {
			t.Fatal(err)
		}
		s.checkpointer.afterCopy = func() {
			close(commit)
			<-committed
		}
		if err := s.checkpointer.checkpoint(ctx); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		largest = max(largest, walSize())
	}
	if limit := int64(2 * walRestartFrames * 4096); largest > limit {
		t.Fatalf("the WAL grew to %d bytes over 48 MiB of commits, want at most %d: the checkpointer did not restart it", largest, limit)
	}
}

// TestNewConnectionsLeaveTheWriterCache: opening the checkpointer's
// connection or read connections commits nothing, so the writer's
// PRAGMA data_version stays put and neither its page cache nor the row
// cache starts over (syncCache). A connection that set auto_vacuum wrote
// the file's header in a transaction of its own, which the writer counted
// as another connection's commit.
func TestNewConnectionsLeaveTheWriterCache(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	version := func() int64 {
		t.Helper()
		var v int64
		err := s.withWriter(ctx, func(w *writer) (err error) {
			v, err = queryOneRow(ctx, w, w.stmts[wDataVersion], nil, scanInt)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := version()
	if err := s.checkpointer.checkpoint(ctx); err != nil { // opens its connection
		t.Fatal(err)
	}
	var conns []*sql.Conn
	for range DefaultReadConns {
		c, err := s.readDB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		var n int
		if err := c.QueryRowContext(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if after := version(); after != before {
		t.Fatalf("writer's data_version %d -> %d across new connections: another connection committed", before, after)
	}
	if mode, err := s.AutoVacuum(ctx); err != nil || mode != AutoVacuumIncremental {
		t.Fatalf("auto_vacuum %d, %v; want INCREMENTAL (%d)", mode, err, AutoVacuumIncremental)
	}
}

// TestAuditReleaseEndsTheRead: once a cut calls its snapshot's Release,
// the WAL written after it can be copied whole (and so restarted) while
// the cut goes on writing; while the read is held, it cannot.
func TestAuditReleaseEndsTheRead(t *testing.T) {
	for _, release := range []bool{true, false} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			ctx := context.Background()
			s := openWithoutCheckpointer(t)
			write := func(q string) { t.Helper(); execWrite(t, s, q, nil) }
			write("CREATE TABLE filler (b BLOB)")
			err := s.AuditSnapshot(ctx, true, func(snap *ledger.Snapshot, _ int64) error {
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

// openWithoutCheckpointer opens a store whose checkpointer is stopped, so
// that the test decides when the WAL is copied. The store closes with the
// test.
func openWithoutCheckpointer(t *testing.T, opts ...Option) *Store {
	t.Helper()
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "capledger.db"), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.checkpointer.stop()
	<-s.checkpointer.done
	return s
}

// execWrite runs q in one write transaction of s; inside, if not nil,
// runs after q and before the commit.
func execWrite(t *testing.T, s *Store, q string, inside func()) {
	t.Helper()
	ctx := context.Background()
	err := s.withWriter(ctx, func(w *writer) error {
		return s.inWriteTx(ctx, w, "filler", func(tx *writeTx) error {
			if _, err := tx.exec(q); err != nil {
				return err
			}
			if inside != nil {
				inside()
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
