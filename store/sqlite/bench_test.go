package sqlite_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
	cpu := cpuTime()
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
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime returns the CPU time (user and system) the process has used: on
// a machine shared with other work it varies far less than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nextID numbers the benchmarks' reservations across runs of one file.
var nextID atomic.Int64

// BenchmarkTxSteps measures the steps of one small engine batch on their
// own: an empty transaction (BEGIN IMMEDIATE, the row cache's data_version
// check, COMMIT without writes), a reservation lookup that finds nothing,
// and a one-reserve write (reservation, journal entry, account) committed
// durably.
//
//	go test -run '^$' -bench TxSteps ./store/sqlite
func BenchmarkTxSteps(b *testing.B) {
	ctx := context.Background()
	s := openTempB(b)
	account := ledger.Account{Key: crashAccount, Dims: 1, EpochStart: t0,
		Balances: ledger.Balances{{Opening: 1 << 40, Available: 1 << 40}}}
	b.Run("begin-rollback", func(b *testing.B) {
		for n := 0; n < b.N; n++ {
			tx, err := s.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			tx.Rollback(ctx)
		}
	})
	b.Run("reservation-get-missing", func(b *testing.B) {
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for n := 0; n < b.N; n++ {
			if _, err := tx.ReservationGet(ctx, fmt.Sprintf("rl-missing-%08d", n)); err == nil {
				b.Fatal("found")
			}
		}
	})
	b.Run("write-one-reserve", func(b *testing.B) {
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for n := 0; n < b.N; n++ {
			r := reservation(fmt.Sprintf("rl-w-%08d", nextID.Add(1)))
			account.Version++
			c := &store.Changes{Accounts: []ledger.Account{account}, Reservations: []ledger.Reservation{r},
				NewReservations: map[string]bool{r.ID: true},
				Journal: []ledger.JournalEntry{{At: t0, Kind: ledger.KindReserve, Account: crashAccount, ReservationID: r.ID,
					From: ledger.StateRequested, To: ledger.StateReserved, Delta: ledger.Balances{{Available: -600, Reserved: 600}}}}}
			if err := tx.Write(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("commit-one-reserve", func(b *testing.B) {
		for n := 0; n < b.N; n++ {
			tx, err := s.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			r := reservation(fmt.Sprintf("rl-c-%08d", nextID.Add(1)))
			account.Version++
			c := &store.Changes{Accounts: []ledger.Account{account}, Reservations: []ledger.Reservation{r},
				NewReservations: map[string]bool{r.ID: true},
				Journal: []ledger.JournalEntry{{At: t0, Kind: ledger.KindReserve, Account: crashAccount, ReservationID: r.ID,
					From: ledger.StateRequested, To: ledger.StateReserved, Delta: ledger.Balances{{Available: -600, Reserved: 600}}}}}
			if err := tx.Write(ctx, c); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
