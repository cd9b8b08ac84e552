package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.ConsoleStore = (*Store)(nil)

// The console's reads run on the read connections; its two small records
// (resolver answers, audit records) are written in write transactions of
// their own, like rollouts.
const (
	// The subject's range of the index, and its rows for route and state.
	subjectStatesSQL = "SELECT r.route, r.state, count(*) FROM reservation_subjects s CROSS JOIN reservations r ON r.id = s.id" +
		" WHERE s.subject = ?1 AND r.subject = ?1 GROUP BY r.route, r.state ORDER BY r.route, r.state"
	retainedOfSQL = "SELECT subject, route, region, generation, reservations FROM retained WHERE subject = ? AND reservations > 0" +
		" ORDER BY subject, route, region, generation"
	statementsOfSQL = "SELECT " + statementCols + " FROM statements WHERE subject = ?1 AND route = ?2 AND region = ?3" +
		" AND generation = ?4 AND epoch_start < ?5 ORDER BY epoch_start DESC LIMIT ?6"
	answerCols   = "reservation_id, subject, route, region, generation, answer, detail, asked_at, attempts, next_at"
	answerPutSQL = "INSERT OR REPLACE INTO resolver_answers (" + answerCols + ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
	// An answer is of the reservation its id names only when that
	// reservation is of its account (store.ResolverAnswer).
	answerOfItsReservation = "r.id = a.reservation_id AND r.subject = a.subject AND r.route = a.route AND r.region = a.region" +
		" AND r.generation = a.generation AND r.state = 8"
	answersStaleSQL = "SELECT reservation_id, subject, route, region, generation FROM resolver_answers a" +
		" WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE " + answerOfItsReservation + ")"
	answerDeleteSQL   = "DELETE FROM resolver_answers WHERE reservation_id = ? AND subject = ? AND route = ? AND region = ? AND generation = ?"
	auditCols         = "at, by, mode, discrepancies, checks"
	auditRecordsSQL   = "SELECT name, " + auditCols + " FROM audit_records"
	auditRecordPutSQL = "INSERT INTO audit_records (name, " + auditCols + ") VALUES (?, ?, ?, ?, ?, ?)" +
		" ON CONFLICT (name) DO UPDATE SET at = excluded.at, by = excluded.by, mode = excluded.mode," +
		" discrepancies = excluded.discrepancies, checks = excluded.checks WHERE excluded.at >= audit_records.at"
)

var (
	// subjectRowCols are reservationCols of the row r.
	subjectRowCols = "r." + strings.ReplaceAll(reservationCols, ", ", ", r.")
	// ?2 is the set of states listed, bit s for state s (see statesMask):
	// one backwards range of reservation_subjects (subject, created_at,
	// id), each entry's row read by id and its state tested. CROSS JOIN
	// keeps the index the outer loop. An entry whose row is gone or names
	// another subject is skipped.
	subjectFirstSQL = "SELECT " + subjectRowCols + " FROM reservation_subjects s CROSS JOIN reservations r ON r.id = s.id" +
		" WHERE s.subject = ?1 AND r.subject = ?1 AND (?2 >> r.state) & 1 ORDER BY s.created_at DESC, s.id DESC LIMIT ?3"
	subjectBeforeSQL = "SELECT " + subjectRowCols + " FROM reservation_subjects s CROSS JOIN reservations r ON r.id = s.id" +
		" WHERE s.subject = ?1 AND r.subject = ?1 AND (?2 >> r.state) & 1 AND (s.created_at, s.id) < (?4, ?5)" +
		" ORDER BY s.created_at DESC, s.id DESC LIMIT ?3"
)

// pendingRowsSQL reads the rows of n pending entries by id.
func pendingRowsSQL(n int) string {
	return "SELECT " + reservationCols + " FROM reservations WHERE id IN (" + params(n) + ")"
}

// pendingStatesSQL reads the route and state of those of n pending
// entries' rows (?1 the subject, then the ids) whose entry the table does
// not hold yet: a flush may have written some since pending was read.
func pendingStatesSQL(n int) string {
	return "SELECT r.route, r.state FROM reservations r WHERE r.id IN (" + params(n) + ") AND r.subject = ?" +
		" AND NOT EXISTS (SELECT 1 FROM reservation_subjects s WHERE s.subject = r.subject AND s.created_at = r.created_at AND s.id = r.id)"
}

// readQuery is a query text run on the read connections, in the shape
// queryAll takes.
type readQuery struct {
	db *sql.DB
	q  string
}

func (r readQuery) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return r.db.QueryContext(ctx, r.q, args...)
}

func (s *Store) reader(q string) readQuery { return readQuery{s.readDB, q} }

