package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"path/filepath"
	"testing"
)

// The estimate of a journal too long to count (estimateRowsWith's sampled
// path) stays near the entries present when batch sizes are heavy-tailed
// and periodic: a batch of 300 entries every 300th among batches of one
// (a worker's pages among gateways' singles). A mean count per batch from
// 1,024 samples was 35 % off (77,519 for 119,800).
func TestJournalEstimateSampledNearTheEntries(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "estimate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, stmt := range []string{
		"CREATE TABLE journal (seq INTEGER PRIMARY KEY)",
		"CREATE TABLE journal_batches (seq INTEGER PRIMARY KEY, entries BLOB NOT NULL)",
		"CREATE TABLE accounts (id INTEGER PRIMARY KEY)",
		"CREATE TABLE reservations (id TEXT PRIMARY KEY)",
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	var entries int64
	for b := range 60_000 {
		n := uint64(1)
		if b%300 == 299 {
			n = 300
		}
		blob := make([]byte, 4+40*n) // an entry's bytes each
		blob[0] = 1
		binary.PutUvarint(blob[1:], n)
		if _, err := tx.Exec("INSERT INTO journal_batches (entries) VALUES (?)", blob); err != nil {
			t.Fatal(err)
		}
		entries += int64(n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	read, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer read.Rollback()
	exact, err := estimateRowsWith(ctx, read, nil, true, 100_000, estimateSamples)
	if err != nil || exact != entries {
		t.Fatalf("exact count %d (%v), want %d", exact, err, entries)
	}
	sampled, err := estimateRowsWith(ctx, read, nil, true, 0, estimateSamples)
	if err != nil {
		t.Fatal(err)
	}
	if sampled < entries*85/100 || sampled > entries*115/100 {
		t.Fatalf("sampled estimate %d for %d entries (more than 15%% off)", sampled, entries)
	}
	t.Logf("%d entries: sampled estimate %d", entries, sampled)
}
