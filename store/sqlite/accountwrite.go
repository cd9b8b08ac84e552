package sqlite

import (
	"context"
	"fmt"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// accountUpdateCols are the columns the short account UPDATE rewrites: all
// but the key and epoch_indexed. SQLite maintains an index on every UPDATE
// (or upsert) that names one of its columns, whatever the values: the
// upsert of wAccountPut names epoch_indexed and so rewrites the account's
// entry of accounts_by_epoch, a second random page per account written
// (measured: 2.5x the time of a batch over many accounts). The short
// UPDATE names no indexed column, so it writes the table's page only,
// also when it rolls the account's epoch (schema version 14: the index is
// on epoch_indexed, which the epoch worker advances later, in index
// order; see putAccounts). Its value columns are bound as accountArgs
// binds them (the numbers are their positions there).
var accountUpdateCols = []struct {
	name string
	arg  int
}{{"dims", 5}, {"balances", 6}, {"epoch_start", 7}, {"epoch_opening", 8}, {"refilled_to", 9}, {"breaches", 10}, {"version", 11}, {"held_elsewhere", 12}}

// accountKeyArgs are the positions in accountArgs of what the short UPDATE
// matches: the key.
var accountKeyArgs = []struct {
	name string
	arg  int
}{{"subject", 1}, {"route", 2}, {"region", 3}, {"generation", 4}}

// accountUpdateRowsSQL returns the short UPDATE of rows accounts, bound as
// accountArgs binds them, row after row: for one row a plain UPDATE, for
// more an UPDATE ... FROM a VALUES list, one primary-key seek per row. OR
// FAIL: see insertFresh.
func accountUpdateRowsSQL(rows int) string {
	var set, where []string
	if rows == 1 {
		for _, c := range accountUpdateCols {
			set = append(set, fmt.Sprintf("%s = ?%d", c.name, c.arg))
		}
		for _, c := range accountKeyArgs {
			where = append(where, fmt.Sprintf("%s = ?%d", c.name, c.arg))
		}
		return "UPDATE OR FAIL accounts SET " + strings.Join(set, ", ") + " WHERE " + strings.Join(where, " AND ")
	}
	for _, c := range accountUpdateCols {
		set = append(set, fmt.Sprintf("%s = v.column%d", c.name, c.arg))
	}
	for _, c := range accountKeyArgs {
		where = append(where, fmt.Sprintf("accounts.%s = v.column%d", c.name, c.arg))
	}
	row := "(" + params(len(strings.Split(accountCols, ", "))) + ")"
	return "UPDATE OR FAIL accounts SET " + strings.Join(set, ", ") +
		" FROM (VALUES " + strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ") + ") AS v WHERE " +
		strings.Join(where, " AND ")
}

// accountPutSQL is wAccountPut: the upsert of every column, bound as
// accountPutArgs binds them, which sets epoch_indexed to epoch_start (so
// it moves the account's entry of accounts_by_epoch to its epoch).
var accountPutSQL = upsertSQL("accounts", accountCols+", epoch_indexed", "subject, route, region, generation")

// accountPutArgs binds wAccountPut: accountArgs, then epoch_start again
// as epoch_indexed.
func accountPutArgs(a *ledger.Account, c *codec.Conv) []any {
	return append(accountArgs(a, c), c.Nanos(a.EpochStart))
}

// storedEpoch is what a transaction knows of an account's stored row for
// putAccounts: its epoch_start and whether its epoch is idle
// (ledger.Account.EpochIdle: nothing changed in it); and, for the row
// cache's update after the commit (accountSlot), the slot the account was
// read from in the cache, noSlot if it was read from the file.
type storedEpoch struct {
	start int64
	idle  bool
	slot  int32
}

// noteAccountEpoch records the epoch_start the file holds for key and
// whether the row's epoch is idle, so a write of the account can use the
// short UPDATE, and the cache slot it was read from (noSlot: keep the one
// noted before, if any).
func (tx *Tx) noteAccountEpoch(key ledger.AccountKey, epochStart int64, idle bool, slot int32) {
	if tx.storedEpochs == nil {
		tx.storedEpochs = map[ledger.AccountKey]storedEpoch{}
	}
	if slot == noSlot {
		if stored, ok := tx.storedEpochs[key]; ok {
			slot = stored.slot
		}
	}
	tx.storedEpochs[key] = storedEpoch{start: epochStart, idle: idle, slot: slot}
}

