package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

func init() {
	register(&command{name: "backup", summary: "copy the embedded store (and its shard keys) consistently, while serve runs", help: backupHelp, run: runBackup})
	register(&command{name: "restore", summary: "put a backup in place of the embedded store, audited first, the old files kept", help: restoreHelp, run: runRestore})
}

const backupHelp = `Usage: capledger backup [--data-dir DIR | --store sqlite:PATH] DEST

Backup copies the embedded SQLite store into DEST, a new directory (or an
empty one), as a data directory of its own: DEST/capledger.db, one file
holding one consistent point in time, and DEST/shard-keys, a copy of the
data directory's shard signing keys where there are any (keep them with the
backup: shards in the copy were signed with them; a keys file given to
serve --shard-keys is yours to back up). serve may run meanwhile: the copy
is what one read of the store sees, and serve goes on admitting. A crashed
serve's WAL is read too (its commits are in the copy). The copy keeps the
store's schema as it is, so take one before a migration. DEST/capledger.db
appears only once whole (after the shard keys): a killed backup leaves
capledger.db.partial instead; remove DEST and run it again. A DEST inside
the store's directory is made, with a warning on stderr: it shares the
store's disk, so copy it elsewhere too.

Restore it with "capledger restore", or run "capledger serve --data-dir DEST"
on it. Check it at any time with "capledger audit --data-dir DEST".

Flags:
  --data-dir DIR   data directory of the embedded store (default ./capledger-data)
  --store SPEC     "sqlite" (the default, in --data-dir) or "sqlite:PATH", as
                   serve takes it; PostgreSQL is refused (use its own
                   backups: docs/OPERATIONS.md "Backups")

Example:
  capledger backup --data-dir /var/lib/capledger /backups/capledger-$(date +%F)

Exit codes: 0 copied; 1 bad flags, DEST not empty, no database in the data
directory, a PostgreSQL or memory store; 5 no room for the copy (nothing is
left in DEST).
`

const restoreHelp = `Usage: capledger restore [--data-dir DIR | --store sqlite:PATH] [--no-audit] BACKUP

Restore puts a backup in place of the embedded SQLite store, with serve
stopped (it is refused while serve runs on the data directory). BACKUP is a
directory "capledger backup" made (or any data directory), or a database
file. Restore copies it beside the store, migrates the copy to this binary's
schema and audits it; a copy that fails either leaves the store untouched
(exit 6 and the audit's report for discrepancies). Then the store's file
and its -wal and -shm move into DIR/pre-restore-<UTC time> (delete it once
the restored store is in service) and the copy takes their place: a WAL
left beside the store by a crash is moved away with it, never replayed
onto the backup. Where the data directory has no shard-keys file, the
backup directory's is copied (none from a database file); one that is
there is kept as it is (restore names the backup's keys it lacks).

A restore goes back in time: see docs/OPERATIONS.md "Backups" for what
gateways see afterwards. If a restore is interrupted, run it again: until
then serve and migrate refuse the store (exit 1, naming the
capledger.db.restoring it left).

Flags:
  --data-dir DIR   data directory of the embedded store (default ./capledger-data)
  --store SPEC     "sqlite" (the default, in --data-dir) or "sqlite:PATH", as
                   serve takes it
  --no-audit       skip the audit of the copy (a large store's takes minutes;
                   the copy is still migrated)

Example:
  capledger restore --data-dir /var/lib/capledger /backups/capledger-2026-12-01

Exit codes: 0 restored; 1 bad flags, no backup there, a backup of a newer
schema, serve running on the data directory (stop it first); 5 no room for
the copy; 6 the copy's audit found discrepancies (nothing changed).
`

// shardKeysFile is the keys file serve keeps in its data directory when
// --shard-keys is not given (shardConfig).
const shardKeysFile = "shard-keys"

