package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkCommitBesideAudit measures what an open audit read costs the
// commits and reads beside it: each op commits 16 reserves (reservation,
// journal entry, account) and then reads 4 reservations through the read
// pool, on a store of 100,000 reservations. "pinned" holds an audit's read
// transaction open for the whole run (its journal stream waits after the
// first entry), as an audit paced beside admission did for tens of
// seconds: SQLite cannot reset the WAL past the audit's read mark, so the
// WAL grows with every commit. "copied" waits the same way in the
// reservation stream of a full audit, which reads its copy of the
// database once the transaction has ended. wal-MB is the WAL's size at the end.
// Run them interleaved, e.g.
//
//	go test -run '^$' -bench CommitBesideAudit -benchtime 4000x -count 3 ./store/sqlite/
func BenchmarkCommitBesideAudit(b *testing.B) {
	for _, audit := range []string{"alone", "pinned", "copied"} {
		b.Run(audit, func(b *testing.B) { commitBesideAudit(b, audit) })
	}
}

func commitBesideAudit(b *testing.B, audit string) {
	ctx := context.Background()
	s := openTempB(b)
	path := walPath(b, s)
	account := ledger.Account{Key: crashAccount, Dims: 1, EpochStart: t0,
		Balances: ledger.Balances{{Opening: 1 << 50, Available: 1 << 50}}}
	commit := func(prefix string, n int) []string {
		tx, err := s.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		c := &store.Changes{NewReservations: map[string]bool{}}
		ids := make([]string, n)
		for i := range n {
			r := reservation(fmt.Sprintf("%s-%08d", prefix, nextID.Add(1)))
			ids[i] = r.ID
			account.Version++
			c.Reservations = append(c.Reservations, r)
			c.NewReservations[r.ID] = true
			c.Journal = append(c.Journal, ledger.JournalEntry{At: t0, Kind: ledger.KindReserve, Account: crashAccount, ReservationID: r.ID,
				From: ledger.StateRequested, To: ledger.StateReserved, Delta: ledger.Balances{{Available: -600, Reserved: 600}}})
		}
		c.Accounts = []ledger.Account{account}
		if err := tx.Write(ctx, c); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		return ids
	}
	for range 100 {
		commit("seed", 1000)
	}
	if audit != "alone" {
		held, release := make(chan struct{}), make(chan struct{})
		go s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			n := 0
			wait := func() {
				if n++; n == 1 {
					close(held)
					<-release
				}
			}
			if audit == "copied" {
				return snap.ReservationStream(func(*ledger.Reservation) error { wait(); return nil })
			}
			return snap.JournalStream(func(int64, *ledger.JournalEntry) error { wait(); return nil })
		})
		<-held
		defer close(release)
	}
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	for range b.N {
		ids := commit("op", 16)
		for _, id := range ids[:4] {
			if _, err := s.ReservationGet(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
	if st, err := os.Stat(path); err == nil {
		b.ReportMetric(float64(st.Size())/(1<<20), "wal-MB")
	}
}

// walPath is the WAL file of s.
func walPath(b *testing.B, s *sqlite.Store) string {
	b.Helper()
	return s.Path() + "-wal"
}
