package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// headCounting counts the store's reads of policy heads and generations
// (point reads: get; reads of many: many), and its views
// (store.Store.AccountsView, which read both with the accounts).
type headCounting struct {
	store.Store
	head, heads, get, many, views atomic.Int64
}

func (s *headCounting) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	s.views.Add(1)
	return s.Store.AccountsView(ctx, subjects)
}

func (s *headCounting) PoliciesOfGenerations(ctx context.Context, generations []uint64) (map[uint64]ledger.Policy, error) {
	s.many.Add(1)
	return s.Store.PoliciesOfGenerations(ctx, generations)
}

func (s *headCounting) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	s.head.Add(1)
	return s.Store.PolicyHead(ctx, key)
}

func (s *headCounting) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	s.heads.Add(1)
	return s.Store.PolicyHeads(ctx, keys)
}

func (s *headCounting) PolicyGet(ctx context.Context, generation uint64) (ledger.Policy, error) {
	s.get.Add(1)
	return s.Store.PolicyGet(ctx, generation)
}

func (s *headCounting) reset() {
	s.head.Store(0)
	s.heads.Store(0)
	s.get.Store(0)
	s.many.Store(0)
	s.views.Store(0)
}

// viewReads fails t unless the store was read through views only since
// the last reset, views of them, and resets it.
func (s *headCounting) viewReads(t *testing.T, what string, views int64) {
	t.Helper()
	if h, hs, g, m, v := s.head.Load(), s.heads.Load(), s.get.Load(), s.many.Load(), s.views.Load(); h+hs+g+m != 0 || v != views {
		t.Errorf("%s: %d head point reads, %d reads of heads, %d generation point reads, %d reads of generations, %d views; want none but %d views", what, h, hs, g, m, v, views)
	}
	s.reset()
}

// A page of accounts of 500 distinct subjects under one "*" policy (one
// of them with a policy of its own) costs one read of heads, not one per
// subject: DecidingGenerations reads the page's heads in one
// store.PolicyHeads and no head by a point read; AccountsPage and
// AccountsInDebt read them with the accounts and the generations in one
// store.AccountsView a page, and nothing else. The
// deciding generations they say are the heads': the subject's own
// policy for the one that has it, the "*" policy for the others.
func TestAPageOfDistinctSubjectsReadsItsHeadsOnce(t *testing.T) {
	ctx := context.Background()
	st := &headCounting{Store: memstore.New()}
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1000, time.Minute, 0) // generation 1, "*"
	own := ledger.Policy{Key: ledger.PolicyKey{Subject: "u0007", Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 500, RefillUnits: 10, RefillInterval: time.Second}}}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &own}); err != nil || res.Err != nil {
		t.Fatalf("publish u0007's own: %v %v", err, res.Err)
	}
	const n = 500
	var accounts []ledger.Account
	var subjects []ledger.PolicyKey
	for i := range n {
		generation := uint64(1)
		if i == 7 {
			generation = 2
		}
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("u%04d", i), Route: "chat.generate", Region: "eu", Generation: generation},
			Dims: 1, EpochStart: t0, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 1000, Available: 100, Spent: 900}
		if i%10 == 0 { // in debt: overdraft drawn, none repaid
			a.Balances[0] = ledger.Balance{Opening: 1000, OverdraftIssued: 50, Spent: 1050}
		}
		a.RefilledTo[0] = t0.UnixNano()
		accounts = append(accounts, a)
		subjects = append(subjects, a.Key.SubjectKey())
	}
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{Accounts: accounts}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	checkDeciding := func(what string, deciding map[ledger.PolicyKey]uint64, want int) {
		t.Helper()
		if len(deciding) != want {
			t.Errorf("%s: %d subjects decided, want %d", what, len(deciding), want)
		}
		for subject, g := range deciding {
			if wantG := map[bool]uint64{true: 2, false: 1}[subject.Subject == "u0007"]; g != wantG {
				t.Errorf("%s: %s decided by %d, want %d", what, subject, g, wantG)
			}
		}
	}
	reads := func(what string, heads, gets int64) {
		t.Helper()
		if h, hs, g := st.head.Load(), st.heads.Load(), st.get.Load(); h != 0 || hs != heads || g > gets {
			t.Errorf("%s: %d head point reads, %d reads of heads, %d generation reads; want 0, %d, at most %d", what, h, hs, g, heads, gets)
		}
		st.reset()
	}

	st.reset()
	page, with, _, more, err := e.AccountsPage(ctx, store.AccountFilter{Limit: n + 1})
	deciding := with.deciding()
	if err != nil || len(page) != n || more {
		t.Fatalf("one page: %d accounts, more %v, %v", len(page), more, err)
	}
	checkDeciding("AccountsPage", deciding, n)
	st.viewReads(t, "a page of 500 subjects", 1)

	deciding, err = e.DecidingGenerations(ctx, subjects)
	if err != nil {
		t.Fatal(err)
	}
	checkDeciding("DecidingGenerations", deciding, n)
	reads("DecidingGenerations of 500 subjects", 1, 0)

	pages := int64(0)
	for after, more := (ledger.AccountKey{}), true; more; pages++ {
		page, with, after, more, err = e.AccountsPage(ctx, store.AccountFilter{After: after, Limit: 100})
		deciding = with.deciding()
		if err != nil {
			t.Fatal(err)
		}
		checkDeciding("a page of 100", deciding, len(page))
	}
	st.viewReads(t, fmt.Sprintf("%d pages of 100", pages), pages)

	debtors, _, _, _, err := e.AccountsInDebt(ctx, store.DebtFilter{Limit: 100}, nil)
	if err != nil || len(debtors) != n/10 {
		t.Fatalf("debtors: %d, %v; want %d", len(debtors), err, n/10)
	}
	st.viewReads(t, "a page of 50 debtors", 1)
}

