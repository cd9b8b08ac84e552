package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/internal/testport"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

// startInProcess runs `capledger serve` through run() on a free loopback
// port over a fresh data directory, and stops it (gracefully, through the
// context) when the test ends. It returns the server's http:// URL.
func startInProcess(t *testing.T, extra ...string) string {
	t.Helper()
	addr, _ := serveInProcess(t, extra...)
	return "http://" + addr
}

// serveInProcess is startInProcess returning the listening host:port and
// the server's log.
func serveInProcess(t *testing.T, extra ...string) (string, *lockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan int, 1)
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, extra...)
	go func() {
		done <- run(ctx, &env{stdout: logs, stderr: logs, getenv: func(string) string { return "" }}, args)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("serve exited %d:\n%s", code, logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := listeningLine.FindStringSubmatch(logs.String()); m != nil {
			return m[1], logs
		}
		select {
		case code := <-done:
			done <- code // for the cleanup, which waits for it
			t.Fatalf("serve exited %d:\n%s", code, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cli runs one capledger command against url and returns its exit code,
// stdout and stderr.
func cli(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string {
		if k == "CAPLEDGER_ADDR" {
			return url
		}
		return ""
	}}
	code := run(context.Background(), e, args)
	return code, stdout.String(), stderr.String()
}

func wantExit(t *testing.T, want int, code int, stdout, stderr string) {
	t.Helper()
	if code != want {
		t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, want, stdout, stderr)
	}
}

const policyYAML = `# tenant-7 on chat.generate
subject: tenant-7
route: chat.generate
holdTtl: 30s
dimensions:
  - unit: tokens
    burst: 1000
    refillUnits: 100
    refillInterval: 1s
  - unit: requests
    burst: 10
    refillUnits: 1
    refillInterval: 1s
`

func TestCLIAgainstServer(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := cli(t, url, "policy", "publish", policyPath)
	wantExit(t, exitOK, code, out, errOut)
	var published map[string]any
	if err := json.Unmarshal([]byte(out), &published); err != nil || published["generation"] != "1" || published["holdTtl"] != "30s" {
		t.Fatalf("publish printed %s (%v)", out, err)
	}

	// get --format yaml prints the file form; publishing it again is a
	// replay of the same terms.
	code, out, errOut = cli(t, url, "policy", "get", "1", "--format", "yaml")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "holdTtl: 30s") || !strings.Contains(out, "refillInterval: 1s") {
		t.Fatalf("yaml form:\n%s", out)
	}
	roundTrip := filepath.Join(dir, "again.yaml")
	os.WriteFile(roundTrip, []byte(out), 0o600)
	code, out, errOut = cli(t, url, "policy", "publish", roundTrip)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(errOut, "nothing new published") {
		t.Fatalf("republish of the same terms: %s", errOut)
	}

	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600,requests=1", "--id", "req-1")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"state": "RESERVATION_STATE_RESERVED"`) {
		t.Fatalf("reserve printed %s", out)
	}
	// Without --id an id is generated and shown.
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(errOut, "reservation id ") {
		t.Fatalf("generated id not shown: %s", errOut)
	}
	// Rejected by capacity: exit 2, with the reason and Retry-After.
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600", "--id", "req-2")
	wantExit(t, exitRejected, code, out, errOut)
	if !strings.Contains(errOut, "INSUFFICIENT_CAPACITY") || !strings.Contains(errOut, "Retry-After") {
		t.Fatalf("rejection message: %s", errOut)
	}

	// start and settle take the id as their argument too, as release,
	// mark-unknown and get do (and --id, the same id given both ways).
	code, out, errOut = cli(t, url, "start", "req-1", "--operation", "op-1")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "start", "--id", "req-1", "req-1", "--operation", "op-1")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "settle", "req-1", "--operation", "op-1", "--units", "tokens=200,requests=1")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"tokens": "400"`) {
		t.Fatalf("settle did not show the refund: %s", out)
	}
	// A different settle of the same reservation: exit 4, with the state.
	code, out, errOut = cli(t, url, "settle", "--id", "req-1", "--operation", "op-1", "--units", "tokens=300,requests=1")
	wantExit(t, exitConflict, code, out, errOut)
	if !strings.Contains(errOut, "RESERVATION_ALREADY_SETTLED") || !strings.Contains(errOut, "is SETTLED") {
		t.Fatalf("conflict message: %s", errOut)
	}
	code, out, errOut = cli(t, url, "release", "req-1")
	wantExit(t, exitConflict, code, out, errOut)

	code, out, errOut = cli(t, url, "get", "req-1")
	wantExit(t, exitOK, code, out, errOut)
	// The reservation itself (limitReservation.v1, as help says), not the
	// answer that wraps it.
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || got["reservationId"] != "req-1" || got["state"] != "RESERVATION_STATE_SETTLED" {
		t.Fatalf("get printed %s (%v)", out, err)
	}
	code, out, errOut = cli(t, url, "get", "never-reserved")
	wantExit(t, exitNotFound, code, out, errOut)

	code, out, errOut = cli(t, url, "account", "--subject", "tenant-7", "--route", "chat.generate")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"spent": "200"`) {
		t.Fatalf("account printed %s", out)
	}
	code, out, errOut = cli(t, url, "policy", "list")
	wantExit(t, exitOK, code, out, errOut)
	// record: usage nothing reserved, beyond what is free, is recorded as
	// debt; a retry replays, other usage under the id is a conflict.
	code, out, errOut = cli(t, url, "record", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=50000", "--id", "resp-1")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"state": "RESERVATION_STATE_SETTLED_WITH_DEBT"`) || !strings.Contains(errOut, "debt") {
		t.Fatalf("record printed %s / %s", out, errOut)
	}
	code, out, errOut = cli(t, url, "record", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=50000", "--id", "resp-1")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"replayed": true`) {
		t.Fatalf("record retry printed %s", out)
	}
	code, out, errOut = cli(t, url, "record", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=50001", "--id", "resp-1")
	wantExit(t, exitConflict, code, out, errOut)
	code, out, errOut = cli(t, url, "audit")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "audit", "--since-checkpoint", "--progress")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(errOut, "audit [") || !strings.Contains(errOut, "100%") || !strings.Contains(out, "checkedAt") {
		t.Fatalf("audit --progress printed %q / %q", out, errOut)
	}
	code, out, errOut = cli(t, url, "policy", "rollback", "1")
	wantExit(t, exitOK, code, out, errOut)
	// Nothing admits after the rollback: no policy is "not found".
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=1", "--id", "req-3")
	wantExit(t, exitNotFound, code, out, errOut)
}

