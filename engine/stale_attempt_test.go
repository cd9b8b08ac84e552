package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/memstore"
)

// The failover gate's non-linearizable history (CI, 6 Dec): an attempt of
// a reserve that its caller gave up on stays queued in one replica's engine
// while that replica's store is unreachable; the caller's retry reaches
// another replica and is rejected for capacity (nothing is written for a
// rejection); then capacity is freed and the first replica's engine, its
// store back, commits the queued attempt: the id the caller was told was
// rejected now holds units that nobody will settle.
func TestRejectedReserveIsNotAdmittedLaterByAnAbandonedAttempt(t *testing.T) {
	a, b, gated := twoReplicasWithAHolder(t)
	ctx := context.Background()

	// Replica a: its store hangs (a primary killed mid-batch); a batch is
	// stuck in Begin, and the reserve's first attempt queues behind it
	// until its caller stops waiting.
	stuck := make(chan error, 1)
	go func() { _, err := a.Do(ctx, reserveCmd("blocker", 1)); stuck <- err }()
	for gated.begins.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := a.Do(short, reserveCmd("x", 50))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first attempt on the hung replica: %v, want the caller's deadline", err)
	}

	// The retry on replica b is decided: rejected for capacity.
	res, err := b.Do(ctx, reserveCmd("x", 50))
	if err != nil || !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("retry on the other replica: %v %v, want a capacity rejection", err, res.Err)
	}
	// The caller moves on; the holder ends and frees the capacity.
	if res, err := b.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: "holder"}); err != nil || res.Err != nil {
		t.Fatalf("release holder: %v %v", err, res.Err)
	}

	// Replica a's store comes back: its queue is committed.
	close(gated.gate)
	if err := <-stuck; err != nil {
		t.Fatalf("blocker: %v", err)
	}
	if _, err := a.Do(ctx, reserveCmd("after", 1)); err != nil { // queued behind x
		t.Fatalf("after: %v", err)
	}
	if r, err := b.Reservation(ctx, "x"); err == nil && r.State.Holds() {
		t.Fatalf("reserve x was answered rejected, but an attempt its caller abandoned admitted it later: %s holding %v", r.State, r.Reserved)
	}
}

// The same race one step later: the attempt's batch was formed while its
// caller still waited, and its Begin hangs (a pool reaching for a primary
// that is gone) past the caller's deadline; the retry is rejected on the
// other replica and capacity comes back. When the store answers, the
// batch finds its caller gone once it holds the rows it read and writes
// nothing: the attempt is answered not applied.
func TestRejectedReserveIsNotAdmittedByABatchWhoseCallerLeft(t *testing.T) {
	a, b, gated := twoReplicasWithAHolder(t)
	ctx := context.Background()

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := a.Do(short, reserveCmd("x", 50)); first <- err }()
	for gated.begins.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	<-short.Done()

	res, err := b.Do(ctx, reserveCmd("x", 50))
	if err != nil || !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("retry on the other replica: %v %v, want a capacity rejection", err, res.Err)
	}
	if res, err := b.Do(ctx, ledger.Command{Kind: ledger.KindRelease, ReservationID: "holder"}); err != nil || res.Err != nil {
		t.Fatalf("release holder: %v %v", err, res.Err)
	}

	close(gated.gate)
	if err := <-first; !errors.Is(err, ErrNotApplied) {
		t.Errorf("the abandoned attempt: %v, want not applied", err)
	}
	if r, err := b.Reservation(ctx, "x"); err == nil && r.State.Holds() {
		t.Fatalf("reserve x was answered rejected, but a batch whose caller had left admitted it later: %s holding %v", r.State, r.Reserved)
	}
}

// twoReplicasWithAHolder returns two engines over one store, a's through a
// gate that holds its Begin until gate is closed, with a policy of 100
// units and a reservation "holder" of 60 made through b.
func twoReplicasWithAHolder(t *testing.T) (a, b *Engine, gated *gatedStore) {
	t.Helper()
	shared := memstore.New()
	c := newClock()
	b = New(shared, Options{DisableWorkers: true, Clock: c.Now})
	t.Cleanup(func() { b.Close() })
	gated = &gatedStore{Store: shared, gate: make(chan struct{})}
	a = New(gated, Options{DisableWorkers: true, Clock: c.Now})
	t.Cleanup(func() { a.Close() })
	publish(t, b, 100, time.Hour, 0)
	if res, err := b.Do(context.Background(), reserveCmd("holder", 60)); err != nil || res.Err != nil {
		t.Fatalf("holder: %v %v", err, res.Err)
	}
	return a, b, gated
}