// ReservationsOfSubject returns up to f.Limit of the subject's
// reservations in f's states, newest first: the subject's pending subject
// index entries (subjectindex.go), read first, merged with one range of
// reservation_subjects, the rows of other states skipped. An entry in
// both is listed once.
func (s *Store) ReservationsOfSubject(ctx context.Context, f store.SubjectFilter) (_ []ledger.Reservation, err error) {
	defer s.readBarrier(ctx, &err)
	defer s.subjects.complete("reservations of "+f.Subject, s.subjects.begin(), &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if err := f.Check(); err != nil {
		return nil, err
	}
	var c codec.Conv
	before := c.Nanos(f.Before.CreatedAt)
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("reservations of %s: cursor: %w", f.Subject, err)
	}
	what := "reservations of " + f.Subject
	states := statesMask(f.StatesList())
	var cursor *subjectKey
	if f.Before != (store.SubjectCursor{}) {
		cursor = &subjectKey{f.Subject, before, f.Before.ID}
	}
	// Pending first: an entry a flush moves meanwhile is in the table
	// when the table is read.
	pending := s.subjects.of(f.Subject, cursor)
	if len(pending) == 0 { // one statement, no transaction to begin
		if cursor == nil {
			return queryAll(ctx, s.reader(subjectFirstSQL), scanReservation, what, f.Subject, states, f.Limit)
		}
		return queryAll(ctx, s.reader(subjectBeforeSQL), scanReservation, what, f.Subject, states, f.Limit,
			before, f.Before.ID)
	}
	tx, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, translate(ctx, err))
	}
	defer tx.Rollback()
	var out []ledger.Reservation
	for from := 0; from < len(pending) && len(out) < f.Limit; {
		n := min(len(pending)-from, retentionChunk)
		for n&(n-1) != 0 {
			n &= n - 1 // a power of two: a few statement texts serve every page
		}
		args := make([]any, n)
		for i, k := range pending[from : from+n] {
			args[i] = k.id
		}
		from += n
		rows, err := queryAll(ctx, txQuery{tx, pendingRowsSQL(n)}, scanReservation, what, args...)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			if r.Account.Subject == f.Subject && states>>r.State&1 == 1 {
				out = append(out, r)
			}
		}
	}
	var table []ledger.Reservation
	if cursor == nil {
		table, err = queryAll(ctx, txQuery{tx, subjectFirstSQL}, scanReservation, what, f.Subject, states, f.Limit)
	} else {
		table, err = queryAll(ctx, txQuery{tx, subjectBeforeSQL}, scanReservation, what, f.Subject, states, f.Limit,
			before, f.Before.ID)
	}
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return table, nil
	}
	seen := make(map[string]bool, len(out))
	for _, r := range out {
		seen[r.ID] = true
	}
	for _, r := range table {
		if !seen[r.ID] {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b ledger.Reservation) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), strings.Compare(b.ID, a.ID))
	})
	return out[:min(len(out), f.Limit)], nil
}

// statesMask returns states as a set of bits, bit s for state s (every
// state is below 64).
func statesMask(states []ledger.State) int64 {
	var mask int64
	for _, st := range states {
		mask |= 1 << st
	}
	return mask
}

