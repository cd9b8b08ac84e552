package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/capledger/capledger/store"
)

// backupStepPages is how many pages a step of Backup copies (4 MiB of 4
// KiB pages). The copy runs in its own process or goroutine, never on
// the store's writer, so its steps need no pauses between them.
const backupStepPages = 1024

// BackupInfo describes a copy Backup made.
type BackupInfo struct {
	// Schema is the copy's schema version (the source's when it began).
	Schema int
	// Bytes is the copy's size.
	Bytes int64
}

// Backup copies the capledger database file at src into a new file dst
// (refused if dst exists) and syncs it and its directory. The copy is
// what one read transaction on src sees, made with SQLite's online
// backup: a server may be writing src meanwhile, and a crashed server's
// WAL beside src is read as SQLite reads it (its commits are in the
// copy). The copy is a single file in rollback-journal mode: reading it
// needs no -wal or -shm, and a store that opens it puts it back in WAL
// mode. The schema is copied as it is, whatever its version (so a copy
// can be taken before a migration). src must be a SQLite database with
// capledger's schema_migrations table; a failure removes dst, and a full
// disk is an error wrapping store.ErrUnavailable and syscall.ENOSPC.
func Backup(ctx context.Context, src, dst string) (BackupInfo, error) {
	return copyDatabase(ctx, src, dst, "back up")
}

// copyDatabase is Backup, its errors beginning with verb and src ("back
// up X: ...", or restore's "copy X: ...").
func copyDatabase(ctx context.Context, src, dst, verb string) (BackupInfo, error) {
	var info BackupInfo
	if err := CheckPath(dst); err != nil {
		return info, err
	}
	if err := checkNoRestore(src); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	db, err := openReadOnlyDB(src, 1)
	if err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, translate(ctx, err))
	}
	defer conn.Close()
	// The read transaction the copy is made in: begun by its first read.
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, translate(ctx, err))
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "ROLLBACK")
	err = conn.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations").Scan(&info.Schema)
	if err != nil {
		return info, fmt.Errorf("%s %s: read the schema version (is it a capledger database?): %w", verb, src, translate(ctx, err))
	}
	var pageSize, pageCount int64
	if err := conn.QueryRowContext(ctx, "PRAGMA page_size").Scan(&pageSize); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, translate(ctx, err))
	}
	// The size as this read transaction sees it, for the no-room error:
	// a backup that fails its first step counts no pages.
	if err := conn.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pageCount); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, translate(ctx, err))
	}
	info.Bytes = pageCount * pageSize

	f, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	done := false
	defer func() {
		f.Close()
		if !done {
			os.Remove(dst)
		}
	}()
	// No journal and no sync while the backup writes: a failed copy is
	// removed whole, and the finished one is synced once below.
	dstDSN, err := dsn(dst, "journal_mode(OFF)", "synchronous(OFF)")
	if err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	copyConn, pages, err := onlineBackup(ctx, conn, dstDSN, backupStepPages, func() {}, func(int, int) {})
	if pages > 0 {
		info.Bytes = int64(pages) * pageSize
	}
	if copyConn != nil {
		err = errors.Join(err, copyConn.Close())
	}
	if err != nil {
		var e *sqlite.Error
		if errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL {
			return info, fmt.Errorf("%w: %s %s: no room in %s for a copy of the database (%d bytes): %w", store.ErrUnavailable, verb, src, filepath.Dir(dst), info.Bytes, syscall.ENOSPC)
		}
		return info, fmt.Errorf("%s %s: %w", verb, src, translate(ctx, err))
	}
	if err := rollbackHeader(f); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	if err := f.Sync(); err != nil {
		return info, fmt.Errorf("%s %s: sync %s: %w", verb, src, dst, err)
	}
	if err := SyncDir(filepath.Dir(dst)); err != nil {
		return info, fmt.Errorf("%s %s: %w", verb, src, err)
	}
	done = true
	return info, nil
}

// SyncDir fsyncs the directory dir, so that the names created, renamed
// or removed in it last through a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory %s: %w", dir, err)
	}
	return nil
}

// restoringSuffix names the copy a restore puts beside the database
// (PATH.restoring) until it is renamed over it. While it is there, Open
// refuses the database: a restore killed after it moved the WAL aside
// leaves the file without the commits that WAL held: serve must not run
// on that, nor an audit or a backup pass it for the store
// (ErrRestoreInterrupted; Open, OpenReadOnly, Backup).
const restoringSuffix = ".restoring"

