package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

var consoleCases = []struct {
	name string
	f    func(t *testing.T, s store.Store)
}{
	{"ReservationsOfSubject", testReservationsOfSubject},
	{"ReservationStatesOfSubject", testReservationStatesOfSubject},
	{"StatementsOf", testStatementsOf},
	{"ResolverAnswers", testResolverAnswers},
	{"AuditRecords", testAuditRecords},
}

func consoleStore(t *testing.T, s store.Store) store.ConsoleStore {
	t.Helper()
	c, ok := s.(store.ConsoleStore)
	if !ok {
		t.Fatalf("%T does not implement store.ConsoleStore", s)
	}
	return c
}

// subjectRows are reservations of two subjects on two routes, with ties in
// CreatedAt broken by id.
func subjectRows() []ledger.Reservation {
	mk := func(id, subject, route string, state ledger.State, created time.Duration) ledger.Reservation {
		key := accEU2
		key.Subject, key.Route = subject, route
		r := ledger.Reservation{ID: id, RequestDigest: "sha256:" + id, Account: key, AccountingEpoch: at(0),
			Reserved: ledger.Amounts{10}, State: state, CreatedAt: at(created), ExpiresAt: at(created + time.Minute)}
		if state != ledger.StateReserved {
			r.OperationID, r.StartedAt = "op-"+id, at(created+time.Second)
		}
		if state == ledger.StateSettled {
			r.Actual, r.FinishedAt = ledger.Amounts{4}, at(created+2*time.Second)
		}
		if state == ledger.StateUsageUnknown {
			r.UnknownAt = at(created + 3*time.Second)
		}
		return r
	}
	return []ledger.Reservation{
		mk("s-1", "tenant7", "chat.generate", ledger.StateSettled, 1*time.Second),
		mk("s-2", "tenant7", "chat.generate", ledger.StateReserved, 2*time.Second),
		mk("s-3a", "tenant7", "embed", ledger.StateSettled, 3*time.Second),
		mk("s-3b", "tenant7", "chat.generate", ledger.StateUsageUnknown, 3*time.Second),
		mk("s-3c", "tenant7", "chat.generate", ledger.StateSettled, 3*time.Second),
		mk("s-4", "tenant7", "embed", ledger.StateStarted, 4*time.Second),
		mk("s-5", "tenant7", "chat.generate", ledger.StateSettled, 5*time.Second),
		mk("o-1", "tenant8", "chat.generate", ledger.StateSettled, 6*time.Second),
		mk("o-2", "tenant8", "chat.generate", ledger.StateReserved, 0),
	}
}

