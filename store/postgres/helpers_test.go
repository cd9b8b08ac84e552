package postgres_test

import (
	"context"
	"testing"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store/postgres"
)

// envDSN names the variable holding the test server's DSN
// (replicatest.EnvDSN).
const envDSN = replicatest.EnvDSN

// serverDSN is replicatest.ServerDSN: the test server's DSN, or a skip
// without one.
func serverDSN(t testing.TB) string { t.Helper(); return replicatest.ServerDSN(t) }

// schemaDSN is replicatest.SchemaDSN: a fresh schema, dropped when the
// test ends.
func schemaDSN(t testing.TB) string { t.Helper(); return replicatest.SchemaDSN(t) }

// withParam is replicatest.WithParam: dsn with a connection parameter
// added.
func withParam(t testing.TB, dsn, name, value string) string {
	t.Helper()
	return replicatest.WithParam(t, dsn, name, value)
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
