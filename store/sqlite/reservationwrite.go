package sqlite

import (
	"context"
	"database/sql/driver"
	"fmt"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
)

// reservationUpdateSQL rewrites what a reservation's lifecycle changes
// (state, usage, the times of its steps, due_at) and nothing else: every
// other column is fixed when the reservation is reserved (the ledger never
// changes them; the audit checks it). Binding 11 values instead of the
// upsert's 20 (the driver copies every string and blob into C memory)
// and naming fewer columns is cheaper, and SQLite maintains only the
// indexes whose columns an UPDATE names: none of the key columns of
// reservations_by_subject is named here.
var reservationUpdateSQL = "UPDATE reservations SET " + reservationUpdateSet + " WHERE id = ?"

const reservationUpdateSet = "actual = ?, overdraft = ?, operation_id = ?, state = ?, started_at = ?, " +
	"execution_deadline = ?, unknown_at = ?, finished_at = ?, breach = ?, due_at = ?"

// reservationFixed is what a reservation's row holds that
// reservationUpdateSQL does not write, as the row stores it.
type reservationFixed struct {
	requestDigest           string
	account                 ledger.AccountKey
	epoch, created, expires int64
	reserved                ledger.Amounts
}

func fixedOf(r *ledger.Reservation, c *codec.Conv) reservationFixed {
	return reservationFixed{r.RequestDigest, r.Account, c.Nanos(r.AccountingEpoch), c.Nanos(r.CreatedAt),
		c.Nanos(r.ExpiresAt), r.Reserved}
}

// noteReservation records the fixed columns of r, which this transaction
// read from the file, so a write of r that keeps them can use
// reservationUpdateSQL.
func (tx *Tx) noteReservation(r *ledger.Reservation) {
	var c codec.Conv
	f := fixedOf(r, &c)
	if c.Err() != nil {
		return // not as stored: the upsert writes it (and reports the error)
	}
	if tx.storedReservations == nil {
		tx.storedReservations = map[string]reservationFixed{}
	}
	tx.storedReservations[r.ID] = f
}

func appendReservationUpdateArgs(dst []any, r *ledger.Reservation, c *codec.Conv) []any {
	return append(dst, codec.EncodeAmounts(&r.Actual), codec.EncodeAmounts(&r.Overdraft), r.OperationID, int64(r.State),
		c.Nanos(r.StartedAt), c.Nanos(r.ExecutionDeadline), c.Nanos(r.UnknownAt), c.Nanos(r.FinishedAt), c.Bool(r.Breach),
		dueAt(r, c), r.ID)
}

// putReservation writes r over its existing row: with
// reservationUpdateSQL when this transaction read the row and r keeps its
// fixed columns, else (a blind write, a changed fixed column, or an update
// that found no row) with the upsert, which writes every column.
func (tx *Tx) putReservation(ctx context.Context, r *ledger.Reservation, conv *codec.Conv) error {
	describe := func() string { return "reservation " + r.ID }
	if stored, ok := tx.storedReservations[r.ID]; ok && stored == fixedOf(r, conv) {
		args := appendReservationUpdateArgs(tx.w.rowArgs[:0], r, conv)
		defer func() { clear(args); tx.w.rowArgs = args[:0] }()
		if err := conv.Err(); err != nil {
			return fmt.Errorf("%s: %w", describe(), err)
		}
		nv, err := tx.w.named(args)
		if err != nil {
			return fmt.Errorf("%s: %w", describe(), err)
		}
		res, err := tx.w.stmts[wReservationUpdate].(driver.StmtExecContext).ExecContext(stmtCtx(ctx), nv)
		if err != nil {
			return fmt.Errorf("%s: %w", describe(), tx.err(ctx, err))
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			return nil
		}
	}
	return tx.run(ctx, wReservationPut, describe, conv, reservationArgs(r, conv))
}
