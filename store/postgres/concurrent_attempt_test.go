package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
)

// Two attempts of one reserve run at once on two replicas over one
// PostgreSQL, on an account with room for one of them: attempt a has
// locked the account and written the reservation, and waits to commit;
// attempt b looks the id up (absent, uncommitted: nothing to lock), then
// waits for the account's lock. When a commits, b reads the account as a
// left it (READ COMMITTED re-reads a locked row) and finds too little
// room. b must answer a's receipt, replayed: a rejection would tell the
// caller "rejected" for an id the store holds (docs/CLIENTS.md, section
// 5: a resend admits it, replays it, or rejects it).
func TestConcurrentAttemptReplaysTheAdmissionItWaitedFor(t *testing.T) {
	plain, dsn := openStore(t)
	publish(t, plain)
	if res := commitCmds(t, plain, time.Now(), reserveCmd("holder", 960)); res[0].Err != nil {
		t.Fatalf("holder: %v", res[0].Err)
	}

	pausedA, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pausedA.Close()
	gate := &commitGate{Store: pausedA, reached: make(chan struct{}), release: make(chan struct{})}
	// b's connections carry a name of their own, so the test can see
	// b's backend wait for a lock.
	appName := fmt.Sprintf("capledger-attempt-b-%d", time.Now().UnixNano())
	storeB, err := postgres.Open(context.Background(), withParam(t, dsn, "application_name", appName))
	if err != nil {
		t.Fatal(err)
	}
	defer storeB.Close()
	a := engine.New(gate, engine.Options{DisableWorkers: true})
	defer a.Close()
	b := engine.New(storeB, engine.Options{DisableWorkers: true})
	defer b.Close()

	ctx := context.Background()
	type answer struct {
		res ledger.Result
		err error
	}
	answerA := make(chan answer, 1)
	go func() { res, err := a.Do(ctx, reserveCmd("x", 30)); answerA <- answer{res, err} }()
	select {
	case <-gate.reached:
	case ans := <-answerA:
		t.Fatalf("attempt a answered before its commit: %+v %v", ans.res.Err, ans.err)
	}

	answerB := make(chan answer, 1)
	go func() { res, err := b.Do(ctx, reserveCmd("x", 30)); answerB <- answer{res, err} }()
	waitForLockWait(t, serverDSN(t), appName, answerB)
	close(gate.release)

	ansA, ansB := <-answerA, <-answerB
	if ansA.err != nil || ansA.res.Err != nil || ansA.res.Replayed {
		t.Fatalf("attempt a: %v %v (replayed %v), want the admission", ansA.err, ansA.res.Err, ansA.res.Replayed)
	}
	if ansB.err != nil {
		t.Fatalf("attempt b: %v", ansB.err)
	}
	if ansB.res.Err != nil {
		t.Fatalf("attempt b answered %v, but attempt a holds x: %s holding %v", ansB.res.Err, ansA.res.Reservation.State, ansA.res.Reservation.Reserved)
	}
	if !ansB.res.Replayed || ansB.res.Reservation.ID != "x" || !ansB.res.Reservation.CreatedAt.Equal(ansA.res.Reservation.CreatedAt) ||
		ansB.res.Reservation.Reserved != ansA.res.Reservation.Reserved {
		t.Fatalf("attempt b: %+v, want a's receipt replayed: %+v", ansB.res.Reservation, ansA.res.Reservation)
	}
}

// commitGate is a store whose first transaction to commit stops before
// its COMMIT (reached closed) until release is closed.
type commitGate struct {
	*postgres.Store
	reached, release chan struct{}
	once             atomic.Bool
}

func (g *commitGate) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := g.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &gatedCommitTx{Tx: tx, gate: g}, nil
}

// gatedCommitTx passes the store's rechecks through (the engine asks for
// them), but not its prefetches: the test's batches hold one command.
type gatedCommitTx struct {
	store.Tx
	gate *commitGate
}

func (t *gatedCommitTx) Commit(ctx context.Context) error {
	if t.gate.once.CompareAndSwap(false, true) {
		close(t.gate.reached)
		<-t.gate.release
	}
	return t.Tx.Commit(ctx)
}

func (t *gatedCommitTx) ReservationsCommitted(ctx context.Context, ids []string) ([]string, error) {
	return t.Tx.(store.ReservationsRechecker).ReservationsCommitted(ctx, ids)
}

