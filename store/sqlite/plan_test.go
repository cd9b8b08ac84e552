package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// queryPlan returns SQLite's plan for query, one detail per line.
func queryPlan(t *testing.T, s *Store, query string, args ...any) string {
	t.Helper()
	rows, err := s.readDB.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+query, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, detail)
	}
	return strings.Join(lines, "\n")
}

// The worker and list queries must read an index in the order they
// return, never sort the table: these run on every expiry tick and every
// account listing.
func TestQueriesUseIndexes(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, query, want string
		args              []any
	}{
		{"accounts of a subject", "SELECT " + accountCols + " FROM accounts WHERE subject = ? AND route = ? AND region = ? ORDER BY generation",
			"PRIMARY KEY", []any{"a", "b", "c"}},
		{"every account", "SELECT " + accountCols + " FROM accounts ORDER BY subject, route, region, generation", "", nil},
		{"accounts by epoch, first page", epochFirstSQL, "accounts_by_epoch", []any{1, 100, 512}},
		{"accounts by epoch, page after a position", epochAfterSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch", []any{1, 100, 512, 5, "a", "b", "c"}},
		{"epoch index catch-up, first chunk", catchUpFirstSQL, "SEARCH accounts USING INDEX accounts_by_epoch", []any{1, 100, 512}},
		{"epoch index catch-up, chunk after a position", catchUpAfterSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch (generation=? AND (epoch_indexed,subject,route,region)>(?,?,?,?)", []any{1, 100, 512, 5, "a", "b", "c"}},
		{"accounts by epoch across generations, first page", acrossFirstSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch_across (epoch_indexed<?)", []any{0, 100, 512}},
		{"accounts by epoch across generations, page after a position", acrossAfterSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch_across ((epoch_indexed,subject,route,region,generation)>(?,?,?,?,?) AND epoch_indexed<?)", []any{0, 100, 512, 5, "a", "b", "c", 1}},
		{"epoch index catch-up across generations, first chunk", catchUpAcrossFirstSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch_across (epoch_indexed<?)", []any{0, 100, 512}},
		{"epoch index catch-up across generations, chunk after a position", catchUpAcrossAfterSQL,
			"SEARCH accounts USING INDEX accounts_by_epoch_across ((epoch_indexed,subject,route,region,generation)>(?,?,?,?,?) AND epoch_indexed<?)", []any{0, 100, 512, 5, "a", "b", "c", 1}},
		{"epoch index catch-up's move, many rows", catchUpMoveSQL(64),
			"SEARCH accounts USING PRIMARY KEY (subject=? AND route=? AND region=? AND generation=?)", make([]any, 64*4)},
		{"epoch index catch-up's move, one row", catchUpMoveSQL(1),
			"SEARCH accounts USING PRIMARY KEY (subject=? AND route=? AND region=? AND generation=?)", []any{"a", "b", "c", 1}},
		{"a route's accounts, page after a cursor", pageOfRouteSQL,
			"SEARCH accounts USING INDEX accounts_by_route (route=? AND (subject,region,generation)>(?,?,?))", []any{100, "chat", "a", "eu", 1, ""}},
		{"a route's accounts, past a subject", pageOfRoutePastSQL,
			"SEARCH accounts USING INDEX accounts_by_route (route=? AND subject>?)", []any{100, "chat", "a", "eu"}},
		{"a subject's reservations of a state, first page", subjectFirstSQL,
			"SEARCH s USING PRIMARY KEY (subject=?)", []any{"a", 3, 21}},
		{"a subject's reservations of a state, page before a cursor", subjectBeforeSQL,
			"SEARCH s USING PRIMARY KEY (subject=? AND (created_at,id)<(?,?))", []any{"a", 3, 21, 5, "x"}},
		{"pending entries' states", pendingStatesSQL(2), "SEARCH s USING PRIMARY KEY (subject=? AND created_at=? AND id=?)", []any{"a", "b", "c"}},
		{"retention's delete of subject index entries", subjectDeleteSQL(2), "SEARCH reservation_subjects USING PRIMARY KEY", []any{"a", "b"}},
		{"an account's statements", statementsOfSQL, "", []any{"a", "b", "c", 1, 5, 51}},
		{"reservations' short update, many rows", writeSQL[wReservationUpdateRows],
			"SEARCH reservations USING PRIMARY KEY (id=?)", make([]any, 64*11)},
		{"reservations' short update, one row", writeSQL[wReservationUpdateRows+len(chunkSizes)-1],
			"SEARCH reservations USING PRIMARY KEY (id=?)", make([]any, 11)},
		{"accounts' short update, many rows", writeSQL[wAccountUpdateRows],
			"SEARCH accounts USING PRIMARY KEY (subject=? AND route=? AND region=? AND generation=?)", make([]any, 64*12)},
		{"accounts' short update, one row", writeSQL[wAccountUpdateRows+len(chunkSizes)-1],
			"SEARCH accounts USING PRIMARY KEY (subject=? AND route=? AND region=? AND generation=?)", make([]any, 12)},
		{"journal", "SELECT " + journalCols + " FROM journal ORDER BY seq", "", nil},
		{"journal batches", "SELECT seq, entries FROM journal_batches ORDER BY seq", "", nil},
	} {
		plan := queryPlan(t, s, tc.query, tc.args...)
		t.Logf("%s:\n%s", tc.name, plan)
		if strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%s: sorts instead of reading in index order:\n%s", tc.name, plan)
		}
		if tc.want != "" && !strings.Contains(plan, tc.want) {
			t.Errorf("%s: plan does not use %s:\n%s", tc.name, tc.want, plan)
		}
	}
}

// AccountsInDebt must read debtors only: the keys of account_debtors in
// order (from a seek past the cursor), and each one's account by primary
// key, never a scan of accounts (a million tenants, a handful in debt)
// and never a sort.
func TestDebtQueriesUseTheirIndex(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, query, debtors string
		args                 []any
	}{
		{"first page", debtFirstSQL, "SCAN d", []any{100}},
		{"page after a key", debtAfterSQL, "SEARCH d USING PRIMARY KEY ((subject,route,region,generation)>(?,?,?,?))",
			[]any{100, "a", "b", "c", 1}},
	} {
		plan := queryPlan(t, s, tc.query, tc.args...)
		t.Logf("%s:\n%s", tc.name, plan)
		lines := strings.Split(plan, "\n")
		want := []string{tc.debtors, "SEARCH a USING PRIMARY KEY (subject=? AND route=? AND region=? AND generation=?)"}
		if !slices.Equal(lines, want) {
			t.Errorf("%s: plan\n%s\nwant\n%s", tc.name, plan, strings.Join(want, "\n"))
		}
	}
}

// AccountsOfSubjects shows a page of debtors with their subjects'
// accounts: each key is a seek of the accounts' primary key, never a scan
// of accounts (a million tenants, a page of 100 shown), and never a sort.
func TestAccountsOfSubjectsQueryUsesThePrimaryKey(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, n := range subjectChunkSizes {
		args := make([]any, 3*n)
		for i := range args {
			args[i] = fmt.Sprint("k", i)
		}
		plan := queryPlan(t, s, accountsOfSubjectsSQL(n), args...)
		t.Logf("%d subjects:\n%s", n, plan)
		if !strings.Contains(plan, "SEARCH accounts USING PRIMARY KEY (subject=? AND route=? AND region=?)") {
			t.Errorf("%d subjects: plan does not seek the primary key by subject:\n%s", n, plan)
		}
		if strings.Contains(plan, "SCAN accounts") || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%d subjects: scans or sorts:\n%s", n, plan)
		}
	}
}

// ReservationsDue runs on every worker tick: it must reach due rows through
// its two partial indexes, never by scanning the table. (Its final sort is
// over at most limit rows plus the EXPIRING ones.)
func TestDueQueryUsesItsIndexes(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plan := queryPlan(t, s, dueSQL, 1, 10)
	for _, index := range []string{"reservations_due", "reservations_expiring"} {
		if !strings.Contains(plan, index) {
			t.Errorf("due query does not use %s:\n%s", index, plan)
		}
	}
	for _, line := range strings.Split(plan, "\n") {
		if strings.Contains(line, "SCAN reservations") && !strings.Contains(line, "INDEX") {
			t.Errorf("due query scans the reservations table:\n%s", plan)
		}
	}
}

// The USAGE_UNKNOWN list and backlog must read only the partial index
// reservations_usage_unknown_at: never the whole reservations table (which
// holds every reservation ever made), and the list never sorts, so each
// page stops after its LIMIT rows.
func TestUnknownQueriesUseTheirIndex(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, query string
		args        []any
	}{
		{"first page", unknownFirstSQL, []any{"", "", 10}},
		{"first page of a subject and route", unknownFirstSQL, []any{"tenant7", "chat.generate", 10}},
		{"page after a cursor", unknownAfterSQL, []any{"", "", 10, int64(1), "rl-1"}},
		{"page of a subject after a cursor", unknownAfterSQL, []any{"tenant7", "", 10, int64(1), "rl-1"}},
		{"backlog", unknownBacklogSQL, nil},
	} {
		plan := queryPlan(t, s, tc.query, tc.args...)
		t.Logf("%s:\n%s", tc.name, plan)
		if !strings.Contains(plan, "USING INDEX reservations_usage_unknown_at") &&
			!strings.Contains(plan, "USING COVERING INDEX reservations_usage_unknown_at") {
			t.Errorf("%s: plan does not use reservations_usage_unknown_at:\n%s", tc.name, plan)
		}
		if strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%s: sorts instead of reading the index in order:\n%s", tc.name, plan)
		}
		for _, line := range strings.Split(plan, "\n") {
			if strings.Contains(line, "reservations") && !strings.Contains(line, "reservations_usage_unknown_at") {
				t.Errorf("%s: reads reservations other than through reservations_usage_unknown_at:\n%s", tc.name, plan)
			}
		}
	}
}

