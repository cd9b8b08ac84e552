package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
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
	wReservationPut
	wMoveInsert
	wShardPut
	wDataVersion
	wReservationPrefetchSmall
	wReservationPrefetch
	wJournalBatchInsert
	wDebtorPut
	wDebtorDelete
	wMetaDelete
	nBaseStmts
)

// Multi-row INSERTs: one statement for many rows saves the per-statement
// work of the driver and of database/sql, which dominates a batch's CPU
// time. Each kind has one statement per size in chunkSizes; a batch's rows
// go in the largest chunks that fit (at most one statement per size for the
// remainder below the largest).
const (
	// wReservationRows inserts new reservations, every column bound.
	wReservationRows = nBaseStmts + iota*len(chunkSizes)
	// wFreshReservationRows inserts new RESERVED reservations with nothing
	// started, settled or overdrawn (what a reserve writes): the columns
	// that are then zero are literals, so a row binds 10 values, not 19.
	wFreshReservationRows
	// wFreshSharedRows inserts fresh reservations of one account created
	// at one time (see freshSharedCols): what they share is bound once per
	// statement, and a row binds 3 values.
	wFreshSharedRows
	// wReservationUpdateRows updates reservations the transaction read
	// (reservationwrite.go): their lifecycle columns only.
	wReservationUpdateRows
	// wAccountUpdateRows updates accounts the transaction read
	// (accountwrite.go): every column but the key and epoch_indexed.
	wAccountUpdateRows
	// wStatementRows inserts the statements of closed epochs: a rollover
	// closes every busy account's epoch, 64 a worker chunk.
	wStatementRows
	nWriteStmts
)

// chunkSizes are the row counts of the multi-row INSERTs, largest first,
// ending in 1. 64 rows of 20 parameters stay far below SQLite's limit
// (32766); a batch of 100 takes 3 statements (64, 32, 4), not 4.
var chunkSizes = [...]int{64, 32, 16, 8, 4, 2, 1}

// prefetchSmall and prefetchChunk are the id counts of the two
// ReservationsPrefetch statements (binding unused parameters costs too, so
// small batches use the small one).
const (
	prefetchSmall = 8
	prefetchChunk = 64
)

var writeSQL = buildWriteSQL()

func buildWriteSQL() [nWriteStmts]string {
	sql := baseWriteSQL
	for k, rows := range chunkSizes {
		sql[wReservationRows+k] = insertRowsSQL("reservations", reservationCols, rows, "due_at")
		sql[wFreshReservationRows+k] = freshReservationsSQL(rows)
		sql[wFreshSharedRows+k] = freshSharedSQL(rows)
		sql[wReservationUpdateRows+k] = reservationUpdateRowsSQL(rows)
		sql[wAccountUpdateRows+k] = accountUpdateRowsSQL(rows)
		sql[wStatementRows+k] = insertRowsSQL("statements", statementCols, rows)
	}
	return sql
}

// freshColumns are the columns of a fresh reservation (see
// wFreshReservationRows) in the order appendFreshReservationArgs binds
// them (due_at is expires_at again); freshLiterals the values of the
// others.
var (
	freshColumns  = "id, request_digest, subject, route, region, generation, accounting_epoch, reserved, created_at, expires_at, due_at"
	freshLiterals = map[string]string{
		"actual":             fmt.Sprintf("X'%X'", codec.EncodeAmounts(&ledger.Amounts{})),
		"overdraft":          fmt.Sprintf("X'%X'", codec.EncodeAmounts(&ledger.Amounts{})),
		"operation_id":       "''",
		"state":              fmt.Sprint(int64(ledger.StateReserved)),
		"started_at":         "0",
		"execution_deadline": "0",
		"unknown_at":         "0",
		"finished_at":        "0",
		"breach":             "0",
	}
)

// freshReservationsSQL returns the INSERT of rows fresh reservations.
// Parameters are anonymous: the driver reads the name of every numbered
// one into a new string on each execution.
func freshReservationsSQL(rows int) string {
	bound := strings.Split(freshColumns, ", ")
	var row []string
	for range bound {
		row = append(row, "?")
	}
	for _, c := range strings.Split(reservationCols, ", ") {
		if lit, ok := freshLiterals[c]; ok {
			bound = append(bound, c)
			row = append(row, lit)
		}
	}
	if len(bound) != len(strings.Split(reservationCols, ", "))+1 {
		panic("fresh reservation columns do not cover the table") // a build defect, caught by every test
	}
	values := strings.TrimSuffix(strings.Repeat("("+strings.Join(row, ", ")+"), ", rows), ", ")
	return insertFresh + " (" + strings.Join(bound, ", ") + ") VALUES " + values
}

