package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/store/postgres"
)

// While the database refuses new connections, /readyz's path check
// (postgres.Store.CheckPath, two connections of its own) runs at most
// once a pathCheckInterval, as when it passes: probes in between answer
// the failure it found, naming it; the first probe a pathCheckInterval
// after the database is back runs it again and passes.
func TestPathCheckFailingIsCheckedOnceAMinute(t *testing.T) {
	dsn := postgresDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	runs := 0
	check := cachedPathCheck(st.SettingsNotInEffect(), func(ctx context.Context) (postgres.PathReport, error) {
		runs++
		return st.CheckPath(ctx)
	}, func() time.Time { return at })
	probe := func() error {
		_, err := check(ctx)
		return err
	}
	if err := probe(); err != nil || runs != 0 {
		t.Fatalf("the first probe: %v after %d runs, want ready on Open's check", err, runs)
	}

	allowConnections(t, dsn, false)
	at = at.Add(pathCheckInterval)
	err = probe()
	if runs != 1 || err == nil || !strings.Contains(err.Error(), "not currently accepting connections") {
		t.Fatalf("a probe a minute on, database refusing connections: %v after %d runs, want the refusal after 1", err, runs)
	}
	for range 5 {
		at = at.Add(pathCheckInterval / 10)
		if again := probe(); again == nil || again.Error() != err.Error() {
			t.Fatalf("a probe %s later: %v, want the failure found (%v)", at.Sub(at.Truncate(time.Hour)), again, err)
		}
	}
	if runs != 1 {
		t.Fatalf("the failing check ran %d times within a minute, want once", runs)
	}

	allowConnections(t, dsn, true)
	at = at.Add(pathCheckInterval / 2)
	if err := probe(); err != nil || runs != 2 {
		t.Fatalf("the first probe a minute after the failure, database back: %v after %d runs, want ready after 2", err, runs)
	}
}

// postgresDatabase creates a database of its own on CAPLEDGER_TEST_POSTGRES's
// server (dropped at the end) and returns its DSN: one a test may close
// to connections without touching anyone else's.
func postgresDatabase(t *testing.T) string {
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
	name := "capledger_cli_" + hex.EncodeToString(random[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	u, err := neturl.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// allowConnections opens or closes dsn's database to new connections
// (ALTER DATABASE ... ALLOW_CONNECTIONS); those already open go on.
func allowConnections(t *testing.T, dsn string, allow bool) {
	t.Helper()
	u, err := neturl.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/" + "postgres"
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" ALLOW_CONNECTIONS "+map[bool]string{true: "true", false: "false"}[allow]); err != nil {
		t.Fatal(err)
	}
}
