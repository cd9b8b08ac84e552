package envoyrls

import (
	"testing"

	"github.com/capledger/capledger/ledger"
)

// TestViewCacheIsBounded: views of ever new generations do not pile up
// past maxViews.
func TestViewCacheIsBounded(t *testing.T) {
	var c viewCache
	p := ledger.Policy{Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 10}}}
	for gen := range uint64(3 * maxViews) {
		c.put(viewKey{generation: gen + 1, route: "r", unit: "tokens"}, newLimitView(&p, "r", "tokens"))
	}
	n := 0
	c.m.Range(func(any, any) bool { n++; return true })
	if n == 0 || n > maxViews {
		t.Fatalf("%d views cached after %d generations; want 1..%d", n, 3*maxViews, maxViews)
	}
	if _, ok := c.get(viewKey{generation: 3 * maxViews, route: "r", unit: "tokens"}); !ok {
		t.Fatal("the last view stored is not cached")
	}
}