func runBackup(ctx context.Context, e *env, args []string) error {
	fs := newFlags("backup")
	storeSpec := fs.String("store", "", "")
	dataDir := fs.String("data-dir", defaultDataDir, "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 1, "the backup's directory (DEST)"); err != nil {
		return err
	}
	dest := positional[0]
	db, err := sqliteFile(*storeSpec, *dataDir, "back up")
	if err != nil {
		return err
	}
	if _, err := os.Stat(db); err != nil {
		return usagef("back up %s: %v (check --data-dir)", db, err)
	}
	if err := emptyDir(dest); err != nil {
		return usagef("back up to %s: %v", dest, err)
	}
	// The keys first and the database under another name until it is
	// whole: a backup killed midway leaves no capledger.db in DEST, and
	// one that is there has its keys beside it.
	destDB := filepath.Join(dest, open.DefaultFile)
	partial, destKeys := destDB+".partial", filepath.Join(dest, shardKeysFile)
	// What this run made is removed on failure, nothing else: another
	// backup into the same new DEST meanwhile finds the names taken
	// (O_EXCL, link), fails and leaves that one's files alone.
	keys, copied := "none in "+*dataDir, false
	if copied, err = copyIfThere(filepath.Join(*dataDir, shardKeysFile), destKeys); err != nil {
		return backupError(fmt.Errorf("back up the shard keys: %w", err))
	} else if copied {
		keys = "copied"
	}
	info, err := sqlite.Backup(ctx, db, partial) // removes partial if it fails
	if err == nil {
		if err = os.Link(partial, destDB); err != nil {
			os.Remove(partial)
		} else if err = os.Remove(partial); err == nil {
			err = sqlite.SyncDir(dest)
		}
	}
	if err != nil {
		if copied {
			os.Remove(destKeys)
		}
		return backupError(err)
	}
	fmt.Fprintf(e.stdout, "backed up %s (schema %d, %d bytes) to %s; shard keys: %s\n", db, info.Schema, info.Bytes, destDB, keys)
	if within(dest, filepath.Dir(db)) {
		fmt.Fprintf(e.stderr, "warning: %s is inside %s, on the store's own disk: a lost disk loses the backup too; copy it elsewhere\n", dest, filepath.Dir(db))
	}
	return nil
}

