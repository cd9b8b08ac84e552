package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

var _ store.ConsoleStore = (*Store)(nil)

// The console's reads run on the pool (committed state); its two small
// records are single statements, each its own transaction.
const (
	// $1 subject, $2 state, $3 limit, $4 and $5 the cursor: a range of
	// reservations_by_subject_route read backwards.
	subjectFirstSQL = reservationSelect + ` WHERE subject = $1 AND state = $2
		ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT $3`
	subjectBeforeSQL = reservationSelect + ` WHERE subject = $1 AND state = $2
		AND (created_at, id COLLATE "C") < ($4, $5 COLLATE "C")
		ORDER BY created_at DESC, id COLLATE "C" DESC LIMIT $3`
	// The subject's range of reservations_by_subject_route, which
	// includes the route: an index-only scan (schema 24).
	subjectStatesSQL = `SELECT route, state, count(*) FROM reservations WHERE subject = $1
		GROUP BY route, state ORDER BY route COLLATE "C", state`
	retainedOfSQL = `SELECT route, region, generation, reservations FROM retained
		WHERE subject = $1 AND reservations > 0 ORDER BY route COLLATE "C", region COLLATE "C", generation`
	// The inner SELECT reads the statements' unique key backwards for one
	// page of ids; the outer one joins their term rows.
	statementsOfSQL = statementSelect + ` WHERE st.id IN (
		SELECT id FROM statements WHERE subject = $1 AND route = $2 AND region = $3 AND generation = $4
		AND epoch_start < $5 ORDER BY epoch_start DESC LIMIT $6)
		ORDER BY st.epoch_start DESC, t.dim, t.closing`
	answerPutSQL = `INSERT INTO resolver_answers_by_account (reservation_id, subject, route, region, generation,
		answer, detail, asked_at, attempts, next_at)
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[],
			$6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[])
		ON CONFLICT (reservation_id, subject, route, region, generation) DO UPDATE SET answer = excluded.answer,
		detail = excluded.detail, asked_at = excluded.asked_at, attempts = excluded.attempts, next_at = excluded.next_at`
	// An answer is of the reservation its id names only when that
	// reservation is of its account (store.ResolverAnswer).
	answerOfItsReservation = `r.id = a.reservation_id AND r.subject = a.subject AND r.route = a.route
		AND r.region = a.region AND r.generation = a.generation AND r.state = 8`
	answersGetSQL = `SELECT a.reservation_id, a.subject, a.route, a.region, a.generation,
		a.answer, a.detail, a.asked_at, a.attempts, a.next_at
		FROM resolver_answers_by_account a JOIN reservations r ON ` + answerOfItsReservation + `
		WHERE a.reservation_id = ANY($1)`
	answersPruneSQL = `DELETE FROM resolver_answers_by_account a WHERE NOT EXISTS (
		SELECT 1 FROM reservations r WHERE ` + answerOfItsReservation + `)`
	auditRecordPutSQL = `INSERT INTO audit_records (name, at, by_name, mode, discrepancies, checks)
		SELECT n, a, b, m, d, c::jsonb FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::text[])
			AS u (n, a, b, m, d, c)
		ON CONFLICT (name) DO UPDATE SET at = excluded.at, by_name = excluded.by_name, mode = excluded.mode,
		discrepancies = excluded.discrepancies, checks = excluded.checks WHERE excluded.at >= audit_records.at`
	auditRecordsSQL = `SELECT name, at, by_name, mode, discrepancies, checks FROM audit_records`
)

// ReservationsOfSubject returns up to f.Limit of the subject's
// reservations in f's states, newest first: one range of
// reservations_by_subject_route per state, merged.
func (s *Store) ReservationsOfSubject(ctx context.Context, f store.SubjectFilter) ([]ledger.Reservation, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	var conv codec.Conv
	before := conv.Nanos(f.Before.CreatedAt)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reservations of %s: cursor: %w", f.Subject, err)
	}
	what := "reservations of " + f.Subject
	var lists [][]ledger.Reservation
	for _, state := range f.StatesList() {
		var (
			rows []ledger.Reservation
			err  error
		)
		if f.Before == (store.SubjectCursor{}) {
			rows, err = s.reservationsQuery(ctx, s.pool, what, subjectFirstSQL, f.Subject, int16(state), f.Limit)
		} else {
			rows, err = s.reservationsQuery(ctx, s.pool, what, subjectBeforeSQL, f.Subject, int16(state), f.Limit, before, f.Before.ID)
		}
		if err != nil {
			return nil, err
		}
		lists = append(lists, rows)
	}
	return store.MergeNewestFirst(lists, f.Limit), nil
}

