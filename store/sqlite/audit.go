package sqlite

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
)

// AuditSnapshot implements store.CheckpointStore: one read transaction,
// the reservations and the journal after the last checkpoint each read
// through one cursor (SQLite steps it a row at a time; the journal is
// decoded a batch at a time), so an audit holds a row and a batch rather
// than the history. A journal position is a journal_batches seq;
// rows of the journal table (schema versions 1 and 2) are at position 0,
// before every batch, and the first checkpoint summarises them.
func (s *Store) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) (err error) {
	defer s.readBarrier(ctx, &err)
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
	// One writer at a time: every batch up to the last one read is in the
	// snapshot, and a later one gets a greater seq.
	var through int64
	if !cut {
	} else if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM journal_batches").Scan(&through); err != nil {
		return fmt.Errorf("snapshot journal: %w", translate(ctx, err))
	}
	streamAccounts(ctx, tx, snap)
	snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
		return auditReservations(ctx, tx, yield)
	}
	last := snap.LastCheckpoint()
	snap.Estimate = func(reservations bool) (int64, error) { return estimateRows(ctx, tx, last, reservations) }
	snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
		return journalSince(ctx, tx, last, func(pos int64, batch []ledger.JournalEntry) error {
			for i := range batch {
				if err := yield(pos, &batch[i]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return f(snap, through)
}

// journalSince calls f with the journal after checkpoint last (every entry
// when last is nil), a batch at a time with its position; the slice is
// reused between calls.
func journalSince(ctx context.Context, tx *sql.Tx, last *ledger.Checkpoint, f func(pos int64, batch []ledger.JournalEntry) error) error {
	var after int64
	if last != nil {
		after = last.Through
	} else {
		legacy, err := queryAll(ctx, txQuery{tx, "SELECT " + journalCols + " FROM journal ORDER BY seq"}, scanJournal, "snapshot journal")
		if err != nil {
			return err
		}
		if len(legacy) > 0 {
			if err := f(0, legacy); err != nil {
				return err
			}
		}
	}
	rows, err := tx.QueryContext(ctx, "SELECT seq, entries FROM journal_batches WHERE seq > ? ORDER BY seq", after)
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
		if err := f(seq, batch); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
	}
	return nil
}

const (
	checkpointCols        = "seq, through, cut_at, entries, moves, prev, accounts_digest, digest"
	checkpointAccountCols = "subject, route, region, generation, balances, entries, journal"
)

// checkpointChain reads every checkpoint header, oldest first, and the
// last one's accounts when asked.
func checkpointChain(ctx context.Context, tx *sql.Tx, withAccounts bool) ([]ledger.Checkpoint, error) {
	chain, err := queryAll(ctx, txQuery{tx, "SELECT " + checkpointCols + " FROM checkpoints ORDER BY seq"}, scanCheckpoint, "snapshot checkpoints")
	if err != nil || len(chain) == 0 || !withAccounts {
		return chain, err
	}
	last := &chain[len(chain)-1]
	var accounts int64
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM checkpoint_accounts WHERE seq = ?", last.Seq).Scan(&accounts); err != nil {
		return nil, fmt.Errorf("snapshot checkpoint accounts: %w", translate(ctx, err))
	}
	last.Accounts, err = queryAllSized(ctx, txQuery{tx, "SELECT " + checkpointAccountCols + " FROM checkpoint_accounts WHERE seq = ? ORDER BY subject, route, region, generation"},
		accounts, scanCheckpointAccount, "snapshot checkpoint accounts", last.Seq)
	return chain, err
}

func scanCheckpoint(sc scanner) (ledger.Checkpoint, error) {
	var (
		c     ledger.Checkpoint
		cutAt int64
		conv  codec.Conv
	)
	if err := sc.Scan(&c.Seq, &c.Through, &cutAt, &c.Entries, &c.Moves, &c.Prev, &c.AccountsDigest, &c.Digest); err != nil {
		return c, err
	}
	c.CutAt = conv.Time(cutAt)
	return c, conv.Err()
}

func scanCheckpointAccount(sc scanner) (ledger.CheckpointAccount, error) {
	var (
		a          ledger.CheckpointAccount
		generation int64
		balances   []byte
	)
	if err := sc.Scan(&a.Account.Subject, &a.Account.Route, &a.Account.Region, &generation, &balances, &a.Entries, &a.Journal); err != nil {
		return a, err
	}
	a.Account.Generation = uint64(generation)
	var err error
	a.Balances, err = codec.DecodeBalances(balances)
	return a, err
}

// estimateRows estimates the journal entries after checkpoint last, plus
// the reservations when asked: the batches since times the mean entry
// count of the newest 32 (each blob starts with its count).
func estimateRows(ctx context.Context, tx *sql.Tx, last *ledger.Checkpoint, reservations bool) (int64, error) {
	var after, rows, batches int64
	if last != nil {
		after = last.Through
	} else if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM journal").Scan(&rows); err != nil {
		return 0, translate(ctx, err)
	}
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM journal_batches WHERE seq > ?", after).Scan(&batches); err != nil {
		return 0, translate(ctx, err)
	}
	sample, err := tx.QueryContext(ctx, "SELECT substr(entries, 1, 11) FROM journal_batches WHERE seq > ? ORDER BY seq DESC LIMIT 32", after)
	if err != nil {
		return 0, translate(ctx, err)
	}
	defer sample.Close()
	var entries, sampled int64
	for sample.Next() {
		var head []byte
		if err := sample.Scan(&head); err != nil {
			return 0, translate(ctx, err)
		}
		if len(head) > 1 {
			if n, k := binary.Uvarint(head[1:]); k > 0 {
				entries += int64(n)
				sampled++
			}
		}
	}
	if err := sample.Err(); err != nil {
		return 0, translate(ctx, err)
	}
	if sampled > 0 {
		rows += batches * entries / sampled
	}
	if reservations {
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM reservations").Scan(&n); err != nil {
			return 0, translate(ctx, err)
		}
		rows += n
	}
	return rows, nil
}

