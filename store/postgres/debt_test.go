package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// connectTo opens a connection of its own to dsn's schema, closed when
// the test ends.
func connectTo(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// inDebtFlags returns accounts.in_debt by account key (as
// ledger.AccountKey.String writes it), and whether the
// account's term rows owe (overdraft_issued > overdraft_repaid in any),
// read from the database itself.
func inDebtFlags(t *testing.T, conn *pgx.Conn) (flags, owes map[string]bool) {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT a.subject || '/' || a.route || '@' || a.region || '#' || a.generation,
			a.in_debt, EXISTS (SELECT 1 FROM account_terms o WHERE o.account_id = a.id AND o.overdraft_issued > o.overdraft_repaid)
		FROM accounts a`)
	if err != nil {
		t.Fatal(err)
	}
	flags, owes = map[string]bool{}, map[string]bool{}
	for rows.Next() {
		var (
			key         string
			flag, owing bool
		)
		if err := rows.Scan(&key, &flag, &owing); err != nil {
			t.Fatal(err)
		}
		flags[key], owes[key] = flag, owing
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return flags, owes
}

// debtorKeys pages through AccountsInDebt, two accounts a page.
func debtorKeys(t *testing.T, s store.Store) []string {
	t.Helper()
	var (
		keys  []string
		after ledger.AccountKey
	)
	for {
		page, err := s.AccountsInDebt(context.Background(), store.DebtFilter{After: after, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range page {
			keys = append(keys, a.Key.String())
			after = a.Key
		}
		if len(page) < 2 {
			return keys
		}
	}
}

// accounts.in_debt (schema 12) follows the terms through the store's
// own write path: a settle above its reservation draws debt and sets
// it, refills repay part of the debt (still set), then all of it
// (cleared), and the account then lists in AccountsInDebt exactly while
// it owes. The seed's policy: burst 1,000, 100 minted a minute, repaying
// debt first.
func TestInDebtFollowsTheTerms(t *testing.T) {
	s, dsn := openStore(t)
	generation := publish(t, s)
	conn := connectTo(t, dsn)
	key := ledger.AccountKey{Subject: tenant7.Subject, Route: tenant7.Route, Region: tenant7.Region, Generation: generation}
	check := func(step string, wantDebt int64) {
		t.Helper()
		a := account(t, s, generation)
		if debt := a.Balances[0].OverdraftIssued - a.Balances[0].OverdraftRepaid; debt != wantDebt {
			t.Fatalf("%s: debt %d, want %d", step, debt, wantDebt)
		}
		flags, owes := inDebtFlags(t, conn)
		if flags[key.String()] != (wantDebt > 0) || owes[key.String()] != (wantDebt > 0) {
			t.Fatalf("%s: in_debt %v, terms owe %v; want both %v", step, flags[key.String()], owes[key.String()], wantDebt > 0)
		}
		var want []string
		if wantDebt > 0 {
			want = []string{key.String()}
		}
		if got := debtorKeys(t, s); !slices.Equal(got, want) {
			t.Fatalf("%s: AccountsInDebt %v, want %v", step, got, want)
		}
	}
	reserve := func(now time.Time, id string, units int64) ledger.Result {
		return commitCmds(t, s, now, reserveCmd(id, units))[0]
	}
	if res := reserve(t0, "rl-1", 1000); res.Err != nil {
		t.Fatal(res.Err)
	}
	check("reserved", 0)
	commitCmds(t, s, t0.Add(time.Second), ledger.Command{Kind: ledger.KindStart, ReservationID: "rl-1", OperationID: "op-1"})
	res := commitCmds(t, s, t0.Add(2*time.Second), ledger.Command{Kind: ledger.KindSettle, ReservationID: "rl-1",
		OperationID: "op-1", Units: ledger.Amounts{1250}})[0]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	check("settled 250 above its reservation", 250)
	// A reserve refills first (repaying debt), then is refused while debt
	// remains; the refill is written all the same.
	reserve(t0.Add(2*time.Second+2*time.Minute), "rl-2", 1)
	check("two minutes of refill", 50)
	if res := reserve(t0.Add(2*time.Second+4*time.Minute), "rl-3", 1); res.Err != nil {
		t.Fatalf("reserve once the debt is repaid: %v", res.Err)
	}
	check("repaid", 0)
	mustAudit(t, s)
}

// schemaAt11 takes a migrated schema back to version 11: migration 12's
// triggers, function, index and column are dropped.
func schemaAt11(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	for _, q := range []string{
		`DROP TRIGGER account_terms_debt_inserted ON account_terms`,
		`DROP TRIGGER account_terms_debt_updated ON account_terms`,
		`DROP TRIGGER account_terms_debt_deleted ON account_terms`,
		`DROP FUNCTION account_terms_debt_changed()`,
		`DROP INDEX accounts_in_debt`,
		`ALTER TABLE accounts DROP COLUMN in_debt`,
		`DELETE FROM schema_migrations WHERE version = 12`,
	} {
		if _, err := conn.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// debtChanges returns the accounts of the migration test written
// through the store: n accounts, every third in debt in dimension 1 of
// 2, and the keys in debt in key order.
func debtChanges(n int) (*store.Changes, []string) {
	c := &store.Changes{}
	var inDebt []string
	for i := range n {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("t%03d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 2, EpochStart: t0, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 100}
		a.Balances[1] = ledger.Balance{Opening: 100, Available: 100}
		if i%3 == 0 {
			a.Balances[1] = ledger.Balance{Opening: 100, Minted: 2, OverdraftIssued: 7, Spent: 107, OverdraftRepaid: 2}
			inDebt = append(inDebt, a.Key.String())
		}
		c.Accounts = append(c.Accounts, a)
	}
	return c, inDebt
}

func writeChanges(t *testing.T, s store.Store, c *store.Changes) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func checkFlagsMatchTerms(t *testing.T, conn *pgx.Conn, step string) {
	t.Helper()
	flags, owes := inDebtFlags(t, conn)
	for key, flag := range flags {
		if flag != owes[key] {
			t.Errorf("%s: %s in_debt %v, terms owe %v", step, key, flag, owes[key])
		}
	}
}

// Migration 12 on a schema at version 11 holding debtors (written by this
// store while the schema had no in_debt) sets the flag of exactly those,
// and AccountsInDebt lists them; then a replica of the older version,
// still running during the rolling upgrade, repays and draws debt with
// writes that know nothing of the column, and the flag follows (the
// triggers). With the column and index added beforehand, as
// docs/OPERATIONS.md has an operator with a large table do, and flags
// written wrong meanwhile, the migration corrects them.
func TestMigration12BackfillsDebtors(t *testing.T) {
	for _, prebuilt := range []bool{false, true} {
		t.Run(fmt.Sprintf("prebuilt=%v", prebuilt), func(t *testing.T) {
			ctx := context.Background()
			s, dsn := openStore(t)
			conn := connectTo(t, dsn)
			schemaAt11(t, conn)
			changes, inDebt := debtChanges(30)
			writeChanges(t, s, changes)
			if prebuilt {
				for _, q := range []string{
					`ALTER TABLE accounts ADD COLUMN IF NOT EXISTS in_debt boolean NOT NULL DEFAULT false`,
					`CREATE INDEX CONCURRENTLY IF NOT EXISTS accounts_in_debt
						ON accounts (subject COLLATE "C", route COLLATE "C", region COLLATE "C", generation) WHERE in_debt`,
					// Written wrong before the migration: set without debt.
					`UPDATE accounts SET in_debt = true WHERE subject = 't001'`,
				} {
					if _, err := conn.Exec(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
			}
			ran, err := postgres.Migrate(ctx, dsn)
			if err != nil || !slices.Equal(ran, []int{12}) {
				t.Fatalf("migrate: ran %v, %v; want [12]", ran, err)
			}
			checkFlagsMatchTerms(t, conn, "after migration 12")
			if got := debtorKeys(t, s); !slices.Equal(got, inDebt) {
				t.Fatalf("AccountsInDebt after migration 12: %v, want %v", got, inDebt)
			}
			// An older replica's writes: its upsert of term rows names no
			// in_debt. t000 repays, t001 draws debt.
			for _, q := range []string{
				`UPDATE account_terms SET minted = minted + 5, available = available, overdraft_repaid = 7, spent = spent
					WHERE dim = 1 AND account_id = (SELECT id FROM accounts WHERE subject = 't000')`,
				`UPDATE account_terms SET overdraft_issued = 4, spent = spent + 4
					WHERE dim = 1 AND account_id = (SELECT id FROM accounts WHERE subject = 't001')`,
			} {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			checkFlagsMatchTerms(t, conn, "after an older replica's writes")
			want := append([]string{ledger.AccountKey{Subject: "t001", Route: "chat", Region: "eu", Generation: 1}.String()}, inDebt[1:]...)
			if got := debtorKeys(t, s); !slices.Equal(got, want) {
				t.Fatalf("AccountsInDebt after an older replica's writes: %v, want %v", got, want)
			}
		})
	}
}

// AccountsInDebt orders keys as bytes whatever the collation of the key
// columns (here ICU's English one, as a database created with it would
// give them, which orders the subjects below a, A, a-c, ab, B), as Go and
// the SQLite store order them (A, B, a, a-c, ab; docs/API.md), and pages
// through them one at a time without skipping or repeating one.
func TestDebtPagesOrderKeysAsBytes(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	conn := connectTo(t, dsn)
	var icu bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'en-x-icu')`).Scan(&icu); err != nil {
		t.Fatal(err)
	}
	if !icu {
		t.Skip("needs PostgreSQL built with ICU (collation en-x-icu)")
	}
	for _, column := range []string{"subject", "route", "region"} {
		q := `ALTER TABLE accounts ALTER COLUMN ` + column + ` TYPE text COLLATE "en-x-icu"`
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var c store.Changes
	var want []string
	subjects := []string{"a", "B", "ab", "a-c", "A"}
	for _, subject := range subjects {
		a := ledger.Account{Key: ledger.AccountKey{Subject: subject, Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: t0, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Minted: 2, OverdraftIssued: 7, Spent: 107, OverdraftRepaid: 2}
		c.Accounts = append(c.Accounts, a)
	}
	slices.Sort(subjects) // Go compares strings as bytes: A, B, a, a-c, ab
	for _, subject := range subjects {
		want = append(want, ledger.AccountKey{Subject: subject, Route: "chat", Region: "eu", Generation: 1}.String())
	}
	writeChanges(t, s, &c)
	var (
		got   []string
		after ledger.AccountKey
	)
	for {
		page, err := s.AccountsInDebt(ctx, store.DebtFilter{After: after, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		got, after = append(got, page[0].Key.String()), page[0].Key
		if len(got) > len(want) {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("debt pages of one: %v, want %v", got, want)
	}
}

// Migration 12 fills the flags from what was committed while it waited for
// its locks, whatever the database's default isolation: under
// default_transaction_isolation=serializable its transaction's snapshot
// was taken at its first statement, before the wait, and a debt a writer
// committed in between was left unflagged (out of every debt page until
// the account's debt next changed).
func TestMigration12SeesWritesItWaitedFor(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	conn := connectTo(t, dsn)
	schemaAt11(t, conn)
	changes, _ := debtChanges(30)
	writeChanges(t, s, changes)
	// An older replica's write, not yet committed: t001 draws debt.
	writer := connectTo(t, dsn)
	wtx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wtx.Exec(ctx, `UPDATE account_terms SET overdraft_issued = 4, spent = spent + 4
		WHERE dim = 1 AND account_id = (SELECT id FROM accounts WHERE subject = 't001')`); err != nil {
		t.Fatal(err)
	}
	migrated := make(chan error, 1)
	go func() {
		_, err := postgres.Migrate(ctx, withParam(t, dsn, "default_transaction_isolation", "serializable"))
		migrated <- err
	}()
	// Wait until the migration waits for the writer's lock.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-migrated:
			t.Fatalf("the migration ended (%v) without waiting for the writer's lock", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the migration never waited for the writer's lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := wtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-migrated; err != nil {
		t.Fatalf("migrate: %v", err)
	}
	checkFlagsMatchTerms(t, conn, "after migration 12 waited for a writer")
}

// The flag's trigger keeps the store's schema whatever the writing
// session's search_path (an operator's SQL naming the schema): the
// function names its tables unqualified, and without its own search_path
// an update of this schema's terms from another search_path failed
// ("relation accounts does not exist") or reached another schema's
// accounts.
func TestInDebtTriggerKeepsItsSchema(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	changes, _ := debtChanges(4)
	writeChanges(t, s, changes)
	conn := connectTo(t, dsn)
	var schema string
	if err := conn.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	q := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		`SET search_path = pg_catalog`,
		`UPDATE ` + q + `.account_terms SET overdraft_issued = 4, spent = spent + 4
			WHERE dim = 1 AND account_id = (SELECT id FROM ` + q + `.accounts WHERE subject = 't001')`,
		`RESET search_path`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	checkFlagsMatchTerms(t, conn, "after an update from another search_path")
}

// Two writers from outside the store, neither locking the account row
// first, change two term rows of one account: A repays the debt of
// dimension 1 and holds its transaction open, B makes dimension 0 owe.
// The flag must end as the terms say (B's debt), so B's trigger has to
// wait for A's, not read the flag A is about to clear.
func TestInDebtFollowsWritersThatDoNotLockTheAccount(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	changes, _ := debtChanges(1) // t000: dimension 1 owes 5
	writeChanges(t, s, changes)
	a, b, watch := connectTo(t, dsn), connectTo(t, dsn), connectTo(t, dsn)
	const account = `(SELECT id FROM accounts WHERE subject = 't000')`
	txA, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	if _, err := txA.Exec(ctx, `UPDATE account_terms SET overdraft_repaid = 7, spent = spent - 5
		WHERE dim = 1 AND account_id = `+account); err != nil {
		t.Fatal(err)
	}
	var bPID int
	if err := b.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&bPID); err != nil {
		t.Fatal(err)
	}
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Exec(ctx, `UPDATE account_terms SET overdraft_issued = 4, spent = spent + 4
			WHERE dim = 0 AND account_id = `+account)
		bDone <- err
	}()
	// Commit A once B waits for a lock, or at once if B finished without
	// waiting (the flag is then left as B found it).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if len(bDone) > 0 {
			break
		}
		var waiting bool
		if err := watch.QueryRow(ctx, `SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1`,
			bPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	checkFlagsMatchTerms(t, watch, "after two writers that did not lock the account")
	if keys := debtorKeys(t, s); len(keys) != 1 {
		t.Errorf("debt pages list %v, want the one account that owes", keys)
	}
}
