//go:build unix

package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/capledger/capledger/store/open"
)

// underUmask returns a script that runs bin under umask 022, the usual
// default, which lets SQLite's own 0644 through (the test's own umask may
// be stricter and hide that).
func underUmask(t *testing.T, bin string) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "capledger-umask-022")
	if err := os.WriteFile(script, []byte("#!/bin/sh\numask 022\nexec '"+bin+"' \"$@\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return script
}

// wantModes fails the test for each path (relative to dir) whose
// permission bits are not want's.
func wantModes(t *testing.T, what, dir string, want map[string]os.FileMode) {
	t.Helper()
	for name, mode := range want {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if got := fi.Mode().Perm(); got != mode {
			t.Errorf("%s: %s is %v, want %v", what, name, got, mode)
		}
	}
}

// docs/OPERATIONS.md, "The embedded SQLite store": under umask 022, the
// data directory serve, migrate and restore create is 0700, and
// capledger.db, its -wal and -shm, the lock file and shard-keys 0600 (as
// a backup's files); an existing store keeps the modes it has, but for
// the database a restore replaces.
func TestStoreFilesAreOwnerOnly(t *testing.T) {
	bin := underUmask(t, buildBinary(t))
	base := t.TempDir()
	owner := map[string]os.FileMode{".": 0o700, open.DefaultFile: 0o600, open.DefaultFile + "-wal": 0o600,
		open.DefaultFile + "-shm": 0o600, open.DefaultFile + ".lock": 0o600, "shard-keys": 0o600}

	data := filepath.Join(base, "new", "data") // neither exists yet
	srv := startServer(t, bin, data)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte("subject: tenant-7\nroute: chat\ndimensions:\n  - unit: tokens\n    burst: 6000\n"), 0o600)
	cliAgainst(t, bin, srv.url, "policy", "publish", policy)
	cliAgainst(t, bin, srv.url, "reserve", "--subject", "tenant-7", "--route", "chat", "--units", "tokens=100", "--id", "r1")
	wantModes(t, "serve's new data directory", data, owner)
	srv.cmd.Process.Signal(syscall.SIGTERM)
	srv.cmd.Wait()

	backup := filepath.Join(base, "bk")
	if out, code := runBinary(t, bin, "backup", "--data-dir", data, backup); code != exitOK {
		t.Fatalf("backup: exit %d, %s", code, out)
	}
	wantModes(t, "the backup", backup, map[string]os.FileMode{".": 0o700, open.DefaultFile: 0o600, "shard-keys": 0o600})

	restored := filepath.Join(base, "restored")
	if out, code := runBinary(t, bin, "restore", "--data-dir", restored, backup); code != exitOK {
		t.Fatalf("restore: exit %d, %s", code, out)
	}
	wantModes(t, "a restore into a new data directory", restored,
		map[string]os.FileMode{".": 0o700, open.DefaultFile: 0o600, open.DefaultFile + ".lock": 0o600, "shard-keys": 0o600})

	migrated := filepath.Join(base, "migrated")
	if out, code := runBinary(t, bin, "migrate", "--data-dir", migrated); code != exitOK {
		t.Fatalf("migrate: exit %d, %s", code, out)
	}
	wantModes(t, "migrate's new data directory", migrated, map[string]os.FileMode{".": 0o700, open.DefaultFile: 0o600})
	file := filepath.Join(base, "elsewhere.db")
	if out, code := runBinary(t, bin, "migrate", "--store", "sqlite:"+file); code != exitOK {
		t.Fatalf("migrate --store sqlite:PATH: exit %d, %s", code, out)
	}
	wantModes(t, "migrate's new sqlite:PATH", base, map[string]os.FileMode{"elsewhere.db": 0o600})

	// The operator's modes on an existing store stay: serve changes none,
	// and SQLite gives the -wal and -shm it makes the file's.
	for name, mode := range map[string]os.FileMode{".": 0o750, open.DefaultFile: 0o640} {
		if err := os.Chmod(filepath.Join(restored, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	srv = startServer(t, bin, restored)
	cliAgainst(t, bin, srv.url, "get", "r1")
	wantModes(t, "an existing store", restored, map[string]os.FileMode{".": 0o750, open.DefaultFile: 0o640,
		open.DefaultFile + "-wal": 0o640, open.DefaultFile + "-shm": 0o640})
	srv.cmd.Process.Signal(syscall.SIGTERM)
	srv.cmd.Wait()

	// A restore puts a new file, the backup's copy, in the database's
	// place: it is 0600 again; the directory keeps its mode.
	if out, code := runBinary(t, bin, "restore", "--data-dir", restored, backup); code != exitOK {
		t.Fatalf("restore over the store: exit %d, %s", code, out)
	}
	wantModes(t, "a restore over an existing store", restored, map[string]os.FileMode{".": 0o750, open.DefaultFile: 0o600})
}
