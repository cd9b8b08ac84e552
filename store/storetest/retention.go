package storetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// retentionCases are the retention checks, run by Run.
var retentionCases = []struct {
	name string
	f    func(t *testing.T, s store.Store)
}{
	{"Retention", testRetention},
	{"RetentionConcurrentReplicas", testRetentionConcurrent},
	{"TombstoneDuplicate", testTombstoneDuplicate},
	{"AuditReusedIDAfterHorizon", testAuditReusedID},
	{"CheckedAccountAfterIDReuse", testCheckedAccountAfterIDReuse},
	{"ResolverAnswersAfterIDReuse", testResolverAnswersAfterIDReuse},
	{"SnapshotStreaming", testSnapshotStreaming},
	{"ReuseInOneBatch", testReuseInOneBatch},
	{"ReinsertThenUpdate", testReinsertThenUpdate},
	{"ShardFencesIdle", testShardFencesIdle},
	{"MetaRemoved", testMetaRemoved},
	{"StatementsRetained", testStatementsRetained},
	{"StatementsRemoveEarliestEndedFirst", testStatementsRemoveEarliestEndedFirst},
}

// retentionWorld publishes one policy and drives reservations into every
// state through the ledger: settled "s" (with debt), released "r",
// expired "x", and live ones: RESERVED "h", STARTED "g", USAGE_UNKNOWN "u".
// It returns the time after the last command and the account's key.
func retentionWorld(t *testing.T, s store.Store, now time.Time) (time.Time, ledger.AccountKey) {
	t.Helper()
	ctx := context.Background()
	key := ledger.PolicyKey{Subject: "tenant-r", Route: "chat", Region: "eu"}
	policy := ledger.Policy{
		Key:        key,
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: time.Hour, MaxOverdraft: 500}},
		HoldTTL:    30 * time.Second,
	}.WithDefaults()
	run := func(cmd *ledger.Command, want State) ledger.Result {
		t.Helper()
		res, err := apply(ctx, s, cmd, now)
		if err != nil || res.Err != nil || want != 0 && res.Reservation.State != ledger.State(want) {
			t.Fatalf("%s %s at %s: %+v, %v", cmd.Kind, cmd.ReservationID, now, res, err)
		}
		now = now.Add(time.Second)
		return res
	}
	res := run(&ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &policy}, 0)
	reserve := func(id string, units ledger.Units) {
		run(&ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{units}}, State(ledger.StateReserved))
	}
	for _, id := range []string{"x", "s", "r", "h", "g", "u"} {
		reserve(id, 100)
	}
	run(&ledger.Command{Kind: ledger.KindStart, ReservationID: "s", OperationID: "op-s"}, State(ledger.StateStarted))
	run(&ledger.Command{Kind: ledger.KindStart, ReservationID: "g", OperationID: "op-g"}, State(ledger.StateStarted))
	run(&ledger.Command{Kind: ledger.KindStart, ReservationID: "u", OperationID: "op-u"}, State(ledger.StateStarted))
	run(&ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "u"}, State(ledger.StateUsageUnknown))
	now = now.Add(time.Minute) // x's hold runs out
	run(&ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "x"}, State(ledger.StateExpiring))
	run(&ledger.Command{Kind: ledger.KindExpire, ReservationID: "x"}, State(ledger.StateExpired))
	run(&ledger.Command{Kind: ledger.KindSettle, ReservationID: "s", OperationID: "op-s", Units: ledger.Amounts{700}}, State(ledger.StateSettledWithDebt))
	run(&ledger.Command{Kind: ledger.KindRelease, ReservationID: "r"}, State(ledger.StateReleased))
	return now, ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: res.Generation}
}

// State is a ledger.State usable as "no expectation" at zero.
type State = ledger.State

func auditClean(t *testing.T, s store.Store) *ledger.Snapshot {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	for _, d := range ledger.Audit(snap) {
		t.Errorf("audit: %s", d)
	}
	return snap
}

