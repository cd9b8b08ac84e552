package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The plan tests' shared set-up: a connection of its own to a fresh,
// migrated schema, rows seeded in bulk, and the plans PostgreSQL chooses
// (EXPLAIN) or runs (EXPLAIN ANALYZE) on it.

// planConn opens a store on a fresh schema (migrated to the latest
// version), connects to that schema on a connection of its own, closed
// when the test ends, and runs setup on it in order: the rows to seed,
// ANALYZE, the plan_cache_mode the plans are checked under.
func planConn(t *testing.T, setup ...string) *pgx.Conn {
	t.Helper()
	_, dsn := openStore(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	execAll(t, conn, setup...)
	return conn
}

// execAll runs each statement on conn in order, failing the test at the
// first error.
func execAll(t *testing.T, conn *pgx.Conn, statements ...string) {
	t.Helper()
	for _, q := range statements {
		if _, err := conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// reservationRows returns an INSERT of n reservations rl-1 to rl-n (i):
// tenant(i % 10)'s on chat.generate/eu, generation 1, created at i and
// expiring at i + 30, with state, started_at and unknown_at the SQL
// expressions of i given.
func reservationRows(n int, state, startedAt, unknownAt string) string {
	return fmt.Sprintf(`INSERT INTO reservations (id, request_digest, subject, route, region, generation, accounting_epoch,
			reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
			execution_deadline, unknown_at, finished_at, breach)
		SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i %% 10, 'chat.generate', 'eu', 1, 0,
			'{1,0,0,0}', '{0,0,0,0}', '{0,0,0,0}', 'op-' || i, %s, i, i + 30, %s, 0, %s, 0, false
		FROM generate_series(1, %d) AS i`, state, startedAt, unknownAt, n)
}

// accountsInsert is the head of an INSERT of account rows; a SELECT
// of their columns follows.
const accountsInsert = `INSERT INTO accounts (subject, route, region, generation, dims, epoch_start, breaches, version)
	`

// accountRows returns an INSERT of n accounts of dims dimensions, one
// per tenant tenant1 to tenant<n>, on chat.generate/eu, generation 1.
func accountRows(n, dims int) string {
	return accountsInsert + fmt.Sprintf(`SELECT 'tenant' || i, 'chat.generate', 'eu', 1, %d, 0, 0, 1 FROM generate_series(1, %d) AS i`, dims, n)
}

// termsInsert is the head of an INSERT of account_terms rows; a SELECT
// of their columns follows.
const termsInsert = `INSERT INTO account_terms (account_id, dim, opening, minted, overdraft_issued, available, reserved, spent,
		retired_for_emergency, retired_for_move, overdraft_repaid, epoch_opening, epoch_minted,
		epoch_overdraft_issued, epoch_available, epoch_reserved, epoch_spent, epoch_retired_for_emergency,
		epoch_retired_for_move, epoch_overdraft_repaid, refilled_to)
	`

// termRowsOfEveryAccount inserts dimension 0 of every account: 100
// opened and available, in the account and in its epoch.
const termRowsOfEveryAccount = termsInsert +
	`SELECT id, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 0 FROM accounts`

// genericPlan returns the generic plan of query: prepared, then explained
// under force_generic_plan.
func genericPlan(t *testing.T, conn *pgx.Conn, query string, args []any) string {
	t.Helper()
	execAll(t, conn, "DEALLOCATE ALL", "PREPARE unknown_plan AS "+query)
	return explain(t, conn, "EXPLAIN EXECUTE unknown_plan"+literalArgs(args))
}

// explainAnalyze runs query with args under EXPLAIN (ANALYZE, COSTS OFF,
// TIMING OFF) and returns the plan it ran: its nodes, each with its
// "(actual rows=N loops=M)".
func explainAnalyze(t *testing.T, conn *pgx.Conn, query string, args ...any) string {
	t.Helper()
	return explain(t, conn, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "+query, args...)
}

// explain runs the EXPLAIN statement explainSQL with args and returns its
// lines joined.
func explain(t *testing.T, conn *pgx.Conn, explainSQL string, args ...any) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), explainSQL, args...)
	if err != nil {
		t.Fatalf("%s: %v", explainSQL, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", explainSQL, err)
	}
	return strings.Join(lines, "\n")
}

// literalArgs returns EXECUTE's argument list for args, "" for none:
// EXECUTE's parameters are not themselves parameters, but literals.
func literalArgs(args []any) string {
	var literals []string
	for _, a := range args {
		switch v := a.(type) {
		case string:
			literals = append(literals, "'"+strings.ReplaceAll(v, "'", "''")+"'")
		default:
			literals = append(literals, fmt.Sprint(v))
		}
	}
	if len(literals) == 0 {
		return ""
	}
	return "(" + strings.Join(literals, ", ") + ")"
}
