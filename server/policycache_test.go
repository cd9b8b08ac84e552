package server

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// policyRows is a Ledger whose policies are a slice the test edits (the
// policy cache reads only Policies and Policy).
type policyRows struct {
	Ledger
	rows  []ledger.Policy
	reads int // Policy calls
	// afterRows counts the rows PoliciesPage returned.
	afterRows int
}

func (l *policyRows) Policies(context.Context) ([]ledger.Policy, error) {
	return append([]ledger.Policy(nil), l.rows...), nil
}

// PoliciesPage returns up to f.Limit rows newer than f.After (the rows
// are in generation order), each with whether its key's head names it
// active. The cache reads no other filter.
func (l *policyRows) PoliciesPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	var out []store.ListedPolicy
	for _, p := range l.rows {
		if p.Generation > f.After && len(out) < f.Limit {
			h, _ := l.PolicyHead(ctx, p.Key)
			out = append(out, store.ListedPolicy{Policy: p, Active: h.Active == p.Generation})
		}
	}
	l.afterRows += len(out)
	return out, nil
}

// PolicyHead is the key's head as the ledger keeps it: the newest
// generation, and the newest not rolled back (0 for none).
func (l *policyRows) PolicyHead(_ context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	h := ledger.PolicyHead{Key: key}
	for _, p := range l.rows {
		if p.Key != key {
			continue
		}
		h.Latest = max(h.Latest, p.Generation)
		if !p.RolledBack {
			h.Active = max(h.Active, p.Generation)
		}
	}
	if h.Latest == 0 {
		return h, store.ErrNotFound
	}
	return h, nil
}

func (l *policyRows) Policy(_ context.Context, generation uint64) (ledger.Policy, error) {
	l.reads++
	for _, p := range l.rows {
		if p.Generation == generation {
			return p, nil
		}
	}
	return ledger.Policy{}, store.ErrNotFound
}

func (l *policyRows) publish(key ledger.PolicyKey) uint64 {
	g := uint64(len(l.rows) + 1)
	l.rows = append(l.rows, ledger.Policy{Key: key, Generation: g})
	return g
}

// recentBefore is policyCache.recent as it was when the cache kept every
// generation: active, or fewer than two newer generations of its key; true
// for one not published.
func recentBefore(all []ledger.Policy, generation uint64) bool {
	active := ledger.NewActiveGenerations(all)
	for _, p := range all {
		if p.Generation != generation {
			continue
		}
		if g, ok := active.Active(p.Key); ok && g == generation {
			return true
		}
		newer := 0
		for _, q := range all {
			if q.Key == p.Key && q.Generation > generation {
				newer++
			}
		}
		return newer < 2
	}
	return true
}

