package server

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/digest"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// policyCache remembers published policies by generation, so units can be
// mapped between names and dimension positions without a store read per
// request. A generation's terms are immutable; only its RolledBack flag and
// which generation is active change, and a stale view of those is safe: the
// server names the generation it mapped units for (Command.Generation) and
// the ledger refuses the reserve if another generation decides, after which
// the cache is refreshed and the reserve mapped again. A request the cache
// cannot map at all (no policy for its key, a unit the cached generation
// lacks) never reaches the ledger, so it reloads the cache itself
// (refreshForMiss) before it is refused.
//
// It keeps, per policy key, the active generation and the two newest (what
// decides, and what recent reports), and at most olderPolicies older ones
// that get read from the store since: its size grows with the policy keys,
// not with the generations published. An older generation is read again
// on demand (get). Generations of equal terms (with a policy per tenant,
// usually all of a route's) share one copy of them (policyTerms), so a
// policy costs its key, its generation numbers and a pointer.
type policyCache struct {
	ledger Ledger
	mu     sync.RWMutex
	// kept are the generations kept for their key (keptFor); older holds
	// up to olderPolicies others that get read.
	kept, older map[uint64]cachedPolicy
	// keys are, per key, its active generation (the newest not rolled
	// back: the ledger's rule for the generation that admits) and its two
	// newest; they index kept.
	keys map[ledger.PolicyKey]keyGenerations
	// terms shares equal terms between the cached generations.
	terms policyTerms
	// through is the newest generation up to which every one was taken
	// in (read by a reload or a catch-up, or published here without a
	// gap): generations are numbered in publication order, so one up to
	// it that is not kept is neither active nor one of its key's two
	// newest.
	through uint64

	// reload serializes reloads; loadedAt is when the last one started.
	reload   sync.Mutex
	loadedAt time.Time
	// loaded is set once load has read every generation (warm).
	loaded atomic.Bool
}

// keyGenerations are one policy key's generations the cache keeps.
type keyGenerations struct {
	// active is the newest generation not rolled back, 0 for none.
	active uint64
	// newest are the two newest generations known, the newest first (0
	// where there are fewer).
	newest [2]uint64
}

// cachedPolicy is one generation as the cache keeps it: what is its own,
// and its terms (every other field), shared with the cached generations
// of equal terms and never changed.
type cachedPolicy struct {
	subject     string
	generation  uint64
	publishedAt time.Time
	terms       *ledger.Policy
	rolledBack  bool
}

// policy returns the generation as a ledger.Policy (its Dimensions shared
// with the cache: read only, as every cached policy's always were).
func (p *cachedPolicy) policy() ledger.Policy {
	out := *p.terms
	out.Key.Subject, out.Generation, out.PublishedAt, out.RolledBack = p.subject, p.generation, p.publishedAt, p.rolledBack
	return out
}

// key returns the generation's policy key.
func (p *cachedPolicy) key() ledger.PolicyKey {
	return ledger.PolicyKey{Subject: p.subject, Route: p.terms.Key.Route, Region: p.terms.Key.Region}
}

// policyTerms interns the terms of policies: a policy without its key's
// subject, its generation, its publication time and its rolled-back flag
// (its route and region are kept in the terms too, so the cached keys
// share their strings). A term nothing cached refers to any more is
// collected (the table holds it weakly) and its entry swept later.
type policyTerms struct {
	mu   sync.Mutex
	seed maphash.Seed
	// byHash holds one interned terms per hash; terms whose hash is taken
	// by other terms get a copy of their own.
	byHash  map[uint64]weak.Pointer[ledger.Policy]
	sweepAt int
}

// termsOf returns p's terms: p with its own fields zeroed.
func termsOf(p *ledger.Policy) ledger.Policy {
	t := *p
	t.Key.Subject, t.Generation, t.PublishedAt, t.RolledBack = "", 0, time.Time{}, false
	return t
}

// hash returns a hash of terms' fields (equal terms hash equal).
func (pt *policyTerms) hash(t *ledger.Policy) uint64 {
	var h maphash.Hash
	h.SetSeed(pt.seed)
	h.WriteString(t.Key.Route)
	h.WriteByte(0)
	h.WriteString(t.Key.Region)
	h.WriteByte(0)
	h.WriteString(t.EstimatorDigest)
	h.WriteByte(0)
	h.WriteString(string(t.Rollout))
	h.WriteByte(0)
	var b [8]byte
	word := func(v uint64) {
		binary.LittleEndian.PutUint64(b[:], v)
		h.Write(b[:])
	}
	for i := range t.Dimensions {
		d := &t.Dimensions[i]
		h.WriteString(d.Unit)
		h.WriteByte(0)
		word(uint64(d.RefillUnits))
		word(uint64(d.RefillInterval))
		word(uint64(d.Burst))
		word(uint64(d.MaxReservation))
		word(uint64(d.MaxOverdraft))
	}
	word(uint64(t.HoldTTL))
	word(uint64(t.ExecutionLimit))
	word(uint64(t.Priority))
	word(uint64(t.FairnessWeight))
	word(math.Float64bits(t.FairnessBudget))
	word(uint64(t.EpochLength))
	if t.EmergencyMode {
		h.WriteByte(1)
	}
	return h.Sum64()
}

