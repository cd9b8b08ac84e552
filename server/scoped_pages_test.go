package server_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// countingStore counts the rows the engine reads through the list reads
// of a scoped caller: the USAGE_UNKNOWN index, the debt rows, the
// subjects whose accounts the engine reads to show a debtor (AccountList,
// AccountsOfSubjects, AccountsView), and the policy
// reads (PolicyList); and reads, the calls of every read of accounts and
// policies (PolicyGet, PoliciesOfGenerations and AccountsView too).
type countingStore struct {
	store.Store
	unknownRows, debtRows, subjectsRead, accountRows, policyLists, reads atomic.Int64
}

func (c *countingStore) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	c.reads.Add(1)
	c.policyLists.Add(1)
	return c.Store.PolicyList(ctx)
}

func (c *countingStore) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	c.reads.Add(1)
	return c.Store.PolicyGet(ctx, generation)
}

func (c *countingStore) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	c.reads.Add(1)
	return c.Store.PoliciesOfGenerations(ctx, generations)
}

func (c *countingStore) ReservationsUnknown(ctx context.Context, f store.UnknownFilter) ([]ledger.Reservation, error) {
	rows, err := c.Store.ReservationsUnknown(ctx, f)
	c.unknownRows.Add(int64(len(rows)))
	return rows, err
}

func (c *countingStore) AccountsInDebt(ctx context.Context, f store.DebtFilter) ([]ledger.Account, error) {
	c.reads.Add(1)
	rows, err := c.Store.AccountsInDebt(ctx, f)
	c.debtRows.Add(int64(len(rows)))
	return rows, err
}

func (c *countingStore) AccountGet(ctx context.Context, key ledger.AccountKey) (ledger.Account, error) {
	c.reads.Add(1)
	return c.Store.AccountGet(ctx, key)
}

func (c *countingStore) AccountList(ctx context.Context, subject ledger.PolicyKey) ([]ledger.Account, error) {
	c.reads.Add(1)
	c.subjectsRead.Add(1)
	rows, err := c.Store.AccountList(ctx, subject)
	c.accountRows.Add(int64(len(rows)))
	return rows, err
}

func (c *countingStore) AccountsOfSubjects(ctx context.Context, subjects []ledger.PolicyKey) ([]ledger.Account, error) {
	c.reads.Add(1)
	c.subjectsRead.Add(int64(len(subjects)))
	rows, err := c.Store.AccountsOfSubjects(ctx, subjects)
	c.accountRows.Add(int64(len(rows)))
	return rows, err
}

func (c *countingStore) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	c.reads.Add(1)
	c.subjectsRead.Add(int64(len(subjects)))
	view, err := c.Store.AccountsView(ctx, subjects)
	c.accountRows.Add(int64(len(view.Accounts)))
	return view, err
}

func (c *countingStore) AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, error) {
	c.reads.Add(1)
	rows, err := c.Store.AccountsPage(ctx, f)
	c.accountRows.Add(int64(len(rows)))
	return rows, err
}

// scopedScanPages is server.maxScopedScanPages (and engine's maxDebtScans):
// the store pages of at most the page size one scoped list call reads.
const scopedScanPages = 8

func countingHarness(t *testing.T) (*harness, *countingStore) {
	var counted *countingStore
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		counted = &countingStore{Store: st}
		return counted
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s","maxOverdraft":"1000"}]}}`, adminToken)
	return h, counted
}

// tokenText is what a holder of a page token can read in it: the token,
// and its bytes base64-decoded (after any prefix up to a dot).
func tokenText(token string) string {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		raw, _ = base64.RawURLEncoding.DecodeString(token[strings.IndexByte(token, '.')+1:])
	}
	return token + " " + string(raw)
}

// aRow matches the ids of tenant-a's rows below, not preceded by a
// base64url character: the token's own text is random base64url, where
// "Ta-43-39T" came up by chance (a CI run on 4 Dec failed on it), while a
// leaked id stands after a quote, a separator or the start.
var aRow = regexp.MustCompile(`(^|[^A-Za-z0-9_-])a-[0-9]+-[0-9]+`)

