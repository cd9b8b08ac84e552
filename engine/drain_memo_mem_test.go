package engine

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The drain memo keeps a digest of the active generations its verdicts
// hold for, not their map: with a policy per tenant that map held every
// policy key between passes (about 85 bytes a policy).
func TestDrainMemoHoldsNoKeyPerPolicy(t *testing.T) {
	const n = 50_000
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var memo drainMemo
	before := heap()
	func() {
		active := ledger.ActiveGenerations{}
		for i := range n {
			active[ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat", Region: "eu"}] = uint64(i + 1)
		}
		memo.update(active, nil, nil, false, time.Unix(0, 0))
		if p := memo.plan(active, 1, time.Unix(0, 0)); p.Skip || p.ByPoints {
			t.Fatal("a generation without a verdict is planned")
		}
	}()
	held := float64(int64(heap())-int64(before)) / n
	runtime.KeepAlive(&memo)
	t.Logf("the drain memo holds %.1f bytes per active policy key", held)
	if held > 8 {
		t.Fatalf("the drain memo holds %.1f bytes per active policy key, want none (at most 8 of noise)", held)
	}
}
