package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/storetest"
)

// BenchmarkGetFairnessPolicyPerTenant times GetFairness, each call a new
// question (its limit), over 20,000 tenants' accounts, each tenant under
// a policy of its own (a platform with a policy per tenant), on SQLite
// and, with CAPLEDGER_TEST_POSTGRES set, on PostgreSQL: per page of 1,000
// accounts, 1,000 generations to read.
func BenchmarkGetFairnessPolicyPerTenant(b *testing.B) {
	benchPolicyPerTenant(b, func(h *harness, i int) {
		got := h.consoleOK("GetFairness", fmt.Sprintf(`{"limit":%d}`, 1+i%1000), consoleViewer)
		if g, _ := got["groups"].([]any); len(g) != 1 || num(g[0].(map[string]any)["subjectCount"]) != fairnessBenchTenants {
			b.Fatalf("fairness: %v", got["groups"])
		}
	})
}

// BenchmarkListAccountStandingsAllPolicyPerTenant is the console's
// standings of every account, each call a new question, over the same
// 20,000 tenants with a policy each.
func BenchmarkListAccountStandingsAllPolicyPerTenant(b *testing.B) {
	benchPolicyPerTenant(b, func(h *harness, i int) {
		got := h.consoleOK("ListAccountStandings", fmt.Sprintf(`{"limit":%d}`, 1+i%1000), consoleViewer)
		if num(got["matched"]) != fairnessBenchTenants {
			b.Fatalf("standings: matched %v", got["matched"])
		}
	})
}

// benchPolicyPerTenant runs call b.N times per store over 20,000 tenants,
// each with a policy of its own and one account under it, written to the
// engine's store directly (benchOverStores; the server's cache learns
// them from the untimed first call).
func benchPolicyPerTenant(b *testing.B, call func(h *harness, i int)) {
	benchOverStores(b, func(h *harness, engineStore store.Store) {
		now := h.clock.Now()
		for from := 0; from < fairnessBenchTenants; from += 2000 {
			changes := &store.Changes{}
			for i := from; i < from+2000; i++ {
				key := ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%06d", i), Route: "chat.generate", Region: "default"}
				p := ledger.Policy{Key: key, Generation: uint64(i + 1), FairnessWeight: 1, PublishedAt: now,
					Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: time.Hour}}}.WithDefaults()
				changes.Policies = append(changes.Policies, p)
				changes.Heads = append(changes.Heads, ledger.PolicyHead{Key: key, Active: p.Generation, Latest: p.Generation})
				a := ledger.Account{Key: ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: p.Generation},
					Dims: 1, EpochStart: now, Version: 1}
				a.Balances[0] = ledger.Balance{Opening: 100, Available: 100 - int64(i%50), Spent: int64(i % 50)}
				a.RefilledTo[0] = now.UnixNano()
				changes.Accounts = append(changes.Accounts, a)
			}
			storetest.Commit(b, engineStore, changes)
		}
	}, call)
}
