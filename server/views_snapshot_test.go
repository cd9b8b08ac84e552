package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// viewHookStore runs a hook between the reads of the next view the
// engine reads (store.WithBetweenReads in store.Store.AccountsView's
// context), once.
type viewHookStore struct {
	store.Store
	hook atomic.Pointer[func()]
}

func (s *viewHookStore) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	if f := s.hook.Swap(nil); f != nil {
		ctx = store.WithBetweenReads(ctx, *f)
	}
	return s.Store.AccountsView(ctx, subjects)
}

// ListAccountStandings, with inDebt and ranking every account, shows
// each account's active and rolledBack marks as they stood with its
// balances: with a release of one of a frozen subject's holds and then a
// publish (a new generation decides) or a rollback (the deciding one is
// rolled back) committed while the engine's view reads
// (store.WithBetweenReads), the answer is the one before both, between
// them or after both, never the balances from before the release beside
// the heads or policies from after the publish or rollback (a state that
// never existed). Each store (PostgreSQL with CAPLEDGER_TEST_POSTGRES).
func TestStandingsShowMarksTheirBalancesStoodWith(t *testing.T) {
	const subject = `"subject":"tenant-7","route":"chat.generate","region":"eu"`
	publish := func(h *harness, burst, refill int) {
		h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{%s,"holdTtl":"3600s",
		  "dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"%d","refillInterval":"1s","maxOverdraft":"500"}]}}`,
			subject, burst, refill), adminToken)
	}
	changes := map[string]struct {
		// setup publishes the generation the subject's debt is in; change
		// is what commits, after the release, while the view reads.
		setup, change func(h *harness)
	}{
		"publish": {
			setup:  func(h *harness) { publish(h, 1000, 10) },
			change: func(h *harness) { publish(h, 100, 100) },
		},
		"rollback": {
			setup:  func(h *harness) { publish(h, 50, 1); publish(h, 1000, 10) },
			change: func(h *harness) { h.ok("RollbackPolicy", `{"generation":"2"}`, adminToken) },
		},
	}
	stores := map[string]harnessOptions{"memstore": {faults: true}, "sqlite": {}, "postgres": {postgres: true}}
	requests := map[string]string{"inDebt": `"inDebt":true`, "ranking": `"subjectContains":"tenant"`}
	for storeName, opts := range stores {
		for changeName, change := range changes {
			for requestName, request := range requests {
				t.Run(storeName+"/"+changeName+"/"+requestName, func(t *testing.T) {
					var hooked *viewHookStore
					opts := opts
					opts.auth, opts.tokens = true, consoleTokens
					opts.wrapStore = func(st store.Store) store.Store {
						hooked = &viewHookStore{Store: st}
						return hooked
					}
					h := newHarness(t, opts)
					change.setup(h)
					do := func(cmd ledger.Command) {
						t.Helper()
						cmd.Subject, cmd.Route, cmd.Region = "tenant-7", "chat.generate", "eu"
						res, err := h.engine.Do(context.Background(), cmd)
						if err == nil {
							err = res.Err
						}
						if err != nil {
							t.Fatalf("%s %s: %v", cmd.Kind, cmd.ReservationID, err)
						}
					}
					for _, id := range []string{"a", "b"} {
						do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id, Units: ledger.Amounts{100}})
					}
					do(ledger.Command{Kind: ledger.KindStart, ReservationID: "a", OperationID: "op-a"})
					// 100 from the hold, 800 from available, 100 owed: frozen.
					do(ledger.Command{Kind: ledger.KindSettle, ReservationID: "a", OperationID: "op-a", Units: ledger.Amounts{1000}})
					h.clock.Advance(5 * time.Second)

					// Each read asks a limit of its own, so none is given the
					// ranking another read shared (they all match fewer).
					read := func(limit int) string {
						t.Helper()
						got := h.consoleOK("ListAccountStandings", fmt.Sprintf(`{%s,"limit":%d}`, request, limit), consoleViewer)
						raw, err := json.Marshal(got["accounts"])
						if err != nil {
							t.Fatal(err)
						}
						return string(raw)
					}
					before := read(20)
					var between string
					hooks := 0
					hook := func() {
						hooks++
						do(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"})
						between = read(19)
						change.change(h)
					}
					hooked.hook.Store(&hook)
					got := read(18)
					if hooks != 1 {
						t.Fatalf("the hook between the view's reads ran %d times, want once", hooks)
					}
					after := read(17)
					for _, v := range []string{before, between, after} {
						if got == v {
							return
						}
					}
					t.Errorf("read while a release and a %s committed:\n %s\nnot before:\n %s\nbetween:\n %s\nnor after:\n %s",
						changeName, got, before, between, after)
				})
			}
		}
	}
}
