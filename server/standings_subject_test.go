package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// pageRows records the keys of the accounts AccountsPage returns.
type pageRows struct {
	store.Store
	mu   sync.Mutex
	keys []ledger.AccountKey
}

func (s *pageRows) AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, error) {
	page, err := s.Store.AccountsPage(ctx, f)
	s.mu.Lock()
	for i := range page {
		s.keys = append(s.keys, page[i].Key)
	}
	s.mu.Unlock()
	return page, err
}

// take returns the keys recorded since the last take.
func (s *pageRows) take() []ledger.AccountKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := s.keys
	s.keys = nil
	return keys
}

// ListAccountStandings of one subject (without a whole subject key)
// reads that subject's accounts from the store, not every account and
// filters them: among 1,112 tenants' accounts (two pages of every
// account), t1's standings read t1's two accounts only, none of t10 ..
// t1999's whose names begin with it, and with a route only the account
// on that route; they are ranked as before (in debt first, then the
// highest used fraction). A scoped token asking for a subject outside
// its scope gets what an unknown subject gets.
func TestConsoleStandingsOfOneSubjectReadItsAccountsOnly(t *testing.T) {
	rows := &pageRows{}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		rows.Store = st
		return rows
	}})
	for _, route := range []string{"chat.generate", "embed"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	}
	h.ok("Reserve", reserveFor("r-t1", "t1", 1), adminToken)
	h.ok("Reserve", `{"reservationId":"r-t1-embed","subject":"t1","route":"embed","units":{"tokens":3}}`, adminToken)
	reserveSimilarSubjects(h)
	h.ok("Reserve", reserveFor("r-other", "tenant-b/u1", 1), adminToken)

	every := h.consoleOK("ListAccountStandings", `{"limit":1000}`, consoleViewer)
	// (A page that ends within a subject key leaves that key to the
	// next page, so a row may be read twice.)
	if n := len(rows.take()); num(every["matched"]) != 1113 || n < 1113 {
		t.Fatalf("every account: matched %v, %d rows read; want 1113, at least 1113", every["matched"], n)
	}
	for _, tc := range []struct {
		body  string
		want  []string // route of each standing, in order
		reads []ledger.AccountKey
	}{
		{`{"subject":"t1"}`, []string{"embed", "chat.generate"}, []ledger.AccountKey{
			{Subject: "t1", Route: "chat.generate", Region: "global", Generation: 1},
			{Subject: "t1", Route: "embed", Region: "global", Generation: 2}}},
		{`{"subject":"t1","route":"embed"}`, []string{"embed"}, []ledger.AccountKey{
			{Subject: "t1", Route: "embed", Region: "global", Generation: 2}}},
		{`{"subject":"t1","region":"eu"}`, nil, nil},
		{`{"subject":"t10","limit":1000}`, []string{"chat.generate"}, []ledger.AccountKey{
			{Subject: "t10", Route: "chat.generate", Region: "global", Generation: 1}}},
		{`{"subject":"nobody"}`, nil, nil},
	} {
		got := h.consoleOK("ListAccountStandings", tc.body, consoleViewer)
		var routes []string
		accounts, _ := got["accounts"].([]any)
		for _, a := range accounts {
			acc := a.(map[string]any)["account"].(map[string]any)
			routes = append(routes, fmt.Sprint(acc["route"]))
			if want := strings.Split(strings.Split(tc.body, `"subject":"`)[1], `"`)[0]; acc["subject"] != want {
				t.Errorf("%s: a standing of %v", tc.body, acc["subject"])
			}
		}
		if num(got["matched"]) != int64(len(tc.want)) || !slices.Equal(routes, tc.want) {
			t.Errorf("%s: matched %v, routes %v; want %v", tc.body, got["matched"], routes, tc.want)
		}
		if read := rows.take(); !slices.Equal(read, tc.reads) {
			t.Errorf("%s: read %d accounts (%v ...); want %v", tc.body, len(read), read[:min(len(read), 3)], tc.reads)
		}
	}

	unknown := h.consoleOK("ListAccountStandings", `{"subject":"nobody"}`, consoleScoped)
	outside := h.consoleOK("ListAccountStandings", `{"subject":"t1"}`, consoleScoped)
	delete(unknown, "asOf")
	delete(outside, "asOf")
	if fmt.Sprint(unknown) != fmt.Sprint(outside) {
		t.Errorf("scoped token: a subject outside the scope answers %v, an unknown one %v", outside, unknown)
	}
	own := h.consoleOK("ListAccountStandings", `{"subject":"tenant-b/u1"}`, consoleScoped)
	if accounts, _ := own["accounts"].([]any); num(own["matched"]) != 1 || len(accounts) != 1 {
		t.Errorf("scoped token, its own subject: %v", own)
	}
}