// auditReservationCols are the columns of a reservation the audit reads
// (ledger.Snapshot.ReservationStream).
const auditReservationCols = "id, subject, route, region, generation, state, reserved, actual, overdraft"

// auditReservations calls yield with every reservation in id order, only
// the audit's fields filled, through one reused row: reading the 19
// columns of each and allocating a row apiece cost the audit of a large
// store more than everything else it does.
func auditReservations(ctx context.Context, tx *sql.Tx, yield func(*ledger.Reservation) error) error {
	rows, err := tx.QueryContext(ctx, "SELECT "+auditReservationCols+" FROM reservations ORDER BY id")
	if err != nil {
		return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
	}
	defer rows.Close()
	var (
		r                           ledger.Reservation
		conv                        codec.Conv
		subject, route, region      sql.RawBytes
		reserved, actual, overdraft sql.RawBytes
		generation, state           int64
	)
	for rows.Next() {
		if err := rows.Scan(&r.ID, &subject, &route, &region, &generation, &state, &reserved, &actual, &overdraft); err != nil {
			return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
		}
		// Most rows name the account of the row before: keep its strings.
		if string(subject) != r.Account.Subject {
			r.Account.Subject = string(subject)
		}
		if string(route) != r.Account.Route {
			r.Account.Route = string(route)
		}
		if string(region) != r.Account.Region {
			r.Account.Region = string(region)
		}
		r.Account.Generation = conv.Uint(generation)
		r.State = conv.State(state)
		r.Reserved, r.Actual, r.Overdraft = conv.Amounts(reserved), conv.Amounts(actual), conv.Amounts(overdraft)
		if err := conv.Err(); err != nil {
			return fmt.Errorf("reservation %s: %w", r.ID, err)
		}
		if err := yield(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
	}
	return nil
}
