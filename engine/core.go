// Package engine drives the pure ledger over a durable store: it orders
// commands, groups concurrent ones into one store transaction (group
// commit), answers each caller only once its batch is durable, and runs the
// background workers (expiry, unknown-usage marking, epoch close).
//
// Its core, Core, is a step function with no goroutines and no clock: the
// simulator calls it directly with simulated time. Engine wraps Core with
// the goroutines and the real clock.
package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Core applies batches of commands to a store. It is not safe for
// concurrent use; Engine serialises calls.
type Core struct {
	store store.Store
}

// NewCore returns a Core over st.
func NewCore(st store.Store) *Core { return &Core{store: st} }

// Store returns the store the core writes to.
func (c *Core) Store() store.Store { return c.store }

// Commit applies cmds in order, in one store transaction, at time now, and
// returns one result per command. Results are valid only when err is nil:
// then every command's effect is durable. On error nothing of the batch is
// applied (or, for store.ErrUnavailable, the outcome is unknown and the
// callers must resolve it by retrying with the same ids); err wraps
// store.ErrConflict when the whole batch may simply be run again.
func (c *Core) Commit(ctx context.Context, cmds []ledger.Command, now time.Time) ([]ledger.Result, error) {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx)
	if prefetcher, ok := tx.(store.Prefetcher); ok && len(cmds) > 1 {
		ids := make([]string, 0, len(cmds))
		for i := range cmds {
			if cmds[i].ReservationID != "" {
				ids = append(ids, cmds[i].ReservationID)
			}
		}
		if err := prefetcher.ReservationsPrefetch(ctx, ids); err != nil {
			return nil, fmt.Errorf("prefetch: %w", err)
		}
	}
	book := store.NewBook(ctx, tx, len(cmds))
	results := make([]ledger.Result, len(cmds))
	for i := range cmds {
		results[i] = ledger.Apply(book, &cmds[i], now)
		if err := book.Err(); err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
	}
	changes := book.Changes()
	if changes.Empty() {
		return results, nil
	}
	if err := tx.Write(ctx, changes); err != nil {
		if errors.Is(err, store.ErrDuplicate) {
			// A concurrent writer (another replica) inserted the same
			// receipt first; re-running the batch turns it into a replay.
			err = fmt.Errorf("%w: %w", store.ErrConflict, err)
		}
		return nil, fmt.Errorf("write: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return results, nil
}

// Due returns the worker commands due at now, for at most limit
// reservations: an expiry claim and its completion for RESERVED holds past
// their TTL, the completion for EXPIRING ones, and USAGE_UNKNOWN marking
// for STARTED work past its execution deadline. The commands are safe to
// run in any interleaving with gateway commands: the ledger's
// compare-and-set rules decide (a start that wins makes the claim fail).
func (c *Core) Due(ctx context.Context, now time.Time, limit int) ([]ledger.Command, error) {
	ids, err := c.store.ReservationsDue(ctx, now, limit)
	if err != nil {
		return nil, fmt.Errorf("due reservations: %w", err)
	}
	cmds := make([]ledger.Command, 0, 2*len(ids))
	for _, id := range ids {
		r, err := c.store.ReservationGet(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("due reservation %s: %w", id, err)
		}
		switch r.State {
		case ledger.StateReserved:
			cmds = append(cmds,
				ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: id},
				ledger.Command{Kind: ledger.KindExpire, ReservationID: id})
		case ledger.StateExpiring:
			cmds = append(cmds, ledger.Command{Kind: ledger.KindExpire, ReservationID: id})
		case ledger.StateStarted:
			// Listed as an expired hold and started since (the start's
			// batch committed between the listing and this re-read): due
			// only once its own execution deadline has passed.
			if !r.ExecutionDeadline.IsZero() && !now.Before(r.ExecutionDeadline) {
				cmds = append(cmds, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id})
			}
		}
	}
	return cmds, nil
}

// EpochsDue returns close-epoch commands for every account whose accounting
// epoch ended before now, so idle accounts get their statements too.
func (c *Core) EpochsDue(ctx context.Context, now time.Time) ([]ledger.Command, error) {
	accounts, err := c.store.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	policies := map[uint64]time.Duration{}
	var cmds []ledger.Command
	for i := range accounts {
		a := &accounts[i]
		length, ok := policies[a.Key.Generation]
		if !ok {
			p, err := c.store.PolicyGet(ctx, a.Key.Generation)
			if err != nil {
				return nil, fmt.Errorf("policy %d: %w", a.Key.Generation, err)
			}
			length = p.EpochLength
			policies[a.Key.Generation] = length
		}
		if length > 0 && !now.Before(a.EpochStart.Add(length)) {
			cmds = append(cmds, ledger.Command{Kind: ledger.KindCloseEpoch, Account: a.Key})
		}
	}
	return cmds, nil
}

// DrainsDue returns drain commands for accounts of superseded or
// rolled-back generations that still hold available capacity or debt
// (late refunds and late overuse land there after a generation switch or a
// rollback). A drain moves them to the subject's current account exactly
// once; the ledger answers ErrNothingToDrain where there is nothing to do,
// so a candidate picked too eagerly costs one no-op command.
func (c *Core) DrainsDue(ctx context.Context) ([]ledger.Command, error) {
	policies, err := c.store.PolicyList(ctx)
	if err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	// The generation that admits for a key: its newest one not rolled
	// back (the ledger's PolicyHead says the same; reads outside a
	// transaction have only the rows).
	active := map[ledger.PolicyKey]uint64{}
	for i := range policies {
		if p := &policies[i]; !p.RolledBack && p.Generation > active[p.Key] {
			active[p.Key] = p.Generation
		}
	}
	accounts, err := c.store.AccountList(ctx, ledger.PolicyKey{})
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	var cmds []ledger.Command
	for i := range accounts {
		a := &accounts[i]
		subject := a.Key.SubjectKey()
		deciding, ok := active[subject]
		if !ok {
			deciding, ok = active[ledger.PolicyKey{Subject: ledger.AnySubject, Route: subject.Route, Region: subject.Region}]
		}
		if !ok || deciding == a.Key.Generation {
			continue // nothing admits for the subject, or this account is the one that does
		}
		for d := 0; d < a.Dims; d++ {
			if a.Balances[d].Available > 0 || a.Balances[d].Debt() > 0 {
				cmds = append(cmds, ledger.Command{Kind: ledger.KindDrain, Account: a.Key})
				break
			}
		}
	}
	return cmds, nil
}
