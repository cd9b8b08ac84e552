package ledger

import (
	"fmt"
	"testing"
)

// idCache gives every key its own accountID, whichever keys share a slot
// and however often each comes back: keys differing in one field only,
// and more keys than slots, seen in turn and again.
func TestIDCacheGivesEachKeyItsID(t *testing.T) {
	ids, cache := newAccountIDs(), newIDCache()
	var keys []AccountKey
	for i := range 3 * idCacheSize {
		keys = append(keys, AccountKey{Subject: fmt.Sprintf("s%d", i%(idCacheSize+7)), Route: fmt.Sprintf("r%d", i%3), Region: "eu", Generation: uint64(i % 2)})
	}
	keys = append(keys, AccountKey{Subject: "s1", Route: "r1", Region: "us", Generation: 1}, AccountKey{Subject: "s1", Route: "r1", Region: "eu", Generation: 1})
	for round := range 2 {
		for _, k := range keys {
			if got, want := cache.of(ids, k), ids.of(k); got != want {
				t.Fatalf("round %d: key %v: cached id %x, want %x", round, k, got, want)
			}
		}
	}
}

// The journal's accounts: the same 100 again and again (a cache of
// theirs always hits), or a new one every time (it never does).
func BenchmarkAccountIDs(b *testing.B) {
	keys := make([]AccountKey, 1<<16)
	for i := range keys {
		keys[i] = AccountKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "bench", Region: "eu", Generation: 1}
	}
	for _, c := range []struct {
		name   string
		cached bool
		cycle  int
	}{{"sha256/100", false, 100}, {"cached/100", true, 100}, {"sha256/65536", false, len(keys)}, {"cached/65536", true, len(keys)}} {
		b.Run(c.name, func(b *testing.B) {
			ids, cache := newAccountIDs(), newIDCache()
			var sink accountID
			for i := 0; b.Loop(); i++ {
				k := keys[i%c.cycle]
				if c.cached {
					sink = cache.of(ids, k)
				} else {
					sink = ids.of(k)
				}
			}
			_ = sink
		})
	}
}
