package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

type codecConv = codec.Conv

// lockMode is how a getter locks the rows it reads.
type lockMode uint8

const (
	// lockNone: a read of committed state outside a write transaction.
	lockNone lockMode = iota
	// lockShare: rows that change rarely (policies, heads, currents); many
	// transactions may hold them, a writer waits for all.
	lockShare
	// lockWait: an exclusive lock, waiting for the holder (in lock order).
	lockWait
	// lockOutOfOrder: an exclusive lock out of lock order, waiting at
	// most outOfOrderLockTimeout (the transaction's lock_timeout, lowered
	// by tx.lockMode).
	lockOutOfOrder
)

// clause returns the locking clause for the table aliases of (empty: every
// table of the query).
func (m lockMode) clause(of string) string {
	if of != "" {
		of = " OF " + of
	}
	switch m {
	case lockShare:
		return " FOR SHARE" + of
	case lockWait:
		return " FOR NO KEY UPDATE" + of
	case lockOutOfOrder:
		return " FOR NO KEY UPDATE" + of
	}
	return ""
}

const policySelect = `SELECT generation, subject, route, region, dimensions, estimator_digest, hold_ttl,
	execution_limit, priority, fairness_weight, fairness_budget, emergency_mode, rollout, epoch_length,
	published_at, rolled_back FROM policies`

func scanPolicy(row pgx.Row) (*ledger.Policy, error) {
	var (
		p                                                  ledger.Policy
		conv                                               codec.Conv
		generation, holdTTL, execLimit, priority, epochLen int64
		publishedAt                                        int64
		dims                                               []byte
		rollout                                            string
	)
	if err := row.Scan(&generation, &p.Key.Subject, &p.Key.Route, &p.Key.Region, &dims, &p.EstimatorDigest,
		&holdTTL, &execLimit, &priority, &p.FairnessWeight, &p.FairnessBudget, &p.EmergencyMode, &rollout,
		&epochLen, &publishedAt, &p.RolledBack); err != nil {
		return nil, err
	}
	p.Generation = conv.Uint(generation)
	p.HoldTTL, p.ExecutionLimit, p.EpochLength = time.Duration(holdTTL), time.Duration(execLimit), time.Duration(epochLen)
	p.Priority = int(priority)
	p.Rollout = ledger.RolloutMode(rollout)
	p.PublishedAt = conv.Time(publishedAt)
	decoded, err := codec.DecodeDimensions(dims)
	if err != nil {
		return nil, fmt.Errorf("policy %d: %w", generation, err)
	}
	p.Dimensions = decoded
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("policy %d: %w", generation, err)
	}
	return &p, nil
}

func (s *Store) policyGet(ctx context.Context, q querier, generation uint64, lock lockMode) (*ledger.Policy, error) {
	var conv codec.Conv
	g := conv.Int(generation)
	if conv.Err() != nil {
		return nil, notFound(fmt.Sprintf("policy %d", generation))
	}
	p, err := scanPolicy(q.QueryRow(ctx, policySelect+` WHERE generation = $1`+lock.clause(""), g))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound(fmt.Sprintf("policy %d", generation))
	}
	if err != nil {
		return nil, s.c.classify(fmt.Sprintf("policy %d", generation), err, false)
	}
	return p, nil
}

// accountSelect reads accounts with one row per dimension (every account
// has at least one, so the inner join loses none).
const accountSelect = accountSelectColumns + ` FROM accounts a JOIN account_terms t ON t.account_id = a.id`

// accountSelectColumns is accountSelect's column list, for queries that read
// the accounts (as a) from elsewhere.
const accountSelectColumns = `SELECT a.id, a.subject, a.route, a.region, a.generation, a.dims, a.epoch_start,
	a.breaches, a.version, t.dim, t.opening, t.minted, t.overdraft_issued, t.available, t.reserved, t.spent,
	t.retired_for_emergency, t.retired_for_move, t.overdraft_repaid, t.epoch_opening, t.epoch_minted,
	t.epoch_overdraft_issued, t.epoch_available, t.epoch_reserved, t.epoch_spent,
	t.epoch_retired_for_emergency, t.epoch_retired_for_move, t.epoch_overdraft_repaid, t.refilled_to, t.held_elsewhere`