// ReservationStatesOfSubject counts the subject's reservations by route
// and state, and reads what retention removed from its accounts.
func (s *Store) ReservationStatesOfSubject(ctx context.Context, subject string) (_ store.SubjectStates, err error) {
	defer s.readBarrier(ctx, &err)
	defer s.subjects.complete("reservation states of "+subject, s.subjects.begin(), &err)
	if s.closed.Load() {
		return store.SubjectStates{}, errClosed
	}
	var out store.SubjectStates
	what := "reservation states of " + subject
	// Pending first, as in ReservationsOfSubject; in one read transaction
	// with the table's counts, a pending entry is counted unless the
	// table holds it.
	pending := s.subjects.of(subject, nil)
	var (
		q  queryer = s.reader(subjectStatesSQL) // one statement when nothing is pending
		tx *sql.Tx
	)
	if len(pending) > 0 {
		if tx, err = s.readDB.BeginTx(ctx, nil); err != nil {
			return out, fmt.Errorf("%s: %w", what, translate(ctx, err))
		}
		defer tx.Rollback()
		q = txQuery{tx, subjectStatesSQL}
	}
	out.Counts, err = queryAll(ctx, q, func(sc scanner) (store.StateCount, error) {
		var (
			n     store.StateCount
			state int64
			c     codec.Conv
		)
		if err := sc.Scan(&n.Route, &state, &n.Count); err != nil {
			return n, err
		}
		n.State = c.State(state)
		return n, c.Err()
	}, what, subject)
	if err != nil {
		return out, err
	}
	if len(pending) > 0 {
		type routeState struct {
			route string
			state ledger.State
		}
		more := map[routeState]int64{}
		err := inChunks(len(pending), func(from, n int) error {
			args := make([]any, 0, n+1)
			for _, k := range pending[from : from+n] {
				args = append(args, k.id)
			}
			rows, err := queryAll(ctx, txQuery{tx, pendingStatesSQL(n)}, func(sc scanner) (routeState, error) {
				var (
					rs    routeState
					state int64
					c     codec.Conv
				)
				if err := sc.Scan(&rs.route, &state); err != nil {
					return rs, err
				}
				rs.state = c.State(state)
				return rs, c.Err()
			}, what, append(args, subject)...)
			for _, rs := range rows {
				more[rs]++
			}
			return err
		})
		if err != nil {
			return out, err
		}
		for i := range out.Counts {
			n := &out.Counts[i]
			rs := routeState{n.Route, n.State}
			n.Count += more[rs]
			delete(more, rs)
		}
		for rs, n := range more {
			out.Counts = append(out.Counts, store.StateCount{Route: rs.route, State: rs.state, Count: n})
		}
		slices.SortFunc(out.Counts, func(a, b store.StateCount) int {
			return cmp.Or(strings.Compare(a.Route, b.Route), cmp.Compare(a.State, b.State))
		})
	}
	out.Retained, err = queryAll(ctx, s.reader(retainedOfSQL), func(sc scanner) (store.RetainedCount, error) {
		var (
			n          store.RetainedCount
			generation int64
			c          codec.Conv
		)
		if err := sc.Scan(&n.Account.Subject, &n.Account.Route, &n.Account.Region, &generation, &n.Reservations); err != nil {
			return n, err
		}
		n.Account.Generation = c.Uint(generation)
		return n, c.Err()
	}, "retained of "+subject, subject)
	return out, err
}

// StatementsOf returns the account's statements, the latest epoch first,
// from the statements' unique key (subject, route, region, generation,
// epoch_start).
func (s *Store) StatementsOf(ctx context.Context, f store.StatementFilter) (_ []ledger.Statement, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	if f.Limit <= 0 {
		return nil, fmt.Errorf("statements of %s: limit %d is not positive", f.Account, f.Limit)
	}
	if !storable(f.Account.Generation) {
		return nil, nil
	}
	var c codec.Conv
	before := int64(1<<63 - 1)
	if !f.Before.IsZero() {
		before = c.Nanos(f.Before)
	}
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("statements of %s: cursor: %w", f.Account, err)
	}
	return queryAll(ctx, s.reader(statementsOfSQL), scanStatement, "statements of "+f.Account.String(),
		f.Account.Subject, f.Account.Route, f.Account.Region, int64(f.Account.Generation), before, f.Limit)
}

// writeOwn runs f in a write transaction of its own and commits it.
func (s *Store) writeOwn(ctx context.Context, what string, f func(exec func(q string, args ...any) error) error) error {
	t, err := s.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	tx := t.(*Tx)
	defer tx.Rollback(ctx)
	exec := func(q string, args ...any) error {
		st, err := tx.w.stmt(stmtCtx(ctx), q)
		if err == nil {
			err = tx.w.exec(stmtCtx(ctx), st, args)
		}
		return tx.err(ctx, err)
	}
	if err := f(exec); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ResolverAnswersPut upserts answers by (account, reservation id), in
// one write transaction.
func (s *Store) ResolverAnswersPut(ctx context.Context, answers []store.ResolverAnswer) error {
	if len(answers) == 0 {
		return nil
	}
	var c codec.Conv
	args := make([][]any, len(answers))
	for i, a := range answers {
		if err := a.Check(); err != nil {
			return err
		}
		k := a.Account
		args[i] = []any{a.ReservationID, k.Subject, k.Route, k.Region, c.Int(k.Generation),
			a.Answer, a.Detail, c.Nanos(a.AskedAt), a.Attempts, c.Nanos(a.NextAt)}
	}
	if err := c.Err(); err != nil {
		return fmt.Errorf("resolver answers: %w", err)
	}
	return s.writeOwn(ctx, "resolver answers", func(exec func(string, ...any) error) error {
		for _, a := range args {
			if err := exec(answerPutSQL, a...); err != nil {
				return err
			}
		}
		return nil
	})
}

// ResolverAnswersGet returns the answers of ids whose reservation is
// USAGE_UNKNOWN, each only if it is of that reservation's account, in
// the order of ids.
func (s *Store) ResolverAnswersGet(ctx context.Context, ids []string) (_ []store.ResolverAnswer, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, errClosed
	}
	var out []store.ResolverAnswer
	answered := map[string]bool{}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 500)]
		ids = ids[len(chunk):]
		q := "SELECT a." + strings.ReplaceAll(answerCols, ", ", ", a.") + " FROM resolver_answers a" +
			" JOIN reservations r ON " + answerOfItsReservation +
			" WHERE a.reservation_id IN (?" + strings.Repeat(", ?", len(chunk)-1) + ")"
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		found, err := queryAll(ctx, s.reader(q), scanAnswer, "resolver answers", args...)
		if err != nil {
			return nil, err
		}
		byID := make(map[string]store.ResolverAnswer, len(found))
		for _, a := range found {
			byID[a.ReservationID] = a
		}
		for _, id := range chunk {
			if a, ok := byID[id]; ok && !answered[id] {
				out = append(out, a)
				answered[id] = true // an id asked twice is answered once
			}
		}
	}
	return out, nil
}