// A page of accounts of 500 tenants, each under a policy of its own,
// costs one read of their generations, not a point read per tenant:
// DrainProgress (which also reads the generation deciding for each
// account's subject) reads a page's generations in one
// store.PoliciesOfGenerations and none by PolicyGet but the generation
// it is asked about; page by page, one read of generations per page.
// AccountsPage and AccountsInDebt read them with the accounts in one
// store.AccountsView a page.
func TestAPageOfTenantsWithAPolicyEachReadsItsGenerationsOnce(t *testing.T) {
	ctx := context.Background()
	st := &headCounting{Store: memstore.New()}
	clk := newClock()
	e := New(st, Options{Clock: clk.Now, DisableWorkers: true, PageSize: 100})
	defer e.Close()
	const n = 500
	dim := ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 10, RefillInterval: time.Second}
	// Generation 1 is the route's "*" policy, rolled back: each tenant's
	// own (generation i+2) decides, and every other tenant still has an
	// account under generation 1 to drain.
	star := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Generation: 1, Dimensions: []ledger.Dimension{dim}, RolledBack: true}.WithDefaults()
	changes := &store.Changes{Policies: []ledger.Policy{star}, Heads: []ledger.PolicyHead{{Key: star.Key, Latest: 1}}}
	for i := range n {
		subject := ledger.PolicyKey{Subject: fmt.Sprintf("u%04d", i), Route: "chat.generate", Region: "eu"}
		own := ledger.Policy{Key: subject, Generation: uint64(i + 2), Dimensions: []ledger.Dimension{dim}}.WithDefaults()
		changes.Policies = append(changes.Policies, own)
		changes.Heads = append(changes.Heads, ledger.PolicyHead{Key: subject, Active: own.Generation, Latest: own.Generation})
		for _, g := range []uint64{1, own.Generation} {
			if g == 1 && i%2 == 1 {
				continue
			}
			a := ledger.Account{Key: ledger.AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: g},
				Dims: 1, EpochStart: t0, Version: 1}
			a.Balances[0] = ledger.Balance{Opening: 1000, Available: 100, Spent: 900}
			if g != 1 && i%10 == 0 { // in debt: overdraft drawn, none repaid
				a.Balances[0] = ledger.Balance{Opening: 1000, OverdraftIssued: 50, Spent: 1050}
			}
			a.RefilledTo[0] = t0.UnixNano()
			changes.Accounts = append(changes.Accounts, a)
		}
	}
	writeBehindTheJournal(t, st, changes)
	reads := func(what string, gets, many int64) {
		t.Helper()
		if g, m := st.get.Load(), st.many.Load(); g != gets || m != many {
			t.Errorf("%s: %d generation point reads, %d reads of generations; want %d, %d", what, g, m, gets, many)
		}
		st.reset()
	}

	st.reset()
	page, with, _, more, err := e.AccountsPage(ctx, store.AccountFilter{Limit: len(changes.Accounts) + 1})
	deciding := with.deciding()
	if err != nil || len(page) != len(changes.Accounts) || more {
		t.Fatalf("one page: %d accounts, more %v, %v", len(page), more, err)
	}
	if len(deciding) != n || deciding[ledger.PolicyKey{Subject: "u0007", Route: "chat.generate", Region: "eu"}] != 9 {
		t.Errorf("deciding: %d subjects, u0007's %d; want %d, 9", len(deciding), deciding[ledger.PolicyKey{Subject: "u0007", Route: "chat.generate", Region: "eu"}], n)
	}
	st.viewReads(t, "a page of 750 accounts of 500 tenants", 1)

	pages := int64(0)
	for after, more := (ledger.AccountKey{}), true; more; pages++ {
		if _, _, after, more, err = e.AccountsPage(ctx, store.AccountFilter{After: after, Limit: 100}); err != nil {
			t.Fatal(err)
		}
	}
	st.viewReads(t, fmt.Sprintf("%d pages of 100", pages), pages)

	debtors, _, _, _, err := e.AccountsInDebt(ctx, store.DebtFilter{Limit: 100}, nil)
	if err != nil || len(debtors) != n/10 {
		t.Fatalf("debtors: %d, %v; want %d", len(debtors), err, n/10)
	}
	st.viewReads(t, "a page of 50 debtors", 1)

	drains, err := e.DrainProgress(ctx, []uint64{1})
	if err != nil || len(drains) != 1 || drains[0].Accounts != n/2 {
		t.Fatalf("drain progress of generation 1: %+v, %v; want %d accounts", drains, err, n/2)
	}
	// The generation asked about by a point read; then each page of 100
	// of its 250 accounts one read of their generation and the 100
	// generations deciding for their tenants.
	reads("drain progress of 250 accounts in pages of 100", 1, 3)
}
