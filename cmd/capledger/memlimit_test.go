package main

import (
	"testing"

	"github.com/capledger/capledger/store/sqlite"
)

// At the default row cache, serve's soft memory limit plus what its RSS
// holds outside the Go runtime, plus room for the collector's overshoot,
// stays within the 600 MB (600,000 kB) a million accounts may take: the
// heap sits at the limit while the expiry of a million holds runs beside
// a checkpoint cut (docs/PERFORMANCE.md, "RSS and the checkpoint cut").
func TestServeMemoryLimitKeepsAMillionAccountsWithin600MB(t *testing.T) {
	const (
		budgetKiB = 600_000
		// What serve's RSS holds that the Go runtime does not count
		// (SQLite's page caches, the binary): 66-72 MiB measured with a
		// million accounts.
		serveOutsideGo = 72 << 20
		overshoot      = 24 << 20
	)
	limit := serveMemoryLimit(sqlite.DefaultCacheRows)
	if total := (limit + serveOutsideGo + overshoot) >> 10; total > budgetKiB {
		t.Fatalf("limit %d MiB + %d MiB outside Go + %d MiB overshoot = %d kB, over %d kB",
			limit>>20, serveOutsideGo>>20, overshoot>>20, total, budgetKiB)
	}
	// A full cache of packed tenants (about 257 bytes each: the account
	// and its current generation, store/sqlite TestPackedCacheBytesPerTenant).
	if limit < int64(sqlite.DefaultCacheRows)*275+200<<20 {
		t.Fatalf("limit %d MiB leaves a full cache (about 257 bytes a row) and a cut's replays little room", limit>>20)
	}
}
