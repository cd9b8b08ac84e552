package ledger_test

import (
	"errors"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// Shard and receipt ids may hold "/". Tenant-8's gateway reconciles shard
// "a/b" leaving receipt "c" unknown (200 tokens held); tenant-7's shard
// "a", reconciled with nothing unknown, then sends a settled receipt
// "b/c". The two receipts are different ones of different shards (and
// tenants): tenant-7's is refused as not left unknown, nothing is
// reminted anywhere (the checked harness audits every command), and
// tenant-8's receipt stays pending until its own gateway settles it.
func TestShardReceiptOfAnotherShardUnderASlashedIDResolvesNothing(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	other := emergencyPolicy()
	other.Key.Subject = "tenant-8"
	c.publish(other)
	issueFor := func(subject, id, gateway string, units ledger.Units) *ledger.Shard {
		cmd := issueCmd(id, gateway, 1, units)
		cmd.Subject = subject
		return c.must(c.apply(cmd)).Shard
	}

	theirs := ledger.NewShardLocal(issueFor("tenant-8", "a/b", "gw-b", 500))
	theirs.Reserve("c", "d", ledger.Amounts{200}, c.now)
	theirs.Start("c", "op", c.now)
	theirs.Inherit(c.now)
	receipts, _ := theirs.Submission()
	if res := c.must(c.apply(reconcileCmd("a/b", "gw-b", receipts))); res.Shard.Unknown[0] != 200 {
		t.Fatalf("tenant-8's shard after its first submission: %+v", res.Shard)
	}
	mine := ledger.NewShardLocal(issueFor("tenant-7", "a", "gw-a", 100))
	mine.Reserve("x", "d", ledger.Amounts{10}, c.now)
	mine.Release("x", c.now)
	receipts, _ = mine.Submission()
	c.must(c.apply(reconcileCmd("a", "gw-a", receipts)))

	res := c.apply(reconcileCmd("a", "gw-a", []ledger.ShardReceipt{{ReservationID: "b/c", State: ledger.StateSettled, Reserved: ledger.Amounts{200}}}))
	if !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) || res.Shard.Unknown[0] != 0 || res.Shard.Reminted[0] != 100 {
		t.Fatalf("tenant-7's shard a with a receipt b/c: %v, %+v; want it refused, the shard as it was", res.Err, res.Shard)
	}
	if got := ledger.ShardReceiptStandingOf(c.m.Meta(ledger.MetaShardReceipt("a/b", "c"))); got != ledger.ShardReceiptPending {
		t.Fatalf("tenant-8's receipt c of a/b: %v, want still pending", got)
	}
	if got := ledger.ShardReceiptStandingOf(c.m.Meta(ledger.MetaShardReceipt("a", "b/c"))); got != ledger.ShardReceiptNotPending {
		t.Fatalf("tenant-7's receipt b/c of a: %v, want not pending", got)
	}
	res = c.must(c.apply(reconcileCmd("a/b", "gw-b", []ledger.ShardReceipt{{ReservationID: "c", State: ledger.StateSettled,
		Reserved: ledger.Amounts{200}, Actual: ledger.Amounts{50}}})))
	if res.Shard.Unknown[0] != 0 || res.Shard.Spent[0] != 50 || res.Shard.Reminted[0] != 450 {
		t.Fatalf("tenant-8's shard after its own settled receipt: %+v", res.Shard)
	}
}
