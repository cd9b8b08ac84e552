package main

import (
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/tmpfs"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

// `capledger backup` copies the store while serve runs and admits; after
// a kill -9 left newer commits in the WAL, `capledger restore` is refused
// while serve runs, then puts the backup in place with the crashed WAL
// moved aside, not replayed onto it (copying the file over the store
// brings r2 back): the restarted server has r1, not r2, and audits sound.
func TestBackupWhileServingThenRestoreOverACrashedWAL(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, open.DefaultFile)
	srv := startServer(t, bin, dir)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte("subject: tenant-7\nroute: chat\nholdTTL: 1h\ndimensions:\n  - unit: tokens\n    burst: 6000\n"), 0o600)
	cliAgainst(t, bin, srv.url, "policy", "publish", policy)
	reserve := func(id string) {
		cliAgainst(t, bin, srv.url, "reserve", "--subject", "tenant-7", "--route", "chat", "--units", "tokens=100", "--id", id)
	}
	reserve("r1")

	// Gateways go on reserving and settling while the copy is made; the
	// copy is one point in time, so it audits sound, and it holds every
	// reservation acknowledged before the backup began and none asked for
	// after it ended.
	const phaseBefore, phaseDuring, phaseAfter = 0, 1, 2
	var phase atomic.Int32
	var mu sync.Mutex
	ackedBefore, sentAfter := map[string]bool{}, map[string]bool{}
	warm, stop, loaded := make(chan struct{}), make(chan struct{}), make(chan int)
	go func() {
		client, n := &http.Client{Timeout: 10 * time.Second}, 0
		for ; ; n++ {
			select {
			case <-stop:
				loaded <- n
				return
			default:
			}
			id := fmt.Sprintf("load-%d", n)
			sent := phase.Load()
			if status, body := post(client, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-7","route":"chat","units":{"tokens":1}}`, id)); status != 200 {
				t.Errorf("reserve %s beside the backup: %d %v", id, status, body)
			}
			mu.Lock()
			if phase.Load() == phaseBefore {
				if ackedBefore[id] = true; len(ackedBefore) == 5 {
					close(warm)
				}
			}
			if sent == phaseAfter {
				sentAfter[id] = true
			}
			mu.Unlock()
			post(client, srv.url, "Release", fmt.Sprintf(`{"reservationId":%q}`, id))
		}
	}()
	<-warm
	backup := filepath.Join(t.TempDir(), "bk")
	phase.Store(phaseDuring)
	out, code := runBinary(t, bin, "backup", "--data-dir", dir, backup)
	phase.Store(phaseAfter)
	for {
		mu.Lock()
		n := len(sentAfter)
		mu.Unlock()
		if n >= 5 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	t.Logf("%d reserves and releases beside the backup", <-loaded)
	if code != exitOK || !strings.Contains(out, "shard keys: copied") {
		t.Fatalf("backup while serving: exit %d, %s", code, out)
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", backup); len(r.Discrepancies) != 0 {
		t.Fatalf("the backup made under load: %+v", r)
	}
	if a, b := fileHash(t, filepath.Join(dir, "shard-keys")), fileHash(t, filepath.Join(backup, "shard-keys")); a != b {
		t.Fatal("the backup's shard keys differ from the data directory's")
	}
	for _, sfx := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(filepath.Join(backup, open.DefaultFile+sfx)); err == nil {
			t.Fatalf("the backup is not one file: %s%s beside it", open.DefaultFile, sfx)
		}
	}
	inCopy := map[string]bool{}
	for _, id := range strings.Fields(querySQL(t, filepath.Join(backup, open.DefaultFile), "SELECT id FROM reservations")) {
		inCopy[id] = true
	}
	for id := range ackedBefore {
		if !inCopy[id] {
			t.Fatalf("%s, acknowledged before the backup began, is not in it", id)
		}
	}
	for id := range sentAfter {
		if inCopy[id] {
			t.Fatalf("%s, reserved after the backup ended, is in it", id)
		}
	}
	reserve("r2")

	// (The running server's own checkpoints write the file: its names
	// are compared, and r2 is read below.)
	before := dirListing(t, dir)
	out, code = runBinary(t, bin, "restore", "--data-dir", dir, backup)
	if code != exitUsage || !strings.Contains(out, "stop serve first") {
		t.Fatalf("restore while serve runs: exit %d, %s", code, out)
	}
	if got := dirListing(t, dir); got != before {
		t.Fatalf("the refused restore changed the data directory: %s, was %s", got, before)
	}
	cliAgainst(t, bin, srv.url, "get", "r2")

	srv.cmd.Process.Kill()
	srv.cmd.Wait()
	if fi, err := os.Stat(db + "-wal"); err != nil || fi.Size() == 0 {
		t.Fatalf("the killed server left no WAL to replay (%v): nothing to test", err)
	}
	if _, err := os.Stat(db + "-shm"); err != nil {
		t.Fatalf("the killed server left no -shm: %v", err)
	}
	// A backup of the crashed store holds what its WAL holds: r2.
	crashed := filepath.Join(t.TempDir(), "crashed")
	if out, code := runBinary(t, bin, "backup", "--data-dir", dir, crashed); code != exitOK {
		t.Fatalf("backup of the crashed store: exit %d, %s", code, out)
	}
	copySrv := startServer(t, bin, crashed)
	cliAgainst(t, bin, copySrv.url, "get", "r2")
	copySrv.cmd.Process.Kill()

	out, code = runBinary(t, bin, "restore", "--data-dir", dir, backup)
	if code != exitOK || !strings.Contains(out, "pre-restore-") || !strings.Contains(out, "kept the shard keys") {
		t.Fatalf("restore: exit %d, %s", code, out)
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "pre-restore-*"))
	if len(aside) != 1 {
		t.Fatalf("replaced files kept in %v, want one directory", aside)
	}
	for _, name := range []string{open.DefaultFile, open.DefaultFile + "-wal", open.DefaultFile + "-shm"} {
		if _, err := os.Stat(filepath.Join(aside[0], name)); err != nil {
			t.Fatalf("the replaced %s was not kept: %v", name, err)
		}
	}
	for _, sfx := range []string{"-wal", "-shm"} {
		if _, err := os.Stat(db + sfx); err == nil {
			t.Fatalf("a %s is left beside the restored store", sfx)
		}
	}

	srv = startServer(t, bin, dir)
	cliAgainst(t, bin, srv.url, "get", "r1")
	if code, out, errOut := cli(t, srv.url, "get", "r2"); code != exitNotFound {
		t.Fatalf("r2, reserved after the backup, after the restore: exit %d\n%s%s", code, out, errOut)
	}
	if out := cliAgainst(t, bin, srv.url, "audit"); !strings.Contains(out, `"discrepancies": []`) {
		t.Fatalf("audit of the restored store: %s", out)
	}
}

