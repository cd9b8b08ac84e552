package engine

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// shownView is what a read view shows of a subject: its accounts and,
// for AccountsPage and AccountsInDebt, what they were shown beside (the
// generation deciding for it, the accounts' policies).
type shownView struct {
	accounts []ledger.Account
	with     ShownWith
}

func (v shownView) String() string {
	s := fmt.Sprintf("deciding %v;", v.with.deciding())
	for _, a := range v.accounts {
		if p, ok := v.with.Policy(a.Key); ok {
			s += fmt.Sprintf(" %s policy %d rolled back %v;", a.Key, p.Generation, p.RolledBack)
		}
	}
	for _, a := range v.accounts {
		s += fmt.Sprintf(" %s v%d %+v;", a.Key, a.Version, a.Balances[0])
	}
	return s
}

// The read views (Accounts, AccountsPage, AccountsInDebt) of a frozen
// subject show numbers that stood together in one committed state: with
// a release of one of its holds and then a publish of generation 2 (burst
// 100, refill ten times faster) committed while a view reads
// (store.WithBetweenReads: after the view read the accounts), the view is
// the one before both, between them or after both, never generation 1's
// accounts as they stood before the release shown under generation 2
// deciding (a state that never existed). Each store.
func TestViewsReadOneSnapshotWhileAPublishCommits(t *testing.T) {
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	views := map[string]func(ctx context.Context, e *Engine) (shownView, error){
		"Accounts": func(ctx context.Context, e *Engine) (v shownView, err error) {
			v.accounts, err = e.Accounts(ctx, key)
			return v, err
		},
		"AccountsPage": func(ctx context.Context, e *Engine) (v shownView, err error) {
			v.accounts, v.with, _, _, err = e.AccountsPage(ctx, store.AccountFilter{Subject: key.Subject, Limit: 10})
			return v, err
		},
		"AccountsInDebt": func(ctx context.Context, e *Engine) (v shownView, err error) {
			v.accounts, v.with, _, _, err = e.AccountsInDebt(ctx, store.DebtFilter{Limit: 10}, nil)
			return v, err
		},
	}
	for name, open := range withPostgres(memstoreAndSQLite) {
		for viewName, view := range views {
			t.Run(name+"/"+viewName, func(t *testing.T) {
				ctx := context.Background()
				now := t0
				e := leadingEngine(t, open(t), Options{Clock: func() time.Time { return now }})
				must := func(cmd ledger.Command) { t.Helper(); mustDo(t, e, cmd) }
				publish := func(burst, refill ledger.Units) {
					p := ledger.Policy{Key: key, HoldTTL: time.Hour, Dimensions: []ledger.Dimension{
						{Unit: "tokens", Burst: burst, RefillUnits: refill, RefillInterval: time.Second, MaxOverdraft: 500}}}.WithDefaults()
					must(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
				}
				reserve := func(id string, units ledger.Units) {
					must(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
						Subject: key.Subject, Route: key.Route, Region: key.Region, Units: ledger.Amounts{units}})
				}
				read := func(ctx context.Context) shownView {
					t.Helper()
					v, err := view(ctx, e)
					if err != nil {
						t.Fatal(err)
					}
					return v
				}
				publish(1000, 10) // generation 1
				reserve("a", 100)
				reserve("b", 100)
				must(ledger.Command{Kind: ledger.KindStart, ReservationID: "a", OperationID: "op-a"})
				// 100 from the hold, 800 from available, 100 owed: frozen.
				must(ledger.Command{Kind: ledger.KindSettle, ReservationID: "a", OperationID: "op-a", Units: ledger.Amounts{1000}})
				now = now.Add(5 * time.Second)

				before := read(ctx)
				if len(before.accounts) != 1 {
					t.Fatalf("before: %v; want generation 1's account, owing", before)
				}
				var between shownView
				hooks := 0
				got := read(store.WithBetweenReads(ctx, func() {
					if hooks++; hooks > 1 {
						return
					}
					must(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"})
					between = read(ctx)
					publish(100, 100) // generation 2
				}))
				if hooks != 1 {
					t.Fatalf("the hook between the view's reads ran %d times, want once", hooks)
				}
				after := read(ctx)
				for _, v := range []shownView{before, between, after} {
					if reflect.DeepEqual(got, v) {
						return
					}
				}
				t.Errorf("read while a release and a publish committed:\n %v\nnot before:\n %v\nbetween:\n %v\nnor after:\n %v",
					got, before, between, after)
			})
		}
	}
}
