package sqlite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/capledger/capledger/store"
)

// Pipelined durability (store.Syncer).
//
// Opened WithPipelinedSync, the write connection runs synchronous=NORMAL:
// in WAL mode a COMMIT then writes its frames to the -wal file (the OS page
// cache: they survive the process being killed) without an fsync, and Sync
// fdatasyncs the -wal file through a descriptor of its own. On Linux the
// page cache belongs to the inode, so that flushes the frames every COMMIT
// that returned before it wrote, whoever wrote them. SQLite itself keeps
// the file consistent in NORMAL (a lost suffix of commits at a power loss,
// never a half commit): a checkpoint syncs the WAL before it copies frames
// into the database file and syncs that file after, and the WAL restarts
// from its beginning (or is truncated to journal_size_limit) only after a
// checkpoint copied every frame, so a restart never overwrites a frame
// that is not durable elsewhere. The WAL file is the same inode as long as
// any connection has the database open (the store keeps its own open); a
// Sync that finds another inode at the path (or opens the file for the
// first time) syncs the directory too, for the file's name.
//
// Tx.Commit keeps its contract in this mode (COMMIT, then Sync); only
// Tx.CommitDeferred leaves the sync to a later Sync call. The read pool
// sees committed WAL frames whether they are synced or not, so every read
// method ends with afterRead, which syncs what it may have seen first.

// WithPipelinedSync opens the store for pipelined durability
// (store.Syncer): synchronous=NORMAL on the write connection, commits
// whose fsync Tx.CommitDeferred leaves to Store.Sync.
func WithPipelinedSync() Option { return func(c *config) { c.pipelined = true } }

// walSync is the store's pipelined-durability state.
type walSync struct {
	// started counts the writes that may have become visible: bumped
	// before every COMMIT; committed is set to that count once the COMMIT
	// returned (whatever it returned), synced once a sync that began after
	// it returned succeeded. Writes are serialised by Store.writer, so the
	// three only grow.
	started, committed, synced atomic.Uint64

	mu      sync.Mutex // one sync at a time; guards file
	walPath string
	file    *os.File
	// datasync flushes the file's data (fdatasync); tests replace it to
	// make a sync fail.
	datasync func(*os.File) error

	// failed is the first fsync failure: permanent (see store.Syncer).
	failed atomic.Pointer[error]
}

// ErrSyncFailed is wrapped by every error the store returns after an
// fsync failed: the store refuses everything until it is opened again.
var ErrSyncFailed = errors.New("fsync failed: the store refuses every read and write until the process restarts and recovers the file")

// failure returns the permanent error, or nil.
func (p *walSync) failure() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// fail records err as the permanent failure (the first one wins).
func (p *walSync) fail(err error) error {
	e := fmt.Errorf("%w: %w (%w)", store.ErrUnavailable, ErrSyncFailed, err)
	p.failed.CompareAndSwap(nil, &e)
	return p.failure()
}

// Pipelined reports whether the store was opened WithPipelinedSync.
func (s *Store) Pipelined() bool { return s.pipelined }

// Sync makes every commit that returned before it durable (store.Syncer):
// it fdatasyncs the -wal file unless nothing was committed since the last
// sync. It does nothing unless the store is Pipelined (every commit synced
// itself). After an error, every later call returns it (never retrying the
// fsync), and so do Begin and the read methods.
func (s *Store) Sync(ctx context.Context) error {
	p := &s.sync
	if err := p.failure(); err != nil {
		return err
	}
	if !s.pipelined {
		return nil
	}
	if s.closed.Load() {
		return errClosed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.failure(); err != nil {
		return err
	}
	target := p.committed.Load()
	if p.synced.Load() >= target {
		return nil
	}
	if err := p.syncWAL(); err != nil {
		return p.fail(err)
	}
	p.synced.Store(target)
	return nil
}

// syncWAL fdatasyncs the -wal file, (re)opening it when the path names
// another inode than the descriptor (and then syncing the directory too).
// p.mu is held.
func (p *walSync) syncWAL() error {
	if p.file != nil {
		fi, err1 := p.file.Stat()
		at, err2 := os.Stat(p.walPath)
		if err1 != nil || err2 != nil || !os.SameFile(fi, at) {
			p.file.Close()
			p.file = nil
		}
	}
	fresh := p.file == nil
	if fresh {
		f, err := os.Open(p.walPath)
		if err != nil {
			return fmt.Errorf("open the write-ahead log: %w", err)
		}
		p.file = f
	}
	if err := p.datasync(p.file); err != nil {
		return fmt.Errorf("fdatasync %s: %w", p.walPath, err)
	}
	if fresh {
		dir, err := os.Open(filepath.Dir(p.walPath))
		if err != nil {
			return fmt.Errorf("open the data directory: %w", err)
		}
		err = dir.Sync()
		dir.Close()
		if err != nil {
			return fmt.Errorf("fsync the data directory: %w", err)
		}
	}
	return nil
}

func (p *walSync) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.file != nil {
		p.file.Close()
		p.file = nil
	}
}