// scanAccounts assembles accounts from accountSelect rows ordered by
// account, then dimension, and closes rows. It also returns how many
// dimension rows each account has in the database.
func scanAccounts(rows pgx.Rows) ([]ledger.Account, []int, error) {
	defer rows.Close()
	var (
		out    []ledger.Account
		nrows  []int
		lastID int64 = -1
	)
	for rows.Next() {
		var (
			id, generation, epochStart, breaches, version int64
			dims, dim                                     int16
			key                                           ledger.AccountKey
			bal, open                                     ledger.Balance
			refilledTo, held                              int64
		)
		if err := rows.Scan(&id, &key.Subject, &key.Route, &key.Region, &generation, &dims, &epochStart,
			&breaches, &version, &dim,
			&bal.Opening, &bal.Minted, &bal.OverdraftIssued, &bal.Available, &bal.Reserved, &bal.Spent,
			&bal.RetiredForEmergency, &bal.RetiredForMove, &bal.OverdraftRepaid,
			&open.Opening, &open.Minted, &open.OverdraftIssued, &open.Available, &open.Reserved, &open.Spent,
			&open.RetiredForEmergency, &open.RetiredForMove, &open.OverdraftRepaid, &refilledTo, &held); err != nil {
			return nil, nil, err
		}
		if id != lastID {
			var conv codec.Conv
			key.Generation = conv.Uint(generation)
			a := ledger.Account{Key: key, Dims: conv.Dims(int64(dims)), EpochStart: conv.Time(epochStart),
				Breaches: breaches, Version: conv.Uint(version)}
			if err := conv.Err(); err != nil {
				return nil, nil, fmt.Errorf("account %s: %w", key, err)
			}
			out = append(out, a)
			nrows = append(nrows, 0)
			lastID = id
		}
		a := &out[len(out)-1]
		if dim < 0 || int(dim) >= ledger.MaxDimensions {
			return nil, nil, fmt.Errorf("account %s: %w: dimension %d", a.Key, codec.ErrCorrupt, dim)
		}
		a.Balances[dim], a.EpochOpening[dim], a.RefilledTo[dim], a.HeldElsewhere[dim] = bal, open, refilledTo, held
		nrows[len(nrows)-1]++
	}
	return out, nrows, rows.Err()
}

// accountGet returns the account and how many dimension rows it has.
// accountByKeySQL reads one account with its terms (its lock clause
// appended).
const accountByKeySQL = accountSelect + ` WHERE a.subject = $1 AND a.route = $2 AND a.region = $3
		AND a.generation = $4 ORDER BY t.dim`

func (s *Store) accountGet(ctx context.Context, q querier, key ledger.AccountKey, lock lockMode) (*ledger.Account, int, error) {
	var conv codec.Conv
	g := conv.Int(key.Generation)
	if conv.Err() != nil {
		return nil, 0, notFound("account " + key.String())
	}
	// Locking both tables matters under READ COMMITTED: when the lock had to
	// wait for another writer, PostgreSQL re-reads only the locked rows, so
	// an unlocked joined term row could be the stale version.
	rows, err := q.Query(ctx, accountByKeySQL+lock.clause("a, t"), key.Subject, key.Route, key.Region, g)
	if err != nil {
		return nil, 0, s.c.classify("account "+key.String(), err, false)
	}
	accounts, nrows, err := scanAccounts(rows)
	if err != nil {
		return nil, 0, s.c.classify("account "+key.String(), err, false)
	}
	if len(accounts) == 0 {
		return nil, 0, notFound("account " + key.String())
	}
	return &accounts[0], nrows[0], nil
}

const reservationSelect = `SELECT id, request_digest, subject, route, region, generation,
	accounting_epoch, reserved, actual, overdraft, operation_id, state, created_at,
	expires_at, started_at, execution_deadline, unknown_at, finished_at, breach FROM reservations`