// subjectPages pages through ReservationsOfSubject under f, each page
// after the last row of the one before, until a page comes back short.
func subjectPages(t *testing.T, cs store.ConsoleStore, f store.SubjectFilter) [][]string {
	t.Helper()
	var pages [][]string
	for range 20 {
		rows, err := cs.ReservationsOfSubject(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{}
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		pages = append(pages, ids)
		if len(rows) < f.Limit {
			return pages
		}
		last := rows[len(rows)-1]
		f.Before = store.SubjectCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	t.Fatal("paging does not end")
	return nil
}

// One subject's reservations list newest first (ties by id, descending),
// filtered by state, paged strictly before the cursor, as whole rows; other
// subjects' rows and removed rows never appear.
func testReservationsOfSubject(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	rows := subjectRows()
	insertAll(t, s, rows)
	byID := map[string]ledger.Reservation{}
	for _, r := range rows {
		byID[r.ID] = r
	}
	all, err := cs.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant7", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var want []ledger.Reservation
	for _, id := range []string{"s-5", "s-4", "s-3c", "s-3b", "s-3a", "s-2", "s-1"} {
		want = append(want, byID[id])
	}
	same(t, "every reservation of tenant7, newest first", all, want)

	settled := []ledger.State{ledger.StateSettled}
	for _, tc := range []struct {
		name  string
		f     store.SubjectFilter
		pages [][]string
	}{
		{"limit 3", store.SubjectFilter{Subject: "tenant7", Limit: 3},
			[][]string{{"s-5", "s-4", "s-3c"}, {"s-3b", "s-3a", "s-2"}, {"s-1"}}},
		{"limit 1", store.SubjectFilter{Subject: "tenant7", Limit: 1},
			[][]string{{"s-5"}, {"s-4"}, {"s-3c"}, {"s-3b"}, {"s-3a"}, {"s-2"}, {"s-1"}, {}}},
		{"settled", store.SubjectFilter{Subject: "tenant7", States: settled, Limit: 2},
			[][]string{{"s-5", "s-3c"}, {"s-3a", "s-1"}, {}}},
		{"two states", store.SubjectFilter{Subject: "tenant7", States: []ledger.State{ledger.StateReserved, ledger.StateUsageUnknown}, Limit: 5},
			[][]string{{"s-3b", "s-2"}}},
		{"a state without rows", store.SubjectFilter{Subject: "tenant7", States: []ledger.State{ledger.StateExpired}, Limit: 5},
			[][]string{{}}},
		{"inside a tie", store.SubjectFilter{Subject: "tenant7", Before: store.SubjectCursor{CreatedAt: at(3 * time.Second), ID: "s-3b"}, Limit: 10},
			[][]string{{"s-3a", "s-2", "s-1"}}},
		{"before a time, after its ids", store.SubjectFilter{Subject: "tenant7", Before: store.SubjectCursor{CreatedAt: at(3 * time.Second), ID: "s-3z"}, Limit: 10},
			[][]string{{"s-3c", "s-3b", "s-3a", "s-2", "s-1"}}},
		{"another subject", store.SubjectFilter{Subject: "tenant8", Limit: 10}, [][]string{{"o-1", "o-2"}}},
		{"no such subject", store.SubjectFilter{Subject: "tenant9", Limit: 10}, [][]string{{}}},
	} {
		same(t, tc.name, subjectPages(t, cs, tc.f), tc.pages)
	}
	for _, limit := range []int{0, -1} {
		if got, err := cs.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant7", Limit: limit}); err == nil {
			t.Errorf("limit %d: %v and no error", limit, got)
		}
	}
	// A state no row is ever in is an error naming the field on every
	// store, not an empty (or, listing REQUESTED, a silently full) page.
	for _, st := range []ledger.State{ledger.StateRequested, ledger.StateReservationUnknown} {
		got, err := cs.ReservationsOfSubject(ctx, store.SubjectFilter{Subject: "tenant7", States: []ledger.State{ledger.StateSettled, st}, Limit: 10})
		if err == nil || !strings.Contains(err.Error(), "states") {
			t.Errorf("states %v: %d rows, error %v; want an error naming states", st, len(got), err)
		}
	}

	// A state change moves the row; a removed row is gone.
	moved := byID["s-2"]
	moved.State, moved.FinishedAt = ledger.StateReleased, at(time.Minute)
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{moved},
		Retention: store.RetentionChanges{RemovedReservations: []string{"s-1"}}})
	same(t, "after a release and a removal", subjectPages(t, cs, store.SubjectFilter{Subject: "tenant7", States: []ledger.State{ledger.StateReleased, ledger.StateSettled}, Limit: 10}),
		[][]string{{"s-5", "s-3c", "s-3a", "s-2"}})
}

