package postgres

import (
	"context"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// owingLocked is what a transaction locked of its subjects' owing sets
// (ledger.OwingMetaName and the rows under it) and, with each set, of the
// subject's left_behind rows (ledger.LeftBehindNamesOf): the sets' names, and the
// rows found, by name, kept as the transaction's own Writes leave them.
type owingLocked struct {
	bases map[string]bool
	rows  map[string]int64
}

// get answers an owing-set row of a set already locked: its value and
// whether it is stored; ok is false when name is not such a row.
func (o *owingLocked) get(name string) (value int64, found, ok bool) {
	base, isOwing := lockedWithSet(name)
	if !isOwing || !o.bases[base] {
		return 0, false, false
	}
	value, found = o.rows[name]
	return value, found, true
}

// written records that the transaction stored (or, stored false,
// removed) the named row.
func (o *owingLocked) written(name string, value int64, stored bool) {
	if base, ok := lockedWithSet(name); !ok || !o.bases[base] {
		return
	}
	if stored {
		o.rows[name] = value
	} else {
		delete(o.rows, name)
	}
}

// accounts appends to keys the accounts subject's owing set names (the
// generations the rows under its name hold), as locked.
func (o *owingLocked) accounts(keys []ledger.AccountKey, subject ledger.PolicyKey) []ledger.AccountKey {
	under := ledger.OwingMetaName(subject) + "/"
	for name, g := range o.rows {
		if strings.HasPrefix(name, under) && g > 0 {
			keys = append(keys, ledger.AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: uint64(g)})
		}
	}
	return keys
}

// owes reports whether subject's owing set, as locked, is not empty.
func (o *owingLocked) owes(subject ledger.PolicyKey) bool {
	return o.rows[ledger.OwingMetaName(subject)] > 0
}

// lockedWithSet returns the owing set locked with the Meta row name: the
// set itself, or the one it is a row of (ledger.OwingSetOf), or, for a
// left_behind row (ledger.MetaLeftBehindPrefix), its subject's: a move
// away from an account reads it (and writes it once), a switch opening an
// account reads it, after the subject's accounts were locked. Locked with
// the subject's owing set, after its rows (rankLeftBehind), before the
// accounts, they are read in lock order. ok is false for any other row.
func lockedWithSet(name string) (set string, ok bool) {
	if set, ok := ledger.OwingSetOf(name); ok {
		return set, true
	}
	return ledger.OwingSetOfLeftBehind(name)
}

// lockOwingSQL reads and locks, for the owing sets named as parallel
// arrays ($1 each set's name, $2 and $3 the range of the names under it),
// the set's row and the rows under it, range after range as given (the
// sets in name order, then the left_behind prefixes, each a range whose
// name, lo and prefix are alike), each in name order (the lock order:
// COLLATE "C" compares bytes, as Go compares strings), through meta's
// index of names in bytes order (schema 18): one range per set, from its
// name to the end of the names under it, less the names between (another
// subject's set whose name continues this one's with a byte before "/").
const lockOwingSQL = `SELECT m.name, m.value FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS k(name, lo, hi, ord)
	JOIN meta m ON m.name COLLATE "C" >= k.name AND m.name COLLATE "C" < k.hi
		AND (m.name = k.name OR m.name COLLATE "C" >= k.lo)
	ORDER BY k.ord, m.name COLLATE "C"`

// owingLockMode is how owing-set rows are locked: waiting for a holder as
// in lock order, also when out of it (a transaction locking an account of
// a second subject through AccountGet), unlike the other rows (lockMode).
// Lowering the transaction's lock_timeout for them would shorten every
// wait after, the in-order waits for accounts included, while most such
// reads find no row (a subject that owes nothing has none) and so wait
// for nobody; a wait cycle through the rows of a subject that owes is
// broken by PostgreSQL's deadlock detector (40P01, store.ErrConflict).
const owingLockMode = lockWait

// lockOwing reads and locks the owing-set rows, and the left_behind rows,
// of those of subjects whose set this transaction did not lock yet, in one
// statement (a range of each set's and each left_behind prefix), in lock order
// (rankOwing: before every account; owingLockMode), and keeps them:
// MetaGet answers them without a query. Returns nil or the
// read's error (store.ErrConflict for a lock timeout or deadlock,
// store.ErrUnavailable when the server cannot be reached).
func (t *tx) lockOwing(ctx context.Context, subjects []ledger.PolicyKey) error {
	l := t.owingLookup(subjects)
	if l == nil {
		return nil
	}
	found := map[string]int64{}
	err := t.queryLookup(ctx, func(rows pgx.Rows) error { return scanOwing(rows, found) }, l.sql, l.args...)
	if err != nil {
		return t.s.c.classify("owing sets", err, false)
	}
	t.owingRead(l.bases, found)
	return nil
}

// owingSetsLookup is lockOwing's statement, made by owingLookup, for a
// caller that sends it with others (AccountsPrefetch), scans its rows
// (scanOwing) and records them (owingRead).
type owingSetsLookup struct {
	bases []string
	sql   string
	args  []any
}

