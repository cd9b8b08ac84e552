package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/capledger/capledger/store"
)

// translate is the one place where driver errors become the store's terms:
//   - SQLITE_BUSY, SQLITE_LOCKED (another writer holds the database past the
//     busy timeout): store.ErrConflict, the transaction may be retried whole;
//   - a UNIQUE or PRIMARY KEY constraint: store.ErrDuplicate;
//   - I/O errors, a full disk, a file that cannot be opened or is not (or
//     no longer) a database, a closed store or connection:
//     store.ErrUnavailable; a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB)
//     store.ErrDamaged beside it;
//   - an interrupted statement whose context ended: the context's error;
//   - store.ErrNotFound for sql.ErrNoRows.
//
// Both sentinels stay in the chain (%w twice), so errors.Is finds the
// store's term and the driver's detail is kept for the log. Anything else
// is returned unchanged. ctx may be nil. (openFailed adds what Open knows
// beyond the driver: that the disk is full.)
func translate(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	if ctx != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// modernc interrupts a statement when its context ends; report
		// the cause, not SQLITE_INTERRUPT.
		var e *sqlite.Error
		if errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_INTERRUPT || errors.Is(err, sql.ErrTxDone) {
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
	}
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch code := e.Code(); code & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
			return fmt.Errorf("%w: %w", store.ErrConflict, err)
		case sqlite3.SQLITE_CONSTRAINT:
			if code == sqlite3.SQLITE_CONSTRAINT_UNIQUE || code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY ||
				strings.Contains(e.Error(), "UNIQUE constraint failed") {
				return fmt.Errorf("%w: %w", store.ErrDuplicate, err)
			}
		case sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
			return damagedError{err}
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN,
			sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_NOLFS:
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		return err
	}
	// database/sql reports a closed pool or connection with plain errors.
	if errors.Is(err, sql.ErrConnDone) || strings.Contains(err.Error(), "sql: database is closed") {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// damagedError is a driver error reporting a damaged file: shown as
// store.ErrDamaged's message and the driver's, with store.ErrUnavailable
// in the chain too (a server answers unavailable, as for any store
// failure).
type damagedError struct{ err error }

func (e damagedError) Error() string { return store.ErrDamaged.Error() + ": " + e.err.Error() }
func (e damagedError) Unwrap() []error {
	return []error{store.ErrUnavailable, store.ErrDamaged, e.err}
}

// openRoom is the free space below which Open blames a failure to write
// on a full disk: opening writes the -shm file (32 KiB) and, in WAL
// mode, the -wal file's header and the frames of setup's and the
// migrations' commits, so a file system with less cannot open the store
// whatever else is wrong.
const openRoom = 1 << 20

// openFailed is Open's error for err. When err is a failure to write or
// create a file (an I/O error, SQLITE_FULL, SQLITE_CANTOPEN) and the file
// system holding path has less than openRoom free, it says the disk is
// full and where, with syscall.ENOSPC and store.ErrUnavailable in the
// chain: SQLite reports an ENOSPC while sizing the -shm file as a bare
// "disk I/O error (4874)", which names neither.
func openFailed(path string, err error) error {
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch e.Code() & 0xff {
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
			dir := filepath.Dir(path)
			if free, ok := freeBytes(dir); ok && free < openRoom {
				if !errors.Is(err, store.ErrUnavailable) {
					err = fmt.Errorf("%w: %w", store.ErrUnavailable, err)
				}
				return fmt.Errorf("open sqlite %s: no room in %s (%d bytes free): %w: %w", path, dir, free, syscall.ENOSPC, err)
			}
		}
	}
	return fmt.Errorf("open sqlite %s: %w", path, err)
}