// testRetention: ReservationsFinished finds exactly the terminal rows due,
// in finish order, in pages; retire removes them, leaves tombstones and
// retained totals the audit adds up; every later command on a removed id
// is answered from its tombstone and debits nothing; live reservations are
// never removed; TombstonesDue and forget end the tombstones.
func testRetention(t *testing.T, s store.Store) {
	ctx := context.Background()
	start := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	now, key := retentionWorld(t, s, start)
	if _, err := s.ReservationsFinished(ctx, now, 0); err == nil {
		t.Error("ReservationsFinished with limit 0: no error")
	}
	ids, err := s.ReservationsFinished(ctx, now, 10)
	sameIDs(t, "finished reservations", ids, []string{"x", "s", "r"})
	if err != nil {
		t.Fatal(err)
	}
	page, _ := s.ReservationsFinished(ctx, now, 2)
	sameIDs(t, "first page", page, []string{"x", "s"})
	x, _ := s.ReservationGet(ctx, "x")
	cut, _ := s.ReservationsFinished(ctx, x.FinishedAt, 10)
	sameIDs(t, "finished at or before x", cut, []string{"x"})
	early, _ := s.ReservationsFinished(ctx, x.FinishedAt.Add(-time.Nanosecond), 10)
	sameIDs(t, "finished before x", early, []string(nil))

	before, _ := s.AccountGet(ctx, key)
	settled, _ := s.ReservationGet(ctx, "s")
	for _, id := range []string{"h", "g", "u"} {
		res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: now}, now)
		if err != nil || !errors.Is(res.Err, ledger.ErrReservationNotFinished) {
			t.Fatalf("retire of live %s: %+v, %v", id, res, err)
		}
	}
	for _, id := range ids {
		res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: now}, now)
		if err != nil || res.Err != nil || res.Replayed || !res.Reservation.Retired {
			t.Fatalf("retire %s: %+v, %v", id, res, err)
		}
		_, err = s.ReservationGet(ctx, id)
		mustNotFound(t, "retired reservation "+id, err)
	}
	tomb, err := s.TombstoneGet(ctx, "s")
	same(t, "tombstone", tomb, ledger.Tombstone{ID: "s", RequestDigest: "sha256:s", Account: key,
		State: ledger.StateSettledWithDebt, FinishedAt: settled.FinishedAt})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.TombstoneGet(ctx, "h")
	mustNotFound(t, "tombstone of a live reservation", err)
	left, _ := s.ReservationsFinished(ctx, now, 10)
	sameIDs(t, "finished after retention", left, []string(nil))
	snap := auditClean(t, s)
	same(t, "retained", snap.Retained, []ledger.Retained{{Account: key, Reservations: 3,
		Spent: settled.Actual, Overdraft: settled.Overdraft}})
	for _, r := range snap.Reservations {
		if r.State.Terminal() {
			t.Errorf("terminal %s still in the snapshot", r.ID)
		}
	}

	// Replays from the tombstones change nothing.
	later := now.Add(time.Hour)
	reserve := &ledger.Command{Kind: ledger.KindReserve, ReservationID: "s", RequestDigest: "sha256:s",
		Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{100}}
	res, err := apply(ctx, s, reserve, later)
	if err != nil || res.Err != nil || !res.Replayed || !res.Reservation.Retired || res.Reservation.State != ledger.StateSettledWithDebt {
		t.Fatalf("reserve replay from the tombstone: %+v, %v", res, err)
	}
	res, _ = apply(ctx, s, &ledger.Command{Kind: ledger.KindSettle, ReservationID: "s", OperationID: "op-s", Units: ledger.Amounts{700}}, later)
	if !errors.Is(res.Err, ledger.ErrReservationAlreadySettled) || !errors.Is(res.Err, ledger.ErrReservationRetired) {
		t.Fatalf("settle replay from the tombstone: %+v", res)
	}
	res, _ = apply(ctx, s, &ledger.Command{Kind: ledger.KindRelease, ReservationID: "r"}, later)
	if res.Err != nil || !res.Replayed || !res.Reservation.Retired {
		t.Fatalf("release replay from the tombstone: %+v", res)
	}
	res, _ = apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: later}, later)
	if res.Err != nil || !res.Replayed {
		t.Fatalf("second retire: %+v", res)
	}
	// The same replay in a batch whose reservations are prefetched (the
	// engine's path): the prefetch must not hide the tombstone.
	batch := []ledger.Command{*reserve, {Kind: ledger.KindRelease, ReservationID: "r"}}
	results := applyPrefetched(t, s, batch, later)
	if results[0].Err != nil || !results[0].Replayed || !results[0].Reservation.Retired ||
		results[1].Err != nil || !results[1].Replayed || !results[1].Reservation.Retired {
		t.Fatalf("prefetched batch of replays from tombstones: %+v", results)
	}
	after, _ := s.AccountGet(ctx, key)
	if after.Balances != before.Balances {
		t.Fatalf("retention or a replay changed the account: %+v -> %+v", before.Balances, after.Balances)
	}
	auditClean(t, s)

	// Tombstones end past the horizon, in finish order.
	if _, err := s.TombstonesDue(ctx, later, 0); err == nil {
		t.Error("TombstonesDue with limit 0: no error")
	}
	due, err := s.TombstonesDue(ctx, later, 10)
	sameIDs(t, "tombstones due", due, []string{"x", "s", "r"})
	if err != nil {
		t.Fatal(err)
	}
	due, _ = s.TombstonesDue(ctx, x.FinishedAt, 10)
	sameIDs(t, "tombstones due at x", due, []string{"x"})
	for _, id := range []string{"x", "s", "r"} {
		res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindForget, ReservationID: id, Before: later}, later)
		if err != nil || res.Err != nil {
			t.Fatalf("forget %s: %+v, %v", id, res, err)
		}
		_, err = s.TombstoneGet(ctx, id)
		mustNotFound(t, "forgotten tombstone "+id, err)
	}
	due, _ = s.TombstonesDue(ctx, later, 10)
	sameIDs(t, "tombstones after forget", due, []string(nil))
	// Past the horizon the id is new: the retained totals still hold the
	// usage, so the audit stays clean after it is admitted again.
	reserve.RequestDigest = "sha256:s2"
	res, err = apply(ctx, s, reserve, later.Add(10*time.Hour))
	if err != nil || res.Replayed || res.Reservation.Retired {
		t.Fatalf("reserve of a forgotten id: %+v, %v", res, err)
	}
	auditClean(t, s)
}

