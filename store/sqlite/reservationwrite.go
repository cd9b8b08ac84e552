package sqlite

import (
	"context"
	"fmt"
	"strings"

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
var reservationUpdateSQL = "UPDATE OR FAIL reservations SET " +
	strings.ReplaceAll(reservationUpdateCols, ",", " = ?,") + " = ? WHERE id = ?"

// reservationUpdateCols are the columns the short UPDATE writes, in the
// order appendReservationUpdateArgs binds them (then the id).
const reservationUpdateCols = "actual, overdraft, operation_id, state, started_at, execution_deadline, unknown_at, " +
	"finished_at, breach, due_at"

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

// putReservations writes rows over their existing rows. Those this
// transaction read, keeping their fixed columns, are written by the short
// UPDATE, as many rows a statement as the largest of chunkSizes that fits
// (wReservationUpdateRows); the others (a blind write, a changed fixed
// column, an id given twice) and the rows of a chunk that did not update
// as many rows as it holds are written one at a time by the upsert, which
// writes every column.
func (tx *Tx) putReservations(ctx context.Context, rows []*ledger.Reservation, conv *codec.Conv) error {
	short := make([]*ledger.Reservation, 0, len(rows))
	var upserts []*ledger.Reservation
	var seen map[string]int
	if len(rows) > 1 {
		seen = make(map[string]int, len(rows))
		for _, r := range rows {
			seen[r.ID]++
		}
	}
	for _, r := range rows {
		if stored, ok := tx.storedReservations[r.ID]; ok && stored == fixedOf(r, conv) && seen[r.ID] <= 1 {
			short = append(short, r)
		} else {
			upserts = append(upserts, r)
		}
	}
	if err := conv.Err(); err != nil {
		return fmt.Errorf("reservation: %w", err)
	}
	more, err := execChunks(ctx, tx, conv, nil, short, wReservationUpdateRows,
		func(args []any, r *ledger.Reservation) []any { return appendReservationUpdateArgs(args, r, conv) },
		func(r *ledger.Reservation) string { return "reservation " + r.ID })
	if err != nil {
		return err
	}
	upserts = append(upserts, more...)
	for _, r := range upserts {
		if err := tx.run(ctx, wReservationPut, func() string { return "reservation " + r.ID }, conv, reservationArgs(r, conv)); err != nil {
			return err
		}
	}
	return nil
}

// reservationUpdateRowsSQL returns the short UPDATE of rows reservations,
// bound as appendReservationUpdateArgs appends them, row after row: for
// one row a plain UPDATE, for more an UPDATE ... FROM a VALUES list, one
// seek by id per row. OR FAIL: a row that breaks a constraint ends the
// statement without undoing its earlier rows, so SQLite keeps no
// statement journal for them (see insertFresh).
func reservationUpdateRowsSQL(rows int) string {
	if rows == 1 {
		return reservationUpdateSQL
	}
	var set []string
	for i, c := range strings.Split(reservationUpdateCols, ", ") {
		set = append(set, fmt.Sprintf("%s = v.column%d", c, i+1))
	}
	n := len(set) + 1
	row := "(" + params(n) + ")"
	return "UPDATE OR FAIL reservations SET " + strings.Join(set, ", ") +
		" FROM (VALUES " + strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ") + ") AS v" +
		fmt.Sprintf(" WHERE reservations.id = v.column%d", n)
}
