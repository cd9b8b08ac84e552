package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/capledger/capledger/ledger"
)

// SnapshotStreaming is Snapshot without the journal in memory: it calls f
// with a snapshot whose JournalStream reads the journal, row by row, in
// the same REPEATABLE READ transaction, so an audit does not hold the
// history. The snapshot is valid only during f. It returns f's error, or
// the read's.
func (s *Store) SnapshotStreaming(ctx context.Context, f func(*ledger.Snapshot) error) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return s.c.classify("snapshot: begin", err, false)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	snap, err := s.snapshotRows(ctx, tx)
	if err != nil {
		return err
	}
	snap.JournalStream = func(yield func(*ledger.JournalEntry) error) error {
		return s.journalEach(ctx, tx, yield)
	}
	if err := f(snap); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return s.c.classify("snapshot: end", err, false)
	}
	return nil
}

// snapshotRows reads every row of a snapshot but the journal, in tx.
func (s *Store) snapshotRows(ctx context.Context, tx pgx.Tx) (*ledger.Snapshot, error) {
	var err error
	snap := &ledger.Snapshot{JournalComplete: true}
	if snap.Policies, err = s.policyList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
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
	if snap.Moves, err = s.moveList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if snap.Shards, err = s.shardList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if snap.Statements, err = s.statementList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if snap.Retained, err = s.retainedList(ctx, tx); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return snap, nil
}
