package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkSubjectIndexCost measures what the console's index
// reservation_subjects costs the ledger's writes: per op, 100
// reservations are inserted, then started, then settled, in three
// durable transactions (the index holds no state, so only the insert
// makes an entry; since schema version 12 the entry waits in pending, and
// "index=true" flushes every pending entry at the end, inside the timed
// loop). "index=false" never flushes: the baseline, measured in the same
// run. It reports CPU time per op (the flusher's included) and, where
// SQLite's dbstat table is compiled in, the index's bytes per
// reservation.
//
//	go test -run '^$' -bench SubjectIndexCost -benchtime 200x ./store/sqlite
func BenchmarkSubjectIndexCost(b *testing.B) {
	const perBatch = 100
	ctx := context.Background()
	for _, indexed := range []bool{true, false} {
		b.Run(fmt.Sprintf("index=%v", indexed), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "capledger.db")
			s, err := sqlite.Open(ctx, path, sqlite.WithSubjectIndexFlush(time.Hour, 1<<30))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			// commit reads every reservation it updates, as the engine
			// does (a blind write takes the upsert, which names every
			// column).
			commit := func(c *store.Changes) {
				tx, err := s.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				for i := range c.Reservations {
					if id := c.Reservations[i].ID; !c.NewReservations[id] {
						if _, err := tx.ReservationGet(ctx, id); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := tx.Write(ctx, c); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
			}
			rows := make([]ledger.Reservation, perBatch)
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				c := &store.Changes{NewReservations: make(map[string]bool, perBatch)}
				for i := range rows {
					r := reservation(fmt.Sprintf("rl-%08d-%03d", n, i))
					// Subjects spread as tenants would be.
					r.Account.Subject = fmt.Sprintf("tenant-%03d", (n*perBatch+i)%1000)
					r.CreatedAt = t0.Add(time.Duration(n*perBatch+i) * time.Millisecond)
					rows[i] = r
					c.NewReservations[r.ID] = true
				}
				c.Reservations = rows
				commit(c)
				for i := range rows {
					rows[i].State, rows[i].OperationID, rows[i].StartedAt = ledger.StateStarted, "op", rows[i].CreatedAt
				}
				commit(&store.Changes{Reservations: rows})
				for i := range rows {
					rows[i].State, rows[i].Actual, rows[i].FinishedAt = ledger.StateSettled, ledger.Amounts{300}, rows[i].CreatedAt
				}
				commit(&store.Changes{Reservations: rows})
			}
			if indexed {
				if err := s.FlushSubjectIndex(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			if indexed {
				db, err := sql.Open("sqlite", path)
				if err != nil {
					b.Fatal(err)
				}
				defer db.Close()
				var bytes int64
				if db.QueryRow("SELECT sum(pgsize) FROM dbstat WHERE name = 'reservation_subjects'").Scan(&bytes) == nil {
					b.ReportMetric(float64(bytes)/float64(b.N*perBatch), "index-B/reservation")
				}
			}
		})
	}
}