func TestCLIUsageErrors(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("subject: a\nroute: b\nholdTime: 30s\ndimensions: [{unit: tokens, burst: 5}]\n"), 0o600)
	badDuration := filepath.Join(dir, "duration.yaml")
	os.WriteFile(badDuration, []byte("subject: a\nroute: b\nholdTTL: thirty\ndimensions: [{unit: tokens, burst: 5}]\n"), 0o600)
	invalid := filepath.Join(dir, "invalid.yaml")
	os.WriteFile(invalid, []byte("subject: a\nroute: b\ndimensions: [{unit: tokens, burst: 0}]\n"), 0o600)
	// Two policies in one file: the second was dropped without a word and
	// the first published; nothing is published now.
	twoPolicies := filepath.Join(dir, "two.yaml")
	os.WriteFile(twoPolicies, []byte("subject: a\nroute: b\ndimensions: [{unit: tokens, burst: 5}]\n---\nsubject: c\nroute: b\ndimensions: [{unit: tokens, burst: 5}]\n"), 0o600)

	for _, c := range []struct {
		args []string
		want int
		says string
	}{
		{[]string{}, exitUsage, "Commands:"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"reserve", "--subject", "t"}, exitUsage, "required"},
		{[]string{"reserve", "--subject", "t", "--route", "r", "--units", "tokens"}, exitUsage, "unit=amount"},
		{[]string{"reserve", "--bogus"}, exitUsage, "bogus"},
		{[]string{"settle", "--id", "x"}, exitUsage, "required"},
		{[]string{"settle", "x"}, exitUsage, "required"},
		{[]string{"start", "--operation", "op"}, exitUsage, "a reservation id is required"},
		{[]string{"start", "x", "y", "--operation", "op"}, exitUsage, "want one reservation id"},
		{[]string{"settle", "x", "--id", "y", "--operation", "op"}, exitUsage, "reservation id given twice"},
		{[]string{"get"}, exitUsage, "required"},
		{[]string{"policy"}, exitUsage, "subcommand"},
		{[]string{"policy", "get", "zero"}, exitUsage, "positive integer"},
		{[]string{"policy", "publish", filepath.Join(dir, "missing.yaml")}, exitUsage, "no such file"},
		{[]string{"policy", "publish", bad}, exitUsage, "holdTime"},
		{[]string{"policy", "publish", badDuration}, exitUsage, "30s, 5m, 1h"},
		{[]string{"policy", "publish", invalid}, exitUsage, "INVALID_POLICY"},
		{[]string{"policy", "publish", twoPolicies}, exitUsage, "more than one document"},
		{[]string{"reserve", "--subject", "t", "--route", "r", "--units", "x=1", "--addr", "ftp://host"}, exitUsage, "http://"},
		// A --timeout that cannot wait for any answer is a bad flag (1),
		// not an unavailable server (5).
		{[]string{"audit", "--timeout", "0s"}, exitUsage, "--timeout 0s: want a duration above 0"},
		{[]string{"get", "--id", "x", "--timeout", "-1s"}, exitUsage, "--timeout -1s"},
		{[]string{"status", "--timeout", "0s"}, exitUsage, "--timeout 0s"},
		{[]string{"backlog", "--timeout", "0s"}, exitUsage, "--timeout 0s"},
		{[]string{"serve", "--addr", "0.0.0.0:0", "--data-dir", dir}, exitUsage, "--tokens"},
		{[]string{"serve", "--tokens", filepath.Join(dir, "missing-tokens")}, exitUsage, "tokens file"},
	} {
		code, out, errOut := cli(t, url, c.args...)
		if code != c.want || !strings.Contains(out+errOut, c.says) {
			t.Errorf("capledger %v: exit %d (want %d), output lacks %q:\n%s%s", c.args, code, c.want, c.says, out, errOut)
		}
	}
}

