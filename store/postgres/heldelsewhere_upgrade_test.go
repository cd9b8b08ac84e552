package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/storetest"
)

// A schema of version 21 (no account_terms.held_elsewhere) migrates to 22
// with its accounts as they were and 0 held elsewhere in every dimension;
// a count written after the upgrade reads back, in a dimension past the
// first too. The schema "at version 21" is one at 22 without the column.
func TestHeldElsewhereUpgrade(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	key := ledger.AccountKey{Subject: "tenant-a", Route: "chat", Region: "eu", Generation: 3}
	old := ledger.Account{Key: key, Dims: 2, EpochStart: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC), Version: 9,
		Balances:   ledger.Balances{{Opening: 1000, Available: 400, Reserved: 600}, {Opening: 5, Available: 5}},
		RefilledTo: [ledger.MaxDimensions]int64{1764720000000000000, 1764720000000000000}}
	old.EpochOpening = old.Balances
	writeChanges(t, s, &store.Changes{Accounts: []ledger.Account{old}})
	s.Close()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"ALTER TABLE account_terms DROP COLUMN held_elsewhere", "DELETE FROM schema_migrations WHERE version = 22"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	upgraded, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer upgraded.Close()
	got, err := upgraded.AccountGet(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got != old {
		t.Fatalf("after the upgrade: %+v, want %+v (held elsewhere 0)", got, old)
	}
	a := old
	a.HeldElsewhere = ledger.Amounts{0, 600}
	a.Version++
	writeChanges(t, upgraded, &store.Changes{Accounts: []ledger.Account{a}})
	if got, err := upgraded.AccountGet(ctx, key); err != nil || got.HeldElsewhere != a.HeldElsewhere {
		t.Fatalf("written with %v held elsewhere, read back %v, %v", a.HeldElsewhere, got.HeldElsewhere, err)
	}
}

// Holds outstanding under a superseded generation in a schema of version
// 22 are counted by version 23's migration (storetest.HeldElsewhereUpgrade).
// Every term row's held_elsewhere is 5 before it (0 is what version 22
// left, a wrong count anywhere is what this checks): the migration sets
// the current account's and clears every other one.
func TestHeldElsewhereCountedAtTheUpgrade(t *testing.T) {
	s, dsn := openStore(t)
	storetest.HeldElsewhereUpgrade(t, s, func(t *testing.T) store.Store {
		s.Close()
		wrongCountsAtVersion22(t, dsn)
		return openUpgraded(t, dsn)
	})
}

// The migration to version 23 takes its EXCLUSIVE locks before it reads the
// accounts: a replica's transaction that wrote accounts and has not
// committed makes it wait (so it counts what that transaction commits,
// and the replica's later writes wait for it in turn), and it goes on
// once that transaction ends.
func TestHeldElsewhereCountWaitsForWriters(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	s.Close()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DELETE FROM schema_migrations WHERE version = 23"); err != nil {
		t.Fatal(err)
	}
	writer, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	// Any write takes ROW EXCLUSIVE on the table, as a command's does.
	if _, err := writer.Exec(ctx, "UPDATE accounts SET breaches = breaches WHERE false"); err != nil {
		t.Fatal(err)
	}
	done := migrateUntilItAsksForAccounts(t, dsn, "mode = 'ExclusiveLock' AND NOT granted")
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("migrate after the writer committed: %v", err)
	}
}

// A replica's command first reads its rows FOR NO KEY UPDATE (a ROW SHARE
// lock on the table) and writes them later. The migration to version 23
// must wait for such a command to end rather than take its lock beside
// it: with SHARE it did, the command's write then waited for the
// migration and the migration's clearing for the command's row locks,
// and PostgreSQL ended one of them with a deadlock (the migration, which
// is not retried, failed the upgrade).
func TestHeldElsewhereCountWaitsForACommandThatHasOnlyRead(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	storetest.HeldElsewhereUpgrade(t, s, func(t *testing.T) store.Store {
		s.Close()
		conn := wrongCountsAtVersion22(t, dsn)
		command, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer command.Rollback(ctx)
		if _, err := command.Exec(ctx, "SELECT 1 FROM account_terms FOR NO KEY UPDATE"); err != nil {
			t.Fatal(err)
		}
		// The command's write below comes after the migration asked for
		// its lock.
		done := migrateUntilItAsksForAccounts(t, dsn, "mode IN ('ShareLock', 'ExclusiveLock')")
		if _, err := command.Exec(ctx, "UPDATE account_terms SET held_elsewhere = held_elsewhere WHERE false"); err != nil {
			t.Fatalf("the command's write beside the migration: %v", err)
		}
		if err := command.Commit(ctx); err != nil {
			t.Fatalf("the command's commit beside the migration: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("migrate beside a command that had read: %v", err)
		}
		return openUpgraded(t, dsn)
	})
}

// wrongCountsAtVersion22 takes the store at dsn back to schema version 22
// with every term row's held_elsewhere at 5 (0 is what version 22 left; a
// wrong count anywhere is what the migration must clear), and returns a
// connection to it, closed when the test ends.
func wrongCountsAtVersion22(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	for _, q := range []string{"UPDATE account_terms SET held_elsewhere = 5", "DELETE FROM schema_migrations WHERE version = 23"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return conn
}

// openUpgraded opens the store at dsn, which migrates it, closed when the
// test ends.
func openUpgraded(t *testing.T, dsn string) store.Store {
	t.Helper()
	upgraded, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { upgraded.Close() })
	return upgraded
}

// migrateUntilItAsksForAccounts runs the migrations in the background and
// returns once the migration holds or waits for a lock on accounts that
// lockIs (a condition on pg_locks) describes; the channel gets its
// result. The test fails if the migration ends first.
func migrateUntilItAsksForAccounts(t *testing.T, dsn, lockIs string) <-chan error {
	t.Helper()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := postgres.Migrate(ctx, withParam(t, dsn, "lock_timeout", "60s"))
		done <- err
	}()
	watch, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	for range 600 {
		asked := false
		if err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = 'accounts'::regclass AND pid <> pg_backend_pid() AND `+lockIs+`)`).Scan(&asked); err != nil {
			t.Fatal(err)
		}
		if asked {
			return done
		}
		select {
		case err := <-done:
			t.Fatalf("the migration ended (%v) while a command's transaction was open", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("the migration never asked for a lock on accounts (%s)", lockIs)
	return nil
}
