package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capledger/capledger/internal/tmpfs"
	"github.com/capledger/capledger/store"
)

// TestOpenFailedOnAFullDiskIsUnavailable: a set-up error Open gets as the
// driver returns it (not translated: setup's own connection and pool
// closes, say), a file that cannot be opened or written, on a disk with
// no room left, becomes an error that names the full disk and wraps both
// syscall.ENOSPC and store.ErrUnavailable, so that serve exits 5, what a
// supervisor retries on, rather than 1; one that translate already
// marked unavailable says so once. Needs root to mount a size-limited
// tmpfs; skipped otherwise.
func TestOpenFailedOnAFullDiskIsUnavailable(t *testing.T) {
	dir := tmpfs.Mount(t, "1m")
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4<<10); ; {
		if _, err := filler.Write(chunk); err != nil {
			break
		}
	}
	filler.Close()
	// The driver's own error for a file it cannot create (SQLITE_CANTOPEN).
	path := filepath.Join(dir, "ledger.db")
	db, err := sql.Open("sqlite", filepath.Join(dir, "missing", "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	raw := db.PingContext(context.Background())
	if raw == nil || errors.Is(raw, store.ErrUnavailable) {
		t.Fatalf("the driver's error for a file it cannot create: %v", raw)
	}
	for name, setupErr := range map[string]error{"as the driver returns it": raw, "translated": translate(nil, raw)} {
		err := openFailed(path, setupErr)
		if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "no room in "+dir) ||
			strings.Count(err.Error(), store.ErrUnavailable.Error()) != 1 {
			t.Errorf("a set-up error %s on a full disk: %v; want it unavailable (once), ENOSPC, naming %s", name, err, dir)
		}
	}
}