func TestCLIHelpTeaches(t *testing.T) {
	for name := range commands {
		code, out, errOut := cli(t, "", name, "--help")
		if code != exitOK {
			t.Fatalf("%s --help: exit %d: %s", name, code, errOut)
		}
		if !strings.Contains(out, "Usage:") || !strings.Contains(out, "Example") || !strings.Contains(out, "Exit codes") {
			t.Errorf("%s --help lacks usage, an example or the exit codes:\n%s", name, out)
		}
	}
	code, out, _ := cli(t, "", "help", "settle")
	if code != exitOK || !strings.Contains(out, "refunds the unused") {
		t.Fatalf("help settle: %d %s", code, out)
	}
}

func TestCLIUnavailableServer(t *testing.T) {
	addr := testport.Addr(t) // nothing listens here now
	code, out, errOut := cli(t, "http://"+addr, "get", "x")
	wantExit(t, exitUnavailable, code, out, errOut)
}

// discrepantLedger answers Audit with one discrepancy. A sound ledger
// cannot be made unsound through the API, so the exit code of a failing
// audit is checked against this stand-in server.
type discrepantLedger struct {
	capledgerv1connect.UnimplementedLedgerServiceHandler
}

func (discrepantLedger) Audit(context.Context, *connect.Request[v1.AuditRequest]) (*connect.Response[v1.AuditResponse], error) {
	return connect.NewResponse(&v1.AuditResponse{Discrepancies: []*v1.Discrepancy{{Check: "conservation", Account: "t/r@global#1", Detail: "off by one"}}}), nil
}

func TestCLIAuditDiscrepanciesExit6(t *testing.T) {
	path, handler := capledgerv1connect.NewLedgerServiceHandler(discrepantLedger{})
	mux := http.NewServeMux()
	mux.Handle(path, handler)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()
	code, out, errOut := cli(t, "http://"+ln.Addr().String(), "audit")
	wantExit(t, exitDiscrepancies, code, out, errOut)
	if !strings.Contains(out, "off by one") || !strings.Contains(errOut, "1 discrepancy\n") {
		t.Fatalf("audit output: %s / %s", out, errOut)
	}
}

func TestCLIAuthToken(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("admin-secret-0123456789 admin ops\ngateway-secret-0123456789 gateway gw\n"), 0o600)
	url := startInProcess(t, "--tokens", tokens)
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte(policyYAML), 0o600)

	code, out, errOut := cli(t, url, "policy", "publish", policy)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "unauthenticated") {
		t.Fatalf("no token: %s", errOut)
	}
	code, out, errOut = cli(t, url, "policy", "publish", policy, "--token", "gateway-secret-0123456789")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "permission_denied") {
		t.Fatalf("gateway token: %s", errOut)
	}
	code, out, errOut = cli(t, url, "policy", "publish", policy, "--token", "admin-secret-0123456789")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=1",
		"--token", "gateway-secret-0123456789")
	wantExit(t, exitOK, code, out, errOut)

	// The audit is a streaming call (AuditService.StreamAudit): the token
	// must reach it too, with or without the progress bar.
	code, out, errOut = cli(t, url, "audit")
	wantExit(t, exitUsage, code, out, errOut)
	for _, args := range [][]string{{"audit"}, {"audit", "--since-checkpoint", "--progress"}} {
		code, out, errOut = cli(t, url, append(args, "--token", "admin-secret-0123456789")...)
		wantExit(t, exitOK, code, out, errOut)
		if !strings.Contains(out, "checkedAt") {
			t.Fatalf("%v printed %q / %q", args, out, errOut)
		}
	}
}

