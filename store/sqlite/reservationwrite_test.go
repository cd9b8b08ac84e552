package sqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// TestReservationWriteAfterReadKeepsEveryColumn checks the short UPDATE of
// a reservation this transaction read (reservationwrite.go): a lifecycle
// step stores its state, usage and times, and a write that also changes a
// column the short form leaves alone (what the ledger never does) still
// stores the whole row, so Write keeps replacing rows whole.
func TestReservationWriteAfterReadKeepsEveryColumn(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	commit(t, s, insert("rl-a", "rl-b"))
	step := func(id string, change func(r *ledger.Reservation)) ledger.Reservation {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		r, err := tx.ReservationGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		change(r)
		if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{*r}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return *r
	}
	check := func(want ledger.Reservation) {
		t.Helper()
		got, err := s.ReservationGet(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("stored\n%+v\nwant\n%+v", got, want)
		}
	}
	started := step("rl-a", func(r *ledger.Reservation) {
		r.State, r.OperationID, r.StartedAt, r.ExecutionDeadline = ledger.StateStarted, "op-1", t0.Add(time.Second), t0.Add(time.Hour)
	})
	check(started)
	check(step("rl-a", func(r *ledger.Reservation) {
		r.State, r.Actual, r.Overdraft, r.FinishedAt, r.Breach = ledger.StateSettled, ledger.Amounts{700}, ledger.Amounts{100},
			t0.Add(2*time.Second), true
	}))
	// Every fixed column changed at once, with the state.
	check(step("rl-b", func(r *ledger.Reservation) {
		r.RequestDigest, r.Account.Region, r.AccountingEpoch = "sha256:other", "us", t0.Add(-time.Hour)
		r.Reserved, r.CreatedAt, r.ExpiresAt = ledger.Amounts{5}, t0.Add(time.Millisecond), t0.Add(2*time.Minute)
		r.State, r.UnknownAt = ledger.StateUsageUnknown, t0.Add(time.Second)
	}))
}
