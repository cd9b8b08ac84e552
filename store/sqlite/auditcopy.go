package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// auditCopy is a full audit's copy of the database, made with SQLite's
// online backup inside the audit's read transaction (copyForAudit), and
// a read transaction on it: the audit's streams read the copy as they
// would the live file, and the live read ends as soon as it is copied
// (AuditSnapshot). The copy is a temporary file next to the database,
// unlinked as soon as SQLite has opened it where the system allows it (a
// crash leaves nothing behind), else removed at close. It takes the
// database file's size (free pages included).
type auditCopy struct {
	db *sql.DB
	tx *sql.Tx
	// path is the file to remove at close ("" once unlinked).
	path string
}

// defaultAuditCopyPages is how many pages a step of the copy copies (256
// KiB of 4 KiB pages, about half a millisecond on 2 busy cores) before it
// offers the caller's pacing a pause, which gives the processor up
// between the pauses it takes (engine.AuditWith): a request that became
// runnable waits for a step, not for Go's preemption after 10 ms. (A
// store's auditCopyPages; tests open stores with smaller steps.)
const defaultAuditCopyPages = 64

// auditCopyCacheKiB bounds the page cache of the copy's connection,
// which the backup fills with the pages it writes (spilling them to the
// file when full) and the audit's reads afterwards.
const auditCopyCacheKiB = 2048

// copyForAudit copies the database that src's open read transaction
// sees into a new file in dir with SQLite's online backup and opens a
// read transaction on the copy. The backup steps inside that read
// transaction: a source connection with a read transaction open reads
// every page from its snapshot, and commits by other connections do not
// restart the backup (SQLite restarts it only when the source connection
// begins a new read and finds the database changed), so the copy is the
// transaction's view, whatever is committed meanwhile. Every step of
// stepPages pages offers a pause (store.Pause) with
// progress(pages copied, pages in all). A failure (a full disk: SQLITE_FULL)
// removes the copy and leaves the database as it was.
func copyForAudit(ctx context.Context, dir string, src *sql.Conn, stepPages int, progress func(done, total int) int64) (_ *auditCopy, err error) {
	f, err := os.CreateTemp(dir, ".capledger-audit-*")
	if err != nil {
		return nil, fmt.Errorf("audit copy: %w", err)
	}
	name := f.Name()
	cp := &auditCopy{path: name}
	// f stays open until the copy is made: the header is fixed through it
	// (rollbackHeader). It is closed before the copy is read: closing a
	// file drops every POSIX lock the process holds on it, SQLite's too.
	defer f.Close()
	defer func() {
		if err != nil {
			cp.close()
		}
	}()
	// No journal: the copy is written once, by the backup, and read by
	// this audit alone; a crash leaves nothing to recover. No sync: the
	// file is gone with the process.
	dst, err := dsn(name, "journal_mode(OFF)", "synchronous(OFF)", fmt.Sprintf("cache_size(-%d)", auditCopyCacheKiB))
	if err != nil {
		return nil, fmt.Errorf("audit copy: %w", err)
	}
	var pageSize, size int64 // the copy's size, for a full disk's error
	if err := src.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		return nil, fmt.Errorf("audit copy: %w", translate(ctx, err))
	}
	copyConn, pages, err := onlineBackup(ctx, src, dst, stepPages, func() {
		// SQLite holds the file open from here: unlink it.
		if os.Remove(name) == nil {
			cp.path = ""
		}
	}, func(done, total int) {
		store.Pause(ctx, progress(done, total))
	})
	size = int64(pages) * pageSize
	if err == nil {
		err = rollbackHeader(f)
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		if copyConn != nil {
			copyConn.Close()
		}
		var e *sqlite.Error
		if errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL {
			// The backup reports the destination's failure with the
			// source connection's message ("not an error").
			return nil, fmt.Errorf("%w: audit copy: no room in %s for a copy of the database (%d bytes): %w", store.ErrUnavailable, dir, size, syscall.ENOSPC)
		}
		return nil, fmt.Errorf("audit copy: %w", translate(ctx, err))
	}
	cp.db = sql.OpenDB(&oneConn{conn: copyConn})
	cp.db.SetMaxOpenConns(1)
	if cp.tx, err = cp.db.BeginTx(ctx, nil); err != nil {
		return nil, fmt.Errorf("audit copy: %w", translate(ctx, err))
	}
	return cp, nil
}

