package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

// An account written before schema version 23 (no held_elsewhere) reads
// 0 held elsewhere after the upgrade, its other fields as written; a count
// written after it (read first, as a command does: the short UPDATE)
// reads back, and 0 again once the account is current no more.
func TestHeldElsewhereOfAnEarlierSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v22.db")
	db := dbAtSchema(t, path, 22)
	key := ledger.AccountKey{Subject: "tenant-a", Route: "chat", Region: "eu", Generation: 3}
	old := ledger.Account{Key: key, Dims: 2, EpochStart: time.Unix(0, 1764720000000000000).UTC(),
		Balances: ledger.Balances{{Opening: 1000, Available: 400, Reserved: 600}, {Opening: 5, Available: 5}},
		Version:  9, RefilledTo: [ledger.MaxDimensions]int64{1764720000000000000, 1764720000000000000}}
	old.EpochOpening = old.Balances
	insertAccountAt(t, db, &old, ", epoch_indexed", old.EpochStart.UnixNano())
	s := openUpgraded(t, db, path)
	got, err := s.AccountGet(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got != old {
		t.Fatalf("after the upgrade: %+v, want %+v (held elsewhere 0)", got, old)
	}
	for _, held := range []ledger.Amounts{{0, 600}, {}} {
		a := old
		a.HeldElsewhere = held
		a.Version++
		old = a
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.AccountGet(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := s.AccountGet(ctx, key); err != nil || got.HeldElsewhere != held {
			t.Fatalf("written with %v held elsewhere, read back %v, %v", held, got.HeldElsewhere, err)
		}
	}
}

// Holds outstanding under a superseded generation in a file of schema
// version 23 (held_elsewhere 0 on every row, as that version's migration
// left them) are counted by version 24's (storetest.HeldElsewhereUpgrade).
func TestHeldElsewhereCountedAtTheUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v23.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	storetest.HeldElsewhereUpgrade(t, s, func(t *testing.T) store.Store {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"UPDATE accounts SET held_elsewhere = NULL", "DELETE FROM schema_migrations WHERE version = 24"} {
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		return openUpgraded(t, db, path)
	})
}
