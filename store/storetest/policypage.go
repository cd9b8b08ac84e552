package storetest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// testPolicyPage checks PolicyPage: following the last generation of each
// page visits every generation the filters select exactly once, oldest
// first, whatever the page size, each marked active exactly when its
// key's head names it; each filter matches exactly (the wildcard subject
// "*" selects its own policies only); Limit <= 0 is an error and a cursor
// past every generation (also above math.MaxInt64) an empty page.
func testPolicyPage(t *testing.T, s store.Store) {
	ctx := context.Background()
	base := fixturePolicies()[1]
	subjects := []string{"tenant-a", "tenant-b", ledger.AnySubject, "tenant-a/team-1"}
	routes := []string{"chat", "embed", "chat.generate"}
	regions := []string{"eu", "us"}
	var all []ledger.Policy
	heads := map[ledger.PolicyKey]*ledger.PolicyHead{}
	for g := uint64(1); g <= 41; g++ {
		p := base
		p.Generation = g
		p.Key = ledger.PolicyKey{Subject: subjects[g%4], Route: routes[g%3], Region: regions[g%2]}
		p.RolledBack = g%5 == 0 || p.Key.Subject == "tenant-b" && p.Key.Route == "embed" // a key with none active
		all = append(all, p)
		h := heads[p.Key]
		if h == nil {
			h = &ledger.PolicyHead{Key: p.Key}
			heads[p.Key] = h
		}
		h.Latest = g
		if !p.RolledBack {
			h.Active = g
		}
	}
	written := slices.Clone(all)
	slices.Reverse(written) // insertion order is not the answer
	changes := &store.Changes{Policies: written}
	for _, h := range heads {
		changes.Heads = append(changes.Heads, *h)
	}
	Commit(t, s, changes)
	listed := func(p ledger.Policy) store.ListedPolicy {
		return store.ListedPolicy{Policy: p, Active: heads[p.Key].Active == p.Generation}
	}
	actives := 0
	for _, p := range all {
		if listed(p).Active {
			actives++
		}
	}
	if actives < 5 || actives == len(all) {
		t.Fatalf("the fixture has %d active generations of %d", actives, len(all))
	}

	filters := []store.PolicyFilter{{}, {Subject: "tenant-a"}, {Subject: ledger.AnySubject}, {Route: "chat"},
		{Region: "us"}, {Subject: "tenant-b", Route: "embed"}, {Subject: "tenant-a/team-1", Route: "chat.generate", Region: "eu"},
		{Subject: "tenant-"}, {Subject: "nobody"}}
	for _, f := range filters {
		var want []store.ListedPolicy
		for _, p := range all {
			if (f.Subject == "" || f.Subject == p.Key.Subject) && (f.Route == "" || f.Route == p.Key.Route) &&
				(f.Region == "" || f.Region == p.Key.Region) {
				want = append(want, listed(p))
			}
		}
		for _, limit := range []int{1, 2, 7, 41, 100} {
			name := fmt.Sprintf("filter %+v limit %d", f, limit)
			var got []store.ListedPolicy
			page := f
			page.Limit = limit
			for pages := 0; ; pages++ {
				if pages > len(all)+1 {
					t.Fatalf("%s: more pages than generations", name)
				}
				rows, err := s.PolicyPage(ctx, page)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if len(rows) > limit {
					t.Fatalf("%s: a page of %d", name, len(rows))
				}
				got = append(got, rows...)
				if len(rows) < limit {
					break
				}
				page.After = rows[len(rows)-1].Policy.Generation
			}
			same(t, name, got, want)
		}
	}

	for _, limit := range []int{0, -1} {
		if _, err := s.PolicyPage(ctx, store.PolicyFilter{Limit: limit}); err == nil {
			t.Errorf("policy page of limit %d: no error", limit)
		}
	}
	for _, after := range []uint64{41, 1 << 40, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
		if got, err := s.PolicyPage(ctx, store.PolicyFilter{After: after, Limit: 10}); err != nil || len(got) != 0 {
			t.Errorf("policies after %d: %v, %v; want none", after, got, err)
		}
	}
	// A page reads what committed before it: a generation published
	// after the previous page is on the next one, active, and its key's
	// generation before it is no longer.
	later := base
	later.Generation, later.Key = 42, ledger.PolicyKey{Subject: "tenant-a", Route: "chat.generate", Region: "eu"}
	before := heads[later.Key].Active
	if before == 0 {
		t.Fatalf("the fixture has no active generation of %v", later.Key)
	}
	heads[later.Key].Active, heads[later.Key].Latest = 42, 42
	Commit(t, s, &store.Changes{Policies: []ledger.Policy{later}, Heads: []ledger.PolicyHead{*heads[later.Key]}})
	got, err := s.PolicyPage(ctx, store.PolicyFilter{Subject: "tenant-a", After: 41, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	same(t, "the generation published since", got, []store.ListedPolicy{{Policy: later, Active: true}})
	got, err = s.PolicyPage(ctx, store.PolicyFilter{Subject: "tenant-a", Route: "chat.generate", Region: "eu", After: before - 1, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	same(t, "the generation active before", got, []store.ListedPolicy{{Policy: all[before-1]}})
}
