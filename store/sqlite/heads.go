package sqlite

import (
	"context"
	"fmt"

	"github.com/capledger/capledger/ledger"
)

// completeHeadsMax is the most policy heads the row cache loads whole.
// A policy head exists per published policy key, so most ledgers have a
// handful while their subjects number in the millions: with every head
// cached, a command for a subject without a policy of its own (decided by
// the route's "*" policy) learns that from the cache instead of a B-tree
// miss per subject, which also kept one negative entry per subject in the
// cache. A ledger with more heads than this looks each one up as before.
const completeHeadsMax = 1 << 14

var headsAllSQL = "SELECT " + headCols + " FROM policy_heads LIMIT ?1"

// completeHeads loads every policy head into the row cache and marks its
// heads table complete, once per cache generation, when the table has at
// most completeHeadsMax rows and fits the cache bound. It reads the
// committed rows, so it runs only before the transaction's first Write;
// a failure leaves the cache as it was (the getter then reads one row).
func (tx *Tx) completeHeads(ctx context.Context) error {
	c := tx.s.cache
	c.mu.Lock()
	done := c.heads.complete || c.headsTooMany
	c.mu.Unlock()
	if done || len(tx.written) > 0 {
		return nil
	}
	if err := tx.check(ctx); err != nil {
		return err
	}
	st, err := tx.w.stmt(stmtCtx(ctx), headsAllSQL)
	if err != nil {
		return fmt.Errorf("policy heads: %w", tx.err(ctx, err))
	}
	limit := min(completeHeadsMax, c.heads.limit)
	var heads []ledger.PolicyHead
	err = tx.w.query(stmtCtx(ctx), st, []any{int64(limit + 1)}, func(sc scanner) error {
		h, err := scanHead(sc)
		heads = append(heads, h)
		return err
	})
	if err != nil {
		return fmt.Errorf("policy heads: %w", tx.err(ctx, err))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(heads) > limit {
		// Too many to hold whole: remember it until the cache starts over.
		c.headsTooMany = true
		return nil
	}
	// Start the table over with exactly the rows of the SQL table (no
	// eviction can happen: limit rows at most), dropping the entries of
	// absent keys that completeness makes redundant.
	c.heads.reset()
	for i := range heads {
		c.heads.rememberRow(heads[i].Key, &heads[i], nil)
	}
	c.heads.complete = true
	return nil
}
