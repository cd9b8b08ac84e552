package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Begin opens a READ COMMITTED write transaction. Every getter of the
// returned Tx locks what it reads (see Tx). Returns an error wrapping
// store.ErrUnavailable when no connection can be had.
//
// READ COMMITTED rather than REPEATABLE READ on purpose: with every read
// row locked, each locking read returns the newest committed version after
// any wait, which is what two-phase locking needs, whereas REPEATABLE READ
// would fail every batch whose hot account another replica committed to
// since the batch began.
func (s *Store) Begin(ctx context.Context) (store.Tx, error) {
	opts := pgx.TxOptions{IsoLevel: pgx.ReadCommitted}
	if s.planPerStatement {
		opts.BeginQuery = beginWrite // READ COMMITTED too, with cached plans (plan.go)
	}
	t, err := s.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, s.c.classify("begin", err, false)
	}
	s.c.transactions.Add(1)
	return &tx{s: s, tx: t, absent: map[rowKey]bool{}, termRows: map[ledger.AccountKey]int{}}, nil
}

// Lock ranks: the first field of the fixed lock order. Within a rank, rows
// are ordered by key.
//
// A subject's owing-set Meta rows (ledger.MetaOwingPrefix) rank of their
// own, right before the accounts: a command reads them only after it
// found an account of the subject owing, so ranked with the other meta
// rows they were always locked out of order, and with them, the owing
// accounts the set names. Every transaction locks a subject's owing rows
// before the first account of the subject it locks (AccountsPrefetch,
// AccountGet): for a subject that owes they are the gate its accounts are
// locked behind, and the owing accounts a command of the subject then
// locks, in any order, are held by no other transaction. A subject's
// left_behind rows (ledger.MetaLeftBehindPrefix), read when a move leaves one of
// its accounts or a switch opens one, after its accounts, are locked with
// its owing set, ranked after every owing row (a command may read its
// subject's owing rows before any account, one by one) and before the
// accounts.
const (
	rankMeta uint8 = iota
	rankShard
	rankReservation
	rankOwing
	rankLeftBehind
	rankAccount
)

// rowKey names a row for the lock order and for remembering which rows a
// transaction found absent.
type rowKey struct {
	rank       uint8
	a, b, c    string
	generation uint64
}

func compareRowKeys(x, y rowKey) int {
	return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.a, y.a), cmp.Compare(x.b, y.b),
		cmp.Compare(x.c, y.c), cmp.Compare(x.generation, y.generation))
}

// Table tags of rowKey.rank for rows that are share-locked or never locked
// (they take no part in the lock order, only in absent-row tracking).
const (
	tagPolicy uint8 = 100 + iota
	tagHead
	tagCurrent
)

// metaRow is the row of the named Meta counter: rankOwing for an owing-set
// row, rankLeftBehind for a left_behind row (both locked with the owing
// set, lockOwing), else rankMeta.
func metaRow(name string) rowKey {
	if strings.HasPrefix(name, ledger.MetaOwingPrefix) {
		return rowKey{rank: rankOwing, a: name}
	}
	if strings.HasPrefix(name, ledger.MetaLeftBehindPrefix) {
		return rowKey{rank: rankLeftBehind, a: name}
	}
	return rowKey{rank: rankMeta, a: name}
}

func accountRow(k ledger.AccountKey) rowKey {
	return rowKey{rank: rankAccount, a: k.Subject, b: k.Route, c: k.Region, generation: k.Generation}
}

func policyKeyRow(tag uint8, k ledger.PolicyKey) rowKey {
	return rowKey{rank: tag, a: k.Subject, b: k.Route, c: k.Region}
}

