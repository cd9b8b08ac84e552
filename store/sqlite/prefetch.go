package sqlite

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.AccountsPrefetcher = (*Tx)(nil)

// accountPrefetchSizes are the key counts of the prefetch statements,
// largest first; a shorter chunk repeats its last key up to the next size
// (a repeated key returns its row again, which changes nothing).
var accountPrefetchSizes = []int{128, 32, 8}

// accountPrefetchSQL reads, for n (subject, route, region) keys bound in
// order, each subject's current generation and, when it exists, that
// generation's account: the keys drive the join, so each is one seek into
// account_currents and one into accounts, in one statement.
func accountPrefetchSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
	cols := make([]string, 0, 12)
	for _, c := range strings.Split(accountCols, ", ") {
		cols = append(cols, "a."+c)
	}
	return "SELECT c.subject, c.route, c.region, c.generation, a.subject IS NOT NULL, " + strings.Join(cols, ", ") +
		" FROM (VALUES " + values + ") AS k" +
		" JOIN account_currents c ON c.subject = k.column1 AND c.route = k.column2 AND c.region = k.column3" +
		" LEFT JOIN accounts a ON a.subject = c.subject AND a.route = c.route AND a.region = c.region AND a.generation = c.generation"
}

// AccountsPrefetch reads the current generation and its account of every
// subject the row cache does not hold, in key order, up to 128 subjects a
// statement, and caches what it read (a subject without a current row as
// absent), so that AccountCurrentGet and AccountGet answer them from the
// cache. It reads the committed rows, so it does nothing after the first
// Write.
func (tx *Tx) AccountsPrefetch(ctx context.Context, subjects []ledger.PolicyKey) error {
	if err := tx.check(ctx); err != nil {
		return err
	}
	if len(tx.written) > 0 || len(subjects) == 0 {
		return nil
	}
	c := tx.s.cache
	var missing []ledger.PolicyKey
	c.mu.Lock()
	for _, k := range subjects {
		if _, ok := c.currents.get(k); !ok {
			missing = append(missing, k)
		}
	}
	c.mu.Unlock()
	if len(missing) < 2 {
		return nil // one read each is as cheap
	}
	slices.SortFunc(missing, ledger.PolicyKey.Compare)
	missing = slices.Compact(missing)
	args := make([]any, 0, 3*accountPrefetchSizes[0])
	for start := 0; start < len(missing); {
		n := accountPrefetchSizes[0]
		for _, size := range accountPrefetchSizes {
			if size >= len(missing)-start {
				n = size
			}
		}
		chunk := missing[start:min(start+n, len(missing))]
		start += len(chunk)
		args = args[:0]
		for i := range n {
			k := chunk[min(i, len(chunk)-1)]
			args = append(args, k.Subject, k.Route, k.Region)
		}
		st, err := tx.w.stmt(stmtCtx(ctx), accountPrefetchSQL(n))
		if err != nil {
			return fmt.Errorf("prefetch accounts: %w", tx.err(ctx, err))
		}
		found := make(map[ledger.PolicyKey]bool, len(chunk))
		err = tx.w.query(stmtCtx(ctx), st, args, func(sc scanner) error {
			var (
				k          ledger.PolicyKey
				generation int64
				hasAccount bool
			)
			row := sc.(driverRow)
			if err := row[:5].Scan(&k.Subject, &k.Route, &k.Region, &generation, &hasAccount); err != nil {
				return err
			}
			var conv codec.Conv
			g := conv.Uint(generation)
			if err := conv.Err(); err != nil {
				return err
			}
			found[k] = true
			remember(c, c.currents, k, &g, copyRow)
			key := ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g}
			if hasAccount {
				a, err := scanAccount(row[5:])
				if err != nil {
					return err
				}
				remember(c, c.accounts, key, &a, copyRow)
			} else {
				remember(c, c.accounts, key, nil, copyRow)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("prefetch accounts: %w", tx.err(ctx, err))
		}
		for _, k := range chunk {
			if !found[k] {
				remember[ledger.PolicyKey, uint64](c, c.currents, k, nil, copyRow)
			}
		}
	}
	return nil
}
