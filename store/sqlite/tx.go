package sqlite

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// Tx is a SQLite write transaction (BEGIN IMMEDIATE on the store's one
// write connection). It must end with Commit or Rollback; defer Rollback,
// it is a no-op after Commit.
type Tx struct {
	s   *Store
	w   *writer
	ctx context.Context // Begin's: once it ends, statements fail and Commit rolls back
	// failed is the error of a Write that stopped part-way: SQLite keeps
	// the statements that succeeded, so Commit must refuse.
	failed error
	done   bool
	// written holds what Write wrote, for the row cache once Commit
	// succeeds; once it is non-empty the getters read the B-trees, which
	// hold the transaction's own writes.
	written []*store.Changes
	// prefetched answers ReservationGet for the ids ReservationsPrefetch
	// read (nil: the reservation does not exist), until the first Write.
	prefetched map[string]*ledger.Reservation
	// tombs holds the tombstones prefetched with them (retention.go).
	tombs map[string]*ledger.Tombstone
	// storedEpochs is the epoch_start the file holds for the accounts
	// this transaction read or wrote, and whether that epoch is idle
	// (accountwrite.go).
	storedEpochs map[ledger.AccountKey]storedEpoch
	// storedDebt is whether the file's row owes, for the accounts this
	// transaction read or wrote: whether account_debtors holds the key
	// (accountwrite.go).
	storedDebt map[ledger.AccountKey]bool
	// storedReservations is the fixed columns the file holds for the
	// reservations this transaction read (reservationwrite.go).
	storedReservations map[string]reservationFixed
	// subjectKeys and subjectsRemoved are what Commit hands to the
	// subject index's pending entries (subjectindex.go).
	subjectKeys     []subjectKey
	subjectsRemoved []string
}

var _ store.Tx = (*Tx)(nil)

// stmtCtx is the context statements run under: ctx without its
// cancellation. The driver starts a goroutine per statement to watch a
// cancellable context, which cost more than the statement on this path;
// check honours ctx and the Begin context before every statement instead,
// and the busy timeout bounds a wait for another process's lock.
func stmtCtx(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }

// syncCache reads PRAGMA data_version inside the new transaction and
// empties the row cache when another connection committed since the cache
// was filled.
func (tx *Tx) syncCache(ctx context.Context) error {
	version, err := queryOneRow(stmtCtx(ctx), tx.w, tx.w.stmts[wDataVersion], nil, scanInt)
	if err != nil {
		return fmt.Errorf("data version: %w", tx.err(ctx, err))
	}
	tx.s.cache.sync(version)
	return nil
}

// end releases the writer; every way a Tx ends calls it once. After Close
// it closes the write connection, which Close left to it.
func (tx *Tx) end() {
	tx.done = true
	if tx.s.closed.Load() {
		tx.w.close()
	}
	<-tx.s.writer
}

// err translates a driver error.
func (tx *Tx) err(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if tx.s.closed.Load() {
		return errClosed
	}
	return translate(ctx, err)
}

func (tx *Tx) check(ctx context.Context) error {
	if tx.done {
		return errors.New("transaction already ended")
	}
	if tx.s.closed.Load() {
		return errClosed
	}
	if err := tx.ctx.Err(); err != nil {
		return fmt.Errorf("transaction context: %w", err)
	}
	return ctx.Err()
}

func getOne[T any](ctx context.Context, tx *Tx, i int, scan func(scanner) (T, error), what string, args ...any) (*T, error) {
	if err := tx.check(ctx); err != nil {
		return nil, err
	}
	v, err := queryOneRow(stmtCtx(ctx), tx.w, tx.w.stmts[i], args, scan)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, tx.err(ctx, err))
	}
	return &v, nil
}

// cachedGet answers a getter from the row cache when it can; otherwise it
// runs read and, before the transaction wrote anything (so what it reads is
// the committed row), caches the answer, a row or its absence.
func cachedGet[K comparable, T any](ctx context.Context, tx *Tx, m rowTable[K, T], key K, clone func(*T) *T,
	what string, read func() (*T, error)) (*T, error) {
	row, _, err := cachedGetAt(ctx, tx, m, key, clone, what, read)
	return row, err
}

