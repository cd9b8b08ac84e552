//go:build unix

package sqlite_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/capledger/capledger/store/sqlite"
)

// withUmask runs the rest of the test under umask mask (process-wide:
// the tests that call it are not parallel, so nothing else runs meanwhile).
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// modes returns the permission bits of path and its -wal and -shm, failing
// the test when one is missing.
func modes(t *testing.T, path string) map[string]os.FileMode {
	t.Helper()
	out := map[string]os.FileMode{}
	for _, name := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Base(name)] = fi.Mode().Perm()
	}
	return out
}

// A database Open creates is the owner's only (0600), and so are the
// -wal and -shm SQLite makes beside it, under the usual umask 022, which
// lets SQLite's own default (0644) through: it holds tenants' names and
// usage.
func TestOpenCreatesTheFileOwnerOnly(t *testing.T) {
	withUmask(t, 0o022)
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, insert("rl-1"))
	for name, mode := range modes(t, path) {
		if mode != 0o600 {
			t.Errorf("%s is %v, want -rw------- (0600)", name, mode)
		}
	}
}

// A database that is already there keeps the mode its operator gave it,
// and SQLite gives its -wal and -shm that mode: Open changes no mode.
func TestOpenKeepsAnExistingFilesMode(t *testing.T) {
	withUmask(t, 0o022)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, s, insert("rl-1"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, sfx := range []string{"-wal", "-shm"} {
		if err := os.Remove(path + sfx); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	s, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit(t, s, insert("rl-2"))
	for name, mode := range modes(t, path) {
		if mode != 0o640 {
			t.Errorf("%s is %v, want the operator's -rw-r----- (0640)", name, mode)
		}
	}
}
