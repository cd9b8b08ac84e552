package postgres

import (
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The idle fences query is a constant, so it spells out its range's end.
func TestShardFencePrefixEnd(t *testing.T) {
	if end := store.PrefixEnd(ledger.MetaShardFencePrefix); end != shardFencePrefixEnd {
		t.Errorf("shardFencePrefixEnd %q, want store.PrefixEnd(%q) = %q", shardFencePrefixEnd, ledger.MetaShardFencePrefix, end)
	}
}