// recent answers as it did when the cache kept every generation, after
// any sequence of publications and rollbacks over a few keys, whether the
// cache learnt them by a reload or (publications here) by get.
func TestPolicyCacheRecentAnswersAsBefore(t *testing.T) {
	a := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"}
	b := ledger.PolicyKey{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}
	c := ledger.PolicyKey{Subject: ledger.AnySubject, Route: "embed", Region: "eu"}
	// Steps: a key publishes; "-N" rolls generation N back.
	type step struct {
		publish  *ledger.PolicyKey
		rollback uint64
	}
	pub := func(k ledger.PolicyKey) step { return step{publish: &k} }
	back := func(g uint64) step { return step{rollback: g} }
	cases := map[string][]step{
		"one key":                    {pub(a), pub(a), pub(a), pub(a), pub(a)},
		"keys interleaved":           {pub(a), pub(b), pub(a), pub(c), pub(b), pub(a), pub(b), pub(a), pub(c), pub(c)},
		"newest rolled back":         {pub(a), pub(a), pub(a), pub(a), back(4)},
		"two newest rolled back":     {pub(a), pub(a), pub(a), pub(a), back(4), back(3)},
		"all rolled back":            {pub(a), pub(a), back(2), back(1)},
		"publish after rollbacks":    {pub(a), pub(a), pub(a), back(3), back(2), pub(a), pub(a)},
		"rollback of an older one":   {pub(a), pub(b), pub(a), pub(a), back(1), pub(b)},
		"many, then back to the old": {pub(a), pub(a), pub(a), pub(a), pub(a), pub(a), back(6), back(5), back(4), back(3)},
	}
	keys := []ledger.PolicyKey{a, b, c, {Subject: "tenant-8", Route: "chat.generate", Region: "eu"}, {Subject: "tenant-8", Route: "embed", Region: "eu"}}
	for name, steps := range cases {
		// How the cache learns: publishes by a reload, a get, a publish
		// here (published) or a miss (catching up); rollbacks by a reload,
		// a rollback here (rolledBack) or a stale refusal (refreshStale).
		for _, learn := range []string{"reload", "get", "published", "miss"} {
			t.Run(name+"/"+learn, func(t *testing.T) {
				ctx := context.Background()
				l := &policyRows{}
				cache := newPolicyCache(l)
				for i, s := range steps {
					switch {
					case s.publish != nil:
						g := l.publish(*s.publish)
						var err error
						switch learn {
						case "get":
							_, err = cache.get(ctx, g)
						case "published":
							cache.published(l.rows[g-1])
						case "miss":
							cache.loadedAt = time.Time{}
							err = cache.refreshForMiss(ctx, *s.publish)
						default:
							_, err = cache.refresh(ctx)
						}
						if err != nil {
							t.Fatal(err)
						}
					default:
						p := &l.rows[s.rollback-1]
						p.RolledBack = true
						var err error
						switch learn {
						case "get", "published":
							err = cache.rolledBack(ctx, ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: p.Key, Generation: s.rollback})
						case "miss":
							// A reserve mapped by the cache, refused by
							// the ledger for the generation that decides.
							decides, _ := ledger.NewActiveGenerations(l.rows).Deciding(p.Key)
							if cached, ok := cache.active(p.Key); !ok || cached.Generation != decides {
								err = cache.refreshStale(ctx, p.Key, decides)
							}
						default:
							_, err = cache.refresh(ctx)
						}
						if err != nil {
							t.Fatal(err)
						}
					}
					truth := ledger.NewActiveGenerations(l.rows)
					for _, k := range keys {
						want, wantOK := truth.Deciding(k)
						p, ok := cache.active(k)
						if ok != wantOK || ok && p.Generation != want {
							t.Errorf("after step %d: the cache decides %v for %v (%v), want %d (%v)", i+1, p.Generation, k, ok, want, wantOK)
						}
						if ok && p.RolledBack {
							t.Errorf("after step %d: the deciding generation %d of %v is cached as rolled back", i+1, p.Generation, k)
						}
					}
					// A rollback elsewhere of a generation that decides for
					// nothing is told to no cache (no reserve is refused
					// for it): its flag may lag there, and nothing shown
					// comes from it (GetPolicy reads the store).
					if learn == "miss" {
						continue
					}
					cache.mu.RLock()
					for _, m := range []map[uint64]cachedPolicy{cache.kept, cache.older} {
						for g, p := range m {
							if p.rolledBack != l.rows[g-1].RolledBack {
								t.Errorf("after step %d: generation %d cached with rolledBack %v, want %v", i+1, g, p.rolledBack, l.rows[g-1].RolledBack)
							}
						}
					}
					cache.mu.RUnlock()
					for g := uint64(1); g <= uint64(len(l.rows))+2; g++ {
						if got, want := cache.recent(g), recentBefore(l.rows, g); got != want {
							t.Errorf("after step %d: recent(%d) = %v, want %v", i+1, g, got, want)
						}
					}
				}
			})
		}
	}
}

// The cache keeps, per key, the active generation and the two newest,
// plus a bounded number of older ones read since, however many
// generations are published; an older one is read from the store on
// demand and answers the same.
func TestPolicyCacheStaysBoundedPerKey(t *testing.T) {
	ctx := context.Background()
	l := &policyRows{}
	cache := newPolicyCache(l)
	const keys, generations = 4, 1000
	key := func(i int) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i%keys), Route: "chat.generate", Region: "eu"}
	}
	size := func() int {
		cache.mu.RLock()
		defer cache.mu.RUnlock()
		return len(cache.kept) + len(cache.older)
	}
	largest := 0
	for i := range generations {
		g := l.publish(key(i))
		if i%250 == 0 {
			if _, err := cache.refresh(ctx); err != nil {
				t.Fatal(err)
			}
		} else if _, err := cache.get(ctx, g); err != nil {
			t.Fatal(err)
		}
		// A late settle's or a shard's older generation.
		if old, err := cache.get(ctx, uint64(1+i/2)); err != nil || old.Generation != uint64(1+i/2) {
			t.Fatalf("get(%d): %+v, %v", 1+i/2, old, err)
		}
		largest = max(largest, size())
		cache.mu.RLock()
		older := len(cache.older)
		cache.mu.RUnlock()
		if older > olderPolicies {
			t.Fatalf("after generation %d the cache holds %d older policies, want at most %d", g, older, olderPolicies)
		}
	}
	t.Logf("%d generations of %d keys: at most %d policies held", generations, keys, largest)
	if largest > 3*keys+olderPolicies {
		t.Fatalf("the cache held up to %d policies over %d generations of %d keys, want at most %d", largest, generations, keys, 3*keys+olderPolicies)
	}
	if _, err := cache.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := size(); n > 3*keys {
		t.Fatalf("after a reload the cache holds %d policies, want at most %d (3 per key)", n, 3*keys)
	}
	reads := l.reads
	for _, g := range []uint64{1, generations / 2, generations} {
		p, err := cache.get(ctx, g)
		if err != nil || p.Generation != g || p.Key != key(int(g-1)) {
			t.Fatalf("get(%d) after the reload: %+v, %v", g, p, err)
		}
	}
	if l.reads != reads+2 {
		t.Fatalf("%d store reads for two old generations and a kept one, want 2", l.reads-reads)
	}
	if p, ok := cache.active(key(generations - 1)); !ok || p.Generation != generations {
		t.Fatalf("active: %+v, %v; want generation %d", p, ok, generations)
	}
}

