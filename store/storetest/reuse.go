package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testReuseInOneBatch: one batch may end an id's life and begin its next
// (the engine commits a retention page in the same transaction as the
// gateways' commands waiting beside it): a forget of s's tombstone then a
// reserve of s; a retire of x past the tombstone horizon (which leaves no
// tombstone) then a reserve of x; a retire, a forget and a reserve of r;
// and an unrelated release of h. The batch commits whole, every command
// answers as it would alone, and afterwards the new lives are the rows
// every read sees (the committed reads, the next batch's transaction, the
// due, finished and subject indexes), no tombstone is left for their ids,
// the retained totals count the old lives and the audit is clean, before
// and after the new lives end.
func testReuseInOneBatch(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, key := retentionWorld(t, s, time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC))
	settled, _ := s.ReservationGet(ctx, "s")
	res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: "s", Before: now}, now)
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("retire s: %+v, %v", res, err)
	}
	later := now.Add(721 * time.Hour) // past a 30-day tombstone horizon
	reserve := func(id string) ledger.Command {
		return ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id + "-again",
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{10}}
	}
	batch := []ledger.Command{
		{Kind: ledger.KindForget, ReservationID: "s", Before: later},
		reserve("s"),
		{Kind: ledger.KindRetire, ReservationID: "x", Before: later, ForgetBefore: later},
		reserve("x"),
		{Kind: ledger.KindRetire, ReservationID: "r", Before: later},
		{Kind: ledger.KindForget, ReservationID: "r", Before: later},
		reserve("r"),
		{Kind: ledger.KindRelease, ReservationID: "h"},
	}
	results, err := applyBatch(ctx, s, batch, later)
	if err != nil {
		t.Fatalf("a batch that forgets and reuses ids: %v", err)
	}
	for i, r := range results {
		cmd := &batch[i]
		if r.Err != nil || r.Replayed {
			t.Errorf("%s %s: %+v", cmd.Kind, cmd.ReservationID, r)
			continue
		}
		switch cmd.Kind {
		case ledger.KindReserve:
			if r.Reservation.Retired || r.Reservation.State != ledger.StateReserved || r.Reservation.RequestDigest != cmd.RequestDigest {
				t.Errorf("reserve of reused %s: %+v", cmd.ReservationID, r.Reservation)
			}
		case ledger.KindRelease:
			if r.Reservation.State != ledger.StateReleased {
				t.Errorf("release of h: %+v", r.Reservation)
			}
		}
	}

	reused := []string{"r", "s", "x"}
	for _, id := range reused {
		got, err := s.ReservationGet(ctx, id)
		if err != nil || got.State != ledger.StateReserved || got.RequestDigest != "sha256:"+id+"-again" ||
			got.Reserved != (ledger.Amounts{10}) || !got.CreatedAt.Equal(later) {
			t.Errorf("reused %s after the batch: %+v, %v", id, got, err)
		}
		_, err = s.TombstoneGet(ctx, id)
		mustNotFound(t, "tombstone of reused "+id, err)
	}
	due, err := s.TombstonesDue(ctx, later.Add(1000*time.Hour), 10)
	sameIDs(t, "tombstones after the batch", due, []string(nil))
	if err != nil {
		t.Fatal(err)
	}
	finished, err := s.ReservationsFinished(ctx, later, 10)
	sameIDs(t, "finished after the batch", finished, []string{"h"})
	if err != nil {
		t.Fatal(err)
	}
	// The new holds expire: the due index lists each once, as RESERVED.
	listed, err := s.ReservationsDue(ctx, later.Add(time.Hour), 20)
	if err != nil {
		t.Fatal(err)
	}
	var expiring []string
	for _, d := range listed {
		if d.State == ledger.StateReserved {
			expiring = append(expiring, d.ID)
		}
	}
	slices.Sort(expiring)
	sameIDs(t, "RESERVED holds due after the batch", expiring, reused)
	if cs, ok := s.(store.SubjectReservations); ok {
		page, err := cs.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: key.Subject,
			States: []ledger.State{ledger.StateReserved}, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range page {
			ids = append(ids, r.ID+"="+r.RequestDigest)
		}
		sameIDs(t, "the subject's RESERVED reservations", ids, []string{"x=sha256:x-again", "s=sha256:s-again", "r=sha256:r-again"})
		states, err := cs.ReservationStatesOfSubject(ctx, key.Subject)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "the subject's state counts", states.Counts, []store.StateCount{
			{Route: key.Route, State: ledger.StateReserved, Count: 3},
			{Route: key.Route, State: ledger.StateStarted, Count: 1},
			{Route: key.Route, State: ledger.StateReleased, Count: 1},
			{Route: key.Route, State: ledger.StateUsageUnknown, Count: 1},
		})
	}
	snap := auditClean(t, s)
	same(t, "retained", snap.Retained, []ledger.Retained{{Account: key, Reservations: 3,
		Spent: settled.Actual, Overdraft: settled.Overdraft}})
	forgets := 0
	for _, e := range snap.Journal {
		if e.Kind == ledger.KindForget {
			forgets++
		}
	}
	if forgets != 3 {
		t.Errorf("%d forget entries in the journal, want 3 (s, x, r)", forgets)
	}

	// The new lives go on and end through later batches' transactions.
	end := later.Add(time.Second)
	for _, cmd := range []ledger.Command{
		{Kind: ledger.KindStart, ReservationID: "x", OperationID: "op-x2"},
		{Kind: ledger.KindSettle, ReservationID: "x", OperationID: "op-x2", Units: ledger.Amounts{4}},
		{Kind: ledger.KindRelease, ReservationID: "s"},
		{Kind: ledger.KindRelease, ReservationID: "r"},
	} {
		res, err := apply(ctx, s, &cmd, end)
		if err != nil || res.Err != nil || res.Replayed || res.Reservation.Retired {
			t.Fatalf("%s %s of the new life: %+v, %v", cmd.Kind, cmd.ReservationID, res, err)
		}
	}
	finished, _ = s.ReservationsFinished(ctx, end, 10)
	sameIDs(t, "finished after the new lives end", finished, []string{"h", "r", "s", "x"})
	auditClean(t, s)
}