// A backup that fails its audit is not restored: exit 6 with the report,
// the store byte for byte as it was and nothing left beside it; with
// --no-audit it is restored as asked.
func TestRestoreRefusesABackupThatFailsItsAudit(t *testing.T) {
	bin, dir, db, backup := backedUpStore(t)
	withSQLite(t, filepath.Join(backup, open.DefaultFile), plantBehindTheJournal)

	before := dirListing(t, dir)
	hash := fileHash(t, db)
	out, code := runBinary(t, bin, "restore", "--data-dir", dir, backup)
	if code != exitDiscrepancies || !strings.Contains(out, "journal_replay") || !strings.Contains(out, "tenant-7") {
		t.Fatalf("restore of an unsound backup: exit %d, %s", code, out)
	}
	if fileHash(t, db) != hash || dirListing(t, dir) != before {
		t.Fatalf("the refused restore changed the data directory: %s, was %s", dirListing(t, dir), before)
	}

	if out, code := runBinary(t, bin, "restore", "--no-audit", "--data-dir", dir, backup); code != exitOK {
		t.Fatalf("restore --no-audit: exit %d, %s", code, out)
	}
	if r := auditBinary(t, bin, exitDiscrepancies, "--data-dir", dir); len(r.Discrepancies) == 0 {
		t.Fatal("restore --no-audit did not put the backup in place")
	}
}

