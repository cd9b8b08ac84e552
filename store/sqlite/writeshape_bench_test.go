package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/capledger/capledger/store/sqlite"
)

// BenchmarkAccountWriteShapes measures what SQLite alone charges for
// writing account rows in the shapes a design for many tenants can
// choose between (issue 15), on the accounts table of the current schema
// holding CAPLEDGER_BENCH_SHAPE_ACCOUNTS rows (skipped when unset; a
// million take about a minute to seed). An op is one account written;
// cpu-µs/account is the process's CPU per account, the checkpoints that
// copy the written pages back included (TRUNCATE every 20,000 accounts
// and at the end). No ledger work, no journal, no fsync (synchronous
// NORMAL): only the pages.
//
//   - inline/hot-G: G updates a transaction over 10 accounts (a hot
//     subject's group commit);
//   - inline/random-G: G updates a transaction, each a random account of
//     all (a group commit over many tenants, as main writes them);
//   - log-G: one row a transaction holding G account images of 150 bytes
//     appended in key order (what an account log or journal of images
//     would add to each commit);
//   - flush-sorted: b.N random accounts (the dirty set, a few drawn twice) written in key
//     order, 2,048 a transaction (a write-behind's flush); run it with
//     -benchtime 200000x for a dirty set of 200,000.
//
// CAPLEDGER_BENCH_SHAPE_ACCOUNTS=1000000 go test -run '^$' -bench
// AccountWriteShapes -benchtime 100000x ./store/sqlite
func BenchmarkAccountWriteShapes(b *testing.B) {
	n, _ := strconv.Atoi(os.Getenv("CAPLEDGER_BENCH_SHAPE_ACCOUNTS"))
	if n < 10 {
		b.Skip("set CAPLEDGER_BENCH_SHAPE_ACCOUNTS to the number of accounts (e.g. 1000000)")
	}
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "shapes.db")
	s, err := sqlite.Open(ctx, path) // the current schema
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=wal_autocheckpoint(0)&_pragma=cache_size(-16384)")
	if err != nil {
		b.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	b.Cleanup(func() { db.Close() })
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	exec := func(query string, args ...any) {
		if _, err := conn.ExecContext(ctx, query, args...); err != nil {
			b.Fatal(err)
		}
	}
	key := func(i int) string { return fmt.Sprintf("tenant-%08d", i) }
	balances := make([]byte, 90) // about what two dimensions encode to
	for i := 0; i < n; i += 10000 {
		exec("BEGIN")
		for j := i; j < min(i+10000, n); j++ {
			exec("INSERT INTO accounts (subject, route, region, generation, dims, balances, epoch_start, epoch_opening, refilled_to, breaches, version)"+
				" VALUES (?, 'chat.generate', 'global', 1, 2, ?, 1, ?, ?, 0, 1)", key(j), balances, balances[:40], balances[:16])
		}
		exec("COMMIT")
	}
	exec("CREATE TABLE shape_log (seq INTEGER PRIMARY KEY, images BLOB NOT NULL)")
	exec("PRAGMA wal_checkpoint(TRUNCATE)")
	update, err := conn.PrepareContext(ctx, "UPDATE accounts SET balances = ?, refilled_to = ?, version = version + 1"+
		" WHERE subject = ? AND route = 'chat.generate' AND region = 'global' AND generation = 1")
	if err != nil {
		b.Fatal(err)
	}
	defer update.Close()
	write := func(k int) {
		balances[0]++
		if _, err := update.ExecContext(ctx, balances, balances[:16], key(k)); err != nil {
			b.Fatal(err)
		}
	}
	// run writes b.N accounts in transactions of group, each(i) writing
	// the i-th, and reports the CPU per account.
	run := func(b *testing.B, group int, each func(i int)) {
		cpu := cpuTime()
		b.ResetTimer()
		for done := 0; done < b.N; done += group {
			exec("BEGIN")
			for i := done; i < min(done+group, b.N); i++ {
				each(i)
			}
			exec("COMMIT")
			if done/20000 != (done+group)/20000 {
				exec("PRAGMA wal_checkpoint(TRUNCATE)")
			}
		}
		exec("PRAGMA wal_checkpoint(TRUNCATE)")
		b.StopTimer()
		b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/1e3/float64(b.N), "cpu-µs/account")
	}
	for _, group := range []int{16, 100} {
		b.Run(fmt.Sprintf("inline/hot-%d", group), func(b *testing.B) {
			run(b, group, func(i int) { write(i % 10) })
		})
		b.Run(fmt.Sprintf("inline/random-%d", group), func(b *testing.B) {
			run(b, group, func(int) { write(rand.IntN(n)) })
		})
		b.Run(fmt.Sprintf("log-%d", group), func(b *testing.B) {
			images := make([]byte, 150*group)
			run(b, group, func(i int) {
				if (i+1)%group == 0 || i == b.N-1 {
					images[0]++
					exec("INSERT INTO shape_log (images) VALUES (?)", images)
				}
			})
			exec("DELETE FROM shape_log")
		})
	}
	b.Run("flush-sorted", func(b *testing.B) {
		dirty := make([]int, b.N)
		for i := range dirty {
			dirty[i] = rand.IntN(n)
		}
		slices.Sort(dirty)
		run(b, 2048, func(i int) { write(dirty[i]) })
	})
}