// applyBatch runs cmds in one transaction as the engine's Core.Commit
// does: their reservations prefetched, then the accounts of the batch's
// subjects and of the reservations it refunds, when the store can; it
// returns the write's or the commit's error.
func applyBatch(ctx context.Context, s store.Store, cmds []ledger.Command, now time.Time) ([]ledger.Result, error) {
	tx, err := s.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	if p, ok := tx.(store.Prefetcher); ok {
		var ids []string
		for i := range cmds {
			ids = append(ids, cmds[i].ReservationID)
		}
		if err := p.ReservationsPrefetch(ctx, ids); err != nil {
			return nil, fmt.Errorf("prefetch: %w", err)
		}
	}
	if p, ok := tx.(store.AccountsPrefetcher); ok {
		var subjects []ledger.PolicyKey
		var refunds []string
		for i := range cmds {
			switch cmds[i].Kind {
			case ledger.KindReserve:
				k := ledger.PolicyKey{Subject: cmds[i].Subject, Route: cmds[i].Route, Region: cmds[i].Region}
				if !slices.Contains(subjects, k) {
					subjects = append(subjects, k)
				}
			case ledger.KindSettle, ledger.KindRelease, ledger.KindExpire:
				refunds = append(refunds, cmds[i].ReservationID)
			}
		}
		if err := p.AccountsPrefetch(ctx, subjects, nil, refunds); err != nil {
			return nil, fmt.Errorf("prefetch accounts: %w", err)
		}
	}
	book := store.NewBook(ctx, tx, len(cmds))
	results := make([]ledger.Result, len(cmds))
	for i := range cmds {
		results[i] = ledger.Apply(book, &cmds[i], now)
	}
	if err := book.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if c := book.Changes(); !c.Empty() {
		if err := tx.Write(ctx, c); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return results, nil
}

// testReinsertThenUpdate: a Write that deletes a reservation row
// (RetentionChanges.RemovedReservations) and inserts one under the same
// id leaves that new row in place, and a later Write of the same
// transaction updates it (it is not NewReservations there: the row
// exists) rather than inserting it a second time.
func testReinsertThenUpdate(t *testing.T, s store.Store) {
	ctx := context.Background()
	Commit(t, s, fixture())
	old := fixtureReservations()[1]
	again := old
	again.RequestDigest = "sha256:again"
	again.CreatedAt = old.CreatedAt.Add(time.Hour)
	again.ExpiresAt = old.ExpiresAt.Add(time.Hour)
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.ReservationGet(ctx, old.ID); err != nil {
		t.Fatalf("read %s: %v", old.ID, err)
	}
	err = tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{again}, NewReservations: map[string]bool{again.ID: true},
		Retention: store.RetentionChanges{RemovedReservations: []string{old.ID}}})
	if err != nil {
		t.Fatalf("remove %s and insert it again: %v", old.ID, err)
	}
	got, err := tx.ReservationGet(ctx, old.ID)
	if err != nil || got.RequestDigest != again.RequestDigest {
		t.Fatalf("%s read back in the transaction: %+v, %v", old.ID, got, err)
	}
	released := again
	released.State, released.FinishedAt = ledger.StateReleased, again.CreatedAt.Add(time.Second)
	if err := tx.Write(ctx, &store.Changes{Reservations: []ledger.Reservation{released}}); err != nil {
		t.Fatalf("update of the inserted %s: %v", old.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	stored, err := s.ReservationGet(ctx, old.ID)
	if err != nil || stored.RequestDigest != released.RequestDigest || stored.State != ledger.StateReleased ||
		!stored.CreatedAt.Equal(released.CreatedAt) {
		t.Fatalf("%s after the commit: %+v, %v", old.ID, stored, err)
	}
}
