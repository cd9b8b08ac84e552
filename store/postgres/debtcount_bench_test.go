package postgres_test

import (
	"context"
	"testing"

	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/storetest"
)

// BenchmarkAccountsInDebtCount is what capledger_debt_accounts costs a
// scrape (at most one every 5 s a replica): one count over the partial
// index accounts_in_debt, with 200,000 accounts of which 50,000 owe.
func BenchmarkAccountsInDebtCount(b *testing.B) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, schemaDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	storetest.FillDebtors(b, s, 200_000, 50_000)
	if _, err := postgres.PoolOf(s).Exec(ctx, `VACUUM ANALYZE accounts`); err != nil {
		b.Fatal(err)
	}
	rows, err := postgres.PoolOf(s).Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) SELECT count(*) FROM accounts WHERE in_debt`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			b.Fatal(err)
		}
		b.Log(line) // the plan: an index only scan of accounts_in_debt
	}
	rows.Close()
	for b.Loop() {
		n, err := s.AccountsInDebtCount(ctx)
		if err != nil || n != 50_000 {
			b.Fatalf("%d, %v; want 50000", n, err)
		}
	}
}