// A generation published here right after every one the cache has taken
// in is not read back by the next catch-up (a miss's, or a stale
// refusal's); one published elsewhere still is, with those after it.
func TestPolicyCacheDoesNotReadBackWhatWasPublishedHere(t *testing.T) {
	ctx := context.Background()
	l := &policyRows{}
	cache := newPolicyCache(l)
	key := func(i int) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat.generate", Region: "eu"}
	}
	l.publish(key(0))
	if _, err := cache.load(ctx); err != nil {
		t.Fatal(err)
	}
	const burst = 500
	for i := 1; i <= burst; i++ {
		g := l.publish(key(i))
		cache.published(l.rows[g-1])
	}
	l.afterRows = 0
	if _, err := cache.load(ctx); err != nil {
		t.Fatal(err)
	}
	if l.afterRows != 0 {
		t.Fatalf("the catch-up after %d generations published here read %d of them back, want 0", burst, l.afterRows)
	}
	elsewhere := l.publish(key(burst + 1)) // another replica's
	here := l.publish(key(burst + 2))
	cache.published(l.rows[here-1])
	if _, err := cache.load(ctx); err != nil {
		t.Fatal(err)
	}
	if l.afterRows != 2 {
		t.Fatalf("the catch-up after a generation published elsewhere and one here read %d rows, want 2", l.afterRows)
	}
	if p, ok := cache.active(key(burst + 1)); !ok || p.Generation != elsewhere {
		t.Fatalf("the key published elsewhere: %+v, %v; want generation %d", p, ok, elsewhere)
	}
}

// pagedRows is policyRows recording the size of each page read.
type pagedRows struct {
	*policyRows
	pages []int
}

func (l *pagedRows) PoliciesPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	out, err := l.policyRows.PoliciesPage(ctx, f)
	l.pages = append(l.pages, len(out))
	return out, err
}

// The load after a start reads the policies a page of at most cachePage
// at a time (one read of 1,000,000 policies at once, beside the workers'
// own, had not finished after 10 minutes at a 1,022 MB peak), and ends
// with the cache a read of every policy at once makes (reloadLocked):
// each key's active generation and two newest, the same generations kept.
// The generations: more than two pages of tenants' policies, some
// republished, some rolled back (one down to none), and a "*" policy.
func TestPolicyCacheLoadsAPageAtATime(t *testing.T) {
	ctx := context.Background()
	l := &pagedRows{policyRows: &policyRows{}}
	key := func(i int) ledger.PolicyKey {
		return ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", i), Route: "chat.generate", Region: "eu"}
	}
	l.publish(ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "eu"})
	for i := range 2*cachePage + 300 {
		g := l.publish(key(i))
		switch i % 7 {
		case 1:
			l.publish(key(i))
		case 2:
			l.rows[l.publish(key(i))-1].RolledBack = true
		case 3:
			l.rows[g-1].RolledBack = true
		}
	}
	loaded := newPolicyCache(l)
	read, err := loaded.load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if read != len(l.rows) || len(l.pages) < len(l.rows)/cachePage {
		t.Fatalf("the load read %d of %d policies in pages %v", read, len(l.rows), l.pages)
	}
	for _, n := range l.pages {
		if n > cachePage {
			t.Fatalf("a page of %d policies, want at most %d (pages %v)", n, cachePage, l.pages)
		}
	}
	whole := newPolicyCache(l.policyRows)
	if _, err := whole.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(loaded.keys, whole.keys) {
		t.Fatalf("the paged load's keys differ from a read of every policy's (%d against %d keys)", len(loaded.keys), len(whole.keys))
	}
	if !slices.Equal(slices.Sorted(maps.Keys(loaded.kept)), slices.Sorted(maps.Keys(whole.kept))) || loaded.through != whole.through {
		t.Fatalf("the paged load keeps %d generations through %d, a read of every policy %d through %d",
			len(loaded.kept), loaded.through, len(whole.kept), whole.through)
	}
	rolledBackToNone := key(3)
	if _, ok := loaded.active(rolledBackToNone); !ok {
		t.Fatal("a tenant whose only generation was rolled back has no deciding policy, want the \"*\" one")
	}
}
