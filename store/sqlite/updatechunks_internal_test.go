package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// TestChunkWithARowMissingGoesToTheUpsert pins execChunks's row-count
// fallback alone: a chunk of the short multi-row UPDATE that changes fewer
// rows than it holds sends its rows to the upsert. Each row here was read
// by the transaction, so the short UPDATE is chosen; then one row of the
// chunk is made to miss behind the transaction's back (a reservation row
// deleted, an account row's epoch_start moved, which the account UPDATE
// matches on). Without the fallback that row is lost (or keeps its old
// values) though Write and Commit succeed.
func TestChunkWithARowMissingGoesToTheUpsert(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "capledger.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	// 4 rows: one chunk of chunkSizes' 4.
	const n = 4
	if chunkSizes[len(chunkSizes)-3] != n {
		t.Fatalf("chunkSizes %v has no chunk of %d", chunkSizes, n)
	}
	fresh := &store.Changes{NewReservations: map[string]bool{}}
	for i := range n {
		id := fmt.Sprintf("chunk-%d", i)
		fresh.Reservations = append(fresh.Reservations, ledger.Reservation{ID: id, RequestDigest: "sha256:" + id,
			Account:  ledger.AccountKey{Subject: "tenant-7", Route: "chat", Region: "eu", Generation: 1},
			Reserved: ledger.Amounts{600}, State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)})
		fresh.NewReservations[id] = true
		fresh.Accounts = append(fresh.Accounts, ledger.Account{
			Key:  ledger.AccountKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: t0, Balances: ledger.Balances{{Opening: 1000, Available: 1000}}, Version: 1})
	}
	write := func(c *store.Changes, behindTheBack ...string) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		stx := tx.(*Tx)
		for i := range c.Reservations {
			if _, err := stx.ReservationGet(ctx, c.Reservations[i].ID); err != nil && len(behindTheBack) > 0 {
				t.Fatal(err)
			}
		}
		for i := range c.Accounts {
			if _, err := stx.AccountGet(ctx, c.Accounts[i].Key); err != nil && len(behindTheBack) > 0 {
				t.Fatal(err)
			}
		}
		for _, q := range behindTheBack {
			st, err := stx.w.stmt(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if err := stx.w.exec(ctx, st, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Write(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write(fresh)

	started := &store.Changes{}
	for i := range fresh.Reservations {
		r := fresh.Reservations[i]
		r.State, r.OperationID, r.StartedAt = ledger.StateStarted, "op", t0.Add(time.Second)
		started.Reservations = append(started.Reservations, r)
		a := fresh.Accounts[i]
		a.Balances[0].Available, a.Balances[0].Reserved, a.Version = 400, 600, 2
		started.Accounts = append(started.Accounts, a)
	}
	write(started,
		"DELETE FROM reservations WHERE id = 'chunk-2'",
		fmt.Sprintf("UPDATE accounts SET epoch_start = %d WHERE subject = 'tenant-2'", t0.Add(-time.Hour).UnixNano()))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Read the file, not the row cache.
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, want := range started.Reservations {
		got, err := s.ReservationGet(ctx, want.ID)
		if err != nil {
			t.Errorf("reservation %s after the write: %v", want.ID, err)
			continue
		}
		if got != want {
			t.Errorf("reservation %s stored\n%+v\nwant\n%+v", want.ID, got, want)
		}
	}
	for _, want := range started.Accounts {
		got, err := s.AccountGet(ctx, want.Key)
		if err != nil {
			t.Errorf("account %s after the write: %v", want.Key, err)
			continue
		}
		if got.Balances != want.Balances || !got.EpochStart.Equal(want.EpochStart) || got.Version != want.Version {
			t.Errorf("account %s stored\n%+v\nwant\n%+v", want.Key, got, want)
		}
	}
}