// Into a data directory that has nothing (the machine was lost), a
// restore puts the backup and its shard keys in place and keeps nothing
// aside; a backup of an older schema is copied as it is and migrated by
// the restore.
func TestRestoreIntoAnEmptyDataDirFromAnOlderSchema(t *testing.T) {
	bin := buildBinary(t)
	src := t.TempDir()
	withSQLite(t, filepath.Join(src, open.DefaultFile), fillLedger)
	execSQL(t, filepath.Join(src, open.DefaultFile), fmt.Sprintf("DELETE FROM schema_migrations WHERE version = %d", sqlite.SchemaVersion()))
	os.WriteFile(filepath.Join(src, "shard-keys"), []byte("# keys\n"), 0o600)
	backup := filepath.Join(t.TempDir(), "bk")
	out, code := runBinary(t, bin, "backup", "--data-dir", src, backup)
	if code != exitOK || !strings.Contains(out, fmt.Sprintf("schema %d,", sqlite.SchemaVersion()-1)) {
		t.Fatalf("backup of an older schema: exit %d, %s", code, out)
	}

	dir := filepath.Join(t.TempDir(), "new")
	out, code = runBinary(t, bin, "restore", "--data-dir", dir, backup)
	if code != exitOK || strings.Contains(out, "pre-restore") || !strings.Contains(out, "copied the backup's shard keys") {
		t.Fatalf("restore into an empty data dir: exit %d, %s", code, out)
	}
	if got := dirListing(t, dir); got != "capledger.db shard-keys" {
		t.Fatalf("data dir after the restore: %s", got)
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("the restored store (migrated): %+v", r)
	}
	// --no-audit skips the audit, not the migration.
	dir = filepath.Join(t.TempDir(), "new")
	if out, code := runBinary(t, bin, "restore", "--no-audit", "--data-dir", dir, backup); code != exitOK {
		t.Fatalf("restore --no-audit: exit %d, %s", code, out)
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("the store restored with --no-audit (migrated): %+v", r)
	}
}

// What backup and restore refuse, each with exit 1 and nothing changed:
// a DEST that is not empty, a data directory without a database (none is
// created), PostgreSQL, a backup that is not a database or was written by
// a newer binary.
func TestBackupAndRestoreRefusals(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	db := filepath.Join(dir, open.DefaultFile)
	withSQLite(t, db, fillLedger)

	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "notes"), []byte("mine"), 0o600)
	empty := t.TempDir()
	text := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(text, []byte("not a database\n"), 0o600)
	newer := filepath.Join(t.TempDir(), "newer")
	if out, code := runBinary(t, bin, "backup", "--data-dir", dir, newer); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	execSQL(t, filepath.Join(newer, open.DefaultFile), fmt.Sprintf("INSERT INTO schema_migrations (version, name) VALUES (%d, 'from the future')", sqlite.SchemaVersion()+1))

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a DEST that is not empty", []string{"backup", "--data-dir", dir, full}, "not empty"},
		{"no database in the data dir", []string{"backup", "--data-dir", empty, filepath.Join(t.TempDir(), "x")}, "check --data-dir"},
		{"PostgreSQL", []string{"backup", "--store", "postgres://u@127.0.0.1:1/db", filepath.Join(t.TempDir(), "x")}, "pg_basebackup"},
		{"no DEST", []string{"backup", "--data-dir", dir}, "DEST"},
		{"a backup that is not a database", []string{"restore", "--data-dir", dir, text}, "not a SQLite database"},
		{"a backup that is not there", []string{"restore", "--data-dir", dir, filepath.Join(empty, "missing")}, "missing"},
		{"a backup of a newer schema", []string{"restore", "--data-dir", dir, newer}, "newer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before, hash, fullBefore, emptyBefore := dirListing(t, dir), fileHash(t, db), dirListing(t, full), dirListing(t, empty)
			out, code := runBinary(t, bin, c.args...)
			if code != exitUsage || !strings.Contains(out, c.want) {
				t.Fatalf("exit %d, want %d and %q: %s", code, exitUsage, c.want, out)
			}
			if c.args[0] == "restore" && strings.Contains(out, "back up") {
				t.Fatalf("a refused restore speaks of backing up: %s", out)
			}
			if dirListing(t, dir) != before || fileHash(t, db) != hash || dirListing(t, full) != fullBefore || dirListing(t, empty) != emptyBefore {
				t.Fatalf("the refused %s changed a directory", c.args[0])
			}
		})
	}
}

