package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// auditPage is how many reservations one query of an audit reads.
const auditPage = 4096

// AuditSnapshot implements store.CheckpointStore in one REPEATABLE READ,
// read-only transaction: reservations are read a page at a time in id
// order and the journal after the last checkpoint row by row, so an audit
// holds a page rather than the history. A journal position is journal.seq.
//
// Journal rows get their seq when inserted, not when committed, so a
// snapshot may hold seq 12 while seq 11 is still uncommitted. With cut, a
// short transaction first takes a SHARE lock on journal, which waits for
// every open writer of it (and holds new ones for that long) and reads the
// greatest seq then: every row up to it is committed, and the snapshot
// taken after sees them all.
func (s *Store) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) error {
	var through int64
	if cut {
		var err error
		if through, err = s.committedThrough(ctx); err != nil {
			return err
		}
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return s.c.classify("snapshot: begin", err, false)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	store.Progressed(ctx)
	snap, err := s.snapshotRows(ctx, tx, false)
	if err != nil {
		return err
	}
	s.streamAccounts(ctx, tx, snap)
	snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
		after := ""
		for {
			page, err := s.reservationsQuery(ctx, tx, "snapshot reservations", reservationSelect+` WHERE id > $1 ORDER BY id LIMIT $2`, after, auditPage)
			if err != nil {
				return err
			}
			for i := range page {
				if err := yield(&page[i]); err != nil {
					return err
				}
			}
			if len(page) < auditPage {
				return nil
			}
			after = page[len(page)-1].ID
		}
	}
	var after int64
	if last := snap.LastCheckpoint(); last != nil {
		after = last.Through
	}
	snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
		return s.journalEach(ctx, tx, after, yield)
	}
	snap.Estimate = func(reservations bool) (int64, error) {
		// The seq span since the checkpoint (exact but for gaps), and the
		// live rows of the accounts (read after the journal) and the
		// reservations: no count(*) over the tables. Live rows are the
		// statistics' n_live_tup, which every insert and delete moves
		// (within a second or so); the planner's reltuples changes only at
		// VACUUM or ANALYZE, so right after retention removed most
		// reservations (autovacuum off, or not yet run) it still counted
		// them (328,443 estimated for far fewer). But n_live_tup starts
		// again from 0 when the statistics are reset (crash recovery, a
		// start from a base backup, a promoted standby): it then counts
		// only the rows inserted since (10 of 2,010). A vacuum or analyze
		// sets n_live_tup to the rows present, so one seen by the
		// statistics makes it right; with none seen, either they were
		// reset or the table was never vacuumed nor analysed (then
		// n_live_tup counts from the table's start), so the larger of
		// n_live_tup and reltuples (kept in pg_class through a reset; 0
		// for a table never analysed, or the rows when a migration built
		// an index) counts the rows, near enough for a progress bar.
		var rows int64
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), $1) - $1 FROM journal`, after).Scan(&rows); err != nil {
			return 0, s.c.classify("snapshot: estimate", err, false)
		}
		store.Progressed(ctx) // each query answered: a bounded audit waits anew
		tables := []string{"accounts"}
		if reservations {
			tables = append(tables, "reservations")
		}
		for _, table := range tables {
			var live int64
			var counted bool
			var planned float64
			if err := tx.QueryRow(ctx, `SELECT COALESCE(st.n_live_tup, 0),
					COALESCE(st.last_vacuum, st.last_autovacuum, st.last_analyze, st.last_autoanalyze) IS NOT NULL,
					GREATEST(c.reltuples, 0)
				FROM pg_class c LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid WHERE c.oid = $1::regclass`, table).Scan(&live, &counted, &planned); err != nil {
				return 0, s.c.classify("snapshot: estimate", err, false)
			}
			store.Progressed(ctx)
			if counted {
				rows += live
			} else {
				rows += max(live, int64(planned))
			}
		}
		return rows, nil
	}
	if err := f(snap, through); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return s.c.classify("snapshot: end", err, false)
	}
	return nil
}

// committedThrough returns the greatest journal seq all of whose rows
// before it are committed (AuditSnapshot).
func (s *Store) committedThrough(ctx context.Context) (int64, error) {
	var through int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE journal IN SHARE MODE`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM journal`).Scan(&through)
	})
	return through, s.c.classify("snapshot: journal position", err, false)
}

// snapshotRows reads every row of a snapshot but the journal (and the
// reservations and policies, unless reservations is set: then the
// snapshot reads the policies of the generations asked, PoliciesOf), in
// tx.
func (s *Store) snapshotRows(ctx context.Context, tx pgx.Tx, reservations bool) (*ledger.Snapshot, error) {
	var err error
	snap := &ledger.Snapshot{JournalComplete: true}
	if !reservations { // an audit's: the policies of a page of accounts at a time
		snap.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
			return s.policiesOf(ctx, tx, generations)
		}
	} else if snap.Policies, err = s.policyList(ctx, tx, 0); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	// A query answered: a bounded audit (store.WithProgress) waits anew
	// for each next one.
	store.Progressed(ctx)
	if reservations { // else streamed (streamAccounts)
		rows, err := tx.Query(ctx, accountSelect+` ORDER BY a.subject, a.route, a.region, a.generation, t.dim`)
		if err != nil {
			return nil, s.c.classify("snapshot: accounts", err, false)
		}
		if snap.Accounts, _, err = scanAccounts(rows); err != nil {
			return nil, s.c.classify("snapshot: accounts", err, false)
		}
		if snap.Reservations, err = s.reservationList(ctx, tx); err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}
	store.Progressed(ctx)
	if snap.Moves, err = s.moveList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	store.Progressed(ctx)
	if snap.Shards, err = s.shardList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	store.Progressed(ctx)
	if snap.Statements, err = s.statementList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	store.Progressed(ctx)
	if snap.Retained, err = s.retainedList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	store.Progressed(ctx)
	if snap.RetainedShards, err = s.retainedShardsList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	store.Progressed(ctx)
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(value), 0) FROM meta WHERE name = $1`, store.MetaForgetsJournaledAfter).
		Scan(&snap.ForgetsJournaledAfter); err != nil {
		return nil, s.c.classify("snapshot: meta", err, false)
	}
	store.Progressed(ctx)
	if snap.Checkpoints, err = s.checkpointChain(ctx, tx, reservations); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return snap, nil
}