// ReservationStatesOfSubject counts the subject's reservations by route
// and state, from reservations_by_subject_route alone (it reads a table
// page only where the visibility map says it changed since the last
// vacuum), and reads what retention removed from its accounts.
func (s *Store) ReservationStatesOfSubject(ctx context.Context, subject string) (store.SubjectStates, error) {
	var out store.SubjectStates
	what := "reservation states of " + subject
	rows, err := s.pool.Query(ctx, subjectStatesSQL, subject)
	if err != nil {
		return out, s.c.classify(what, err, false)
	}
	for rows.Next() {
		var (
			n     store.StateCount
			state int16
			conv  codec.Conv
		)
		if err := rows.Scan(&n.Route, &state, &n.Count); err != nil {
			rows.Close()
			return out, s.c.classify(what, err, false)
		}
		n.State = conv.State(int64(state))
		if err := conv.Err(); err != nil {
			rows.Close()
			return out, fmt.Errorf("%s: %w", what, err)
		}
		out.Counts = append(out.Counts, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, s.c.classify(what, err, false)
	}
	rows, err = s.pool.Query(ctx, retainedOfSQL, subject)
	if err != nil {
		return out, s.c.classify(what, err, false)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			n          store.RetainedCount
			generation int64
			conv       codec.Conv
		)
		n.Account.Subject = subject
		if err := rows.Scan(&n.Account.Route, &n.Account.Region, &generation, &n.Reservations); err != nil {
			return out, s.c.classify(what, err, false)
		}
		n.Account.Generation = conv.Uint(generation)
		if err := conv.Err(); err != nil {
			return out, fmt.Errorf("%s: %w", what, err)
		}
		out.Retained = append(out.Retained, n)
	}
	return out, s.c.classify(what, rows.Err(), false)
}

// StatementsOf returns the account's statements, the latest epoch first.
func (s *Store) StatementsOf(ctx context.Context, f store.StatementFilter) ([]ledger.Statement, error) {
	if f.Limit <= 0 {
		return nil, fmt.Errorf("statements of %s: limit %d is not positive", f.Account, f.Limit)
	}
	if f.Account.Generation > math.MaxInt64 {
		return nil, nil
	}
	var conv codec.Conv
	before := int64(math.MaxInt64)
	if !f.Before.IsZero() {
		before = conv.Nanos(f.Before)
	}
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("statements of %s: cursor: %w", f.Account, err)
	}
	k := f.Account
	return s.statementsQuery(ctx, s.pool, "statements of "+k.String(), statementsOfSQL,
		k.Subject, k.Route, k.Region, int64(k.Generation), before, f.Limit)
}

// ResolverAnswersPut upserts answers by (account, reservation id), in
// one statement.
func (s *Store) ResolverAnswersPut(ctx context.Context, answers []store.ResolverAnswer) error {
	if len(answers) == 0 {
		return nil
	}
	n := len(answers)
	var (
		conv                           codec.Conv
		ids, subjects, routes, regions = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		generations                    = make([]int64, n)
		kinds, details                 = make([]string, n), make([]string, n)
		asked, attempts, nexts         = make([]int64, n), make([]int64, n), make([]int64, n)
	)
	for i, a := range answers {
		if err := a.Check(); err != nil {
			return err
		}
		ids[i], kinds[i], details[i] = a.ReservationID, a.Answer, a.Detail
		subjects[i], routes[i], regions[i], generations[i] = a.Account.Subject, a.Account.Route, a.Account.Region, conv.Int(a.Account.Generation)
		asked[i], attempts[i], nexts[i] = conv.Nanos(a.AskedAt), a.Attempts, conv.Nanos(a.NextAt)
	}
	if err := conv.Err(); err != nil {
		return fmt.Errorf("resolver answers: %w", err)
	}
	if _, err := s.pool.Exec(ctx, answerPutSQL, ids, subjects, routes, regions, generations, kinds, details, asked, attempts, nexts); err != nil {
		return s.c.classify("resolver answers", err, true)
	}
	return nil
}