// PolicyPage with a subject reads that subject's range of policies_key
// (schema 20), whatever route and region it names, never the policies
// table in generation order (26-37 ms a page at 100,000 policies); only
// the subject's rows are sorted. PoliciesOfGenerations seeks the primary
// key per generation.
func TestPolicyReadsUseTheirIndex(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, query, want string
		args              []any
	}{
		{"a subject's policies", policyPageOfSubjectSQL, "SEARCH policies USING INDEX policies_key (subject=?)",
			[]any{0, "tenant-1", "", "", 100}},
		{"a subject's policies of a route", policyPageOfSubjectSQL, "SEARCH policies USING INDEX policies_key (subject=?)",
			[]any{0, "tenant-1", "chat", "", 100}},
		{"a key's policies", policyPageOfSubjectSQL, "SEARCH policies USING INDEX policies_key (subject=?)",
			[]any{0, "tenant-1", "chat", "eu", 100}},
	} {
		plan := queryPlan(t, s, tc.query, tc.args...)
		t.Logf("%s:\n%s", tc.name, plan)
		if !strings.Contains(plan, tc.want) {
			t.Errorf("%s: plan does not use %s:\n%s", tc.name, tc.want, plan)
		}
		if strings.Contains(plan, "SCAN policies") {
			t.Errorf("%s: scans the policies:\n%s", tc.name, plan)
		}
	}
	for _, n := range subjectChunkSizes {
		plan := queryPlan(t, s, policiesOfSQL(n), make([]any, n)...)
		t.Logf("%d generations:\n%s", n, plan)
		if !strings.Contains(plan, "SEARCH policies USING INTEGER PRIMARY KEY (rowid=?)") ||
			strings.Contains(plan, "SCAN policies") || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%d generations: plan does not seek the primary key per generation:\n%s", n, plan)
		}
	}
}

// AccountsPage of one subject (the console's standings of one tenant)
// seeks the subject's range of the accounts' primary key at the cursor:
// it reads that subject's accounts only, whatever the others'.
func TestAccountsPageOfSubjectSeeksThePrimaryKey(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plan := queryPlan(t, s, pageOfSubjectSQL, 1000, "tenant7", "", "", -1, "", "")
	if want := "SEARCH accounts USING PRIMARY KEY (subject=? AND (route,region,generation)>(?,?,?))"; plan != want {
		t.Errorf("a subject's page: plan\n%s\nwant %s", plan, want)
	}
}