// ErrRestoreInterrupted is the error of Open, OpenReadOnly and Backup for
// a database beside which an interrupted restore left its copy: run the
// restore again.
var ErrRestoreInterrupted = errors.New("an interrupted restore")

// checkNoRestore returns an error wrapping ErrRestoreInterrupted when a
// restore's copy lies beside the database file at path.
func checkNoRestore(path string) error {
	if _, err := os.Lstat(path + restoringSuffix); err == nil {
		return fmt.Errorf("open sqlite %s: %w left %s: run capledger restore again (the files it was replacing are in the newest pre-restore-* directory beside it; docs/OPERATIONS.md, \"Backups\")",
			path, ErrRestoreInterrupted, path+restoringSuffix)
	}
	return nil
}

// restoreSuffixes are the files SQLite keeps beside a database: a
// restore moves them aside with it, since SQLite would replay a WAL left
// beside the restored file onto it, undoing the restore without a word.
var restoreSuffixes = []string{"-wal", "-shm", "-journal"}

// Restore replaces the database file at path with a copy of the backup
// file backup, for a caller that holds path's lock (no server running on
// it). It copies the backup beside path (Backup, the schema as it is) and
// calls prepare with the copy's name, a file the caller may open, migrate
// and audit; an error from it (or from the copy) removes the copy and
// leaves path as it was. Then, where path exists, it and its -wal, -shm
// and -journal move into a new directory beside it,
// pre-restore-<now in UTC>, which it returns (the database is linked
// there before its WAL moves, so the old state is whole in it at every
// step), and the copy, a single file in rollback-journal mode, is renamed
// over path. The directories are synced. A restore interrupted before the
// rename leaves path as it was, except that its WAL may already have
// moved aside: run it again.
func Restore(ctx context.Context, backup, path string, now time.Time, prepare func(ctx context.Context, copy string) error) (aside string, err error) {
	if err := CheckPath(path); err != nil {
		return "", err
	}
	tmp := path + restoringSuffix
	removeWithSidecars(tmp) // an interrupted restore's
	defer func() {
		if err != nil {
			removeWithSidecars(tmp)
		}
	}()
	if _, err := copyDatabase(ctx, backup, tmp, "copy"); err != nil {
		return "", err
	}
	if err := prepare(ctx, tmp); err != nil {
		return "", err
	}
	// Fold what prepare committed into the file itself: rollback-journal
	// mode checkpoints the WAL and removes it.
	if err := leaveWAL(ctx, tmp); err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(path); err == nil {
		aside = filepath.Join(dir, "pre-restore-"+now.UTC().Format("20060102T150405.000000000Z"))
		if err := os.Mkdir(aside, 0o700); err != nil {
			return "", fmt.Errorf("restore: %w", err)
		}
		base := filepath.Base(path)
		if err := os.Link(path, filepath.Join(aside, base)); err != nil {
			os.Remove(aside)
			return "", fmt.Errorf("restore: keep the replaced database: %w", err)
		}
		for _, sfx := range restoreSuffixes {
			if err := os.Rename(path+sfx, filepath.Join(aside, base+sfx)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return aside, fmt.Errorf("restore: move %s aside: %w", path+sfx, err)
			}
		}
		if err := SyncDir(aside); err != nil {
			return aside, fmt.Errorf("restore: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("restore: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return aside, fmt.Errorf("restore: %w", err)
	}
	if err := SyncDir(dir); err != nil {
		return aside, fmt.Errorf("restore: %w", err)
	}
	return aside, nil
}

// leaveWAL puts the database file at path in rollback-journal mode,
// which checkpoints its WAL into it and removes the WAL.
func leaveWAL(ctx context.Context, path string) error {
	name, err := dsn(path, "busy_timeout(5000)")
	if err != nil {
		return err
	}
	db, err := sql.Open("sqlite", name)
	if err != nil {
		return err
	}
	defer db.Close()
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode=DELETE").Scan(&mode); err != nil {
		return fmt.Errorf("%s: leave WAL mode: %w", path, translate(ctx, err))
	}
	if mode != "delete" {
		return fmt.Errorf("%s: leave WAL mode: journal mode is still %q", path, mode)
	}
	return nil
}

func removeWithSidecars(path string) {
	os.Remove(path)
	for _, sfx := range restoreSuffixes {
		os.Remove(path + sfx)
	}
}