// tx is one write transaction.
//
// Getters lock rows: accounts, reservations, shards and meta counters
// exclusively (FOR NO KEY UPDATE, which still lets foreign-key checks of
// inserted reservations and journal rows through), in the fixed order of
// rowKey; policies, policy heads and current-generation pointers shared
// (FOR SHARE), since every reserve reads them and only publish, rollback
// and generation switches write them. Moves are immutable and not locked.
// A row found absent is remembered: Write then inserts it with a plain
// INSERT, so a concurrent creator of the same row surfaces as a unique
// violation instead of being overwritten.
type tx struct {
	s  *Store
	tx pgx.Tx

	// held is the greatest exclusively locked row so far (valid when
	// holding is set).
	held    rowKey
	holding bool
	// shortLockWait is set once lock_timeout was lowered for an
	// out-of-order lock (lockMode).
	shortLockWait bool

	absent map[rowKey]bool
	// termRows is how many dimension rows each read account has, so Write
	// knows when a narrower account must drop rows.
	termRows map[ledger.AccountKey]int
	// prefetched holds the reservations ReservationsPrefetch read and
	// locked (nil for an id found absent), until the next Write.
	prefetched map[string]*ledger.Reservation
	// subjects holds what AccountsPrefetch read, until the next Write.
	subjects subjectsPrefetch
	// tombs holds the tombstones prefetched with them (retention.go).
	tombs map[string]*ledger.Tombstone
	// owing holds the owing-set rows locked so far (owing.go).
	owing owingLocked
	// metaOutOfOrder names the Meta rows MetaGet locked out of lock
	// order, for tests.
	metaOutOfOrder []string
	done           bool
}

// outOfOrderLockTimeout bounds the wait for a row lock asked out of lock
// order (see lockMode): long enough that the holder, another replica's
// batch on the same hot account, usually commits within it (a batch
// takes milliseconds), short enough that the rare wait cycle is broken
// quickly: by this timeout (SQLSTATE 55P03) or by the deadlock detector
// (40P01, after deadlock_timeout: 100ms as docs/OPERATIONS.md asks, 1s by
// default), both store.ErrConflict, after which the engine reruns the
// batch.
const outOfOrderLockTimeout = 20 * time.Millisecond

// lockMode returns how to lock row k: waiting when it sorts after every row
// held; out of order, waiting too, but only up to outOfOrderLockTimeout.
// The first out-of-order lock of the transaction lowers its lock_timeout
// (SET LOCAL, one round trip; the rest of the transaction's waits are
// bounded by it too). Refusing such a lock at once (NOWAIT), as this
// store did before, turned 1-2 % of the commands at a hot account shared
// by three replicas into 503 STORE_CONFLICT after the engine's retries.
func (t *tx) lockMode(ctx context.Context, k rowKey) (lockMode, error) {
	if !t.holding || compareRowKeys(k, t.held) >= 0 {
		return lockWait, nil
	}
	if !t.shortLockWait {
		if _, err := t.tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", outOfOrderLockTimeout.Milliseconds())); err != nil {
			return lockWait, t.s.c.classify("lock timeout", err, false)
		}
		t.shortLockWait = true
	}
	return lockOutOfOrder, nil
}

// locked records that row k is now held.
func (t *tx) locked(k rowKey) {
	if !t.holding || compareRowKeys(k, t.held) > 0 {
		t.held, t.holding = k, true
	}
}

// result records a getter's outcome: a found row as locked, an absent one
// as absent. It returns err.
func (t *tx) result(k rowKey, err error) error {
	switch {
	case err == nil:
		t.locked(k)
	case errors.Is(err, store.ErrNotFound):
		t.absent[k] = true
	}
	return err
}

// MetaGet returns a named counter, locked; ErrNotFound when never set.
// An owing-set row of a subject whose set was locked (lockOwing) is
// answered from what that read, without a query.
func (t *tx) MetaGet(ctx context.Context, name string) (int64, error) {
	k := metaRow(name)
	if value, found, ok := t.owing.get(name); ok {
		if !found {
			return 0, t.result(k, notFound("meta "+name))
		}
		return value, nil
	}
	mode, err := t.lockMode(ctx, k)
	if err != nil {
		return 0, err
	}
	if mode == lockOutOfOrder {
		t.metaOutOfOrder = append(t.metaOutOfOrder, name)
	}
	var value int64
	err = t.tx.QueryRow(ctx, `SELECT value FROM meta WHERE name = $1`+mode.clause(""), name).Scan(&value)
	if errors.Is(err, pgx.ErrNoRows) {
		err = notFound("meta " + name)
	} else if err != nil {
		err = t.s.c.classify("meta "+name, err, false)
	}
	return value, t.result(k, err)
}

// PolicyGet returns one generation, share-locked, or ErrNotFound.
func (t *tx) PolicyGet(ctx context.Context, generation uint64) (*ledger.Policy, error) {
	p, err := t.s.policyGet(ctx, t.tx, generation, lockShare)
	if errors.Is(err, store.ErrNotFound) {
		t.absent[rowKey{rank: tagPolicy, generation: generation}] = true
	}
	return p, err
}

