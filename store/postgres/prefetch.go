package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.AccountsPrefetcher = (*tx)(nil)

// subjectsPrefetch holds what AccountsPrefetch read, until the next Write:
// a nil entry is a row found absent.
type subjectsPrefetch struct {
	heads    map[ledger.PolicyKey]*ledger.PolicyHead
	currents map[ledger.PolicyKey]*uint64
	accounts map[ledger.AccountKey]*prefetchedAccount
}

type prefetchedAccount struct {
	a    ledger.Account
	rows int // dimension rows (tx.termRows)
}

// The prefetch statements take the keys as parallel arrays and lock as the
// getters do: heads and currents FOR SHARE, accounts and their term rows
// FOR NO KEY UPDATE. Rows are locked in the order of ORDER BY (PostgreSQL
// sorts before it locks), which for accounts is the lock order of rowKey:
// COLLATE "C" compares bytes, as Go compares strings.
const (
	prefetchHeadsSQL = `SELECT h.subject, h.route, h.region, h.active, h.latest
		FROM unnest($1::text[], $2::text[], $3::text[]) AS k(subject, route, region)
		JOIN policy_heads h ON h.subject = k.subject AND h.route = k.route AND h.region = k.region
		ORDER BY h.subject COLLATE "C", h.route COLLATE "C", h.region COLLATE "C" FOR SHARE OF h`
	prefetchCurrentsSQL = `SELECT c.subject, c.route, c.region, c.generation
		FROM unnest($1::text[], $2::text[], $3::text[]) AS k(subject, route, region)
		JOIN account_currents c ON c.subject = k.subject AND c.route = k.route AND c.region = k.region
		ORDER BY c.subject COLLATE "C", c.route COLLATE "C", c.region COLLATE "C" FOR SHARE OF c`
	prefetchAccountsSQL = accountSelect + `
		JOIN unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS k(subject, route, region, generation)
		ON a.subject = k.subject AND a.route = k.route AND a.region = k.region AND a.generation = k.generation
		ORDER BY a.subject COLLATE "C", a.route COLLATE "C", a.region COLLATE "C", a.generation, t.dim`
)

// AccountsPrefetch reads, for the subjects not prefetched yet in this
// transaction, their policy heads and current generations (share-locked,
// both statements in one round trip) and then, in a second round trip,
// the accounts of those generations, the named accounts and the accounts
// of the named reservations that ReservationsPrefetch read (the accounts a
// batch's settles, releases and expiries change), with their terms, all
// locked in one statement in lock order; it keeps them until the next Write:
// PolicyHeadGet, AccountCurrentGet and AccountGet then answer them without
// a query, as they would have answered by reading (a row found absent is
// ErrNotFound and remembered as absent, so Write inserts it). Fewer than
// two rows to lock are left to the getters (one read each is as cheap).
//
// Locking every account of the batch in one order is what keeps two
// replicas' batches over the same accounts from waiting on each other in
// a cycle: a settle's account read by its getter after the prefetch had
// locked a later account was an out-of-order lock (tx.lockMode), which
// ends in a lock timeout (55P03) or a deadlock (40P01) whenever the other
// batch holds it and waits for one of ours.
//
// The accounts are locked like AccountGet locks one: waiting when the first
// sorts after every row held, else with the short out-of-order lock wait
// (tx.lockMode). Returns nil or the error of a read (store.ErrConflict for
// a lock timeout or deadlock, store.ErrUnavailable when the server cannot
// be reached).
func (t *tx) AccountsPrefetch(ctx context.Context, subjects []ledger.PolicyKey, named []ledger.AccountKey, reservations []string) error {
	if t.done {
		return fmt.Errorf("accounts prefetch: %w", pgx.ErrTxClosed)
	}
	p := &t.subjects
	keys := make([]ledger.PolicyKey, 0, len(subjects))
	for _, k := range subjects {
		if _, ok := p.currents[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, ledger.PolicyKey.Compare)
	keys = slices.Compact(keys)
	extra := slices.Clone(named)
	for _, id := range reservations {
		if r := t.prefetched[id]; r != nil {
			extra = append(extra, r.Account)
		}
	}
	extra = slices.DeleteFunc(extra, func(k ledger.AccountKey) bool {
		_, ok := p.accounts[k]
		return ok
	})
	if len(keys)+len(extra) < 2 {
		return nil
	}
	// The owing sets of every subject whose accounts are locked below,
	// before them (rankOwing), in the round trip of the heads and
	// currents; and with those accounts, the accounts a set names and,
	// for a subject whose head was read, the deciding generation's
	// account: a command of a subject that owes reads them all (ledger's
	// settleOwing), which after the accounts below were locked out of
	// order.
	owingSubjects := slices.Clone(keys)
	for _, k := range extra {
		owingSubjects = append(owingSubjects, k.SubjectKey())
	}
	heads := make(map[ledger.PolicyKey]*ledger.PolicyHead, len(keys))
	currents := make(map[ledger.PolicyKey]*uint64, len(keys))
	if len(keys) > 0 {
		if err := t.prefetchCurrents(ctx, keys, heads, currents, t.owingLookup(owingSubjects)); err != nil {
			return err
		}
	} else if err := t.lockOwing(ctx, owingSubjects); err != nil {
		return err
	}

	wanted := extra
	for _, k := range keys {
		if g := currents[k]; g != nil {
			wanted = append(wanted, ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: *g})
		}
		if h := heads[k]; h != nil && h.Active != 0 && t.owing.owes(k) {
			wanted = append(wanted, ledger.AccountKey{Subject: k.Subject, Route: k.Route, Region: k.Region, Generation: h.Active})
		}
	}
	for _, k := range owingSubjects {
		wanted = t.owing.accounts(wanted, k)
	}
	wanted = slices.DeleteFunc(wanted, func(k ledger.AccountKey) bool {
		_, ok := p.accounts[k]
		return ok
	})
	slices.SortFunc(wanted, func(x, y ledger.AccountKey) int { return compareRowKeys(accountRow(x), accountRow(y)) })
	wanted = slices.Compact(wanted)
	accounts := make(map[ledger.AccountKey]*prefetchedAccount, len(wanted))
	if len(wanted) > 0 {
		// wanted is in lock order.
		mode, err := t.lockMode(ctx, accountRow(wanted[0]))
		if err != nil {
			return err
		}
		subj, route, region := make([]string, 0, len(wanted)), make([]string, 0, len(wanted)), make([]string, 0, len(wanted))
		gens := make([]int64, 0, len(wanted))
		for _, k := range wanted {
			var conv codec.Conv
			g := conv.Int(k.Generation)
			if conv.Err() != nil {
				continue // no such row, as accountGet finds
			}
			subj, route, region, gens = append(subj, k.Subject), append(route, k.Route), append(region, k.Region), append(gens, g)
		}
		var found []ledger.Account
		var nrows []int
		err = t.queryLookup(ctx, func(rows pgx.Rows) (err error) {
			found, nrows, err = scanAccounts(rows)
			return err
		}, prefetchAccountsSQL+mode.clause("a, t"), subj, route, region, gens)
		if err != nil {
			return t.s.c.classify("accounts prefetch", err, false)
		}
		for i := range found {
			accounts[found[i].Key] = &prefetchedAccount{a: found[i], rows: nrows[i]}
			t.locked(accountRow(found[i].Key))
		}
	}

	if p.currents == nil {
		p.heads = make(map[ledger.PolicyKey]*ledger.PolicyHead, len(keys))
		p.currents = make(map[ledger.PolicyKey]*uint64, len(keys))
		p.accounts = make(map[ledger.AccountKey]*prefetchedAccount, len(wanted))
	}
	for _, k := range keys {
		p.heads[k] = heads[k]
		p.currents[k] = currents[k]
	}
	for _, k := range wanted {
		p.accounts[k] = accounts[k]
	}
	return nil
}

