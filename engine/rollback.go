package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// GenerationDrain is what one generation still holds, for following a
// rollback to zero (RolloutService.DrainProgress, `capledger rollback
// --wait`). Amounts are by dimension, in the order of the generation's
// policy.
type GenerationDrain struct {
	Policy ledger.Policy
	// Active is whether the generation is its key's active one now.
	Active   bool
	Accounts int64
	// Reserved, Debt and Available sum the generation's accounts.
	Reserved, Debt, Available ledger.Amounts
	// BlockedByBurst counts accounts holding available capacity that the
	// drain cannot move because the deciding account has no room: it is
	// at its burst once refilled to now, as the drain refills it, and owes
	// nothing (ledger.DrainRoom; counted by addBlockedByBurst);
	// BlockedNoPolicy those holding capacity or debt whose subject no
	// generation decides for. BlockedDroppedUnit counts those holding
	// available capacity in a unit the generation deciding for their
	// subject does not limit (by unit name, as the ledger's drain matches
	// units): the drain never moves it, so the generation never drains
	// while that generation decides (counted by addDrain; such an account
	// may also be BlockedByBurst in a unit both limit). Debt in such a
	// unit is not counted: the owing account stays (or becomes again) its
	// subject's current account, freezing its admission, and its own
	// refill repays it; the subject then switches.
	BlockedByBurst, BlockedNoPolicy, BlockedDroppedUnit int64
	// UnreconciledShards are shards issued under the generation and not
	// reconciled; ShardUnits their allocations.
	UnreconciledShards int64
	ShardUnits         ledger.Amounts
	// LegacyBudgets and LegacyUnits are the legacy limiter's budgets among
	// them (ledger.Shard.IsLegacyBudget).
	LegacyBudgets int64
	LegacyUnits   ledger.Amounts
}

// Drained reports whether the generation holds nothing any more: not
// active, no holds, no debt, no capacity left to move, no shard open.
func (d *GenerationDrain) Drained() bool {
	return !d.Active && d.Reserved == (ledger.Amounts{}) && d.Debt == (ledger.Amounts{}) &&
		d.Available == (ledger.Amounts{}) && d.UnreconciledShards == 0
}

// RunDrains runs one full pass of the drain worker now, on this replica
// (leader or not: drains are ledger commands, safe next to the leader's),
// and returns how many of its drain commands moved capacity or debt (one
// for an account that holds only reservations, or is blocked by the
// deciding account's burst, moves nothing and is not counted, so an
// operator following a rollback sees 0 while nothing moves). It reads
// every superseded generation in full; the drain worker runs the same
// pass once per epoch interval, but reads again only what its drain memo
// says may still need a drain. This is for an operator following a
// rollback.
//
// On a failure it returns the moves counted so far, committed by the
// batches before, and an error that wraps ErrNotApplied when the failed
// step was a read (the page's drains were not applied) or a batch that
// did not commit. Its reads tell a bounded caller (store.Progressed,
// store.Waits) when they wait for the store; its batches do not count
// as waits: each commit is bounded by Options.BatchTimeout.
func (e *Engine) RunDrains(ctx context.Context) (int, error) {
	waiting := store.Waits(ctx)
	p, _, err := e.core.DrainPager(ctx, e.opts.PageSize, nil, nil)
	if err != nil {
		return 0, fmt.Errorf("drains: %w (%w)", err, ErrNotApplied)
	}
	ran := 0
	for {
		store.Progressed(ctx) // asking for the next page
		cmds, err := p.Next(ctx)
		if err != nil {
			return ran, fmt.Errorf("drains: reading a page: %w (%w)", err, ErrNotApplied)
		}
		if len(cmds) == 0 {
			return ran, nil
		}
		e.workerRuns.Add(1)
		e.workerCmds.Add(uint64(len(cmds)))
		for start := 0; start < len(cmds); start += e.opts.MaxBatch {
			end := min(start+e.opts.MaxBatch, len(cmds))
			waiting(false)
			results, err := e.doMaintenance(ctx, cmds[start:end])
			if err != nil {
				return ran, fmt.Errorf("drains: %w", err)
			}
			for i := range results {
				if results[i].Move != nil {
					ran++
				}
			}
		}
	}
}

