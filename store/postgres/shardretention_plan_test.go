package postgres_test

import (
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// Shard retention reads reconciled shards through the partial index
// shards_reconciled, in its order, in the generic plan, on a table where
// most shards are live or unreconciled: never a scan of the table.
func TestShardsReconciledUsesItsIndex(t *testing.T) {
	conn := planConn(t, `INSERT INTO shards (id, subject, route, region, generation, gateway_id, boot_epoch, fence, allocated, spent, unknown,
			reminted, issued_at, expires_at, key_id, signature, reconciled)
		SELECT 'sh-' || i, 'tenant' || i % 10, 'chat.generate', 'eu', 1, 'gw-' || i, 1, 1, '{10,0,0,0}', '{0,0,0,0}', '{0,0,0,0}',
			'{0,0,0,0}', i, i + 60, 'k1', '\x00', i % 50 = 0
		FROM generate_series(1, 20000) AS i`,
		`ANALYZE shards`, `SET plan_cache_mode = force_generic_plan`)
	for name, c := range map[string]struct {
		query string
		args  []any
	}{
		"first page":     {postgres.ShardsReconciledSQL, []any{int64(1000), 64}},
		"after a cursor": {postgres.ShardsReconciledAfterSQL, []any{int64(1000), int64(500), "sh-440", 64}},
	} {
		plan := genericPlan(t, conn, c.query, c.args)
		t.Logf("%s:\n%s", name, plan)
		if !strings.Contains(plan, "shards_reconciled") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Errorf("reconciled shards, %s: not read through shards_reconciled in its order:\n%s", name, plan)
		}
	}
}

// DrainProgress reads a generation's unreconciled shards through the
// partial index shards_unreconciled, in its order, in the generic plan,
// on a table where most shards are reconciled or of other generations:
// never a scan of the table.
func TestShardsUnreconciledUseTheirIndex(t *testing.T) {
	conn := planConn(t, `INSERT INTO shards (id, subject, route, region, generation, gateway_id, boot_epoch, fence, allocated, spent, unknown,
			reminted, issued_at, expires_at, key_id, signature, reconciled)
		SELECT 'sh-' || i, 'tenant' || i % 10, 'chat.generate', 'eu', i % 40, 'gw-' || i, 1, 1, '{10,0,0,0}', '{0,0,0,0}', '{0,0,0,0}',
			'{0,0,0,0}', i, i + 60, 'k1', '\x00', i % 50 <> 0
		FROM generate_series(1, 20000) AS i`,
		`ANALYZE shards`, `SET plan_cache_mode = force_generic_plan`)
	for name, args := range map[string][]any{
		"first page":     {int64(10), "", 64},
		"after a cursor": {int64(10), "sh-450", 64},
	} {
		plan := genericPlan(t, conn, postgres.ShardsUnreconciledSQL, args)
		t.Logf("%s:\n%s", name, plan)
		if !strings.Contains(plan, "shards_unreconciled") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Sort") {
			t.Errorf("unreconciled shards, %s: not read through shards_unreconciled in its order:\n%s", name, plan)
		}
	}
}

// The meta reads by name prefix (a shard's unknown receipts for every
// shard retention may remove, the gateways' fence rows, the retained
// shard totals) read their key range of meta_name_bytes in the generic
// plan, on a table holding many other names: never a scan of meta, which
// grows with the accounts that folded shards.
func TestMetaPrefixReadsUseTheirIndex(t *testing.T) {
	conn := planConn(t, `INSERT INTO meta (name, value)
		SELECT 'shard_retained/tenant' || i || '/chat.generate/eu/1/tokens/count', i FROM generate_series(1, 20000) AS i`,
		`INSERT INTO meta (name, value) SELECT 'shard_unknown/sh-' || i || '/r', i FROM generate_series(1, 200) AS i`,
		`INSERT INTO meta (name, value) SELECT 'shard_fence/gw-' || i, i FROM generate_series(1, 20) AS i`,
		`ANALYZE meta`, `SET plan_cache_mode = force_generic_plan`)
	unknown := ledger.ShardUnknownPrefix("sh-7")
	unknownEnd := store.PrefixEnd(unknown)
	for name, c := range map[string]struct {
		query string
		args  []any
	}{
		"a shard's unknown receipts": {postgres.MetaNamesSQL, []any{unknown, unknownEnd, 17}},
		"idle fences":                {postgres.ShardFencesIdleSQL, []any{int64(1000), 64}},
	} {
		plan := genericPlan(t, conn, c.query, c.args)
		t.Logf("%s:\n%s", name, plan)
		// An index scan in name order filtered by the prefix would also
		// avoid a Seq Scan and a Sort, and still read every name after
		// the prefix: the index condition must bound the range.
		if !strings.Contains(plan, "meta_name_bytes") || !strings.Contains(plan, "Index Cond: ((name >=") ||
			!strings.Contains(plan, "AND (name <") || strings.Contains(plan, "Seq Scan on meta") || strings.Contains(plan, "Sort") {
			t.Errorf("%s: not read as a key range of meta_name_bytes in its order:\n%s", name, plan)
		}
	}
}
