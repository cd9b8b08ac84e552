package sqlite

import (
	"context"
	"fmt"

	"github.com/capledger/capledger/ledger"
)

// warmChunk is the most subjects WarmCache reads in one transaction: the
// writer waits for it, about as long as for a batch of commands.
const warmChunk = 1024

// warmSQL reads the subjects after a key, in key order, with their current
// generation and that generation's account (as accountPrefetchSQL).
var warmSQL = "SELECT " + currentAccountCols +
	" FROM account_currents c" +
	" LEFT JOIN accounts a ON a.subject = c.subject AND a.route = c.route AND a.region = c.region AND a.generation = c.generation" +
	" WHERE (c.subject, c.route, c.region) > (?, ?, ?) ORDER BY c.subject, c.route, c.region" +
	fmt.Sprintf(" LIMIT %d", warmChunk)

// WarmCache reads the subjects' current generations and their accounts
// into the row cache, in key order, until the cache's account table is
// full or every subject is cached, so that a server started on a file of
// many tenants does not read two leaves for each tenant's first command.
// It reads in write transactions of warmChunk subjects, so what it caches
// is what the writer would read (the cache only holds committed rows),
// and it never replaces a row the cache already holds. It returns the
// subjects it cached, and ctx's error or the store's if one ended it.
func (s *Store) WarmCache(ctx context.Context) (int, error) {
	var after ledger.PolicyKey
	warmed := 0
	for {
		n, last, full, err := s.warmChunk(ctx, after)
		warmed += n
		if err != nil || full || last == nil {
			return warmed, err
		}
		after = *last
	}
}

// warmChunk caches up to warmChunk subjects after the key after; last is
// the last subject read (nil when none was left) and full reports that
// the cache's account table is full.
func (s *Store) warmChunk(ctx context.Context, after ledger.PolicyKey) (n int, last *ledger.PolicyKey, full bool, err error) {
	t, err := s.Begin(ctx)
	if err != nil {
		return 0, nil, false, fmt.Errorf("warm cache: %w", err)
	}
	tx := t.(*Tx)
	defer tx.Rollback(ctx)
	st, err := tx.w.stmt(stmtCtx(ctx), warmSQL)
	if err != nil {
		return 0, nil, false, fmt.Errorf("warm cache: %w", tx.err(ctx, err))
	}
	c := s.cache
	rows := 0
	err = tx.w.query(stmtCtx(ctx), st, []any{after.Subject, after.Route, after.Region}, func(sc scanner) error {
		k, key, a, err := scanCurrentAccount(sc.(driverRow))
		if err != nil {
			return err
		}
		g := key.Generation
		rows++
		last = &k
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.accounts.len() >= c.accounts.limit || c.currents.len() >= c.currents.limit {
			full = true
			return nil
		}
		if !c.currents.has(k) {
			c.currents.rememberRow(k, &g, copyRow)
		}
		if !c.accounts.has(key) {
			c.accounts.rememberRow(key, a, copyRow)
			n++
		}
		return nil
	})
	if err != nil {
		return n, nil, false, fmt.Errorf("warm cache: %w", tx.err(ctx, err))
	}
	if rows < warmChunk {
		last = nil
	}
	return n, last, full, nil
}