func scanReservation(row pgx.Row) (*ledger.Reservation, error) {
	var (
		r                                                                  ledger.Reservation
		conv                                                               codec.Conv
		generation, epoch, created, expires, started, deadline, unknown, f int64
		state                                                              int16
		reserved, actual, overdraft                                        []int64
	)
	if err := row.Scan(&r.ID, &r.RequestDigest, &r.Account.Subject, &r.Account.Route, &r.Account.Region,
		&generation, &epoch, &reserved, &actual, &overdraft, &r.OperationID, &state, &created, &expires,
		&started, &deadline, &unknown, &f, &r.Breach); err != nil {
		return nil, err
	}
	r.Account.Generation = conv.Uint(generation)
	r.AccountingEpoch, r.CreatedAt, r.ExpiresAt = conv.Time(epoch), conv.Time(created), conv.Time(expires)
	r.StartedAt, r.ExecutionDeadline, r.FinishedAt = conv.Time(started), conv.Time(deadline), conv.Time(f)
	r.UnknownAt = conv.Time(unknown)
	r.State = conv.State(int64(state))
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("reservation %s: %w", r.ID, err)
	}
	for _, v := range [...]struct {
		dst *ledger.Amounts
		src []int64
	}{{&r.Reserved, reserved}, {&r.Actual, actual}, {&r.Overdraft, overdraft}} {
		if err := amountsFrom(v.dst, v.src); err != nil {
			return nil, fmt.Errorf("reservation %s: %w", r.ID, err)
		}
	}
	return &r, nil
}

func amountsFrom(dst *ledger.Amounts, src []int64) error {
	if len(src) != ledger.MaxDimensions {
		return fmt.Errorf("%w: %d amounts, want %d", codec.ErrCorrupt, len(src), ledger.MaxDimensions)
	}
	copy(dst[:], src)
	return nil
}

func (s *Store) reservationGet(ctx context.Context, q querier, id string, lock lockMode) (*ledger.Reservation, error) {
	r, err := scanReservation(q.QueryRow(ctx, reservationSelect+` WHERE id = $1`+lock.clause(""), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("reservation " + id)
	}
	if err != nil {
		return nil, s.c.classify("reservation "+id, err, false)
	}
	return r, nil
}

func (s *Store) reservationList(ctx context.Context, q querier) ([]ledger.Reservation, error) {
	return s.reservationsQuery(ctx, q, "reservation list", reservationSelect+` ORDER BY id`)
}

// reservationsQuery runs query (a reservationSelect with its clauses) and
// decodes every row it returns; what names the read in errors.
func (s *Store) reservationsQuery(ctx context.Context, q querier, what, query string, args ...any) ([]ledger.Reservation, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, s.c.classify(what, err, false)
	}
	defer rows.Close()
	var out []ledger.Reservation
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		r, err := scanReservation(rows)
		if err != nil {
			return nil, s.c.classify(what, err, false)
		}
		out = append(out, *r)
	}
	return out, s.c.classify(what, rows.Err(), false)
}

const moveSelect = `SELECT receipt_id, kind, from_subject, from_route, from_region, from_generation,
	to_subject, to_route, to_region, to_generation, units, debt, at FROM moves`

func scanMove(row pgx.Row) (*ledger.Move, error) {
	var (
		m                  ledger.Move
		conv               codec.Conv
		kind               int16
		fromGen, toGen, at int64
		units, debt        []int64
	)
	if err := row.Scan(&m.ReceiptID, &kind, &m.From.Subject, &m.From.Route, &m.From.Region, &fromGen,
		&m.To.Subject, &m.To.Route, &m.To.Region, &toGen, &units, &debt, &at); err != nil {
		return nil, err
	}
	m.Kind = conv.MoveKind(int64(kind))
	m.From.Generation, m.To.Generation = conv.Uint(fromGen), conv.Uint(toGen)
	m.At = conv.Time(at)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("move %s: %w", m.ReceiptID, err)
	}
	if err := amountsFrom(&m.Units, units); err != nil {
		return nil, fmt.Errorf("move %s: %w", m.ReceiptID, err)
	}
	if err := amountsFrom(&m.Debt, debt); err != nil {
		return nil, fmt.Errorf("move %s: %w", m.ReceiptID, err)
	}
	return &m, nil
}

