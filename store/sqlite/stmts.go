package sqlite

import (
	"github.com/capledger/capledger/ledger"

	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Write-connection statements, prepared once at Open: the hot path of every
// command runs them without parsing SQL.
const (
	wMetaGet = iota
	wPolicyGet
	wHeadGet
	wAccountGet
	wCurrentGet
	wReservationGet
	wMoveGet
	wShardGet
	wMetaPut
	wPolicyPut
	wHeadPut
	wAccountPut
	wCurrentPut
	wReservationInsert
	wReservationPut
	wMoveInsert
	wShardPut
	wStatementInsert
	wJournalInsert
	wReservationInsertChunk
	wJournalInsertChunk
	wDataVersion
	wReservationPrefetchSmall
	wReservationPrefetch
	nWriteStmts
)

// prefetchSmall and prefetchChunk are the id counts of the two
// ReservationsPrefetch statements (binding unused parameters costs too, so
// small batches use the small one).
const (
	prefetchSmall = 8
	prefetchChunk = 64
)

// insertChunk is how many rows one multi-row INSERT of new reservations or
// journal entries carries (19 and 11 parameters a row, far below SQLite's
// limit). A batch's rows go in full chunks, the remainder one by one.
const insertChunk = 25

var writeSQL = [nWriteStmts]string{
	wMetaGet:           "SELECT value FROM meta WHERE name = ?",
	wPolicyGet:         "SELECT " + policyCols + " FROM policies WHERE generation = ?",
	wHeadGet:           "SELECT " + headCols + " FROM policy_heads WHERE subject = ? AND route = ? AND region = ?",
	wAccountGet:        "SELECT " + accountCols + " FROM accounts WHERE subject = ? AND route = ? AND region = ? AND generation = ?",
	wCurrentGet:        "SELECT generation FROM account_currents WHERE subject = ? AND route = ? AND region = ?",
	wReservationGet:    "SELECT " + reservationCols + " FROM reservations WHERE id = ?",
	wMoveGet:           "SELECT " + moveCols + " FROM moves WHERE receipt_id = ?",
	wShardGet:          "SELECT " + shardCols + " FROM shards WHERE id = ?",
	wMetaPut:           upsertSQL("meta", "name, value", "name"),
	wPolicyPut:         upsertSQL("policies", policyCols, "generation"),
	wHeadPut:           upsertSQL("policy_heads", headCols, "subject, route, region"),
	wAccountPut:        upsertSQL("accounts", accountCols, "subject, route, region, generation"),
	wCurrentPut:        upsertSQL("account_currents", currentCols, "subject, route, region"),
	wReservationInsert: insertSQL("reservations", reservationCols, "due_at"),
	wReservationPut:    upsertSQL("reservations", reservationCols, "id", "due_at"),
	wMoveInsert:        insertSQL("moves", moveCols),
	wShardPut:          upsertSQL("shards", shardCols, "id"),
	wStatementInsert:   insertSQL("statements", statementCols),
	wJournalInsert:     insertSQL("journal", journalCols),

	wReservationInsertChunk: insertRowsSQL("reservations", reservationCols, insertChunk, "due_at"),
	wJournalInsertChunk:     insertRowsSQL("journal", journalCols, insertChunk),

	wDataVersion:              "PRAGMA data_version",
	wReservationPrefetchSmall: "SELECT " + reservationCols + " FROM reservations WHERE id IN (" + params(prefetchSmall) + ")",
	wReservationPrefetch:      "SELECT " + reservationCols + " FROM reservations WHERE id IN (" + params(prefetchChunk) + ")",
}

// params returns n comma-separated placeholders.
func params(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

type writeStmts struct {
	stmts [nWriteStmts]*sql.Stmt
}

func (w *writeStmts) prepare(ctx context.Context, db *sql.DB) error {
	for i, q := range writeSQL {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", q, err)
		}
		w.stmts[i] = st
	}
	return nil
}

func (w *writeStmts) close() {
	for _, st := range w.stmts {
		if st != nil {
			st.Close()
		}
	}
}

// readStmts are the Store's read methods, prepared on the read pool.
type readStmts struct {
	reservation, account, accountsOf, accountsAll, policy, policies, shard, shards, due *sql.Stmt
}

func (r *readStmts) prepare(ctx context.Context, db *sql.DB) error {
	var errs []error
	prep := func(q string) *sql.Stmt {
		st, err := db.PrepareContext(ctx, q)
		if err != nil {
			errs = append(errs, fmt.Errorf("prepare %q: %w", q, err))
		}
		return st
	}
	r.reservation = prep(writeSQL[wReservationGet])
	r.account = prep(writeSQL[wAccountGet])
	r.accountsOf = prep("SELECT " + accountCols + " FROM accounts WHERE subject = ? AND route = ? AND region = ? ORDER BY generation")
	r.accountsAll = prep("SELECT " + accountCols + " FROM accounts ORDER BY subject, route, region, generation")
	r.policy = prep(writeSQL[wPolicyGet])
	r.policies = prep("SELECT " + policyCols + " FROM policies ORDER BY generation")
	r.shard = prep(writeSQL[wShardGet])
	r.shards = prep("SELECT " + shardCols + " FROM shards ORDER BY id")
	r.due = prep(dueSQL)
	return errors.Join(errs...)
}

func (r *readStmts) close() {
	for _, st := range []*sql.Stmt{r.reservation, r.account, r.accountsOf, r.accountsAll, r.policy, r.policies, r.shard, r.shards, r.due} {
		if st != nil {
			st.Close()
		}
	}
}

// dueSQL is ReservationsDue's query, with ?1 = now and ?2 = limit.
// Two index range scans, each stopping early: what is due by time
// (the partial index reservations_due, read in (due_at, id) order up to
// now), and the EXPIRING rows whose due_at is still ahead (the small
// partial index reservations_expiring). One "due_at <= now OR state =
// EXPIRING" scan would instead walk every live reservation on each
// worker tick. The state literal must match the index's WHERE for
// SQLite to use it.
var dueSQL = fmt.Sprintf(`SELECT id FROM (
		SELECT id, due_at FROM (SELECT id, due_at FROM reservations
			WHERE due_at IS NOT NULL AND due_at <= ?1 ORDER BY due_at, id LIMIT ?2)
		UNION ALL
		SELECT id, due_at FROM reservations WHERE state = %d AND due_at > ?1
	) ORDER BY due_at, id LIMIT ?2`, ledger.StateExpiring)