func TestMigrate(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "schema at version") {
		t.Fatalf("migrate printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "capledger.db")); err != nil {
		t.Fatalf("no database file after migrate: %v", err)
	}
	code, out, errOut = cli(t, "", "migrate", "--store", "bogus:thing")
	wantExit(t, exitUsage, code, out, errOut)
	if strings.Count(errOut, "migrate:") != 1 || !strings.Contains(errOut, "open store: unknown store") {
		t.Fatalf("migrate of a bogus store says %q: want the command named once, then the cause", errOut)
	}

	dsn := postgresSchema(t)
	for range 2 { // the second run finds the schema current
		code, out, errOut = cli(t, "", "migrate", "--store", dsn)
		wantExit(t, exitOK, code, out, errOut)
	}
	if !strings.Contains(out, "already at version") {
		t.Fatalf("second postgres migrate printed %q", out)
	}
}

// A PostgreSQL that cannot be reached is exit 5, the general rule for an
// unavailable store (--help's exit codes, README), not 1: a deploy script
// retries a 5 and stops on a 1 (bad flags, a schema newer than the
// binary). Nothing listens on 47701 (this package's test port range).
func TestMigrateUnreachablePostgresExits5(t *testing.T) {
	code, out, errOut := cli(t, "", "migrate", "--store", "postgres://postgres@127.0.0.1:47701/test?sslmode=disable&connect_timeout=5")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(errOut, "migrate: connect") {
		t.Fatalf("migrate of an unreachable PostgreSQL says %q", errOut)
	}
}

// migrate's errors name the command once ("capledger migrate: "), then
// the step that failed: PostgreSQL unreachable, a schema a newer binary
// migrated, a search_path naming no schema, and a SQLite file a newer
// binary migrated (it said "migrate: migrate: connect" before).
func TestMigrateErrorNamesTheCommandOnce(t *testing.T) {
	once := func(t *testing.T, errOut, cause string) {
		t.Helper()
		if strings.Count(errOut, "migrate:") != 1 || !strings.HasPrefix(errOut, "capledger migrate: ") || !strings.Contains(errOut, cause) {
			t.Errorf("migrate says %q: want \"capledger migrate: \" once, then %q", errOut, cause)
		}
	}
	code, out, errOut := cli(t, "", "migrate", "--store", "postgres://postgres@127.0.0.1:47251/test?sslmode=disable&connect_timeout=5")
	wantExit(t, exitUnavailable, code, out, errOut)
	once(t, errOut, "capledger migrate: connect: ")

	dir := t.TempDir()
	code, out, errOut = cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitOK, code, out, errOut)
	db, err := sql.Open("sqlite", filepath.Join(dir, "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO schema_migrations (version, name) VALUES (?, 'from_the_future')`, sqlite.SchemaVersion()+1)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitUsage, code, out, errOut)
	once(t, errOut, "this binary knows up to")

	dsn := postgresSchema(t)
	u, err := neturl.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "capledger_cli_no_such_schema")
	u.RawQuery = q.Encode()
	code, out, errOut = cli(t, "", "migrate", "--store", u.String())
	wantExit(t, exitUsage, code, out, errOut)
	once(t, errOut, "capledger migrate: no schema of the search_path")

	code, out, errOut = cli(t, "", "migrate", "--store", dsn)
	wantExit(t, exitOK, code, out, errOut)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(context.Background(), `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future')`, postgres.SchemaVersion()+1)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "", "migrate", "--store", dsn)
	wantExit(t, exitUsage, code, out, errOut)
	once(t, errOut, "does not know: a newer capledger migrated it")
}

// serve exits 5 when its store cannot be reached, the general rule for an
// unavailable store (a supervisor retries), not 1 (bad flags or config).
func TestServeUnreachablePostgresExits5(t *testing.T) {
	code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:47301", "--store", "postgres://postgres@127.0.0.1:47302/test?sslmode=disable&connect_timeout=5")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(errOut, "127.0.0.1:47302") {
		t.Fatalf("serve on an unreachable PostgreSQL says %q", errOut)
	}
}

// postgresSchema returns a DSN for a fresh schema on the test server
// (dropped when the test ends), or skips without CAPLEDGER_TEST_POSTGRES.
func postgresSchema(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("CAPLEDGER_TEST_POSTGRES")
	if dsn == "" {
		t.Skip("CAPLEDGER_TEST_POSTGRES is not set (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable)")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("CAPLEDGER_TEST_POSTGRES: %v", err)
	}
	defer conn.Close(ctx)
	var random [6]byte
	rand.Read(random[:])
	schema := "capledger_cli_" + hex.EncodeToString(random[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Error(err)
		}
	})
	u, err := neturl.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestTwoReplicasOnPostgres runs two `capledger serve` replicas on one
