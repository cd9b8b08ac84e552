package server_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/replicatest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/postgres"
	"github.com/capledger/capledger/store/storetest"
)

// fairnessBenchTenants is how many subjects, one account each under one
// "*" policy, benchOneStarPolicy's calls scan.
const fairnessBenchTenants = 20_000

// BenchmarkGetFairnessOneStarPolicy times GetFairness, each call a new
// question (its limit), over 20,000 tenants' accounts under one "*"
// policy (issue #15's shape: one policy, many tenants), on SQLite and,
// with CAPLEDGER_TEST_POSTGRES set, on PostgreSQL. Each scan reads the 20
// pages of 1,000 accounts and, per page, the policies it needs.
func BenchmarkGetFairnessOneStarPolicy(b *testing.B) {
	benchOneStarPolicy(b, func(h *harness, i int) {
		got := h.consoleOK("GetFairness", fmt.Sprintf(`{"limit":%d}`, 1+i%1000), consoleViewer)
		if g, _ := got["groups"].([]any); len(g) != 1 || num(g[0].(map[string]any)["subjectCount"]) != fairnessBenchTenants {
			b.Fatalf("fairness: %v", got["groups"])
		}
	})
}

// BenchmarkListAccountStandingsAllOneStarPolicy is the console's
// standings of every account (no filter), each call a new question (its
// limit), over the same 20,000 tenants.
func BenchmarkListAccountStandingsAllOneStarPolicy(b *testing.B) {
	benchOneStarPolicy(b, func(h *harness, i int) {
		got := h.consoleOK("ListAccountStandings", fmt.Sprintf(`{"limit":%d}`, 1+i%1000), consoleViewer)
		if num(got["matched"]) != fairnessBenchTenants {
			b.Fatalf("standings: matched %v", got["matched"])
		}
	})
}

// benchOneStarPolicy runs call b.N times per store over 20,000 tenants'
// accounts under one "*" policy (benchOverStores).
func benchOneStarPolicy(b *testing.B, call func(h *harness, i int)) {
	benchOverStores(b, func(h *harness, engineStore store.Store) {
		h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
		  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
		p, err := engineStore.PolicyGet(context.Background(), 1)
		if err != nil {
			b.Fatal(err)
		}
		for from := 0; from < fairnessBenchTenants; from += 2000 {
			var accounts []ledger.Account
			for i := from; i < from+2000; i++ {
				a := ledger.Account{Key: ledger.AccountKey{Subject: fmt.Sprintf("tenant-%06d", i), Route: p.Key.Route, Region: p.Key.Region, Generation: 1},
					Dims: 1, EpochStart: h.clock.Now(), Version: 1}
				a.Balances[0] = ledger.Balance{Opening: 100, Available: 100 - int64(i%50), Spent: int64(i % 50)}
				a.RefilledTo[0] = h.clock.Now().UnixNano()
				accounts = append(accounts, a)
			}
			storetest.Commit(b, engineStore, &store.Changes{Accounts: accounts})
		}
	}, call)
}

// benchOverStores runs call b.N times per store, after seed has written
// the tenants to the engine's store and one untimed call: SQLite (the
// harness's file), and with CAPLEDGER_TEST_POSTGRES set PostgreSQL (a
// fresh schema given to the engine; the harness's own SQLite file then
// holds only the server's rollouts and console tables).
func benchOverStores(b *testing.B, seed func(h *harness, engineStore store.Store), call func(h *harness, i int)) {
	benchOverWrappedStores(b, func(st store.Store) store.Store { return st }, seed, func(_ *testing.B, h *harness, i int) { call(h, i) })
}

// benchOverWrappedStores is benchOverStores with the engine's store
// wrapped by wrap (seed writes to the store unwrapped), call given the
// store's sub-benchmark.
func benchOverWrappedStores(b *testing.B, wrap func(store.Store) store.Store, seed func(h *harness, engineStore store.Store), call func(b *testing.B, h *harness, i int)) {
	for _, backend := range []string{"sqlite", "postgres"} {
		b.Run(backend, func(b *testing.B) {
			var engineStore store.Store
			opts := harnessOptions{auth: true, tokens: consoleTokens}
			if backend == "postgres" {
				if os.Getenv("CAPLEDGER_TEST_POSTGRES") == "" {
					b.Skip("CAPLEDGER_TEST_POSTGRES not set")
				}
				pg, err := postgres.Open(context.Background(), replicatest.SchemaDSN(b))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { pg.Close() })
				opts.wrapStore = func(store.Store) store.Store { engineStore = pg; return wrap(pg) }
			} else {
				opts.wrapStore = func(st store.Store) store.Store { engineStore = st; return wrap(st) }
			}
			h := newHarness(b, opts)
			seed(h, engineStore)
			call(b, h, 1000) // the server's policy cache takes in what it reads
			b.ResetTimer()
			for i := range b.N {
				call(b, h, i)
			}
		})
	}
}

