package main

import (
	"context"
	"crypto/rand"
	"errors"
	"github.com/capledger/capledger/server"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/tmpfs"
	"github.com/capledger/capledger/store/open"
)

// With --store sqlite:PATH the shard keys are serve's, in --data-dir
// (made by serve if missing): a restore into a new place makes that
// directory for the backup's keys rather than failing after the store
// was restored.
func TestRestoreWithStorePathCopiesKeysIntoANewDataDir(t *testing.T) {
	bin := buildBinary(t)
	src := t.TempDir()
	withSQLite(t, filepath.Join(src, open.DefaultFile), fillLedger)
	os.WriteFile(filepath.Join(src, "shard-keys"), []byte("# keys\n"), 0o600)
	backup := filepath.Join(t.TempDir(), "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", src, backup); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	base := t.TempDir()
	db, keysDir := filepath.Join(base, "my.db"), filepath.Join(base, "keys-dir")
	out, code := runBinary(t, bin, "restore", "--store", "sqlite:"+db, "--data-dir", keysDir, backup)
	if code != exitOK || !strings.Contains(out, "copied the backup's shard keys") {
		t.Fatalf("restore --store sqlite:PATH into a new data dir: exit %d, %s", code, out)
	}
	if fileHash(t, filepath.Join(keysDir, "shard-keys")) != fileHash(t, filepath.Join(backup, "shard-keys")) {
		t.Fatal("the backup's shard keys were not copied")
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", db); len(r.Discrepancies) != 0 {
		t.Fatalf("the restored store: %+v", r)
	}
}

// A directory without capledger.db is not a backup: exit 1 naming what
// is missing, and the data directory is not even created.
func TestRestoreFromADirectoryWithoutADatabase(t *testing.T) {
	bin := buildBinary(t)
	notBackup := t.TempDir()
	os.WriteFile(filepath.Join(notBackup, "shard-keys"), []byte("# keys\n"), 0o600)
	dir := filepath.Join(t.TempDir(), "data")
	out, code := runBinary(t, bin, "restore", "--data-dir", dir, notBackup)
	if code != exitUsage || !strings.Contains(out, notBackup+": no capledger.db in it") {
		t.Fatalf("restore from a directory without a database: exit %d, %s", code, out)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("the refused restore created the data directory %s", dir)
	}
}

// A restore without room in the data directory for the copy exits 5
// saying how much it needs, the store byte for byte as it was.
func TestRestoreOnAFullDisk(t *testing.T) {
	bin := buildBinary(t)
	src := t.TempDir()
	withSQLite(t, filepath.Join(src, open.DefaultFile), fillLedger)
	execSQL(t, filepath.Join(src, open.DefaultFile), // more than one step of the online backup (4 MiB)
		"CREATE TABLE pad(b BLOB); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 50) INSERT INTO pad SELECT randomblob(100000) FROM c")
	backup := filepath.Join(t.TempDir(), "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", src, backup); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	small := tmpfs.Mount(t, "64k")
	db := filepath.Join(small, open.DefaultFile)
	os.WriteFile(db, []byte("SQLite format 3\x00 stand-in"), 0o600) // only its bytes are compared
	hash, before := fileHash(t, db), dirListing(t, small)
	out, code := runBinary(t, bin, "restore", "--data-dir", small, backup)
	if code != exitUnavailable || !strings.Contains(out, "no room in "+small) {
		t.Fatalf("restore onto a full disk: exit %d, %s", code, out)
	}
	if m := regexp.MustCompile(`\((\d+) bytes\)`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Fatalf("the no-room error does not say the copy's size: %s", out)
	}
	if fileHash(t, db) != hash || dirListing(t, small) != before {
		t.Fatalf("the failed restore changed the data directory: %s, was %s", dirListing(t, small), before)
	}
}

