package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

var t0 = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)

func reservation(id string) ledger.Reservation {
	return ledger.Reservation{ID: id, RequestDigest: "sha256:" + id,
		Account:  ledger.AccountKey{Subject: "tenant7", Route: "chat", Region: "eu", Generation: 1},
		Reserved: ledger.Amounts{600}, State: ledger.StateReserved, CreatedAt: t0, ExpiresAt: t0.Add(time.Minute)}
}

func insert(id string) *store.Changes {
	return &store.Changes{Reservations: []ledger.Reservation{reservation(id)}, NewReservations: map[string]bool{id: true}}
}

// write begins, writes c and returns the open transaction.
func write(t *testing.T, s *memstore.Store, c *store.Changes) store.Tx {
	t.Helper()
	tx, err := s.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return tx
}

func exists(t *testing.T, s *memstore.Store, id string) bool {
	t.Helper()
	_, err := s.ReservationGet(context.Background(), id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func TestCrashDropsOpenTransaction(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	if err := write(t, s, insert("rl-durable")).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx := write(t, s, insert("rl-in-flight"))
	s.Crash()
	if err := tx.Commit(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("commit after crash: %v, want ErrUnavailable", err)
	}
	if _, err := tx.ReservationGet(ctx, "rl-durable"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("read after crash: %v, want ErrUnavailable", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("rollback after crash: %v", err)
	}
	if !exists(t, s, "rl-durable") || exists(t, s, "rl-in-flight") {
		t.Fatal("crash lost committed data or kept uncommitted data")
	}
	// The writer slot is free again: the restarted process can write.
	if err := write(t, s, insert("rl-after")).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// A crash with no open transaction changes nothing.
	s.Crash()
	if !exists(t, s, "rl-after") {
		t.Fatal("idle crash lost data")
	}
}

func TestFailNextCommit(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	injected := errors.New("disk full")
	s.FailNextCommit(injected)
	if err := write(t, s, insert("rl-1")).Commit(ctx); !errors.Is(err, injected) {
		t.Fatalf("commit: %v, want the injected error", err)
	}
	if exists(t, s, "rl-1") {
		t.Fatal("failed commit applied its changes")
	}
	// Only the next commit fails.
	if err := write(t, s, insert("rl-1")).Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(t, s, "rl-1") {
		t.Fatal("retry did not apply")
	}
}

func TestLoseNextCommitAck(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	s.LoseNextCommitAck()
	if err := write(t, s, insert("rl-1")).Commit(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("commit: %v, want ErrUnavailable", err)
	}
	if !exists(t, s, "rl-1") {
		t.Fatal("commit with a lost ack did not apply")
	}
	// The caller's retry with the same id now meets the durable row.
	tx := write(t, s, &store.Changes{})
	defer tx.Rollback(ctx)
	if err := tx.Write(ctx, insert("rl-1")); !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("re-insert: %v, want ErrDuplicate", err)
	}
}

func TestCrashClearsPendingFaults(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	s.FailNextCommit(store.ErrConflict)
	s.LoseNextCommitAck()
	s.Crash()
	if err := write(t, s, insert("rl-1")).Commit(ctx); err != nil {
		t.Fatalf("commit after crash: %v", err)
	}
}

func TestBeginWaitsForWriter(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	first := write(t, s, insert("rl-1"))
	// While the first transaction is open, Begin waits until its context
	// ends.
	waitCtx, cancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() {
		tx, err := s.Begin(waitCtx)
		if err == nil {
			tx.Rollback(ctx)
		}
		got <- err
	}()
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("begin while another writer is open: %v, want context.Canceled", err)
	}
	// And a waiting Begin proceeds once the writer commits.
	second := make(chan store.Tx, 1)
	go func() {
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Error(err)
		}
		second <- tx
	}()
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx := <-second
	defer tx.Rollback(ctx)
	if _, err := tx.ReservationGet(ctx, "rl-1"); err != nil {
		t.Fatalf("second writer does not see the first one's commit: %v", err)
	}
}

func TestClose(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	tx := write(t, s, insert("rl-1"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("commit after close: %v", err)
	}
	if _, err := s.Begin(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("begin after close: %v", err)
	}
	if _, err := s.ReservationGet(ctx, "rl-1"); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("read after close: %v", err)
	}
}

// The simulator replays a seed and expects the same answers: every list
// comes out in the same order however the rows were inserted.
func TestDeterministicOrder(t *testing.T) {
	ctx := context.Background()
	build := func(ids []string) *ledger.Snapshot {
		s := memstore.New()
		for _, id := range ids {
			if err := write(t, s, insert(id)).Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	a := build([]string{"rl-c", "rl-a", "rl-b", "rl-e", "rl-d"})
	b := build([]string{"rl-e", "rl-d", "rl-c", "rl-b", "rl-a"})
	for i := range a.Reservations {
		if a.Reservations[i].ID != b.Reservations[i].ID {
			t.Fatalf("order depends on insertion: %s vs %s", a.Reservations[i].ID, b.Reservations[i].ID)
		}
	}
}