// prefetchCurrents reads the policy heads and current generations of keys
// (sorted), share-locked, in one round trip, into heads and currents, and
// in the same round trip the owing sets of owing (when not nil), which it
// records (owingRead).
func (t *tx) prefetchCurrents(ctx context.Context, keys []ledger.PolicyKey,
	heads map[ledger.PolicyKey]*ledger.PolicyHead, currents map[ledger.PolicyKey]*uint64, owing *owingSetsLookup) error {
	subj, route, region := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		subj[i], route[i], region[i] = k.Subject, k.Route, k.Region
	}
	b := t.lookupBatch()
	b.Queue(prefetchHeadsSQL, subj, route, region)
	b.Queue(prefetchCurrentsSQL, subj, route, region)
	if owing != nil {
		b.Queue(owing.sql, owing.args...)
	}
	br, err := b.send(ctx, t.tx)
	if err != nil {
		return t.s.c.classify("accounts prefetch", err, false)
	}
	err = scanPrefetch(br, func(r pgx.Rows, k ledger.PolicyKey, conv *codec.Conv) error {
		var active, latest int64
		if err := r.Scan(&k.Subject, &k.Route, &k.Region, &active, &latest); err != nil {
			return err
		}
		heads[k] = &ledger.PolicyHead{Key: k, Active: conv.Uint(active), Latest: conv.Uint(latest)}
		return nil
	})
	if err == nil {
		err = scanPrefetch(br, func(r pgx.Rows, k ledger.PolicyKey, conv *codec.Conv) error {
			var generation int64
			if err := r.Scan(&k.Subject, &k.Route, &k.Region, &generation); err != nil {
				return err
			}
			g := conv.Uint(generation)
			currents[k] = &g
			return nil
		})
	}
	found := map[string]int64{}
	if err == nil && owing != nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			err = scanOwing(rows, found)
			rows.Close()
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return t.s.c.classify("accounts prefetch", err, false)
	}
	if owing != nil {
		t.owingRead(owing.bases, found)
	}
	return nil
}

// scanPrefetch reads the next result of br, a row at a time.
func scanPrefetch(br pgx.BatchResults, scan func(pgx.Rows, ledger.PolicyKey, *codec.Conv) error) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var conv codec.Conv
		if err := scan(rows, ledger.PolicyKey{}, &conv); err != nil {
			return err
		}
		if err := conv.Err(); err != nil {
			return err
		}
	}
	return rows.Err()
}

// prefetchedHead answers PolicyHeadGet from the prefetch: ok is false when
// key was not prefetched.
func (t *tx) prefetchedHead(key ledger.PolicyKey) (h *ledger.PolicyHead, ok bool) {
	h, ok = t.subjects.heads[key]
	if ok && h != nil {
		copied := *h
		h = &copied
	}
	return h, ok
}

// forgetPrefetch drops what AccountsPrefetch read (after a Write the
// getters read again, seeing the transaction's own writes).
func (t *tx) forgetPrefetch() {
	t.subjects = subjectsPrefetch{}
}
