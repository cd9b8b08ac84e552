package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// epochAccounts returns accounts of generations 7 and 8 with epoch starts
// that tie (several at one start, as epochs aligned to their length do),
// keys that sort differently from their starts, and, for generation 7,
// the keys in the order AccountsByEpoch must return them.
func epochAccounts() (all []ledger.Account, gen7 []ledger.AccountKey) {
	type row struct {
		subject string
		start   time.Duration
		gen     uint64
	}
	rows := []row{
		{"t-c", 0, 7}, {"t-a", 0, 7}, {"t-b", 0, 7},
		{"t-a", time.Hour, 8}, // the same subject, another generation
		{"s-z", -time.Hour, 7},
		{"u-a", time.Hour, 7},
		{"t-d", 2 * time.Hour, 7},
		{"a-a", 3 * time.Hour, 8},
	}
	for i, r := range rows {
		a := ledger.Account{
			Key:  ledger.AccountKey{Subject: r.subject, Route: "chat", Region: "eu", Generation: r.gen},
			Dims: 1, EpochStart: at(r.start), Version: uint64(i + 1),
		}
		a.Balances[0] = fullBalance(int64(i))
		a.EpochOpening[0] = fullBalance(int64(i) - 1)
		a.RefilledTo[0] = at(r.start).UnixNano()
		all = append(all, a)
	}
	for _, s := range []string{"s-z", "t-a", "t-b", "t-c", "u-a", "t-d"} {
		gen7 = append(gen7, ledger.AccountKey{Subject: s, Route: "chat", Region: "eu", Generation: 7})
	}
	return all, gen7
}

func keysOf(accounts []ledger.Account) []ledger.AccountKey {
	keys := []ledger.AccountKey{}
	for i := range accounts {
		keys = append(keys, accounts[i].Key)
	}
	return keys
}

// epochPages follows AccountsByEpoch page by page from f's cursor and
// returns the pages' keys.
func epochPages(t *testing.T, s store.Store, f store.EpochFilter) [][]ledger.AccountKey {
	t.Helper()
	var pages [][]ledger.AccountKey
	for range 100 {
		page, next, err := s.AccountsByEpoch(context.Background(), f)
		if err != nil {
			t.Fatalf("accounts by epoch %+v: %v", f, err)
		}
		if len(page) == 0 {
			if next != (store.EpochCursor{}) {
				t.Fatalf("accounts by epoch %+v: no account, cursor %+v", f, next)
			}
			return pages
		}
		pages = append(pages, keysOf(page))
		f.After = next
	}
	t.Fatalf("accounts by epoch: more than 100 pages")
	return nil
}

func testAccountsByEpoch(t *testing.T, s store.Store) {
	ctx := context.Background()
	all, gen7 := epochAccounts()
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}
	// Uncommitted accounts are not listed.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{Accounts: all}); err != nil {
			t.Fatal(err)
		}
		if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, Limit: 10}); err != nil || len(got) != 0 {
			t.Errorf("uncommitted: %v, %v; want none", got, err)
		}
	})
	Commit(t, s, &store.Changes{Accounts: all})

	// Whole rows, as AccountGet reads them, in (EpochStart, key) order.
	got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var want []ledger.Account
	for _, k := range gen7 {
		a, err := s.AccountGet(ctx, k)
		if err != nil {
			t.Fatalf("account %s: %v", k, err)
		}
		want = append(want, a)
	}
	same(t, "every account of generation 7", got, want)

	for _, tc := range []struct {
		name      string
		gen       uint64
		startedBy time.Time
		want      []ledger.AccountKey
	}{
		{"no bound", 7, time.Time{}, gen7},
		{"bound at a tie, inclusive", 7, at(0), gen7[:4]},
		{"bound just before the tie", 7, at(-time.Nanosecond), gen7[:1]},
		{"bound before every start", 7, at(-2 * time.Hour), nil},
		{"bound after every start", 7, at(100 * time.Hour), gen7},
		{"another generation", 8, at(time.Hour),
			[]ledger.AccountKey{{Subject: "t-a", Route: "chat", Region: "eu", Generation: 8}}},
		{"a generation without accounts", 9, time.Time{}, nil},
	} {
		for _, limit := range []int{1, 2, 3, 100} {
			f := store.EpochFilter{Generation: tc.gen, StartedBy: tc.startedBy, Limit: limit}
			var flat []ledger.AccountKey
			for _, page := range epochPages(t, s, f) {
				if len(page) > limit {
					t.Errorf("%s: a page of %d for limit %d", tc.name, len(page), limit)
				}
				flat = append(flat, page...)
			}
			same(t, fmt.Sprintf("%s, pages of %d", tc.name, limit), flat, tc.want)
		}
	}

	// A cursor between rows (as a row that changed since the last page
	// leaves it) continues after its position.
	mid := store.EpochCursor{EpochStart: at(0), Subject: "t-aa", Route: "chat", Region: "eu"}
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, After: mid, Limit: 100}); err != nil {
		t.Fatal(err)
	} else {
		same(t, "after a position between rows", keysOf(got), gen7[2:])
	}

	// An account whose epoch rolls moves in the order; one that leaves
	// the bound is no longer listed.
	rolled := all[1] // t-a, generation 7, started at 0
	rolled.EpochStart = at(5 * time.Hour)
	rolled.Version++
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{rolled}})
	wantAfter := append(slices.Clone(gen7[:1]), gen7[2:]...)
	wantAfter = append(wantAfter, gen7[1])
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, Limit: 100}); err != nil {
		t.Fatal(err)
	} else {
		same(t, "after t-a's epoch rolled", keysOf(got), wantAfter)
	}
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, StartedBy: at(0), Limit: 100}); err != nil {
		t.Fatal(err)
	} else {
		same(t, "due after t-a's epoch rolled", keysOf(got), []ledger.AccountKey{gen7[0], gen7[2], gen7[3]})
	}

	for _, f := range []store.EpochFilter{
		{Generation: 7, Limit: 0},
		{Generation: 7, Limit: -1},
		{Generation: 1 << 63, Limit: 1},
	} {
		if _, _, err := s.AccountsByEpoch(ctx, f); err == nil {
			t.Errorf("filter %+v: no error", f)
		}
	}
}

