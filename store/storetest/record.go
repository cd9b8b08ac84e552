package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testRecordScenario runs ledger.Record through the store, one
// transaction per command: two gateways record the same usage under one
// id at once (each in its own transaction; the loser's insert conflicts
// and its retry replays), so it is charged once, beyond what is free, as
// debt; a record on the frozen account is charged too. The stored row
// holds nothing and carries the usage, the debt and the operation, the
// journal keeps the record's kind, and the audit of the store's snapshot
// finds nothing.
func testRecordScenario(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	key := ledger.PolicyKey{Subject: "tenant7", Route: "chat.generate", Region: "eu"}
	policy := ledger.Policy{
		Key:        key,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 5000}},
		HoldTTL:    30 * time.Second,
	}.WithDefaults()
	if res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}, now); err != nil || res.Err != nil {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	record := func(id string, units ledger.Units) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: "record:" + id, OperationID: "op-" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{units}}
	}
	results := make([]ledger.Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = apply(ctx, s, record("rec-1", 1500), now)
		}()
	}
	wg.Wait()
	replays := 0
	for i := range results {
		if errs[i] != nil || results[i].Err != nil || results[i].Reservation.State != ledger.StateSettledWithDebt {
			t.Fatalf("record %d: %+v, %v", i, results[i], errs[i])
		}
		if results[i].Replayed {
			replays++
		}
	}
	if replays != 1 {
		t.Fatalf("%d of two concurrent records of one id replayed, want exactly one", replays)
	}
	res, err := apply(ctx, s, record("rec-2", 40), now.Add(time.Second))
	if err != nil || res.Err != nil || res.Reservation.Overdraft[0] != 40 {
		t.Fatalf("record on the frozen account: %+v, %v", res, err)
	}
	stored, err := s.ReservationGet(ctx, "rec-1")
	if err != nil || stored.State != ledger.StateSettledWithDebt || stored.Reserved != (ledger.Amounts{}) || stored.Actual[0] != 1500 ||
		stored.Overdraft[0] != 500 || stored.OperationID != "op-rec-1" || stored.RequestDigest != "record:rec-1" {
		t.Fatalf("stored record: %+v, %v", stored, err)
	}
	account, err := s.AccountGet(ctx, ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	// One second of refill (100) repaid part of the debt before rec-2.
	if b := account.Balances[0]; b.Spent != 1540 || b.Debt() != 440 || b.Available != 0 || b.Reserved != 0 {
		t.Fatalf("account after the records: %+v", b)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, e := range snap.Journal {
		if e.Kind == ledger.KindRecord {
			records++
		}
	}
	if records != 2 || len(snap.Reservations) != 2 {
		t.Fatalf("snapshot: %d record entries in the journal, %d reservations; want 2 and 2", records, len(snap.Reservations))
	}
	for _, d := range ledger.Audit(snap) {
		t.Errorf("audit: %s", d)
	}

	// After retention removed it, a retry with the same digest replays
	// from the tombstone (alone and in a prefetched batch, the engine's
	// path), charging nothing; another digest is still refused.
	later := now.Add(time.Hour)
	if res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: "rec-1", Before: later}, later); err != nil || res.Err != nil {
		t.Fatalf("retire rec-1: %+v, %v", res, err)
	}
	before, err := s.AccountGet(ctx, account.Key)
	if err != nil {
		t.Fatal(err)
	}
	res, err = apply(ctx, s, record("rec-1", 1500), later)
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range []ledger.Result{res, applyPrefetched(t, s, []ledger.Command{*record("rec-1", 1500)}, later)[0]} {
		if res.Err != nil || !res.Replayed || !res.Reservation.Retired || res.Reservation.State != ledger.StateSettledWithDebt ||
			res.Reservation.RequestDigest != "record:rec-1" || res.Generation != 1 {
			t.Fatalf("record replay %d after retention: %+v, want a replay from the tombstone", i, res)
		}
	}
	other := record("rec-1", 1500)
	other.RequestDigest = "record:elsewhere"
	if res, err := apply(ctx, s, other, later); err != nil || !errors.Is(res.Err, ledger.ErrDigestMismatch) || !errors.Is(res.Err, ledger.ErrReservationRetired) {
		t.Fatalf("record of a removed id with another digest: %+v, %v", res, err)
	}
	after, err := s.AccountGet(ctx, account.Key)
	if err != nil || after.Balances != before.Balances {
		t.Fatalf("a replay from the tombstone changed the account: %+v -> %+v, %v", before.Balances, after.Balances, err)
	}
	auditClean(t, s)
}