// within reports whether path is dir or lies under it, as absolute paths
// with symbolic links resolved where they exist.
func within(path, dir string) bool {
	resolve := func(p string) string {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return p
	}
	rel, err := filepath.Rel(resolve(dir), resolve(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func runRestore(ctx context.Context, e *env, args []string) error {
	fs := newFlags("restore")
	storeSpec := fs.String("store", "", "")
	dataDir := fs.String("data-dir", defaultDataDir, "")
	noAudit := fs.Bool("no-audit", false, "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 1, "the backup (a directory or a database file)"); err != nil {
		return err
	}
	backup, backupDir := positional[0], ""
	if fi, err := os.Stat(backup); err != nil {
		return usagef("restore from %s: %v", backup, err)
	} else if fi.IsDir() {
		backupDir, backup = backup, filepath.Join(backup, open.DefaultFile)
		if _, err := os.Stat(backup); err != nil {
			return usagef("restore from %s: no %s in it (%v): give a directory capledger backup made, or a database file", backupDir, open.DefaultFile, err)
		}
	}
	db, err := sqliteFile(*storeSpec, *dataDir, "restore")
	if err != nil {
		return err
	}
	unlock, err := open.LockSQLite(*storeSpec, *dataDir)
	if err != nil {
		return lockError(err, ": stop serve first")
	}
	defer unlock()

	var report error
	aside, err := sqlite.Restore(ctx, backup, db, time.Now(), func(ctx context.Context, copy string) error {
		st, err := sqlite.Open(ctx, copy) // migrates it
		if err != nil {
			return err
		}
		if err := st.Close(); err != nil || *noAudit {
			return err
		}
		fmt.Fprintf(e.stderr, "auditing the copy of %s...\n", backup)
		ro, err := sqlite.OpenReadOnly(ctx, copy)
		if err != nil {
			return err
		}
		defer ro.Close()
		eng := engine.New(ro, engine.Options{DisableWorkers: true})
		defer eng.Close()
		found, err := eng.AuditWith(ctx, engine.AuditOptions{})
		if err != nil {
			return err
		}
		if len(found) > 0 {
			report = printAuditReport(e.stdout, server.AuditReport(found, time.Now()))
			return errRestoreUnsound
		}
		return nil
	})
	switch {
	case errors.Is(err, errRestoreUnsound):
		if report == nil {
			report = fmt.Errorf("the backup %s fails its audit (report above); the store is unchanged", backup)
		}
		return report
	case err != nil && aside != "":
		return backupError(fmt.Errorf("restore from %s: %w (the replaced files moved so far are in %s: run restore again once fixed)", backup, err, aside))
	case err != nil:
		return backupError(fmt.Errorf("restore from %s: %w (the store is unchanged unless it says otherwise)", backup, err))
	}
	fmt.Fprintf(e.stdout, "restored %s from %s\n", db, backup)
	if aside != "" {
		fmt.Fprintf(e.stdout, "the replaced files are in %s (delete it once the restored store is in service)\n", aside)
	}
	if backupDir == "" {
		fmt.Fprintf(e.stdout, "shard keys: none copied (%s is a file; a backup directory's shard-keys is copied where %s has none)\n", backup, *dataDir)
	} else {
		keys := filepath.Join(*dataDir, shardKeysFile) // serve's, whatever --store says
		// serve makes --data-dir for its keys even with --store sqlite:PATH.
		if err := os.MkdirAll(*dataDir, 0o700); err != nil {
			return backupError(fmt.Errorf("restored the store, but not the shard keys: %w", err))
		}
		switch copied, err := copyIfThere(filepath.Join(backupDir, shardKeysFile), keys); {
		case errors.Is(err, os.ErrExist):
			fmt.Fprintf(e.stdout, "kept the shard keys in %s\n", keys)
			if missing := missingKeyLines(filepath.Join(backupDir, shardKeysFile), keys); len(missing) > 0 {
				fmt.Fprintf(e.stdout, "warning: %s lacks the backup's keys %s, which signed any shards in it: put their lines from %s above the others in it for those shards to verify\n",
					keys, strings.Join(missing, ", "), filepath.Join(backupDir, shardKeysFile))
			}
		case err != nil:
			return backupError(fmt.Errorf("restored the store, but not the shard keys: %w", err))
		case copied:
			fmt.Fprintf(e.stdout, "copied the backup's shard keys to %s\n", keys)
		}
	}
	return nil
}

// backupError is storeError's exit, and 5 for any full disk, the shard
// keys' copy's included (the help's "no room").
func backupError(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return exitError{code: exitUnavailable, err: err}
	}
	return storeError(err)
}

// errRestoreUnsound is the restore's prepare step finding discrepancies.
var errRestoreUnsound = exitError{code: exitDiscrepancies, err: errors.New("the backup fails its audit")}

// sqliteFile returns the database file of the embedded store spec and
// dataDir name (as serve takes them), or a usage error for PostgreSQL,
// memory and a spec serve refuses.
func sqliteFile(spec, dataDir, what string) (string, error) {
	if path, ok := open.SQLitePath(spec, dataDir); ok {
		return path, nil
	}
	if strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://") {
		return "", usagef("capledger can %s only the embedded SQLite store; back PostgreSQL up with its own tools (pg_basebackup, WAL archiving: docs/OPERATIONS.md \"Backups\")", what)
	}
	if spec == "memory" {
		return "", usagef("the in-memory store has nothing to %s", what)
	}
	return "", usagef("--store %q: want \"sqlite\" or \"sqlite:PATH\"", spec)
}

// emptyDir makes dir if it is not there; one that is must be an empty
// directory.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.MkdirAll(dir, 0o700)
	case err != nil:
		return err
	case len(entries) > 0:
		return errors.New("not empty: give a new directory")
	}
	return nil
}

// copyIfThere copies the file src to dst (a new file, mode 0600, synced)
// and reports whether it did: false where src is not there, os.ErrExist
// where dst is.
func copyIfThere(src, dst string) (bool, error) {
	in, err := os.Open(src)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(out, in)
	if err == nil {
		err = out.Sync()
	}
	if closeErr := out.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		os.Remove(dst)
		return false, err
	}
	return true, sqlite.SyncDir(filepath.Dir(dst))
}

// missingKeyLines returns the key ids of the keys file backup that the
// keys file kept does not hold (both read as serve reads them,
// server.LoadShardKeys), none where either cannot be read.
func missingKeyLines(backup, kept string) []string {
	ids := func(path string) map[string]bool {
		ring, err := server.LoadShardKeys(path)
		if err != nil {
			return nil
		}
		m := map[string]bool{}
		for _, k := range ring.Keys() {
			m[k.KeyID] = true
		}
		return m
	}
	have := ids(kept)
	if have == nil {
		return nil
	}
	var missing []string
	for id := range ids(backup) {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	return missing
}