// querySQL is the rows stmt reads from the SQLite file at path, opened
// read-only, one value a row, separated by spaces.
func querySQL(t *testing.T, path, stmt string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(stmt)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var vals []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(vals, " ")
}

// dirListing is the names in dir, sorted, space-separated, but the
// lock file (restore takes the lock serve takes, which leaves the file).
func dirListing(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != open.DefaultFile+".lock" {
			names = append(names, e.Name())
		}
	}
	return strings.Join(names, " ")
}

// backedUpStore builds the binary, fills a store in a new data directory
// (fillLedger) and backs it up with the binary into a new directory; it
// returns the binary, the data directory, its capledger.db and the backup.
func backedUpStore(t *testing.T) (bin, dir, db, backup string) {
	t.Helper()
	bin = buildBinary(t)
	dir = t.TempDir()
	db = filepath.Join(dir, open.DefaultFile)
	withSQLite(t, db, fillLedger)
	backup = filepath.Join(t.TempDir(), "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", dir, backup); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	return bin, dir, db, backup
}

// A backup onto a disk without room for it exits 5 saying so, and leaves
// nothing in DEST; with room it is made.
func TestBackupOnAFullDisk(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	withSQLite(t, filepath.Join(dir, open.DefaultFile), fillLedger)
	small := tmpfs.Mount(t, "64k")
	dest := filepath.Join(small, "bk")
	out, code := runBinary(t, bin, "backup", "--data-dir", dir, dest)
	if code != exitUnavailable || !strings.Contains(out, "no room in "+dest) {
		t.Fatalf("backup onto a full disk: exit %d, %s", code, out)
	}
	if got := dirListing(t, dest); got != "" {
		t.Fatalf("the failed backup left %s in DEST", got)
	}
	// With shard keys, which fit: the failed backup removes the copy of
	// them it made too.
	writeKeyLine(t, filepath.Join(dir, "shard-keys"), "k-full")
	dest = filepath.Join(small, "bk-keys")
	if out, code := runBinary(t, bin, "backup", "--data-dir", dir, dest); code != exitUnavailable {
		t.Fatalf("backup with shard keys onto a full disk: exit %d, %s", code, out)
	}
	if got := dirListing(t, dest); got != "" {
		t.Fatalf("the failed backup with shard keys left %s in DEST", got)
	}
	dest = filepath.Join(t.TempDir(), "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", dir, dest); code != exitOK {
		t.Fatalf("backup with room: exit %d, %s", code, out)
	}
}

// A backup into the data directory is made, with a warning that it
// shares the store's disk; one beside it gets none.
func TestBackupInsideTheDataDirWarns(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	withSQLite(t, filepath.Join(dir, open.DefaultFile), fillLedger)
	const warning = "on the store's own disk"
	for _, c := range []struct {
		dest string
		warn bool
	}{
		{filepath.Join(dir, "backups", "today"), true},
		{dir + "-backup", false},
		{filepath.Join(dir, "..", filepath.Base(dir)+"-other"), false},
	} {
		out, code := runBinary(t, bin, "backup", "--data-dir", dir, c.dest)
		if code != exitOK || !strings.Contains(out, "backed up") {
			t.Fatalf("backup to %s: exit %d, %s", c.dest, code, out)
		}
		if strings.Contains(out, warning) != c.warn {
			t.Fatalf("backup to %s: want a warning %v: %s", c.dest, c.warn, out)
		}
		if _, err := os.Stat(filepath.Join(c.dest, open.DefaultFile)); err != nil {
			t.Fatalf("backup to %s: %v", c.dest, err)
		}
	}
}