func scanAnswer(sc scanner) (store.ResolverAnswer, error) {
	var (
		a                       store.ResolverAnswer
		c                       codec.Conv
		generation, asked, next int64
	)
	if err := sc.Scan(&a.ReservationID, &a.Account.Subject, &a.Account.Route, &a.Account.Region, &generation,
		&a.Answer, &a.Detail, &asked, &a.Attempts, &next); err != nil {
		return a, err
	}
	a.Account.Generation = c.Uint(generation)
	a.AskedAt, a.NextAt = c.Time(asked), c.Time(next)
	return a, c.Err()
}

// ResolverAnswersPrune deletes the answers that are not of a
// USAGE_UNKNOWN reservation of their account. It finds them on a read
// connection first: a reservation that left USAGE_UNKNOWN never returns
// to it, so an answer found stale is still stale when the delete runs
// (unless its own account reused the id meanwhile: that reservation's
// resolver then asks afresh, as after a restart without answers).
func (s *Store) ResolverAnswersPrune(ctx context.Context) (int, error) {
	if s.closed.Load() {
		return 0, errClosed
	}
	stale, err := queryAll(ctx, s.reader(answersStaleSQL), func(sc scanner) ([]any, error) {
		var (
			id, subject, route, region string
			generation                 int64
		)
		err := sc.Scan(&id, &subject, &route, &region, &generation)
		return []any{id, subject, route, region, generation}, err
	}, "stale resolver answers")
	if err != nil || len(stale) == 0 {
		return 0, err
	}
	err = s.writeOwn(ctx, "prune resolver answers", func(exec func(string, ...any) error) error {
		for _, key := range stale {
			if err := exec(answerDeleteSQL, key...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(stale), nil
}

// AuditRecordPut records rec as the last audit (and, clean, the last
// clean one) unless a later one is recorded: the upsert's WHERE keeps the
// later row.
func (s *Store) AuditRecordPut(ctx context.Context, rec *store.AuditRecord) error {
	var c codec.Conv
	at := c.Nanos(rec.At)
	if err := c.Err(); err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	checks, err := json.Marshal(rec.Checks)
	if err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	return s.writeOwn(ctx, "audit record", func(exec func(string, ...any) error) error {
		if err := exec(auditRecordPutSQL, store.AuditRecordLast, at, rec.By, rec.Mode, rec.Discrepancies, string(checks)); err != nil {
			return err
		}
		if rec.Clean() {
			return exec(auditRecordPutSQL, store.AuditRecordClean, at, rec.By, rec.Mode, rec.Discrepancies, string(checks))
		}
		return nil
	})
}

// AuditRecordsGet returns the last audit and the last clean one.
func (s *Store) AuditRecordsGet(ctx context.Context) (last, lastClean *store.AuditRecord, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return nil, nil, errClosed
	}
	type named struct {
		name string
		rec  store.AuditRecord
	}
	rows, err := queryAll(ctx, s.reader(auditRecordsSQL), func(sc scanner) (named, error) {
		var (
			n      named
			c      codec.Conv
			at     int64
			checks string
		)
		if err := sc.Scan(&n.name, &at, &n.rec.By, &n.rec.Mode, &n.rec.Discrepancies, &checks); err != nil {
			return n, err
		}
		n.rec.At = c.Time(at)
		if err := json.Unmarshal([]byte(checks), &n.rec.Checks); err != nil {
			return n, fmt.Errorf("%w: checks: %v", codec.ErrCorrupt, err)
		}
		return n, c.Err()
	}, "audit records")
	if err != nil {
		return nil, nil, err
	}
	for i := range rows {
		switch rows[i].name {
		case store.AuditRecordLast:
			last = &rows[i].rec
		case store.AuditRecordClean:
			lastClean = &rows[i].rec
		}
	}
	return last, lastClean, nil
}
