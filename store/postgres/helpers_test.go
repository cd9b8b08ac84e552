package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store/postgres"
)

// envDSN names the variable holding the test server's DSN; CI sets it to
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
const envDSN = "CAPLEDGER_TEST_POSTGRES"

// serverDSN returns the test server's DSN. Without the variable the test is
// skipped (saying how to set it); with it, an unreachable server fails the
// test, so CI can never pass by silently skipping.
func serverDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(envDSN)
	if dsn == "" {
		t.Skipf("PostgreSQL tests need a server: set %s, e.g. %s=postgres://postgres@127.0.0.1:5432/test?sslmode=disable", envDSN, envDSN)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("%s is set but the server cannot be reached: %v", envDSN, err)
	}
	conn.Close(ctx)
	return dsn
}

// schemaDSN creates a fresh schema capledger_test_<random> on the test
// server, drops it when the test ends, and returns a DSN whose search_path
// selects it, so parallel test packages and runs never share tables.
func schemaDSN(t testing.TB) string {
	t.Helper()
	dsn := serverDSN(t)
	var random [6]byte
	if _, err := rand.Read(random[:]); err != nil {
		t.Fatal(err)
	}
	schema := "capledger_test_" + hex.EncodeToString(random[:])
	replicatest.Admin(t, dsn, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { replicatest.Admin(t, dsn, "DROP SCHEMA "+schema+" CASCADE") })
	return withParam(t, dsn, "search_path", schema)
}

// withParam returns dsn with a connection parameter added (URL or
// key=value form).
func withParam(t testing.TB, dsn, name, value string) string {
	t.Helper()
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("parse %s: %v", envDSN, err)
		}
		q := u.Query()
		q.Set(name, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + name + "=" + value
}

// openStore opens a store on a fresh schema and closes it when the test
// ends.
func openStore(t testing.TB) (*postgres.Store, string) {
	t.Helper()
	dsn := schemaDSN(t)
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dsn
}