// ListAccountStandings of one route without a subject reads that
// route's accounts from the store (its range of the route index, as
// GetFairness of one route), not every account filtered: among 2,162
// accounts (three pages of every account), the embed route's 1,051 (two
// pages of their own) are all it reads, and its ranking is the embed part
// of the ranking of every account, in the same order (embed's accounts
// stand nearest their limit, so every account's best 1,000 are embed's
// best 1,000); with a region, a generation or a smaller limit it answers
// as before.
func TestConsoleStandingsOfOneRouteReadItsAccountsOnly(t *testing.T) {
	rows := &pageRows{}
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		rows.Store = st
		return rows
	}})
	for _, route := range []string{"chat.generate", "embed"} {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
		  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	}
	h.ok("Reserve", reserveFor("r-t1", "t1", 1), adminToken)
	h.ok("Reserve", `{"reservationId":"r-t1-embed","subject":"t1","route":"embed","units":{"tokens":3}}`, adminToken)
	reserveSimilarSubjects(h) // 1,110 subjects, 2 tokens each on chat.generate
	var items []string
	const embedSubjects = 1050
	for i := range embedSubjects {
		// 3 to 42 tokens of 100: every one nearer its limit than any
		// account of chat.generate.
		items = append(items, fmt.Sprintf(`{"reservationId":"e-%04d","subject":"e-%04d","route":"embed","units":{"tokens":%d}}`, i, i, 3+(i*7)%40))
		if len(items) == 500 || i == embedSubjects-1 {
			h.ok("ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`, adminToken)
			items = nil
		}
	}
	const embedAccounts = embedSubjects + 1

	keysOf := func(got map[string]any) []string {
		var keys []string
		accounts, _ := got["accounts"].([]any)
		for _, a := range accounts {
			acc := a.(map[string]any)["account"].(map[string]any)
			keys = append(keys, fmt.Sprintf("%v/%v/%v/%v", acc["subject"], acc["route"], acc["region"], acc["policyGeneration"]))
		}
		return keys
	}
	every := h.consoleOK("ListAccountStandings", `{"limit":1000}`, consoleViewer)
	if n := len(rows.take()); num(every["matched"]) != 2162 || n < 2162 {
		t.Fatalf("every account: matched %v, %d rows read; want 2162, at least 2162", every["matched"], n)
	}
	everyKeys := keysOf(every)
	for _, k := range everyKeys {
		if !strings.Contains(k, "/embed/") {
			t.Fatalf("every account: %s among the best 1000; the test wants embed's accounts nearest their limit", k)
		}
	}

	checkRead := func(body string, want int) {
		t.Helper()
		read := rows.take()
		distinct := map[ledger.AccountKey]bool{}
		for _, k := range read {
			if k.Route != "embed" {
				t.Fatalf("%s: read %s", body, k)
			}
			distinct[k] = true
		}
		// (A page that ends within a subject key leaves that key to the
		// next page, so a row may be read again once a page.)
		if len(distinct) != want || len(read) > want+2 {
			t.Errorf("%s: read %d rows, %d accounts; want the route's %d", body, len(read), len(distinct), want)
		}
	}
	body := `{"route":"embed","limit":1000}`
	got := h.consoleOK("ListAccountStandings", body, consoleViewer)
	if num(got["matched"]) != embedAccounts || !slices.Equal(keysOf(got), everyKeys) {
		t.Errorf("%s: matched %v, %d standings; want %d and every account's ranking (first %v, want %v)",
			body, got["matched"], len(keysOf(got)), embedAccounts, keysOf(got)[:min(3, len(keysOf(got)))], everyKeys[:3])
	}
	checkRead(body, embedAccounts)

	body = `{"route":"embed","region":"global","limit":5}`
	got = h.consoleOK("ListAccountStandings", body, consoleViewer)
	if num(got["matched"]) != embedAccounts || !slices.Equal(keysOf(got), everyKeys[:5]) {
		t.Errorf("%s: matched %v, %v; want %d, %v", body, got["matched"], keysOf(got), embedAccounts, everyKeys[:5])
	}
	checkRead(body, embedAccounts)

	body = `{"route":"embed","region":"eu"}`
	if got = h.consoleOK("ListAccountStandings", body, consoleViewer); num(got["matched"]) != 0 || len(keysOf(got)) != 0 {
		t.Errorf("%s: %v", body, got)
	}
	checkRead(body, 0)

	body = `{"route":"embed","policyGeneration":"1"}`
	if got = h.consoleOK("ListAccountStandings", body, consoleViewer); num(got["matched"]) != 0 || len(keysOf(got)) != 0 {
		t.Errorf("%s: %v", body, got)
	}
	checkRead(body, embedAccounts)

	// The route chat.generate: its own accounts, none of embed's.
	got = h.consoleOK("ListAccountStandings", `{"route":"chat.generate","subjectContains":"t1","limit":3}`, consoleViewer)
	if num(got["matched"]) != 1+int64(len(similarSubjects())) || len(keysOf(got)) != 3 {
		t.Errorf("chat.generate: matched %v, %v", got["matched"], keysOf(got))
	}
	for _, k := range rows.take() {
		if k.Route != "chat.generate" {
			t.Fatalf("chat.generate: read %s", k)
		}
	}
}