// ResolverAnswersGet returns the answers of ids whose reservation is
// USAGE_UNKNOWN, each only if it is of that reservation's account, in
// the order of ids.
func (s *Store) ResolverAnswersGet(ctx context.Context, ids []string) ([]store.ResolverAnswer, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, answersGetSQL, ids)
	if err != nil {
		return nil, s.c.classify("resolver answers", err, false)
	}
	defer rows.Close()
	byID := map[string]store.ResolverAnswer{}
	for rows.Next() {
		var (
			a                       store.ResolverAnswer
			generation, asked, next int64
			conv                    codec.Conv
		)
		if err := rows.Scan(&a.ReservationID, &a.Account.Subject, &a.Account.Route, &a.Account.Region, &generation,
			&a.Answer, &a.Detail, &asked, &a.Attempts, &next); err != nil {
			return nil, s.c.classify("resolver answers", err, false)
		}
		a.Account.Generation = conv.Uint(generation)
		a.AskedAt, a.NextAt = conv.Time(asked), conv.Time(next)
		if err := conv.Err(); err != nil {
			return nil, fmt.Errorf("resolver answer of %s: %w", a.ReservationID, err)
		}
		byID[a.ReservationID] = a
	}
	if err := rows.Err(); err != nil {
		return nil, s.c.classify("resolver answers", err, false)
	}
	var out []store.ResolverAnswer
	for _, id := range ids {
		if a, ok := byID[id]; ok {
			out = append(out, a)
			delete(byID, id) // an id asked twice is answered once
		}
	}
	return out, nil
}

// ResolverAnswersPrune deletes the answers that are not of a
// USAGE_UNKNOWN reservation of their account.
func (s *Store) ResolverAnswersPrune(ctx context.Context) (int, error) {
	tag, err := s.pool.Exec(ctx, answersPruneSQL)
	if err != nil {
		return 0, s.c.classify("prune resolver answers", err, true)
	}
	return int(tag.RowsAffected()), nil
}

// AuditRecordPut records rec as the last audit (and, clean, the last
// clean one) unless a later one is recorded: the upsert's WHERE keeps the
// later row.
func (s *Store) AuditRecordPut(ctx context.Context, rec *store.AuditRecord) error {
	var conv codec.Conv
	at := conv.Nanos(rec.At)
	if err := conv.Err(); err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	checks, err := json.Marshal(rec.Checks)
	if err != nil {
		return fmt.Errorf("audit record: %w", err)
	}
	names := []string{store.AuditRecordLast}
	if rec.Clean() {
		names = append(names, store.AuditRecordClean)
	}
	n := len(names)
	ats, bys, modes, found, checksList := make([]int64, n), make([]string, n), make([]string, n), make([]int64, n), make([]string, n)
	for i := range names {
		ats[i], bys[i], modes[i], found[i], checksList[i] = at, rec.By, rec.Mode, rec.Discrepancies, string(checks)
	}
	if _, err := s.pool.Exec(ctx, auditRecordPutSQL, names, ats, bys, modes, found, checksList); err != nil {
		return s.c.classify("audit record", err, true)
	}
	return nil
}

// AuditRecordsGet returns the last audit and the last clean one.
func (s *Store) AuditRecordsGet(ctx context.Context) (last, lastClean *store.AuditRecord, err error) {
	rows, err := s.pool.Query(ctx, auditRecordsSQL)
	if err != nil {
		return nil, nil, s.c.classify("audit records", err, false)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name   string
			at     int64
			checks []byte
			rec    store.AuditRecord
			conv   codec.Conv
		)
		if err := rows.Scan(&name, &at, &rec.By, &rec.Mode, &rec.Discrepancies, &checks); err != nil {
			return nil, nil, s.c.classify("audit records", err, false)
		}
		rec.At = conv.Time(at)
		if err := conv.Err(); err != nil {
			return nil, nil, fmt.Errorf("audit record %s: %w", name, err)
		}
		if err := json.Unmarshal(checks, &rec.Checks); err != nil {
			return nil, nil, fmt.Errorf("audit record %s: %w: checks: %v", name, codec.ErrCorrupt, err)
		}
		switch name {
		case store.AuditRecordLast:
			last = &rec
		case store.AuditRecordClean:
			lastClean = &rec
		}
	}
	return last, lastClean, s.c.classify("audit records", rows.Err(), false)
}
