package tmpfs_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/capledger/capledger/internal/tmpfs"
)

// A mounted tmpfs of 1 MiB refuses a write past its size with ENOSPC.
func TestMountIsFullPastItsSize(t *testing.T) {
	dir := tmpfs.Mount(t, "1m")
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for written := 0; ; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write after %d bytes: %v, want ENOSPC", written, err)
			}
			if written > 2<<20 {
				t.Fatalf("%d bytes written to a 1 MiB tmpfs", written)
			}
			return
		}
	}
}