// DrainProgress returns what each of generations still holds (see
// GenerationDrain), reading its accounts page by page and its
// unreconciled shards (addUnreconciledShards);
// store.ErrNotFound for a generation that does not exist. The policies
// it reads are those generations and, per page, the generations and
// heads deciding for the page's subjects, not every policy. The deciding
// accounts BlockedByBurst needs are read a page at a time too
// (store.AccountsOfSubjects of the page's subjects that hold capacity),
// not one AccountGet per account. Active and the sums stood together: a
// pass during which a publish or rollback of the generation's key
// committed is read again (at most maxDrainPasses, then ErrPolicyChanging), so it
// never says drained while the generation is active or holds capacity it
// took while active.
func (e *Engine) DrainProgress(ctx context.Context, generations []uint64) ([]GenerationDrain, error) {
	out := make([]GenerationDrain, 0, len(generations))
	for _, g := range generations {
		// The generation's key's active generation is read before its
		// pages and again after them: a publish or rollback of its key
		// committed meanwhile (the head moved) may have made it active and
		// let it take and spend capacity between the two, so the pass is
		// read again. The same head h at both ends means g was not active
		// in between: the active generation is always the newest one not
		// rolled back, so g (not h) could have become active only by h's
		// rollback, and a rolled-back generation never decides again, so
		// the head could not have come back to h. (The head may go h, h',
		// h: a publish of h' and its rollback; g was not active then
		// either.) A generation already rolled back when the pass began
		// can never be active, so its pass stands whatever the head did:
		// `rollback --wait` is answered while its key is published to.
		for pass := 1; ; pass++ {
			d, head, err := e.drainPass(ctx, g)
			if err != nil {
				return nil, err
			}
			if d.Policy.RolledBack {
				out = append(out, d)
				break
			}
			again, err := e.core.store.PolicyHead(ctx, d.Policy.Key)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return nil, fmt.Errorf("policy head %s: %w", d.Policy.Key, err)
			}
			if again.Active == head {
				out = append(out, d)
				break
			}
			if pass == maxDrainPasses {
				return nil, fmt.Errorf("drain progress of generation %d: %w during each of %d passes; ask again", g, ErrPolicyChanging, pass)
			}
		}
	}
	return out, nil
}

// ErrPolicyChanging is DrainProgress's answer for a generation whose
// key's active generation moved (publishes or rollbacks of the key)
// during each of maxDrainPasses passes in a row: no pass stood still long
// enough to say whether the generation is drained. Nothing failed and
// nothing is wrong with the store: asking again once the key's publishes
// pause answers.
var ErrPolicyChanging = errors.New("its key's active generation changed")

// beforeHeadReadKey is the context key of the tests' hook that drainPass
// calls between its reads of the generation's policy and of its key's head.
type beforeHeadReadKey struct{}

// maxDrainPasses bounds the passes DrainProgress reads for one generation
// while its key's active generation keeps changing during them.
const maxDrainPasses = 4

