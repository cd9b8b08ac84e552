package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// BenchmarkFullAudit runs a full audit (ledger.AuditWith over
// AuditSnapshot: the copy into the spill, its reading and the checks) of
// the store in CAPLEDGER_AUDIT_DIR, made by scripts/auditsize, e.g.
//
//	go run ./scripts/auditsize -n 30000 -checkpoint-every 30000 -phases none -dir D
//	CAPLEDGER_AUDIT_DIR=D go test -run '^$' -bench FullAudit -benchmem ./store/sqlite
//
// It reports allocations per reservation as well as per audit.
func BenchmarkFullAudit(b *testing.B) {
	dir := os.Getenv("CAPLEDGER_AUDIT_DIR")
	if dir == "" {
		b.Skip("CAPLEDGER_AUDIT_DIR names no store (scripts/auditsize makes one)")
	}
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(dir, "capledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
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
