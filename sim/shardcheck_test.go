package sim

import (
	"testing"

	"github.com/capledger/capledger/ledger"
)

// The gateway-side model of a shard's central record, by hand: a first
// submission with a settled receipt over its hold and an unknown one, then
// the unknown one resolved.
func TestModelShardFromReceipts(t *testing.T) {
	alloc := ledger.Amounts{100}
	subs := [][]ledger.ShardReceipt{
		{
			{ReservationID: "a", State: ledger.StateSettled, Reserved: ledger.Amounts{20}, Actual: ledger.Amounts{30}},
			{ReservationID: "b", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{40}},
			{ReservationID: "c", State: ledger.StateReleased, Reserved: ledger.Amounts{10}},
		},
		{{ReservationID: "b", State: ledger.StateSettled, Reserved: ledger.Amounts{40}, Actual: ledger.Amounts{50}}},
	}
	first := modelShard(alloc, subs, 1)
	if first.spent != (ledger.Amounts{30}) || first.unknown != (ledger.Amounts{40}) || first.reminted != (ledger.Amounts{30}) || first.charged != (ledger.Amounts{}) {
		t.Fatalf("after the first submission: %+v", first)
	}
	both := modelShard(alloc, subs, 2)
	if both.spent != (ledger.Amounts{70}) || both.unknown != (ledger.Amounts{}) || both.reminted != (ledger.Amounts{30}) || both.charged != (ledger.Amounts{10}) {
		t.Fatalf("after both submissions: %+v", both)
	}
}

// A refusal as "already reconciled" passes only for a submission another
// copy of which reached the ledger and was applied; a central row that
// reminted unknown work fails unknown_as_unconsumed.
func TestShardChecksAgainstTheGateway(t *testing.T) {
	cfg := DefaultConfig()
	fresh := func() (*world, *simShard) {
		w := newWorld(&cfg, 1, hooks{})
		w.shards.init(w)
		sh := &simShard{id: "sh-1", key: "sh-1", subs: [][]ledger.ShardReceipt{{{ReservationID: "b", State: ledger.StateStarted, Reserved: ledger.Amounts{40}}}}, delivered: []int{1}}
		w.shards.list = append(w.shards.list, sh)
		w.shards.byLife[sh.key] = sh
		return w, sh
	}
	w, sh := fresh()
	if w.shardCopyApplied(sh, 1) || w.fail == nil || w.fail.Gate != GateProtocol {
		t.Fatalf("a refusal of a submission delivered once and never applied passed: %+v", w.fail)
	}
	w, sh = fresh()
	sh.delivered[0] = 2
	w.shardRowApplied(&ledger.Shard{ID: sh.id, Allocated: ledger.Amounts{100}, Reconciled: true, Unknown: ledger.Amounts{40}, Reminted: ledger.Amounts{60}})
	if w.fail != nil || !w.shardCopyApplied(sh, 1) {
		t.Fatalf("a refusal of a submission applied by its other copy failed: %+v", w.fail)
	}
	w, sh = fresh()
	w.shardRowApplied(&ledger.Shard{ID: sh.id, Allocated: ledger.Amounts{100}, Reconciled: true, Reminted: ledger.Amounts{100}})
	if w.fail == nil || w.fail.Gate != GateUnknownAsUnconsumed {
		t.Fatalf("a row that reminted unknown work passed: %+v", w.fail)
	}
}
