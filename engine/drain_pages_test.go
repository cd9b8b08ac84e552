package engine

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// policyPageStore records the policy reads of a drain pass: how many
// policies each PolicyPage returned, and the reads of every policy at
// once (PolicyList).
type policyPageStore struct {
	store.Store
	mu    sync.Mutex
	pages []int
	lists int
}

func (s *policyPageStore) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	out, err := s.Store.PolicyPage(ctx, f)
	s.mu.Lock()
	s.pages = append(s.pages, len(out))
	s.mu.Unlock()
	return out, err
}

func (s *policyPageStore) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	s.mu.Lock()
	s.lists++
	s.mu.Unlock()
	return s.Store.PolicyList(ctx)
}

// taken returns the pages and full reads recorded since the last call.
func (s *policyPageStore) taken() (pages []int, lists int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pages, lists = s.pages, s.lists
	s.pages, s.lists = nil, 0
	return pages, lists
}

// A drain pass reads the policies a page of at most policyPage at a
// time (a pass after a change read every policy at once: about 290 MB at
// 900,000 policies), and finds what one read of every policy finds
// (newDrainView over PolicyList): the same superseded generations in the
// same order, the same points, rolled-back and refilling generations,
// newest generation and digest of the active ones. The policies: more
// than two pages of tenants, some republished, some rolled back (one of
// them down to none), a "*" policy per route, one of them republished and
// one rolled back, so that points, superseded "*" generations and keys
// without an active generation all occur.
func TestDrainPassReadsPoliciesAPageAtATime(t *testing.T) {
	for name, open := range withPostgres(memstoreAndSQLite) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := &policyPageStore{Store: open(t)}
			clk := newClock()
			core := New(st, Options{DisableWorkers: true, Clock: clk.Now}).core
			rnd := rand.New(rand.NewPCG(15, 1))
			routes := []string{"chat", "embed", "rank"}
			publish := func(subject, route string, refills bool) uint64 {
				d := ledger.Dimension{Unit: "tokens", Burst: 100}
				if refills {
					d.RefillUnits, d.RefillInterval = 1, ledger.MinRefillInterval
				}
				p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: route, Region: "eu"}, Dimensions: []ledger.Dimension{d}}.WithDefaults()
				results, err := core.Commit(ctx, []ledger.Command{{Kind: ledger.KindPublishPolicy, Policy: &p}}, clk.Now())
				if err != nil || results[0].Err != nil {
					t.Fatalf("publish %s: %v, %v", p.Key, err, results[0].Err)
				}
				return results[0].Generation
			}
			rollback := func(subject, route string, g uint64) {
				commitAlone(t, core, clk.Now(), ledger.Command{Kind: ledger.KindRollbackPolicy,
					PolicyKey: ledger.PolicyKey{Subject: subject, Route: route, Region: "eu"}, Generation: g})
			}
			for _, route := range routes[:2] {
				publish(ledger.AnySubject, route, false)
			}
			const tenants = 2*policyPage + 300
			for i := range tenants {
				subject, route := fmt.Sprintf("tenant-%05d", i), routes[i%len(routes)]
				g := publish(subject, route, rnd.IntN(2) == 0)
				switch rnd.IntN(10) {
				case 0:
					publish(subject, route, rnd.IntN(2) == 0)
				case 1:
					g2 := publish(subject, route, true)
					rollback(subject, route, g2)
				case 2:
					rollback(subject, route, g)
				}
			}
			publish(ledger.AnySubject, "chat", true)
			rollback(ledger.AnySubject, "embed", publish(ledger.AnySubject, "embed", true))
			publish(ledger.AnySubject, "rank", false)
			st.taken()

			policies, err := st.Store.PolicyList(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := newDrainView(policies, true)
			for _, known := range []*DrainPolicies{nil, {}} {
				got, err := core.drainView(ctx, known, true)
				if err != nil {
					t.Fatal(err)
				}
				pages, lists := st.taken()
				if lists != 0 {
					t.Fatalf("the pass read every policy at once %d times, want none", lists)
				}
				if read := sum(pages); read != len(policies) || len(pages) < len(policies)/policyPage {
					t.Fatalf("the pass read %d policies in %d pages %v, want all %d in pages of at most %d", read, len(pages), pages, len(policies), policyPage)
				}
				for _, n := range pages {
					if n > policyPage {
						t.Fatalf("a page of %d policies, want at most %d (pages %v)", n, policyPage, pages)
					}
				}
				if len(want.superseded) < 100 || len(want.points) < 100 || len(want.rolledBack) < 100 || len(want.refills) < 50 {
					t.Fatalf("the policies make %d superseded, %d points, %d rolled back and %d refilling: too few to compare",
						len(want.superseded), len(want.points), len(want.rolledBack), len(want.refills))
				}
				if !slices.Equal(got.superseded, want.superseded) {
					t.Fatalf("superseded %d generations, want %d (the full read's, in its order)", len(got.superseded), len(want.superseded))
				}
				sortKeys := func(keys []ledger.AccountKey) []ledger.AccountKey {
					return slices.SortedFunc(slices.Values(keys), func(a, b ledger.AccountKey) int { return strings.Compare(a.String(), b.String()) })
				}
				if !slices.Equal(sortKeys(got.points), sortKeys(want.points)) {
					t.Fatalf("points %d, want the full read's %d", len(got.points), len(want.points))
				}
				if got.newest != want.newest || !maps.Equal(got.rolledBack, want.rolledBack) || !maps.Equal(got.refills, want.refills) {
					t.Fatalf("newest %d, %d rolled back, %d refilling; want %d, %d, %d",
						got.newest, len(got.rolledBack), len(got.refills), want.newest, len(want.rolledBack), len(want.refills))
				}
				if got.digest != want.digest {
					t.Fatalf("digest of the active generations %+v, want the full read's %+v", got.digest, want.digest)
				}
			}
		})
	}
}

func sum(ns []int) int {
	total := 0
	for _, n := range ns {
		total += n
	}
	return total
}
