package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

// headCountingStore counts the reads of policy heads: point reads
// (PolicyHead) and reads of many (PolicyHeads); of generations: point
// reads (get: PolicyGet) and reads of many (many: PoliciesOfGenerations);
// and the views (store.Store.AccountsView, which read a page's heads and
// generations with its accounts).
type headCountingStore struct {
	store.Store
	head, heads, get, many, views atomic.Int64
}

func (s *headCountingStore) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	s.views.Add(1)
	return s.Store.AccountsView(ctx, subjects)
}

func (s *headCountingStore) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	s.get.Add(1)
	return s.Store.PolicyGet(ctx, generation)
}

func (s *headCountingStore) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	s.many.Add(1)
	return s.Store.PoliciesOfGenerations(ctx, generations)
}

func (s *headCountingStore) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	s.head.Add(1)
	return s.Store.PolicyHead(ctx, key)
}

func (s *headCountingStore) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	s.heads.Add(1)
	return s.Store.PolicyHeads(ctx, keys)
}

// GetFairness and ListAccountStandings over 1,500 tenants under one "*"
// policy read the heads deciding for them once per page of accounts (two
// pages), with the page's accounts in one view each, not a point read per
// tenant, and not again (they count and show from the deciding
// generations their pages were shown with).
func TestConsoleScansReadHeadsOncePerPage(t *testing.T) {
	var counted *headCountingStore
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		counted = &headCountingStore{Store: st}
		return counted
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
	ctx := context.Background()
	p, err := counted.Store.PolicyGet(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const tenants = 1500
	var accounts []ledger.Account
	for i := range tenants {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: p.Key.Route, Region: p.Key.Region, Generation: 1},
			Dims: 1, EpochStart: h.clock.Now(), Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 100 - int64(i%50), Spent: int64(i % 50)}
		a.RefilledTo[0] = h.clock.Now().UnixNano()
		accounts = append(accounts, a)
	}
	tx, err := counted.Store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: accounts}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	counted.head.Store(0)
	counted.heads.Store(0)
	counted.views.Store(0)
	got := h.consoleOK("GetFairness", `{}`, consoleViewer)
	groups, _ := got["groups"].([]any)
	if len(groups) != 1 || num(groups[0].(map[string]any)["subjectCount"]) != tenants {
		t.Fatalf("fairness of %d tenants under one \"*\" policy: %v", tenants, groups)
	}
	if head, heads, views := counted.head.Swap(0), counted.heads.Swap(0), counted.views.Swap(0); head != 0 || heads != 0 || views != 2 {
		t.Errorf("GetFairness over 2 pages: %d head point reads, %d reads of heads, %d views; want 0, 0, 2", head, heads, views)
	}
	got = h.consoleOK("ListAccountStandings", `{}`, consoleViewer)
	if num(got["matched"]) != tenants {
		t.Fatalf("standings of %d tenants: matched %v", tenants, got["matched"])
	}
	// Two pages; the ranked accounts are shown with the heads their
	// pages' views read, not read again.
	if head, heads, views := counted.head.Swap(0), counted.heads.Swap(0), counted.views.Swap(0); head != 0 || heads != 0 || views != 2 {
		t.Errorf("ListAccountStandings over 2 pages: %d head point reads, %d reads of heads, %d views; want 0, 0, 2", head, heads, views)
	}
}

// GetFairness, ListAccountStandings and ListDebts over 1,500 tenants, each
// under a policy of its own that this replica has not cached (published
// through another), read a page's generations together, not one point
// read per tenant (up to 1,000 round trips a page on PostgreSQL): the
// engine with each page's accounts (one view a page), and the server none
// of its own: it shows each account with the policy its view read.
func TestConsoleScansReadGenerationsOncePerPage(t *testing.T) {
	var counted *headCountingStore
	h := newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		counted = &headCountingStore{Store: st}
		return counted
	}})
	const tenants = 1500
	now := h.clock.Now()
	changes := &store.Changes{}
	for i := range tenants {
		key := ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat.generate", Region: "default"}
		p := ledger.Policy{Key: key, Generation: uint64(i + 1), FairnessWeight: 1, PublishedAt: now,
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: time.Hour}}}.WithDefaults()
		changes.Policies = append(changes.Policies, p)
		changes.Heads = append(changes.Heads, ledger.PolicyHead{Key: key, Active: p.Generation, Latest: p.Generation})
		a := ledger.Account{Key: ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: p.Generation},
			Dims: 1, EpochStart: now, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 100 - int64(i%50), Spent: int64(i % 50)}
		if i%30 == 0 { // 50 in debt: overdraft drawn, none repaid
			a.Balances[0] = ledger.Balance{Opening: 100, OverdraftIssued: 50, Spent: 150}
		}
		a.RefilledTo[0] = now.UnixNano()
		changes.Accounts = append(changes.Accounts, a)
	}
	storetest.Commit(t, counted.Store, changes)
	reads := func(what string, many, views int64) {
		t.Helper()
		if get, m, v := counted.get.Swap(0), counted.many.Swap(0), counted.views.Swap(0); get != 0 || m != many || v != views {
			t.Errorf("%s: %d generation point reads, %d reads of generations, %d views; want 0, %d, %d", what, get, m, v, many, views)
		}
	}
	counted.get.Store(0)
	counted.many.Store(0)
	counted.views.Store(0)
	got := h.consoleOK("GetFairness", `{}`, consoleViewer)
	groups, _ := got["groups"].([]any)
	if len(groups) != 1 || num(groups[0].(map[string]any)["subjectCount"]) != tenants {
		t.Fatalf("fairness of %d tenants with a policy each: %v", tenants, groups)
	}
	reads("GetFairness over 2 pages, nothing cached", 0, 2)
	got = h.consoleOK("ListAccountStandings", `{}`, consoleViewer)
	if num(got["matched"]) != tenants {
		t.Fatalf("standings of %d tenants: matched %v", tenants, got["matched"])
	}
	reads("ListAccountStandings over 2 pages", 0, 2)
	page := h.ok("ListDebts", `{"pageSize":100}`, adminToken)
	if shown := len(debtors(t, page)); shown != tenants/30 {
		t.Fatalf("ListDebts: %d debtors, want %d", shown, tenants/30)
	}
	reads("ListDebts, a page of 50", 0, 1)
}
