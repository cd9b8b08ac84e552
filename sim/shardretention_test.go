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

// Seed 6217 (found by the release gate's run of 1,000,000 interleavings):
// a gateway's issuance is refused, a delayed earlier copy then issues the
// shard, the gateway's closing submission reconciles it whole with its
// answer lost, retention removes it, and the resend is answered
// SHARD_NOT_FOUND. The gateway never held the shard, and that is right:
// the checker must accept it rather than report a shard its gateway never
// learnt of.
func TestShardIssuedLateClosedAndRemovedBeforeTheResend(t *testing.T) {
	cfg := DefaultConfig()
	var trace bytes.Buffer
	cfg.Trace = &trace
	if o := RunOne(&cfg, 6217); o.Violation != nil {
		t.Fatalf("seed 6217:\n%s", o.Violation.Report())
	}
	if !strings.Contains(trace.String(), "closed: issued late, reconciled whole by an earlier copy, removed by retention") {
		t.Fatal("seed 6217 no longer closes a shard retention removed: the case is untested (find another seed with `capledger sim`)")
	}
}
