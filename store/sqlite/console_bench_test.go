package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
	"github.com/capledger/capledger/store/storetest"
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

// BenchmarkSubjectStateCounts measures ReservationStatesOfSubject (the
// counts of ConsoleService.ListSubjectReservations) on one subject
// holding n live reservations (CAPLEDGER_BENCH_SUBJECT_RESERVATIONS,
// default 200,000) over 3 routes and 4 states, with ids in no relation
// to their creation order (as gateways' random ids are). The store is
// kept in CAPLEDGER_BENCH_SUBJECT_DB when it is set (seeded when the file
// does not exist, reused when it does: seeding a million takes minutes).
//
//	CAPLEDGER_BENCH_SUBJECT_RESERVATIONS=1000000 go test -run '^$' -bench SubjectStateCounts -benchtime 3x ./store/sqlite
func BenchmarkSubjectStateCounts(b *testing.B) {
	ctx := context.Background()
	n := 200_000
	if v := os.Getenv("CAPLEDGER_BENCH_SUBJECT_RESERVATIONS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	path := os.Getenv("CAPLEDGER_BENCH_SUBJECT_DB")
	if path == "" {
		path = filepath.Join(b.TempDir(), "capledger.db")
	}
	_, statErr := os.Stat(path)
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if statErr != nil {
		seedOneSubject(b, s, n)
	}
	storetest.BenchSubjectCounts(b, s, "tenant7", int64(n))
}

// seedOneSubject writes n reservations of tenant7 in transactions of
// 2,000 and flushes the subject index every 50,000.
func seedOneSubject(b *testing.B, s *sqlite.Store, n int) {
	ctx := context.Background()
	routes := []string{"chat", "embed", "image"}
	states := []ledger.State{ledger.StateReserved, ledger.StateStarted, ledger.StateUsageUnknown, ledger.StateSettled}
	for from := 0; from < n; from += 2000 {
		c := &store.Changes{NewReservations: map[string]bool{}}
		for i := from; i < min(n, from+2000); i++ {
			// A bijection of i scattered over 64 bits: ids in no order.
			x := uint64(i)*0x9E3779B97F4A7C15 ^ 0x5851F42D4C957F2D
			r := reservation(fmt.Sprintf("%016x", x))
			r.Account.Route = routes[i%len(routes)]
			r.State = states[i%len(states)]
			r.CreatedAt = t0.Add(time.Duration(i) * time.Millisecond)
			if r.State != ledger.StateReserved {
				r.OperationID, r.StartedAt = "op", r.CreatedAt
			}
			if r.State == ledger.StateSettled {
				r.Actual, r.FinishedAt = ledger.Amounts{300}, r.CreatedAt
			}
			c.Reservations = append(c.Reservations, r)
			c.NewReservations[r.ID] = true
		}
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
		// These writes journal nothing, so the index could not catch up
		// from the journal: flush before pending reaches its cap.
		if from%50_000 == 0 {
			if err := s.FlushSubjectIndex(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := s.FlushSubjectIndex(ctx); err != nil {
		b.Fatal(err)
	}
}
