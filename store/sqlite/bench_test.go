package sqlite_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// BenchmarkCommitBatch measures one engine group commit: 100 new
// reservations, 100 journal entries and one account update in one
// transaction, durable (WAL fsync) on return. rows/s counts the 201 rows.
func BenchmarkCommitBatch(b *testing.B) {
	const perBatch = 100
	ctx := context.Background()
	s := openTempB(b)
	account := ledger.Account{Key: crashAccount, Dims: 2, EpochStart: t0,
		Balances: ledger.Balances{{Opening: 1 << 40, Available: 1 << 40}, {Opening: 1 << 20, Available: 1 << 20}}}
	c := &store.Changes{NewReservations: make(map[string]bool, perBatch)}
	c.Reservations = make([]ledger.Reservation, perBatch)
	c.Journal = make([]ledger.JournalEntry, perBatch)
	c.Accounts = []ledger.Account{account}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		clear(c.NewReservations)
		for i := 0; i < perBatch; i++ {
			r := reservation(fmt.Sprintf("rl-%08d-%03d", n, i))
			r.Reserved = ledger.Amounts{600, 1}
			c.Reservations[i] = r
			c.NewReservations[r.ID] = true
			c.Journal[i] = ledger.JournalEntry{At: t0, Kind: ledger.KindReserve, Account: crashAccount, ReservationID: r.ID,
				From: ledger.StateRequested, To: ledger.StateReserved,
				Delta: ledger.Balances{{Available: -600, Reserved: 600}, {Available: -1, Reserved: 1}}}
			c.Accounts[0].Balances[0].Available -= 600
			c.Accounts[0].Balances[0].Reserved += 600
		}
		c.Accounts[0].Version++
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := tx.Write(ctx, c); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*(2*perBatch+1))/b.Elapsed().Seconds(), "rows/s")
}