// PostgreSQL schema and reserves through both at once: neither oversells
// (exactly burst/size reservations fit) and the audit is clean.
func TestTwoReplicasOnPostgres(t *testing.T) {
	dsn := postgresSchema(t)
	urls := []string{startInProcess(t, "--store", dsn), startInProcess(t, "--store", dsn)}
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(policy, []byte("subject: tenant-7\nroute: chat\nholdTTL: 1h\ndimensions:\n  - unit: tokens\n    burst: 6000\n"), 0o600)
	code, out, errOut := cli(t, urls[0], "policy", "publish", policy)
	wantExit(t, exitOK, code, out, errOut)

	// 40 gateways want 600 each; 6000 tokens fit exactly 10 of them.
	var admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, out, errOut := cli(t, urls[i%2], "reserve", "--subject", "tenant-7", "--route", "chat",
				"--units", "tokens=600", "--id", fmt.Sprintf("gw-%d", i))
			switch code {
			case exitOK:
				admitted.Add(1)
			case exitRejected:
				rejected.Add(1)
			default:
				t.Errorf("reserve gw-%d: exit %d: %s %s", i, code, out, errOut)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 10 || rejected.Load() != 30 {
		t.Fatalf("admitted %d, rejected %d; want 10 and 30", admitted.Load(), rejected.Load())
	}
	code, out, errOut = cli(t, urls[1], "audit")
	wantExit(t, exitOK, code, out, errOut)
}

// TestLongKeysOnPostgres: a subject, route and region of
// ledger.MaxKeyBytes each are kept on PostgreSQL (its index rows of the
// three stay under 2,704 bytes), and a longer subject is refused as
// invalid (exit 1), not answered unavailable (exit 5: the index row did
// not fit, the batch failed, and a client retried forever).
func TestLongKeysOnPostgres(t *testing.T) {
	url := startInProcess(t, "--store", postgresSchema(t))
	random := func(n int) string { // incompressible, as PostgreSQL would otherwise shrink it
		b := make([]byte, n/2)
		rand.Read(b)
		return hex.EncodeToString(b)
	}
	subject, route, region := random(ledger.MaxKeyBytes), random(ledger.MaxKeyBytes), random(ledger.MaxKeyBytes)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte("subject: '*'\nroute: "+route+"\nregion: "+region+"\ndimensions:\n  - unit: tokens\n    burst: 100\n"), 0o600)
	code, out, errOut := cli(t, url, "policy", "publish", policy)
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "reserve", "--subject", subject, "--route", route, "--region", region, "--units", "tokens=1", "--id", "max")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "reserve", "--subject", random(3000), "--route", route, "--region", region, "--units", "tokens=1", "--id", "long")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "INVALID_COMMAND") {
		t.Fatalf("a 3000-byte subject: %s", errOut)
	}
	code, out, errOut = cli(t, url, "audit")
	wantExit(t, exitOK, code, out, errOut)
}

// cuttableProxy relays TCP connections to target until cut, which closes
// its listener and every relayed connection (the database unreachable
// from this replica alone); mend listens on the same address again.
type cuttableProxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        []net.Conn
}

func newCuttableProxy(t *testing.T, target string) *cuttableProxy {
	t.Helper()
	p := &cuttableProxy{target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *cuttableProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", p.target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go func() { io.Copy(server, client); server.Close() }()
			go func() { io.Copy(client, server); client.Close() }()
		}
	}()
}

func (p *cuttableProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cuttableProxy) mend(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.serve(ln)
}

