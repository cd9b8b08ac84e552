package postgres_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store/postgres"
)

// pgbouncerSchema returns a schema migrated directly on the test server
// and the DSN of a transaction-mode PgBouncer in front of it (pgx's
// default query exec mode), its server connections running serverSetup.
func pgbouncerSchema(t *testing.T, serverSetup string) string {
	t.Helper()
	_, dsn := openStore(t) // creates the schema's tables
	u, _ := url.Parse(dsn)
	return pgbouncer(t, u.Query().Get("search_path"), serverSetup)
}

// Behind PgBouncer 1.18 in transaction mode without exec mode, named
// prepared statements are lost between transactions: Open refuses,
// naming the fix, and `capledger serve` exits with that error instead of
// starting and calling itself ready while every command fails with
// SQLSTATE 26000; Migrate and `capledger migrate` refuse it the same way.
func TestOpenRefusesAPathLosingPreparedStatements(t *testing.T) {
	dsn := pgbouncerSchema(t, "")
	s, err := postgres.Open(context.Background(), dsn)
	if err == nil {
		s.Close()
		t.Fatal("Open behind a transaction-mode PgBouncer without exec mode succeeded")
	}
	if !errors.Is(err, postgres.ErrPreparedStatementsLost) {
		t.Fatalf("Open: %v; want ErrPreparedStatementsLost", err)
	}

	if _, err := postgres.Migrate(context.Background(), dsn); !errors.Is(err, postgres.ErrPreparedStatementsLost) {
		t.Fatalf("Migrate: %v; want ErrPreparedStatementsLost", err)
	}

	bin := replicatest.BuildCapledger(t)
	migrated, err := exec.Command(bin, "migrate", "--store", dsn).CombinedOutput()
	if err == nil || !strings.Contains(string(migrated), "default_query_exec_mode=exec") {
		t.Fatalf("capledger migrate behind the same path: %v, want it refused naming the fix:\n%s", err, migrated)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve", "--addr", replicatest.FreeAddr(t), "--store", dsn, "--data-dir", t.TempDir())
	childproc.DieWithParent(cmd)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("serve still running after 60s behind a path that loses prepared statements:\n%s", out)
	}
	if err == nil {
		t.Fatalf("serve exited 0:\n%s", out)
	}
	t.Logf("serve: %s", out)
	for _, want := range []string{"prepared statements", "default_query_exec_mode=exec", "max_prepared_statements"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("serve's error does not name %q:\n%s", want, out)
		}
	}
}

// With exec mode behind the same PgBouncer, serve is ready and commands
// work; the session settings PgBouncer dropped (ignore_startup_parameters)
// are named in a warning at start, with their fix, and under /readyz.
func TestServeBehindPgBouncerExecModeWarnsOfDroppedSettings(t *testing.T) {
	dsn := pgbouncerSchema(t, "") + "&default_query_exec_mode=exec"
	r := replicatest.StartReplica(t, replicatest.BuildCapledger(t), dsn)
	publishPolicy(t, r.Addr, 1000, 1000)
	c, err := client.New(r.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, id := range []string{"pgb-1", "pgb-2", "pgb-3"} {
		if _, err := c.Reserve(context.Background(), client.ReserveRequest{ReservationID: id,
			Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Units: client.Units{"tokens": 10}}); err != nil {
			t.Fatalf("reserve %d behind PgBouncer in exec mode: %v", i, err)
		}
	}
	resp, err := http.Get("http://" + r.Addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "warning: lock_timeout") {
		t.Errorf("/readyz: %d %q; want 200 naming lock_timeout", resp.StatusCode, body)
	}
	r.Stop()
	logs := r.Logs.String()
	for _, want := range []string{
		`setting=lock_timeout seen=0 want=5s fix="ALTER ROLE postgres SET lock_timeout = '5s'"`,
		`setting=idle_in_transaction_session_timeout seen=0 want=30s fix="ALTER ROLE postgres SET idle_in_transaction_session_timeout = '30s'"`,
	} {
		if !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, want) {
			t.Errorf("serve's log has no warning with %s:\n%s", want, logs)
		}
	}
}

// Settings are compared as the server reads them: lock_timeout set on
// the server connections as 5000 (ms) is the store's '5s', so only the
// setting still dropped is reported; directly on PostgreSQL none is.
func TestCheckPathComparesSettingsAsTheServerReadsThem(t *testing.T) {
	direct, _ := openStore(t)
	if off := direct.SettingsNotInEffect(); len(off) != 0 {
		t.Errorf("directly on PostgreSQL: settings not in effect %v", off)
	}
	s := openMore(t, pgbouncerSchema(t, "SET lock_timeout = 5000")+"&default_query_exec_mode=exec")
	off := s.SettingsNotInEffect()
	if len(off) != 1 || off[0].Name != "idle_in_transaction_session_timeout" || off[0].Seen != "0" || off[0].Want != "30s" {
		t.Fatalf("behind PgBouncer with lock_timeout set on the server connections: %v; want idle_in_transaction_session_timeout alone", off)
	}
}