// BenchmarkGetFairnessOfOneRoute times GetFairness of the embed route,
// each call a new question (its limit), over 100,000 accounts: 99,000
// tenants on chat.generate and 1,000 on embed, a "*" policy each, on
// SQLite and, with CAPLEDGER_TEST_POSTGRES set, on PostgreSQL. It
// reports the accounts the store returned per call (rows/op): the
// route's accounts where the route index is read, every account where
// each page of every account is filtered.
func BenchmarkGetFairnessOfOneRoute(b *testing.B) {
	benchOneRoute(b, func(b *testing.B, h *harness, limit int) {
		got := h.consoleOK("GetFairness", fmt.Sprintf(`{"route":"embed","limit":%d}`, limit), consoleViewer)
		if g, _ := got["groups"].([]any); len(g) != 1 || num(g[0].(map[string]any)["subjectCount"]) != routeBenchEmbed {
			b.Fatalf("fairness: %v", got["groups"])
		}
	})
}

// BenchmarkListAccountStandingsOfOneRoute is BenchmarkGetFairnessOfOneRoute
// for ListAccountStandings of the embed route (no subject), each call a
// new question (its limit).
func BenchmarkListAccountStandingsOfOneRoute(b *testing.B) {
	benchOneRoute(b, func(b *testing.B, h *harness, limit int) {
		got := h.consoleOK("ListAccountStandings", fmt.Sprintf(`{"route":"embed","limit":%d}`, limit), consoleViewer)
		if accounts, _ := got["accounts"].([]any); num(got["matched"]) != routeBenchEmbed || len(accounts) != min(limit, routeBenchEmbed) {
			b.Fatalf("standings: matched %v, %d accounts", got["matched"], len(accounts))
		}
	})
}

// routeBenchTenants and routeBenchEmbed are benchOneRoute's tenants and
// those of them on the embed route.
const routeBenchTenants, routeBenchEmbed = 100_000, 1_000

// benchOneRoute seeds routeBenchTenants accounts, a tenant each, every
// hundredth on embed (generation 2), the rest on chat.generate
// (generation 1), and runs call with a limit new each call (the warm-up's
// is 1), reporting the accounts the store returned per call (rows/op).
func benchOneRoute(b *testing.B, call func(b *testing.B, h *harness, limit int)) {
	rows := &pageRows{}
	var calls, read int
	benchOverWrappedStores(b, func(st store.Store) store.Store { rows.Store = st; return rows }, func(h *harness, engineStore store.Store) {
		h.http.Timeout = 10 * time.Minute // a scan of every account takes longer than the harness's 10 s under load
		for _, route := range []string{"chat.generate", "embed"} {
			h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"`+route+`",
			  "dimensions":[{"unit":"tokens","burst":"100","refillUnits":"10","refillInterval":"3600s"}]}}`, adminToken)
		}
		for from := 0; from < routeBenchTenants; from += 2000 {
			var accounts []ledger.Account
			for i := from; i < from+2000; i++ {
				key := ledger.AccountKey{Subject: fmt.Sprintf("tenant-%06d", i), Route: "chat.generate", Region: "global", Generation: 1}
				if i%(routeBenchTenants/routeBenchEmbed) == 0 {
					key.Route, key.Generation = "embed", 2
				}
				a := ledger.Account{Key: key, Dims: 1, EpochStart: h.clock.Now(), Version: 1}
				a.Balances[0] = ledger.Balance{Opening: 100, Available: 100 - int64(i%50), Spent: int64(i % 50)}
				a.RefilledTo[0] = h.clock.Now().UnixNano()
				accounts = append(accounts, a)
			}
			storetest.Commit(b, engineStore, &store.Changes{Accounts: accounts})
		}
	}, func(b *testing.B, h *harness, i int) {
		if i == 0 {
			rows.take()
			calls, read = 0, 0
		}
		// Each call a new question: the warm-up's (i 1000) limit is 1.
		limit := 2 + i%999
		if i == 1000 {
			limit = 1
		}
		call(b, h, limit)
		calls++
		read += len(rows.take())
		b.ReportMetric(float64(read)/float64(calls), "rows/op")
	})
}