// postgresBehindCuttableProxy returns the DSN of a fresh test schema
// reached through a cuttable proxy (connect_timeout 1 s), and the proxy.
func postgresBehindCuttableProxy(t *testing.T) (string, *cuttableProxy) {
	t.Helper()
	u, err := neturl.Parse(postgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCuttableProxy(t, u.Host)
	u.Host = proxy.addr
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return u.String(), proxy
}

// TestWorkerLeaseLapseLogged: a replica whose renewals fail (its database
// unreachable) stops running the workers once its last renewal lapses,
// and says so in its log with "worker lease lost" (docs/OPERATIONS.md,
// "Worker leader"), as it does when another replica takes the lease; it
// logged only the renewals' errors, and "acquired" again once back.
func TestWorkerLeaseLapseLogged(t *testing.T) {
	dsn, proxy := postgresBehindCuttableProxy(t)
	addr, logs := serveInProcess(t, "--store", dsn, "--lease-ttl", "900ms")
	waitFor := func(what string, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for !strings.Contains(logs.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log within %v:\n%s", what, within, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("worker lease acquired", 10*time.Second)
	proxy.cut()
	waitFor("worker lease lost", 5*time.Second)
	var status struct{ Workers struct{ Leader bool } }
	resp, err := http.Get("http://" + addr + "/statusz")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&status)
	resp.Body.Close()
	if status.Workers.Leader {
		t.Fatal("/statusz says leader after the lease was lost")
	}
	proxy.mend(t)
	if n := strings.Count(logs.String(), "worker lease acquired"); n != 1 {
		t.Fatalf("acquired %d times before the store came back", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(logs.String(), "worker lease acquired") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the lease was not taken again once the store came back:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One serve owns a SQLite store (docs/OPERATIONS.md, "Worker leader"): a
// second serve, or a migrate, on the same data directory refuses to start
// while the first runs, instead of leading the workers beside it.
func TestSecondServeOnOneDataDirRefused(t *testing.T) {
	dir := t.TempDir()
	serveInProcess(t, "--data-dir", dir)
	// Bounded, so that a second serve that does start ends the test.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, out, errOut := runWithEnv(ctx, nil, "serve", "--addr", "127.0.0.1:0", "--data-dir", dir)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "another capledger serve") {
		t.Fatalf("second serve: %s", errOut)
	}
	code, out, errOut = cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "stop serve first") {
		t.Fatalf("migrate beside serve: %s", errOut)
	}
	// Another data directory is another store.
	code, out, errOut = cli(t, "", "migrate", "--data-dir", t.TempDir())
	wantExit(t, exitOK, code, out, errOut)
}

// serve and migrate --store sqlite:PATH in a directory that does not exist
// named a lock file the operator never wrote ("lock: open PATH.lock: no
// such file or directory"), and migrate added "stop serve first" to it,
// though no serve ran. Both name the directory now; only a lock another
// process holds says to stop serve.
func TestSQLitePathInAMissingDirectory(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	spec := "sqlite:" + filepath.Join(missing, "ledger.db")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, out, errOut := runWithEnv(ctx, nil, "serve", "--addr", "127.0.0.1:0", "--store", spec)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "directory "+missing+" does not exist") {
		t.Fatalf("serve: %s", errOut)
	}
	code, out, errOut = cli(t, "", "migrate", "--store", spec)
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "directory "+missing+" does not exist") || strings.Contains(errOut, "stop serve first") {
		t.Fatalf("migrate: %s", errOut)
	}
}

// migrate --auto-vacuum converts a SQLite file; asked of a store without
// one it is refused before anything runs, not silently ignored with exit
// 0 (an operator would take that for space given back).
func TestMigrateAutoVacuumOnlyForSQLite(t *testing.T) {
	for _, spec := range []string{"memory", "postgres://postgres@127.0.0.1:1/none?sslmode=disable"} {
		code, out, errOut := cli(t, "", "migrate", "--store", spec, "--auto-vacuum")
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "--auto-vacuum converts a SQLite file") {
			t.Fatalf("migrate --store %s --auto-vacuum says %q", spec, errOut)
		}
	}
	code, out, errOut := cli(t, "", "migrate", "--data-dir", t.TempDir(), "--auto-vacuum")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "auto_vacuum mode 2") {
		t.Fatalf("migrate --auto-vacuum of a SQLite file printed %q", out)
	}
}

// `policy rollback` printed {} when no generation was left active (protojson
// leaves zero values out), so the answer said nothing. It prints both
// fields always: activeGeneration "0" (none) or the one active again, and
// replayed.
func TestPolicyRollbackPrintsEveryField(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 { // generations 1 and 2 (another estimator digest: new terms)
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitOK, code, out, errOut)
		if err := os.WriteFile(path, []byte(policyYAML+"estimatorDigest: v2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct{ gen, want string }{
		{"2", `{"activeGeneration":"1","replayed":false}`},
		{"1", `{"activeGeneration":"0","replayed":false}`},
		{"1", `{"activeGeneration":"0","replayed":true}`},
	} {
		code, out, errOut := cli(t, url, "policy", "rollback", step.gen)
		wantExit(t, exitOK, code, out, errOut)
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(out)); err != nil || compact.String() != step.want {
			t.Errorf("policy rollback %s printed %s (%v), want %s", step.gen, out, err, step.want)
		}
	}
}

// rollout --help's "--by route" entry ended "every request of an enforced
// route is" and went on with the next flag: a sentence cut off when its
// last line was lost. No help text has a line ending in a word that
// cannot end a sentence followed by a new flag's entry, a blank line or
// the end.
func TestCLIHelpHasNoSentenceCutOff(t *testing.T) {
	dangling := regexp.MustCompile(`\b(is|are|the|a|an|of|and|or|by|with|its|when|than)$`)
	flagEntry := regexp.MustCompile(`^  --\S`)
	names := []string{""}
	for name := range commands {
		names = append(names, name)
	}
	for _, name := range names {
		args := []string{"--help"}
		if name != "" {
			args = []string{name, "--help"}
		}
		_, out, errOut := cli(t, "", args...)
		lines := strings.Split(out+errOut, "\n")
		for i, line := range lines {
			line = strings.TrimRight(line, " ")
			if !dangling.MatchString(line) {
				continue
			}
			next := ""
			if i+1 < len(lines) {
				next = lines[i+1]
			}
			if strings.TrimSpace(next) == "" || flagEntry.MatchString(next) {
				t.Errorf("capledger %s --help: a sentence is cut off after %q (next line %q)", name, line, next)
			}
		}
	}
}

