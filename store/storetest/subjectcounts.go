package storetest

import (
	"context"
	"testing"

	"github.com/capledger/capledger/store"
)

// BenchSubjectCounts times b.N reads of subject's reservation counts by
// route and state (store.Store.ReservationStatesOfSubject, what
// ListSubjectReservations answers with) on a store seeded with want of
// them, failing when the counts do not add up to want; it reports
// ms/count. One loop for every store's benchmark of it.
func BenchSubjectCounts(b *testing.B, s interface {
	ReservationStatesOfSubject(ctx context.Context, subject string) (store.SubjectStates, error)
}, subject string, want int64) {
	b.Helper()
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		st, err := s.ReservationStatesOfSubject(ctx, subject)
		if err != nil {
			b.Fatal(err)
		}
		var total int64
		for _, c := range st.Counts {
			total += c.Count
		}
		if total != want {
			b.Fatalf("counted %d reservations, want %d", total, want)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/count")
}
