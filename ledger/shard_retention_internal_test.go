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

// A shard's receipt counters are its prefix, one escaped receipt id and
// at most a dimension written as strconv.Itoa writes it: RemoveShards
// removes only those, so a name that merely looks like one ("01", "-0",
// another shard's deeper name) is left alone.
func TestOwnUnknownNames(t *testing.T) {
	p := ShardUnknownPrefix("sh-1")
	for _, c := range []struct {
		name      string
		units, ok bool
	}{
		{p + "r1", false, true},
		{p + "r1/0", true, true},
		{p + "r1/3", true, true},
		{p + "r1/01", false, false},
		{p + "r1/-0", false, false},
		{p + "r1/+1", false, false},
		{p + "r1/x", false, false},
		{p + "r1/4", false, false},
		{p, false, false},
		{p + "/0", false, false},
		{ShardUnknownPrefix("sh-2") + "r1", false, false},
	} {
		if units, ok := ownUnknownName("sh-1", c.name); units != c.units || ok != c.ok {
			t.Errorf("ownUnknownName(sh-1, %q) = %v, %v; want %v, %v", c.name, units, ok, c.units, c.ok)
		}
	}
}

// SortedRetainedShards lists the totals in account key order (subject,
// route, region, generation), whatever order the meta rows came in.
func TestSortedRetainedShardsInAccountOrder(t *testing.T) {
	keys := []AccountKey{
		{Subject: "a", Route: "chat", Region: "eu", Generation: 2},
		{Subject: "a", Route: "chat", Region: "eu", Generation: 10},
		{Subject: "a", Route: "chat", Region: "us", Generation: 1},
		{Subject: "b", Route: "batch", Region: "eu", Generation: 1},
	}
	by := map[AccountKey]*RetainedShards{}
	for i := len(keys) - 1; i >= 0; i-- {
		by[keys[i]] = &RetainedShards{Account: keys[i], Shards: int64(i + 1)}
	}
	got := SortedRetainedShards(by)
	if len(got) != len(keys) {
		t.Fatalf("%d totals, want %d", len(got), len(keys))
	}
	for i, k := range keys {
		if got[i].Account != k || got[i].Shards != int64(i+1) {
			t.Errorf("totals %d: %+v, want account %+v with %d shards", i, got[i], k, i+1)
		}
	}
}
