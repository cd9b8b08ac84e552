package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// ReservationsDue runs on every worker tick and now reads each listed
// row's state too: it must still reach the due rows through its two
// partial indexes (reservations_due up to now, reservations_expiring for
// the EXPIRING rows ahead of it), never by scanning the table, in the
// generic plan, on a table where few rows are due.
func TestDueQueryUsesItsIndexes(t *testing.T) {
	_, dsn := openStore(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO reservations (id, request_digest, subject, route, region, generation, accounting_epoch,
			reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
			execution_deadline, unknown_at, finished_at, breach)
		SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 0,
			'{1,0,0,0}', '{0,0,0,0}', '{0,0,0,0}', 'op-' || i, i % 8,
			i, i + 30, i + 1, 0, 0, 0, false
		FROM generate_series(1, 20000) AS i`,
		`ANALYZE reservations`,
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	plan := genericPlan(t, conn, postgres.DueSQL, []any{int64(200), 10})
	t.Logf("due:\n%s", plan)
	for _, index := range []string{"reservations_due", "reservations_expiring"} {
		if !strings.Contains(plan, index) {
			t.Errorf("due query does not use %s:\n%s", index, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan") {
		t.Errorf("due query scans the reservations table:\n%s", plan)
	}
}

// The USAGE_UNKNOWN list and backlog must read the partial index
// reservations_usage_unknown_at, never the whole reservations table, and the
// list must not sort: pgx prepares each query and PostgreSQL may switch
// to a generic plan after a few runs, so the generic plan (parameters
// unknown) is what is checked, on a table where USAGE_UNKNOWN rows are 1
// in 100 and the statistics are current.
func TestUnknownQueriesUseTheirIndex(t *testing.T) {
	_, dsn := openStore(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO reservations (id, request_digest, subject, route, region, generation, accounting_epoch,
			reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
			execution_deadline, unknown_at, finished_at, breach)
		SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 0,
			'{1,0,0,0}', '{0,0,0,0}', '{0,0,0,0}', 'op-' || i, CASE WHEN i % 100 = 0 THEN 8 ELSE i % 8 END,
			i, i + 30, i + 1, 0, CASE WHEN i % 100 = 0 THEN i + 2 ELSE 0 END, 0, false
		FROM generate_series(1, 20000) AS i`,
		`ANALYZE reservations`,
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cursor := store.UnknownCursor{MarkedAt: time.Unix(0, 5002), ID: "rl-5000"}
	for _, tc := range []struct {
		name string
		f    store.UnknownFilter
	}{
		{"first page", store.UnknownFilter{Limit: 10}},
		{"first page of a subject and route", store.UnknownFilter{Subject: "tenant0", Route: "chat.generate", Limit: 10}},
		{"page after a cursor", store.UnknownFilter{After: cursor, Limit: 10}},
		{"page of a subject after a cursor", store.UnknownFilter{Subject: "tenant0", After: cursor, Limit: 10}},
	} {
		query, args := postgres.UnknownSQL(tc.f, cursor.MarkedAt.UnixNano())
		plan := genericPlan(t, conn, query, args)
		t.Logf("%s:\n%s", tc.name, plan)
		checkUnknownPlan(t, tc.name, plan)
		if strings.Contains(plan, "Sort") {
			t.Errorf("%s: sorts instead of reading the index in order:\n%s", tc.name, plan)
		}
		if tc.f.After != (store.UnknownCursor{}) && !strings.Contains(plan, "Index Cond: (ROW(unknown_at, id) >") {
			t.Errorf("%s: does not seek the index at the cursor:\n%s", tc.name, plan)
		}
	}
	plan := genericPlan(t, conn, postgres.UnknownBacklogSQL, nil)
	t.Logf("backlog:\n%s", plan)
	checkUnknownPlan(t, "backlog", plan)
}

// A replica's connections live for hours; its tables may be empty when it
// starts and hold millions of rows later, analysed by nobody when
// autovacuum is off or late. Each batch prefetch is prepared and run, as
// pgx runs it, on one of the store's own connections while its table is
// empty and never analysed (a new database), then the table grows by
// 20,000 rows, still unanalysed: the next execution must reach its rows
// through the table's indexes. Under PostgreSQL's default plan cache the
// plan kept from the empty table is a sequential scan of the whole table
// on every batch (singles beside batches collapsed to 12-82 calls/s with
// 4 s prefetches: docs/PERFORMANCE.md).
func TestBatchPrefetchesUseTheIndexAsTablesGrow(t *testing.T) {
	s, _ := openStore(t)
	ctx := context.Background()
	const rows = 20000
	keys := func(prefix string, n int) string { // an array literal of n keys
		var b strings.Builder
		for i := 1; i <= n; i++ {
			if i > 1 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s%d", prefix, i*97%rows+1)
		}
		return "{" + b.String() + "}"
	}
	same := func(v string, n int) string { return "{" + strings.TrimSuffix(strings.Repeat(v+",", n), ",") + "}" }
	// A batch of 10 keys: on 20,000 rows, reading the index costs a
	// fraction of reading the table, in the planner's model as in fact.
	const batch = 10
	accounts := []any{keys("tenant", batch), same("chat.generate", batch), same("eu", batch), same("1", batch)}
	for _, tc := range []struct {
		name, query string
		tables      []string
		fill        []string
		args        []any // one batch's keys
	}{
		{"reservations", postgres.ReservationsPrefetchSQL, []string{"reservations"}, []string{
			`INSERT INTO reservations (id, request_digest, subject, route, region, generation, accounting_epoch,
				reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
				execution_deadline, unknown_at, finished_at, breach)
			SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 0,
				'{1,0,0,0}', '{0,0,0,0}', '{0,0,0,0}', 'op-' || i, 1, i, i + 30, 0, 0, 0, 0, false
			FROM generate_series(1, 20000) AS i`,
		}, []any{keys("rl-", batch)}},
		{"tombstones", postgres.TombstonesPrefetchSQL, []string{"tombstones"}, []string{
			`INSERT INTO tombstones (id, request_digest, subject, route, region, generation, state, finished_at)
			SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 3, i
			FROM generate_series(1, 20000) AS i`,
		}, []any{keys("rl-", batch)}},
		{"policy heads", postgres.PrefetchHeadsSQL, []string{"policy_heads"}, []string{
			`INSERT INTO policy_heads (subject, route, region, active, latest)
			SELECT 'tenant' || i, 'chat.generate', 'eu', 1, 1 FROM generate_series(1, 20000) AS i`,
		}, accounts[:3]},
		{"current generations", postgres.PrefetchCurrentsSQL, []string{"account_currents"}, []string{
			`INSERT INTO account_currents (subject, route, region, generation)
			SELECT 'tenant' || i, 'chat.generate', 'eu', 1 FROM generate_series(1, 20000) AS i`,
		}, accounts[:3]},
		{"accounts", postgres.PrefetchAccountsSQL, []string{"accounts", "account_terms"}, []string{
			`INSERT INTO accounts (subject, route, region, generation, dims, epoch_start, breaches, version)
			SELECT 'tenant' || i, 'chat.generate', 'eu', 1, 1, 0, 0, 1 FROM generate_series(1, 20000) AS i`,
			`INSERT INTO account_terms (account_id, dim, opening, minted, overdraft_issued, available, reserved, spent,
				retired_for_emergency, retired_for_move, overdraft_repaid, epoch_opening, epoch_minted,
				epoch_overdraft_issued, epoch_available, epoch_reserved, epoch_spent, epoch_retired_for_emergency,
				epoch_retired_for_move, epoch_overdraft_repaid, refilled_to)
			SELECT id, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 0 FROM accounts`,
		}, accounts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := postgres.PoolOf(s).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			const stmt = "prefetch_as_tables_grow"
			if _, err := conn.Conn().Prepare(ctx, stmt, tc.query); err != nil {
				t.Fatalf("prepare: %v", err)
			}
			defer conn.Exec(ctx, "DEALLOCATE "+stmt)
			// A replica's first batches, on the empty table: enough
			// runs for PostgreSQL to settle on a plan to keep.
			for range 10 {
				if _, err := conn.Exec(ctx, stmt, tc.args...); err != nil {
					t.Fatalf("run on the empty table: %v", err)
				}
			}
			for _, q := range tc.fill {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			plan := explainExecute(t, conn.Conn(), stmt, tc.args)
			t.Logf("after the table grew:\n%s", plan)
			for _, table := range tc.tables {
				if strings.Contains(plan, "Seq Scan on "+table+" ") {
					t.Errorf("reads every row of %s for one batch:\n%s", table, plan)
				}
			}
			for _, q := range []string{"TRUNCATE reservations, tombstones, policy_heads, account_currents, account_terms",
				"DELETE FROM accounts"} {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
		})
	}
}

// explainExecute returns the plan the prepared statement stmt runs with
// args (array literals) now.
func explainExecute(t *testing.T, conn *pgx.Conn, stmt string, args []any) string {
	t.Helper()
	var literals []string
	for _, a := range args {
		literals = append(literals, "'"+strings.ReplaceAll(fmt.Sprint(a), "'", "''")+"'")
	}
	rows, err := conn.Query(context.Background(), "EXPLAIN EXECUTE "+stmt+"("+strings.Join(literals, ", ")+")")
	if err != nil {
		t.Fatalf("explain %s: %v", stmt, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("explain %s: %v", stmt, err)
	}
	return strings.Join(lines, "\n")
}

// genericPlan returns the generic plan of query: prepared, then explained
// under force_generic_plan.
func genericPlan(t *testing.T, conn *pgx.Conn, query string, args []any) string {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "PREPARE unknown_plan AS "+query); err != nil {
		t.Fatalf("prepare %s: %v", query, err)
	}
	explain := "EXPLAIN EXECUTE unknown_plan" + literalArgs(args)
	rows, err := conn.Query(ctx, explain)
	if err != nil {
		t.Fatalf("%s: %v", explain, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", explain, err)
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

func checkUnknownPlan(t *testing.T, name, plan string) {
	t.Helper()
	if !strings.Contains(plan, "reservations_usage_unknown_at") {
		t.Errorf("%s: plan does not use reservations_usage_unknown_at:\n%s", name, plan)
	}
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "Scan") && strings.Contains(line, "on reservations") &&
			!strings.Contains(line, "using reservations_usage_unknown_at") {
			t.Errorf("%s: reads reservations other than through reservations_usage_unknown_at:\n%s", name, plan)
		}
	}
}

// AccountsInDebt must read a page of debtors as a range of the partial
// index accounts_in_debt (schema 12), in key order from the cursor, and
// stop after the page: on a ledger of 20,000 accounts where 5,000 owe,
// neither every account nor every debtor is read or sorted. The plan
// before schema 12 read the ids of all debtors (account_terms_in_debt),
// fetched them and sorted them by key for each page. As for the
// USAGE_UNKNOWN list, the generic plan of the prepared statement is what
// is checked, on current statistics; then the same prepared statement is
// run (EXPLAIN ANALYZE) to check that the index scan returned only the
// page's entries.
func TestDebtQueriesUseTheirIndex(t *testing.T) {
	_, dsn := openStore(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`INSERT INTO accounts (subject, route, region, generation, dims, epoch_start, breaches, version)
		SELECT 'tenant' || i, 'chat.generate', 'eu', 1, 2, 0, 0, 1 FROM generate_series(1, 20000) AS i`,
		// Debt in dimension 1 of every fourth account: the triggers of
		// schema 12 set their in_debt.
		`INSERT INTO account_terms (account_id, dim, opening, minted, overdraft_issued, available, reserved, spent,
			retired_for_emergency, retired_for_move, overdraft_repaid, epoch_opening, epoch_minted,
			epoch_overdraft_issued, epoch_available, epoch_reserved, epoch_spent, epoch_retired_for_emergency,
			epoch_retired_for_move, epoch_overdraft_repaid, refilled_to)
		SELECT a.id, d, 100, 0, debt, 100, 0, debt, 0, 0, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 0
		FROM accounts a, generate_series(0, 1) AS d,
			LATERAL (SELECT CASE WHEN a.id % 4 = 0 AND d = 1 THEN 10 ELSE 0 END AS debt) AS x`,
		`ANALYZE accounts`,
		`ANALYZE account_terms`,
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var debtors int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM accounts WHERE in_debt`).Scan(&debtors); err != nil || debtors != 5000 {
		t.Fatalf("accounts in debt: %d, %v; want 5000", debtors, err)
	}
	const page = 10
	for _, tc := range []struct {
		name, query string
		args        []any
	}{
		{"first page", postgres.DebtFirstSQL, []any{page}},
		{"page after a cursor", postgres.DebtAfterSQL, []any{page, "tenant5000", "chat.generate", "eu", 1}},
	} {
		plan := genericPlan(t, conn, tc.query, tc.args)
		t.Logf("%s:\n%s", tc.name, plan)
		lines := strings.Split(plan, "\n")
		// The page is a Limit directly over the index scan: the index
		// returns the keys in order, nothing sorts the debtors.
		limitOverIndex := false
		for i, line := range lines {
			if strings.Contains(line, "->  Limit") && i+1 < len(lines) &&
				strings.Contains(lines[i+1], "Index Scan using accounts_in_debt on accounts d") {
				limitOverIndex = true
			}
		}
		if !limitOverIndex {
			t.Errorf("%s: the page is not a Limit over an index scan of accounts_in_debt:\n%s", tc.name, plan)
		}
		// The only scans: accounts_in_debt, then the page's term rows by
		// primary key. A sort may order the page's term rows by
		// dimension (an incremental sort of rows presorted by key).
		for _, line := range lines {
			if strings.Contains(line, "Scan") && !strings.Contains(line, "Index Scan using accounts_in_debt on accounts d") &&
				!strings.Contains(line, "Index Scan using account_terms_pkey on account_terms o") {
				t.Errorf("%s: reads more than the page of accounts in debt (%s):\n%s", tc.name, strings.TrimSpace(line), plan)
			}
			if strings.Contains(line, "Sort  (") && !strings.Contains(line, "Incremental Sort") {
				t.Errorf("%s: sorts instead of reading the index in order (%s):\n%s", tc.name, strings.TrimSpace(line), plan)
			}
		}
		if strings.Contains(tc.name, "cursor") && !strings.Contains(plan, "Index Cond: (ROW((subject)::text, (route)::text, (region)::text, generation) >") {
			t.Errorf("%s: does not seek the index at the cursor:\n%s", tc.name, plan)
		}
		// Run it: the index scan returns the page's entries only.
		rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE unknown_plan"+literalArgs(tc.args))
		if err != nil {
			t.Fatal(err)
		}
		ran, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s, run:\n%s", tc.name, strings.Join(ran, "\n"))
		found := false
		for _, line := range ran {
			if strings.Contains(line, "Index Scan using accounts_in_debt") {
				found = true
				if want := fmt.Sprintf("(actual rows=%d loops=1)", page); !strings.Contains(line, want) {
					t.Errorf("%s: the index scan read %s, want %s", tc.name, strings.TrimSpace(line), want)
				}
			}
		}
		if !found {
			t.Errorf("%s: run without accounts_in_debt:\n%s", tc.name, strings.Join(ran, "\n"))
		}
	}
}
