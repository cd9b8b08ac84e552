package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// policyReads reads, for one call, the policies some accounts need to be
// shown: the generations they are under and the generation deciding for
// each of their subject keys (ledger.DecidingGeneration over the heads
// of the key and of its route's "*" key). Each row is read once per call:
// the heads of a page's subjects together (store.Store.PolicyHeads, one
// read however many subjects), then the page's generations not read yet
// together (store.Store.PoliciesOfGenerations). A call costs in
// proportion to the accounts it shows, however many policies there are
// (reading every policy cost seconds at 100,000 of them), and a page of
// a thousand tenants costs two reads whether they share one "*" policy
// or each has its own, not a round trip per tenant.
type policyReads struct {
	store store.Store
	// byGeneration holds the generations read; heads the active
	// generation of each key read (0: none active, or no head).
	byGeneration map[uint64]*ledger.Policy
	heads        map[ledger.PolicyKey]uint64
	// deciding is, per subject key read, the generation deciding for it
	// (absent: none decides).
	deciding map[ledger.PolicyKey]uint64
	decided  map[ledger.PolicyKey]bool
}

func newPolicyReads(st store.Store) *policyReads {
	return &policyReads{store: st, byGeneration: map[uint64]*ledger.Policy{}, heads: map[ledger.PolicyKey]uint64{},
		deciding: map[ledger.PolicyKey]uint64{}, decided: map[ledger.PolicyKey]bool{}}
}

// policy returns generation's policy, read once; store.ErrNotFound
// (wrapped, naming the generation) when it does not exist.
func (r *policyReads) policy(ctx context.Context, generation uint64) (*ledger.Policy, error) {
	if p, ok := r.byGeneration[generation]; ok {
		return p, nil
	}
	p, err := r.store.PolicyGet(ctx, generation)
	if err != nil {
		return nil, fmt.Errorf("policy %d: %w", generation, err)
	}
	r.byGeneration[generation] = &p
	return &p, nil
}

// active returns key's active generation (0 when none is, or the key
// never had a policy), its head read once.
func (r *policyReads) active(ctx context.Context, key ledger.PolicyKey) (uint64, error) {
	if g, ok := r.heads[key]; ok {
		return g, nil
	}
	h, err := r.store.PolicyHead(ctx, key)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, fmt.Errorf("policy head %s: %w", key, err)
	}
	r.heads[key] = h.Active // the zero head when not found
	return h.Active, nil
}

// readHeads reads, in one store.Store.PolicyHeads, the heads not read yet
// that deciding for subjects may need: those ledger.DecidingGeneration
// may ask for (each subject's key and its route's "*" key). readDeciding
// then finds them read.
func (r *policyReads) readHeads(ctx context.Context, subjects []ledger.PolicyKey) error {
	var keys []ledger.PolicyKey
	asked := map[ledger.PolicyKey]bool{}
	for _, subject := range subjects {
		if r.decided[subject] {
			continue
		}
		// Every key DecidingGeneration may ask, when none has a head.
		ledger.DecidingGeneration(subject, func(key ledger.PolicyKey) (uint64, bool) {
			if _, read := r.heads[key]; !read && !asked[key] {
				asked[key] = true
				keys = append(keys, key)
			}
			return 0, false
		})
	}
	if len(keys) == 0 {
		return nil
	}
	heads, err := r.store.PolicyHeads(ctx, keys)
	if err != nil {
		return fmt.Errorf("policy heads: %w", err)
	}
	for _, key := range keys {
		r.heads[key] = heads[key].Active // 0 when absent: no head
	}
	return nil
}

// readPolicies reads, in one store.Store.PoliciesOfGenerations, those of
// generations not read yet; it returns store.ErrNotFound (wrapped,
// naming the generation) for one that does not exist.
func (r *policyReads) readPolicies(ctx context.Context, generations []uint64) error {
	var missing []uint64
	asked := map[uint64]bool{}
	for _, g := range generations {
		if _, read := r.byGeneration[g]; !read && !asked[g] {
			asked[g] = true
			missing = append(missing, g)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	found, err := r.store.PoliciesOfGenerations(ctx, missing)
	if err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	for _, g := range missing {
		p, ok := found[g]
		if !ok {
			return fmt.Errorf("policy %d: %w", g, store.ErrNotFound)
		}
		r.byGeneration[g] = &p
	}
	return nil
}

// readDeciding reads which generation decides for subject (once), from
// the heads readHeads read (a point read of any it did not).
func (r *policyReads) readDeciding(ctx context.Context, subject ledger.PolicyKey) error {
	if r.decided[subject] {
		return nil
	}
	var headErr error
	g, ok := ledger.DecidingGeneration(subject, func(key ledger.PolicyKey) (uint64, bool) {
		active, err := r.active(ctx, key)
		headErr = errors.Join(headErr, err)
		return active, active != 0
	})
	if headErr != nil {
		return headErr
	}
	if ok {
		r.deciding[subject] = g
	}
	r.decided[subject] = true
	return nil
}

// load reads what accounts need to be shown: the policy of each one's
// generation, the generation deciding for its subject key, and when
// withDeciding that generation's policy too. The heads are one read, the
// generations not read yet another.
func (r *policyReads) load(ctx context.Context, accounts []ledger.Account, withDeciding bool) error {
	subjects := make([]ledger.PolicyKey, len(accounts))
	for i := range accounts {
		subjects[i] = accounts[i].Key.SubjectKey()
	}
	if err := r.readHeads(ctx, subjects); err != nil {
		return err
	}
	generations := make([]uint64, 0, len(accounts))
	for i := range accounts {
		generations = append(generations, accounts[i].Key.Generation)
		if err := r.readDeciding(ctx, subjects[i]); err != nil {
			return err
		}
		if g, ok := r.deciding[subjects[i]]; ok && withDeciding {
			generations = append(generations, g)
		}
	}
	return r.readPolicies(ctx, generations)
}

// Deciding returns the generation deciding for subject as read (load or
// readDeciding), false when none does or it was not read.
func (r *policyReads) Deciding(subject ledger.PolicyKey) (uint64, bool) {
	g, ok := r.deciding[subject]
	return g, ok
}

// DecidingGenerations returns the generation deciding for each of
// subjects (ledger.DecidingGeneration over their keys' heads and their
// routes' "*" heads, as the ledger decides a reserve now); a subject
// for which none decides is absent. It reads their heads in one
// store.Store.PolicyHeads (two keys per subject at most, each "*" key
// once), not every policy.
func (e *Engine) DecidingGenerations(ctx context.Context, subjects []ledger.PolicyKey) (map[ledger.PolicyKey]uint64, error) {
	r := newPolicyReads(e.core.store)
	if err := r.readHeads(ctx, subjects); err != nil {
		return nil, err
	}
	for _, subject := range subjects {
		if err := r.readDeciding(ctx, subject); err != nil {
			return nil, err
		}
	}
	return r.deciding, nil
}