// beginWrite is called before a COMMIT (or a write outside a Tx) in a
// pipelined store and returns its sequence number; endWrite after it,
// whatever it returned.
func (s *Store) beginWrite() uint64 {
	if !s.pipelined {
		return 0
	}
	return s.sync.started.Add(1)
}

// beginCommit is beginWrite for the COMMIT of a transaction on w, which
// it counts only when the transaction may have changed something
// (w.changedRows): a COMMIT that changed no row makes nothing visible
// that was not before, so no read needs to wait for it and no Sync needs
// to fsync for it (a maintenance pass that finds nothing to do costs no
// fdatasync). It returns 0 for a COMMIT it does not count, which
// endWrite ignores.
func (s *Store) beginCommit(ctx context.Context, w *writer) uint64 {
	if !s.pipelined || !w.changedRows(ctx) {
		return 0
	}
	return s.sync.started.Add(1)
}

// endWrite is called after the COMMIT (or write) beginWrite or
// beginCommit numbered seq, whatever it returned.
func (s *Store) endWrite(seq uint64) {
	if s.pipelined && seq != 0 {
		s.sync.committed.Store(seq)
	}
}

// changedRows reports whether a statement on w changed a row since the
// last call, by SQLite's total_changes() (every row an INSERT, UPDATE or
// DELETE on the connection changed, whether kept or rolled back since):
// at a COMMIT, whether the transaction may have written anything. It
// answers true at its first call and when the count cannot be read, so
// it errs towards a sync. The store's transactions change the file only
// by INSERT, UPDATE and DELETE (schema changes run at Open, before any
// of them), so a transaction that changed no row wrote no page a read
// could see.
func (w *writer) changedRows(ctx context.Context) bool {
	st, err := w.stmt(ctx, "SELECT total_changes()")
	if err != nil {
		return true
	}
	total, err := queryOneRow(ctx, w, st, nil, scanInt)
	if err != nil {
		return true
	}
	changed := !w.totalChangesRead || total != w.totalChanges
	w.totalChanges, w.totalChangesRead = total, true
	return changed
}

// afterRead returns nil once everything a read that has just finished
// may have seen is durable: in a pipelined store it syncs the commits that
// had begun by then (waiting for a COMMIT still running to return first).
// It returns the permanent failure after a failed fsync, in any mode.
func (s *Store) afterRead(ctx context.Context) error {
	p := &s.sync
	if err := p.failure(); err != nil {
		return err
	}
	if !s.pipelined {
		return nil
	}
	target := p.started.Load()
	for p.synced.Load() < target {
		if p.committed.Load() >= target {
			if err := s.Sync(ctx); err != nil {
				return err
			}
			continue
		}
		// A COMMIT is running: it returns within its statement's time.
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// noteFsyncFailure makes the store fail for good when err is SQLite
// reporting a failed fsync (of the WAL in a COMMIT with synchronous=FULL,
// or of the database file in a checkpoint): the same rule as a failed
// Sync, in every mode.
func (s *Store) noteFsyncFailure(err error) {
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch e.Code() {
		case sqlite3.SQLITE_IOERR_FSYNC, sqlite3.SQLITE_IOERR_DIR_FSYNC:
			s.sync.fail(err)
		}
	}
}

// readBarrier is deferred by the read methods: when the read succeeded (or
// found nothing, an answer too) it holds the answer back until what the
// read may have seen is durable (afterRead), or replaces *err with why it
// cannot be.
func (s *Store) readBarrier(ctx context.Context, err *error) {
	if *err != nil && !errors.Is(*err, store.ErrNotFound) {
		return
	}
	if b := s.afterRead(ctx); b != nil {
		*err = b
	}
}