// insertFresh starts the multi-row INSERTs of new reservations. OR FAIL:
// a row that breaks a constraint ends the statement without undoing its
// earlier rows, so SQLite keeps no statement journal (a copy of every page
// the statement changes) for them. Nothing is lost: after any failed
// statement the Tx refuses to commit and rolls back whole.
const insertFresh = "INSERT OR FAIL INTO reservations"

// freshSharedCols and freshSharedRow are the bound columns of
// wFreshSharedRows: what the rows share (?1 to ?7: the account key, the
// accounting epoch, created_at and expires_at, the last again as due_at),
// then per row what appendFreshSharedArgs binds. A batch applies its
// commands at one time, so a reserve batch's reservations of one account
// share all of these.
const (
	freshSharedCols   = "subject, route, region, generation, accounting_epoch, created_at, expires_at, due_at"
	freshSharedParams = "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7"
	freshSharedRow    = "id, request_digest, reserved"
	freshSharedRowN   = 3
)

// freshSharedSQL returns the INSERT of rows fresh reservations that share
// freshSharedCols. The row parameters are anonymous (numbered on from the
// largest so far). Every numbered parameter costs on each execution: the
// driver asks SQLite for the name of every parameter, a linear search of
// the statement's named ones.
func freshSharedSQL(rows int) string {
	cols := freshSharedCols + ", " + freshSharedRow
	var literals []string
	for _, c := range strings.Split(reservationCols, ", ") {
		if lit, ok := freshLiterals[c]; ok {
			cols += ", " + c
			literals = append(literals, lit)
		}
	}
	if len(strings.Split(cols, ", ")) != len(strings.Split(reservationCols, ", "))+1 {
		panic("fresh reservation columns do not cover the table") // a build defect, caught by every test
	}
	row := []string{freshSharedParams}
	for range freshSharedRowN {
		row = append(row, "?")
	}
	value := "(" + strings.Join(append(row, literals...), ", ") + ")"
	return insertFresh + " (" + cols + ") VALUES " + strings.TrimSuffix(strings.Repeat(value+", ", rows), ", ")
}

var baseWriteSQL = [nWriteStmts]string{
	wMetaGet:        "SELECT value FROM meta WHERE name = ?",
	wPolicyGet:      "SELECT " + policyCols + " FROM policies WHERE generation = ?",
	wHeadGet:        "SELECT " + headCols + " FROM policy_heads WHERE subject = ? AND route = ? AND region = ?",
	wAccountGet:     "SELECT " + accountCols + " FROM accounts WHERE subject = ? AND route = ? AND region = ? AND generation = ?",
	wCurrentGet:     "SELECT generation FROM account_currents WHERE subject = ? AND route = ? AND region = ?",
	wReservationGet: "SELECT " + reservationCols + " FROM reservations WHERE id = ?",
	wMoveGet:        "SELECT " + moveCols + " FROM moves WHERE receipt_id = ?",
	wShardGet:       "SELECT " + shardCols + " FROM shards WHERE id = ?",
	wMetaPut:        upsertSQL("meta", "name, value", "name"),
	wPolicyPut:      upsertSQL("policies", policyCols, "generation"),
	wHeadPut:        upsertSQL("policy_heads", headCols, "subject, route, region"),
	wAccountPut:     accountPutSQL,
	wCurrentPut:     upsertSQL("account_currents", currentCols, "subject, route, region"),
	wReservationPut: upsertSQL("reservations", reservationCols, "id", "due_at"),
	wMoveInsert:     insertSQL("moves", moveCols),
	wShardPut:       upsertSQL("shards", shardCols, "id"),

	wDataVersion:              "PRAGMA data_version",
	wReservationPrefetchSmall: "SELECT " + reservationCols + " FROM reservations WHERE id IN (" + params(prefetchSmall) + ")",
	wReservationPrefetch:      "SELECT " + reservationCols + " FROM reservations WHERE id IN (" + params(prefetchChunk) + ")",
	wJournalBatchInsert:       "INSERT INTO journal_batches (entries) VALUES (?)",
	wDebtorPut:                "INSERT OR IGNORE INTO account_debtors (subject, route, region, generation) VALUES (?, ?, ?, ?)",
	wDebtorDelete:             "DELETE FROM account_debtors WHERE subject = ? AND route = ? AND region = ? AND generation = ?",
	wMetaDelete:               "DELETE FROM meta WHERE name = ?",
}