// A viewer scoped to tenant-b/* over a backlog of 150 tenant-a rows around
// its 3 pages through it reading at most scopedScanPages pages of the page
// size per call (it read the whole backlog on each call before), gets
// short or empty pages with a next token meanwhile, reaches every one of
// its rows, and no token shows a tenant-a row. The sealed tokens are bound
// to their filters and to the token they were issued to.
func TestScopedBacklogReadsAreBounded(t *testing.T) {
	h, counted := countingHarness(t)
	mark := func(id, subject string) {
		h.ok("Reserve", reserveFor(id, subject, 10), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("MarkUsageUnknown", `{"reservationId":"`+id+`"}`, adminToken)
		h.clock.Advance(time.Millisecond)
	}
	var want []string
	for i := range 3 {
		for j := range 50 {
			mark(fmt.Sprintf("a-%d-%d", i, j), fmt.Sprintf("tenant-a/u%d-%d", i, j))
		}
		id := fmt.Sprintf("b-%d", i)
		mark(id, "tenant-b/u1")
		want = append(want, id)
	}

	const size = 2
	var got []string
	token, shortWithToken, firstToken := "", 0, ""
	for calls := 0; ; calls++ {
		if calls > 40 {
			t.Fatalf("still paging after %d calls: %v", calls, got)
		}
		counted.unknownRows.Store(0)
		page := h.ok("ListUsageUnknown", fmt.Sprintf(`{"route":"chat.generate","pageSize":%d,"pageToken":%q}`, size, token), consoleScoped)
		if n := counted.unknownRows.Load(); n > scopedScanPages*size {
			t.Fatalf("call %d read %d USAGE_UNKNOWN rows, want at most %d", calls, n, scopedScanPages*size)
		}
		shown := ids(t, page)
		got = append(got, shown...)
		token, _ = page["nextPageToken"].(string)
		if text := tokenText(token); aRow.MatchString(text) || strings.Contains(text, "tenant-a") {
			t.Fatalf("a tenant-b/* token's page token shows a tenant-a row: %q", text)
		}
		if token == "" {
			break
		}
		if firstToken == "" {
			firstToken = token
		}
		if len(shown) < size {
			shortWithToken++
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages for tenant-b/*: %v, want %v", got, want)
	}
	if shortWithToken == 0 {
		t.Errorf("no short page with a next token: the reads were not bounded")
	}

	for _, c := range []struct{ body, token, says string }{
		{`{"route":"chat.generate","pageToken":"` + firstToken + `"}`, consoleViewer, "not a nextPageToken this server issued"},
		{`{"route":"chat.generate","pageToken":"` + firstToken + `"}`, adminToken, "not a nextPageToken this server issued"},
		{`{"pageToken":"` + firstToken + `"}`, consoleScoped, "another subject or route filter"},
		{`{"pageToken":"p1.` + strings.Repeat("A", 40) + `"}`, consoleScoped, "not a nextPageToken this server issued"},
	} {
		r := h.call("ListUsageUnknown", c.body, c.token)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, c.says) {
			t.Errorf("%s with %s: message %q, want it to say %q", c.body, c.token, msg, c.says)
		}
	}
}

// A viewer scoped to tenant-b/* over 100 debtors of tenant-a and tenant-c
// around its 3 pages through ListDebts reading at most scopedScanPages
// pages of debt rows per call, showing (AccountList) only its own
// accounts (every debtor's subject was read, every call, before), and
// reaches every one of its debtors; no token shows another tenant's.
func TestScopedDebtReadsAreBounded(t *testing.T) {
	h, counted := countingHarness(t)
	owe := func(id, subject string) {
		h.ok("Reserve", reserveFor(id, subject, 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	var want []string
	for i := range 50 {
		owe(fmt.Sprintf("a%d", i), fmt.Sprintf("tenant-a/u%02d", i))
		owe(fmt.Sprintf("c%d", i), fmt.Sprintf("tenant-c/u%02d", i))
	}
	for i := range 3 {
		subject := fmt.Sprintf("tenant-b/u%d", i)
		owe(fmt.Sprintf("b%d", i), subject)
		want = append(want, subject)
	}

	const size = 2
	var got []string
	token, shortWithToken := "", 0
	for calls := 0; ; calls++ {
		if calls > 40 {
			t.Fatalf("still paging after %d calls: %v", calls, got)
		}
		counted.debtRows.Store(0)
		counted.subjectsRead.Store(0)
		page := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":%d,"pageToken":%q}`, size, token), consoleScoped)
		if n := counted.debtRows.Load(); n > scopedScanPages*size {
			t.Fatalf("call %d read %d debt rows, want at most %d", calls, n, scopedScanPages*size)
		}
		shown := debtors(t, page)
		// The subjects of the rows in scope only: those shown, and the
		// one more row read to know whether the page is the last.
		if n := counted.subjectsRead.Load(); n > int64(len(shown))+1 {
			t.Fatalf("call %d read the accounts of %d subjects to show %d", calls, n, len(shown))
		}
		for _, s := range shown {
			got = append(got, strings.Split(s, ":")[0])
		}
		token, _ = page["nextPageToken"].(string)
		if text := tokenText(token); strings.Contains(text, "tenant-a") || strings.Contains(text, "tenant-c") {
			t.Fatalf("a tenant-b/* token's page token shows another tenant's account: %q", text)
		}
		if token == "" {
			break
		}
		if len(shown) < size {
			shortWithToken++
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages for tenant-b/*: %v, want %v", got, want)
	}
	if shortWithToken == 0 {
		t.Errorf("no short page with a next token: the reads were not bounded")
	}
}

// countingConsole counts the reservation rows ListSubjectReservations
// reads from the console store.
type countingConsole struct {
	store.ConsoleStore
	subjectRows atomic.Int64
}

func (c *countingConsole) ReservationsOfSubject(ctx context.Context, f store.SubjectFilter) ([]ledger.Reservation, error) {
	rows, err := c.ConsoleStore.ReservationsOfSubject(ctx, f)
	c.subjectRows.Add(int64(len(rows)))
	return rows, err
}

// A viewer scoped to tenant-b/* on route chat.generate (routes=) reading
// a subject of its tenant with 150 reservations on another route around
// its 3 pages through ListSubjectReservations reading at most
// scopedScanPages pages of the page size per call (it read every
// out-of-route row on each call before), gets short or empty pages with a
// next token meanwhile, reaches every one of its rows, newest first, and
// no token shows an out-of-route row. The sealed tokens are bound to the
// subject and states filter and to the token they were issued to.
func TestScopedSubjectReservationReadsAreBounded(t *testing.T) {
	const routesScoped = "console-routes-token-000000001"
	var counted *countingConsole
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens +
		routesScoped + " viewer team-b-chat subjects=tenant-b/* routes=chat.generate\n",
		wrapConsole: func(cs store.ConsoleStore) store.ConsoleStore {
			counted = &countingConsole{ConsoleStore: cs}
			return counted
		}})
	for _, route := range []string{"chat.generate", "embed.batch"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"100000","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	}
	reserve := func(id, route string) {
		h.ok("Reserve", `{"reservationId":"`+id+`","subject":"tenant-b/u1","route":"`+route+`","units":{"tokens":1}}`, adminToken)
		h.clock.Advance(time.Millisecond)
	}
	var want []string
	for i := range 3 {
		id := fmt.Sprintf("chat-%d", i)
		reserve(id, "chat.generate")
		want = append([]string{id}, want...) // newest first
		for j := range 50 {
			reserve(fmt.Sprintf("e-%d-%d", i, j), "embed.batch")
		}
	}
	embedRow := regexp.MustCompile(`e-[0-9]+-[0-9]+`)

	const size = 2
	var got []string
	token, shortWithToken, firstToken := "", 0, ""
	for calls := 0; ; calls++ {
		if calls > 40 {
			t.Fatalf("still paging after %d calls: %v", calls, got)
		}
		counted.subjectRows.Store(0)
		page := h.consoleOK("ListSubjectReservations", fmt.Sprintf(`{"subject":"tenant-b/u1","pageSize":%d,"pageToken":%q}`, size, token), routesScoped)
		if n := counted.subjectRows.Load(); n > scopedScanPages*size {
			t.Fatalf("call %d read %d reservation rows, want at most %d", calls, n, scopedScanPages*size)
		}
		shown := reservationIDs(t, page)
		got = append(got, shown...)
		token, _ = page["nextPageToken"].(string)
		if text := tokenText(token); embedRow.MatchString(text) {
			t.Fatalf("a routes=chat.generate token's page token shows an embed.batch row: %q", text)
		}
		if token == "" {
			break
		}
		if firstToken == "" {
			firstToken = token
		}
		if len(shown) < size {
			shortWithToken++
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages for routes=chat.generate: %v, want %v", got, want)
	}
	if shortWithToken == 0 {
		t.Errorf("no short page with a next token: the reads were not bounded")
	}

	for _, c := range []struct{ body, token, says string }{
		{`{"subject":"tenant-b/u1","pageToken":"` + firstToken + `"}`, consoleScoped, "not a nextPageToken this server issued"},
		{`{"subject":"tenant-b/u1","pageToken":"` + firstToken + `"}`, consoleViewer, "not a nextPageToken this server issued"},
		{`{"subject":"tenant-b/u2","pageToken":"` + firstToken + `"}`, routesScoped, "another subject or states filter"},
		{`{"subject":"tenant-b/u1","states":["RESERVATION_STATE_RESERVED"],"pageToken":"` + firstToken + `"}`, routesScoped, "another subject or states filter"},
		{`{"subject":"tenant-b/u1","pageToken":"p1.` + strings.Repeat("A", 40) + `"}`, routesScoped, "not a nextPageToken this server issued"},
	} {
		r := h.consoleCall("ListSubjectReservations", c.body, c.token)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, c.says) {
			t.Errorf("%s with %s: message %q, want it to say %q", c.body, c.token, msg, c.says)
		}
	}
}

// ListDebts reads the policies once per call, not once per debtor shown
// (each debtor's refill needs them): a page of 12 debtors, and the pages
// of 5 after it, each cost one policy read.
func TestListDebtsReadsThePoliciesOnce(t *testing.T) {
	h, counted := countingHarness(t)
	for i := range 12 {
		id := fmt.Sprintf("d%d", i)
		h.ok("Reserve", reserveFor(id, fmt.Sprintf("tenant-d/u%02d", i), 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	for _, size := range []int{100, 5} {
		token, shown := "", 0
		for {
			counted.policyLists.Store(0)
			page := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":%d,"pageToken":%q}`, size, token), adminToken)
			shown += len(debtors(t, page))
			if n := counted.policyLists.Load(); n > 1 {
				t.Fatalf("pages of %d: a call showing %d debtors read the policies %d times, want once", size, len(debtors(t, page)), n)
			}
			if token, _ = page["nextPageToken"].(string); token == "" {
				break
			}
		}
		if shown != 12 {
			t.Fatalf("pages of %d showed %d debtors, want 12", size, shown)
		}
	}
}

// A ListDebts page costs the same few store reads whatever its size: the
// store's page of debtors, one read of the page's subjects' accounts (each
// debtor's refill depends on them) and the policies, not one subject read
// per debtor shown (a page of 100 on PostgreSQL took 23-28 ms, of which
// the store's page was 0.6-0.9: docs/PERFORMANCE.md). Pages of 4 and of
// 40 debtors, the policies already cached by the server.
func TestListDebtsReadsDoNotGrowWithThePage(t *testing.T) {
	h, counted := countingHarness(t)
	for i := range 40 {
		id := fmt.Sprintf("d%d", i)
		h.ok("Reserve", reserveFor(id, fmt.Sprintf("tenant-d/u%02d", i), 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	h.ok("ListDebts", `{"pageSize":1}`, adminToken) // the server caches the policy shown
	reads := map[int]int64{}
	for _, size := range []int{4, 40} {
		counted.reads.Store(0)
		page := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":%d}`, size), adminToken)
		if shown := len(debtors(t, page)); shown != size {
			t.Fatalf("a page of %d showed %d debtors", size, shown)
		}
		reads[size] = counted.reads.Load()
	}
	if reads[40] != reads[4] || reads[40] > 3 {
		t.Fatalf("store reads: %d for a page of 4 debtors, %d for a page of 40; want the same, at most 3 "+
			"(the debt page, the subjects' accounts, the policies)", reads[4], reads[40])
	}
}

// The console's Debts page asks ListAccountStandings with in_debt for when
// refill repays each debt: that reads the debtors' accounts only (the
// store's index of debtors, as ListDebts), not every account as the call
// without it does, and answers exactly the standings in debt that the call
// without it answers; a scoped token gets its own debtors only.
func TestDebtStandingsReadOnlyTheDebtors(t *testing.T) {
	h, counted := countingHarness(t)
	for i := range 40 {
		h.ok("Reserve", reserveFor(fmt.Sprintf("r%d", i), fmt.Sprintf("tenant-%c/u%02d", 'a'+i%3, i), 10), adminToken)
	}
	owe := func(id, subject string) {
		h.ok("Reserve", reserveFor(id, subject, 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	owe("d1", "tenant-a/debtor")
	owe("d2", "tenant-b/debtor")

	counted.accountRows.Store(0)
	all := h.consoleOK("ListAccountStandings", `{"limit":1000}`, consoleViewer)
	if n := counted.accountRows.Load(); n < 42 {
		t.Fatalf("the call without in_debt read %d account rows, want every one of the 42", n)
	}
	var want []any
	for _, st := range all["accounts"].([]any) {
		if field(st.(map[string]any), "account", "frozen") == true {
			want = append(want, st)
		}
	}
	if len(want) != 2 {
		t.Fatalf("%d standings in debt, want 2: %v", len(want), all)
	}

	counted.accountRows.Store(0)
	debts := h.consoleOK("ListAccountStandings", `{"inDebt":true,"limit":1000}`, consoleViewer)
	if n := counted.accountRows.Load(); n > 2 {
		t.Errorf("in_debt read %d account rows, want only the 2 debtors'", n)
	}
	if got, _ := debts["accounts"].([]any); num(debts["matched"]) != 2 || !reflect.DeepEqual(got, want) {
		t.Errorf("in_debt answered %d standings (matched %v), want the 2 in debt, as the call without it shows them: %v", len(got), debts["matched"], want)
	}

	scopedDebts := h.consoleOK("ListAccountStandings", `{"inDebt":true}`, consoleScoped)
	if got, _ := scopedDebts["accounts"].([]any); len(got) != 1 || field(got[0].(map[string]any), "account", "subject") != "tenant-b/debtor" {
		t.Errorf("a tenant-b/* token's in_debt standings: %d (matched %v), want tenant-b/debtor's only", len(got), scopedDebts["matched"])
	}
}

// A list call whose page is exactly full answers no next token when it
// can tell the store holds no more within its read bound (one row more
// than the page still lacks): it answered one that led to an empty page
// before. Scoped ListUsageUnknown with other tenants' rows before the
// page's, ListDebts for an admin and for a scoped token, and a routes=
// token's ListSubjectReservations; a page with more after it still gets
// its token, and that page then none.
func TestFullLastPageHasNoNextToken(t *testing.T) {
	const routesScoped = "console-routes-token-000000001"
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens +
		routesScoped + " viewer team-b-chat subjects=tenant-b/* routes=chat.generate\n"})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s","maxOverdraft":"1000"}]}}`, adminToken)
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"embed.batch",
	  "dimensions":[{"unit":"tokens","burst":"100000","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	mark := func(id, subject string) {
		h.ok("Reserve", reserveFor(id, subject, 1), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("MarkUsageUnknown", `{"reservationId":"`+id+`"}`, adminToken)
		h.clock.Advance(time.Millisecond)
	}
	owe := func(id, subject string) {
		h.ok("Reserve", reserveFor(id, subject, 50), adminToken)
		h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+id+`","operationId":"op","actualUnits":{"tokens":200}}`, adminToken)
	}
	for i := range 5 {
		mark(fmt.Sprintf("a-%d", i), fmt.Sprintf("tenant-a/u%d", i))
		owe(fmt.Sprintf("da-%d", i), fmt.Sprintf("tenant-a/d%d", i))
	}
	for i := range 2 {
		mark(fmt.Sprintf("b-%d", i), fmt.Sprintf("tenant-b/u%d", i))
		owe(fmt.Sprintf("db-%d", i), fmt.Sprintf("tenant-b/d%d", i))
	}
	for i := range 2 {
		h.ok("Reserve", `{"reservationId":"chat-`+strconv.Itoa(i)+`","subject":"tenant-b/u9","route":"chat.generate","units":{"tokens":1}}`, adminToken)
		h.clock.Advance(time.Millisecond)
		for j := range 5 {
			h.ok("Reserve", fmt.Sprintf(`{"reservationId":"e-%d-%d","subject":"tenant-b/u9","route":"embed.batch","units":{"tokens":1}}`, i, j), adminToken)
			h.clock.Advance(time.Millisecond)
		}
	}

	// pages lists every page of a list call, its rows' count each, and
	// whether the last one came with a token.
	pages := func(call func(token string) (map[string]any, int)) []int {
		t.Helper()
		var shown []int
		token := ""
		for range 10 {
			page, n := call(token)
			shown = append(shown, n)
			if token, _ = page["nextPageToken"].(string); token == "" {
				return shown
			}
		}
		t.Fatalf("still paging after 10 pages: %v", shown)
		return nil
	}
	for _, c := range []struct {
		name string
		want []int
		call func(token string) (map[string]any, int)
	}{
		{"scoped ListUsageUnknown, page of 2", []int{2}, func(token string) (map[string]any, int) {
			page := h.ok("ListUsageUnknown", fmt.Sprintf(`{"pageSize":2,"pageToken":%q}`, token), consoleScoped)
			return page, len(ids(t, page))
		}},
		{"scoped ListUsageUnknown, page of 1", []int{1, 1}, func(token string) (map[string]any, int) {
			page := h.ok("ListUsageUnknown", fmt.Sprintf(`{"pageSize":1,"pageToken":%q}`, token), consoleScoped)
			return page, len(ids(t, page))
		}},
		{"admin ListDebts, page of 7", []int{7}, func(token string) (map[string]any, int) {
			page := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":7,"pageToken":%q}`, token), adminToken)
			return page, len(debtors(t, page))
		}},
		{"scoped ListDebts, page of 2", []int{2}, func(token string) (map[string]any, int) {
			page := h.ok("ListDebts", fmt.Sprintf(`{"pageSize":2,"pageToken":%q}`, token), consoleScoped)
			return page, len(debtors(t, page))
		}},
		{"routes= ListSubjectReservations, page of 2", []int{2}, func(token string) (map[string]any, int) {
			page := h.consoleOK("ListSubjectReservations", fmt.Sprintf(`{"subject":"tenant-b/u9","pageSize":2,"pageToken":%q}`, token), routesScoped)
			return page, len(reservationIDs(t, page))
		}},
	} {
		if got := pages(c.call); !slices.Equal(got, c.want) {
			t.Errorf("%s: pages of %v rows, want %v (no token after a full last page)", c.name, got, c.want)
		}
	}
}

// Two tokens of one name (a rotation, a copied line) are still two
// tokens: a page token is accepted only with the token it was issued to
// (API.md, "Authentication"), so a viewer scoped to tenant-b/* cannot
// continue the pages of an unscoped viewer that bears its name, nor the
// unscoped one a page of the scoped one's; each continues its own.
func TestPageTokensAreBoundToTheTokenNotToItsName(t *testing.T) {
	const twin = "console-twin-0123456789" // named oncall, as consoleViewer
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens + twin + " viewer oncall subjects=tenant-b/*\n"})
	h.ok("PublishPolicy", anySubjectPolicy, adminToken)
	for _, subject := range []string{"tenant-a/u1", "tenant-b/u1", "tenant-b/u2", "tenant-b/u3"} {
		h.ok("Reserve", `{"reservationId":"`+subject+`","subject":"`+subject+`","route":"chat.generate","units":{"tokens":10}}`, adminToken)
		h.ok("Start", `{"reservationId":"`+subject+`","operationId":"op"}`, adminToken)
		h.ok("Settle", `{"reservationId":"`+subject+`","operationId":"op","actualUnits":{"tokens":2000}}`, adminToken)
	}
	for _, c := range []struct{ issuedTo, presentedBy string }{{consoleViewer, twin}, {twin, consoleViewer}} {
		next, _ := h.ok("ListDebts", `{"pageSize":1}`, c.issuedTo)["nextPageToken"].(string)
		if next == "" {
			t.Fatalf("ListDebts of one row for %s: no next page token", c.issuedTo)
		}
		again := `{"pageSize":1,"pageToken":"` + next + `"}`
		r := h.call("ListDebts", again, c.presentedBy)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "INVALID_COMMAND")
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "not a nextPageToken this server issued") {
			t.Errorf("%s's page token with %s: message %q", c.issuedTo, c.presentedBy, msg)
		}
		h.ok("ListDebts", again, c.issuedTo)
	}
}

// A ListUsageUnknown filtered on a subject or a route outside the token's
// scope is answered as one naming a subject or route with no rows: no
// rows and no next page token. Reading on past the other tenant's rows,
// it answered an empty page with a token when that tenant had more
// USAGE_UNKNOWN reservations than the first read covers, and none when it
// had none: a probe of another tenant's backlog.
func TestUsageUnknownFilterOutsideTheScopeAnswersAsNoRows(t *testing.T) {
	const routesScoped = "console-routes-token-000000002"
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens +
		routesScoped + " viewer team-b-chat subjects=tenant-b/* routes=chat.generate\n"})
	for _, route := range []string{"chat.generate", "embed.batch"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"100000","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	}
	for i := range 3 * scopedScanPages { // more than one call reads
		for _, w := range []struct{ subject, route string }{{"tenant-a/u1", "chat.generate"}, {"tenant-b/u1", "embed.batch"}} {
			id := fmt.Sprintf("%s-%s-%d", w.subject, w.route, i)
			h.ok("Reserve", `{"reservationId":"`+id+`","subject":"`+w.subject+`","route":"`+w.route+`","units":{"tokens":1}}`, adminToken)
			h.ok("Start", `{"reservationId":"`+id+`","operationId":"op"}`, adminToken)
			h.ok("MarkUsageUnknown", `{"reservationId":"`+id+`"}`, adminToken)
		}
	}
	for _, c := range []struct{ token, outside, nobody string }{
		{consoleScoped, `"subject":"tenant-a/u1"`, `"subject":"tenant-a/nobody"`},
		{routesScoped, `"subject":"tenant-b/u1","route":"embed.batch"`, `"subject":"tenant-b/u1","route":"embed.nothing"`},
		{routesScoped, `"route":"embed.batch"`, `"route":"embed.nothing"`},
	} {
		outside := h.call("ListUsageUnknown", `{"pageSize":1,`+c.outside+`}`, c.token)
		nobody := h.call("ListUsageUnknown", `{"pageSize":1,`+c.nobody+`}`, c.token)
		if outside.status != http.StatusOK || string(outside.raw) != string(nobody.raw) {
			t.Errorf("{%s} outside the scope answers\n  %d %s\nbut {%s}\n  %d %s", c.outside, outside.status, outside.raw, c.nobody, nobody.status, nobody.raw)
		}
	}
}
