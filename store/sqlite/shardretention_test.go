package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// Shard retention reads reconciled shards through shards_reconciled, in
// its order (no sort), and a shard's receipt counters through the meta
// key's range; DrainProgress a generation's unreconciled shards through
// shards_unreconciled: never a scan of the table.
func TestShardRetentionQueriesUseIndexes(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name, query, want string
		args              []any
	}{
		{"reconciled shards, first page", shardsReconciledSQL, "SEARCH shards USING INDEX shards_reconciled (expires_at<?)", []any{1, 64}},
		{"reconciled shards after a cursor", shardsReconciledAfterSQL,
			"SEARCH shards USING INDEX shards_reconciled ((expires_at,id)>(?,?) AND expires_at<?)", []any{1, 0, "a", 64}},
		{"a generation's unreconciled shards", shardsUnreconciledSQL,
			"SEARCH shards USING INDEX shards_unreconciled (generation=? AND id>?)", []any{3, "a", 64}},
		{"a shard's receipt counters", metaNamesSQL, "SEARCH meta USING PRIMARY KEY (name>? AND name<?)", []any{"shard_unknown/a/", "shard_unknown/a0", 10}},
		{"retained shard totals", metaPrefixSQL, "SEARCH meta USING PRIMARY KEY (name>? AND name<?)", []any{"shard_retained/", "shard_retained0"}},
	} {
		plan := queryPlan(t, s, tc.query, tc.args...)
		if !strings.Contains(plan, tc.want) || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%s: plan %q, want %q and no sort", tc.name, plan, tc.want)
		}
	}
}