// cachedGetAt is cachedGet that also returns the slot the row was found at
// in the cache (rowTable.lookupRow), noSlot when it was read.
func cachedGetAt[K comparable, T any](ctx context.Context, tx *Tx, m rowTable[K, T], key K, clone func(*T) *T,
	what string, read func() (*T, error)) (*T, int32, error) {
	if err := tx.check(ctx); err != nil {
		return nil, noSlot, err
	}
	c := tx.s.cache
	if len(tx.written) == 0 {
		if row, found, slot := lookup(c, m, key, clone); found {
			if row == nil {
				return nil, slot, notFoundError{what}
			}
			return row, slot, nil
		}
	}
	row, err := read()
	if len(tx.written) == 0 {
		switch {
		case err == nil:
			remember(c, m, key, row, clone)
		case errors.Is(err, store.ErrNotFound):
			remember(c, m, key, nil, clone)
		}
	}
	return row, noSlot, err
}

// notFoundError is fmt.Errorf("%s: %w", what, store.ErrNotFound) made
// without formatting: a batch over many new subjects is answered "not
// found" from the row cache for each (their policy heads), and the
// formatting cost three allocations each time.
type notFoundError struct{ what string }

func (e notFoundError) Error() string { return e.what + ": " + store.ErrNotFound.Error() }

func (e notFoundError) Unwrap() error { return store.ErrNotFound }

func scanInt(sc scanner) (int64, error) {
	var v int64
	err := sc.Scan(&v)
	return v, err
}

// storable reports whether a uint64 key can exist in the store; a larger
// one is simply not found (Write refuses to store it).
func storable(u uint64) bool { return u <= math.MaxInt64 }

// MetaGet returns the named counter, or store.ErrNotFound.
func (tx *Tx) MetaGet(ctx context.Context, name string) (int64, error) {
	v, err := cachedGet(ctx, tx, tx.s.cache.meta, name, copyRow, "meta "+name, func() (*int64, error) {
		return getOne(ctx, tx, wMetaGet, scanInt, "meta "+name, name)
	})
	if err != nil {
		return 0, err
	}
	return *v, nil
}

// PolicyGet returns the policy generation, or store.ErrNotFound.
func (tx *Tx) PolicyGet(ctx context.Context, generation uint64) (*ledger.Policy, error) {
	if !storable(generation) {
		return nil, fmt.Errorf("policy generation %d: %w", generation, store.ErrNotFound)
	}
	what := fmt.Sprintf("policy generation %d", generation)
	return cachedGet(ctx, tx, tx.s.cache.policies, generation, copyPolicy, what, func() (*ledger.Policy, error) {
		return getOne(ctx, tx, wPolicyGet, scanPolicy, what, int64(generation))
	})
}

// PolicyHeadGet returns the key's head, or store.ErrNotFound.
func (tx *Tx) PolicyHeadGet(ctx context.Context, key ledger.PolicyKey) (*ledger.PolicyHead, error) {
	if err := tx.completeHeads(ctx); err != nil {
		return nil, err
	}
	return cachedGet(ctx, tx, tx.s.cache.heads, key, copyRow, "policy head", func() (*ledger.PolicyHead, error) {
		return getOne(ctx, tx, wHeadGet, scanHead, "policy head "+key.String(), key.Subject, key.Route, key.Region)
	})
}

