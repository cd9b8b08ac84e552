package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// noDebt is a balance without debt.
func noDebt() ledger.Balance { return ledger.Balance{Opening: 100, Available: 100} }

// owing is a balance that drew issued units of overdraft and has repaid
// repaid of them from minted capacity; it conserves, as the PostgreSQL
// store's CHECKs require.
func owing(issued, repaid int64) ledger.Balance {
	return ledger.Balance{Opening: 100, Minted: repaid, OverdraftIssued: issued, Spent: 100 + issued, OverdraftRepaid: repaid}
}

func debtKey(subject, route, region string, generation uint64) ledger.AccountKey {
	return ledger.AccountKey{Subject: subject, Route: route, Region: region, Generation: generation}
}

// debtAccounts returns the accounts of the AccountsInDebt test, out of
// key order, and the keys of those in debt, in key order. Subjects,
// routes and regions include keys that are prefixes of others ("t" and
// "t7" of "t70", "chat" of "chatbot", "eu" of "eu-west"), and
// generations that sort differently as text (2 and 10). Accounts without
// debt, or whose debt is repaid (issued == repaid > 0), lie between, before
// and after the debtors.
func debtAccounts() ([]ledger.Account, []ledger.AccountKey) {
	mk := func(key ledger.AccountKey, dims int, balances ...ledger.Balance) ledger.Account {
		a := ledger.Account{Key: key, Dims: dims, EpochStart: at(0), Version: key.Generation + 3, Breaches: 1}
		copy(a.Balances[:], balances)
		for d := range dims {
			a.RefilledTo[d] = at(-time.Duration(d+1) * time.Second).UnixNano()
		}
		return a
	}
	accounts := []ledger.Account{
		mk(debtKey("t70", "chat", "eu", 10), 1, owing(30, 0)),
		mk(debtKey("t7", "chat", "eu", 3), 3, owing(40, 40), noDebt(), owing(25, 5)),
		mk(debtKey("t", "chat", "eu", 1), 1, noDebt()),
		mk(debtKey("t7", "chat", "us", 1), 2, owing(40, 40), owing(2, 2)),
		// Debt in two dimensions, listed once.
		mk(debtKey("t7", "chat", "eu", 1), 2, owing(50, 10), owing(2, 1)),
		mk(debtKey("t7", "chatbot", "eu", 1), 2, noDebt(), owing(1, 0)),
		mk(debtKey("t7", "chat", "eu", 2), 2, noDebt(), noDebt()),
		mk(debtKey("t7", "chat", "eu-west", 1), 1, owing(7, 6)),
		mk(debtKey("t7", "chat", "us", 2), 2, noDebt(), owing(3, 1)),
		mk(debtKey("t7", "embed", "eu", 1), 1, noDebt()),
		mk(debtKey("t70", "chat", "eu", 2), 1, owing(9, 0)),
		// Debt in a balance past Dims, the last one a row can hold
		// (ledger.MaxDimensions): the row holds it, so it counts.
		mk(debtKey("t8", "chat", "eu", 4), 1, noDebt(), noDebt(), noDebt(), owing(1, 0)),
		mk(debtKey("t9", "chat", "eu", 1), 1, owing(60, 60)),
	}
	inDebt := []ledger.AccountKey{
		debtKey("t7", "chat", "eu", 1),
		debtKey("t7", "chat", "eu", 3),
		debtKey("t7", "chat", "eu-west", 1),
		debtKey("t7", "chat", "us", 2),
		debtKey("t7", "chatbot", "eu", 1),
		debtKey("t70", "chat", "eu", 2),
		debtKey("t70", "chat", "eu", 10),
		debtKey("t8", "chat", "eu", 4),
	}
	return accounts, inDebt
}

// debtPages pages through AccountsInDebt from f, each page after the last
// account of the one before, until a page comes back short. It returns
// the keys of each page, the empty page included when the last full page
// was the end.
func debtPages(t *testing.T, s store.Store, f store.DebtFilter) [][]ledger.AccountKey {
	t.Helper()
	pages := [][]ledger.AccountKey{}
	for range 50 {
		page, err := s.AccountsInDebt(context.Background(), f)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if len(page) > f.Limit {
			t.Fatalf("%+v: %d accounts, more than the limit", f, len(page))
		}
		keys := []ledger.AccountKey{}
		for _, a := range page {
			keys = append(keys, a.Key)
		}
		pages = append(pages, keys)
		if len(page) < f.Limit {
			return pages
		}
		f.After = page[len(page)-1].Key
	}
	t.Fatalf("%+v: still paging after 50 pages (does the cursor move on?)", f)
	return nil
}