// capledger migrate --data-dir with a mistyped directory made a new,
// empty database there and answered as for the real one ("schema at
// version N", with --auto-vacuum "auto_vacuum mode 2"): an operator could
// read it as the conversion of the file meant. It says so when it created
// the database; on an existing one it does not.
func TestMigrateSaysWhenItCreatedTheDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "capledger-dtaa")
	code, out, errOut := cli(t, "", "migrate", "--data-dir", dir, "--auto-vacuum")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "no database was there: created a new one") {
		t.Errorf("migrate of a directory without a database says %q: want that it created one", out)
	}
	code, out, errOut = cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitOK, code, out, errOut)
	if strings.Contains(out, "created") || !strings.Contains(out, "schema at version") {
		t.Errorf("migrate of an existing database says %q", out)
	}
	file := filepath.Join(t.TempDir(), "x.db")
	code, out, errOut = cli(t, "", "migrate", "--store", "sqlite:"+file)
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, "no database was there: created a new one") {
		t.Errorf("migrate of a sqlite: path without a file says %q", out)
	}
}

// A token with a newline in it (a file read with its line end, a pasted
// line) could not be sent as a header: the command exited 5 "unavailable:
// net/http: invalid header field value", which a deploy script retries as
// a server down. It is a bad flag (exit 1) that says what is wrong, for
// --token and $CAPLEDGER_TOKEN alike, on the commands that use the SDK
// (get) and those that do not (status, policy list).
func TestCLITokenWithANewlineIsABadFlag(t *testing.T) {
	url := startInProcess(t)
	for _, args := range [][]string{
		{"policy", "list", "--token", "s3cr3t-token-00000001\n"},
		{"status", "--token", "s3cr3t-token-00000001\r\n"},
		{"get", "x", "--token", "s3cr3t-\ttoken-00000001"},
	} {
		code, out, errOut := cli(t, url, args...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "--token") || !strings.Contains(errOut, "control character") {
			t.Errorf("capledger %q: the message does not say what is wrong with the token:\n%s", args, errOut)
		}
	}
}

// status against an address that is not a capledger server's (a path
// prefix, another service) printed "status: 404 Not Found <nil>": the
// answer's status with a nil error pasted after it. It names what answered,
// and exits 1, the bad --addr (TestCLIAddressExitCodesAgree).
func TestCLIStatusNamesAnUnexpectedAnswer(t *testing.T) {
	url := startInProcess(t)
	code, out, errOut := cli(t, url+"/prefix", "status")
	wantExit(t, exitUsage, code, out, errOut)
	if strings.Contains(errOut, "<nil>") || !strings.Contains(errOut, "/prefix/statusz answered 404 Not Found") {
		t.Errorf("status against a wrong path says:\n%s", errOut)
	}
}

// An operator who put back a data directory a newer binary migrated (or
// restored onto the wrong binary) is told what to do by the refusal
// itself; a "Run `capledger serve --help` for usage" after it points at
// flags that are not the problem. The pointer stays for a bad flag. Run
// through the built binary, as an operator would.
func TestStoreRefusalHasNoUsageHint(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	code, out, errOut := cli(t, "", "migrate", "--data-dir", dir)
	wantExit(t, exitOK, code, out, errOut)
	db, err := sql.Open("sqlite", filepath.Join(dir, "capledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Exec(`INSERT INTO schema_migrations (version, name) VALUES (?, 'from_the_future')`, sqlite.SchemaVersion()+1)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"migrate", "--data-dir", dir},
		{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir},
	} {
		errOut, code := runBinary(t, bin, args...)
		if code != exitUsage || !strings.Contains(errOut, "this binary knows up to") {
			t.Errorf("capledger %v: exit %d, stderr %q: want 1 and the refusal", args, code, errOut)
		}
		if strings.Contains(errOut, "--help` for usage") {
			t.Errorf("capledger %v: a store's refusal points at --help: %q", args, errOut)
		}
	}
	errOut, code = runBinary(t, bin, "migrate", "--data-dir", dir, "--bogus")
	if code != exitUsage || !strings.Contains(errOut, "Run `capledger migrate --help` for usage.") {
		t.Errorf("capledger migrate --bogus: exit %d, stderr %q: want 1 and the pointer to --help", code, errOut)
	}
}

// A second serve (or a migrate) on a data directory a running serve owns is
// refused because of the store, not its flags: the refusal says to stop the
// other process, and no "Run `capledger serve --help` for usage" follows it
// (an operator at 3 a.m. would go looking for a wrong flag). Exit 1 as for
// any store that refuses (docs/OPERATIONS.md, "Migrations and upgrades").
func TestLockedStoreHasNoUsageHint(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	startServer(t, bin, dir)
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir},
		{"migrate", "--data-dir", dir},
	} {
		errOut, code := runBinary(t, bin, args...)
		if code != exitUsage || !strings.Contains(errOut, "is locked: another capledger serve (or migrate) uses this store") {
			t.Errorf("capledger %v: exit %d, stderr %q: want 1 and the lock's refusal", args, code, errOut)
		}
		if strings.Contains(errOut, "--help` for usage") {
			t.Errorf("capledger %v: a locked store points at --help: %q", args, errOut)
		}
	}
}