// AccountGet returns the account, or store.ErrNotFound. The transaction
// already holds the database's write lock, so the row cannot change under
// it.
func (tx *Tx) AccountGet(ctx context.Context, key ledger.AccountKey) (*ledger.Account, error) {
	if !storable(key.Generation) {
		return nil, fmt.Errorf("account %s: %w", key, store.ErrNotFound)
	}
	a, slot, err := cachedGetAt(ctx, tx, tx.s.cache.accounts, key, copyRow, "account", func() (*ledger.Account, error) {
		return getOne(ctx, tx, wAccountGet, scanAccount, "account "+key.String(),
			key.Subject, key.Route, key.Region, int64(key.Generation))
	})
	if err == nil {
		var c codec.Conv // as accountArgs stores it
		tx.noteAccountEpoch(key, c.Nanos(a.EpochStart), a.EpochIdle(), slot)
		tx.noteAccountDebt(key, store.RowInDebt(a))
	} else if errors.Is(err, store.ErrNotFound) {
		// No account, so no key in account_debtors: a new account's
		// first write costs no debtor statement unless it owes.
		tx.noteAccountDebt(key, false)
	}
	return a, err
}

// AccountCurrentGet returns the subject's current generation, or
// store.ErrNotFound.
func (tx *Tx) AccountCurrentGet(ctx context.Context, subject ledger.PolicyKey) (uint64, error) {
	g, err := cachedGet(ctx, tx, tx.s.cache.currents, subject, copyRow, "current generation", func() (*uint64, error) {
		v, err := getOne(ctx, tx, wCurrentGet, scanInt, "current generation of "+subject.String(),
			subject.Subject, subject.Route, subject.Region)
		if err != nil {
			return nil, err
		}
		var c codec.Conv
		g := c.Uint(*v)
		return &g, c.Err()
	})
	if err != nil {
		return 0, err
	}
	return *g, nil
}

// ReservationGet returns the reservation, or store.ErrNotFound.
func (tx *Tx) ReservationGet(ctx context.Context, id string) (*ledger.Reservation, error) {
	if r, ok := tx.prefetched[id]; ok {
		if err := tx.check(ctx); err != nil {
			return nil, err
		}
		if r == nil {
			return nil, fmt.Errorf("reservation %s: %w", id, store.ErrNotFound)
		}
		out := *r
		tx.noteReservation(&out)
		return &out, nil
	}
	r, err := getOne(ctx, tx, wReservationGet, scanReservation, "reservation "+id, id)
	if err == nil {
		tx.noteReservation(r)
	}
	return r, err
}

// ReservationsPrefetch reads the reservations named by ids in a few
// statements (up to prefetchChunk ids each) instead of one per id, so that
// ReservationGet answers them without a query until the first Write. It
// returns the first read error; after one, ReservationGet reads as usual.
func (tx *Tx) ReservationsPrefetch(ctx context.Context, ids []string) error {
	if err := tx.check(ctx); err != nil {
		return err
	}
	if len(tx.written) > 0 || len(ids) == 0 {
		return nil
	}
	found := make(map[string]*ledger.Reservation, len(ids))
	args := make([]any, prefetchChunk)
	for start := 0; start < len(ids); start += prefetchChunk {
		chunk := ids[start:min(start+prefetchChunk, len(ids))]
		stmt := wReservationPrefetchSmall
		if len(chunk) > prefetchSmall {
			stmt = wReservationPrefetch
		}
		n := prefetchSmall
		if stmt == wReservationPrefetch {
			n = prefetchChunk
		}
		for i := range n {
			// Unused parameters repeat an id of the chunk: IN ignores
			// duplicates.
			args[i] = chunk[min(i, len(chunk)-1)]
		}
		err := tx.w.query(stmtCtx(ctx), tx.w.stmts[stmt], args[:n], func(sc scanner) error {
			r, err := scanReservation(sc)
			if err != nil {
				return err
			}
			found[r.ID] = &r
			return nil
		})
		if err != nil {
			return fmt.Errorf("prefetch reservations: %w", tx.err(ctx, err))
		}
	}
	for _, id := range ids {
		if _, ok := found[id]; !ok {
			found[id] = nil
		}
	}
	tx.prefetched = found
	return tx.prefetchTombstones(ctx, ids, found)
}

// MoveGet returns the move receipt, or store.ErrNotFound.
func (tx *Tx) MoveGet(ctx context.Context, receiptID string) (*ledger.Move, error) {
	return getOne(ctx, tx, wMoveGet, scanMove, "move "+receiptID, receiptID)
}

