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
// largest first. Keys go in the largest statement that they fill
// (accountPrefetchChunks); only a last single key is repeated to fill a
// statement of 2 (a repeated key returns its row again, which changes
// nothing). Filling a larger statement with repeats instead cost a seek
// of both tables and a decode and remember of the row per repeat: with
// sizes 128, 32 and 8, 40 keys ran 88 repeats.
var accountPrefetchSizes = []int{128, 64, 32, 16, 8, 4, 2}

// accountPrefetchChunks returns the statement sizes that read n keys (n
// at least 2): the largest size that n still fills, again for the rest,
// and a last single key in the smallest size.
func accountPrefetchChunks(n int) []int {
	var sizes []int
	for n > 0 {
		size := accountPrefetchSizes[len(accountPrefetchSizes)-1]
		for _, s := range accountPrefetchSizes {
			if s <= n {
				size = s
				break
			}
		}
		sizes = append(sizes, size)
		n -= size
	}
	return sizes
}

// accountPrefetchSQL reads, for n (subject, route, region) keys bound in
// order, each subject's current generation and, when it exists, that
// generation's account: the keys drive the join, so each is one seek into
// account_currents and one into accounts, in one statement.
func accountPrefetchSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
	return "SELECT " + currentAccountCols +
		" FROM (VALUES " + values + ") AS k" +
		" JOIN account_currents c ON c.subject = k.column1 AND c.route = k.column2 AND c.region = k.column3" +
		" LEFT JOIN accounts a ON a.subject = c.subject AND a.route = c.route AND a.region = c.region AND a.generation = c.generation"
}

// currentAccountCols selects, from account_currents c LEFT JOIN accounts
// a, a subject's key, its current generation, whether that generation's
// account exists, and the account's columns (scanCurrentAccount).
var currentAccountCols = func() string {
	cols := make([]string, 0, 12)
	for _, c := range strings.Split(accountCols, ", ") {
		cols = append(cols, "a."+c)
	}
	return "c.subject, c.route, c.region, c.generation, a.subject IS NOT NULL, " + strings.Join(cols, ", ")
}()

// scanCurrentAccount scans a row of currentAccountCols: the subject, the
// key of its current generation's account, and that account (nil when
// the generation has none yet).
func scanCurrentAccount(row driverRow) (k ledger.PolicyKey, key ledger.AccountKey, a *ledger.Account, err error) {
	var (
		generation int64
		hasAccount bool
	)
	if err := row[:5].Scan(&k.Subject, &k.Route, &k.Region, &generation, &hasAccount); err != nil {
		return k, key, nil, err
	}
	var conv codec.Conv
	g := conv.Uint(generation)
	if err := conv.Err(); err != nil {
		return k, key, nil, err
	}
	key = ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: g}
	if hasAccount {
		scanned, err := scanAccount(row[5:])
		if err != nil {
			return k, key, nil, err
		}
		a = &scanned
	}
	return k, key, a, nil
}

// accountPrefetchQueries holds accountPrefetchSQL of every size.
var accountPrefetchQueries = func() map[int]string {
	m := map[int]string{}
	for _, n := range accountPrefetchSizes {
		m[n] = accountPrefetchSQL(n)
	}
	return m
}()

// AccountsPrefetch reads the current generation and its account of every
// subject the row cache does not hold, in key order, up to 128 subjects a
// statement, and caches what it read (a subject without a current row as
// absent), so that AccountCurrentGet and AccountGet answer them from the
// cache. It reads the committed rows, so it does nothing after the first
// Write. Named accounts and reservations' accounts are left to AccountGet:
// with one writer there is no lock order to keep.
func (tx *Tx) AccountsPrefetch(ctx context.Context, subjects []ledger.PolicyKey, _ []ledger.AccountKey, _ []string) error {
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
		if !c.currents.has(k) {
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
	start := 0
	for _, n := range accountPrefetchChunks(len(missing)) {
		chunk := missing[start:min(start+n, len(missing))]
		start += len(chunk)
		args = args[:0]
		for i := range n {
			k := chunk[min(i, len(chunk)-1)]
			args = append(args, k.Subject, k.Route, k.Region)
		}
		st, err := tx.w.stmt(stmtCtx(ctx), accountPrefetchQueries[n])
		if err != nil {
			return fmt.Errorf("prefetch accounts: %w", tx.err(ctx, err))
		}
		found := make(map[ledger.PolicyKey]bool, len(chunk))
		err = tx.w.query(stmtCtx(ctx), st, args, func(sc scanner) error {
			k, key, a, err := scanCurrentAccount(sc.(driverRow))
			if err != nil {
				return err
			}
			found[k] = true
			remember(c, c.currents, k, &key.Generation, copyRow)
			remember(c, c.accounts, key, a, copyRow)
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
