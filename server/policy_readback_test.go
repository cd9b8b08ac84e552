package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// headHookStore runs a hook before the next read of one policy head
// (store.Store.PolicyHead), once.
type headHookStore struct {
	store.Store
	hook atomic.Pointer[func()]
}

func (s *headHookStore) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	if f := s.hook.Swap(nil); f != nil {
		(*f)()
	}
	return s.Store.PolicyHead(ctx, key)
}

// GetPolicy and PublishPolicy's answer show a generation's active and
// rolledBack as they stood together: with a rollback of the generation
// committed between the server's read of the policy and of its key's
// head, the answer is active and not rolled back (before) or rolled back
// and not active (after), never neither (a state the active generation
// never was in). Each store (PostgreSQL with CAPLEDGER_TEST_POSTGRES).
func TestPolicyAnswersShowActiveAndRolledBackTogether(t *testing.T) {
	const policy = `{"policy":{"subject":"tenant-7","route":"chat.generate","region":"eu",
	  "dimensions":[{"unit":"tokens","burst":"%s","refillUnits":"10","refillInterval":"1s"}]}}`
	key := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	stores := map[string]harnessOptions{"memstore": {faults: true}, "sqlite": {}, "postgres": {postgres: true}}
	for storeName, opts := range stores {
		for _, method := range []string{"GetPolicy", "PublishPolicy"} {
			t.Run(storeName+"/"+method, func(t *testing.T) {
				var hooked *headHookStore
				opts := opts
				opts.auth = true
				opts.wrapStore = func(st store.Store) store.Store {
					hooked = &headHookStore{Store: st}
					return hooked
				}
				h := newHarness(t, opts)
				h.ok("PublishPolicy", fmtPolicy(policy, "100"), adminToken) // generation 1
				rollback := func() {
					res, err := h.engine.Do(context.Background(), ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: key, Generation: 2})
					if err == nil {
						err = res.Err
					}
					if err != nil {
						t.Fatalf("rollback of generation 2: %v", err)
					}
				}
				hooks := 0
				hook := func() { hooks++; rollback() }
				var got map[string]any
				if method == "GetPolicy" {
					h.ok("PublishPolicy", fmtPolicy(policy, "200"), adminToken) // generation 2
					hooked.hook.Store(&hook)
					got = h.ok("GetPolicy", `{"generation":"2"}`, adminToken)["policy"].(map[string]any)
				} else {
					hooked.hook.Store(&hook)
					got = h.ok("PublishPolicy", fmtPolicy(policy, "200"), adminToken)["policy"].(map[string]any)
				}
				if hooks != 1 {
					t.Fatalf("the hook before the head's read ran %d times, want once", hooks)
				}
				active, rolledBack := got["active"] == true, got["rolledBack"] == true
				if active == rolledBack {
					t.Errorf("%s of generation 2 while its rollback committed: active %v, rolledBack %v; want one of them",
						method, active, rolledBack)
				}
			})
		}
	}
}

func fmtPolicy(format, burst string) string {
	return fmt.Sprintf(format, burst)
}