// params returns n comma-separated placeholders.
func params(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// readStmts are the Store's read methods, prepared on the read pool.
type readStmts struct {
	reservation, account, accountsOf, accountsAll, policy, head, policies, policiesAfter, policyPage, meta, shard, shards, due *sql.Stmt
	unknownFirst, unknownAfter, unknownBacklog                                                                                 *sql.Stmt
	debtFirst, debtAfter                                                                                                       *sql.Stmt
	// debtorCount counts account_debtors (AccountsInDebtCount).
	debtorCount          *sql.Stmt
	pageFirst, pageAfter *sql.Stmt
	// pageOfSubject is AccountsPage's read with a subject.
	pageOfSubject *sql.Stmt
	// pageOfRoute and pageOfRoutePast are its reads of a route's
	// accounts (no subject) by accounts_by_route.
	pageOfRoute, pageOfRoutePast *sql.Stmt
	// The epoch worker's reads, one of each per generation a pass: parsed
	// at every call they were half its CPU with a policy per tenant.
	epochFirst, epochAfter, catchUpFirst, catchUpAfter *sql.Stmt
	// Their forms across generations, a few a pass.
	acrossFirst, acrossAfter, catchUpAcrossFirst, catchUpAcrossAfter *sql.Stmt
	// accountsOfSubjects holds accountsOfSubjectsSQL of each size of
	// subjectChunkSizes, in that order.
	accountsOfSubjects [len(subjectChunkSizes)]*sql.Stmt
	// headsOf holds headsOfSQL of each size of subjectChunkSizes.
	headsOf [len(subjectChunkSizes)]*sql.Stmt
	// policyPageOfSubject is PolicyPage's read with a subject.
	policyPageOfSubject *sql.Stmt
	// policiesOf holds policiesOfSQL of each size of subjectChunkSizes.
	policiesOf [len(subjectChunkSizes)]*sql.Stmt
	// owingOf holds owingOfSubjectsSQL of each size of subjectChunkSizes.
	owingOf [len(subjectChunkSizes)]*sql.Stmt
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
	r.head = prep(writeSQL[wHeadGet])
	r.policies = prep("SELECT " + policyCols + " FROM policies ORDER BY generation")
	r.policiesAfter = prep("SELECT " + policyCols + " FROM policies WHERE generation > ? ORDER BY generation")
	r.policyPage = prep(policyPageSQL)
	r.policyPageOfSubject = prep(policyPageOfSubjectSQL)
	r.meta = prep(writeSQL[wMetaGet])
	r.shard = prep(writeSQL[wShardGet])
	r.shards = prep("SELECT " + shardCols + " FROM shards ORDER BY id")
	r.due = prep(dueSQL)
	r.unknownFirst = prep(unknownFirstSQL)
	r.unknownAfter = prep(unknownAfterSQL)
	r.unknownBacklog = prep(unknownBacklogSQL)
	r.debtorCount = prep("SELECT count(*) FROM account_debtors")
	r.debtFirst = prep(debtFirstSQL)
	r.debtAfter = prep(debtAfterSQL)
	r.pageFirst = prep(pageFirstSQL)
	r.pageAfter = prep(pageAfterSQL)
	r.pageOfSubject = prep(pageOfSubjectSQL)
	r.pageOfRoute = prep(pageOfRouteSQL)
	r.pageOfRoutePast = prep(pageOfRoutePastSQL)
	r.epochFirst = prep(epochFirstSQL)
	r.epochAfter = prep(epochAfterSQL)
	r.catchUpFirst = prep(catchUpFirstSQL)
	r.catchUpAfter = prep(catchUpAfterSQL)
	r.acrossFirst = prep(acrossFirstSQL)
	r.acrossAfter = prep(acrossAfterSQL)
	r.catchUpAcrossFirst = prep(catchUpAcrossFirstSQL)
	r.catchUpAcrossAfter = prep(catchUpAcrossAfterSQL)
	for i, n := range subjectChunkSizes {
		r.accountsOfSubjects[i] = prep(accountsOfSubjectsSQL(n))
		r.headsOf[i] = prep(headsOfSQL(n))
		r.policiesOf[i] = prep(policiesOfSQL(n))
		r.owingOf[i] = prep(owingOfSubjectsSQL(n))
	}
	return errors.Join(errs...)
}

func (r *readStmts) close() {
	stmts := []*sql.Stmt{r.reservation, r.account, r.accountsOf, r.accountsAll, r.policy, r.head, r.policies, r.policiesAfter, r.policyPage, r.policyPageOfSubject, r.meta, r.shard, r.shards, r.due,
		r.unknownFirst, r.unknownAfter, r.unknownBacklog, r.debtorCount, r.debtFirst, r.debtAfter, r.pageFirst, r.pageAfter, r.pageOfSubject, r.pageOfRoute, r.pageOfRoutePast,
		r.epochFirst, r.epochAfter, r.catchUpFirst, r.catchUpAfter,
		r.acrossFirst, r.acrossAfter, r.catchUpAcrossFirst, r.catchUpAcrossAfter}
	stmts = append(stmts, r.headsOf[:]...)
	stmts = append(stmts, r.policiesOf[:]...)
	stmts = append(stmts, r.owingOf[:]...)
	for _, st := range append(stmts, r.accountsOfSubjects[:]...) {
		if st != nil {
			st.Close()
		}
	}
}

// dueSQL is ReservationsDue's query, with ?1 = now and ?2 = limit: id,
// state and due_at of each row (state from the table, one lookup per row
// the index found).
// Two index range scans, each stopping early: what is due by time
// (the partial index reservations_due, read in (due_at, id) order up to
// now), and the EXPIRING rows whose due_at is still ahead (the small
// partial index reservations_expiring). One "due_at <= now OR state =
// EXPIRING" scan would instead walk every live reservation on each
// worker tick. The state literal must match the index's WHERE for
// SQLite to use it.
var dueSQL = fmt.Sprintf(`SELECT id, state, due_at FROM (
		SELECT id, state, due_at FROM (SELECT id, state, due_at FROM reservations
			WHERE due_at IS NOT NULL AND due_at <= ?1 ORDER BY due_at, id LIMIT ?2)
		UNION ALL
		SELECT id, state, due_at FROM reservations WHERE state = %d AND due_at > ?1
	) ORDER BY due_at, id LIMIT ?2`, ledger.StateExpiring)

// The USAGE_UNKNOWN queries read the partial index
// reservations_usage_unknown_at (unknown_at, id WHERE state = 8), whose
// predicate the literal state here must match for SQLite to use it. The
// list reads the index in (unknown_at, id) order and stops after ?3 rows;
// subject and route (?1 and ?2, ” for any) filter the rows it finds.
// unknownAfterSQL starts strictly after the cursor (?4, ?5): a seek into
// the index, so a deep page costs what the first one does. The first page
// has a statement of its own because no cursor value sorts before every
// row.
var (
	unknownWhere = fmt.Sprintf("state = %d AND (?1 = '' OR subject = ?1) AND (?2 = '' OR route = ?2)",
		ledger.StateUsageUnknown)
	unknownFirstSQL = "SELECT " + reservationCols + " FROM reservations WHERE " + unknownWhere +
		" ORDER BY unknown_at, id LIMIT ?3"
	unknownAfterSQL = "SELECT " + reservationCols + " FROM reservations WHERE " + unknownWhere +
		" AND (unknown_at, id) > (?4, ?5) ORDER BY unknown_at, id LIMIT ?3"
	// unknownBacklogSQL reads the whole index and nothing else (count
	// needs every entry); min of nothing is NULL, read as 0, the zero time.
	unknownBacklogSQL = fmt.Sprintf("SELECT count(*), COALESCE(min(unknown_at), 0) FROM reservations WHERE state = %d",
		ledger.StateUsageUnknown)
)

// The AccountsInDebt queries read the keys of account_debtors in order,
// from the first or strictly after the key (?2, ?3, ?4, ?5) (a seek into
// its primary key), and each one's account by primary key, up to ?1: they
// read debtors only, whatever the number of accounts. CROSS JOIN keeps
// account_debtors the outer loop. The first page has a statement of its
// own because no key value sorts before every row.
var (
	debtFrom     = " FROM account_debtors d CROSS JOIN accounts a USING (subject, route, region, generation)"
	debtFirstSQL = "SELECT " + accountCols + debtFrom + " ORDER BY d.subject, d.route, d.region, d.generation LIMIT ?1"
	debtAfterSQL = "SELECT " + accountCols + debtFrom +
		" WHERE (d.subject, d.route, d.region, d.generation) > (?2, ?3, ?4, ?5) ORDER BY d.subject, d.route, d.region, d.generation LIMIT ?1"
)

// The AccountsPage queries seek the accounts' primary key at the cursor
// (?2, ?3, ?4, ?5) and read ?1 rows in its order.
var (
	pageFirstSQL = "SELECT " + accountCols + " FROM accounts ORDER BY subject, route, region, generation LIMIT ?1"
	pageAfterSQL = "SELECT " + accountCols + " FROM accounts" +
		" WHERE (subject, route, region, generation) > (?2, ?3, ?4, ?5) ORDER BY subject, route, region, generation LIMIT ?1"
	// pageOfSubjectSQL is AccountsPage's read of one subject (?2): its
	// range of the primary key, from strictly after (?3, ?4, ?5) (route,
	// region, generation; ("", "", -1) is before every row), ?1 rows
	// whose route and region match ?6 and ?7 (each when not empty). It
	// reads the subject's accounts only, whatever the other subjects'.
	pageOfSubjectSQL = "SELECT " + accountCols + " FROM accounts" +
		" WHERE subject = ?2 AND (route, region, generation) > (?3, ?4, ?5)" +
		" AND (?6 = '' OR route = ?6) AND (?7 = '' OR region = ?7) ORDER BY route, region, generation LIMIT ?1"
	// pageOfRouteSQL is AccountsPage's read of one route's accounts (?2)
	// without a subject: its range of accounts_by_route (schema 21) from
	// strictly after (?3, ?4, ?5) (subject, region, generation: the
	// route's key order, store.AccountFilter.RouteSeek), ?1 rows whose
	// region matches ?6 when not empty. It reads the route's accounts
	// only, whatever the other routes'.
	pageOfRouteSQL = "SELECT " + accountCols + " FROM accounts" +
		" WHERE route = ?2 AND (subject, region, generation) > (?3, ?4, ?5)" +
		" AND (?6 = '' OR region = ?6) ORDER BY subject, region, generation LIMIT ?1"
	// pageOfRoutePastSQL is pageOfRouteSQL from the first account of a
	// subject greater than ?3.
	pageOfRoutePastSQL = "SELECT " + accountCols + " FROM accounts" +
		" WHERE route = ?2 AND subject > ?3 AND (?4 = '' OR region = ?4) ORDER BY subject, region, generation LIMIT ?1"
)

// subjectChunkSizes are the subject counts of AccountsOfSubjects'
// statements, smallest first: the subjects go in statements of the
// largest, and the rest in the smallest that holds it, its free places
// bound to NULL (which no key equals, so they cost no row). A page of 100
// debtors is one statement; 5 of them one of 8.
var subjectChunkSizes = [...]int{8, 32, 128}

// accountsOfSubjectsSQL reads the accounts of n (subject, route, region)
// keys bound in order, every generation: a seek of the primary key per
// key. It has no ORDER BY, which SQLite ran as a sort of the rows in a
// temporary B-tree; AccountsOfSubjects orders the few rows it returns.
func accountsOfSubjectsSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
	return "SELECT " + accountCols + " FROM accounts WHERE (subject, route, region) IN (VALUES " + values + ")"
}

// policiesOfSQL reads the policies of n generations bound in order: a
// seek of the primary key per generation, as PolicyGet's.
func policiesOfSQL(n int) string {
	return "SELECT " + policyCols + " FROM policies WHERE generation IN (" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
}

// headsOfSQL reads the policy heads of n (subject, route, region) keys
// bound in order: a seek of the primary key per key, as PolicyHead's.
func headsOfSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
	return "SELECT " + headCols + " FROM policy_heads WHERE (subject, route, region) IN (VALUES " + values + ")"
}