// testLeases checks the lease's contract as far as every driver shares
// it: a store that a process owns (SQLite, in-memory) may grant every
// holder; a store shared by processes (PostgreSQL) grants one holder at a
// time, and store/postgres tests that further.
func testLeases(t *testing.T, s store.Store) {
	ctx := context.Background()
	a, err := s.LeaseAcquire(ctx, "workers", "replica-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Held || a.Holder != "replica-a" || a.Name != "workers" || a.Fence <= 0 {
		t.Fatalf("first acquire: %+v, want held by replica-a with a positive fence", a)
	}
	renewed, err := s.LeaseAcquire(ctx, "workers", "replica-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !renewed.Held || renewed.Fence != a.Fence {
		t.Errorf("renewal: %+v, want held with the same fence %d", renewed, a.Fence)
	}
	other, err := s.LeaseAcquire(ctx, "other-lease", "replica-b", time.Minute)
	if err != nil || !other.Held {
		t.Errorf("another lease name: %+v, %v; want held", other, err)
	}
	b, err := s.LeaseAcquire(ctx, "workers", "replica-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Held && (b.Holder != "replica-a" || b.Fence != a.Fence) {
		t.Errorf("refused acquire: %+v, want it to name replica-a and fence %d", b, a.Fence)
	}
	if err := s.LeaseRelease(ctx, "workers", "replica-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.LeaseRelease(ctx, "workers", "nobody"); err != nil {
		t.Errorf("releasing a lease not held: %v", err)
	}
	b, err = s.LeaseAcquire(ctx, "workers", "replica-b", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Held || b.Holder != "replica-b" {
		t.Errorf("acquire after release: %+v, want held by replica-b", b)
	}
	if _, err := s.LeaseAcquire(ctx, "", "replica-b", time.Minute); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("empty lease name: %v, want an error naming it", err)
	}
	if _, err := s.LeaseAcquire(ctx, "workers", "replica-b", 0); err == nil {
		t.Errorf("zero ttl: no error")
	}
}