// testRetentionConcurrent: replicas retiring the same reservations at once
// remove each once, count it once in the retained totals, and every
// retire answers success or a replay.
func testRetentionConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, key := retentionWorld(t, s, time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC))
	ids, err := s.ReservationsFinished(ctx, now, 10)
	if err != nil || len(ids) != 3 {
		t.Fatalf("finished: %v, %v", ids, err)
	}
	const replicas = 4
	var wg sync.WaitGroup
	results := make([][]ledger.Result, replicas)
	errs := make([]error, replicas)
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, id := range ids {
				res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: now}, now)
				if err != nil {
					errs[i] = err
					return
				}
				results[i] = append(results[i], res)
			}
		}()
	}
	wg.Wait()
	removed := 0
	for i := range replicas {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		for _, res := range results[i] {
			switch {
			case res.Err != nil:
				t.Fatalf("replica %d: %+v", i, res)
			case !res.Replayed:
				removed++
			}
		}
	}
	if removed != len(ids) {
		t.Fatalf("%d removals for %d reservations", removed, len(ids))
	}
	snap := auditClean(t, s)
	if len(snap.Retained) != 1 || snap.Retained[0].Account != key || snap.Retained[0].Reservations != int64(len(ids)) {
		t.Fatalf("retained %+v", snap.Retained)
	}
}

