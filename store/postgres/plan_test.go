package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// ReservationsDue runs on every worker tick and now reads each listed
// row's state too: it must still reach the due rows through its two
// partial indexes (reservations_due up to now, reservations_expiring for
// the EXPIRING rows ahead of it), never by scanning the table, in the
// generic plan, on a table where few rows are due.
func TestDueQueryUsesItsIndexes(t *testing.T) {
	conn := planConn(t, reservationRows(20000, "i % 8", "i + 1", "0"),
		`ANALYZE reservations`, `SET plan_cache_mode = force_generic_plan`)
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
	// One in 100 USAGE_UNKNOWN (state 8), marked at i + 2.
	conn := planConn(t, reservationRows(20000, "CASE WHEN i % 100 = 0 THEN 8 ELSE i % 8 END", "i + 1", "CASE WHEN i % 100 = 0 THEN i + 2 ELSE 0 END"),
		`ANALYZE reservations`, `SET plan_cache_mode = force_generic_plan`)
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
// autovacuum is off or late. Each lookup by arrays of keys of a write
// transaction (the batch prefetches; the term trim and the retention
// deletes of a Write) runs, through the store's own transactions on its
// one connection, ten times while its tables are empty and never analysed
// (a new database), then the tables grow by 20,000 rows, still
// unanalysed: the next run must reach its rows through the tables'
// indexes (no sequential scan in the transaction's statistics,
// pg_stat_xact_user_tables). Under PostgreSQL's default plan cache the
// plan kept from the empty table is a sequential scan of the whole table
// on every batch (singles beside batches collapsed to 12-82 calls/s with
// 4 s prefetches: docs/PERFORMANCE.md); the store plans these lookups at
// each run, while the rest of a write transaction keeps cached plans.
func TestBatchPrefetchesUseTheIndexAsTablesGrow(t *testing.T) {
	dsn := withParam(t, schemaDSN(t), "pool_max_conns", "1") // one connection: its prepared statements
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	const rows = 20000
	// A batch of 10 keys: on 20,000 rows, reading the index costs a
	// fraction of reading the table, in the planner's model as in fact.
	const batch = 10
	ids := make([]string, batch)
	subjects := make([]ledger.PolicyKey, batch)
	for i := range batch {
		n := (i+1)*97%rows + 1
		ids[i] = fmt.Sprintf("rl-%d", n)
		subjects[i] = ledger.PolicyKey{Subject: fmt.Sprintf("tenant%d", n), Route: "chat.generate", Region: "eu"}
	}
	fillReservations := reservationRows(rows, "1", "0", "0")
	fillTombstones := `INSERT INTO tombstones (id, request_digest, subject, route, region, generation, state, finished_at)
		SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 3, i
		FROM generate_series(1, 20000) AS i`
	fillHeadsAndCurrents := []string{
		`INSERT INTO policy_heads (subject, route, region, active, latest)
		SELECT 'tenant' || i, 'chat.generate', 'eu', 1, 1 FROM generate_series(1, 20000) AS i`,
		`INSERT INTO account_currents (subject, route, region, generation)
		SELECT 'tenant' || i, 'chat.generate', 'eu', 1 FROM generate_series(1, 20000) AS i`,
	}
	fillAccounts := []string{accountRows(rows, 1), termRowsOfEveryAccount}
	narrowed := make([]ledger.Account, batch) // written unread: its term rows past Dims are trimmed
	for i, k := range subjects {
		narrowed[i] = ledger.Account{Key: ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: 1}, Dims: 1}
	}
	for _, tc := range []struct {
		name   string
		tables []string
		fill   []string
		run    func(store.Tx) error
	}{
		{"reservations", []string{"reservations"}, []string{fillReservations}, func(tx store.Tx) error {
			return tx.(store.Prefetcher).ReservationsPrefetch(ctx, ids)
		}},
		{"tombstones", []string{"tombstones"}, []string{fillTombstones}, func(tx store.Tx) error {
			return tx.(store.Prefetcher).ReservationsPrefetch(ctx, ids) // absent: their tombstones are read
		}},
		{"policy heads, current generations and accounts", []string{"policy_heads", "account_currents", "accounts", "account_terms"},
			slices.Concat(fillHeadsAndCurrents, fillAccounts), func(tx store.Tx) error {
				return tx.(store.AccountsPrefetcher).AccountsPrefetch(ctx, subjects, nil, nil)
			}},
		{"term trim", []string{"accounts", "account_terms"}, fillAccounts, func(tx store.Tx) error {
			return tx.Write(ctx, &store.Changes{Accounts: narrowed})
		}},
		{"retention deletes", []string{"reservations", "tombstones"}, []string{fillReservations, fillTombstones}, func(tx store.Tx) error {
			return tx.Write(ctx, &store.Changes{Retention: store.RetentionChanges{RemovedReservations: ids, RemovedTombstones: ids}})
		}},
		// Not a lookup by arrays: the getters of one row by its key keep
		// their generic plans, which must read through the indexes too.
		{"getters of one row (generic plans)", []string{"reservations", "tombstones", "policy_heads", "account_currents", "accounts", "account_terms"},
			slices.Concat([]string{fillReservations, fillTombstones}, fillHeadsAndCurrents, fillAccounts), func(tx store.Tx) error {
				k := subjects[3]
				for _, get := range []func() error{
					func() error { _, err := tx.ReservationGet(ctx, ids[3]); return err },
					func() error { _, err := tx.(store.RetentionTx).TombstoneGet(ctx, ids[4]); return err },
					func() error { _, err := tx.PolicyHeadGet(ctx, k); return err },
					func() error { _, err := tx.AccountCurrentGet(ctx, k); return err },
					func() error { _, err := tx.AccountGet(ctx, narrowed[3].Key); return err },
				} {
					if err := get(); err != nil && !errors.Is(err, store.ErrNotFound) {
						return err
					}
				}
				return nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Runs the lookup in a write transaction and returns the
			// sequential scans of tc.tables it made.
			seqScans := func() int64 {
				tx, err := s.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx)
				// The backend's counts not yet reported count as the
				// transaction's too: the difference is this run's.
				count := func() (scans int64) {
					if err := postgres.PgxTx(tx).QueryRow(ctx, `SELECT COALESCE(sum(seq_scan), 0) FROM pg_stat_xact_user_tables
						WHERE relname = ANY($1) AND schemaname = current_schema()`, tc.tables).Scan(&scans); err != nil {
						t.Fatal(err)
					}
					return scans
				}
				before := count()
				if err := tc.run(tx); err != nil {
					t.Fatalf("run: %v", err)
				}
				return count() - before
			}
			// A replica's first batches, on the empty tables: enough
			// runs for PostgreSQL to settle on a plan to keep.
			for range 10 {
				seqScans()
			}
			pool := postgres.PoolOf(s)
			for _, q := range tc.fill {
				if _, err := pool.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if n := seqScans(); n > 0 {
				t.Errorf("%d sequential scans of %v in one run (keys: %d) on tables of %d rows", n, tc.tables, batch, rows)
			}
			for _, q := range []string{"TRUNCATE reservations, tombstones, policy_heads, account_currents, account_terms",
				"DELETE FROM accounts"} {
				if _, err := pool.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
		})
	}
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
// page's entries. The engine then reads the page's subjects' accounts
// (AccountsOfSubjects) by their keys.
func TestDebtQueriesUseTheirIndex(t *testing.T) {
	ctx := context.Background()
	conn := planConn(t, accountRows(20000, 2),
		// Debt in dimension 1 of every fourth account: the triggers of
		// schema 12 set their in_debt.
		termsInsert+`SELECT a.id, d, 100, 0, debt, 100, 0, debt, 0, 0, 0, 100, 0, 0, 100, 0, 0, 0, 0, 0, 0
		FROM accounts a, generate_series(0, 1) AS d,
			LATERAL (SELECT CASE WHEN a.id % 4 = 0 AND d = 1 THEN 10 ELSE 0 END AS debt) AS x`,
		`ANALYZE accounts`, `ANALYZE account_terms`, `SET plan_cache_mode = force_generic_plan`)
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
		ran := explainAnalyze(t, conn, "EXECUTE unknown_plan"+literalArgs(tc.args))
		t.Logf("%s, run:\n%s", tc.name, ran)
		found := false
		for _, line := range strings.Split(ran, "\n") {
			if strings.Contains(line, "Index Scan using accounts_in_debt") {
				found = true
				if want := fmt.Sprintf("(actual rows=%d loops=1)", page); !strings.Contains(line, want) {
					t.Errorf("%s: the index scan read %s, want %s", tc.name, strings.TrimSpace(line), want)
				}
			}
		}
		if !found {
			t.Errorf("%s: run without accounts_in_debt:\n%s", tc.name, ran)
		}
	}
	// A page's subjects' accounts (AccountsOfSubjects, 100 subjects of
	// the page): one seek of the accounts' unique key per subject and of
	// the terms' primary key per account, planned for its keys as the
	// store's pool plans it (at each run), never a scan of either table.
	execAll(t, conn, `SET plan_cache_mode = force_custom_plan`)
	var subjects []string
	for i := 4; i <= 400; i += 4 {
		subjects = append(subjects, fmt.Sprint("tenant", i))
	}
	routes, regions := slices.Repeat([]string{"chat.generate"}, len(subjects)), slices.Repeat([]string{"eu"}, len(subjects))
	plan := explainAnalyze(t, conn, postgres.AccountsOfSubjectsSQL, subjects, routes, regions)
	t.Logf("accounts of 100 subjects, run:\n%s", plan)
	for _, want := range []string{"Index Scan using accounts_subject_route_region_generation_key on accounts a (actual rows=1 loops=100)",
		"on account_terms t (actual rows=2 loops=100)"} {
		if !strings.Contains(plan, want) {
			t.Errorf("accounts of 100 subjects: no %q in the plan:\n%s", want, plan)
		}
	}
	if strings.Contains(plan, "Seq Scan") {
		t.Errorf("accounts of 100 subjects: scans a table:\n%s", plan)
	}
}

// Write transactions keep cached (generic) plans for what reads one row by
// its key and for the batch writes, and plan only the lookups by arrays
// of keys at each run: after a dozen single reserves and a dozen batches
// of two on the store's one connection, PostgreSQL's own counts
// (pg_prepared_statements) show the prefetches planned at every run and
// the rest on generic plans. Planning every statement at each run costs
// PostgreSQL CPU for nothing (docs/PERFORMANCE.md).
// A plan_cache_mode in the DSN applies to every statement
// (docs/OPERATIONS.md): with force_custom_plan nothing runs on a generic
// plan.
func TestWriteTransactionsPlanOnlyLookupsAtEachRun(t *testing.T) {
	type counts struct{ generic, custom int64 }
	// plans runs the reserves on a one-connection store opened with dsn
	// and returns its connection's plan counts by statement.
	plans := func(t *testing.T, dsn string) map[string]counts {
		s, err := postgres.Open(context.Background(), withParam(t, dsn, "pool_max_conns", "1"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		publish(t, s)
		for i := range 12 {
			commitCmds(t, s, t0, reserveCmd(fmt.Sprintf("rl-single-%d", i), 1))
			commitCmds(t, s, t0, reserveCmd(fmt.Sprintf("rl-a-%d", i), 1), reserveCmd(fmt.Sprintf("rl-b-%d", i), 1))
		}
		rows, err := postgres.PoolOf(s).Query(context.Background(),
			`SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements WHERE from_sql = false`)
		if err != nil {
			t.Fatal(err)
		}
		plans := map[string]counts{}
		for rows.Next() {
			var sql string
			var c counts
			if err := rows.Scan(&sql, &c.generic, &c.custom); err != nil {
				t.Fatal(err)
			}
			plans[sql] = c
			t.Logf("generic %3d custom %3d  %.120s", c.generic, c.custom, strings.Join(strings.Fields(sql), " "))
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return plans
	}
	lookups := []string{postgres.ReservationsPrefetchSQL, postgres.TombstonesPrefetchSQL}
	t.Run("store's choice", func(t *testing.T) {
		plans := plans(t, schemaDSN(t))
		for _, sql := range lookups {
			if c, ok := plans[sql]; !ok || c.custom == 0 || c.generic != 0 {
				t.Errorf("lookup planned %d times at its run, %d times from its generic plan (want every run): %.80s",
					c.custom, c.generic, sql)
			}
		}
		for sql, c := range plans {
			if slices.Contains(lookups, sql) || !strings.Contains(sql, "$1") {
				continue
			}
			if c.custom != 0 || c.generic == 0 {
				t.Errorf("statement planned %d times at its run, %d times from its generic plan (want the generic plan): %.80s",
					c.custom, c.generic, sql)
			}
		}
	})
	for _, dsn := range []struct{ name, param, value string }{
		{"force_custom_plan in the DSN", "plan_cache_mode", "force_custom_plan"},
		{"force_custom_plan in the DSN's options", "options", "-cplan_cache_mode=force_custom_plan"},
	} {
		t.Run(dsn.name, func(t *testing.T) {
			plans := plans(t, withParam(t, schemaDSN(t), dsn.param, dsn.value))
			for _, sql := range lookups {
				if _, ok := plans[sql]; !ok {
					t.Errorf("lookup never ran: %.80s", sql)
				}
			}
			for sql, c := range plans {
				if strings.Contains(sql, "$1") && c.generic != 0 {
					t.Errorf("statement ran %d times on its generic plan (want none): %.80s", c.generic, sql)
				}
			}
		})
	}
}

// The reads across generations seek accounts_by_epoch_across (schema 19)
// at the bound and the cursor, a page at a time: no sequential scan of
// accounts, no sort of every due account.
func TestEpochAcrossQueriesUseTheirIndex(t *testing.T) {
	conn := planConn(t, accountsInsert+`SELECT 'tenant' || (i % 500), 'chat.generate', 'eu', 1 + i / 500, 1, (i % 97) * 600000000000, 0, 1
		FROM generate_series(1, 50000) AS i`,
		`ANALYZE accounts`, `SET plan_cache_mode = force_generic_plan`)
	for _, tc := range []struct {
		name, query string
		args        []any
	}{
		{"first page", postgres.AcrossFirstSQL, []any{int64(30 * 600000000000), 8}},
		{"page after a cursor", postgres.AcrossAfterSQL, []any{int64(30 * 600000000000), 8, int64(29 * 600000000000), "tenant1", "chat.generate", "eu", 3}},
	} {
		plan := genericPlan(t, conn, tc.query, tc.args)
		t.Logf("%s:\n%s", tc.name, plan)
		if !strings.Contains(plan, "accounts_by_epoch_across") {
			t.Errorf("%s: does not read accounts_by_epoch_across:\n%s", tc.name, plan)
		}
		if strings.Contains(plan, "Seq Scan on accounts") {
			t.Errorf("%s: scans accounts:\n%s", tc.name, plan)
		}
	}
}

// PolicyPage with a subject reads that subject's range of policies_key
// (schema 1; SQLite gained its own in schema 20), never the policies in
// generation order, and PoliciesOfGenerations seeks the primary key:
// planned at each run as the store's reads outside write transactions
// are (force_custom_plan), on 50,000 policies of as many tenants.
func TestPolicyReadsUseTheirIndex(t *testing.T) {
	conn := planConn(t, `INSERT INTO policies (generation, subject, route, region, dimensions, estimator_digest, hold_ttl,
			execution_limit, priority, fairness_weight, fairness_budget, emergency_mode, rollout, epoch_length,
			published_at, rolled_back)
		SELECT i, 'tenant' || i, CASE WHEN i % 2 = 0 THEN 'chat' ELSE 'embed' END, 'eu', '[]', '', 0, 0, 0, 1, 0.05, false,
			'enforce', 0, i, false FROM generate_series(1, 50000) AS i`,
		`ANALYZE policies`, `SET plan_cache_mode = force_custom_plan`)
	generations := make([]string, 128)
	for i := range generations {
		generations[i] = fmt.Sprint(i*389 + 1)
	}
	for _, tc := range []struct {
		name, query, index string
		args               []any
	}{
		{"a subject's policies", postgres.PolicyPageSQL, "policies_key", []any{0, "tenant7", "", "", 100}},
		{"a key's policies", postgres.PolicyPageSQL, "policies_key", []any{0, "tenant7", "embed", "eu", 100}},
		{"128 generations", postgres.PoliciesOfSQL, "policies_pkey", []any{"{" + strings.Join(generations, ",") + "}"}},
	} {
		plan := genericPlan(t, conn, tc.query, tc.args)
		t.Logf("%s:\n%s", tc.name, plan)
		if !strings.Contains(plan, tc.index) || strings.Contains(plan, "Seq Scan on policies") {
			t.Errorf("%s: does not seek %s:\n%s", tc.name, tc.index, plan)
		}
	}
}

// AccountsPage of one subject (the console's standings of one tenant)
// reads that subject's range of the accounts' unique key, from the
// cursor on, and the term rows of its accounts by primary key: among
// 20,000 tenants' accounts, a tenant's first page and its page after a
// cursor read its own accounts only (actual rows), with its route
// matched within them, planned for its values (the console's session
// default) or generically; never a scan of either table.
func TestAccountsPageOfSubjectReadsItsAccountsOnly(t *testing.T) {
	conn := planConn(t, accountRows(20000, 1),
		accountsInsert+`SELECT 'tenant7', r, 'eu', 1, 1, 0, 0, 1 FROM unnest(ARRAY['a', 'b', 'embed']) AS r`,
		termRowsOfEveryAccount, `ANALYZE accounts`, `ANALYZE account_terms`)
	for _, tc := range []struct {
		name, query string
		args        []any
		rows        int // the accounts the index scan returns
	}{
		{"a subject's first page", postgres.PageOfSubjectFirstSQL, []any{1000, "tenant7", "", ""}, 4},
		{"a subject's page after a cursor", postgres.PageOfSubjectAfterSQL,
			[]any{1000, "tenant7", "b", "eu", 1, "tenant7", "", ""}, 2},
		{"a subject's route", postgres.PageOfSubjectFirstSQL, []any{1000, "tenant7", "embed", ""}, 1},
		{"a cursor in an earlier subject", postgres.PageOfSubjectAfterSQL,
			[]any{1000, "tenant6", "chat.generate", "eu", 1, "tenant7", "", ""}, 4},
	} {
		execAll(t, conn, `SET plan_cache_mode = force_generic_plan`)
		plan := genericPlan(t, conn, tc.query, tc.args)
		if !strings.Contains(plan, "Index Scan using accounts_subject_route_region_generation_key on accounts d") ||
			strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s, generic plan: not a seek of the accounts' key:\n%s", tc.name, plan)
		}
		execAll(t, conn, `SET plan_cache_mode = force_custom_plan`)
		// An unnamed statement: genericPlan deallocates every prepared one.
		plan = explainAnalyze(t, conn, tc.query, append([]any{pgx.QueryExecModeExec}, tc.args...)...)
		t.Logf("%s, run:\n%s", tc.name, plan)
		want := fmt.Sprintf("Index Scan using accounts_subject_route_region_generation_key on accounts d (actual rows=%d loops=1)", tc.rows)
		if !strings.Contains(plan, want) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s: no %q (or a scan of a table):\n%s", tc.name, want, plan)
		}
	}
}

// 20,000 accounts of one route and 3 of others: a page of another
// route's accounts, from the start, after a cursor or past a subject,
// reads that route's accounts only (actual rows) by accounts_by_route,
// planned for its values or generically; never a scan of either table.
func TestAccountsPageOfRouteReadsItsAccountsOnly(t *testing.T) {
	conn := planConn(t, accountRows(20000, 1),
		accountsInsert+`SELECT 'tenant7', r, 'eu', 1, 1, 0, 0, 1 FROM unnest(ARRAY['a', 'b', 'embed']) AS r`,
		accountsInsert+`SELECT 'tenant' || i, 'embed', 'eu', 1, 1, 0, 0, 1 FROM generate_series(8, 9) AS i`,
		termRowsOfEveryAccount, `ANALYZE accounts`, `ANALYZE account_terms`)
	for _, tc := range []struct {
		name, query string
		args        []any
		rows        int // the accounts the index scan returns
	}{
		{"a route's first page", postgres.PageOfRouteSQL, []any{1000, "embed", "", "", -1, ""}, 3},
		{"a route's page after a cursor", postgres.PageOfRouteSQL, []any{1000, "embed", "tenant7", "eu", 1, ""}, 2},
		{"a route's page past a subject", postgres.PageOfRoutePastSQL, []any{1000, "embed", "tenant8", ""}, 1},
		{"a route's region", postgres.PageOfRouteSQL, []any{1000, "embed", "", "", -1, "us"}, 0},
	} {
		execAll(t, conn, `SET plan_cache_mode = force_generic_plan`)
		plan := genericPlan(t, conn, tc.query, tc.args)
		if !strings.Contains(plan, "Index Scan using accounts_by_route on accounts d") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s, generic plan: not a seek of accounts_by_route:\n%s", tc.name, plan)
		}
		execAll(t, conn, `SET plan_cache_mode = force_custom_plan`)
		plan = explainAnalyze(t, conn, tc.query, append([]any{pgx.QueryExecModeExec}, tc.args...)...)
		t.Logf("%s, run:\n%s", tc.name, plan)
		want := fmt.Sprintf("Index Scan using accounts_by_route on accounts d (actual rows=%d loops=1)", tc.rows)
		if !strings.Contains(plan, want) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s: no %q (or a scan of a table):\n%s", tc.name, want, plan)
		}
	}
}