// onlineBackup copies the database src's connection reads into the
// database dstDSN names with SQLite's online backup, stepPages pages a
// step: opened is called once SQLite holds the destination open, and
// progress after every step with the pages copied and in all. With a
// read transaction open on src, the copy is that transaction's view
// (commits by other connections do not restart it). It returns the
// destination's connection (the caller closes it) and the pages in all.
func onlineBackup(ctx context.Context, src *sql.Conn, dstDSN string, stepPages int, opened func(), progress func(done, total int)) (copyConn driver.Conn, pages int, err error) {
	err = src.Raw(func(dc any) error {
		conn, ok := dc.(interface {
			NewBackup(dstURI string) (*sqlite.Backup, error)
		})
		if !ok {
			return fmt.Errorf("driver connection %T has no online backup", dc)
		}
		backup, err := conn.NewBackup(dstDSN)
		if err != nil {
			return err
		}
		opened()
		for {
			more, err := backup.Step(int32(stepPages))
			pages = backup.PageCount()
			if err != nil {
				return errors.Join(err, backup.Finish())
			}
			progress(backup.PageCount()-backup.Remaining(), backup.PageCount())
			if err := ctx.Err(); err != nil {
				return errors.Join(err, backup.Finish())
			}
			if !more {
				break
			}
		}
		copyConn, err = backup.Commit()
		return err
	})
	return copyConn, pages, err
}

// rollbackHeader turns the header of a backup of a WAL database, in f,
// into a rollback journal database's (docs: https://www.sqlite.org/fileformat.html):
// the backup copies page 1 as it is, whose read and write versions (2)
// make a connection that reads it open a WAL and its shared memory by the
// file's name, gone once unlinked (SQLITE_IOERR_FSTAT), or else leave two
// files beside the database. It writes versions 1 and a new change
// counter, which makes the copy's connection drop the page 1 it cached
// while writing and read this one.
func rollbackHeader(f *os.File) error {
	var header [100]byte
	if _, err := f.ReadAt(header[:], 0); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	if string(header[:16]) != "SQLite format 3\x00" {
		return errors.New("header: not a SQLite database")
	}
	header[18], header[19] = 1, 1
	counter := binary.BigEndian.Uint32(header[24:]) + 1
	binary.BigEndian.PutUint32(header[24:], counter)
	binary.BigEndian.PutUint32(header[92:], counter) // the page count at 28 is valid for it
	if _, err := f.WriteAt(header[:], 0); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	return nil
}

func (cp *auditCopy) close() {
	if cp.tx != nil {
		cp.tx.Rollback()
	}
	if cp.db != nil {
		cp.db.Close()
	}
	if cp.path != "" {
		os.Remove(cp.path)
	}
}

// oneConn is a connector of one connection made elsewhere (the backup's
// destination): database/sql gets it once, and an error after. Closing
// the DB closes it (database/sql calls a connector's Close) if database/sql
// never took it: a BeginTx whose ctx had ended before it connected.
type oneConn struct {
	mu   sync.Mutex
	conn driver.Conn
}

func (c *oneConn) Connect(context.Context) (driver.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn := c.conn
	if conn == nil {
		return nil, errors.New("audit copy: its connection was closed")
	}
	c.conn = nil
	return conn, nil
}

func (c *oneConn) Driver() driver.Driver { return &sqlite.Driver{} }

func (c *oneConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// auditReservations calls yield with every reservation tx reads, in id
// order, through one reused row holding only the audit's fields
// (fillAuditRow).
func auditReservations(ctx context.Context, tx *sql.Tx, yield func(*ledger.Reservation) error) error {
	var (
		row  ledger.Reservation
		keys = newKeyStrings()
	)
	return auditRows(ctx, tx, func(generation, state int64, packed []byte, lens auditLens) error {
		if err := fillAuditRow(&row, keys, generation, state, packed, lens); err != nil {
			return err
		}
		return yield(&row)
	})
}