// PolicyHeadGet returns the head of a policy key, share-locked, or
// ErrNotFound.
func (t *tx) PolicyHeadGet(ctx context.Context, key ledger.PolicyKey) (*ledger.PolicyHead, error) {
	if h, ok := t.prefetchedHead(key); ok {
		if h == nil {
			t.absent[policyKeyRow(tagHead, key)] = true
			return nil, notFound("policy head " + key.String())
		}
		return h, nil
	}
	var h ledger.PolicyHead
	var active, latest int64
	err := t.tx.QueryRow(ctx, `SELECT active, latest FROM policy_heads WHERE subject = $1 AND route = $2
		AND region = $3 FOR SHARE`, key.Subject, key.Route, key.Region).Scan(&active, &latest)
	if errors.Is(err, pgx.ErrNoRows) {
		t.absent[policyKeyRow(tagHead, key)] = true
		return nil, notFound("policy head " + key.String())
	}
	if err != nil {
		return nil, t.s.c.classify("policy head "+key.String(), err, false)
	}
	var conv codecConv
	h.Key, h.Active, h.Latest = key, conv.Uint(active), conv.Uint(latest)
	if err := conv.Err(); err != nil {
		return nil, fmt.Errorf("policy head %s: %w", key, err)
	}
	return &h, nil
}

// AccountGet returns the account, locked, or ErrNotFound.
func (t *tx) AccountGet(ctx context.Context, key ledger.AccountKey) (*ledger.Account, error) {
	k := accountRow(key)
	if p, ok := t.subjects.accounts[key]; ok {
		if p == nil {
			return nil, t.result(k, notFound("account "+key.String()))
		}
		t.termRows[key] = p.rows
		copied := p.a // arrays only: a value copy is a deep copy
		return &copied, nil
	}
	mode, err := t.lockMode(ctx, k)
	if err != nil {
		return nil, err
	}
	// With the subject's owing set first, in lock order (rankOwing).
	a, rows, err := t.accountAndOwing(ctx, key, mode)
	if err == nil {
		t.termRows[key] = rows
	}
	return a, t.result(k, err)
}

// AccountCurrentGet returns the generation holding the subject's
// capacity, share-locked, or ErrNotFound.
func (t *tx) AccountCurrentGet(ctx context.Context, subject ledger.PolicyKey) (uint64, error) {
	if g, ok := t.subjects.currents[subject]; ok {
		if g == nil {
			t.absent[policyKeyRow(tagCurrent, subject)] = true
			return 0, notFound("current account of " + subject.String())
		}
		return *g, nil
	}
	var generation int64
	err := t.tx.QueryRow(ctx, `SELECT generation FROM account_currents WHERE subject = $1 AND route = $2
		AND region = $3 FOR SHARE`, subject.Subject, subject.Route, subject.Region).Scan(&generation)
	if errors.Is(err, pgx.ErrNoRows) {
		t.absent[policyKeyRow(tagCurrent, subject)] = true
		return 0, notFound("current account of " + subject.String())
	}
	if err != nil {
		return 0, t.s.c.classify("current account of "+subject.String(), err, false)
	}
	var conv codecConv
	g := conv.Uint(generation)
	return g, conv.Err()
}

// ReservationGet returns the reservation, locked, or ErrNotFound.
func (t *tx) ReservationGet(ctx context.Context, id string) (*ledger.Reservation, error) {
	k := rowKey{rank: rankReservation, a: id}
	if r, ok := t.prefetched[id]; ok {
		if r == nil {
			return nil, t.result(k, notFound("reservation "+id))
		}
		copied := *r // no reference fields: a value copy is a deep copy
		return &copied, nil
	}
	mode, err := t.lockMode(ctx, k)
	if err != nil {
		return nil, err
	}
	r, err := t.s.reservationGet(ctx, t.tx, id, mode)
	return r, t.result(k, err)
}

// reservationsPrefetchSQL reads the reservations of a batch, in lock order
// (its lock clause appended).
const reservationsPrefetchSQL = reservationSelect + ` WHERE id = ANY($1) ORDER BY id`