// ShardGet returns the shard, or store.ErrNotFound.
func (tx *Tx) ShardGet(ctx context.Context, id string) (*ledger.Shard, error) {
	return getOne(ctx, tx, wShardGet, scanShard, "shard "+id, id)
}

// Write writes c in the documented row order. It returns store.ErrDuplicate
// (wrapped) for an existing new-reservation id, move receipt id or epoch
// statement; an error for a value the schema cannot hold (see codec.Conv);
// store.ErrConflict or store.ErrUnavailable for driver failures. After an
// error the transaction holds part of the batch and can only be rolled
// back: Commit refuses it.
func (tx *Tx) Write(ctx context.Context, c *store.Changes) error {
	if err := tx.check(ctx); err != nil {
		return err
	}
	if tx.failed != nil {
		return fmt.Errorf("write after a failed write: %w", tx.failed)
	}
	// From here on reads see the transaction's own writes: no more answers
	// from the prefetch or the row cache.
	tx.prefetched = nil
	tx.tombs = nil
	tx.written = append(tx.written, c)
	if err := tx.write(ctx, c); err != nil {
		tx.failed = err
		return err
	}
	// In write's order: the removed rows, then the written ones.
	tx.noteSubjectsRemoved(c.Retention.RemovedReservations)
	tx.noteSubjects(c.Reservations, c.NewReservations)
	return nil
}

func (tx *Tx) exec(ctx context.Context, i int, what string, conv *codec.Conv, args []any) error {
	return tx.run(ctx, i, func() string { return what }, conv, args)
}

// run is exec with the statement's description built only for an error:
// Write runs a statement per row kind and chunk, and building every
// description (a concatenation or a Sprintf each) cost allocations on
// every batch for messages almost never shown.
func (tx *Tx) run(ctx context.Context, i int, describe func() string, conv *codec.Conv, args []any) error {
	if err := conv.Err(); err != nil {
		return fmt.Errorf("%s: %w", describe(), err)
	}
	if err := tx.w.exec(stmtCtx(ctx), tx.w.stmts[i], args); err != nil {
		return fmt.Errorf("%s: %w", describe(), tx.err(ctx, err))
	}
	return nil
}

