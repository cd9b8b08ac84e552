package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// commitGate holds the Commit of every transaction begun while armed
// until open is closed, and says when one reached it (at).
type commitGate struct {
	store.Store
	armed atomic.Bool
	at    chan struct{}
	open  chan struct{}
}

func (g *commitGate) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := g.Store.Begin(ctx)
	if err != nil || !g.armed.Load() {
		return tx, err
	}
	return &gatedCommit{Tx: tx, g: g}, nil
}

type gatedCommit struct {
	store.Tx
	g *commitGate
}

func (tx *gatedCommit) Commit(ctx context.Context) error {
	select {
	case tx.g.at <- struct{}{}:
	default:
	}
	<-tx.g.open
	return tx.Tx.Commit(ctx)
}

// A Reserve its replica took up before the caller's deadline commits after
// that deadline, and until it does another replica's lookup answers "not
// found": the deadline bounds when an attempt can be taken up, not when
// it lands, so a lookup after a lost answer is never final; a resend is
// (docs/CLIENTS.md section 4, rule 2, and section 5; API.md,
// GetReservation). Over PostgreSQL, where a lookup does not wait for a
// commit in flight.
func TestAttemptTakenUpBeforeItsDeadlineLandsAfterIt(t *testing.T) {
	dsn := replicatest.SchemaDSN(t)
	ctx := context.Background()
	open := func() store.Store {
		st, err := postgres.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	gate := &commitGate{Store: open(), at: make(chan struct{}, 1), open: make(chan struct{})}
	a := New(gate, Options{DisableWorkers: true})
	t.Cleanup(func() { a.Close() })
	b := New(open(), Options{DisableWorkers: true})
	t.Cleanup(func() { b.Close() })
	publish(t, b, 1000, time.Hour, 0)

	gate.armed.Store(true)
	attempt, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		res, err := a.Do(attempt, reserveCmd("x", 50))
		if err == nil {
			err = res.Err
		}
		done <- err
	}()
	<-gate.at // taken up: its batch holds the rows and is committing
	cancel()  // the caller gives up: its deadline passed

	if _, err := b.Reservation(ctx, "x"); !errors.Is(err, store.ErrNotFound) && !errors.Is(err, ledger.ErrReservationNotFound) {
		t.Fatalf("lookup on the other replica while the attempt commits: %v, want not found", err)
	}
	close(gate.open)
	<-done
	r, err := b.Reservation(ctx, "x")
	if err != nil || r.State != ledger.StateReserved {
		t.Fatalf("after its commit: %v %v, want the abandoned attempt landed RESERVED", r.State, err)
	}
	res, err := b.Do(ctx, reserveCmd("x", 50))
	if err != nil || res.Err != nil || !res.Replayed {
		t.Fatalf("resend on the other replica: %v %v replayed=%v, want a replay", err, res.Err, res.Replayed)
	}
	auditClean(t, b)
}
