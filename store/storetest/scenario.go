package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// apply runs one ledger command the way the engine does: Begin, apply over
// a store.Book, Write, Commit, retrying the whole transaction on
// store.ErrConflict or store.ErrDuplicate (a concurrent writer won).
func apply(ctx context.Context, s store.Store, cmd *ledger.Command, now time.Time) (ledger.Result, error) {
	for attempt := 0; ; attempt++ {
		res, err := applyOnce(ctx, s, cmd, now)
		if err == nil || attempt >= 100 || !(errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrDuplicate)) {
			return res, err
		}
	}
}

func applyOnce(ctx context.Context, s store.Store, cmd *ledger.Command, now time.Time) (ledger.Result, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return ledger.Result{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx)
	book := store.NewBook(ctx, tx, 1)
	res := ledger.Apply(book, cmd, now)
	if err := book.Err(); err != nil {
		return ledger.Result{}, fmt.Errorf("%s: read: %w", cmd.Kind, err)
	}
	if c := book.Changes(); !c.Empty() {
		if err := tx.Write(ctx, c); err != nil {
			return ledger.Result{}, fmt.Errorf("%s: write: %w", cmd.Kind, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return ledger.Result{}, fmt.Errorf("%s: commit: %w", cmd.Kind, err)
	}
	return res, nil
}

// testSeedScenario runs the seed's opening story through the store, one
// transaction per command: three gateways reserve 600 of 1,000 at once
// (concurrently, each in its own transaction), exactly one is admitted; it
// starts, settles 200 and gets 400 back exactly once; retries replay. The
// audit of the store's snapshot then finds nothing.
func testSeedScenario(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant7", Route: "chat.generate", Region: "eu"}
	policy := ledger.Policy{
		Key:        key,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500}},
		HoldTTL:    30 * time.Second,
	}.WithDefaults()
	res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}, now)
	if err != nil || res.Err != nil || res.Generation != 1 {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	reserve := func(id string) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{600}}
	}
	gateways := []string{"rl-gw1", "rl-gw2", "rl-gw3"}
	results := make([]ledger.Result, len(gateways))
	errs := make([]error, len(gateways))
	var wg sync.WaitGroup
	for i, id := range gateways {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = apply(ctx, s, reserve(id), now)
		}()
	}
	wg.Wait()
	admitted := ""
	for i, id := range gateways {
		switch {
		case errs[i] != nil:
			t.Fatalf("reserve %s: %v", id, errs[i])
		case results[i].Err == nil:
			if admitted != "" {
				t.Fatalf("both %s and %s admitted 600 of 1000", admitted, id)
			}
			admitted = id
		case errors.Is(results[i].Err, ledger.ErrInsufficientCapacity):
		default:
			t.Fatalf("reserve %s: %v", id, results[i].Err)
		}
	}
	if admitted == "" {
		t.Fatal("no gateway admitted")
	}
	res, err = apply(ctx, s, &ledger.Command{Kind: ledger.KindStart, ReservationID: admitted, OperationID: "op-1"}, now.Add(time.Second))
	if err != nil || res.Err != nil || res.Reservation.State != ledger.StateStarted {
		t.Fatalf("start: %+v, %v", res, err)
	}
	settle := &ledger.Command{Kind: ledger.KindSettle, ReservationID: admitted, OperationID: "op-1", Units: ledger.Amounts{200}}
	res, err = apply(ctx, s, settle, now.Add(2*time.Second))
	if err != nil || res.Err != nil || res.Refunded[0] != 400 || res.Reservation.State != ledger.StateSettled {
		t.Fatalf("settle: %+v, %v", res, err)
	}
	res, err = apply(ctx, s, settle, now.Add(3*time.Second))
	if err != nil || res.Err != nil || !res.Replayed || res.Refunded[0] != 0 {
		t.Fatalf("settle replay refunded again: %+v, %v", res, err)
	}
	res, err = apply(ctx, s, reserve(admitted), now.Add(4*time.Second))
	if err != nil || res.Err != nil || !res.Replayed || res.Reservation.State != ledger.StateSettled {
		t.Fatalf("reserve retry: %+v, %v", res, err)
	}
	stored, err := s.ReservationGet(ctx, admitted)
	if err != nil || stored.State != ledger.StateSettled || stored.Actual[0] != 200 || stored.OperationID != "op-1" {
		t.Fatalf("stored reservation: %+v, %v", stored, err)
	}
	account, err := s.AccountGet(ctx, ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if b := account.Balances[0]; b.Spent != 200 || b.Reserved != 0 || b.Available+b.Spent != b.Opening+b.Minted {
		t.Fatalf("account after the scenario: %+v", b)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Journal) == 0 || len(snap.Reservations) != 1 {
		t.Fatalf("snapshot: %d journal entries, %d reservations", len(snap.Journal), len(snap.Reservations))
	}
	for _, d := range ledger.Audit(snap) {
		t.Errorf("audit: %s", d)
	}
}