func (tx *Tx) write(ctx context.Context, c *store.Changes) error {
	var conv codec.Conv
	for _, name := range slices.Sorted(maps.Keys(c.Meta)) {
		if err := tx.run(ctx, wMetaPut, func() string { return "meta " + name }, &conv, []any{name, c.Meta[name]}); err != nil {
			return err
		}
	}
	for _, name := range c.MetaRemoved {
		if err := tx.run(ctx, wMetaDelete, func() string { return "delete meta " + name }, &conv, []any{name}); err != nil {
			return err
		}
	}
	for i := range c.Policies {
		p := &c.Policies[i]
		if err := tx.run(ctx, wPolicyPut, func() string { return fmt.Sprintf("policy generation %d", p.Generation) }, &conv, policyArgs(p, &conv)); err != nil {
			return err
		}
	}
	for i := range c.Heads {
		h := &c.Heads[i]
		if err := tx.run(ctx, wHeadPut, func() string { return "policy head " + h.Key.String() }, &conv, headArgs(h, &conv)); err != nil {
			return err
		}
	}
	for i := range c.Accounts {
		a := &c.Accounts[i]
		if conv.Dims(int64(a.Dims)); conv.Err() != nil {
			return fmt.Errorf("account %s: %w", a.Key, conv.Err())
		}
	}
	if err := tx.putAccounts(ctx, c.Accounts, &conv); err != nil {
		return err
	}
	for _, cur := range c.Currents {
		if err := tx.run(ctx, wCurrentPut, func() string { return "current of " + cur.Subject.String() }, &conv, currentArgs(cur.Subject, cur.Generation, &conv)); err != nil {
			return err
		}
	}
	if err := tx.deleteReservations(ctx, c.Retention.RemovedReservations); err != nil {
		return err
	}
	var inserts, freshInserts, updates []*ledger.Reservation
	for i := range c.Reservations {
		r := &c.Reservations[i]
		if c.NewReservations[r.ID] {
			if fresh(r) {
				freshInserts = append(freshInserts, r)
			} else {
				inserts = append(inserts, r)
			}
			continue
		}
		updates = append(updates, r)
	}
	if err := tx.putReservations(ctx, updates, &conv); err != nil {
		return err
	}
	reservationName := func(r *ledger.Reservation) string { return "insert reservation " + r.ID }
	shared, freshInserts := groupFresh(freshInserts, &conv)
	for _, group := range shared {
		r := group[0]
		prefix := []any{r.Account.Subject, r.Account.Route, r.Account.Region, conv.Int(r.Account.Generation),
			conv.Nanos(r.AccountingEpoch), conv.Nanos(r.CreatedAt), conv.Nanos(r.ExpiresAt)}
		if err := insertRows(ctx, tx, &conv, prefix, group, wFreshSharedRows, appendFreshSharedArgs, reservationName); err != nil {
			return err
		}
	}
	if err := insertRows(ctx, tx, &conv, nil, freshInserts, wFreshReservationRows, appendFreshReservationArgs, reservationName); err != nil {
		return err
	}
	if err := insertRows(ctx, tx, &conv, nil, inserts, wReservationRows, appendReservationArgs, reservationName); err != nil {
		return err
	}
	for i := range c.Moves {
		m := &c.Moves[i]
		if err := tx.run(ctx, wMoveInsert, func() string { return "insert move " + m.ReceiptID }, &conv, moveArgs(m, &conv)); err != nil {
			return err
		}
	}
	for i := range c.Shards {
		sh := &c.Shards[i]
		if err := tx.run(ctx, wShardPut, func() string { return "shard " + sh.ID }, &conv, shardArgs(sh, &conv)); err != nil {
			return err
		}
	}
	if err := tx.deleteShards(ctx, &conv, c.RemovedShards); err != nil {
		return err
	}
	statements := make([]*ledger.Statement, len(c.Statements))
	for i := range c.Statements {
		statements[i] = &c.Statements[i]
	}
	if err := insertRows(ctx, tx, &conv, nil, statements, wStatementRows, appendStatementArgs,
		func(st *ledger.Statement) string { return "insert statement of " + st.Account.String() }); err != nil {
		return err
	}
	if err := tx.writeRetention(ctx, &c.Retention); err != nil {
		return err
	}
	if len(c.Journal) == 0 {
		return nil
	}
	// The driver copies the blob into C memory: the buffer is reused.
	what := func() string { return fmt.Sprintf("journal of %d entries", len(c.Journal)) }
	blob, err := appendJournalBatch(tx.w.journalBuf[:0], c.Journal)
	if err != nil {
		return fmt.Errorf("%s: %w", what(), err)
	}
	tx.w.journalBuf = blob
	return tx.run(ctx, wJournalBatchInsert, what, &conv, []any{blob})
}

// minSharedRows is the fewest fresh reservations sharing freshSharedCols
// that groupFresh writes as a group (wFreshSharedRows); smaller groups go
// together in the fewer statements of wFreshReservationRows.
const minSharedRows = 4

// freshGroup is what the rows of a wFreshSharedRows statement share.
type freshGroup struct {
	account                   ledger.AccountKey
	epoch, created, expiresAt int64
}

func freshGroupOf(r *ledger.Reservation, c *codec.Conv) freshGroup {
	return freshGroup{r.Account, c.Nanos(r.AccountingEpoch), c.Nanos(r.CreatedAt), c.Nanos(r.ExpiresAt)}
}

