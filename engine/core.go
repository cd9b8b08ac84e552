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
// then every command's effect is durable. On error err wraps ErrNotApplied
// when nothing of the batch was applied (it failed before its COMMIT was
// sent, or the commit was refused as a conflict or known rolled back:
// store.ErrRolledBack); otherwise (COMMIT answered store.ErrUnavailable)
// the outcome is unknown and the callers
// must resolve it by retrying with the same ids; err wraps
// store.ErrConflict when the whole batch may simply be run again.
func (c *Core) Commit(ctx context.Context, cmds []ledger.Command, now time.Time) ([]ledger.Result, error) {
	return c.commit(ctx, cmds, now, false, nil)
}

// CommitDeferred is Commit for pipelined durability: over a store that is
// a store.Syncer opened Pipelined, the batch is committed without waiting
// for its fsync, and its results may be given to the callers only once a
// Sync that began after CommitDeferred returned has returned nil (a crash
// before that may lose the batch, with every later one). Over any other
// store it is Commit.
func (c *Core) CommitDeferred(ctx context.Context, cmds []ledger.Command, now time.Time) ([]ledger.Result, error) {
	return c.commit(ctx, cmds, now, true, nil)
}

// Pipelined reports whether the store defers its fsyncs to Sync.
func (c *Core) Pipelined() bool {
	s, ok := c.store.(store.Syncer)
	return ok && s.Pipelined()
}

// Sync makes every batch CommitDeferred committed before it durable
// (store.Syncer.Sync); over a store that is not pipelined it does nothing.
// Its error is permanent.
func (c *Core) Sync(ctx context.Context) error {
	if s, ok := c.store.(store.Syncer); ok {
		return s.Sync(ctx)
	}
	return nil
}

// errCallerGone: a batch found, once it held the rows it read, that a
// caller of its commands had stopped waiting (Engine.commit drops that
// caller's commands and runs the rest again).
var errCallerGone = errors.New("a caller stopped waiting before the batch was written")

// commit is Commit (deferred: CommitDeferred). When wanted is set it is
// asked after the commands were applied to the transaction's reads (the
// rows they read are held until it ends) and before anything is written:
// false rolls the batch back, not applied, with errCallerGone.
func (c *Core) commit(ctx context.Context, cmds []ledger.Command, now time.Time, deferred bool, wanted func() bool) ([]ledger.Result, error) {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		// The store's error names the step ("begin: ..."): store.Store.
		return nil, fmt.Errorf("%w: %w", ErrNotApplied, err)
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
			return nil, fmt.Errorf("prefetch: %w: %w", ErrNotApplied, err)
		}
	}
	if prefetcher, ok := tx.(store.AccountsPrefetcher); ok && len(cmds) > 1 {
		if err := prefetcher.AccountsPrefetch(ctx, reserveSubjects(cmds), namedAccounts(cmds), refundIDs(cmds)); err != nil {
			return nil, fmt.Errorf("prefetch accounts: %w: %w", ErrNotApplied, err)
		}
	}
	book := store.NewBook(ctx, tx, len(cmds))
	results := make([]ledger.Result, len(cmds))
	for i := range cmds {
		results[i] = ledger.Apply(book, &cmds[i], now)
		if err := book.Err(); err != nil {
			return nil, fmt.Errorf("read: %w: %w", ErrNotApplied, err)
		}
	}
	if err := recheckRejected(ctx, tx, cmds, results); err != nil {
		return nil, err
	}
	changes := book.Changes()
	if changes.Empty() {
		return results, nil
	}
	if wanted != nil && !wanted() {
		return nil, fmt.Errorf("%w: %w", ErrNotApplied, errCallerGone)
	}
	if err := tx.Write(ctx, changes); err != nil {
		if errors.Is(err, store.ErrDuplicate) {
			// A concurrent writer (another replica) inserted the same
			// receipt first; re-running the batch turns it into a replay.
			err = fmt.Errorf("%w: %w", store.ErrConflict, err)
		}
		return nil, fmt.Errorf("write: %w: %w", ErrNotApplied, err)
	}
	commit := tx.Commit
	if dc, ok := tx.(store.DeferredCommitter); ok && deferred {
		commit = dc.CommitDeferred
	}
	if err := commit(ctx); err != nil {
		if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrRolledBack) {
			// Refused and rolled back: the store's word for a conflict, or
			// for a COMMIT it knows did not commit (SQLite: a full disk).
			return nil, fmt.Errorf("%w: %w", ErrNotApplied, err)
		}
		// Anything else during COMMIT (store.ErrUnavailable): it may
		// have committed; the outcome is unknown.
		return nil, err
	}
	return results, nil
}