// ListSubjectReservations' counts of one subject can be answered from
// reservations_by_subject_route alone (its route is included): an
// index-only scan of the subject's range, and its pages seek the same
// index by state, on 20,000 reservations of 10 subjects over 2 routes,
// planned generically and, for the count, for its value. Which plan
// PostgreSQL prefers depends on how much of the table vacuum could mark
// all-visible, which any older transaction in the database (another
// test's) holds back, so the table's own reads (sequential and bitmap
// scans) are ruled out: what is asked is whether the index answers alone
// (with the index of schema 23, which has no route, it does not).
func TestSubjectCountsReadTheIndexOnly(t *testing.T) {
	conn := planConn(t, reservationRows(20000, "i % 4 + 1", "i + 1", "0"),
		`UPDATE reservations SET route = 'embed' WHERE id LIKE '%7'`, `VACUUM ANALYZE reservations`,
		`SET enable_seqscan = off`, `SET enable_bitmapscan = off`, `SET plan_cache_mode = force_generic_plan`)
	for _, q := range []struct {
		name, query, want string
		args              []any
	}{
		{"counts", postgres.SubjectStatesSQL, "Index Only Scan using reservations_by_subject_route on reservations", []any{"tenant7"}},
		{"first page", postgres.SubjectFirstSQL, "Index Scan Backward using reservations_by_subject_route on reservations",
			[]any{"tenant7", 2, 100}},
		{"page after a cursor", postgres.SubjectBeforeSQL, "Index Scan Backward using reservations_by_subject_route on reservations",
			[]any{"tenant7", 2, 100, int64(10000), "rl-10000"}},
	} {
		plan := genericPlan(t, conn, q.query, q.args)
		t.Logf("%s, generic plan:\n%s", q.name, plan)
		if !strings.Contains(plan, q.want) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s, generic plan: no %q:\n%s", q.name, q.want, plan)
		}
	}
	execAll(t, conn, `SET plan_cache_mode = force_custom_plan`)
	plan := explainAnalyze(t, conn, postgres.SubjectStatesSQL, pgx.QueryExecModeExec, "tenant7")
	t.Logf("counts, run:\n%s", plan)
	want := "Index Only Scan using reservations_by_subject_route on reservations (actual rows=2000 loops=1)"
	if !strings.Contains(plan, want) {
		t.Errorf("counts: no %q:\n%s", want, plan)
	}
}
