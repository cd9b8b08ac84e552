package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/capledger/capledger/store"
)

// A long read of a snapshot (queryAll: a full audit's moves, statements,
// reservations) reports progress while its rows arrive (store.RowRead),
// so the server's --store-timeout bounds each wait for the store, not the
// transfer of a whole table: 5,000 rows report at the first row and
// after every 1,024.
func TestLongReadReportsProgressWhileRowsArrive(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tx, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	reports := 0
	counted := store.WithProgress(ctx, func() { reports++ })
	rows, err := queryAll(counted, txQuery{tx, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5000) SELECT x FROM c"},
		func(r scanner) (x int64, err error) { return x, r.Scan(&x) }, "counting")
	if err != nil || len(rows) != 5000 {
		t.Fatalf("read %d rows, %v; want 5000", len(rows), err)
	}
	if reports != 5 { // rows 1, 1024, 2048, 3072, 4096
		t.Fatalf("%d progress reports over 5,000 rows; want 5 (the first row, then every 1,024)", reports)
	}
}
