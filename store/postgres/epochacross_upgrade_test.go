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

// A schema of version 18 migrates to 19 with the index across
// generations built over the accounts already there: AccountsByEpoch
// across generations lists them all, in (epoch start, key, generation)
// order, in pages. The schema "at version 18" is one at 19 without
// version 19's index.
func TestEpochIndexAcrossGenerationsUpgrade(t *testing.T) {
	ctx := context.Background()
	s, dsn := openStore(t)
	epoch := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	var accounts []ledger.Account
	for i := range 30 {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("s%02d", i%10), Route: "chat", Region: "eu",
			Generation: uint64(i/10 + 1)}, Dims: 1, EpochStart: epoch.Add(time.Duration((i*7)%4) * time.Hour), Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 90, Reserved: 10}
		a.EpochOpening[0] = ledger.Balance{Opening: 100, Available: 100}
		accounts = append(accounts, a)
	}
	writeChanges(t, s, &store.Changes{Accounts: accounts})
	s.Close()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{"DROP INDEX accounts_by_epoch_across", "DELETE FROM schema_migrations WHERE version = 19"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	upgraded, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer upgraded.Close()
	var built int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_indexes WHERE indexname = 'accounts_by_epoch_across' AND schemaname = current_schema()").Scan(&built); err != nil || built != 1 {
		t.Fatalf("accounts_by_epoch_across after the upgrade: %d, %v", built, err)
	}
	slices.SortFunc(accounts, func(x, y ledger.Account) int {
		if c := x.EpochStart.Compare(y.EpochStart); c != 0 {
			return c
		}
		if x.Key.Subject != y.Key.Subject {
			if x.Key.Subject < y.Key.Subject {
				return -1
			}
			return 1
		}
		return int(x.Key.Generation) - int(y.Key.Generation)
	})
	for _, bound := range []time.Time{{}, epoch, epoch.Add(2 * time.Hour)} {
		var want []ledger.AccountKey
		for _, a := range accounts {
			if bound.IsZero() || !a.EpochStart.After(bound) {
				want = append(want, a.Key)
			}
		}
		var got []ledger.AccountKey
		f := store.EpochFilter{AllGenerations: true, StartedBy: bound, Limit: 4}
		for range 100 {
			page, next, err := upgraded.AccountsByEpoch(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range page {
				got = append(got, a.Key)
			}
			if len(page) < f.Limit {
				break
			}
			f.After = next
		}
		if !slices.Equal(got, want) {
			t.Errorf("by %v after the upgrade:\n got %v\nwant %v", bound, got, want)
		}
	}
}
