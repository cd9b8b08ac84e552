package sqlite_test

import (
	"context"
	"testing"

	"github.com/capledger/capledger/store/storetest"
)

// BenchmarkAccountsInDebtCount is what capledger_debt_accounts costs a
// scrape (at most one every 5 s): one count over account_debtors, with
// 200,000 accounts of which 50,000 owe.
func BenchmarkAccountsInDebtCount(b *testing.B) {
	ctx := context.Background()
	s := openTempB(b)
	storetest.FillDebtors(b, s, 200_000, 50_000)
	for b.Loop() {
		n, err := s.AccountsInDebtCount(ctx)
		if err != nil || n != 50_000 {
			b.Fatalf("%d, %v; want 50000", n, err)
		}
	}
}