// CheckpointLast implements store.CheckpointStore.
func (s *Store) CheckpointLast(ctx context.Context) (ledger.Checkpoint, bool, error) {
	var (
		c     ledger.Checkpoint
		cutAt int64
		conv  codec.Conv
	)
	err := s.pool.QueryRow(ctx, `SELECT seq, through, cut_at, entries, moves, prev, accounts_digest, digest FROM checkpoints ORDER BY seq DESC LIMIT 1`).
		Scan(&c.Seq, &c.Through, &cutAt, &c.Entries, &c.Moves, &c.Prev, &c.AccountsDigest, &c.Digest)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Checkpoint{}, false, nil
	}
	if err != nil {
		return ledger.Checkpoint{}, false, s.c.classify("last checkpoint", err, false)
	}
	c.CutAt = conv.Time(cutAt)
	return c, true, conv.Err()
}

// checkpointChain reads every checkpoint header, oldest first, and the
// last one's accounts when asked.
func (s *Store) checkpointChain(ctx context.Context, q querier, withAccounts bool) ([]ledger.Checkpoint, error) {
	rows, err := q.Query(ctx, `SELECT seq, through, cut_at, entries, moves, prev, accounts_digest, digest FROM checkpoints ORDER BY seq`)
	if err != nil {
		return nil, s.c.classify("checkpoints", err, false)
	}
	var chain []ledger.Checkpoint
	for rows.Next() {
		var (
			c     ledger.Checkpoint
			cutAt int64
			conv  codec.Conv
		)
		if err := rows.Scan(&c.Seq, &c.Through, &cutAt, &c.Entries, &c.Moves, &c.Prev, &c.AccountsDigest, &c.Digest); err != nil {
			rows.Close()
			return nil, s.c.classify("checkpoints", err, false)
		}
		c.CutAt = conv.Time(cutAt)
		chain = append(chain, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(chain) == 0 || !withAccounts {
		return chain, s.c.classify("checkpoints", err, false)
	}
	last := &chain[len(chain)-1]
	rows, err = q.Query(ctx, `SELECT subject, route, region, generation, balances, entries, journal
		FROM checkpoint_accounts WHERE seq = $1 ORDER BY subject, route, region, generation`, last.Seq)
	if err != nil {
		return nil, s.c.classify("checkpoint accounts", err, false)
	}
	defer rows.Close()
	last.Accounts = []ledger.CheckpointAccount{}
	for rows.Next() {
		var (
			a          ledger.CheckpointAccount
			generation int64
			balances   []byte
		)
		if err := rows.Scan(&a.Account.Subject, &a.Account.Route, &a.Account.Region, &generation, &balances, &a.Entries, &a.Journal); err != nil {
			return nil, s.c.classify("checkpoint accounts", err, false)
		}
		a.Account.Generation = uint64(generation)
		if a.Balances, err = codec.DecodeBalances(balances); err != nil {
			return nil, fmt.Errorf("checkpoint %d accounts: %w", last.Seq, err)
		}
		last.Accounts = append(last.Accounts, a)
	}
	return chain, s.c.classify("checkpoint accounts", rows.Err(), false)
}

// JournalCompact implements store.CheckpointStore: one DELETE of the
// oldest rows the last checkpoint summarises, through the primary key.
func (s *Store) JournalCompact(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("journal compaction: limit %d, want a positive one", limit)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM journal WHERE seq IN (
		SELECT seq FROM journal WHERE seq <= (SELECT COALESCE(MAX(through), 0) FROM checkpoints) ORDER BY seq LIMIT $1)`, limit)
	if err != nil {
		return 0, s.c.classify("journal compaction", err, true)
	}
	return int(tag.RowsAffected()), nil
}
