package ledger

import "testing"

// Retained shard totals are meta rows named after the account: keys
// holding "/" or "%" read back as the same account, not another one whose
// parts join to the same text, and names that are not a term are not
// taken for one.
func TestRetainedShardsNamesReadBack(t *testing.T) {
	keys := []AccountKey{
		{Subject: "a/b", Route: "c", Region: "eu", Generation: 3},
		{Subject: "a", Route: "b/c", Region: "eu", Generation: 3},
		{Subject: "a%2Fb", Route: "c", Region: "e%u", Generation: 1<<64 - 1},
	}
	by := map[AccountKey]*RetainedShards{}
	for i, k := range keys {
		v := int64(i + 1)
		for _, name := range []string{metaShardRetained(k, retainedShardsCount, -1), metaShardRetained(k, retainedShardsRemints, -1),
			metaShardRetained(k, retainedShardsAllocated, 3), metaShardRetained(k, retainedShardsSpent, 0), metaShardRetained(k, retainedShardsReminted, 1)} {
			if !ParseRetainedShards(by, name, v) {
				t.Fatalf("%s not read back", name)
			}
		}
	}
	for i, k := range keys {
		v := int64(i + 1)
		want := RetainedShards{Account: k, Shards: v, Remints: v}
		want.Allocated[3], want.Spent[0], want.Reminted[1] = v, v, v
		if got := by[k]; got == nil || *got != want {
			t.Errorf("%+v: read back %+v, want %+v", k, got, want)
		}
	}
	if len(by) != len(keys) {
		t.Errorf("%d accounts read back, want %d", len(by), len(keys))
	}
	for _, name := range []string{"shard_retained/a/b/c/1", "shard_retained/a/b/c/x/shards", "shard_retained/a/b/c/1/spent",
		"shard_retained/a/b/c/1/spent/4", "shard_retained/a/b/c/1/bogus", "shard_retained/a/b/c/1/shards/0", "shard_fence/gw"} {
		if ParseRetainedShards(by, name, 1) {
			t.Errorf("%s taken for a retained shard total", name)
		}
	}
}