// Counts are by route and state of committed rows of the subject only,
// and the retained totals say how many retention removed per account.
func testReservationStatesOfSubject(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	got, err := cs.ReservationStatesOfSubject(ctx, "tenant7")
	if err != nil {
		t.Fatal(err)
	}
	same(t, "empty store", got, store.SubjectStates{})
	insertAll(t, s, subjectRows())
	retained := []ledger.Retained{
		{Account: accEU2, Reservations: 0},
		{Account: ledger.AccountKey{Subject: "tenant7", Route: "embed", Region: "eu", Generation: 2}, Reservations: 5},
		{Account: accEU1, Reservations: 3, Spent: ledger.Amounts{9}},
		{Account: accOther, Reservations: 7},
	}
	// As the ledger does: read each retained row (absent) before writing it.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		for _, r := range retained {
			if _, err := tx.RetainedGet(ctx, r.Account); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("retained of %s: %v", r.Account, err)
			}
		}
		if err := tx.Write(ctx, &store.Changes{Retention: store.RetentionChanges{Retained: retained}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	got, err = cs.ReservationStatesOfSubject(ctx, "tenant7")
	if err != nil {
		t.Fatal(err)
	}
	same(t, "tenant7", got, store.SubjectStates{
		Counts: []store.StateCount{
			{Route: "chat.generate", State: ledger.StateReserved, Count: 1},
			{Route: "chat.generate", State: ledger.StateSettled, Count: 3},
			{Route: "chat.generate", State: ledger.StateUsageUnknown, Count: 1},
			{Route: "embed", State: ledger.StateStarted, Count: 1},
			{Route: "embed", State: ledger.StateSettled, Count: 1},
		},
		Retained: []store.RetainedCount{
			{Account: accEU1, Reservations: 3},
			{Account: ledger.AccountKey{Subject: "tenant7", Route: "embed", Region: "eu", Generation: 2}, Reservations: 5},
		},
	})
	got, err = cs.ReservationStatesOfSubject(ctx, "tenant9")
	if err != nil {
		t.Fatal(err)
	}
	same(t, "no such subject", got, store.SubjectStates{})
}

// One account's statements come back whole, the latest epoch first, and
// page strictly before the cursor; other accounts' never.
func testStatementsOf(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	sts := fixtureStatements()
	third := ledger.Statement{Account: accEU1, EpochStart: at(-time.Hour), EpochEnd: at(0), Dims: 2,
		Opening: sts[1].Closing, Closing: ledger.Balances{fullBalance(3), fullBalance(4)}}
	other := ledger.Statement{Account: accEU2, EpochStart: at(-time.Hour), EpochEnd: at(0), Dims: 3,
		Opening: ledger.Balances{fullBalance(1)}, Closing: ledger.Balances{fullBalance(2)}}
	Commit(t, s, &store.Changes{Statements: []ledger.Statement{sts[0], other, third, sts[1]}})
	list := func(f store.StatementFilter) []ledger.Statement {
		t.Helper()
		got, err := cs.StatementsOf(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same(t, "every statement of accEU1", list(store.StatementFilter{Account: accEU1, Limit: 10}),
		[]ledger.Statement{third, sts[1], sts[0]})
	same(t, "first page", list(store.StatementFilter{Account: accEU1, Limit: 2}), []ledger.Statement{third, sts[1]})
	same(t, "second page", list(store.StatementFilter{Account: accEU1, Before: sts[1].EpochStart, Limit: 2}),
		[]ledger.Statement{sts[0]})
	same(t, "another account", list(store.StatementFilter{Account: accEU2, Limit: 10}), []ledger.Statement{other})
	if got := list(store.StatementFilter{Account: accOther, Limit: 10}); len(got) != 0 {
		t.Errorf("an account without statements lists %v", got)
	}
	if got, err := cs.StatementsOf(ctx, store.StatementFilter{Account: accEU1}); err == nil {
		t.Errorf("limit 0: %v and no error", got)
	}
}

// Answers read back exactly, in the order asked, only while their
// reservation is USAGE_UNKNOWN; a put replaces; prune deletes the stale.
func testResolverAnswers(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	rows := subjectRows()
	insertAll(t, s, rows)
	second := rows[5] // s-4, STARTED
	second.State, second.UnknownAt = ledger.StateUsageUnknown, at(10*time.Second)
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{second}})
	chat, embed := rows[3].Account, rows[5].Account
	answers := []store.ResolverAnswer{
		{Account: chat, ReservationID: "s-3b", Answer: "running", AskedAt: at(20 * time.Second), Attempts: 1, NextAt: at(21 * time.Second)},
		{Account: embed, ReservationID: "s-4", Answer: "error", Detail: "connection refused", AskedAt: at(22 * time.Second), Attempts: 4, NextAt: at(30 * time.Second)},
		{Account: chat, ReservationID: "s-5", Answer: "running", AskedAt: at(22 * time.Second), Attempts: 1, NextAt: at(23 * time.Second)}, // SETTLED: stale
		{Account: chat, ReservationID: "gone", Answer: "unknown", AskedAt: at(22 * time.Second), Attempts: 1, NextAt: at(23 * time.Second)},
	}
	if err := cs.ResolverAnswersPut(ctx, answers); err != nil {
		t.Fatal(err)
	}
	get := func(ids ...string) []store.ResolverAnswer {
		t.Helper()
		got, err := cs.ResolverAnswersGet(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	same(t, "answers in the order asked", get("s-4", "s-5", "gone", "s-3b", "none"), []store.ResolverAnswer{answers[1], answers[0]})
	same(t, "an id asked twice", get("s-3b", "s-3b"), []store.ResolverAnswer{answers[0]})
	if got := get(); len(got) != 0 {
		t.Errorf("no ids: %v", got)
	}
	replaced := answers[0]
	replaced.Answer, replaced.Attempts, replaced.AskedAt, replaced.NextAt = "unknown", 2, at(40*time.Second), at(42*time.Second)
	if err := cs.ResolverAnswersPut(ctx, []store.ResolverAnswer{replaced}); err != nil {
		t.Fatal(err)
	}
	same(t, "after a second answer", get("s-3b"), []store.ResolverAnswer{replaced})

	// s-4 settles: its answer is stale and read no more; prune deletes
	// it with the two that were stale already.
	second.State, second.Actual, second.FinishedAt = ledger.StateSettled, ledger.Amounts{3}, at(50*time.Second)
	Commit(t, s, &store.Changes{Reservations: []ledger.Reservation{second}})
	if got := get("s-4"); len(got) != 0 {
		t.Errorf("answer of a settled reservation: %v", got)
	}
	n, err := cs.ResolverAnswersPrune(ctx)
	if err != nil || n != 3 {
		t.Fatalf("prune deleted %d, %v; want 3", n, err)
	}
	if n, err := cs.ResolverAnswersPrune(ctx); err != nil || n != 0 {
		t.Fatalf("second prune deleted %d, %v; want 0", n, err)
	}
	same(t, "after prune", get("s-3b", "s-4"), []store.ResolverAnswer{replaced})
	// A batch with an answer naming no reservation or no account stores
	// nothing, not even its good answers.
	good := replaced
	good.Attempts, good.AskedAt = 3, at(60*time.Second)
	for _, bad := range []store.ResolverAnswer{{Account: chat, ReservationID: "", AskedAt: at(0)}, {ReservationID: "s-3b", AskedAt: at(0)}} {
		if err := cs.ResolverAnswersPut(ctx, []store.ResolverAnswer{good, bad}); err == nil {
			t.Errorf("an answer without a reservation id or an account was stored: %+v", bad)
		}
	}
	same(t, "after the refused puts", get("s-3b"), []store.ResolverAnswer{replaced})
}

// The last audit and the last clean one, each the latest by At whatever
// order the writes come in; checks round-trip.
func testAuditRecords(t *testing.T, s store.Store) {
	ctx := context.Background()
	cs := consoleStore(t, s)
	records := func(what string, wantLast, wantClean *store.AuditRecord) {
		t.Helper()
		last, clean, err := cs.AuditRecordsGet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		same(t, what+": last", last, wantLast)
		same(t, what+": last clean", clean, wantClean)
	}
	records("empty store", nil, nil)
	dirty := &store.AuditRecord{At: at(time.Minute), By: "ops", Mode: "full", Discrepancies: 3,
		Checks: map[string]int64{"conservation": 2, "journal_replay": 1}}
	put := func(r *store.AuditRecord) {
		t.Helper()
		if err := cs.AuditRecordPut(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	put(dirty)
	records("one dirty audit", dirty, nil)
	clean := &store.AuditRecord{At: at(2 * time.Minute), By: "oncall", Mode: "since_checkpoint", Checks: map[string]int64{}}
	put(clean)
	records("then a clean one", clean, clean)
	later := &store.AuditRecord{At: at(3 * time.Minute), Mode: "full", Discrepancies: 1, Checks: map[string]int64{"shard": 1}}
	put(later)
	records("then a dirty one", later, clean)
	// An older clean audit that lands late (another replica) changes
	// neither row.
	put(&store.AuditRecord{At: at(90 * time.Second), By: "slow", Mode: "full", Checks: map[string]int64{}})
	records("an older audit landing late", later, clean)
}
