// Command debtlist measures one ListDebts page (engine.AccountsInDebt, a
// page of 100, what `capledger debts` and the console's Debts page ask
// for) over a SQLite or PostgreSQL store of many accounts of which some
// owe (docs/PERFORMANCE.md, "A million tenants"). It fills the store when
// the file does not exist, or the PostgreSQL schema holds no policy
// (accounts written directly, in transactions of 5,000), then times
// -calls calls and prints the median and the fastest, then the same for
// the store's own page (store.AccountsInDebt, what the engine's call
// starts from).
//
// Usage: go run ./scripts/debtlist -db /tmp/debtlist/ledger.db -accounts 100000 -debtors 5
//
//	go run ./scripts/debtlist -store 'postgres://...' -accounts 200000 -debtors 50000
//
// Build it from two trees to compare them; a newer binary opening an older
// tree's file or schema migrates it first (the time Open took is printed).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/sqlite"
)

func main() {
	path := flag.String("db", "", "SQLite file (filled when absent)")
	dsn := flag.String("store", "", "or a PostgreSQL DSN (filled when it holds no policy)")
	accounts := flag.Int("accounts", 100000, "accounts to fill")
	debtors := flag.Int("debtors", 5, "of them in debt, spread evenly")
	calls := flag.Int("calls", 20, "ListDebts calls timed")
	flag.Parse()
	if (*path == "") == (*dsn == "") {
		log.Fatal("one of -db and -store is required")
	}
	ctx := context.Background()
	var (
		st    store.Store
		empty bool
		err   error
	)
	opened := time.Now()
	if *path != "" {
		_, statErr := os.Stat(*path)
		empty = os.IsNotExist(statErr)
		st, err = sqlite.Open(ctx, *path)
	} else {
		st, err = postgres.Open(ctx, *dsn)
	}
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	openTook := time.Since(opened)
	e := engine.New(st, engine.Options{DisableWorkers: true})
	defer e.Close()
	if *dsn != "" {
		policies, err := e.Policies(ctx)
		if err != nil {
			log.Fatal(err)
		}
		empty = len(policies) == 0
	}
	if empty {
		if err := fill(ctx, e, st, *accounts, *debtors); err != nil {
			log.Fatal(err)
		}
	}
	var took []time.Duration
	shown := 0
	for range *calls {
		start := time.Now()
		page, _, _, _, err := e.AccountsInDebt(ctx, store.DebtFilter{Limit: 100}, nil)
		took = append(took, time.Since(start))
		if err != nil {
			log.Fatal(err)
		}
		shown = len(page)
	}
	slices.Sort(took)
	fmt.Printf("open %v; ListDebts page of 100: %d debtors shown, median %v, fastest %v over %d calls\n",
		openTook.Round(time.Millisecond), shown, took[len(took)/2], took[0], len(took))
	// The store's share: its page of the rows that owed at their last
	// command (the engine then reads each one's subject for its refill).
	took = took[:0]
	for range *calls {
		start := time.Now()
		page, err := st.AccountsInDebt(ctx, store.DebtFilter{Limit: 100})
		took = append(took, time.Since(start))
		if err != nil {
			log.Fatal(err)
		}
		shown = len(page)
	}
	slices.Sort(took)
	fmt.Printf("store page of 100: %d rows, median %v, fastest %v over %d calls\n", shown, took[len(took)/2], took[0], len(took))
}

// fill publishes one policy for every subject and writes n accounts of
// it, debtors of them in debt, each refilled up to now (so refill does not
// repay the debt shown).
func fill(ctx context.Context, e *engine.Engine, st store.Store, n, debtors int) error {
	p := ledger.Policy{
		Key:        ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: time.Hour}},
		HoldTTL:    time.Minute,
	}.WithDefaults()
	if res, err := e.Do(ctx, ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		return fmt.Errorf("publish: %v %v", err, res.Err)
	}
	policies, err := e.Policies(ctx)
	if err != nil {
		return err
	}
	generation := policies[len(policies)-1].Generation
	now := time.Now()
	every := n / max(debtors, 1)
	var batch []ledger.Account
	for i := range n {
		a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%07d", i), Route: "chat.generate",
			Region: "eu", Generation: generation}, Dims: 1, EpochStart: now, Version: 1}
		a.Balances[0] = ledger.Balance{Opening: 1000, Available: 1000}
		if debtors > 0 && i%every == every/2 {
			a.Balances[0] = ledger.Balance{Opening: 1000, OverdraftIssued: 500, Spent: 1500}
		}
		a.RefilledTo[0] = now.UnixNano()
		batch = append(batch, a)
		if len(batch) == 5000 || i == n-1 {
			tx, err := st.Begin(ctx)
			if err != nil {
				return err
			}
			if err := tx.Write(ctx, &store.Changes{Accounts: batch}); err != nil {
				tx.Rollback(ctx)
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}
