package ledger_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
)

// An audit whose snapshot gives the policies through PoliciesOf (a store's,
// with a policy per tenant) reads those of a page of accounts at a time,
// each generation once, never every policy at once, and finds what it
// finds with Policies in memory, in the same order: each account's burst
// findings after its conservation ones, before the next account's.
func TestAuditReadsPoliciesAPageOfAccountsAtATime(t *testing.T) {
	const tenants = 1000
	var policies []ledger.Policy
	var accounts []ledger.Account
	for i := range tenants {
		g := uint64(i + 1)
		key := ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%04d", i), Route: "chat", Region: "eu"}
		policies = append(policies, ledger.Policy{Key: key, Generation: g,
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100}, {Unit: "requests", Burst: 10}}})
		a := ledger.Account{Key: ledger.AccountKey{Subject: key.Subject, Route: key.Route, Region: key.Region, Generation: g}, Dims: 2}
		a.Balances[0] = ledger.Balance{Opening: 100, Available: 100}
		a.Balances[1] = ledger.Balance{Opening: 10, Available: 10}
		if i%7 == 0 { // above the burst
			a.Balances[0].Opening, a.Balances[0].Available = 105, 105
		}
		if i%11 == 0 { // created from nothing, and above the burst in both
			a.Balances[0].Available++
			a.Balances[1].Available++
		}
		accounts = append(accounts, a)
	}
	want := ledger.Audit(&ledger.Snapshot{Policies: policies, Accounts: accounts})
	checks := map[string]int{}
	for _, d := range want {
		checks[d.Check]++
	}
	if checks[ledger.CheckBurst] == 0 || checks[ledger.CheckConservation] == 0 {
		t.Fatalf("the ledger was meant to break both checks: %v", checks)
	}

	byGeneration := map[uint64]ledger.Policy{}
	for _, p := range policies {
		byGeneration[p.Generation] = p
	}
	asked := map[uint64]int{}
	most := 0
	snap := &ledger.Snapshot{Accounts: accounts, PoliciesOf: func(generations []uint64) (map[uint64]ledger.Policy, error) {
		most = max(most, len(generations))
		out := map[uint64]ledger.Policy{}
		for _, g := range generations {
			asked[g]++
			out[g] = byGeneration[g]
		}
		return out, nil
	}}
	got := ledger.Audit(snap)
	if !slices.Equal(got, want) {
		t.Errorf("with PoliciesOf the audit found %d:\n%v\nwith Policies %d:\n%v", len(got), got, len(want), want)
	}
	if most > 256 {
		t.Errorf("the audit asked for %d policies at once, want at most 256 (a page of accounts')", most)
	}
	if len(asked) != tenants {
		t.Errorf("the audit asked for %d generations, want every account's: %d", len(asked), tenants)
	}
	for g, n := range asked {
		if n != 1 {
			t.Errorf("generation %d asked for %d times, want once", g, n)
		}
	}

	// A read that fails is a finding: no checkpoint is cut on it.
	snap.PoliciesOf = func([]uint64) (map[uint64]ledger.Policy, error) { return nil, errors.New("disk on fire") }
	failed := false
	for _, d := range ledger.Audit(snap) {
		failed = failed || strings.Contains(d.Detail, "policies could not be read whole: disk on fire")
	}
	if !failed {
		t.Error("a failed read of the policies was not reported")
	}
}