// waitForLockWait returns once a backend of application appName waits
// for a lock; it fails the test if attempt answers first.
func waitForLockWait[T any](t *testing.T, dsn, appName string, attempt <-chan T) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for {
		var waiting int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
			AND wait_event_type = 'Lock'`, appName).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		select {
		case ans := <-attempt:
			t.Fatalf("attempt b answered without waiting for a's lock: %+v", ans)
		case <-time.After(time.Millisecond): // poll again
		}
	}
}

// Many gateways resend the same reserve ids, at the same moments, through
// two replicas over one PostgreSQL, against an account with room for
// about half of them, and nothing frees capacity meanwhile: an id
// answered rejected can then only be one whose admission no attempt
// committed, so none may be held in the store at the end.
func TestResentReservesRejectedAreNeverHeld(t *testing.T) {
	first, dsn := openStore(t)
	publish(t, first)
	if res := commitCmds(t, first, time.Now(), reserveCmd("holder", 400)); res[0].Err != nil {
		t.Fatalf("holder: %v", res[0].Err)
	}
	engines, second := twoEngines(t, first, dsn)

	const gateways, ids = 8, 48 // 48 ids of 25 units: 1,200 asked for, 600 free
	var (
		mu       sync.Mutex
		rejected = map[string]int{}
		admitted = map[string]int{}
	)
	var wg sync.WaitGroup
	for gw := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(gw), 11))
			// Every gateway walks the same ids in the same order, so the
			// attempts of one id meet on both replicas.
			for i := range ids {
				id := fmt.Sprintf("resent-%d", i)
				res, err := engines[rng.IntN(len(engines))].Do(context.Background(), reserveCmd(id, 25))
				if err != nil {
					t.Errorf("reserve %s: %v", id, err)
					return
				}
				mu.Lock()
				switch {
				case res.Rejected():
					rejected[id]++
				case res.Err == nil:
					admitted[id]++
				default:
					t.Errorf("reserve %s: %v", id, res.Err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	held := 0
	for i := range ids {
		id := fmt.Sprintf("resent-%d", i)
		r, err := first.ReservationGet(context.Background(), id)
		switch {
		case err == nil && r.State.Holds():
			held++
			if rejected[id] > 0 {
				t.Errorf("reserve %s: answered rejected %d times, admitted %d times, and the store holds it", id, rejected[id], admitted[id])
			}
		case err == nil:
			t.Errorf("reserve %s: stored %s, want it held or absent", id, r.State)
		default:
			if admitted[id] > 0 {
				t.Errorf("reserve %s: admitted %d times, not stored: %v", id, admitted[id], err)
			}
		}
	}
	if held != 600/25 {
		t.Errorf("%d ids held, want the %d that fit", held, 600/25)
	}
	mustAudit(t, first)
	t.Logf("held %d of %d ids; conflicts: %+v / %+v", held, ids, first.Stats(), second.Stats())
}

// BenchmarkRejectedReserves measures what the recheck of rejected
// reserves (store.ReservationsRechecker) costs: gateways on two engines
// send reserves that never fit (every one is rejected for capacity, so
// every batch rechecks its ids), against the same store with the
// capability hidden, in one run.
//
//	go test ./store/postgres -run '^$' -bench RejectedReserves -count 3
func BenchmarkRejectedReserves(b *testing.B) {
	for _, gateways := range []int{1, 64} {
		for _, recheck := range []bool{true, false} {
			name := fmt.Sprintf("gateways=%d/recheck=%v", gateways, recheck)
			b.Run(name, func(b *testing.B) {
				stores := hotBench(b, 2)
				engines := make([]*engine.Engine, len(stores))
				for i, s := range stores {
					var st store.Store = s
					if !recheck {
						st = withoutRecheck{s}
					}
					engines[i] = engine.New(st, engine.Options{DisableWorkers: true})
					defer engines[i].Close()
				}
				runGateways(b, gateways, func(g int) error {
					res, err := engines[g%2].Do(context.Background(), reserveCmd(nextID(), 1<<50))
					if err == nil && !res.Rejected() {
						err = fmt.Errorf("reserve: %v, want a capacity rejection", res.Err)
					}
					return err
				})
			})
		}
	}
}

// withoutRecheck is a store whose transactions keep their prefetches but
// hide store.ReservationsRechecker.
type withoutRecheck struct{ *postgres.Store }

func (s withoutRecheck) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return prefetchingTx{tx}, nil
}

type prefetchingTx struct{ store.Tx }

func (t prefetchingTx) ReservationsPrefetch(ctx context.Context, ids []string) error {
	return t.Tx.(store.Prefetcher).ReservationsPrefetch(ctx, ids)
}

func (t prefetchingTx) AccountsPrefetch(ctx context.Context, subjects []ledger.PolicyKey, accounts []ledger.AccountKey, reservations []string) error {
	return t.Tx.(store.AccountsPrefetcher).AccountsPrefetch(ctx, subjects, accounts, reservations)
}