// cached returns p as the cache keeps it, its terms shared with the
// generations of equal terms interned before (compared field by field:
// a hash that collides only costs the sharing).
func (pt *policyTerms) cached(p *ledger.Policy) cachedPolicy {
	t := termsOf(p)
	h := pt.hash(&t)
	pt.mu.Lock()
	defer pt.mu.Unlock()
	var shared *ledger.Policy
	if w, ok := pt.byHash[h]; ok {
		if v := w.Value(); v != nil && reflect.DeepEqual(*v, t) {
			shared = v
		} else if v != nil {
			shared = &t // another's hash: a copy of its own
		}
	}
	if shared == nil {
		if len(pt.byHash) >= pt.sweepAt {
			for k, w := range pt.byHash {
				if w.Value() == nil {
					delete(pt.byHash, k)
				}
			}
			pt.sweepAt = max(2*len(pt.byHash), 1024)
		}
		t.Dimensions = slices.Clip(t.Dimensions)
		shared = &t
		pt.byHash[h] = weak.Make(shared)
	}
	return cachedPolicy{subject: p.Key.Subject, generation: p.Generation, publishedAt: p.PublishedAt, terms: shared, rolledBack: p.RolledBack}
}

// olderPolicies bounds the generations the cache keeps beyond each key's
// active one and two newest (those get read for settles, shards and
// accounts of older generations).
const olderPolicies = 256

// missReloadInterval bounds how often a reserve for a key without a cached
// policy reloads the policies: requests for unknown routes must not turn
// into one full policy read each. A policy published through another
// replica is therefore seen here within this interval (one published here
// is seen at once).
const missReloadInterval = 100 * time.Millisecond

func newPolicyCache(l Ledger) *policyCache {
	c := &policyCache{ledger: l, kept: map[uint64]cachedPolicy{}, older: map[uint64]cachedPolicy{},
		keys: map[ledger.PolicyKey]keyGenerations{}}
	c.terms.seed, c.terms.byHash = maphash.MakeSeed(), map[uint64]weak.Pointer[ledger.Policy]{}
	return c
}

// get returns generation's policy, from the cache or the store; it returns
// a missing row (store.ErrNotFound) for an unknown generation, which says
// "policy generation N: not found" whatever the store's words (each store
// names the generation its own way: wrapping them said it twice), and any
// other store error as the store wrote it (naming the generation).
func (c *policyCache) get(ctx context.Context, generation uint64) (ledger.Policy, error) {
	c.mu.RLock()
	cp, ok := c.kept[generation]
	if !ok {
		cp, ok = c.older[generation]
	}
	c.mu.RUnlock()
	if ok {
		return cp.policy(), nil
	}
	p, err := c.ledger.Policy(ctx, generation)
	if errors.Is(err, store.ErrNotFound) {
		return ledger.Policy{}, &missing{kind: "policy generation", name: strconv.FormatUint(generation, 10)}
	}
	if err != nil {
		return ledger.Policy{}, err
	}
	c.add(&p)
	return p, nil
}

// add takes one more generation in.
func (c *policyCache) add(p *ledger.Policy) {
	cp := c.terms.cached(p)
	c.mu.Lock()
	c.addLocked(cp)
	c.mu.Unlock()
}

// addLocked takes one more generation in (mu held for writing): it may
// become its key's active one and one of its two newest (then the
// generation that stops being one of them and is not active is dropped),
// or else goes to older (dropping another there when full).
func (c *policyCache) addLocked(p cachedPolicy) {
	key := p.key()
	was := c.keys[key]
	now := was
	now.active = ledger.ActiveWith(now.active, p.generation, p.rolledBack)
	now.newest = withNewest(now.newest, p.generation)
	if now != was {
		c.keys[key] = now
	}
	if now.newest != was.newest {
		c.dropLocked(key, was.newest[1]) // no longer one of the two newest
	}
	c.dropLocked(key, was.active)
	if c.keptFor(key, p.generation) {
		c.kept[p.generation] = p
		delete(c.older, p.generation)
		return
	}
	c.putOlderLocked(p)
}

// withNewest returns two, a key's two newest generations (the newest
// first, 0 where there are fewer), with generation taken in.
func withNewest(two [2]uint64, generation uint64) [2]uint64 {
	switch {
	case generation == two[0] || generation == two[1]:
	case generation > two[0]:
		two = [2]uint64{generation, two[0]}
	case generation > two[1]:
		two[1] = generation
	}
	return two
}