// groupFresh returns the groups of at least minSharedRows rows that share
// freshSharedCols, and the other rows; each group and the rest keep the
// order of rows.
func groupFresh(rows []*ledger.Reservation, c *codec.Conv) (groups [][]*ledger.Reservation, rest []*ledger.Reservation) {
	if len(rows) < minSharedRows {
		return nil, rows
	}
	first := freshGroupOf(rows[0], c)
	same := true
	for _, r := range rows[1:] {
		if freshGroupOf(r, c) != first {
			same = false
			break
		}
	}
	if same {
		return [][]*ledger.Reservation{rows}, nil
	}
	byGroup := map[freshGroup][]*ledger.Reservation{}
	var order []freshGroup
	for _, r := range rows {
		g := freshGroupOf(r, c)
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], r)
	}
	for _, g := range order {
		if members := byGroup[g]; len(members) >= minSharedRows {
			groups = append(groups, members)
		} else {
			rest = append(rest, members...)
		}
	}
	return groups, rest
}

// insertRows inserts rows in order through the multi-row statements
// first..first+len(chunkSizes)-1 (execChunks).
func insertRows[T any](ctx context.Context, tx *Tx, conv *codec.Conv, prefix []any, rows []*T, first int,
	appendArgs func([]any, *T, *codec.Conv) []any, name func(*T) string) error {
	_, err := execChunks(ctx, tx, conv, prefix, rows, first,
		func(args []any, r *T) []any { return appendArgs(args, r, conv) }, name)
	return err
}

// execChunks runs rows in order through the multi-row statements
// first..first+len(chunkSizes)-1 (one per chunkSizes entry): as many rows
// per statement as the largest size that fits, each statement bound to
// prefix (the same for every chunk) and then each row's arguments. It
// returns the rows of each chunk whose statement changed fewer rows than
// the chunk holds: for an UPDATE, rows that are not stored as the
// transaction read them, which the caller writes by its upsert.
func execChunks[T any](ctx context.Context, tx *Tx, conv *codec.Conv, prefix []any, rows []T, first int,
	appendArgs func([]any, T) []any, name func(T) string) ([]T, error) {
	var missed []T
	// w.execCount copies the arguments: the slice is reused.
	args := tx.w.rowArgs
	defer func() {
		clear(args) // keep no row's strings alive
		tx.w.rowArgs = args[:0]
	}()
	for k, size := range chunkSizes {
		for len(rows) >= size {
			chunk := rows[:size]
			rows = rows[size:]
			args = append(args[:0], prefix...)
			for _, r := range chunk {
				args = appendArgs(args, r)
			}
			describe := func() string {
				what := name(chunk[0])
				if size > 1 {
					what += fmt.Sprintf(" (and %d more)", size-1)
				}
				return what
			}
			if err := conv.Err(); err != nil {
				return nil, fmt.Errorf("%s: %w", describe(), err)
			}
			n, err := tx.w.execCount(stmtCtx(ctx), tx.w.stmts[first+k], args)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", describe(), tx.err(ctx, err))
			}
			if n != int64(size) {
				missed = append(missed, chunk...)
			}
		}
	}
	return missed, nil
}

