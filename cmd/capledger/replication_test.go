package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// readyz returns the status and body of GET /readyz.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// A standalone PostgreSQL (no standbys, fsync and synchronous_commit on)
// cannot lose an acknowledged commit to a failover: serve runs without
// --allow-async-replication and /readyz says what it checked.
func TestServeStandalonePostgresNeedsNoFlag(t *testing.T) {
	dsn := postgresSchema(t)
	addr, _ := serveInProcess(t, "--store", dsn)
	code, body := readyz(t, addr)
	if code != http.StatusOK || !strings.Contains(body, "standalone (no standbys), synchronous_commit=on") {
		t.Fatalf("/readyz %d:\n%s", code, body)
	}
}

// synchronous_commit=off acknowledges commits before they are on disk:
// serve refuses to start on it, saying why, what setting repairs it (it
// told a standalone server's operator to "make the standbys
// synchronous") and which flag accepts the risk; with the flag it starts
// and /readyz keeps warning.
func TestServeRefusesLossyPostgres(t *testing.T) {
	dsn := postgresSchema(t) + "&synchronous_commit=off"
	var logs lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, &env{stdout: &logs, stderr: &logs, getenv: func(string) string { return "" }},
		[]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir(), "--store", dsn})
	out := logs.String()
	if code != exitUsage || !strings.Contains(out, "synchronous_commit is off") || !strings.Contains(out, "set it to on or remote_apply") ||
		strings.Contains(out, "standbys synchronous") || !strings.Contains(out, "--allow-async-replication") {
		t.Fatalf("serve on synchronous_commit=off: exit %d, want %d refusing:\n%s", code, exitUsage, out)
	}

	addr, serveLogs := serveInProcess(t, "--store", dsn, "--allow-async-replication")
	status, body := readyz(t, addr)
	if status != http.StatusOK || !strings.Contains(body, "warning (--allow-async-replication): synchronous_commit is off") {
		t.Fatalf("/readyz %d:\n%s", status, body)
	}
	if !strings.Contains(serveLogs.String(), "acknowledged commits could be lost") {
		t.Errorf("no warning logged:\n%s", serveLogs.String())
	}
}