// A backup killed midway leaves no capledger.db in DEST that a restore
// or serve could take for a backup: DEST holds a whole one or none.
func TestBackupKilledMidwayLeavesNoDatabase(t *testing.T) {
	bin := buildBinary(t)
	src := t.TempDir()
	withSQLite(t, filepath.Join(src, open.DefaultFile), fillLedger)
	execSQL(t, filepath.Join(src, open.DefaultFile),
		"CREATE TABLE pad(b BLOB); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 30000) INSERT INTO pad SELECT randomblob(4000) FROM c")
	os.WriteFile(filepath.Join(src, "shard-keys"), []byte("# keys\n"), 0o600)
	dest := filepath.Join(t.TempDir(), "bk")
	cmd := exec.Command(bin, "backup", "--data-dir", src, dest)
	childproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	written := func() bool {
		entries, _ := os.ReadDir(dest)
		for _, e := range entries {
			if fi, err := e.Info(); err == nil && e.Name() != "shard-keys" && fi.Size() > 0 {
				return true
			}
		}
		return false
	}
	for !written() {
		time.Sleep(100 * time.Microsecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(filepath.Join(dest, open.DefaultFile)); err == nil {
		// Only a whole backup may be there (the kill came too late).
		if r := auditBinary(t, bin, exitOK, "--data-dir", dest); len(r.Discrepancies) != 0 {
			t.Fatalf("the killed backup's capledger.db: %+v", r)
		}
		if _, err := os.Stat(filepath.Join(dest, "shard-keys")); err != nil {
			t.Fatalf("a capledger.db without its shard keys in DEST: %v", err)
		}
	}
}

// Restored into another ledger's data directory, whose shard keys are
// kept, restore says which of the backup's keys they lack; from a
// database file it says no keys were copied.
func TestRestoreSaysWhatBecameOfTheShardKeys(t *testing.T) {
	bin := buildBinary(t)
	src := t.TempDir()
	withSQLite(t, filepath.Join(src, open.DefaultFile), fillLedger)
	writeKeyLine(t, filepath.Join(src, "shard-keys"), "k-old")
	backup := filepath.Join(t.TempDir(), "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", src, backup); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	other := t.TempDir()
	withSQLite(t, filepath.Join(other, open.DefaultFile), fillLedger)
	writeKeyLine(t, filepath.Join(other, "shard-keys"), "k-other")
	out, code := runBinary(t, bin, "restore", "--data-dir", other, backup)
	if code != exitOK || !strings.Contains(out, "kept the shard keys") || !strings.Contains(out, "lacks the backup's keys k-old") {
		t.Fatalf("restore into another ledger's data dir: exit %d, %s", code, out)
	}
	fresh := filepath.Join(t.TempDir(), "data")
	out, code = runBinary(t, bin, "restore", "--data-dir", fresh, filepath.Join(backup, open.DefaultFile))
	if code != exitOK || !strings.Contains(out, "none copied") {
		t.Fatalf("restore from a database file: exit %d, %s", code, out)
	}
	if _, err := os.Stat(filepath.Join(fresh, "shard-keys")); err == nil {
		t.Fatal("restore from a database file copied shard keys")
	}
}

// writeKeyLine writes a keys file of one new signing key named id, as
// capledger shard keygen makes one.
func writeKeyLine(t *testing.T, path, id string) {
	t.Helper()
	line, err := server.NewShardKeyLine(id, rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A disk too full even for the shard keys is "no room" too: exit 5,
// nothing left in DEST.
func TestBackupOnADiskFullBeforeTheKeys(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	withSQLite(t, filepath.Join(dir, open.DefaultFile), fillLedger)
	os.WriteFile(filepath.Join(dir, "shard-keys"), []byte("# keys\n"), 0o600)
	small := tmpfs.Mount(t, "64k")
	f, _ := os.Create(filepath.Join(small, "fill"))
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	f.Close()
	dest := filepath.Join(small, "bk")
	out, code := runBinary(t, bin, "backup", "--data-dir", dir, dest)
	if code != exitUnavailable || !strings.Contains(out, "no space left") {
		t.Fatalf("backup onto a full disk: exit %d, %s", code, out)
	}
	if got := dirListing(t, dest); got != "" {
		t.Fatalf("the failed backup left %s in DEST", got)
	}
}

// Two backups started at once into the same new DEST (a cron job run
// twice): one makes it, the other fails and leaves that one's files
// alone; DEST holds a whole backup with its keys and nothing partial.
func TestTwoBackupsIntoOneDest(t *testing.T) {
	bin := buildBinary(t)
	for _, keys := range []bool{true, false} {
		dir := t.TempDir()
		withSQLite(t, filepath.Join(dir, open.DefaultFile), fillLedger)
		execSQL(t, filepath.Join(dir, open.DefaultFile), "CREATE TABLE pad(b BLOB); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 200) INSERT INTO pad SELECT randomblob(4000) FROM c")
		if keys {
			os.WriteFile(filepath.Join(dir, "shard-keys"), []byte("# keys\n"), 0o600)
		}
		for round := 0; round < 5; round++ {
			dest := filepath.Join(t.TempDir(), "bk")
			codes := make(chan int, 2)
			for range 2 {
				go func() {
					cmd := exec.Command(bin, "backup", "--data-dir", dir, dest)
					childproc.DieWithParent(cmd)
					cmd.Run()
					codes <- cmd.ProcessState.ExitCode()
				}()
			}
			a, b := <-codes, <-codes
			if (a == exitOK) == (b == exitOK) {
				t.Fatalf("keys %v: two backups into one DEST exited %d and %d, want one 0", keys, a, b)
			}
			want := "capledger.db"
			if keys {
				want += " shard-keys"
			}
			if got := dirListing(t, dest); got != want {
				t.Fatalf("keys %v: DEST after two backups into it: %q, want %q", keys, got, want)
			}
			if r := auditBinary(t, bin, exitOK, "--data-dir", dest); len(r.Discrepancies) != 0 {
				t.Fatalf("the backup: %+v", r)
			}
		}
	}
}

// A restore that fails while it moves the old files aside (here a
// -journal that cannot be moved: a mount point) leaves capledger.db
// where it was, whole, so a serve started then does not start on an
// empty store; run again once the cause is gone, it restores.
func TestRestoreFailingWhileMovingAsideKeepsTheStore(t *testing.T) {
	bin, dir, db, backup := backedUpStore(t)
	hash := fileHash(t, db)
	journal := db + "-journal"
	if err := os.Mkdir(journal, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", journal).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v %s", err, out)
	}
	mounted := true
	defer func() {
		if mounted {
			exec.Command("umount", journal).Run()
		}
	}()
	out, code := runBinary(t, bin, "restore", "--data-dir", dir, backup)
	if code == exitOK || !strings.Contains(out, "move "+journal+" aside") || !strings.Contains(out, "run restore again") {
		t.Fatalf("restore with an immovable -journal: exit %d, %s", code, out)
	}
	if fileHash(t, db) != hash {
		t.Fatal("the failed restore left capledger.db changed or missing")
	}
	if out, err := exec.Command("umount", journal).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v %s", err, out)
	}
	mounted = false
	os.Remove(journal)
	if out, code := runBinary(t, bin, "restore", "--data-dir", dir, backup); code != exitOK {
		t.Fatalf("restore run again: exit %d, %s", code, out)
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("the restored store: %+v", r)
	}
}

// A restore killed -9 midway leaves its copy, capledger.db.restoring
// (and perhaps its -wal), beside the store; serve, migrate, audit and
// backup refuse the store, and restore run again replaces the leftover
// and restores.
func TestRestoreRunAgainAfterAKill(t *testing.T) {
	bin, dir, db, backup := backedUpStore(t)
	cmd := exec.Command(bin, "restore", "--data-dir", dir, backup)
	childproc.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	leftover := db + ".restoring"
	for {
		if _, err := os.Stat(leftover); err == nil {
			break
		}
		if done, _ := filepath.Glob(filepath.Join(dir, "pre-restore-*")); len(done) > 0 {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(leftover); err != nil {
		// The kill came too late: leave what such a kill leaves.
		os.WriteFile(leftover, []byte("SQLite format 3\x00 a partial copy"), 0o600)
	}
	if _, err := os.Stat(db); err != nil {
		t.Fatalf("the killed restore left no store: %v", err)
	}
	// serve, migrate, audit and backup refuse the store until the
	// restore is run again: it may have moved the WAL aside already, and
	// an audit or a backup of what is left would pass for the store.
	for _, args := range [][]string{{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, {"migrate", "--data-dir", dir},
		{"audit", "--data-dir", dir}, {"backup", "--data-dir", dir, filepath.Join(t.TempDir(), "bk")}} {
		// A serve that wrongly starts is stopped after a minute (and
		// fails the test), rather than running until the test's timeout.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = withoutAddr()
		out, err := cmd.CombinedOutput()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitUsage || !strings.Contains(string(out), "run capledger restore again") {
			t.Fatalf("%s after a killed restore: %v, %s", args[0], err, out)
		}
	}
	if out, code := runBinary(t, bin, "restore", "--data-dir", dir, backup); code != exitOK {
		t.Fatalf("restore run again: exit %d, %s", code, out)
	}
	if _, err := os.Stat(leftover); err == nil {
		t.Fatal("the restore run again left capledger.db.restoring")
	}
	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("the restored store: %+v", r)
	}
}