// recheckRejected returns an error wrapping store.ErrConflict (and
// ErrNotApplied) when a reserve of cmds that results reject for capacity
// names an id another transaction has committed meanwhile; nil otherwise,
// or the error of the read.
//
// Two attempts of one reservation id (a caller's retry on another
// replica, or the same batch's command queued on two) can run at once
// over a store that lets transactions interleave (PostgreSQL, READ
// COMMITTED): this batch looked the id up before the other committed
// (absent: nothing to lock), then locked the account, which the other
// held, and read it as the other left it, with the id's units gone. Its
// rejection would tell the caller "rejected" for an id the store holds
// (CLIENTS.md: a resend admits it, replays it, or rejects it). Once this
// batch holds its account locks, a fresh read of the ids it rejected
// (store.ReservationsRechecker: one statement, nothing written, and only
// for batches with a rejected reserve) finds any that committed before
// those locks were granted, and the batch runs again: the id now replays.
//
// Left over: an attempt that commits after this batch's locks were
// granted took the account's lock after this batch ended, so it read the
// account as this rejection left it (unchanged but for a refill), and it
// admits only if room came back meanwhile (a release, a refill): it runs
// after the rejection was answered, as a later request would. A caller
// resends only after giving up on an attempt, and Engine drops an attempt
// whose caller's context has ended (dropAbandoned; its last check,
// wanted, is made while its batch holds the account, so a resend that
// comes later waits for that batch and replays). So a rejected resend
// stays rejected unless the replica running the earlier attempt has not
// yet seen its request end (no deadline sent with it, a connection whose
// close has not reached it), or the caller keeps waiting for two attempts
// at once: each is then answered as the store stood when it ran.
func recheckRejected(ctx context.Context, tx store.Tx, cmds []ledger.Command, results []ledger.Result) error {
	rechecker, ok := tx.(store.ReservationsRechecker)
	if !ok {
		return nil
	}
	var ids []string
	for i := range cmds {
		if cmds[i].Kind == ledger.KindReserve && (results[i].Rejected() || errors.Is(results[i].Err, ledger.ErrLifetimeExhausted)) {
			ids = append(ids, cmds[i].ReservationID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	found, err := rechecker.ReservationsCommitted(ctx, ids)
	if err != nil {
		return fmt.Errorf("recheck: %w: %w", ErrNotApplied, err)
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: %w: reservation %s was committed by another attempt after this batch looked it up", ErrNotApplied, store.ErrConflict, found[0])
	}
	return nil
}

// MetaReadyProbe is the meta row Probe writes: the time of the last probe
// that committed, in Unix nanoseconds. Nothing reads it. A probe that
// stands in for a batch also rewrites the pad rows MetaReadyProbe+".pad.N"
// (N < ProbePadMax), so the meta table holds at most that many more rows.
const MetaReadyProbe = "engine_ready_probe"

// ProbePadMax caps the pad rows of a Probe (about 40 bytes each).
const ProbePadMax = 2048

// Probe commits one write transaction (MetaReadyProbe set to now, plus pad
// more meta rows, capped at ProbePadMax) durably, with Commit's fsync: nil
// when the store takes a write of that size now; otherwise the Begin,
// Write or Commit error. A write, not a read: a store that answers reads
// but refuses writes (a full disk, a PostgreSQL primary demoted to a
// read-only standby) is not ready. The pad makes the probe as large as the
// batch it stands in for: on a full disk one small row can fit where a
// batch does not.
func (c *Core) Probe(ctx context.Context, now time.Time, pad int) error {
	tx, err := c.store.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	meta := map[string]int64{MetaReadyProbe: now.UnixNano()}
	for i := range min(pad, ProbePadMax) {
		meta[fmt.Sprintf("%s.pad.%04d", MetaReadyProbe, i)] = now.UnixNano()
	}
	if err := tx.Write(ctx, &store.Changes{Meta: meta}); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	return nil
}

// reserveSubjects returns the distinct subjects the reserves and records
// of cmds name, and those of the accounts drains empty (a drain moves
// into the subject's current account): the current accounts a batch of
// them reads.
func reserveSubjects(cmds []ledger.Command) []ledger.PolicyKey {
	var subjects []ledger.PolicyKey
	seen := map[ledger.PolicyKey]bool{}
	for i := range cmds {
		var k ledger.PolicyKey
		switch cmds[i].Kind {
		case ledger.KindReserve, ledger.KindRecord:
			k = ledger.PolicyKey{Subject: cmds[i].Subject, Route: cmds[i].Route, Region: cmds[i].Region}
		case ledger.KindDrain:
			k = cmds[i].Account.SubjectKey()
		default:
			continue
		}
		if !seen[k] {
			seen[k] = true
			subjects = append(subjects, k)
		}
	}
	return subjects
}

// namedAccounts returns the distinct accounts cmds name directly (refill,
// close-epoch and drain commands).
func namedAccounts(cmds []ledger.Command) []ledger.AccountKey {
	var accounts []ledger.AccountKey
	seen := map[ledger.AccountKey]bool{}
	for i := range cmds {
		k := cmds[i].Account
		if k != (ledger.AccountKey{}) && !seen[k] {
			seen[k] = true
			accounts = append(accounts, k)
		}
	}
	return accounts
}

// refundIDs returns the reservation ids of the commands of cmds that change
// their reservation's account (settle, release, expiry; a start, an expiry
// claim or an unknown marking changes only the reservation).
func refundIDs(cmds []ledger.Command) []string {
	var ids []string
	for i := range cmds {
		switch cmds[i].Kind {
		case ledger.KindSettle, ledger.KindRelease, ledger.KindExpire:
			ids = append(ids, cmds[i].ReservationID)
		}
	}
	return ids
}

// Due returns the worker commands due at now, for at most limit
// reservations: an expiry claim and its completion for RESERVED holds past
// their TTL, the completion for EXPIRING ones, and USAGE_UNKNOWN marking
// for STARTED work past its execution deadline. It decides from the
// store's listing alone (store.ReservationsDue: each row's state and due
// time), without reading the rows again. Every command carries its cause
// (ledger.CauseHoldExpired, ledger.CauseExecutionLimit), and the ledger
// checks the row again when it applies the command, inside the batch's
// transaction, so the commands are safe in any interleaving with gateway
// commands: a Start, Settle or Release that commits between the listing
// and the worker's batch makes the claim fail (or the expiry a no-op), and
// never makes the started work unknown unless its own execution deadline
// has passed.
func (c *Core) Due(ctx context.Context, now time.Time, limit int) ([]ledger.Command, error) {
	due, err := c.store.ReservationsDue(ctx, now, limit)
	if err != nil {
		return nil, fmt.Errorf("due reservations: %w", err)
	}
	cmds := make([]ledger.Command, 0, 2*len(due))
	for i := range due {
		id := due[i].ID
		switch due[i].State {
		case ledger.StateReserved:
			cmds = append(cmds,
				ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: id, Cause: ledger.CauseHoldExpired},
				ledger.Command{Kind: ledger.KindExpire, ReservationID: id, Cause: ledger.CauseHoldExpired})
		case ledger.StateExpiring:
			cmds = append(cmds, ledger.Command{Kind: ledger.KindExpire, ReservationID: id, Cause: ledger.CauseHoldExpired})
		case ledger.StateStarted:
			// Listed for its execution deadline, the only reason a
			// store lists started work; the rule is kept here too, where
			// the command is chosen.
			if !due[i].DueAt.IsZero() && !now.Before(due[i].DueAt) {
				cmds = append(cmds, ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id, Cause: ledger.CauseExecutionLimit})
			}
		}
	}
	return cmds, nil
}

// EpochsDue returns close-epoch commands for every account whose
// accounting epoch ended by now and whose balances changed in it (an idle
// one's next command closes its epochs): every page of EpochPager at once
// (the simulator's stores are small; the engine's worker commits page by
// page instead).
func (c *Core) EpochsDue(ctx context.Context, now time.Time) ([]ledger.Command, error) {
	p, err := c.EpochPager(ctx, now, DefaultPageSize, nil)
	if err != nil {
		return nil, err
	}
	return p.all(ctx)
}

// DrainsDue returns drain commands for accounts of superseded or
// rolled-back generations that still hold available capacity or debt:
// every page of DrainPager at once.
func (c *Core) DrainsDue(ctx context.Context) ([]ledger.Command, error) {
	p, _, err := c.DrainPager(ctx, DefaultPageSize, nil, nil)
	if err != nil {
		return nil, err
	}
	return p.all(ctx)
}
