package postgres

import (
	"context"
	"testing"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/store"
)

// Each of the audit snapshot's long reads (reservations, moves,
// statements, shards, retained totals, retained shard totals) reports
// progress at its first row and after every 1,024 rows it receives from
// PostgreSQL, so a bounded audit waits anew while a large table's rows
// arrive: 5,000 rows of each table, read through the store's own loops,
// report 5 times each (rows 1, 1024, 2048, 3072, 4096). The PostgreSQL
// twin of SQLite's TestLongReadReportsProgressWhileRowsArrive.
func TestLongReadsReportProgressWhileRowsArrive(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, replicatest.SchemaDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 5000
	for _, q := range []string{
		`INSERT INTO reservations (id, request_digest, subject, route, region, generation, accounting_epoch,
			reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
			execution_deadline, finished_at, breach)
			SELECT 'rl-' || i, 'sha256:' || i, 'tenant' || i, 'chat', 'eu', 1, 0, '{1,0,0,0}', '{0,0,0,0}',
				'{0,0,0,0}', '', 1, i, i + 60, 0, 0, 0, false FROM generate_series(1, $1) AS i`,
		`INSERT INTO moves (receipt_id, kind, from_subject, from_route, from_region, from_generation,
			to_subject, to_route, to_region, to_generation, units, debt, at)
			SELECT 'mv-' || i, 1, 'tenant' || i, 'chat', 'eu', 1, 'tenant' || i, 'chat', 'eu', 2,
				'{1,0,0,0}', '{0,0,0,0}', i FROM generate_series(1, $1) AS i`,
		`INSERT INTO statements (subject, route, region, generation, epoch_start, epoch_end, dims)
			SELECT 'tenant' || i, 'chat', 'eu', 1, 0, 3600000000000, 0 FROM generate_series(1, $1) AS i`,
		`INSERT INTO shards (id, subject, route, region, generation, gateway_id, boot_epoch, fence, allocated,
			spent, unknown, reminted, issued_at, expires_at, key_id, signature, reconciled)
			SELECT 'sh-' || i, 'tenant' || i, 'chat', 'eu', 1, 'gw', 1, 1, '{1,0,0,0}', '{0,0,0,0}',
				'{0,0,0,0}', '{0,0,0,0}', i, i + 60, 'k1', '\x01', false FROM generate_series(1, $1) AS i`,
		`INSERT INTO retained (subject, route, region, generation, reservations, spent, overdraft)
			SELECT 'tenant' || i, 'chat', 'eu', 1, 1, '{1,0,0,0}', '{0,0,0,0}' FROM generate_series(1, $1) AS i`,
		`INSERT INTO meta (name, value)
			SELECT 'shard_retained/tenant' || i || '/chat/eu/1/shards', 1 FROM generate_series(1, $1) AS i`,
	} {
		if _, err := s.pool.Exec(ctx, q, n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, read := range []struct {
		name string
		list func(ctx context.Context) (int, error)
	}{
		{"reservations", func(ctx context.Context) (int, error) {
			rows, err := s.reservationList(ctx, s.pool)
			return len(rows), err
		}},
		{"moves", func(ctx context.Context) (int, error) { rows, err := s.moveList(ctx, s.pool); return len(rows), err }},
		{"statements", func(ctx context.Context) (int, error) {
			rows, err := s.statementList(ctx, s.pool)
			return len(rows), err
		}},
		{"shards", func(ctx context.Context) (int, error) { rows, err := s.shardList(ctx, s.pool); return len(rows), err }},
		{"retained", func(ctx context.Context) (int, error) {
			rows, err := s.retainedList(ctx, s.pool)
			return len(rows), err
		}},
		{"retained shards", func(ctx context.Context) (int, error) {
			rows, err := s.retainedShardsList(ctx, s.pool)
			return len(rows), err
		}},
	} {
		reports := 0
		got, err := read.list(store.WithProgress(ctx, func() { reports++ }))
		if err != nil || got != n {
			t.Fatalf("%s: read %d, %v; want %d", read.name, got, err, n)
		}
		if reports != 5 {
			t.Errorf("%s: %d progress reports over %d rows; want 5 (the first row, then every 1,024)", read.name, reports, n)
		}
	}
}