// split returns keys in pages of limit, with the empty last page that
// paging ends on when the last full page was the end.
func split(keys []ledger.AccountKey, limit int) [][]ledger.AccountKey {
	pages := [][]ledger.AccountKey{}
	for chunk := range slices.Chunk(keys, limit) {
		pages = append(pages, chunk)
	}
	if len(keys)%limit == 0 {
		pages = append(pages, []ledger.AccountKey{})
	}
	return pages
}

func testAccountsInDebt(t *testing.T, s store.Store) {
	ctx := context.Background()
	accounts, inDebt := debtAccounts()
	byKey := map[ledger.AccountKey]ledger.Account{}
	for _, a := range accounts {
		byKey[a.Key] = a
	}
	if got, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}

	// Written in two batches, the first with no account in debt.
	var clearOnes, debtors []ledger.Account
	for _, a := range accounts {
		if slices.Contains(inDebt, a.Key) {
			debtors = append(debtors, a)
		} else {
			clearOnes = append(clearOnes, a)
		}
	}
	Commit(t, s, &store.Changes{Accounts: clearOnes})
	if got, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("no account in debt: %v, %v; want none", got, err)
	}
	// Uncommitted debt is not listed.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		if err := tx.Write(ctx, &store.Changes{Accounts: debtors}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 10}); err != nil || len(got) != 0 {
			t.Errorf("uncommitted debt: %v, %v; want none", got, err)
		}
	})
	Commit(t, s, &store.Changes{Accounts: debtors})

	// The accounts are whole rows, as AccountGet reads them.
	all, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var want []ledger.Account
	for _, k := range inDebt {
		got, err := s.AccountGet(ctx, k)
		if err != nil {
			t.Fatalf("account %s: %v", k, err)
		}
		same(t, "account "+k.String(), got, byKey[k])
		want = append(want, got)
	}
	same(t, "every account in debt", all, want)

	for _, limit := range []int{1, 2, 3, 8, 100} {
		same(t, fmt.Sprint("pages of ", limit), debtPages(t, s, store.DebtFilter{Limit: limit}), split(inDebt, limit))
	}

	for _, tc := range []struct {
		name  string
		after ledger.AccountKey
		want  []ledger.AccountKey
	}{
		{"after a debtor in the middle", debtKey("t7", "chat", "eu-west", 1), inDebt[3:]},
		{"after an account without debt", debtKey("t7", "chat", "eu", 2), inDebt[1:]},
		{"after a repaid account", debtKey("t7", "chat", "us", 1), inDebt[3:]},
		{"after a key with no account", debtKey("t7", "chat", "eu", 0), inDebt},
		{"after a subject alone", debtKey("t7", "", "", 0), inDebt},
		{"after a subject that prefixes others", debtKey("t7", "zzz", "", 0), inDebt[5:]},
		{"after the last generation of a route", debtKey("t7", "chat", "eu", math.MaxInt64), inDebt[2:]},
		{"after the shorter of two prefixed routes", debtKey("t7", "chat", "zz", 0), inDebt[4:]},
		{"after a prefix of a subject", debtKey("t70", "", "", 0), inDebt[5:]},
		{"generations compare as numbers", debtKey("t70", "chat", "eu", 2), inDebt[6:]},
		{"between generations", debtKey("t70", "chat", "eu", 3), inDebt[6:]},
		{"after the last debtor", debtKey("t8", "chat", "eu", 4), nil},
		{"after every key", debtKey("zzz", "", "", 0), nil},
	} {
		got, err := s.AccountsInDebt(ctx, store.DebtFilter{After: tc.after, Limit: 100})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var keys []ledger.AccountKey
		for _, a := range got {
			keys = append(keys, a.Key)
		}
		same(t, tc.name, keys, tc.want)
	}
	// Paging with a limit from a cursor in the middle, across routes,
	// regions and subjects.
	same(t, "pages of 2 after t7/chat@eu#1", debtPages(t, s, store.DebtFilter{After: inDebt[0], Limit: 2}),
		split(inDebt[1:], 2))
	same(t, "pages of 1 after t7/chat@eu-west#1", debtPages(t, s, store.DebtFilter{After: inDebt[2], Limit: 1}),
		split(inDebt[3:], 1))

	for _, limit := range []int{0, -1} {
		if got, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: limit}); err == nil {
			t.Errorf("limit %d: %v and no error", limit, got)
		}
	}
	tooBig := debtKey("t7", "chat", "eu", math.MaxInt64+1)
	if got, err := s.AccountsInDebt(ctx, store.DebtFilter{After: tooBig, Limit: 10}); err == nil {
		t.Errorf("cursor generation above MaxInt64: %v and no error", got)
	}

	// A later write that repays the debt removes the account; one that
	// draws an overdraft adds it in its place; a repayment in one
	// dimension leaves an account that owes in another.
	repaid := byKey[debtKey("t7", "chat", "us", 2)]
	repaid.Balances[1] = owing(3, 3)
	repaidToo := byKey[debtKey("t70", "chat", "eu", 2)]
	repaidToo.Balances[0] = owing(9, 9)
	partly := byKey[debtKey("t7", "chat", "eu", 3)]
	partly.Balances[2] = owing(25, 24)
	drawn := byKey[debtKey("t7", "embed", "eu", 1)]
	drawn.Balances[0] = owing(4, 0)
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{repaid, repaidToo, partly, drawn}})
	after := []ledger.AccountKey{
		debtKey("t7", "chat", "eu", 1),
		debtKey("t7", "chat", "eu", 3),
		debtKey("t7", "chat", "eu-west", 1),
		debtKey("t7", "chatbot", "eu", 1),
		debtKey("t7", "embed", "eu", 1),
		debtKey("t70", "chat", "eu", 10),
		debtKey("t8", "chat", "eu", 4),
	}
	for _, limit := range []int{1, 2, 100} {
		same(t, fmt.Sprint("after repaying two and drawing one, pages of ", limit),
			debtPages(t, s, store.DebtFilter{Limit: limit}), split(after, limit))
	}
	got, err := s.AccountsInDebt(ctx, store.DebtFilter{After: debtKey("t7", "chat", "eu", 1), Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	same(t, "the partly repaid account", got, []ledger.Account{partly})
}

// testAccountsInDebtFollowsWrites: the accounts listed follow every way a
// transaction writes an account, among many that never owe: read then
// written (the SQL stores' short update) into and out of debt, written
// twice in one transaction, written in a transaction rolled back, and
// written again unchanged. Listed in key order, page after page.
func testAccountsInDebtFollowsWrites(t *testing.T, s store.Store) {
	ctx := context.Background()
	key := func(i int) ledger.AccountKey { return debtKey(fmt.Sprintf("n%03d", i), "chat", "eu", 1) }
	account := func(i int, b ledger.Balance) ledger.Account {
		a := ledger.Account{Key: key(i), Dims: 1, EpochStart: at(0), Version: 1}
		a.Balances[0] = b
		a.RefilledTo[0] = at(0).UnixNano()
		return a
	}
	owes := map[int]bool{7: true, 150: true, 299: true}
	var all []ledger.Account
	for i := range 300 {
		b := noDebt()
		if owes[i] {
			b = owing(10, 0)
		}
		all = append(all, account(i, b))
	}
	Commit(t, s, &store.Changes{Accounts: all})
	check := func(when string) {
		t.Helper()
		var want []ledger.AccountKey
		for i := range 302 {
			if owes[i] {
				want = append(want, key(i))
			}
		}
		for _, limit := range []int{1, 2, 100} {
			same(t, fmt.Sprintf("%s, pages of %d", when, limit), debtPages(t, s, store.DebtFilter{Limit: limit}), split(want, limit))
		}
	}
	check("written blind")

	// readWrite reads each account in one transaction, applies its change
	// and writes it; commits unless told to roll back.
	readWrite := func(rollback bool, changes map[int][]ledger.Balance) {
		t.Helper()
		tx, err := s.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		for _, i := range slices.Sorted(maps.Keys(changes)) {
			a, err := tx.AccountGet(ctx, key(i))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range changes[i] {
				a.Balances[0] = b
				a.Version++
				if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{*a}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !rollback {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Read, then written out of debt, into debt, or unchanged.
	readWrite(false, map[int][]ledger.Balance{7: {owing(10, 10)}, 8: {owing(3, 0)}, 150: {owing(10, 2)}, 9: {noDebt()}})
	delete(owes, 7)
	owes[8] = true
	check("read and written")
	// Written twice in one transaction: the last write decides.
	readWrite(false, map[int][]ledger.Balance{10: {owing(4, 0), owing(4, 4)}, 150: {owing(10, 10), owing(12, 10)}, 8: {owing(3, 3), owing(3, 1)}})
	check("written twice")
	// Rolled back: nothing changes, and later writes still count.
	readWrite(true, map[int][]ledger.Balance{11: {owing(5, 0)}, 299: {owing(10, 10)}})
	check("rolled back")
	readWrite(false, map[int][]ledger.Balance{11: {noDebt()}, 299: {owing(10, 10)}})
	delete(owes, 299)
	check("after a rollback")
	// New accounts, looked up (not found) and then written, owing or not.
	inTx(t, s, func(ctx context.Context, tx store.Tx) {
		for _, i := range []int{300, 301} {
			if _, err := tx.AccountGet(ctx, key(i)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("account %s before it is written: %v, want ErrNotFound", key(i), err)
			}
		}
		if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{account(300, owing(2, 0)), account(301, noDebt())}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	})
	owes[300] = true
	check("new accounts")
	// Blind writes again, into and out of debt.
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{account(8, owing(3, 3)), account(200, owing(1, 0))}})
	delete(owes, 8)
	owes[200] = true
	check("written blind again")
}

// testAccountsPage: paging through every account, each page after the
// last account of the one before, lists every account once, in
// AccountList's order of every account, whatever the page size; a
// cursor between keys starts at the next one.
func testAccountsPage(t *testing.T, s store.Store) {
	ctx := context.Background()
	if got, err := s.AccountsPage(ctx, store.AccountFilter{Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("empty store: %v, %v; want none", got, err)
	}
	if _, err := s.AccountsPage(ctx, store.AccountFilter{Limit: 0}); err == nil {
		t.Error("limit 0: no error")
	}
	accounts, _ := debtAccounts()
	Commit(t, s, &store.Changes{Accounts: accounts})
	every, err := s.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []ledger.AccountKey
	for _, a := range every {
		keys = append(keys, a.Key)
	}
	if len(keys) != len(accounts) {
		t.Fatalf("AccountList of every account: %d, want %d", len(keys), len(accounts))
	}
	for _, limit := range []int{1, 2, 3, 13, 100} {
		pages := [][]ledger.AccountKey{}
		f := store.AccountFilter{Limit: limit}
		for range 50 {
			page, err := s.AccountsPage(ctx, f)
			if err != nil {
				t.Fatalf("%+v: %v", f, err)
			}
			got := []ledger.AccountKey{}
			for i := range page {
				got = append(got, page[i].Key)
				if limit == 100 {
					same(t, "account "+page[i].Key.String(), page[i], every[slices.Index(keys, page[i].Key)])
				}
			}
			pages = append(pages, got)
			if len(page) < limit {
				break
			}
			f.After = page[len(page)-1].Key
		}
		same(t, fmt.Sprint("pages of ", limit), pages, split(keys, limit))
	}
	i := slices.Index(keys, debtKey("t7", "chat", "eu", 2))
	if got, err := s.AccountsPage(ctx, store.AccountFilter{After: debtKey("t7", "chat", "eu", 2), Limit: 2}); err != nil ||
		len(got) != 2 || got[0].Key != keys[i+1] || got[1].Key != keys[i+2] {
		t.Errorf("after t7/chat/eu/2: %v, %v; want %v", got, err, keys[i+1:i+3])
	}
	if got, err := s.AccountsPage(ctx, store.AccountFilter{After: debtKey("t7", "chat", "eu", 0), Limit: 1}); err != nil ||
		len(got) != 1 || got[0].Key != debtKey("t7", "chat", "eu", 1) {
		t.Errorf("after a key with no account: %v, %v; want t7/chat/eu/1", got, err)
	}
	if got, err := s.AccountsPage(ctx, store.AccountFilter{After: keys[len(keys)-1], Limit: 5}); err != nil || len(got) != 0 {
		t.Errorf("after the last account: %v, %v; want none", got, err)
	}
}

// testAccountsPageOfSubject: AccountsPage with a subject (and a route or
// region) pages through that subject's accounts only, in key order,
// whatever the page size: none of another subject's, not of t70's when
// t7 is asked nor of t7's when t is; a cursor in an earlier subject
// starts at the subject's first account, one in a later subject ends
// the list. A route or region without a subject is refused.
func testAccountsPageOfSubject(t *testing.T, s store.Store) {
	ctx := context.Background()
	accounts, _ := debtAccounts()
	Commit(t, s, &store.Changes{Accounts: accounts})
	every, err := s.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		t.Fatal(err)
	}
	for _, filter := range []store.AccountFilter{
		{Subject: "t7"}, {Subject: "t7", Route: "chat"}, {Subject: "t7", Region: "eu"},
		{Subject: "t7", Route: "chat", Region: "us"}, {Subject: "t70"}, {Subject: "t"}, {Subject: "t8", Route: "embed"},
		{Subject: "nobody"}, {Subject: ledger.AnySubject},
	} {
		var want []ledger.AccountKey
		for _, a := range every {
			k := a.Key
			if k.Subject == filter.Subject && (filter.Route == "" || k.Route == filter.Route) &&
				(filter.Region == "" || k.Region == filter.Region) {
				want = append(want, k)
			}
		}
		checkPages(t, s, filter, every, want)
	}
	for _, tc := range []struct {
		name  string
		after ledger.AccountKey
		want  int
	}{
		{"a cursor in an earlier subject", debtKey("t", "chat", "eu", 1), 8},
		{"a cursor before every key", debtKey("a", "z", "z", 9), 8},
		{"a cursor in a later subject", debtKey("t70", "chat", "eu", 2), 0},
		{"a cursor in the subject, between keys", debtKey("t7", "chat", "eu", 0), 8},
		{"a cursor at the subject's second key", debtKey("t7", "chat", "eu", 2), 6},
	} {
		got, err := s.AccountsPage(ctx, store.AccountFilter{Subject: "t7", After: tc.after, Limit: 100})
		if err != nil || len(got) != tc.want {
			t.Errorf("%s: %d accounts, %v; want %d of t7's", tc.name, len(got), err, tc.want)
		}
		for _, a := range got {
			if a.Key.Subject != "t7" || a.Key.Compare(tc.after) <= 0 {
				t.Errorf("%s: %s", tc.name, a.Key)
			}
		}
	}
	for _, f := range []store.AccountFilter{{Region: "eu", Limit: 10}} {
		if got, err := s.AccountsPage(ctx, f); err == nil {
			t.Errorf("%+v without a subject or route: %v, no error", f, got)
		}
	}
}

// testAccountsPageOfRoute: AccountsPage with a route and no subject (and
// a region or not) pages through that route's accounts only, in key
// order, whatever the page size: not chatbot's when chat is asked nor
// chat's when cha is. A cursor of an earlier route starts at its
// subject's accounts of the route, one of a later route after them.
func testAccountsPageOfRoute(t *testing.T, s store.Store) {
	ctx := context.Background()
	accounts, _ := debtAccounts()
	Commit(t, s, &store.Changes{Accounts: accounts})
	every, err := s.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		t.Fatal(err)
	}
	for _, filter := range []store.AccountFilter{
		{Route: "chat"}, {Route: "chat", Region: "eu"}, {Route: "chatbot"}, {Route: "embed"}, {Route: "cha"},
		{Route: "nothing"}, {Route: "chat", Region: "nowhere"},
	} {
		var want []ledger.AccountKey
		for _, a := range every {
			if k := a.Key; k.Route == filter.Route && (filter.Region == "" || k.Region == filter.Region) {
				want = append(want, k)
			}
		}
		checkPages(t, s, filter, every, want)
	}
	for _, tc := range []struct {
		name  string
		after ledger.AccountKey
		want  []ledger.AccountKey
	}{
		{"a cursor of an earlier route", debtKey("t7", "alpha", "zz", 9),
			[]ledger.AccountKey{debtKey("t7", "chat", "eu", 1), debtKey("t7", "chat", "eu", 2), debtKey("t7", "chat", "eu", 3),
				debtKey("t7", "chat", "eu-west", 1), debtKey("t7", "chat", "us", 1), debtKey("t7", "chat", "us", 2)}},
		{"a cursor of a later route", debtKey("t7", "chatbot", "eu", 1),
			[]ledger.AccountKey{debtKey("t70", "chat", "eu", 2), debtKey("t70", "chat", "eu", 10)}},
		{"a cursor in the route, between keys", debtKey("t7", "chat", "eu-west", 0),
			[]ledger.AccountKey{debtKey("t7", "chat", "eu-west", 1), debtKey("t7", "chat", "us", 1), debtKey("t7", "chat", "us", 2)}},
		{"a cursor at a key of the route", debtKey("t7", "chat", "us", 1),
			[]ledger.AccountKey{debtKey("t7", "chat", "us", 2), debtKey("t70", "chat", "eu", 2)}},
	} {
		got, err := s.AccountsPage(ctx, store.AccountFilter{Route: "chat", After: tc.after, Limit: len(tc.want)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		keys := []ledger.AccountKey{}
		for i := range got {
			keys = append(keys, got[i].Key)
		}
		same(t, tc.name, keys, tc.want)
	}
}

// checkPages pages through AccountsPage with filter at several page sizes
// and checks that the pages split want, each account as stored (every).
func checkPages(t *testing.T, s store.Store, filter store.AccountFilter, every []ledger.Account, want []ledger.AccountKey) {
	t.Helper()
	for _, limit := range []int{1, 2, 3, 100} {
		pages := [][]ledger.AccountKey{}
		f := filter
		f.Limit = limit
		for range 50 {
			page, err := s.AccountsPage(context.Background(), f)
			if err != nil {
				t.Fatalf("%+v: %v", f, err)
			}
			got := []ledger.AccountKey{}
			for i := range page {
				got = append(got, page[i].Key)
				same(t, "account "+page[i].Key.String(), page[i], every[slices.IndexFunc(every, func(a ledger.Account) bool { return a.Key == page[i].Key })])
			}
			pages = append(pages, got)
			if len(page) < limit {
				break
			}
			f.After = page[len(page)-1].Key
		}
		same(t, fmt.Sprintf("%+v: pages of %d", filter, limit), pages, split(want, limit))
	}
}

// AccountsInDebtCount counts what AccountsInDebt pages through: the
// accounts whose row owes in any balance (past Dims too), not those
// repaid, none uncommitted; a write that repays one, or puts another in
// debt, moves the count with it.
func testAccountsInDebtCount(t *testing.T, s store.Store) {
	ctx := context.Background()
	count := func(what string, want int) {
		t.Helper()
		n, err := s.AccountsInDebtCount(ctx)
		if err != nil {
			t.Fatal(err)
		}
		listed, err := s.AccountsInDebt(ctx, store.DebtFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if n != int64(want) || len(listed) != want {
			t.Errorf("%s: counted %d, %d listed; want %d", what, n, len(listed), want)
		}
	}
	count("empty store", 0)
	accounts, inDebt := debtAccounts()
	Commit(t, s, &store.Changes{Accounts: accounts})
	count("the debt fixture", len(inDebt))

	repaid := accounts[0] // t70/chat@eu#10 owes 30
	repaid.Balances[0] = ledger.Balance{Opening: 100, Minted: 30, OverdraftIssued: 30, Spent: 130, OverdraftRepaid: 30}
	repaid.Version++
	owes := accounts[2] // t/chat@eu#1 owed nothing
	owes.Balances[0] = owing(5, 0)
	owes.Version++
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{owes}}); err != nil {
		t.Fatal(err)
	}
	count("a debtor written, not committed", len(inDebt))
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{repaid}})
	count("one repaid", len(inDebt)-1)
	Commit(t, s, &store.Changes{Accounts: []ledger.Account{owes}})
	count("another in debt", len(inDebt))
}

// FillDebtors commits n accounts under generation 1 of n subjects on
// route "chat", every n/debtors-th of them owing debt (debtors in all),
// in transactions of 5,000: the fixture of the benchmarks of
// AccountsInDebtCount (200,000 accounts, 50,000 debtors).
func FillDebtors(tb testing.TB, s store.Store, n, debtors int) {
	tb.Helper()
	every := n / debtors
	var batch []ledger.Account
	for i := range n {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%07d", i), Route: "chat", Region: "eu", Generation: 1},
			Dims: 1, EpochStart: at(0), Version: 1}
		a.Balances[0] = noDebt()
		if i%every == 0 {
			a.Balances[0] = owing(30, 0)
		}
		a.RefilledTo[0] = at(0).UnixNano()
		batch = append(batch, a)
		if len(batch) == 5000 || i == n-1 {
			Commit(tb, s, &store.Changes{Accounts: batch})
			batch = nil
		}
	}
}
