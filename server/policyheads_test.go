package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// headCountingStore counts the reads of policy heads: point reads
// (PolicyHead) and reads of many (PolicyHeads).
type headCountingStore struct {
	store.Store
	head, heads atomic.Int64
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
// pages), not a point read per tenant, and GetFairness not twice per page
// (it counts from the deciding generations its page was shown with).
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
	got := h.consoleOK("GetFairness", `{}`, consoleViewer)
	groups, _ := got["groups"].([]any)
	if len(groups) != 1 || num(groups[0].(map[string]any)["subjectCount"]) != tenants {
		t.Fatalf("fairness of %d tenants under one \"*\" policy: %v", tenants, groups)
	}
	if head, heads := counted.head.Swap(0), counted.heads.Swap(0); head != 0 || heads != 2 {
		t.Errorf("GetFairness over 2 pages: %d head point reads, %d reads of heads; want 0, 2", head, heads)
	}
	got = h.consoleOK("ListAccountStandings", `{}`, consoleViewer)
	if num(got["matched"]) != tenants {
		t.Fatalf("standings of %d tenants: matched %v", tenants, got["matched"])
	}
	// Two pages, and the heads of the ranked accounts shown.
	if head, heads := counted.head.Swap(0), counted.heads.Swap(0); head != 0 || heads != 3 {
		t.Errorf("ListAccountStandings over 2 pages: %d head point reads, %d reads of heads; want 0, 3", head, heads)
	}
}
