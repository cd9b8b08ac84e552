package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/postgres"
)

// twoEngines returns two engines without workers, one over first and one
// over second, a Store of its own on dsn (its own pool, as two replicas
// would have), all closed when the test ends.
func twoEngines(t *testing.T, first *postgres.Store, dsn string) (engines []*engine.Engine, second *postgres.Store) {
	t.Helper()
	second, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Close() })
	engines = []*engine.Engine{
		engine.New(first, engine.Options{DisableWorkers: true}),
		engine.New(second, engine.Options{DisableWorkers: true}),
	}
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines, second
}

// Two engines, each over its own Store (its own pool, as two replicas
// would be), group-commit concurrent gateways' reserve / start / settle on
// one hot account, and a new policy generation is published midway (a
// generation switch under load: the one place where a lock upgrade can
// deadlock, which PostgreSQL breaks and the engine retries). Whatever the
// interleaving: no unit is admitted beyond capacity, every acknowledged
// settle is stored, and the audit finds nothing.
func TestTwoEnginesOneHotAccount(t *testing.T) {
	first, dsn := openStore(t)
	engines, second := twoEngines(t, first, dsn)
	g := publish(t, first)

	const gateways, perGateway = 12, 15
	sizes := []int64{600, 200, 100, 50}
	var (
		mu       sync.Mutex
		settled  = map[string]ledger.Amounts{} // acknowledged settles: id -> actual
		rejected int
	)
	var wg sync.WaitGroup
	// Midway, a new generation is published: the next commands switch the
	// subject's capacity over (a move between two accounts, an update of
	// the shared current-generation row) while both engines keep going.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			mu.Lock()
			n := len(settled) + rejected
			mu.Unlock()
			if n >= gateways*perGateway/3 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		p := seedPolicy()
		p.Dimensions[0].Burst, p.Dimensions[0].MaxReservation = 1200, 1000
		res, err := engines[1].Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
		if err != nil || res.Err != nil {
			t.Errorf("publish generation 2: %v %v", err, res.Err)
		}
	}()
	for gw := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(gw), 7))
			for i := range perGateway {
				e := engines[rng.IntN(len(engines))]
				id := fmt.Sprintf("rl-%d-%d", gw, i)
				units := sizes[rng.IntN(len(sizes))]
				res, err := e.Do(ctx, reserveCmd(id, units))
				if err != nil {
					t.Errorf("reserve %s: %v", id, err)
					return
				}
				if res.Rejected() {
					mu.Lock()
					rejected++
					mu.Unlock()
					continue
				}
				if res.Err != nil {
					t.Errorf("reserve %s: %v", id, res.Err)
					return
				}
				e = engines[rng.IntN(len(engines))]
				if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id}); err != nil || res.Err != nil {
					t.Errorf("start %s: %v %v", id, err, res.Err)
					return
				}
				// Small actuals, so most of the run contends for held capacity
				// rather than running out of spent capacity.
				actual := ledger.Amounts{rng.Int64N(units/20 + 1)}
				e = engines[rng.IntN(len(engines))]
				res, err = e.Do(ctx, ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: actual})
				if err != nil || res.Err != nil {
					t.Errorf("settle %s: %v %v", id, err, res.Err)
					return
				}
				mu.Lock()
				settled[id] = actual
				mu.Unlock()
			}
		}()
	}
	wg.Wait()

	snap := mustAudit(t, first)
	var spent int64
	for id, actual := range settled {
		r, err := first.ReservationGet(context.Background(), id)
		if err != nil || r.Actual != actual || r.State != ledger.StateSettled {
			t.Errorf("acknowledged settle %s: stored %+v, %v", id, r, err)
		}
		spent += actual[0]
	}
	// Across both generations' accounts: everything acknowledged is spent,
	// nothing is still held, and no capacity was created (the moves retire
	// at one end what they mint at the other).
	var total ledger.Balance
	for _, a := range snap.Accounts {
		b := a.Balances[0]
		total.Opening += b.Opening
		total.Minted += b.Minted
		total.Spent += b.Spent
		total.Reserved += b.Reserved
		total.RetiredForMove += b.RetiredForMove
	}
	if total.Spent != spent || total.Reserved != 0 || total.Opening != 1000 || total.Minted != total.RetiredForMove {
		t.Errorf("accounts %+v: spent %d acknowledged; want nothing held, one opening of 1000, minted only by the move", total, spent)
	}
	if len(snap.Accounts) != 2 || snap.Accounts[0].Key.Generation != g {
		t.Errorf("%d accounts, want one per generation", len(snap.Accounts))
	}
	if len(settled)+rejected != gateways*perGateway {
		t.Errorf("%d settled + %d rejected != %d commands", len(settled), rejected, gateways*perGateway)
	}
	if len(snap.Reservations) != len(settled) {
		t.Errorf("%d reservations stored, %d acknowledged", len(snap.Reservations), len(settled))
	}
	t.Logf("settled %d, rejected %d; conflicts: %+v / %+v", len(settled), rejected, first.Stats(), second.Stats())
}
