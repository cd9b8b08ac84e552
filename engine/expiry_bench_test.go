package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkExpiry measures the expiry worker's path per hold, over SQLite:
// Due lists the holds past their TTL (id, state and due time, no re-read),
// and the claim and expire commands go through the engine's queue, the
// ledger and one store transaction per chunk. One op is one expired hold; the holds are made
// (and the clock moved past their TTL) before the timer starts.
//
//	go test -run '^$' -bench Expiry -benchmem -benchtime 5000x ./engine
func BenchmarkExpiry(b *testing.B) {
	e, now := expiryFixture(b, b.N)
	b.ResetTimer()
	if expired := expireAll(b, e, now); expired != b.N {
		b.Fatalf("expired %d holds, want %d", expired, b.N)
	}
}

// expiryFixture returns an engine over a fresh SQLite file holding n
// RESERVED holds, and a time past their TTL.
func expiryFixture(tb testing.TB, n int) (*Engine, time.Time) {
	tb.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(tb.TempDir(), "capledger.db"))
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	e := New(st, Options{DisableWorkers: true, Clock: func() time.Time { return now }})
	tb.Cleanup(func() { e.Close(); st.Close() })
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1 << 50, RefillUnits: 1, RefillInterval: time.Hour}},
		HoldTTL:    time.Minute,
	}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		tb.Fatalf("publish: %v %v", err, res.Err)
	}
	cmds := make([]ledger.Command, 0, 500)
	for made := 0; made < n; made += len(cmds) {
		cmds = cmds[:0]
		for range min(cap(cmds), n-made) {
			cmds = append(cmds, benchReserve())
		}
		if _, err := e.DoBatch(ctx, cmds); err != nil {
			tb.Fatal(err)
		}
	}
	now = now.Add(2 * time.Minute) // the engine's clock too
	return e, now
}

// expireAll runs the expiry worker's passes until nothing is due at now
// and returns how many holds it expired.
func expireAll(tb testing.TB, e *Engine, now time.Time) int {
	tb.Helper()
	expired := 0
	for {
		due, err := e.core.Due(context.Background(), now, duePage)
		if err != nil {
			tb.Fatal(err)
		}
		if len(due) == 0 {
			return expired
		}
		if !e.runWorkerCommands(context.Background(), &e.fails.expiry, due, nil) {
			tb.Fatal("worker batch failed")
		}
		expired += len(due) / 2
	}
}