// testTombstoneDuplicate: a second tombstone for an id is ErrDuplicate and
// the transaction leaves nothing.
func testTombstoneDuplicate(t *testing.T, s store.Store) {
	ctx := context.Background()
	tomb := ledger.Tombstone{ID: "dup", RequestDigest: "sha256:dup", Account: ledger.AccountKey{Subject: "a", Route: "b", Region: "c", Generation: 1},
		State: ledger.StateReleased, FinishedAt: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)}
	Commit(t, s, &store.Changes{Retention: store.RetentionChanges{Tombstones: []ledger.Tombstone{tomb}}})
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	other := tomb
	other.ID = "dup-2"
	err = tx.Write(ctx, &store.Changes{Retention: store.RetentionChanges{Tombstones: []ledger.Tombstone{other, tomb}}})
	if err == nil {
		err = tx.Commit(ctx)
	}
	if !errors.Is(err, store.ErrDuplicate) {
		t.Fatalf("second tombstone: %v, want ErrDuplicate", err)
	}
	tx.Rollback(ctx)
	_, err = s.TombstoneGet(ctx, "dup-2")
	mustNotFound(t, "tombstone of the failed transaction", err)
	got, err := s.TombstoneGet(ctx, "dup")
	same(t, "first tombstone", got, tomb)
	if err != nil {
		t.Fatal(err)
	}
}

// sameIDs compares id lists; no ids may be nil or empty.
func sameIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

// applyPrefetched runs cmds in one transaction as the engine does,
// prefetching their reservations when the store can.
func applyPrefetched(t *testing.T, s store.Store, cmds []ledger.Command, now time.Time) []ledger.Result {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if p, ok := tx.(store.Prefetcher); ok {
		var ids []string
		for i := range cmds {
			ids = append(ids, cmds[i].ReservationID)
		}
		if err := p.ReservationsPrefetch(ctx, ids); err != nil {
			t.Fatalf("prefetch: %v", err)
		}
	}
	book := store.NewBook(ctx, tx, len(cmds))
	results := make([]ledger.Result, len(cmds))
	for i := range cmds {
		results[i] = ledger.Apply(book, &cmds[i], now)
	}
	if err := book.Err(); err != nil {
		t.Fatal(err)
	}
	if c := book.Changes(); !c.Empty() {
		if err := tx.Write(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return results
}

// auditFields is the part of a reservation an audit stream must fill
// (ledger.Snapshot.ReservationStream).
func auditFields(r *ledger.Reservation) ledger.Reservation {
	return ledger.Reservation{ID: r.ID, Account: r.Account, State: r.State, Reserved: r.Reserved, Actual: r.Actual, Overdraft: r.Overdraft}
}

// testSnapshotStreaming: AuditSnapshot streams exactly Snapshot's
// journal and reservations, in order, with the same other rows, and holds
// neither in memory.
func testSnapshotStreaming(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, _ := retentionWorld(t, s, time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC))
	ids, _ := s.ReservationsFinished(ctx, now, 1)
	for _, id := range ids {
		if _, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: id, Before: now}, now); err != nil {
			t.Fatal(err)
		}
	}
	want, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got *ledger.Snapshot
	var journal []ledger.JournalEntry
	var reservations []ledger.Reservation
	var positions []int64
	var accounts []ledger.Account
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		got = snap
		if snap.Journal != nil || snap.JournalStream == nil || snap.Reservations != nil || snap.ReservationStream == nil ||
			snap.Accounts != nil || snap.AccountStream == nil {
			t.Errorf("streaming snapshot holds a journal of %d entries, %d reservations and %d accounts, streams %v %v %v",
				len(snap.Journal), len(snap.Reservations), len(snap.Accounts), snap.JournalStream != nil, snap.ReservationStream != nil, snap.AccountStream != nil)
			return nil
		}
		if err := snap.AccountStream(func(a *ledger.Account) error {
			accounts = append(accounts, *a)
			return nil
		}); err != nil {
			return err
		}
		if snap.Estimate == nil {
			t.Error("streaming snapshot without an estimate")
		} else if n, err := snap.Estimate(true); err != nil || n <= 0 {
			t.Errorf("estimate of a non-empty ledger: %d, %v", n, err)
		}
		if err := snap.ReservationStream(func(r *ledger.Reservation) error {
			reservations = append(reservations, auditFields(r))
			return nil
		}); err != nil {
			return err
		}
		return snap.JournalStream(func(pos int64, e *ledger.JournalEntry) error {
			journal = append(journal, *e)
			positions = append(positions, pos)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	same(t, "streamed journal", journal, want.Journal)
	var wantReservations []ledger.Reservation
	for i := range want.Reservations {
		wantReservations = append(wantReservations, auditFields(&want.Reservations[i]))
	}
	same(t, "streamed reservations", reservations, wantReservations)
	same(t, "streamed accounts", accounts, slices.SortedFunc(slices.Values(want.Accounts), func(a, b ledger.Account) int { return a.Key.Compare(b.Key) }))
	same(t, "streamed retained", got.Retained, want.Retained)
	for i := 1; i < len(positions); i++ {
		if positions[i] < positions[i-1] || positions[i] <= 0 {
			t.Fatalf("journal positions %v do not increase", positions)
		}
	}
	stop := errors.New("stop")
	n := 0
	err = s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
		return snap.JournalStream(func(int64, *ledger.JournalEntry) error { n++; return stop })
	})
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("a yield error: %v after %d entries, want it back after 1", err, n)
	}
}

