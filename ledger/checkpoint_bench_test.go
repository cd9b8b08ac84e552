package ledger

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkCheckpointCut cuts the first checkpoint of a ledger of 20,000
// accounts with two journal entries each, streamed and emitted an account
// at a time, as the engine's cut does: allocations per op are the cut's
// garbage apart from the store's.
func BenchmarkCheckpointCut(b *testing.B) {
	const n = 20000
	var entries []JournalEntry
	for i := range 2 * n {
		e := JournalEntry{At: time.Unix(1_700_000_000, int64(i)).UTC(), Kind: 1, ReservationID: fmt.Sprintf("prefill-bench.reserve-%d", i%n),
			Account: AccountKey{Subject: fmt.Sprintf("bench-%d", i%n), Route: "bench.reserve", Region: "default", Generation: 1}}
		e.Delta[0] = Balance{Minted: 10, Available: 9, Reserved: 1}
		entries = append(entries, e)
	}
	snap := builderLedger(&Checkpoint{}, entries)
	snap.Checkpoints = nil
	snap = streams(snap)
	b.ReportAllocs()
	for b.Loop() {
		var emitted int
		found, c := AuditWith(snap, AuditOptions{SinceCheckpoint: true, Cut: int64(len(entries)), CutAt: time.Unix(1_700_001_000, 0),
			Emit: func(*CheckpointAccount) error { emitted++; return nil }})
		if len(found) > 0 || c == nil || emitted != n {
			b.Fatalf("cut: %v, %v, %d", found, c != nil, emitted)
		}
	}
}