// putOlderLocked puts p in older, dropping another there when full.
func (c *policyCache) putOlderLocked(p cachedPolicy) {
	if len(c.older) >= olderPolicies {
		for g := range c.older {
			delete(c.older, g)
			break
		}
	}
	c.older[p.generation] = p
}

// dropLocked moves generation of key from kept to older unless keptFor
// still keeps it.
func (c *policyCache) dropLocked(key ledger.PolicyKey, generation uint64) {
	if p, ok := c.kept[generation]; ok && !c.keptFor(key, generation) {
		delete(c.kept, generation)
		c.putOlderLocked(p)
	}
}

// keptFor reports whether generation is key's active one or one of its two
// newest.
func (c *policyCache) keptFor(key ledger.PolicyKey, generation uint64) bool {
	k := c.keys[key]
	return generation != 0 && (generation == k.newest[0] || generation == k.newest[1] || generation == k.active)
}

// activeLocked returns key's active generation, false when it has none
// (mu held).
func (c *policyCache) activeLocked(key ledger.PolicyKey) (uint64, bool) {
	g := c.keys[key].active
	return g, g != 0
}

// published takes in p, a generation just published (or replayed) and
// read back from the store: the newest of its key and, as of its commit,
// the active one.
// Generations are numbered in publication order, so one right after
// through leaves no gap below it: through moves on (over any taken in
// already) and the next catch-up does not read it again. Without that,
// the first miss after a burst published here (a policy per tenant)
// read the whole burst back.
func (c *policyCache) published(p ledger.Policy) {
	cp := c.terms.cached(&p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addLocked(cp)
	for {
		_, kept := c.kept[c.through+1]
		_, older := c.older[c.through+1]
		if !kept && !older {
			return
		}
		c.through++
	}
}

// load reads every generation published since the newest the cache has
// read (after a start: every one), under the reload lock, as the first
// miss after a start would, and marks the cache loaded. It returns how
// many generations the read took in, or the read's error. It leaves loadedAt alone: the first miss after it still
// catches up at once (a read of what was published since, on another
// replica too), as the first miss after a start did before the warm
// load, instead of answering "no policy" for missReloadInterval.
func (c *policyCache) load(ctx context.Context) (int, error) {
	c.reload.Lock()
	defer c.reload.Unlock()
	read, err := c.catchUpLocked(ctx)
	if err != nil {
		return 0, err
	}
	c.loaded.Store(true)
	return read, nil
}

// refresh reloads every generation and returns them, oldest first.
func (c *policyCache) refresh(ctx context.Context) ([]ledger.Policy, error) {
	c.reload.Lock()
	defer c.reload.Unlock()
	return c.reloadLocked(ctx)
}

// refreshForMiss catches up after a cache miss for key (no policy
// decides for it, or the one that does lacks a unit asked for), unless a
// reload that started after the miss already ran (it saw everything the
// miss could want) or the last one is younger than missReloadInterval.
//
// It reads the generations published since the newest it knows (the only
// way a key without a policy gets one, or a key a new unit), and reloads
// every policy only when the key's cached deciding generation is not the
// one its key's head names (rolled back elsewhere: what a rollback brings
// back may have the unit): a miss costs a read of what is new and one
// row, not every policy, which a stream of requests for subjects without
// a policy made ten full reads a second.
func (c *policyCache) refreshForMiss(ctx context.Context, key ledger.PolicyKey) error {
	missed := time.Now()
	c.reload.Lock()
	defer c.reload.Unlock()
	if c.loadedAt.After(missed) || time.Since(c.loadedAt) < missReloadInterval {
		return nil
	}
	started := time.Now()
	if _, err := c.catchUpLocked(ctx); err != nil {
		return err
	}
	if p, ok := c.active(key); ok {
		head, err := c.ledger.PolicyHead(ctx, p.Key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("policy head %s: %w", p.Key, err)
		}
		if head.Active != p.Generation {
			_, err := c.reloadLocked(ctx)
			return err
		}
	}
	c.loadedAt = started
	return nil
}

// catchUpLocked (reload held) takes in the generations published since
// the newest one the cache has read: a publish on another replica, or
// after a start every policy. It reads them a page of cachePage at a
// time (Ledger.PoliciesPage, in generation order, each page a read of
// its own) and takes each page in before the next, so it holds the
// cache and one page of decoded policies, not every policy (a start's
// read of 1,000,000 at once, beside the workers' own, had not finished
// after 10 minutes at a 1,022 MB peak). A failed read keeps the pages
// taken in: the next catch-up reads on from there. It returns how many
// it read.
func (c *policyCache) catchUpLocked(ctx context.Context) (int, error) {
	c.mu.RLock()
	after := c.through
	c.mu.RUnlock()
	read := 0
	for {
		page, err := c.ledger.PoliciesPage(ctx, store.PolicyFilter{After: after, Limit: cachePage})
		if err != nil {
			return read, fmt.Errorf("list policies: %w", err)
		}
		taken := make([]cachedPolicy, len(page))
		for i := range page {
			taken[i] = c.terms.cached(&page[i].Policy)
		}
		c.mu.Lock()
		for _, cp := range taken {
			c.addLocked(cp)
			c.through = max(c.through, cp.generation)
		}
		c.mu.Unlock()
		read += len(page)
		if len(page) < cachePage {
			return read, nil
		}
		after = page[len(page)-1].Policy.Generation
	}
}

// cachePage is how many generations a catch-up reads at a time.
const cachePage = 1000

// refreshStale brings the cache to what the ledger said decides for key
// (decides), having refused a command mapped for another generation. A
// publish on another replica explains that, and reading what was
// published since finds it; a rollback does not, and the heads of key and
// of its route's "*" say what is active now. Only if the cache still
// disagrees with the ledger (it changed again meanwhile) does it reload
// every policy, which every stale refusal did: with a policy per tenant
// each publish on one replica cost every other replica a read of all of
// them.
func (c *policyCache) refreshStale(ctx context.Context, key ledger.PolicyKey, decides uint64) error {
	c.reload.Lock()
	defer c.reload.Unlock()
	if _, err := c.catchUpLocked(ctx); err != nil {
		return err
	}
	if c.decides(key, decides) {
		return nil
	}
	for _, k := range decidingKeys(key) {
		if err := c.takeHeadLocked(ctx, k); err != nil {
			return err
		}
	}
	if c.decides(key, decides) {
		return nil
	}
	_, err := c.reloadLocked(ctx)
	return err
}

// rolledBack takes in rollbacks committed here (commands of
// KindRollbackPolicy that succeeded): each generation's flag, what was
// published since, then each key's head (which says what is active; the
// flag of a generation older than the active one it cannot say).
func (c *policyCache) rolledBack(ctx context.Context, rollbacks ...ledger.Command) error {
	c.reload.Lock()
	defer c.reload.Unlock()
	var keys []ledger.PolicyKey
	c.mu.Lock()
	for i := range rollbacks {
		g := rollbacks[i].Generation
		for _, m := range []map[uint64]cachedPolicy{c.kept, c.older} {
			if p, ok := m[g]; ok {
				p.rolledBack = true
				m[g] = p
			}
		}
		if !slices.Contains(keys, rollbacks[i].PolicyKey) {
			keys = append(keys, rollbacks[i].PolicyKey)
		}
	}
	c.mu.Unlock()
	if _, err := c.catchUpLocked(ctx); err != nil {
		return err
	}
	for _, k := range keys {
		if err := c.takeHeadLocked(ctx, k); err != nil {
			return err
		}
	}
	return nil
}

// decides reports whether the cache's deciding generation for key is
// generation.
func (c *policyCache) decides(key ledger.PolicyKey, generation uint64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g, ok := ledger.DecidingGeneration(key, c.activeLocked)
	return ok && g == generation
}

// decidingKeys are the keys whose active generations decide for key
// (ledger.DecidingGeneration): its own, and its route's "*" one.
func decidingKeys(key ledger.PolicyKey) []ledger.PolicyKey {
	if key.Subject == ledger.AnySubject {
		return []ledger.PolicyKey{key}
	}
	return []ledger.PolicyKey{key, {Subject: ledger.AnySubject, Route: key.Route, Region: key.Region}}
}

// takeHeadLocked (reload held) reads key's head and its active
// generation, and makes the cache agree: that generation active (none
// when the head has none), every cached generation of key newer than it
// rolled back (the active generation is the newest not rolled back).
func (c *policyCache) takeHeadLocked(ctx context.Context, key ledger.PolicyKey) error {
	head, err := c.ledger.PolicyHead(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil // never had a policy: nothing cached for it either
	}
	if err != nil {
		return fmt.Errorf("policy head %s: %w", key, err)
	}
	var active cachedPolicy
	if head.Active != 0 {
		p, err := c.ledger.Policy(ctx, head.Active)
		if err != nil {
			return fmt.Errorf("policy generation %d: %w", head.Active, err)
		}
		active = c.terms.cached(&p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A generation newer than the head's latest was published (here, by
	// published, which does not wait for this) after the head was read:
	// the head says nothing of it, and it stays as cached (it decides if
	// live).
	var since []cachedPolicy
	for _, m := range []map[uint64]cachedPolicy{c.kept, c.older} {
		for g, p := range m {
			switch {
			case p.key() != key:
			case g > head.Latest:
				since = append(since, p)
			case g > head.Active && !p.rolledBack:
				p.rolledBack = true
				m[g] = p
			}
		}
	}
	k := c.keys[key]
	k.active = head.Active
	if head.Active != 0 {
		c.kept[active.generation] = active
		delete(c.older, active.generation)
	}
	for i := range since {
		k.active = ledger.ActiveWith(k.active, since[i].generation, since[i].rolledBack)
	}
	c.keys[key] = k
	for _, p := range since {
		if c.keptFor(key, p.generation) {
			c.kept[p.generation] = p
			delete(c.older, p.generation)
		}
	}
	for g, p := range c.kept {
		if p.key() == key {
			c.dropLocked(key, g)
		}
	}
	return nil
}

func (c *policyCache) reloadLocked(ctx context.Context) ([]ledger.Policy, error) {
	started := time.Now()
	all, err := c.ledger.Policies(ctx)
	if err != nil {
		return nil, fmt.Errorf("list policies: %w", err)
	}
	fresh := &policyCache{keys: make(map[ledger.PolicyKey]keyGenerations, len(all)), kept: map[uint64]cachedPolicy{}}
	var through uint64
	for i := range all {
		p := &all[i]
		k := fresh.keys[p.Key]
		k.active = ledger.ActiveWith(k.active, p.Generation, p.RolledBack)
		k.newest = withNewest(k.newest, p.Generation)
		fresh.keys[p.Key] = k
		through = max(through, p.Generation)
	}
	for i := range all {
		if fresh.keptFor(all[i].Key, all[i].Generation) {
			cp := c.terms.cached(&all[i])
			fresh.kept[cp.generation] = cp
		}
	}
	// The keys again, with the strings the kept generations share.
	keys := make(map[ledger.PolicyKey]keyGenerations, len(fresh.keys))
	for _, cp := range fresh.kept {
		key := cp.key()
		keys[key] = fresh.keys[key]
	}
	for key, k := range fresh.keys {
		if _, ok := keys[key]; !ok {
			keys[key] = k // every generation rolled back and none kept: none
		}
	}
	c.mu.Lock()
	// Generations taken in since the read (a publish here, which does not
	// wait for reloads, or get) are newer than every one it read: keep
	// them, or a publish answered while this reload ran would be
	// forgotten, and its key answer NO_POLICY here until a miss read it
	// again.
	var since []cachedPolicy
	for _, cached := range []map[uint64]cachedPolicy{c.kept, c.older} {
		for g, p := range cached {
			if g > through {
				since = append(since, p)
			}
		}
	}
	c.kept, c.older, c.keys, c.through = fresh.kept, map[uint64]cachedPolicy{}, keys, through
	slices.SortFunc(since, func(a, b cachedPolicy) int { return cmp.Compare(a.generation, b.generation) })
	for i := range since {
		c.addLocked(since[i])
	}
	c.mu.Unlock()
	c.loadedAt = started
	return all, nil
}

// recent reports whether generation is the active generation of its
// policy key (subject, route, region) or one of the two newest published
// for it: the one deciding and the one it replaced, or a rolled-back one
// and the one deciding again (however many newer ones were rolled back).
// It reports true for a generation the cache does not know, so nothing is
// forgotten on a guess; a generation up to the newest the last reload read
// that the cache does not keep is known to be neither (false), and so is
// one the cache stopped keeping since while it is among the older ones.
// It looks up two maps, whatever the generations published.
func (c *policyCache) recent(generation uint64) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	p, ok := c.kept[generation]
	if !ok {
		p, ok = c.older[generation]
	}
	if !ok {
		return generation > c.through
	}
	return c.keptFor(p.key(), generation)
}

// active returns the cached policy that decides for a concrete subject:
// the subject's own active generation, else the route's AnySubject one.
func (c *policyCache) active(key ledger.PolicyKey) (ledger.Policy, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	generation, ok := ledger.DecidingGeneration(key, c.activeLocked)
	if !ok {
		return ledger.Policy{}, false
	}
	cp, ok := c.kept[generation]
	if !ok {
		cp, ok = c.older[generation]
	}
	if !ok {
		return ledger.Policy{}, true // not read yet (as a zero policy, which maps no unit)
	}
	return cp.policy(), true
}

// amounts maps a units map to the policy's dimension order. When a name
// is not one of the policy's dimensions it returns unmappedUnitName's
// refusal (field names the map).
func amounts(p *ledger.Policy, field string, units map[string]int64) (ledger.Amounts, *connect.Error) {
	var out ledger.Amounts
	var unknown []string
	for name, value := range units {
		i := p.DimensionIndex(name)
		if i < 0 {
			unknown = append(unknown, name)
			continue
		}
		out[i] = value
	}
	if len(unknown) == 0 {
		return out, nil
	}
	// The answer must not depend on the map's order: a name the text rule
	// refuses answers before any unknown one, then the first by bytes.
	slices.SortFunc(unknown, func(a, b string) int {
		aBad, bBad := ledger.TextProblem(a, ledger.MaxUnitBytes) != "", ledger.TextProblem(b, ledger.MaxUnitBytes) != ""
		if aBad != bBad {
			if aBad {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return out, unmappedUnitName(field, unknown[0], p)
}

// checkUnitValues is the shape check of a units map, made before any
// reservation, shard or policy is read, so bad input gets the same clear
// answer whatever state (or absence) the id names: 400 INVALID_COMMAND
// naming field for a unit name unitNameProblem refuses (the door's rule,
// checked here again for batch items and adapters, which come without
// the door), and naming field and unit for an amount
// ledger.AmountShapeProblem refuses (negative and, when capped, above
// ledger.MaxUnits: the ledger applies the same rule to its amounts). It
// returns nil for a map of well-formed amounts.
func checkUnitValues(field string, units map[string]int64, capped bool) *connect.Error {
	names := make([]string, 0, len(units))
	for name := range units {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if cerr := unitNameProblem(field, name); cerr != nil {
			return cerr
		}
		if problem := ledger.AmountShapeProblem(units[name], capped); problem != "" {
			return invalidField(ReasonInvalidCommand, field, ": %q %s", name, problem)
		}
	}
	return nil
}

// unstated names, quoted and comma-separated, the units reserved (a
// positive amount in reserved) that the units map does not state; "" when
// it states them all. A settle must state each, 0 included: a unit left
// out, or misspelt, must never read as "used nothing".
func unstated(p *ledger.Policy, reserved *ledger.Amounts, units map[string]int64) string {
	var missing []string
	for i := range p.Dimensions {
		if _, ok := units[p.Dimensions[i].Unit]; !ok && reserved[i] > 0 {
			missing = append(missing, fmt.Sprintf("%q (reserved %d)", p.Dimensions[i].Unit, reserved[i]))
		}
	}
	return strings.Join(missing, ", ")
}

func unitList(p *ledger.Policy) string {
	names := make([]string, len(p.Dimensions))
	for i := range p.Dimensions {
		names[i] = strconv.Quote(p.Dimensions[i].Unit)
	}
	return strings.Join(names, ", ")
}

// unitsMap renders amounts by unit name, one entry per policy dimension.
func unitsMap(p *ledger.Policy, a *ledger.Amounts) map[string]int64 {
	out := make(map[string]int64, len(p.Dimensions))
	for i := range p.Dimensions {
		out[p.Dimensions[i].Unit] = a[i]
	}
	return out
}

// requestDigest is the digest the server derives when a reserve names
// none: the canonical request digest of docs/CLIENTS.md (package
// api/digest, the same function the Go SDK uses) over subject, route,
// region and units, with no estimator digest and no body hash. A client
// that computes the canonical digest of the same fields therefore gets the
// same digest as a retry that omits it, and reusing an id for something
// else is detected. For an input the ledger refuses in every case (no
// subject or route, a negative amount) it returns "": the ledger then
// answers INVALID_COMMAND, or DIGEST_MISMATCH for an id that exists (a
// stored digest is never empty).
func requestDigest(subject, route, region string, units map[string]int64) string {
	d, err := digest.Request(digest.Input{Subject: subject, Route: route, Region: region, Units: units})
	if err != nil {
		return ""
	}
	return d
}

var stateToProto = map[ledger.State]v1.ReservationState{
	ledger.StateRequested:          v1.ReservationState_RESERVATION_STATE_REQUESTED,
	ledger.StateReserved:           v1.ReservationState_RESERVATION_STATE_RESERVED,
	ledger.StateStarted:            v1.ReservationState_RESERVATION_STATE_STARTED,
	ledger.StateSettled:            v1.ReservationState_RESERVATION_STATE_SETTLED,
	ledger.StateSettledWithDebt:    v1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT,
	ledger.StateReleased:           v1.ReservationState_RESERVATION_STATE_RELEASED,
	ledger.StateExpiring:           v1.ReservationState_RESERVATION_STATE_EXPIRING,
	ledger.StateExpired:            v1.ReservationState_RESERVATION_STATE_EXPIRED,
	ledger.StateUsageUnknown:       v1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN,
	ledger.StateReservationUnknown: v1.ReservationState_RESERVATION_STATE_RESERVATION_UNKNOWN,
}

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func duration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// reservationProto renders a reservation with its units by name (which
// needs its generation's policy; an error means it could not be read).
func (s *Server) reservationProto(ctx context.Context, r *ledger.Reservation) (*v1.Reservation, error) {
	p, err := s.policies.get(ctx, r.Account.Generation)
	if err != nil {
		return nil, err
	}
	pb := &v1.Reservation{
		Schema:            ledger.SchemaReservation,
		ReservationId:     r.ID,
		RequestDigest:     r.RequestDigest,
		Subject:           r.Account.Subject,
		Route:             r.Account.Route,
		Region:            r.Account.Region,
		PolicyGeneration:  r.Account.Generation,
		AccountingEpoch:   timestamp(r.AccountingEpoch),
		ReservedUnits:     unitsMap(&p, &r.Reserved),
		OperationId:       r.OperationID,
		State:             stateToProto[r.State],
		CreatedAt:         timestamp(r.CreatedAt),
		ExpiresAt:         timestamp(r.ExpiresAt),
		StartedAt:         timestamp(r.StartedAt),
		ExecutionDeadline: timestamp(r.ExecutionDeadline),
		UsageUnknownAt:    timestamp(r.UnknownAt),
		FinishedAt:        timestamp(r.FinishedAt),
		Breach:            r.Breach,
		Retired:           r.Retired,
	}
	if r.Retired {
		pb.ReservedUnits = nil // the tombstone keeps no units
		return pb, nil
	}
	if r.State == ledger.StateSettled || r.State == ledger.StateSettledWithDebt {
		pb.ActualUnits = unitsMap(&p, &r.Actual)
		pb.OverdraftUnits = unitsMap(&p, &r.Overdraft)
	}
	return pb, nil
}

// refundedProto renders what a command refunded, by the reservation's
// units; empty on a replay (nothing was refunded twice).
func (s *Server) refundedProto(ctx context.Context, res *ledger.Result) (map[string]int64, error) {
	if res.Replayed {
		return nil, nil
	}
	p, err := s.policies.get(ctx, res.Reservation.Account.Generation)
	if err != nil {
		return nil, err
	}
	return unitsMap(&p, &res.Refunded), nil
}

func accountProto(a *ledger.Account, p *ledger.Policy) *v1.Account {
	pb := &v1.Account{
		Subject:          a.Key.Subject,
		Route:            a.Key.Route,
		Region:           a.Key.Region,
		PolicyGeneration: a.Key.Generation,
		EpochStart:       timestamp(a.EpochStart),
		Breaches:         a.Breaches,
	}
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		b := &a.Balances[i]
		pb.Balances = append(pb.Balances, &v1.Balance{
			Unit:                p.Dimensions[i].Unit,
			Opening:             b.Opening,
			Minted:              b.Minted,
			OverdraftIssued:     b.OverdraftIssued,
			Available:           b.Available,
			Reserved:            b.Reserved,
			Spent:               b.Spent,
			RetiredForEmergency: b.RetiredForEmergency,
			RetiredForMove:      b.RetiredForMove,
			OverdraftRepaid:     b.OverdraftRepaid,
			Debt:                b.Debt(),
			HeldElsewhere:       a.HeldElsewhere[i],
		})
	}
	dim, _ := a.Debt()
	pb.Frozen = dim >= 0
	return pb
}

var rolloutToProto = map[ledger.RolloutMode]v1.RolloutMode{
	ledger.RolloutEnforce: v1.RolloutMode_ROLLOUT_MODE_ENFORCE,
	ledger.RolloutShadow:  v1.RolloutMode_ROLLOUT_MODE_SHADOW,
}

// PolicyProto renders a policy (active says whether it admits for its key
// now).
func PolicyProto(p *ledger.Policy, active bool) *v1.Policy {
	pb := &v1.Policy{
		Schema:          ledger.SchemaPolicy,
		Subject:         p.Key.Subject,
		Route:           p.Key.Route,
		Region:          p.Key.Region,
		Generation:      p.Generation,
		EstimatorDigest: p.EstimatorDigest,
		HoldTtl:         duration(p.HoldTTL),
		ExecutionLimit:  duration(p.ExecutionLimit),
		Priority:        int32(p.Priority),
		FairnessWeight:  p.FairnessWeight,
		FairnessBudget:  p.FairnessBudget,
		EmergencyMode:   p.EmergencyMode,
		Rollout:         rolloutToProto[p.Rollout],
		EpochLength:     duration(p.EpochLength),
		PublishedAt:     timestamp(p.PublishedAt),
		RolledBack:      p.RolledBack,
		Active:          active,
	}
	for _, d := range p.Dimensions {
		pb.Dimensions = append(pb.Dimensions, &v1.Dimension{
			Unit:           d.Unit,
			RefillUnits:    d.RefillUnits,
			RefillInterval: duration(d.RefillInterval),
			Burst:          d.Burst,
			MaxReservation: d.MaxReservation,
			MaxOverdraft:   d.MaxOverdraft,
		})
	}
	return pb
}

// PolicyFromProto converts a policy to publish, with the ledger's defaults
// filled in (ledger.Policy.WithDefaults). It returns an
// ledger.ErrInvalidPolicy-wrapping error for a field that cannot be
// converted (a malformed duration, an unknown rollout mode); the rest is
// validated by the ledger when publishing.
func PolicyFromProto(pb *v1.Policy) (ledger.Policy, error) {
	if pb == nil {
		return ledger.Policy{}, ledger.NewFieldError(ledger.ErrInvalidPolicy, "", "is required")
	}
	// Empty means the one schema there is; another name is terms this server
	// does not know, and publishing them as admissionBudget.v1 would be a guess.
	if schema := pb.GetSchema(); schema != "" && schema != ledger.SchemaPolicy {
		return ledger.Policy{}, ledger.NewFieldError(ledger.ErrInvalidPolicy, "schema", fmt.Sprintf("%q: want %s (or leave it out)", schema, ledger.SchemaPolicy))
	}
	p := ledger.Policy{
		Key:             ledger.PolicyKey{Subject: pb.GetSubject(), Route: pb.GetRoute(), Region: pb.GetRegion()},
		EstimatorDigest: pb.GetEstimatorDigest(),
		Priority:        int(pb.GetPriority()),
		FairnessWeight:  pb.GetFairnessWeight(),
		FairnessBudget:  pb.GetFairnessBudget(),
		EmergencyMode:   pb.GetEmergencyMode(),
	}
	var err error
	durations := []struct {
		name string
		in   *durationpb.Duration
		out  *time.Duration
	}{
		{"holdTtl", pb.GetHoldTtl(), &p.HoldTTL},
		{"executionLimit", pb.GetExecutionLimit(), &p.ExecutionLimit},
		{"epochLength", pb.GetEpochLength(), &p.EpochLength},
	}
	for _, d := range durations {
		if *d.out, err = durationFromProto(ledger.ErrInvalidPolicy, d.name, d.in); err != nil {
			return ledger.Policy{}, err
		}
	}
	// An explicit value is never turned into a default: holdTtl "0s" was
	// silently 60s. Leave the field out for the default.
	if pb.GetHoldTtl() != nil && p.HoldTTL < ledger.MinHoldTTL {
		return ledger.Policy{}, ledger.NewFieldError(ledger.ErrInvalidPolicy, "holdTtl", fmt.Sprintf("%s is shorter than the minimum %s (leave it out for the default %s)",
			ledger.DurationText(p.HoldTTL), ledger.DurationText(ledger.MinHoldTTL), ledger.DurationText(ledger.DefaultHoldTTL)))
	}
	if pb.GetEpochLength() != nil && p.EpochLength < ledger.MinEpochLength {
		return ledger.Policy{}, ledger.NewFieldError(ledger.ErrInvalidPolicy, "epochLength", fmt.Sprintf("%s is shorter than the minimum %s (leave it out for the default %s)",
			ledger.DurationText(p.EpochLength), ledger.DurationText(ledger.MinEpochLength), ledger.DurationText(ledger.DefaultEpochLength)))
	}
	switch pb.GetRollout() {
	case v1.RolloutMode_ROLLOUT_MODE_UNSPECIFIED, v1.RolloutMode_ROLLOUT_MODE_ENFORCE:
		p.Rollout = ledger.RolloutEnforce
	case v1.RolloutMode_ROLLOUT_MODE_SHADOW:
		p.Rollout = ledger.RolloutShadow
	default:
		return ledger.Policy{}, ledger.NewFieldError(ledger.ErrInvalidPolicy, "rollout", fmt.Sprintf("%d is neither %s nor %s", pb.GetRollout(), v1.RolloutMode_ROLLOUT_MODE_ENFORCE, v1.RolloutMode_ROLLOUT_MODE_SHADOW))
	}
	for i, d := range pb.GetDimensions() {
		interval, err := durationFromProto(ledger.ErrInvalidPolicy, ledger.FieldPath(ledger.ItemPath("dimensions", i), "refillInterval"), d.GetRefillInterval())
		if err != nil {
			return ledger.Policy{}, err
		}
		p.Dimensions = append(p.Dimensions, ledger.Dimension{
			Unit:           d.GetUnit(),
			RefillUnits:    d.GetRefillUnits(),
			RefillInterval: interval,
			Burst:          d.GetBurst(),
			MaxReservation: d.GetMaxReservation(),
			MaxOverdraft:   d.GetMaxOverdraft(),
		})
	}
	return p.WithDefaults(), nil
}

// durationFromProto returns d as a time.Duration (0 when unset), or a
// *ledger.FieldError of kind at path when d is no valid Duration or
// beyond ledger.MaxDurationSeconds either way (a fraction past it too).
// The caller answers it under its reason (INVALID_POLICY in a policy,
// INVALID_COMMAND in a shard's ttl) by fieldRefusal.
func durationFromProto(kind error, path string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	bad := func(format string, args ...any) error {
		return ledger.NewFieldError(kind, path, fmt.Sprintf(format, args...))
	}
	if err := d.CheckValid(); err != nil {
		return 0, bad(": %v", err)
	}
	// The proto allows 10,000 years, time.Duration about 292; AsDuration
	// saturates, which would keep another duration than the one asked.
	seconds, nanos := d.GetSeconds(), d.GetNanos()
	switch {
	case seconds > ledger.MaxDurationSeconds || seconds == ledger.MaxDurationSeconds && nanos > 0:
		return 0, bad("%s is longer than the maximum %ds (about 292 years)", ledger.SecondsText(seconds, nanos), ledger.MaxDurationSeconds)
	case seconds < -ledger.MaxDurationSeconds || seconds == -ledger.MaxDurationSeconds && nanos < 0:
		return 0, bad("%s is below the minimum -%ds", ledger.SecondsText(seconds, nanos), ledger.MaxDurationSeconds)
	}
	return d.AsDuration(), nil
}
