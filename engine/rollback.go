package engine

import (
	"context"
	"fmt"

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
	// drain cannot move because the deciding account is at its burst;
	// BlockedNoPolicy those holding capacity or debt whose subject no
	// generation decides for.
	BlockedByBurst, BlockedNoPolicy int64
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
func (e *Engine) RunDrains(ctx context.Context) (int, error) {
	p, _, err := e.core.DrainPager(ctx, e.opts.PageSize, nil)
	if err != nil {
		return 0, fmt.Errorf("drains: %w", err)
	}
	ran := 0
	for {
		cmds, err := p.Next(ctx)
		if err != nil {
			return ran, fmt.Errorf("drains: %w", err)
		}
		if len(cmds) == 0 {
			return ran, nil
		}
		e.workerRuns.Add(1)
		e.workerCmds.Add(uint64(len(cmds)))
		for start := 0; start < len(cmds); start += e.opts.MaxBatch {
			end := min(start+e.opts.MaxBatch, len(cmds))
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
// GenerationDrain), reading its accounts page by page and every shard;
// store.ErrNotFound for a generation that does not exist. The deciding
// accounts BlockedByBurst needs are read a page at a time too
// (store.AccountsOfSubjects of the page's subjects that hold capacity),
// not one AccountGet per account.
func (e *Engine) DrainProgress(ctx context.Context, generations []uint64) ([]GenerationDrain, error) {
	policies, err := e.core.store.PolicyList(ctx)
	if err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	active := ledger.NewActiveGenerations(policies)
	byGeneration := make(map[uint64]*ledger.Policy, len(policies))
	for i := range policies {
		byGeneration[policies[i].Generation] = &policies[i]
	}
	shards, err := e.core.store.ShardList(ctx)
	if err != nil {
		return nil, fmt.Errorf("shards: %w", err)
	}
	out := make([]GenerationDrain, 0, len(generations))
	for _, g := range generations {
		p, ok := byGeneration[g]
		if !ok {
			return nil, fmt.Errorf("policy generation %d: %w", g, store.ErrNotFound)
		}
		d := GenerationDrain{Policy: *p}
		if a, ok := active.Active(p.Key); ok && a == g {
			d.Active = true
		}
		f := store.EpochFilter{Generation: g, Limit: e.opts.PageSize}
		var waiting []*ledger.Account
		var subjects []ledger.PolicyKey
		for {
			page, next, err := e.core.store.AccountsByEpoch(ctx, f)
			if err != nil {
				return nil, fmt.Errorf("accounts of generation %d: %w", g, err)
			}
			waiting, subjects = waiting[:0], subjects[:0]
			for i := range page {
				if addDrain(&d, &page[i], active) {
					waiting = append(waiting, &page[i])
					subjects = append(subjects, page[i].Key.SubjectKey())
				}
			}
			if err := e.addBlockedByBurst(ctx, &d, waiting, subjects, active, byGeneration); err != nil {
				return nil, err
			}
			if len(page) < f.Limit {
				break
			}
			f.After = next
		}
		for i := range shards {
			if s := &shards[i]; s.Account.Generation == g && !s.Reconciled {
				d.UnreconciledShards++
				for j := range s.Allocated {
					d.ShardUnits[j] += s.Allocated[j]
				}
				if s.IsLegacyBudget() {
					d.LegacyBudgets++
					for j := range s.Allocated {
						d.LegacyUnits[j] += s.Allocated[j]
					}
				}
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// addDrain adds one account to d's sums and BlockedNoPolicy, and reports
// whether what it holds can move depends on the deciding account
// (addBlockedByBurst): it holds available capacity or debt, d's
// generation is not active, and another generation decides for its
// subject. When nothing decides for the subject, neither capacity nor
// debt can move anywhere (a rolled-back generation mints nothing, so its
// debt would stay forever).
func addDrain(d *GenerationDrain, a *ledger.Account, active ledger.ActiveGenerations) bool {
	d.Accounts++
	for i := 0; i < a.Dims; i++ {
		b := &a.Balances[i]
		d.Reserved[i] += b.Reserved
		d.Debt[i] += b.Debt()
		d.Available[i] += b.Available
	}
	if !holds(a) || d.Active {
		return false
	}
	deciding, ok := active.Deciding(a.Key.SubjectKey())
	if !ok {
		d.BlockedNoPolicy++
		return false
	}
	return deciding != a.Key.Generation
}

// addBlockedByBurst counts in d's BlockedByBurst those of accounts (of
// d's generation, each needing its deciding account: addDrain) that the
// drain cannot move: a drain moves available capacity only up to the
// deciding account's burst, held units included. It reads the deciding
// accounts in one store.AccountsOfSubjects of subjects (the accounts'
// subject keys); an account whose subject has no account of the deciding
// generation yet is not blocked (its next command, or the next drain,
// switches). It returns the read's error.
//
// It reads the ledger's rule (ledger.Drain) off the stored rows, not to
// the letter: an account counts when some dimension's capacity cannot
// move (it stays after a drain), where the ledger drains when any can;
// the deciding account is taken as stored, where the ledger first adds
// its refill due (so one that refill would fill reads here as having
// room, and the account is not counted though its drain moves nothing);
// and its debt is not counted as room, where the ledger repays it with
// the capacity moved.
func (e *Engine) addBlockedByBurst(ctx context.Context, d *GenerationDrain, accounts []*ledger.Account, subjects []ledger.PolicyKey, active ledger.ActiveGenerations, byGeneration map[uint64]*ledger.Policy) error {
	if len(accounts) == 0 {
		return nil
	}
	rows, err := e.core.store.AccountsOfSubjects(ctx, subjects)
	if err != nil {
		return fmt.Errorf("accounts of %d subjects: %w", len(subjects), err)
	}
	deciding := make(map[ledger.PolicyKey]*ledger.Account, len(rows))
	for i := range rows {
		subject := rows[i].Key.SubjectKey()
		if g, ok := active.Deciding(subject); ok && g == rows[i].Key.Generation {
			deciding[subject] = &rows[i]
		}
	}
	for _, a := range accounts {
		target := deciding[a.Key.SubjectKey()]
		if target == nil {
			continue
		}
		p := byGeneration[target.Key.Generation]
		if p == nil {
			continue
		}
		for i := 0; i < a.Dims && i < len(d.Policy.Dimensions); i++ {
			j := p.DimensionIndex(d.Policy.Dimensions[i].Unit)
			if j < 0 || j >= target.Dims || a.Balances[i].Available == 0 {
				continue
			}
			if tb := &target.Balances[j]; tb.Available+tb.Reserved >= p.Dimensions[j].Burst {
				d.BlockedByBurst++
				break
			}
		}
	}
	return nil
}
