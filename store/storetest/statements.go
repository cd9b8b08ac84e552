package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testStatementsRetained: StatementsRemove deletes, a page at a time,
// exactly the statements whose epoch ended at or before its bound (by
// end, not start), the earliest first; the audit of what is kept is clean
// (each account's chain starts at its oldest kept statement, and an
// account without one is fine); StatementsOf lists the kept ones; and a
// break planted among kept statements is still reported.
func testStatementsRetained(t *testing.T, s store.Store) {
	ctx := context.Background()
	h0 := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	hour := func(n int) time.Time { return h0.Add(time.Duration(n) * time.Hour) }
	busy, quiet := ledger.PolicyKey{Subject: "tenant-busy", Route: "chat", Region: "eu"}, ledger.PolicyKey{Subject: "tenant-quiet", Route: "chat", Region: "eu"}
	accounts := map[ledger.PolicyKey]ledger.AccountKey{}
	for _, key := range []ledger.PolicyKey{busy, quiet} {
		policy := ledger.Policy{
			Key:         key,
			Dimensions:  []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: time.Hour}},
			HoldTTL:     time.Hour,
			EpochLength: time.Hour,
		}.WithDefaults()
		res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}, h0)
		if err != nil || res.Err != nil {
			t.Fatalf("publish %s: %+v, %v", key, res, err)
		}
		accounts[key] = ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: res.Generation}
	}
	reserve := func(key ledger.PolicyKey, id string, now time.Time) {
		t.Helper()
		res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{10}}, now)
		if err != nil || res.Err != nil {
			t.Fatalf("reserve %s at %s: %+v, %v", id, now, res, err)
		}
	}
	// The busy account holds something new in each of epochs 0-5: five
	// statements, [h0,h1) ... [h4,h5). The quiet one in epochs 0 and 3:
	// one statement [h0,h3), which starts before any bound below and ends
	// after the first.
	for i := range 6 {
		reserve(busy, "busy-"+string(rune('0'+i)), hour(i).Add(time.Minute))
		if i == 0 || i == 3 {
			reserve(quiet, "quiet-"+string(rune('0'+i)), hour(i).Add(2*time.Minute))
		}
	}
	list := func(key ledger.PolicyKey) []ledger.Statement {
		t.Helper()
		got, err := consoleStore(t, s).StatementsOf(ctx, store.StatementFilter{Account: accounts[key], Limit: 100})
		if err != nil {
			t.Fatalf("statements of %s: %v", key, err)
		}
		return got
	}
	all := list(busy)
	if len(all) != 5 || !all[4].EpochStart.Equal(hour(0)) || !all[0].EpochEnd.Equal(hour(5)) {
		t.Fatalf("busy account's statements: %+v", all)
	}
	if q := list(quiet); len(q) != 1 || !q[0].EpochStart.Equal(hour(0)) || !q[0].EpochEnd.Equal(hour(3)) {
		t.Fatalf("quiet account's statements: %+v", q)
	}
	auditAll(t, s, "before any removal")

	remove := func(before time.Time, limit, want int) {
		t.Helper()
		n, err := s.StatementsRemove(ctx, before, limit)
		if err != nil || n != want {
			t.Fatalf("StatementsRemove(%s, %d) = %d, %v; want %d", before, limit, n, err, want)
		}
	}
	if _, err := s.StatementsRemove(ctx, hour(9), 0); err == nil {
		t.Error("StatementsRemove with limit 0: no error")
	}
	remove(hour(1).Add(-time.Nanosecond), 10, 0) // [h0,h1) ends after the bound
	remove(hour(2), 1, 1)                        // the earliest ended: [h0,h1)
	same(t, "kept after one", list(busy), all[:4])
	remove(hour(2), 10, 1) // [h1,h2): an end at the bound is due
	remove(hour(2), 10, 0)
	same(t, "kept after the bound", list(busy), all[:3])
	same(t, "quiet account kept", len(list(quiet)), 1)
	auditAll(t, s, "after removing the busy account's oldest")

	// At h3 the quiet account's only statement goes too (ended at h3),
	// with the busy account's [h2,h3): its current epoch has no statement
	// to open from, which is no discrepancy; listing it answers none.
	remove(hour(3), 10, 2)
	if q := list(quiet); len(q) != 0 {
		t.Fatalf("quiet account keeps %+v", q)
	}
	same(t, "kept after h3", list(busy), all[:2])
	auditAll(t, s, "after removing an account's every statement")
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same(t, "snapshot statements", len(snap.Statements), 2)

	// A break among the kept statements is still reported: a statement
	// starting inside [h3,h4), where [h3,h4) did not close.
	planted := all[1] // [h3,h4)
	planted.EpochStart, planted.EpochEnd = hour(3).Add(30*time.Minute), hour(4).Add(30*time.Minute)
	Commit(t, s, &store.Changes{Statements: []ledger.Statement{planted}})
	remove(hour(3), 10, 0)
	busyKey := accounts[busy].String()
	wantBreak := func(found []ledger.Discrepancy, how string) {
		t.Helper()
		seen := false
		for _, d := range found {
			if d.Check != ledger.CheckStatement || d.Account != busyKey {
				t.Errorf("%s: unexpected %s", how, d)
			}
			seen = true
		}
		if !seen {
			t.Errorf("%s: the planted break was not reported", how)
		}
	}
	snap, err = s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantBreak(ledger.Audit(snap), "audit of Snapshot")
	if err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		found, _ := ledger.AuditWith(snap, ledger.AuditOptions{})
		wantBreak(found, "streamed audit")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// testStatementsRemoveEarliestEndedFirst: StatementsRemove takes the
// earliest ended first, not the first inserted: a statement written
// after one that ends later (another replica's, or one written from a
// clock behind) still goes first.
func testStatementsRemoveEarliestEndedFirst(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := fixture()
	base.Statements = nil
	Commit(t, s, base)
	later, earlier := fixtureStatements()[1], fixtureStatements()[0]
	Commit(t, s, &store.Changes{Statements: []ledger.Statement{later}})
	Commit(t, s, &store.Changes{Statements: []ledger.Statement{earlier}})
	if n, err := s.StatementsRemove(ctx, at(0), 1); err != nil || n != 1 {
		t.Fatalf("StatementsRemove(limit 1) = %d, %v; want 1", n, err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Statements) != 1 || !snap.Statements[0].EpochEnd.Equal(later.EpochEnd) {
		t.Fatalf("kept %+v, want the statement ending at %s", snap.Statements, later.EpochEnd)
	}
}
