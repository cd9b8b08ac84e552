package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// A batch that loses every race until its retries and budget are spent
// was rolled back each time: the caller is told it was not applied (and
// may retry under the same id), never that its outcome is unknown.
func TestConflictsToTheEndAnswerNotApplied(t *testing.T) {
	gated := &gatedStore{Store: memstore.New(), gate: make(chan struct{})}
	close(gated.gate)
	e := New(gated, Options{DisableWorkers: true, MaxConflictRetries: 2, ConflictRetryBudget: time.Nanosecond})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	gated.conflicts.Store(1 << 20)
	_, err := e.Do(context.Background(), reserveCmd("rl-lost", 10))
	if !errors.Is(err, store.ErrConflict) || !errors.Is(err, ErrNotApplied) {
		t.Fatalf("reserve that lost every race: %v, want store.ErrConflict and ErrNotApplied", err)
	}
	gated.conflicts.Store(0)
	if _, err := e.Reservation(context.Background(), "rl-lost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a batch answered not applied left its reservation: %v", err)
	}
}

// racingStore plays another replica that commits the same batch first:
// on the first Write it rolls this transaction back, commits the very same
// changes through a transaction of its own, and answers the duplicate the
// store reports for the second insert of a reservation id.
type racingStore struct {
	store.Store
	armed atomic.Bool
}

func (s *racingStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &racingTx{Tx: tx, s: s}, nil
}

type racingTx struct {
	store.Tx
	s *racingStore
}

func (tx *racingTx) Write(ctx context.Context, c *store.Changes) error {
	if !tx.s.armed.CompareAndSwap(true, false) {
		return tx.Tx.Write(ctx, c)
	}
	tx.Tx.Rollback(ctx) // memstore admits one writer: let the other replica in
	other, err := tx.s.Store.Begin(ctx)
	if err != nil {
		return err
	}
	defer other.Rollback(ctx)
	if err := other.Write(ctx, c); err != nil {
		return err
	}
	if err := other.Commit(ctx); err != nil {
		return err
	}
	return fmt.Errorf("another replica inserted it first: %w", store.ErrDuplicate)
}

// Two replicas that take the same reserve at once: the one whose insert
// finds the other's row runs its batch again, and the reserve is answered
// as a replay of the receipt the other wrote; the hold is taken once.
func TestReserveRacingAnotherReplicaIsAReplay(t *testing.T) {
	racing := &racingStore{Store: memstore.New()}
	e := New(racing, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	racing.armed.Store(true)
	res, err := e.Do(context.Background(), reserveCmd("rl-raced", 600))
	if err != nil || res.Err != nil || !res.Replayed || res.Reservation.State != ledger.StateReserved {
		t.Fatalf("reserve that lost the insert race: %v %+v, want a replay of the RESERVED receipt", err, res)
	}
	accounts, err := e.Accounts(context.Background(), ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil || len(accounts) != 1 || accounts[0].Balances[0].Reserved != 600 {
		t.Fatalf("the raced reserve must hold once: %v %+v", err, accounts)
	}
	auditClean(t, e)
}

// readFailingStore fails the next ReservationGet with an unavailable store
// once armed.
type readFailingStore struct {
	store.Store
	armed atomic.Bool
}

func (s *readFailingStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &readFailingTx{Tx: tx, s: s}, nil
}

type readFailingTx struct {
	store.Tx
	s *readFailingStore
}

func (tx *readFailingTx) ReservationGet(ctx context.Context, id string) (*ledger.Reservation, error) {
	if tx.s.armed.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("read %s: connection reset: %w", id, store.ErrUnavailable)
	}
	return tx.Tx.ReservationGet(ctx, id)
}

// A read the store fails inside a batch is not taken for a missing row:
// the batch is not applied and the caller is told so, rather than being
// answered from a state the ledger never saw (a reserve debiting a second
// time, a settle answered RESERVATION_NOT_FOUND).
func TestFailedReadAppliesNothing(t *testing.T) {
	failing := &readFailingStore{Store: memstore.New()}
	e := New(failing, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0)
	if res, err := e.Do(context.Background(), reserveCmd("rl-1", 600)); err != nil || res.Err != nil {
		t.Fatalf("reserve: %v %v", err, res.Err)
	}
	failing.armed.Store(true)
	res, err := e.Do(context.Background(), reserveCmd("rl-1", 600))
	if !errors.Is(err, ErrNotApplied) || !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("retry whose read failed: %v %+v, want ErrNotApplied and store.ErrUnavailable", err, res)
	}
	accounts, err := e.Accounts(context.Background(), ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil || len(accounts) != 1 || accounts[0].Balances[0].Reserved != 600 {
		t.Fatalf("after the failed read: %v %+v, want the one hold of 600", err, accounts)
	}
	auditClean(t, e)
}

// A hold left EXPIRING (claimed by an expiry whose completion did not
// commit with it) is finished by the expiry worker: EXPIRED, its hold
// back in available, once.
func TestExpiryWorkerFinishesAClaimedHold(t *testing.T) {
	clk := newClock()
	e := New(memstore.New(), Options{DisableWorkers: true, Clock: clk.Now})
	defer e.Close()
	ctx := context.Background()
	publish(t, e, 1000, 10*time.Second, 0)
	if res, err := e.Do(ctx, reserveCmd("rl-claimed", 300)); err != nil || res.Err != nil {
		t.Fatal(err, res.Err)
	}
	clk.Advance(11 * time.Second)
	claim := ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "rl-claimed", Cause: ledger.CauseHoldExpired}
	if res, err := e.Do(ctx, claim); err != nil || res.Err != nil || res.Reservation.State != ledger.StateExpiring {
		t.Fatalf("claim: %v %+v", err, res)
	}
	e.runDue(ctx)
	if r, _ := e.Reservation(ctx, "rl-claimed"); r.State != ledger.StateExpired {
		t.Fatalf("a claimed hold after the expiry worker ran: %s, want EXPIRED", r.State)
	}
	accounts, err := e.Accounts(ctx, ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"})
	if err != nil || len(accounts) != 1 || accounts[0].Balances[0].Reserved != 0 {
		t.Fatalf("after the expiry: %v %+v, want nothing reserved", err, accounts)
	}
	auditClean(t, e)
}