// drainPass is DrainProgress's pass over generation g: what it holds,
// and its key's active generation as read before its accounts.
func (e *Engine) drainPass(ctx context.Context, g uint64) (GenerationDrain, uint64, error) {
	now := e.opts.Clock()
	// The generation asked about and its key's head; then, page by page,
	// the heads deciding for the accounts' subjects and those
	// generations: two reads a page (policyReads.load), not every policy,
	// and forgotten after each page (a "*" generation may have an account
	// per tenant).
	policies := newPolicyReads(e.core.store)
	p, err := policies.policy(ctx, g)
	if errors.Is(err, store.ErrNotFound) {
		return GenerationDrain{}, 0, fmt.Errorf("policy generation %d: %w", g, store.ErrNotFound)
	}
	if err != nil {
		return GenerationDrain{}, 0, err
	}
	d := GenerationDrain{Policy: *p}
	if f, ok := ctx.Value(beforeHeadReadKey{}).(func()); ok {
		f() // the tests' hook: a commit between the policy and the head
	}
	active, err := policies.active(ctx, p.Key)
	if err != nil {
		return GenerationDrain{}, 0, err
	}
	d.Active = active != 0 && active == g
	if !d.Active && !p.RolledBack {
		// Read before the head, the policy may predate a rollback of g
		// committed since, which the head shows (g no longer active): read
		// it again, so the pass never shows g neither active nor rolled
		// back while it was rolled back (rolled back is for good).
		if again, err := e.core.store.PolicyGet(ctx, g); err == nil {
			d.Policy = again
		} else if !errors.Is(err, store.ErrNotFound) {
			return GenerationDrain{}, 0, err
		}
	}
	store.BetweenReads(ctx) // the tests' hook: a commit between the head and the pages
	f := store.EpochFilter{Generation: g, Limit: e.opts.PageSize}
	var waiting []*ledger.Account
	var subjects []ledger.PolicyKey
	for {
		page, next, err := e.core.store.AccountsByEpoch(ctx, f)
		if err != nil {
			return GenerationDrain{}, 0, fmt.Errorf("accounts of generation %d: %w", g, err)
		}
		store.Progressed(ctx) // a page read: the caller may bound the wait for the next
		pagePolicies := newPolicyReads(e.core.store)
		if err := pagePolicies.load(ctx, page, true); err != nil {
			return GenerationDrain{}, 0, err
		}
		waiting, subjects = waiting[:0], subjects[:0]
		for i := range page {
			if addDrain(&d, &page[i], pagePolicies.Deciding, pagePolicies.byGeneration) {
				waiting = append(waiting, &page[i])
				subjects = append(subjects, page[i].Key.SubjectKey())
			}
		}
		if err := e.addBlockedByBurst(ctx, &d, waiting, subjects, pagePolicies.Deciding, pagePolicies.byGeneration, now); err != nil {
			return GenerationDrain{}, 0, err
		}
		if len(page) < f.Limit {
			break
		}
		f.After = next
	}
	if err := e.addUnreconciledShards(ctx, &d, g); err != nil {
		return GenerationDrain{}, 0, err
	}
	return d, active, nil
}

// addUnreconciledShards adds to d the shards of generation g not yet
// reconciled, read a page at a time through the stores' index of them
// (store.Store.ShardsUnreconciled): the generation's open shards, not
// every shard retention still keeps.
func (e *Engine) addUnreconciledShards(ctx context.Context, d *GenerationDrain, g uint64) error {
	f := store.UnreconciledShardFilter{Generation: g, Limit: e.opts.PageSize}
	for {
		shards, err := e.core.store.ShardsUnreconciled(ctx, f)
		if err != nil {
			return fmt.Errorf("unreconciled shards of generation %d: %w", g, err)
		}
		for i := range shards {
			s := &shards[i]
			d.UnreconciledShards++
			for j := range s.Allocated {
				d.ShardUnits[j] = ledger.SumUnits(d.ShardUnits[j], s.Allocated[j])
			}
			if s.IsLegacyBudget() {
				d.LegacyBudgets++
				for j := range s.Allocated {
					d.LegacyUnits[j] = ledger.SumUnits(d.LegacyUnits[j], s.Allocated[j])
				}
			}
		}
		if len(shards) < f.Limit {
			return nil
		}
		f.After = shards[len(shards)-1].ID
	}
}

// addDrain adds one account to d's sums, BlockedNoPolicy and
// BlockedDroppedUnit, and reports whether what it holds can move depends
// on the deciding account (addBlockedByBurst): it holds available
// capacity or debt, d's generation is not active, and another generation
// decides for its subject. When nothing decides for the subject, neither
// capacity nor debt can move anywhere (a rolled-back generation mints
// nothing, so its debt would stay forever); nor can what it holds in a
// unit the deciding generation (its policy in policies) does not limit.
func addDrain(d *GenerationDrain, a *ledger.Account, deciding func(ledger.PolicyKey) (uint64, bool), policies map[uint64]*ledger.Policy) bool {
	d.Accounts++
	for i := 0; i < a.Dims; i++ {
		b := &a.Balances[i]
		d.Reserved[i] = ledger.SumUnits(d.Reserved[i], b.Reserved)
		d.Debt[i] = ledger.SumUnits(d.Debt[i], b.Debt())
		d.Available[i] = ledger.SumUnits(d.Available[i], b.Available)
	}
	if !holds(a) || d.Active {
		return false
	}
	decides, ok := deciding(a.Key.SubjectKey())
	if !ok {
		d.BlockedNoPolicy++
		return false
	}
	if decides == a.Key.Generation {
		return false
	}
	if p := policies[decides]; p != nil && holdsDroppedUnit(a, &d.Policy, p) {
		d.BlockedDroppedUnit++
	}
	return true
}

