package sim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
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
	cfg.TwoUnits = true // the shapes of the run that found it
	var trace bytes.Buffer
	cfg.Trace = &trace
	if o := RunOne(&cfg, 6217); o.Violation != nil {
		t.Fatalf("seed 6217:\n%s", o.Violation.Report())
	}
	if !strings.Contains(trace.String(), "closed: issued late, reconciled whole by an earlier copy, removed by retention") {
		t.Fatal("seed 6217 no longer closes a shard retention removed: the case is untested (find another seed with `capledger sim`)")
	}
}

// A removed shard's id is free again: a new row under it with another
// issue time is the id's next life, its remint moves (named by its issue
// time) are its own, while a row or remint move naming the removed life
// still fails.
func TestShardChecksTellLivesOfOneIDApart(t *testing.T) {
	cfg := DefaultConfig()
	issued := epoch0.Add(time.Minute)
	reissued := issued.Add(5 * time.Minute)
	fresh := func() *world {
		w := newWorld(&cfg, 1, hooks{})
		w.shards.init(w)
		s := &w.shards
		s.rows["sh-1"] = ledger.Shard{ID: "sh-1", Allocated: ledger.Amounts{100}, IssuedAt: issued, Reconciled: true, Reminted: ledger.Amounts{100}}
		s.removed["sh-1"] = true
		s.issued["sh-1"] = ledger.Amounts{50}
		sh := &simShard{id: "sh-1", key: lifeKey("sh-1", 1)}
		s.list = append(s.list, sh)
		s.byLife[sh.key] = sh
		w.shardChanges(&store.Changes{Shards: []ledger.Shard{{ID: "sh-1", Allocated: ledger.Amounts{50}, IssuedAt: reissued}}})
		if w.fail != nil || s.reissued != 1 || s.key("sh-1") != sh.key {
			t.Fatalf("a new shard under a removed one's id: violation %+v, %d reissued, life %s", w.fail, s.reissued, s.key("sh-1"))
		}
		return w
	}
	remint := func(at time.Time) *store.Changes {
		s := &ledger.Shard{ID: "sh-1", IssuedAt: at}
		return &store.Changes{Moves: []ledger.Move{{ReceiptID: ledger.ShardRemintReceipt(s, 1), Kind: ledger.MoveShardRemint, Units: ledger.Amounts{50}}}}
	}
	w := fresh()
	w.shardChanges(remint(reissued))
	if w.fail != nil || w.shards.reminted[lifeKey("sh-1", 1)] != (ledger.Amounts{50}) {
		t.Fatalf("the new shard's remint: violation %+v, reminted %v", w.fail, w.shards.reminted)
	}
	w = fresh()
	w.shardChanges(remint(issued))
	if w.fail == nil || w.fail.Gate != GateDuplicateRecovery {
		t.Fatalf("a remint of the removed shard passed: %+v", w.fail)
	}
	w = fresh()
	w.shards.removed[lifeKey("sh-1", 1)] = true
	w.shardChanges(&store.Changes{Shards: []ledger.Shard{{ID: "sh-1", Allocated: ledger.Amounts{100}, IssuedAt: issued, Reconciled: true, Reminted: ledger.Amounts{100}}}})
	if w.fail == nil || w.fail.Gate != GateDuplicateShardConsumption {
		t.Fatalf("a row of a removed shard's earlier life passed: %+v", w.fail)
	}
}

// Seed 770066 (found by the release gate's run of 1,000,000
// interleavings): another gateway's reconciliation of a gateway's shard
// (the shard_reuse probe) arrives after retention removed the shard, and
// is answered SHARD_NOT_FOUND. That is right: nothing is left to consume.
// The checker must accept it rather than demand SHARD_FOREIGN.
func TestForeignProbeOfARemovedShard(t *testing.T) {
	cfg := DefaultConfig()
	cfg.TwoUnits = true // the shapes of the run that found it
	var trace bytes.Buffer
	cfg.Trace = &trace
	if o := RunOne(&cfg, 770066); o.Violation != nil {
		t.Fatalf("seed 770066:\n%s", o.Violation.Report())
	}
	if !strings.Contains(trace.String(), "tries another gateway's shard") || !strings.Contains(trace.String(), "shards removed") {
		t.Fatal("seed 770066 no longer probes a shard retention removes: the case is untested (find another seed with `capledger sim`)")
	}
}

// Gateways take the ids of shards retention removed (shard_reuse): over
// seeds that issue a new shard under a removed one's id, the checker
// follows each id's next life (its issuance journaled again, its remint
// moves named by its issue time) and every gate passes.
func TestShardIDsReusedAfterRemoval(t *testing.T) {
	cfg := DefaultConfig()
	var reissued int64
	for _, seed := range []uint64{53, 206, 217, 242, 253} {
		var trace bytes.Buffer
		c := cfg
		c.Trace = &trace
		o := RunOne(&c, seed)
		if o.Violation != nil {
			t.Fatalf("seed %d:\n%s", seed, o.Violation.Report())
		}
		if o.ShardsReissued > 0 && !strings.Contains(trace.String(), "reuses the id of a shard retention removed") {
			t.Fatalf("seed %d counts %d shards issued again, its trace shows none", seed, o.ShardsReissued)
		}
		reissued += o.ShardsReissued
	}
	if reissued == 0 {
		t.Fatal("no seed issued a shard under a removed one's id: the case is untested (find seeds with `capledger sim` and shard_reuse)")
	}
}