// accountSlot returns the row cache slot the transaction read key from
// (noSlot if none): a hint for rowCache.committed.
func (tx *Tx) accountSlot(key ledger.AccountKey) int32 {
	if stored, ok := tx.storedEpochs[key]; ok {
		return stored.slot
	}
	return noSlot
}

// noteAccountDebt records whether the row the file holds for key owes
// (store.RowInDebt), and so whether account_debtors holds its key.
func (tx *Tx) noteAccountDebt(key ledger.AccountKey, owes bool) {
	if tx.storedDebt == nil {
		tx.storedDebt = map[ledger.AccountKey]bool{}
	}
	tx.storedDebt[key] = owes
}

// putDebtors keeps account_debtors in step with the accounts written: the
// key of one that owes is added, that of one that does not is removed. An
// account whose stored row this transaction knows (read or written) costs
// a statement only when it starts or stops owing, so the commands of
// accounts out of debt do not touch the table.
func (tx *Tx) putDebtors(ctx context.Context, accounts []ledger.Account, conv *codec.Conv) error {
	for i := range accounts {
		a := &accounts[i]
		owes := store.RowInDebt(a)
		if owed, known := tx.storedDebt[a.Key]; !known || owed != owes {
			stmt := wDebtorDelete
			if owes {
				stmt = wDebtorPut
			}
			args := []any{a.Key.Subject, a.Key.Route, a.Key.Region, conv.Int(a.Key.Generation)}
			if err := tx.run(ctx, stmt, func() string { return "debtor " + a.Key.String() }, conv, args); err != nil {
				return err
			}
		}
		tx.noteAccountDebt(a.Key, owes)
	}
	return nil
}

// putAccounts writes accounts. Those this transaction read go through
// the short UPDATE, as many a statement as the largest of chunkSizes that
// fits (wAccountUpdateRows), unless their epoch rolled from an idle one;
// the others (a new account, a blind write, a key given twice, an idle
// epoch rolled) and the rows of a chunk that did not update as many rows
// as it holds go one at a time through the upsert, which also moves the
// account's entry of the epoch index (epoch_indexed = epoch_start). Then
// account_debtors follows (putDebtors).
//
// So the roll of a busy epoch, the epoch worker's close or a command's
// inline one, writes no page of accounts_by_epoch: its entry stays at the
// epoch it had, behind epoch_start, until the worker's pass moves it
// (EpochIndexCatchUp), in index order. A roll from an idle epoch moves it
// at once: the worker skips idle accounts, and its pass starts at the
// epochs it has not read yet (engine.EpochScans), so an entry left behind
// there would hide the account from later passes. A busy epoch is one
// the worker closes once it ends, so a busy roll happens at most shortly
// after the worker's pass over that epoch began (before the pass reached
// the account, or between its read and its close): the catch-up at the
// end of that pass, or of the next one, which reads that epoch again
// (engine.EpochLateness), moves the entry.
func (tx *Tx) putAccounts(ctx context.Context, accounts []ledger.Account, conv *codec.Conv) error {
	var seen map[ledger.AccountKey]int
	if len(accounts) > 1 {
		seen = make(map[ledger.AccountKey]int, len(accounts))
		for i := range accounts {
			seen[accounts[i].Key]++
		}
	}
	short := make([]*ledger.Account, 0, len(accounts))
	var upserts []*ledger.Account
	for i := range accounts {
		a := &accounts[i]
		epoch := conv.Nanos(a.EpochStart)
		if err := conv.Err(); err != nil {
			return fmt.Errorf("account %s: %w", a.Key, err)
		}
		if stored, ok := tx.storedEpochs[a.Key]; ok && (stored.start == epoch || !stored.idle) && seen[a.Key] <= 1 {
			short = append(short, a)
		} else {
			upserts = append(upserts, a)
		}
	}
	more, err := execChunks(ctx, tx, conv, nil, short, wAccountUpdateRows,
		func(args []any, a *ledger.Account) []any { return appendAccountArgs(args, a, conv) },
		func(a *ledger.Account) string { return "account " + a.Key.String() })
	if err != nil {
		return err
	}
	upserts = append(upserts, more...)
	for _, a := range upserts {
		if err := tx.run(ctx, wAccountPut, func() string { return "account " + a.Key.String() }, conv, accountPutArgs(a, conv)); err != nil {
			return err
		}
	}
	for i := range accounts {
		a := &accounts[i]
		tx.noteAccountEpoch(a.Key, conv.Nanos(a.EpochStart), a.EpochIdle(), noSlot)
	}
	return tx.putDebtors(ctx, accounts, conv)
}
