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

// headCounting counts the store's reads of policy heads and generations.
type headCounting struct {
	store.Store
	head, heads, get atomic.Int64
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

func (s *headCounting) reset() { s.head.Store(0); s.heads.Store(0); s.get.Store(0) }

// A page of accounts of 500 distinct subjects under one "*" policy (one
// of them with a policy of its own) costs one read of heads, not one per
// subject: AccountsPage, DecidingGenerations and AccountsInDebt read the
// page's heads in one store.PolicyHeads and no head by a point read, and
// each generation once; page by page, one read of heads per page. The
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
	page, deciding, _, more, err := e.AccountsPage(ctx, ledger.AccountKey{}, n+1)
	if err != nil || len(page) != n || more {
		t.Fatalf("one page: %d accounts, more %v, %v", len(page), more, err)
	}
	checkDeciding("AccountsPage", deciding, n)
	reads("a page of 500 subjects", 1, 2)

	deciding, err = e.DecidingGenerations(ctx, subjects)
	if err != nil {
		t.Fatal(err)
	}
	checkDeciding("DecidingGenerations", deciding, n)
	reads("DecidingGenerations of 500 subjects", 1, 0)

	pages := int64(0)
	for after, more := (ledger.AccountKey{}), true; more; pages++ {
		page, deciding, after, more, err = e.AccountsPage(ctx, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		checkDeciding("a page of 100", deciding, len(page))
	}
	reads(fmt.Sprintf("%d pages of 100", pages), pages, 2*pages)

	debtors, _, _, err := e.AccountsInDebt(ctx, store.DebtFilter{Limit: 100}, nil)
	if err != nil || len(debtors) != n/10 {
		t.Fatalf("debtors: %d, %v; want %d", len(debtors), err, n/10)
	}
	reads("a page of 50 debtors", 1, 2)
}
