package server

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// generatedPolicies is a Ledger that reads n policies, one per subject,
// decoded afresh on every read as a store returns them (each row its own
// strings and dimensions), so the heap after a load holds only what the
// cache keeps. burst(i) is subject i's burst.
type generatedPolicies struct {
	Ledger
	n     int
	burst func(i int) ledger.Units
}

func (l *generatedPolicies) row(i int) ledger.Policy {
	return ledger.Policy{
		Key:        ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: strings.Clone("chat"), Region: strings.Clone("eu")},
		Generation: uint64(i + 1),
		Dimensions: []ledger.Dimension{{Unit: strings.Clone("tokens"), RefillUnits: 10, RefillInterval: time.Second, Burst: l.burst(i)}},
		HoldTTL:    time.Minute, ExecutionLimit: 10 * time.Minute, FairnessWeight: 1, Rollout: ledger.RolloutEnforce,
		EpochLength: time.Hour, PublishedAt: time.Unix(1765000000, int64(i)).UTC(),
	}
}

// PoliciesPage returns up to f.Limit rows after f.After, each its key's
// only generation (active).
func (l *generatedPolicies) PoliciesPage(_ context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	var out []store.ListedPolicy
	for i := int(f.After); i < l.n && len(out) < f.Limit; i++ {
		out = append(out, store.ListedPolicy{Policy: l.row(i), Active: true})
	}
	return out, nil
}

func (l *generatedPolicies) Policies(context.Context) ([]ledger.Policy, error) {
	var out []ledger.Policy
	for i := range l.n {
		out = append(out, l.row(i))
	}
	return out, nil
}

// liveHeap returns the bytes the heap holds after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// cacheBytesPerPolicy loads n policies into a new cache (the warm load of
// a start) and returns the heap it holds per policy.
func cacheBytesPerPolicy(t *testing.T, n int, burst func(int) ledger.Units) float64 {
	t.Helper()
	l := &generatedPolicies{n: n, burst: burst}
	before := liveHeap()
	cache := newPolicyCache(l)
	if _, err := cache.load(context.Background()); err != nil {
		t.Fatal(err)
	}
	after := liveHeap()
	if p, ok := cache.active(ledger.PolicyKey{Subject: "tenant-7", Route: "chat", Region: "eu"}); !ok || p.Generation != 8 || p.Dimensions[0].Burst != burst(7) {
		t.Fatalf("tenant-7 decides %+v, %v", p, ok)
	}
	runtime.KeepAlive(cache)
	return float64(int64(after)-int64(before)) / float64(n)
}

// The policy cache holds a few hundred bytes per policy with a policy per
// tenant: what tenants' generations share (their terms: route, region,
// dimensions, durations, weights) is kept once, and a key's generations
// are indexed in one map. It held about 505 bytes per policy (this test)
// when each generation kept its own decoded copy and three maps indexed
// them (docs/PERFORMANCE.md, "Many policies"); with a burst per tenant
// (nothing to share) a policy costs about 10% more than it did then.
func TestPolicyCacheBytesPerPolicy(t *testing.T) {
	const n = 50_000
	same := cacheBytesPerPolicy(t, n, func(int) ledger.Units { return 1000 })
	distinct := cacheBytesPerPolicy(t, n, func(i int) ledger.Units { return ledger.Units(1000 + i) })
	t.Logf("%d policies, one per subject: %.0f bytes each with the same terms, %.0f with a burst each", n, same, distinct)
	if same > maxCacheBytesSameTerms {
		t.Errorf("the cache holds %.0f bytes per policy of the same terms, want at most %d", same, maxCacheBytesSameTerms)
	}
	if distinct > maxCacheBytesDistinctTerms {
		t.Errorf("the cache holds %.0f bytes per policy with distinct terms, want at most %d", distinct, maxCacheBytesDistinctTerms)
	}
}

// The bounds of TestPolicyCacheBytesPerPolicy, with a margin of about a
// quarter over what it measured.
const (
	maxCacheBytesSameTerms     = 290
	maxCacheBytesDistinctTerms = 700
)
