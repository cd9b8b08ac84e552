package sim

import (
	"bytes"
	"strings"
	"testing"
)

// Shard retention runs in the interleavings where the retention worker
// does: over a fixed set of seeds some remove emergency shards, gateways
// resubmit for some of them, and every gate passes (the full audit runs
// after every pass that removed shards), and a seed that removes shards
// replays byte for byte.
func TestShardRetentionRemovesShards(t *testing.T) {
	cfg := DefaultConfig()
	var removed, late int64
	replayed := false
	for seed := uint64(1); seed <= 60; seed++ {
		o := RunOne(&cfg, seed)
		if o.Violation != nil {
			t.Fatalf("seed %d:\n%s", seed, o.Violation.Report())
		}
		if o.ShardsRemoved > 0 && !o.Retention {
			t.Fatalf("seed %d removed %d shards with the retention worker off", seed, o.ShardsRemoved)
		}
		removed += o.ShardsRemoved
		late += o.LateShardResends
		if o.ShardsRemoved > 0 && o.LateShardResends > 0 && !replayed {
			replayed = true
			var first, second bytes.Buffer
			c := cfg
			c.Trace = &first
			RunOne(&c, seed)
			c.Trace = &second
			RunOne(&c, seed)
			if !strings.Contains(first.String(), "shards removed") || !bytes.Equal(first.Bytes(), second.Bytes()) {
				t.Fatalf("seed %d: the trace (%d and %d bytes) differs between runs or shows no removal", seed, first.Len(), second.Len())
			}
		}
	}
	if removed == 0 || late == 0 {
		t.Fatalf("60 seeds removed %d shards, resubmitted for %d: shard retention went unexercised", removed, late)
	}
	t.Logf("60 seeds removed %d shards; %d late resubmissions", removed, late)
}
