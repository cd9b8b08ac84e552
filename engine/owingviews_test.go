package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// The views of a frozen subject (Accounts, AccountsInDebt, AccountsPage)
// show each account as the subject's next command finds it, through each
// store: with two accounts owing debt in units the deciding generation
// drops, after time passes without a command, each owing account's debt
// is shown reduced by its own repay-only refill and the current account
// as the ledger keeps it (once one owing account is repaid, the other
// made current), and a command that only brings the subject to now (a
// Refill of an owing account) then stores exactly the balances shown.
func TestViewsOfAFrozenSubjectShowWhatTheNextCommandStores(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			now := t0
			e := leadingEngine(t, st, Options{Clock: func() time.Time { return now }})
			key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
			must := func(cmd ledger.Command) { t.Helper(); mustDo(t, e, cmd) }
			publish := func(dims ...ledger.Dimension) {
				p := ledger.Policy{Key: key, Dimensions: dims}.WithDefaults()
				must(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
			}
			use := func(id string, reserved, used ledger.Amounts) func() {
				must(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
					Subject: key.Subject, Route: key.Route, Region: key.Region, Units: reserved})
				must(ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: "op-" + id})
				return func() {
					must(ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op-" + id, Units: used})
				}
			}
			tokens := ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 100, RefillInterval: time.Second, MaxOverdraft: 500}
			images := ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
			requests := ledger.Dimension{Unit: "requests", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
			publish(tokens, images) // generation 1
			settleA := use("a", ledger.Amounts{10, 1}, ledger.Amounts{10, 6})
			publish(tokens, requests) // generation 2
			settleB := use("b", ledger.Amounts{10, 1}, ledger.Amounts{10, 5})
			publish(tokens) // generation 3
			must(ledger.Command{Kind: ledger.KindReserve, ReservationID: "c", RequestDigest: "sha256:c",
				Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{10}})
			settleB() // generation 2 owes 3 requests
			settleA() // generation 1 owes 4 images: frozen

			debtOf := func(accounts []ledger.Account, generation uint64) ledger.Units {
				for _, a := range accounts {
					if a.Key.Generation == generation {
						return a.Balances[1].Debt()
					}
				}
				t.Fatalf("no account of generation %d in %v", generation, accounts)
				return 0
			}
			for _, step := range []struct {
				after            time.Duration
				images, requests ledger.Units // debt shown on generations 1 and 2
				debtors          int
			}{
				{2 * time.Second, 2, 1, 2}, // each repays at its own rate
				{time.Second, 1, 0, 1},     // generation 2 repaid: generation 1 made current
			} {
				now = now.Add(step.after)
				shown, err := e.Accounts(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if got1, got2 := debtOf(shown, 1), debtOf(shown, 2); got1 != step.images || got2 != step.requests {
					t.Errorf("after %s: shown debt %d images, %d requests; want %d, %d", step.after, got1, got2, step.images, step.requests)
				}
				inDebt, _, _, _, err := e.AccountsInDebt(ctx, store.DebtFilter{Limit: 10}, nil)
				if err != nil {
					t.Fatal(err)
				}
				page, _, _, _, err := e.AccountsPage(ctx, store.AccountFilter{Subject: key.Subject, Limit: 10})
				if err != nil {
					t.Fatal(err)
				}
				// A command that only brings the subject to now.
				must(ledger.Command{Kind: ledger.KindRefill, Account: ledger.AccountKey{Subject: key.Subject,
					Route: key.Route, Region: key.Region, Generation: 1}})
				stored, err := st.AccountList(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				var storedDebtors []ledger.Account
				for _, a := range stored {
					if owes, _ := a.Debt(); owes >= 0 {
						storedDebtors = append(storedDebtors, a)
					}
				}
				if len(storedDebtors) != step.debtors {
					t.Errorf("after %s: %d accounts owe as stored, want %d", step.after, len(storedDebtors), step.debtors)
				}
				sameAsStored(t, "Accounts after "+step.after.String(), shown, stored)
				sameAsStored(t, "AccountsPage after "+step.after.String(), page, stored)
				sameAsStored(t, "AccountsInDebt after "+step.after.String(), inDebt, storedDebtors)
			}
		})
	}
}

// sameAsStored compares the accounts a view showed with the rows stored
// after a command brought them to now: every field but Version (the
// command journals, a view does not).
func sameAsStored(t *testing.T, what string, shown, stored []ledger.Account) {
	t.Helper()
	if len(shown) != len(stored) {
		t.Errorf("%s: %d accounts shown, %d stored", what, len(shown), len(stored))
		return
	}
	for i := range shown {
		a, b := shown[i], stored[i]
		a.Version, b.Version = 0, 0
		if a != b {
			t.Errorf("%s: shown %+v\nstored %+v", what, a, b)
		}
	}
}