func (s *Store) moveGet(ctx context.Context, q querier, receiptID string) (*ledger.Move, error) {
	m, err := scanMove(q.QueryRow(ctx, moveSelect+` WHERE receipt_id = $1`, receiptID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("move " + receiptID)
	}
	if err != nil {
		return nil, s.c.classify("move "+receiptID, err, false)
	}
	return m, nil
}

func (s *Store) moveList(ctx context.Context, q querier) ([]ledger.Move, error) {
	rows, err := q.Query(ctx, moveSelect+` ORDER BY receipt_id`)
	if err != nil {
		return nil, s.c.classify("move list", err, false)
	}
	defer rows.Close()
	var out []ledger.Move
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		m, err := scanMove(rows)
		if err != nil {
			return nil, s.c.classify("move list", err, false)
		}
		out = append(out, *m)
	}
	return out, s.c.classify("move list", rows.Err(), false)
}

const shardSelect = `SELECT id, subject, route, region, generation, gateway_id, boot_epoch, fence, allocated,
	spent, unknown, reminted, issued_at, expires_at, key_id, signature, reconciled FROM shards`

func scanShard(row pgx.Row) (*ledger.Shard, error) {
	var (
		sh                                          ledger.Shard
		conv                                        codec.Conv
		generation, bootEpoch, fence, issued, expir int64
		allocated, spent, unknown, reminted         []int64
		signature                                   []byte
	)
	if err := row.Scan(&sh.ID, &sh.Account.Subject, &sh.Account.Route, &sh.Account.Region, &generation,
		&sh.GatewayID, &bootEpoch, &fence, &allocated, &spent, &unknown, &reminted, &issued, &expir,
		&sh.KeyID, &signature, &sh.Reconciled); err != nil {
		return nil, err
	}
	sh.Account.Generation, sh.BootEpoch, sh.Fence = conv.Uint(generation), conv.Uint(bootEpoch), conv.Uint(fence)
	sh.IssuedAt, sh.ExpiresAt = conv.Time(issued), conv.Time(expir)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("shard %s: %w", sh.ID, err)
	}
	for _, v := range [...]struct {
		dst *ledger.Amounts
		src []int64
	}{{&sh.Allocated, allocated}, {&sh.Spent, spent}, {&sh.Unknown, unknown}, {&sh.Reminted, reminted}} {
		if err := amountsFrom(v.dst, v.src); err != nil {
			return nil, fmt.Errorf("shard %s: %w", sh.ID, err)
		}
	}
	sig, err := codec.DecodeSignature(signature)
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", sh.ID, err)
	}
	sh.Signature = sig
	return &sh, nil
}

