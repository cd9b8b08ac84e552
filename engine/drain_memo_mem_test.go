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
	var memo drainMemo
	before := liveHeap()
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
	held := float64(int64(liveHeap())-int64(before)) / n
	runtime.KeepAlive(&memo)
	t.Logf("the drain memo holds %.1f bytes per active policy key", held)
	if held > 8 {
		t.Fatalf("the drain memo holds %.1f bytes per active policy key, want none (at most 8 of noise)", held)
	}
}

// The drain worker's view of the policies, kept between passes
// (DrainPolicies), holds nothing for a policy key whose only generation
// is active: with a policy per tenant it held every key's active
// generation (about 99 bytes a key, 10 MB at 100,000 tenants). What it
// holds grows with the superseded and rolled-back generations only.
func TestDrainViewHoldsNoKeyPerPolicy(t *testing.T) {
	const n = 50_000
	var known DrainPolicies
	before := liveHeap()
	func() {
		policies := make([]ledger.Policy, 0, n+2)
		for i := range n {
			key := ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat", Region: "eu"}
			policies = append(policies, ledger.Policy{Key: key, Generation: uint64(i + 1), Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100}}})
		}
		// One key with a superseded generation: what the view is for.
		star := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "embed", Region: "eu"}
		for g := uint64(n + 1); g <= n+2; g++ {
			policies = append(policies, ledger.Policy{Key: star, Generation: g, Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100}}})
		}
		known.view = newDrainView(policies, true)
		if len(known.view.superseded) != 1 || known.view.superseded[0] != n+1 {
			t.Fatalf("superseded %v, want [%d]", known.view.superseded, n+1)
		}
	}()
	held := float64(int64(liveHeap())-int64(before)) / n
	runtime.KeepAlive(&known)
	t.Logf("the drain worker's view holds %.1f bytes per policy key", held)
	if held > 8 {
		t.Fatalf("the drain worker's view holds %.1f bytes per policy key whose only generation is active, want none (at most 8 of noise)", held)
	}
}

// liveHeap returns the bytes of the heap live after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
