package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capledger/capledger/internal/tmpfs"
)

// TestAuditOnAFullDiskNamesTheAuditOnce: OPERATIONS.md, "On call": on a
// disk without room for the audit's copy of the SQLite database,
// `capledger audit` exits 5 with "audit copy: no room in DIR ...", and
// the message says "audit:" once (the engine names the audit; the server
// answering it named it again: "audit: audit: store unavailable").
func TestAuditOnAFullDiskNamesTheAuditOnce(t *testing.T) {
	dir := tmpfs.Mount(t, "8m")
	data := filepath.Join(dir, "data")
	addr, _ := serveInProcess(t, "--data-dir", data)
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4<<10); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	// Room again before serve stops (cleanups run last first).
	t.Cleanup(func() { os.Remove(filler) })

	code, stdout, stderr := cli(t, "http://"+addr, "audit")
	want := "audit copy: no room in " + data + " for a copy of the database ("
	if code != exitUnavailable || !strings.Contains(stderr, want) {
		t.Fatalf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", code, exitUnavailable, want, stdout, stderr)
	}
	if n := strings.Count(stderr, "audit: "); !strings.HasPrefix(stderr, "capledger audit: unavailable: audit: store unavailable: audit copy: no room") || n != 2 {
		t.Fatalf("stderr %q names the audit %d times after the command's name, want once: \"capledger audit: unavailable: audit: store unavailable: audit copy: ...\"", stderr, n-1)
	}
}