// holdsDroppedUnit reports whether some dimension of a (under its policy
// ap) holds available capacity in a unit p does not limit: the ledger's
// drain into p's account skips that unit (ledger.drainable matches units
// by name), so it stays on a. Debt in such a unit is not counted: it keeps
// a (or makes it again) its subject's current account, whose refill
// repays it, and the subject switches to p once it is repaid; until then
// it counts in Debt.
func holdsDroppedUnit(a *ledger.Account, ap *ledger.Policy, p *ledger.Policy) bool {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		b := &a.Balances[i]
		if b.Available > 0 && p.DimensionIndex(ap.Dimensions[i].Unit) < 0 {
			return true
		}
	}
	return false
}

// addBlockedByBurst counts in d's BlockedByBurst those of accounts (of
// d's generation, each needing its deciding account: addDrain) whose
// available capacity a drain at now cannot move, in some dimension the
// deciding policy limits: that dimension's ledger.DrainRoom (the deciding
// account refilled to now as the ledger's Drain refills it, then the
// burst's room above available and reserved, plus its debt) is 0. It reads
// the deciding accounts in one store.AccountsOfSubjects of subjects (the
// accounts' subject keys); an account whose subject has no account of the
// deciding generation yet is not blocked (its next command, or the next
// drain, switches). It returns the read's error.
//
// It counts an account when any dimension's capacity cannot move, where
// the ledger's drain runs when any can (ledger.drainable): BLOCKED is
// capacity that stays behind waiting for room, and a drain that moves one
// dimension leaves the other's there. The deciding account refills in the
// drain only when it is its subject's current account. It is, unless the
// subject has an account of a newer generation (one rolled back: a newer
// live one would decide): that one may still be current, and then the
// drain first switches from it, which refills the deciding account
// nothing. So such a deciding account is read as stored; if the subject
// had switched back already, its refill due is not seen.
func (e *Engine) addBlockedByBurst(ctx context.Context, d *GenerationDrain, accounts []*ledger.Account, subjects []ledger.PolicyKey, decidingOf func(ledger.PolicyKey) (uint64, bool), byGeneration map[uint64]*ledger.Policy, now time.Time) error {
	if len(accounts) == 0 {
		return nil
	}
	rows, err := e.core.store.AccountsOfSubjects(ctx, subjects)
	if err != nil {
		return fmt.Errorf("accounts of %d subjects: %w", len(subjects), err)
	}
	deciding := make(map[ledger.PolicyKey]*ledger.Account, len(rows))
	newest := make(map[ledger.PolicyKey]uint64, len(rows))
	for i := range rows {
		subject := rows[i].Key.SubjectKey()
		newest[subject] = max(newest[subject], rows[i].Key.Generation)
		if g, ok := decidingOf(subject); ok && g == rows[i].Key.Generation {
			deciding[subject] = &rows[i]
		}
	}
	for _, a := range accounts {
		subject := a.Key.SubjectKey()
		target := deciding[subject]
		if target == nil {
			continue
		}
		p := byGeneration[target.Key.Generation]
		if p == nil {
			continue
		}
		refills := !p.RolledBack && newest[subject] == target.Key.Generation
		if blockedByBurst(a, &d.Policy, target, p, refills, now) {
			d.BlockedByBurst++
		}
	}
	return nil
}

// blockedByBurst reports whether some dimension of a (under its policy
// ap) holds available capacity that a drain into target (under p, refilled
// to now when refills is set) has no room for (ledger.DrainRoom).
func blockedByBurst(a *ledger.Account, ap *ledger.Policy, target *ledger.Account, p *ledger.Policy, refills bool, now time.Time) bool {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		j := p.DimensionIndex(ap.Dimensions[i].Unit)
		if j < 0 || j >= target.Dims || a.Balances[i].Available <= 0 {
			continue
		}
		if ledger.DrainRoom(p, target, j, refills, now) == 0 {
			return true
		}
	}
	return false
}
