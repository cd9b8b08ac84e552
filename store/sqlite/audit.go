package sqlite

import (
	"context"
	"fmt"

	"github.com/capledger/capledger/ledger"
)

// SnapshotStreaming is Snapshot without the journal in memory: it calls f
// with a snapshot whose JournalStream reads the journal inside the same
// read transaction, one batch at a time, so an audit holds one batch of
// entries rather than the history. The snapshot is valid only during f.
// It returns f's error, or the read's.
func (s *Store) SnapshotStreaming(ctx context.Context, f func(*ledger.Snapshot) error) error {
	if s.closed.Load() {
		return errClosed
	}
	tx, err := s.readDB.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("snapshot: %w", translate(ctx, err))
	}
	defer tx.Rollback()
	snap, err := s.snapshotRows(ctx, tx, false)
	if err != nil {
		return err
	}
	snap.JournalStream = func(yield func(*ledger.JournalEntry) error) error {
		// Rows of the journal table (schema versions 1 and 2) first.
		legacy, err := queryAll(ctx, txQuery{tx, "SELECT " + journalCols + " FROM journal ORDER BY seq"}, scanJournal, "snapshot journal")
		if err != nil {
			return err
		}
		for i := range legacy {
			if err := yield(&legacy[i]); err != nil {
				return err
			}
		}
		legacy = nil
		rows, err := tx.QueryContext(ctx, "SELECT seq, entries FROM journal_batches ORDER BY seq")
		if err != nil {
			return fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
		}
		defer rows.Close()
		var batch []ledger.JournalEntry
		for rows.Next() {
			var (
				seq     int64
				entries []byte
			)
			if err := rows.Scan(&seq, &entries); err != nil {
				return fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
			}
			if batch, err = decodeJournalBatch(batch[:0], entries); err != nil {
				return fmt.Errorf("journal batch %d: %w", seq, err)
			}
			for i := range batch {
				if err := yield(&batch[i]); err != nil {
					return err
				}
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
		}
		return nil
	}
	return f(snap)
}