// testAccountsByEpochAfterRolls checks AccountsByEpoch on accounts whose
// epoch rolled after a read in the same transaction, from a busy epoch
// (SQLite leaves the index entry behind) and from an idle one: every page
// size lists each account within the bound once, by its EpochStart, and
// once EpochIndexCatchUp went over the index every driver lists them in
// (EpochStart, key) order again.
func testAccountsByEpochAfterRolls(t *testing.T, s store.Store) {
	ctx := context.Background()
	all, _ := epochAccounts()
	idle := all[4] // s-z, generation 7, started an hour before 0
	idle.EpochOpening = idle.Balances
	all[4] = idle
	Commit(t, s, &store.Changes{Accounts: all})
	rolls := map[string]time.Duration{"t-a": 5 * time.Hour, "s-z": 4 * time.Hour, "t-c": 30 * time.Minute}
	rolled := rollEpochs(t, s, all, func(k ledger.AccountKey) (time.Duration, bool) {
		d, ok := rolls[k.Subject]
		return d, ok && k.Generation == 7
	})
	// want returns generation 7's keys with EpochStart by bound (any when
	// zero), in (EpochStart, key) order.
	want := func(bound time.Time) []ledger.AccountKey {
		var list []ledger.Account
		for _, a := range all {
			if a.Key.Generation == 7 && (bound.IsZero() || !a.EpochStart.After(bound)) {
				list = append(list, a)
			}
		}
		slices.SortFunc(list, func(x, y ledger.Account) int {
			if c := x.EpochStart.Compare(y.EpochStart); c != 0 {
				return c
			}
			return strings.Compare(x.Key.Subject, y.Key.Subject)
		})
		return keysOf(list)
	}
	bounds := []time.Time{{}, at(0), at(time.Hour), at(4 * time.Hour), at(5 * time.Hour)}
	for _, bound := range bounds {
		for _, limit := range []int{1, 2, 100} {
			var flat []ledger.AccountKey
			for _, page := range epochPages(t, s, store.EpochFilter{Generation: 7, StartedBy: bound, Limit: limit}) {
				flat = append(flat, page...)
			}
			got := slices.Clone(flat)
			wantSet := want(bound)
			sortKeys(got)
			sortKeys(wantSet)
			same(t, fmt.Sprintf("rolled, by %v, pages of %d: each once", bound, limit), got, wantSet)
		}
	}
	for _, a := range rolled {
		page, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{Generation: 7, StartedBy: a.EpochStart, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range page {
			if p.Key == a.Key {
				same(t, "a rolled account as listed", p, a)
			}
		}
	}
	// The catch-up, in chunks of 2 over everything, then the order.
	f := store.EpochFilter{Generation: 7, Limit: 2}
	for range 100 {
		next, more, err := s.EpochIndexCatchUp(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
		f.After = next
	}
	for _, bound := range bounds {
		var flat []ledger.AccountKey
		for _, page := range epochPages(t, s, store.EpochFilter{Generation: 7, StartedBy: bound, Limit: 2}) {
			flat = append(flat, page...)
		}
		same(t, fmt.Sprintf("caught up, by %v", bound), flat, want(bound))
	}
	for _, f := range []store.EpochFilter{
		{Generation: 7, Limit: 0},
		{Generation: 1 << 63, Limit: 1},
	} {
		if _, _, err := s.EpochIndexCatchUp(ctx, f); err == nil {
			t.Errorf("catch-up %+v: no error", f)
		}
	}
}

// rollEpochs rolls, in one transaction after reading each, the epoch of
// every account of all that roll names to the epoch start at(d) (an
// epoch rolled after a read, as a command does), updates all to what was
// written and returns the accounts it rolled.
func rollEpochs(t *testing.T, s store.Store, all []ledger.Account, roll func(ledger.AccountKey) (time.Duration, bool)) []ledger.Account {
	t.Helper()
	var rolled []ledger.Account
	inTxCommit(t, s, func(ctx context.Context, tx store.Tx) {
		for i := range all {
			a := &all[i]
			d, ok := roll(a.Key)
			if !ok {
				continue
			}
			got, err := tx.AccountGet(ctx, a.Key)
			if err != nil {
				t.Fatal(err)
			}
			got.EpochStart, got.EpochOpening = at(d), got.Balances
			got.Version++
			*a = *got
			rolled = append(rolled, *got)
		}
		if err := tx.Write(ctx, &store.Changes{Accounts: rolled}); err != nil {
			t.Fatal(err)
		}
	})
	return rolled
}

// sortKeys sorts account keys by subject, route, region, generation.
func sortKeys(keys []ledger.AccountKey) {
	slices.SortFunc(keys, func(x, y ledger.AccountKey) int {
		return strings.Compare(x.String(), y.String())
	})
}

// inTxCommit runs f in a transaction and commits it.
func inTxCommit(t *testing.T, s store.Store, f func(ctx context.Context, tx store.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx)
	f(ctx, tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// acrossAccounts returns epochAccounts and, besides, t-a's account under
// generation 9 at t-a's epoch start under generation 7 (one key and
// start, two generations: the order across generations ends with the
// generation).
func acrossAccounts() []ledger.Account {
	all, _ := epochAccounts()
	a := all[1] // t-a, generation 7, at 0
	a.Key.Generation = 9
	a.Version = 20
	return append(all, a)
}

// wantAcross returns the keys of accounts with EpochStart by bound (any
// when zero) and after the position from (from the start when zero), in
// (EpochStart, subject, route, region, generation) order.
func wantAcross(accounts []ledger.Account, bound time.Time, from store.EpochCursor) []ledger.AccountKey {
	cursorOf := func(a *ledger.Account) store.EpochCursor { return store.EpochCursorOf(a) }
	compare := func(x, y store.EpochCursor) int {
		if c := x.EpochStart.Compare(y.EpochStart); c != 0 {
			return c
		}
		for _, p := range [][2]string{{x.Subject, y.Subject}, {x.Route, y.Route}, {x.Region, y.Region}} {
			if c := strings.Compare(p[0], p[1]); c != 0 {
				return c
			}
		}
		switch {
		case x.Generation < y.Generation:
			return -1
		case x.Generation > y.Generation:
			return 1
		}
		return 0
	}
	var list []ledger.Account
	for i := range accounts {
		a := &accounts[i]
		if (bound.IsZero() || !a.EpochStart.After(bound)) && (from == store.EpochCursor{} || compare(cursorOf(a), from) > 0) {
			list = append(list, *a)
		}
	}
	if len(list) == 0 {
		return nil // as a list of pages collects none
	}
	slices.SortFunc(list, func(x, y ledger.Account) int { return compare(cursorOf(&x), cursorOf(&y)) })
	return keysOf(list)
}

// testAccountsByEpochAcross checks AccountsByEpoch across generations
// (EpochFilter.AllGenerations): every generation's accounts within the
// bound, in (EpochStart, subject, route, region, generation) order, from
// a cursor that may sit between rows (the epoch worker starts at an epoch
// start, the empty subject sorting first), in pages of any size.
func testAccountsByEpochAcross(t *testing.T, s store.Store) {
	ctx := context.Background()
	all := acrossAccounts()
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{AllGenerations: true, Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}
	Commit(t, s, &store.Changes{Accounts: all})

	// Whole rows, as AccountGet reads them.
	got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{AllGenerations: true, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var want []ledger.Account
	for _, k := range wantAcross(all, time.Time{}, store.EpochCursor{}) {
		a, err := s.AccountGet(ctx, k)
		if err != nil {
			t.Fatalf("account %s: %v", k, err)
		}
		want = append(want, a)
	}
	same(t, "every account of every generation", got, want)

	bounds := []time.Time{{}, at(0), at(-time.Nanosecond), at(-2 * time.Hour), at(time.Hour), at(100 * time.Hour)}
	froms := []store.EpochCursor{{}, {EpochStart: at(0)}, {EpochStart: at(time.Nanosecond)},
		{EpochStart: at(0), Subject: "t-a", Route: "chat", Region: "eu", Generation: 7},
		{EpochStart: at(0), Subject: "t-a", Route: "chat", Region: "eu", Generation: 8}, // between rows
		{EpochStart: at(0), Subject: "t-aa", Route: "chat", Region: "eu"}}
	for _, bound := range bounds {
		for _, from := range froms {
			for _, limit := range []int{1, 2, 3, 100} {
				var flat []ledger.AccountKey
				for _, page := range epochPages(t, s, store.EpochFilter{AllGenerations: true, StartedBy: bound, After: from, Limit: limit}) {
					if len(page) > limit {
						t.Errorf("a page of %d for limit %d", len(page), limit)
					}
					flat = append(flat, page...)
				}
				same(t, fmt.Sprintf("by %v after %+v, pages of %d", bound, from, limit), flat, wantAcross(all, bound, from))
			}
		}
	}

	// A roll moves the account in the order.
	rolled := all[1] // t-a, generation 7, at 0
	rolled.EpochStart = at(5 * time.Hour)
	rolled.Version++
	all[1] = rolled
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{rolled}})
	if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{AllGenerations: true, Limit: 100}); err != nil {
		t.Fatal(err)
	} else {
		same(t, "after t-a's epoch rolled", keysOf(got), wantAcross(all, time.Time{}, store.EpochCursor{}))
	}

	for _, f := range []store.EpochFilter{
		{AllGenerations: true, Limit: 0},
		{AllGenerations: true, Generation: 7, Limit: 1},
		{AllGenerations: true, Limit: 1, After: store.EpochCursor{EpochStart: at(0), Generation: 1 << 63}},
	} {
		if _, _, err := s.AccountsByEpoch(ctx, f); err == nil {
			t.Errorf("filter %+v: no error", f)
		}
		if _, _, err := s.EpochIndexCatchUp(ctx, f); err == nil {
			t.Errorf("catch-up %+v: no error", f)
		}
	}
}

// testAccountsByEpochAcrossAfterRolls checks the index across generations
// on accounts of several generations whose epoch rolled after a read in
// the same transaction, from a busy epoch (SQLite leaves both index
// entries behind) and from an idle one: each account within a bound is
// listed once, by its EpochStart; EpochIndexCatchUp across generations,
// over a range, moves the lagging entries of every generation in it, in
// chunks, and the order is (EpochStart, key, generation) again.
func testAccountsByEpochAcrossAfterRolls(t *testing.T, s store.Store) {
	ctx := context.Background()
	all := acrossAccounts()
	idle := all[4] // s-z, generation 7, started an hour before 0
	idle.EpochOpening = idle.Balances
	all[4] = idle
	Commit(t, s, &store.Changes{Accounts: all})
	// t-a under 7 and 9 and t-c under 7 (busy, at 0), a-a under 8 (busy,
	// at 3h) and s-z (idle) roll.
	rolls := map[ledger.AccountKey]time.Duration{}
	for i, d := range map[int]time.Duration{1: 5 * time.Hour, 8: 4 * time.Hour, 0: 30 * time.Minute, 7: 6 * time.Hour, 4: 4 * time.Hour} {
		rolls[all[i].Key] = d
	}
	rollEpochs(t, s, all, func(k ledger.AccountKey) (time.Duration, bool) {
		d, ok := rolls[k]
		return d, ok
	})
	bounds := []time.Time{{}, at(0), at(time.Hour), at(4 * time.Hour), at(5 * time.Hour), at(6 * time.Hour)}
	for _, bound := range bounds {
		for _, limit := range []int{1, 2, 100} {
			var flat []ledger.AccountKey
			for _, page := range epochPages(t, s, store.EpochFilter{AllGenerations: true, StartedBy: bound, Limit: limit}) {
				flat = append(flat, page...)
			}
			wantSet := wantAcross(all, bound, store.EpochCursor{})
			sortKeys(flat)
			sortKeys(wantSet)
			same(t, fmt.Sprintf("rolled, by %v, pages of %d: each once", bound, limit), flat, wantSet)
		}
	}
	// The catch-up over the epoch starts up to 0, in chunks of 2: it
	// reports the range's end, and then the entries there are at their
	// account's epoch (t-a under 7 and 9 and t-c no longer listed by 0).
	f := store.EpochFilter{AllGenerations: true, StartedBy: at(0), Limit: 2}
	for chunks := 0; ; chunks++ {
		if chunks == 100 {
			t.Fatal("catch-up: more than 100 chunks")
		}
		next, more, err := s.EpochIndexCatchUp(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
		f.After = next
	}
	for _, bound := range []time.Time{at(0), at(30 * time.Minute)} {
		if got, _, err := s.AccountsByEpoch(ctx, store.EpochFilter{AllGenerations: true, StartedBy: bound, Limit: 100}); err != nil {
			t.Fatal(err)
		} else {
			same(t, fmt.Sprintf("caught up to 0, by %v", bound), keysOf(got), wantAcross(all, bound, store.EpochCursor{}))
		}
	}
	// Then over everything, and the order of every bound is exact.
	f = store.EpochFilter{AllGenerations: true, Limit: 3}
	for range 100 {
		next, more, err := s.EpochIndexCatchUp(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
		f.After = next
	}
	for _, bound := range bounds {
		var flat []ledger.AccountKey
		for _, page := range epochPages(t, s, store.EpochFilter{AllGenerations: true, StartedBy: bound, Limit: 2}) {
			flat = append(flat, page...)
		}
		same(t, fmt.Sprintf("caught up, by %v", bound), flat, wantAcross(all, bound, store.EpochCursor{}))
	}
	// The per-generation index agrees (the catch-up moved one column,
	// which both indexes follow).
	for _, g := range []uint64{7, 8, 9} {
		var in []ledger.Account
		for _, a := range all {
			if a.Key.Generation == g {
				in = append(in, a)
			}
		}
		var flat []ledger.AccountKey
		for _, page := range epochPages(t, s, store.EpochFilter{Generation: g, Limit: 2}) {
			flat = append(flat, page...)
		}
		same(t, fmt.Sprintf("generation %d after the catch-up across generations", g), flat, wantAcross(in, time.Time{}, store.EpochCursor{}))
	}
}
