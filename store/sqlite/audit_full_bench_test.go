package sqlite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// BenchmarkFullAudit runs a full audit (ledger.AuditWith over
// AuditSnapshot: the copy of the database, its reading and the checks) of
// the store in CAPLEDGER_AUDIT_DIR, made by scripts/auditsize, e.g.
//
//	go run ./scripts/auditsize -n 30000 -checkpoint-every 30000 -phases none -dir D
//	CAPLEDGER_AUDIT_DIR=D go test -run '^$' -bench FullAudit -benchmem ./store/sqlite
//
// It reports allocations per reservation as well as per audit.
func BenchmarkFullAudit(b *testing.B) {
	ctx := context.Background()
	s := openAuditDir(b)
	var reservations int64
	audit := func() {
		reservations = 0
		err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			stream := snap.ReservationStream
			snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
				return stream(func(r *ledger.Reservation) error { reservations++; return yield(r) })
			}
			if found, _ := ledger.AuditWith(snap, ledger.AuditOptions{}); len(found) > 0 {
				b.Fatalf("%d discrepancies, the first %s", len(found), found[0])
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	audit()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		audit()
	}
	b.ReportMetric(float64(testing.AllocsPerRun(1, audit))/float64(max(reservations, 1)), "allocs/reservation")
}

// BenchmarkAuditLiveRead times how long a full audit holds its read
// transaction on the live database, which keeps SQLite from restarting
// the WAL: from AuditSnapshot's call until the first reservation is
// yielded, by when the copy is made and the read has ended (the read of
// the policies, checkpoints and the like before the copy included). The
// store is CAPLEDGER_AUDIT_DIR's, as for BenchmarkFullAudit.
func BenchmarkAuditLiveRead(b *testing.B) {
	ctx := context.Background()
	s := openAuditDir(b)
	var held time.Duration
	for b.Loop() {
		start := time.Now()
		err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			return snap.ReservationStream(func(*ledger.Reservation) error {
				held += time.Since(start)
				return errStopEarly
			})
		})
		if !errors.Is(err, errStopEarly) && err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(held.Microseconds())/1000/float64(b.N), "held-ms/op")
}

var errStopEarly = errors.New("stopped at the first reservation")

// openAuditDir opens the store in CAPLEDGER_AUDIT_DIR (scripts/auditsize
// makes one), closed when the benchmark ends; it skips without one.
func openAuditDir(b *testing.B) *Store {
	dir := os.Getenv("CAPLEDGER_AUDIT_DIR")
	if dir == "" {
		b.Skip("CAPLEDGER_AUDIT_DIR names no store (scripts/auditsize makes one)")
	}
	s, err := Open(context.Background(), filepath.Join(dir, "capledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}