func (s *Store) shardGet(ctx context.Context, q querier, id string, lock lockMode) (*ledger.Shard, error) {
	sh, err := scanShard(q.QueryRow(ctx, shardSelect+` WHERE id = $1`+lock.clause(""), id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, notFound("shard " + id)
	}
	if err != nil {
		return nil, s.c.classify("shard "+id, err, false)
	}
	return sh, nil
}

// statementSelect reads statements with their term rows, one row per
// term (or one with NULL terms for a statement without any); a query adds
// its WHERE and an ORDER BY that keeps a statement's rows together.
const statementSelect = `SELECT st.id, st.subject, st.route, st.region, st.generation, st.epoch_start,
		st.epoch_end, st.dims, t.dim, t.closing, t.opening, t.minted, t.overdraft_issued, t.available,
		t.reserved, t.spent, t.retired_for_emergency, t.retired_for_move, t.overdraft_repaid
		FROM statements st LEFT JOIN statement_terms t ON t.statement_id = st.id`

func (s *Store) statementList(ctx context.Context, q querier) ([]ledger.Statement, error) {
	return s.statementsQuery(ctx, q, "statement list", statementSelect+` ORDER BY st.id, t.dim, t.closing`)
}

// statementsQuery runs query (a statementSelect with its clauses) and
// decodes the statements, in the order their first rows come.
func (s *Store) statementsQuery(ctx context.Context, q querier, what, query string, args ...any) ([]ledger.Statement, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, s.c.classify(what, err, false)
	}
	defer rows.Close()
	var (
		out    []ledger.Statement
		lastID int64 = -1
	)
	read := 0
	for rows.Next() {
		read++
		store.RowRead(ctx, read) // a bounded audit waits anew while rows arrive
		var (
			id, generation, start, end int64
			dims                       int16
			dim                        *int16
			closing                    *bool
			key                        ledger.AccountKey
			b                          [9]*int64
		)
		if err := rows.Scan(&id, &key.Subject, &key.Route, &key.Region, &generation, &start, &end, &dims,
			&dim, &closing, &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7], &b[8]); err != nil {
			return nil, s.c.classify(what, err, false)
		}
		if id != lastID {
			var conv codec.Conv
			key.Generation = conv.Uint(generation)
			st := ledger.Statement{Account: key, EpochStart: conv.Time(start), EpochEnd: conv.Time(end),
				Dims: conv.Dims(int64(dims))}
			if err := conv.Err(); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", what, key, err)
			}
			out = append(out, st)
			lastID = id
		}
		if dim == nil {
			continue
		}
		if *dim < 0 || int(*dim) >= ledger.MaxDimensions {
			return nil, fmt.Errorf("%s: %w: dimension %d", what, codec.ErrCorrupt, *dim)
		}
		st := &out[len(out)-1]
		bal := &st.Opening[*dim]
		if *closing {
			bal = &st.Closing[*dim]
		}
		*bal = ledger.Balance{Opening: *b[0], Minted: *b[1], OverdraftIssued: *b[2], Available: *b[3],
			Reserved: *b[4], Spent: *b[5], RetiredForEmergency: *b[6], RetiredForMove: *b[7], OverdraftRepaid: *b[8]}
	}
	return out, s.c.classify(what, rows.Err(), false)
}

func (s *Store) journalList(ctx context.Context, q querier, after int64) ([]ledger.JournalEntry, error) {
	var out []ledger.JournalEntry
	err := s.journalEach(ctx, q, after, func(_ int64, e *ledger.JournalEntry) error {
		out = append(out, *e)
		return nil
	})
	return out, err
}

// journalEach calls yield with every journal entry after position after,
// in order, with its position (the entry is valid only during the call),
// and returns the first error.
func (s *Store) journalEach(ctx context.Context, q querier, after int64, yield func(int64, *ledger.JournalEntry) error) error {
	rows, err := q.Query(ctx, `SELECT seq, subject, route, region, generation, at, kind,
		reservation_id, from_state, to_state, receipt_id, delta FROM journal WHERE seq > $1 ORDER BY seq`, after)
	if err != nil {
		return s.c.classify("journal", err, false)
	}
	defer rows.Close()
	var e ledger.JournalEntry
	for rows.Next() {
		var (
			conv                codec.Conv
			seq, generation, at int64
			kind, from, to      int16
			delta               []byte
		)
		e = ledger.JournalEntry{}
		if err := rows.Scan(&seq, &e.Account.Subject, &e.Account.Route, &e.Account.Region, &generation, &at, &kind,
			&e.ReservationID, &from, &to, &e.ReceiptID, &delta); err != nil {
			return s.c.classify("journal", err, false)
		}
		e.Account.Generation = conv.Uint(generation)
		e.At = conv.Time(at)
		e.Kind = conv.Kind(int64(kind))
		e.From, e.To = conv.State(int64(from)), conv.State(int64(to))
		if err := conv.Err(); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		d, err := codec.DecodeBalances(delta)
		if err != nil {
			return fmt.Errorf("journal: %w", err)
		}
		e.Delta = d
		if err := yield(seq, &e); err != nil {
			return err
		}
	}
	return s.c.classify("journal", rows.Err(), false)
}