// owingLookup returns the lookup of the owing sets of those of subjects
// this transaction did not lock yet (nil: none).
func (t *tx) owingLookup(subjects []ledger.PolicyKey) *owingSetsLookup {
	var bases, leftBehind []string
	for _, k := range subjects {
		if base := ledger.OwingMetaName(k); !t.owing.bases[base] {
			bases = append(bases, base)
			leftBehind = append(leftBehind, ledger.LeftBehindNamesOf(k))
		}
	}
	if len(bases) == 0 {
		return nil
	}
	slices.Sort(bases)
	bases = slices.Compact(bases)
	slices.Sort(leftBehind)
	leftBehind = slices.Compact(leftBehind)
	// A range per set, then one per left_behind prefix (its name, lo and
	// the prefix alike: every name in the range), in lock order.
	names := make([]string, 0, 2*len(bases))
	lo, hi := make([]string, 0, 2*len(bases)), make([]string, 0, 2*len(bases))
	for _, base := range bases {
		names, lo, hi = append(names, base), append(lo, base+"/"), append(hi, store.PrefixEnd(base+"/"))
	}
	for _, prefix := range leftBehind {
		names, lo, hi = append(names, prefix), append(lo, prefix), append(hi, store.PrefixEnd(prefix))
	}
	return &owingSetsLookup{bases: bases, sql: lockOwingSQL + owingLockMode.clause("m"), args: []any{names, lo, hi}}
}

// scanOwing reads the (name, value) rows of an owing-set lookup into
// found.
func scanOwing(rows pgx.Rows, found map[string]int64) error {
	for rows.Next() {
		var name string
		var value int64
		if err := rows.Scan(&name, &value); err != nil {
			return err
		}
		found[name] = value
	}
	return rows.Err()
}

// owingRead records that the owing sets named bases were locked, found
// holding the rows found.
func (t *tx) owingRead(bases []string, found map[string]int64) {
	if t.owing.bases == nil {
		t.owing.bases, t.owing.rows = map[string]bool{}, map[string]int64{}
	}
	for _, base := range bases {
		t.owing.bases[base] = true
	}
	for name, value := range found {
		t.owing.rows[name] = value
		t.locked(metaRow(name))
	}
}

// lockOwingOneSQL is lockOwingSQL for one set ($1 its name, $2 and $3 the
// range of the names under it): a statement whose plan is the same at
// every run (a range of meta's index of names in bytes order).
const lockOwingOneSQL = `SELECT name, value FROM meta WHERE name COLLATE "C" >= $1 AND name COLLATE "C" < $3
	AND (name = $1 OR name COLLATE "C" >= $2) ORDER BY name COLLATE "C"`

// accountAndOwing reads the account of key, locked as mode says, as
// Store.accountGet does; when the transaction did not lock the owing set
// of the account's subject yet, it locks that and the subject's
// left_behind rows first (lockOwing), in the same round trip. Returns what accountGet returns, or the error of the
// owing set's read.
func (t *tx) accountAndOwing(ctx context.Context, key ledger.AccountKey, mode lockMode) (*ledger.Account, int, error) {
	base := ledger.OwingMetaName(key.SubjectKey())
	var conv codec.Conv
	g := conv.Int(key.Generation)
	if t.owing.bases[base] || conv.Err() != nil {
		if !t.owing.bases[base] {
			if err := t.lockOwing(ctx, []ledger.PolicyKey{key.SubjectKey()}); err != nil {
				return nil, 0, err
			}
		}
		return t.s.accountGet(ctx, t.tx, key, mode)
	}
	b := &pgx.Batch{}
	leftBehind := ledger.LeftBehindNamesOf(key.SubjectKey()) // after the set's rows: rankLeftBehind
	b.Queue(lockOwingOneSQL+owingLockMode.clause(""), base, base+"/", store.PrefixEnd(base+"/"))
	b.Queue(lockOwingOneSQL+owingLockMode.clause(""), leftBehind, leftBehind, store.PrefixEnd(leftBehind))
	b.Queue(accountByKeySQL+mode.clause("a, t"), key.Subject, key.Route, key.Region, g)
	br := t.tx.SendBatch(ctx, b)
	found := map[string]int64{}
	var err error
	for range 2 {
		var rows pgx.Rows
		if rows, err = br.Query(); err != nil {
			break
		}
		err = scanOwing(rows, found)
		rows.Close()
		if err != nil {
			break
		}
	}
	var accounts []ledger.Account
	var nrows []int
	if err == nil {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			accounts, nrows, err = scanAccounts(rows)
		}
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return nil, 0, t.s.c.classify("account "+key.String(), err, false)
	}
	t.owingRead([]string{base}, found)
	if len(accounts) == 0 {
		return nil, 0, notFound("account " + key.String())
	}
	return &accounts[0], nrows[0], nil
}
