// Package tmpfs mounts a size-limited tmpfs for a test that needs a real
// full disk (ENOSPC from the kernel, not a stub): the full-disk tests of
// the SQLite store, the engine and serve. Mounting needs root; without it
// the test is skipped.
package tmpfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Mount mounts a tmpfs of size (mount's size option: "1m", "16m") on a new
// directory in t's temporary directory and returns that directory; it is
// unmounted when t ends. Without the right to mount, t is skipped.
func Mount(t testing.TB, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a size-limited tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}