// ReservationsPrefetch reads and locks the reservations named by ids in
// one query, in id order (the lock order), and keeps them for this
// transaction: ReservationGet then answers for those ids without a round
// trip, ErrNotFound for the absent ones (remembered as absent, so Write
// inserts them). A caller that knows a batch's reservation ids up front
// (the engine does) turns N locked lookups into one; nothing else changes.
// A Write drops what was prefetched (ReservationGet reads again, seeing the
// transaction's own writes).
//
// Returns nil, or the error of the read: an error wrapping
// store.ErrConflict when a row is held by another transaction and this one
// already holds a row later in the lock order, store.ErrUnavailable when
// the server cannot be reached.
func (t *tx) ReservationsPrefetch(ctx context.Context, ids []string) error {
	if t.done {
		return fmt.Errorf("reservations prefetch: %w", pgx.ErrTxClosed)
	}
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if len(ids) == 0 {
		return nil
	}
	mode, err := t.lockMode(ctx, rowKey{rank: rankReservation, a: ids[0]})
	if err != nil {
		return err
	}
	found := make(map[string]*ledger.Reservation, len(ids))
	err = t.queryLookup(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			r, err := scanReservation(rows)
			if err != nil {
				return err
			}
			found[r.ID] = r
		}
		return nil
	}, reservationsPrefetchSQL+mode.clause(""), ids)
	if err != nil {
		return t.s.c.classify("reservations prefetch", err, false)
	}
	if t.prefetched == nil {
		t.prefetched = make(map[string]*ledger.Reservation, len(ids))
	}
	for _, id := range ids {
		t.prefetched[id] = found[id]
		if found[id] != nil {
			t.locked(rowKey{rank: rankReservation, a: id})
		}
	}
	return t.prefetchTombstones(ctx, ids, found)
}

var _ store.ReservationsRechecker = (*tx)(nil)

// reservationsCommittedSQL looks ids up in a statement of its own, so
// with the newest snapshot of READ COMMITTED.
const reservationsCommittedSQL = `SELECT id FROM reservations WHERE id = ANY($1)`

// ReservationsCommitted returns those of ids that a fresh statement finds
// stored (store.ReservationsRechecker): without a lock, and ignoring what
// ReservationsPrefetch and ReservationGet read before, since what they
// found absent is the question. Returns nil or the read's error
// (store.ErrUnavailable when the server cannot be reached).
func (t *tx) ReservationsCommitted(ctx context.Context, ids []string) ([]string, error) {
	if t.done {
		return nil, fmt.Errorf("reservations committed: %w", pgx.ErrTxClosed)
	}
	var found []string
	err := t.queryLookup(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			found = append(found, id)
		}
		return nil
	}, reservationsCommittedSQL, ids)
	if err != nil {
		return nil, t.s.c.classify("reservations committed", err, false)
	}
	return found, nil
}

// MoveGet returns a move receipt (immutable, so not locked) or ErrNotFound.
func (t *tx) MoveGet(ctx context.Context, receiptID string) (*ledger.Move, error) {
	return t.s.moveGet(ctx, t.tx, receiptID)
}

// ShardGet returns the shard, locked, or ErrNotFound.
func (t *tx) ShardGet(ctx context.Context, id string) (*ledger.Shard, error) {
	k := rowKey{rank: rankShard, a: id}
	mode, err := t.lockMode(ctx, k)
	if err != nil {
		return nil, err
	}
	sh, err := t.s.shardGet(ctx, t.tx, id, mode)
	return sh, t.result(k, err)
}

// Commit makes the transaction durable. Returns nil once PostgreSQL
// acknowledged the COMMIT; an error wrapping store.ErrConflict when the
// server rolled it back for a retryable reason; store.ErrUnavailable when
// the connection failed before the acknowledgement (the outcome is
// unknown: never reported as success).
func (t *tx) Commit(ctx context.Context) error {
	if t.done {
		return fmt.Errorf("commit: %w", pgx.ErrTxClosed)
	}
	t.done = true
	if err := t.tx.Commit(ctx); err != nil {
		t.s.c.rollbacks.Add(1)
		return t.s.c.classify("commit", err, true)
	}
	t.s.c.commits.Add(1)
	return nil
}

// Rollback discards the transaction and returns nil; after Commit (or a
// second Rollback) it does nothing. A rollback that cannot reach the server
// returns an error wrapping store.ErrUnavailable; the server discards the
// transaction when the connection closes either way.
func (t *tx) Rollback(ctx context.Context) error {
	if t.done {
		return nil
	}
	t.done = true
	t.s.c.rollbacks.Add(1)
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return t.s.c.classify("rollback", err, false)
}