// An error of a command made of subcommands named the group ("capledger
// policy: ...", "Run `capledger policy --help`") whichever of its
// subcommands failed: at 3 a.m. the line did not say whether publish or
// rollback had refused. It names the subcommand the user ran, in the
// message and in the pointer to --help (which that subcommand answers);
// a word that names no subcommand leaves the group's name.
func TestCLIErrorNamesTheSubcommandRun(t *testing.T) {
	url := startInProcess(t)
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	for _, c := range []struct {
		args        []string
		want        int
		says, usage string // usage: the --help pointer, "" for none
	}{
		{[]string{"policy", "publish", missing}, exitUsage, "capledger policy publish: read policy: ", "capledger policy publish --help"},
		{[]string{"policy", "rollback", "7"}, exitNotFound, "capledger policy rollback: not_found: ", ""},
		{[]string{"policy", "get", "--format", "xml", "1"}, exitUsage, "capledger policy get: ", "capledger policy get --help"},
		{[]string{"rollout", "undo", "nope"}, exitNotFound, "capledger rollout undo: not_found: ", ""},
		{[]string{"shard", "list", "--bogus"}, exitUsage, "capledger shard list: unknown flag --bogus", "capledger shard list --help"},
		{[]string{"legacy", "carve"}, exitUsage, "capledger legacy carve: ", "capledger legacy carve --help"},
		{[]string{"rollback", "7"}, exitNotFound, "capledger rollback: not_found: ", ""},
		{[]string{"policy", "frobnicate"}, exitUsage, "capledger policy: unknown policy subcommand", "capledger policy --help"},
	} {
		code, out, errOut := cli(t, url, c.args...)
		if code != c.want || !strings.HasPrefix(errOut, c.says) {
			t.Errorf("capledger %v: exit %d (want %d), stderr does not begin %q:\n%s%s", c.args, code, c.want, c.says, out, errOut)
		}
		if pointer := "Run `" + c.usage + "` for usage."; c.usage != "" && !strings.Contains(errOut, pointer) {
			t.Errorf("capledger %v: stderr lacks %q:\n%s", c.args, pointer, errOut)
		}
		if c.usage != "" {
			if code, out, errOut := cli(t, url, append(strings.Fields(c.usage)[1:], "--help")...); code != exitOK || !strings.Contains(out, "Usage:") {
				t.Errorf("%s --help: exit %d:\n%s%s", c.usage, code, out, errOut)
			}
		}
	}
}

// serve refusing its shard keys said so twice ("capledger serve: shard
// keys: shard keys: stat ...: no such file or directory"): the keys'
// own errors name them already.
func TestServeShardKeysRefusalSaysItOnce(t *testing.T) {
	dir := t.TempDir()
	malformed := filepath.Join(dir, "malformed-keys")
	if err := os.WriteFile(malformed, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, keys := range []string{filepath.Join(dir, "missing-keys"), malformed} {
		dataDir := filepath.Join(t.TempDir(), "data")
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--data-dir", dataDir, "--shard-keys", keys)
		wantExit(t, exitUsage, code, out, errOut)
		// Refused before the store is opened: no new, empty store is
		// left behind.
		if entries, err := os.ReadDir(dataDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("--shard-keys %s refused: data directory left with %v (%v), want none", keys, entries, err)
		}
		// The refusal is its own line on stderr (after the log, if any).
		_, refusal, _ := strings.Cut("\n"+errOut, "\ncapledger serve: ")
		if !strings.HasPrefix(refusal, "shard keys") || strings.Count(refusal, "shard keys") != 1 || !strings.Contains(refusal, keys) {
			t.Errorf("--shard-keys %s: %q: want \"capledger serve: shard keys\" once, naming the file", keys, errOut)
		}
	}
}
