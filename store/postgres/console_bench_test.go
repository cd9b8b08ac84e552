package postgres_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/storetest"
)

// BenchmarkSubjectStateCounts measures ReservationStatesOfSubject (the
// counts of ConsoleService.ListSubjectReservations) on one subject
// holding n reservations (CAPLEDGER_BENCH_SUBJECT_RESERVATIONS, default
// 200,000) over 3 routes and 4 states, interleaved with k times as many
// of 10,000 other subjects (CAPLEDGER_BENCH_SUBJECT_OTHERS, default 1), as
// reservations arriving together are, inserted by one statement and
// vacuumed. It logs the count's plan and reports the subject index's
// size per reservation.
//
//	CAPLEDGER_BENCH_SUBJECT_RESERVATIONS=1000000 go test -run '^$' -bench SubjectStateCounts -benchtime 3x ./store/postgres
func BenchmarkSubjectStateCounts(b *testing.B) {
	ctx := context.Background()
	n, k := 200_000, 1
	for name, v := range map[string]*int{"CAPLEDGER_BENCH_SUBJECT_RESERVATIONS": &n, "CAPLEDGER_BENCH_SUBJECT_OTHERS": &k} {
		if s := os.Getenv(name); s != "" {
			var err error
			if *v, err = strconv.Atoi(s); err != nil {
				b.Fatal(err)
			}
		}
	}
	s, err := postgres.Open(ctx, schemaDSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pool := postgres.PoolOf(s)
	if _, err := pool.Exec(ctx, `INSERT INTO reservations (id, request_digest, subject, route, region, generation,
		accounting_epoch, reserved, actual, overdraft, operation_id, state, created_at, expires_at, started_at,
		execution_deadline, finished_at, breach)
		SELECT md5(i::text), 'sha256:' || i, CASE WHEN i % ($2::bigint + 1) = 0 THEN 'tenant7' ELSE 'tenant-' || i % 10000 END, (ARRAY['chat', 'embed', 'image'])[i % 3 + 1], 'eu', 1,
			0, '{600,0,0,0}', '{0,0,0,0}', '{0,0,0,0}', CASE WHEN i % 4 = 0 THEN '' ELSE 'op' END,
			(ARRAY[1, 2, 8, 3])[i % 4 + 1], 1000000 * i, 1000000 * i + 60000000000, 1000000 * i, 0,
			CASE WHEN i % 4 = 3 THEN 1000000 * i ELSE 0 END, false
		FROM generate_series(0::bigint, ($2::bigint + 1) * $1::bigint - 1) AS i`, n, k); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE reservations`); err != nil {
		b.Fatal(err)
	}
	rows, err := pool.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) SELECT route, state, count(*) FROM reservations
		WHERE subject = 'tenant7' GROUP BY route, state ORDER BY route COLLATE "C", state`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			b.Fatal(err)
		}
		b.Log(line)
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	var size int64
	for _, q := range []string{`SELECT pg_relation_size(indexrelid) FROM pg_index WHERE indrelid = 'reservations'::regclass
		AND indexrelid::regclass::text LIKE 'reservations_by_subject%'`} {
		if err := pool.QueryRow(ctx, q).Scan(&size); err != nil {
			b.Fatal(err)
		}
	}
	storetest.BenchSubjectCounts(b, s, "tenant7", int64(n))
	b.ReportMetric(float64(size)/float64((k+1)*n), "index-B/reservation")
}