// Commit makes the transaction durable (the WAL is fsynced before it
// returns: by the COMMIT itself, or in a pipelined store by Store.Sync
// right after it) and returns nil. Otherwise it returns: the Write error after a
// failed Write, having rolled back; the context's error when the Begin or
// Commit context has ended, having rolled back (nothing visible);
// store.ErrUnavailable after Close, having rolled back;
// store.ErrConflict or store.ErrUnavailable from the driver (for an I/O
// error during COMMIT the outcome is unknown, as store.ErrUnavailable
// says; a full disk, SQLITE_FULL, adds store.ErrRolledBack: nothing
// committed, commitNotWritten; a failed fsync fails the store for good,
// see store.Syncer). Every
// outcome ends the transaction.
func (tx *Tx) Commit(ctx context.Context) error {
	if err := tx.commit(ctx); err != nil {
		return err
	}
	if err := tx.s.Sync(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// CommitDeferred is Commit without the fsync in a pipelined store
// (store.DeferredCommitter): the commit is visible to this process's
// writer at once, and durable (and visible to the read methods) once a
// later Store.Sync returned nil. In a store not opened WithPipelinedSync
// it is Commit.
func (tx *Tx) CommitDeferred(ctx context.Context) error { return tx.commit(ctx) }

func (tx *Tx) commit(ctx context.Context) error {
	if tx.done {
		return errors.New("commit: transaction already ended")
	}
	defer tx.end()
	if err := tx.failed; err != nil {
		tx.rollback(ctx)
		return fmt.Errorf("commit after a failed write: %w", err)
	}
	if tx.s.closed.Load() {
		tx.rollback(ctx)
		return fmt.Errorf("commit: %w", errClosed)
	}
	if err := tx.ctx.Err(); err != nil {
		tx.rollback(ctx)
		return fmt.Errorf("commit: transaction context: %w", err)
	}
	if err := ctx.Err(); err != nil {
		tx.rollback(ctx)
		return fmt.Errorf("commit: %w", err)
	}
	seq := tx.s.beginCommit(stmtCtx(ctx), tx.w)
	err := tx.w.exec(stmtCtx(ctx), tx.w.commit, nil)
	tx.s.endWrite(seq)
	if f := tx.s.commitFault.Load(); f != nil && err == nil {
		err = (*f)() // a test's COMMIT that worked and answered an error
	}
	if err != nil {
		tx.s.noteFsyncFailure(err)
		// The outcome may be unknown: the cache reads everything again.
		// A COMMIT that failed may leave the transaction open (SQLITE_BUSY
		// does): end it, or the next BEGIN would fail.
		tx.s.cache.invalidate()
		// Its subject index entries may be in the file: the flusher
		// catches up from the journal (subjectindex.go). Those of the
		// reservations it removed leave pending, whatever the outcome:
		// the catch-up restores a kept one's from its batches.
		tx.s.subjects.remove(tx.subjectsRemoved)
		tx.s.subjects.behind()
		tx.rollback(ctx)
		if commitNotWritten(err) {
			return fmt.Errorf("commit: %w: %w", store.ErrRolledBack, tx.err(ctx, err))
		}
		return fmt.Errorf("commit: %w", tx.err(ctx, err))
	}
	tx.s.commits.Add(1)
	// Removals first: an id retired and admitted again in this
	// transaction keeps its new entry (noteSubjectsRemoved).
	tx.s.subjects.remove(tx.subjectsRemoved)
	tx.s.subjects.add(tx.subjectKeys)
	for _, c := range tx.written {
		tx.s.cache.committed(c, tx.accountSlot)
	}
	return nil
}

// commitNotWritten reports whether a COMMIT's error says its commit
// record never reached the WAL whole, so that nothing of the transaction
// is committed, now or after a crash's recovery: SQLITE_FULL. In WAL mode
// a COMMIT writes the transaction's frames in order, the one carrying the
// commit mark last; a frame counts only with its checksum whole, so a
// write that ran out of room (SQLITE_FULL comes only from a write refused
// with ENOSPC) left at most a torn, invalid commit frame. What a COMMIT
// does after that frame fails with other codes: the fsync (SQLITE_IOERR_FSYNC),
// the wal-index (SQLITE_IOERR_SHM*), and padding frames after the commit
// frame, which SQLite writes only without powersafe overwrite (on by
// default: the store never turns it off). It holds because no connection
// checkpoints on commit (wal_autocheckpoint(0), checkpoint.go): SQLite
// reports a failed autocheckpoint's error, SQLITE_FULL too, from the
// COMMIT that ran it, after that commit took effect. Every other error of
// a COMMIT leaves its outcome unknown.
func commitNotWritten(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code() == sqlite3.SQLITE_FULL
}

// rollback ends the transaction without its writes and returns the
// driver's error, if any (none when SQLite had ended it already).
func (tx *Tx) rollback(ctx context.Context) error {
	return tx.w.exec(stmtCtx(ctx), tx.w.rollback, nil)
}

// Rollback discards the transaction and returns nil; after Commit or a
// previous Rollback it does nothing and returns nil.
func (tx *Tx) Rollback(ctx context.Context) error {
	if tx.done {
		return nil
	}
	defer tx.end()
	// The connection stays open until end: Close waits for the writer.
	if err := tx.rollback(ctx); err != nil {
		return fmt.Errorf("rollback: %w", tx.err(ctx, err))
	}
	return nil
}