// testAuditReusedID: an id whose tombstone was forgotten (the horizon
// passed) is new again (API.md, "Retention: removed reservations"), so a
// client may reserve and end it once more. The store journals each
// forgotten tombstone, and the audit's refund_once check judges each
// life of the id apart only across such a forget entry, on the journal
// the store keeps whole: the reuse is clean, through Snapshot and
// through the streaming AuditSnapshot, while a second ending planted
// within one life, and a life planted while the id's tombstone lived,
// are reported.
func testAuditReusedID(t *testing.T, s store.Store) {
	ctx := context.Background()
	now, key := retentionWorld(t, s, time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC))
	run := func(cmd *ledger.Command, want State) {
		t.Helper()
		res, err := apply(ctx, s, cmd, now)
		if err != nil || res.Err != nil || res.Replayed || res.Reservation.Retired || res.Reservation.State != want {
			t.Fatalf("%s %s at %s: %+v, %v", cmd.Kind, cmd.ReservationID, now, res, err)
		}
		now = now.Add(time.Second)
	}
	// Ended lives of x (expired), s (settled with debt) and r (released):
	// retention removes them, the horizon passes, the tombstones go: s's
	// and r's by forget; x's at once, retired past the horizon
	// (ForgetBefore), which leaves no tombstone. Either way the store
	// journals a forget entry, and only after one is a new life clean.
	for _, kind := range []ledger.Kind{ledger.KindRetire, ledger.KindForget} {
		for _, id := range []string{"x", "s", "r"} {
			cmd := &ledger.Command{Kind: kind, ReservationID: id, Before: now}
			if id == "x" && kind == ledger.KindForget {
				continue
			} else if id == "x" {
				cmd.ForgetBefore = now
			}
			res, err := apply(ctx, s, cmd, now)
			if err != nil || res.Err != nil || res.Replayed {
				t.Fatalf("%s %s: %+v, %v", kind, id, res, err)
			}
		}
		now = now.Add(721 * time.Hour)
	}
	// New lives under the same ids: reserve, start, settle; a record
	// (the late settle of an Envoy gateway, say), which begins and ends a
	// life in one step; reserve and release.
	cmd := func(kind ledger.Kind, id string, units ledger.Units) *ledger.Command {
		return &ledger.Command{Kind: kind, ReservationID: id, RequestDigest: "sha256:" + id + "-again", OperationID: "op2-" + id,
			Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{units}}
	}
	run(cmd(ledger.KindReserve, "s", 50), ledger.StateReserved)
	run(cmd(ledger.KindStart, "s", 0), ledger.StateStarted)
	run(cmd(ledger.KindSettle, "s", 30), ledger.StateSettled)
	run(cmd(ledger.KindRecord, "r", 20), ledger.StateSettled)
	run(cmd(ledger.KindReserve, "x", 10), ledger.StateReserved)
	run(cmd(ledger.KindRelease, "x", 0), ledger.StateReleased)
	audits := func() [][]ledger.Discrepancy {
		t.Helper()
		snap, err := s.Snapshot(ctx)
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		if !snap.JournalComplete {
			t.Fatal("snapshot: journal not complete, the refund_once check does not run")
		}
		var streamed []ledger.Discrepancy
		if err := s.AuditSnapshot(ctx, false, func(snap *ledger.Snapshot, _ int64) error {
			streamed = ledger.Audit(snap)
			return nil
		}); err != nil {
			t.Fatalf("audit snapshot: %v", err)
		}
		return [][]ledger.Discrepancy{ledger.Audit(snap), streamed}
	}
	for _, found := range audits() {
		for _, d := range found {
			t.Errorf("audit after reusing forgotten ids: %s", d)
		}
	}

	// A second ending within one life is a double refund, whether the id
	// lived before: planted after s's second settle (a release that moves
	// nothing, so only refund_once can see it), it is reported.
	Commit(t, s, &store.Changes{Journal: []ledger.JournalEntry{{At: now, Kind: ledger.KindRelease, Account: key,
		ReservationID: "s", From: ledger.StateReserved, To: ledger.StateReleased}}})
	twice := ledger.Discrepancy{Check: ledger.CheckRefundOnce, Reservation: "s", Detail: "ended 2 times"}
	for _, found := range audits() {
		same(t, "audit after a second ending of the new life", found, []ledger.Discrepancy{twice})
	}

	// x's second life is retired: its tombstone answers for the id, so
	// a third life now is one a reserve or record gave while ignoring it
	// (the sim's reserve_ignores_tombstone): planted (an admission and a
	// release that move nothing), it is reported, naming x.
	res, err := apply(ctx, s, &ledger.Command{Kind: ledger.KindRetire, ReservationID: "x", Before: now}, now)
	if err != nil || res.Err != nil || res.Replayed || !res.Reservation.Retired {
		t.Fatalf("retire x again: %+v, %v", res, err)
	}
	plantLife := func() {
		t.Helper()
		Commit(t, s, &store.Changes{Journal: []ledger.JournalEntry{
			{At: now, Kind: ledger.KindReserve, Account: key, ReservationID: "x", From: ledger.StateRequested, To: ledger.StateReserved},
			{At: now, Kind: ledger.KindRelease, Account: key, ReservationID: "x", From: ledger.StateReserved, To: ledger.StateReleased}}})
	}
	plantLife()
	reborn := func(found []ledger.Discrepancy) []ledger.Discrepancy {
		t.Helper()
		var out []ledger.Discrepancy
		for _, d := range found {
			if d.Check == ledger.CheckRefundOnce && d.Reservation == "x" && strings.HasPrefix(d.Detail, "admitted again ") &&
				strings.Contains(d.Detail, "with no forget entry between") {
				out = append(out, ledger.Discrepancy{Check: d.Check, Reservation: d.Reservation, Detail: "admitted again"})
			} else {
				out = append(out, d)
			}
		}
		return out
	}
	again := ledger.Discrepancy{Check: ledger.CheckRefundOnce, Reservation: "x", Detail: "admitted again"}
	for _, found := range audits() {
		same(t, "audit after x was admitted while its tombstone lived", reborn(found), []ledger.Discrepancy{twice, again})
	}

	// Once retention forgets that tombstone, a fourth life is a reuse:
	// nothing more is reported.
	now = now.Add(721 * time.Hour)
	res, err = apply(ctx, s, &ledger.Command{Kind: ledger.KindForget, ReservationID: "x", Before: now}, now)
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("forget x: %+v, %v", res, err)
	}
	plantLife()
	for _, found := range audits() {
		same(t, "audit after x was reused once its tombstone was forgotten", reborn(found), []ledger.Discrepancy{twice, again})
	}
}
