package sqlite

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// auditSpill is a full audit's copy of what its read transaction streams:
// the reservations (as auditReservationsQuery reads them) and the journal
// since the last checkpoint (the stored batches, decoded when read back),
// in a temporary file next to the database, so that the transaction ends
// as soon as they are copied (AuditSnapshot). The file is unlinked as
// soon as it is created where the system allows it (a crash leaves
// nothing behind), else removed at close. It takes about the size of the
// packed columns: some 100 bytes a reservation.
//
// Layout: the reservations in [0, reservationsEnd), each as a uvarint
// length and that many bytes: varint generation, varint state, the
// uvarint lengths of its id, subject and route (auditLens) and the packed
// column (read from memory, not a byte at a time); then
// the journal batches up to journalEnd, each as uvarint seq, uvarint
// length and the stored batch; then the accounts up to accountsEnd and
// the last checkpoint's accounts to the end, in key order, each row as
// its columns (spillRow), so that the ledger, which reads the accounts
// after the journal, reads them from the same transaction.
type auditSpill struct {
	f *os.File
	// path is the file to remove at close ("" once unlinked).
	path                                     string
	reservationsEnd, journalEnd, accountsEnd int64
	size                                     int64
	// legacy holds the rows of the journal table (schema versions 1 and
	// 2) when there is no checkpoint: position 0, before every batch.
	legacy                                  []ledger.JournalEntry
	reservationCount, entries, accountCount int64
}

// spillBuffer is the spill's read and write buffer.
const spillBuffer = 64 << 10

// spillCheckRows: the spill offers to pause (store.Pause) every this
// many rows.
const spillCheckRows = 256

// newAuditSpill copies tx's reservations, its journal after checkpoint
// last, its accounts and last's accounts into a new spill file in dir.
func newAuditSpill(ctx context.Context, dir string, tx *sql.Tx, last *ledger.Checkpoint) (_ *auditSpill, err error) {
	f, err := os.CreateTemp(dir, ".capledger-audit-*")
	if err != nil {
		return nil, fmt.Errorf("audit spill: %w", err)
	}
	// A local, not the named result: every failure returns nil, and the
	// deferred close must still close the file.
	sp := &auditSpill{f: f}
	if os.Remove(f.Name()) != nil {
		sp.path = f.Name()
	}
	defer func() {
		if err != nil {
			sp.close()
		}
	}()
	w := bufio.NewWriterSize(f, spillBuffer)
	var head [3 * binary.MaxVarintLen64]byte
	// The copy offers the caller's pacing a pause every spillCheckRows
	// rows (store.WithPause). The read transaction stays open across
	// whatever the caller does there, and the WAL grows by everything
	// committed meanwhile: the engine only counts its pauses here and
	// takes them once the transaction has ended (engine.AuditWith).
	var copied int
	record := func(b []byte, body []byte) error {
		if copied++; copied%spillCheckRows == 0 {
			store.Pause(ctx, sp.reservationCount+sp.entries+sp.accountCount)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		_, err := w.Write(body)
		sp.size += int64(len(b) + len(body))
		return err
	}
	var rec []byte
	err = auditRows(ctx, tx, func(generation, state int64, packed []byte, lens auditLens) error {
		sp.reservationCount++
		rec = appendReservationRecord(rec[:0], generation, state, lens, packed)
		return record(rec, nil)
	})
	if err != nil {
		return nil, fmt.Errorf("audit spill: %w", err)
	}
	sp.reservationsEnd = sp.size
	var after int64
	if last != nil {
		after = last.Through
	} else if sp.legacy, err = queryAll(ctx, txQuery{tx, "SELECT " + journalCols + " FROM journal ORDER BY seq"}, scanJournal, "snapshot journal"); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, "SELECT seq, entries FROM journal_batches WHERE seq > ? ORDER BY seq", after)
	if err != nil {
		return nil, fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
	}
	defer rows.Close()
	for rows.Next() {
		var (
			seq     int64
			entries sql.RawBytes
		)
		if err := rows.Scan(&seq, &entries); err != nil {
			return nil, fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
		}
		if len(entries) > 1 { // each batch starts with its tag and entry count
			if n, k := binary.Uvarint(entries[1:]); k > 0 {
				sp.entries += int64(n)
			}
		}
		b := binary.AppendUvarint(head[:0], uint64(seq))
		b = binary.AppendUvarint(b, uint64(len(entries)))
		if err := record(b, entries); err != nil {
			return nil, fmt.Errorf("audit spill: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("snapshot journal batches: %w", translate(ctx, err))
	}
	sp.journalEnd = sp.size
	var row []byte
	var counted *int64 // counts the rows copyRows copies, when set
	copyRows := func(q string, args []any, columns int, what string) error {
		return pagedByKey(ctx, tx, q, args, scanSpillRow(columns), spillRowKey, what, func(r *spillRow) error {
			if counted != nil {
				*counted++
			}
			row = r.append(row[:0])
			b := binary.AppendUvarint(head[:0], uint64(len(row)))
			return record(b, row)
		})
	}
	counted = &sp.accountCount
	if err := copyRows(accountsByKey, nil, accountColumns, "audit spill accounts"); err != nil {
		return nil, err
	}
	counted = nil
	sp.accountsEnd = sp.size
	if last != nil {
		if err := copyRows(checkpointAccountsByKey, []any{last.Seq}, checkpointAccountColumns, "audit spill checkpoint accounts"); err != nil {
			return nil, err
		}
	}
	if err := w.Flush(); err != nil {
		return nil, fmt.Errorf("audit spill: %w", err)
	}
	return sp, nil
}

// reservations calls yield with every spilled reservation, in id order,
// through one reused row.
func (sp *auditSpill) reservations(ctx context.Context, yield func(*ledger.Reservation) error) error {
	r := bufio.NewReaderSize(io.NewSectionReader(sp.f, 0, sp.reservationsEnd), spillBuffer)
	var (
		row  ledger.Reservation
		rec  []byte
		keys = newKeyStrings()
	)
	for i := int64(0); i < sp.reservationCount; i++ {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		var err error
		if rec, err = readSpilled(r, rec); err != nil {
			return err
		}
		generation, state, lens, packed, err := decodeReservationRecord(rec)
		if err != nil {
			return err
		}
		if err := fillAuditRow(&row, keys, generation, state, packed, lens); err != nil {
			return err
		}
		if err := yield(&row); err != nil {
			return err
		}
	}
	return nil
}

// appendReservationRecord appends a reservation's spill record: a uvarint
// length and that many bytes, varint generation, varint state, the uvarint
// lengths of its strings and the packed row.
func appendReservationRecord(dst []byte, generation, state int64, lens auditLens, packed []byte) []byte {
	var f [5 * binary.MaxVarintLen64]byte
	b := binary.AppendVarint(f[:0], generation)
	b = binary.AppendVarint(b, state)
	b = binary.AppendUvarint(b, uint64(lens.id))
	b = binary.AppendUvarint(b, uint64(lens.subject))
	b = binary.AppendUvarint(b, uint64(lens.route))
	dst = binary.AppendUvarint(dst, uint64(len(b)+len(packed)))
	return append(append(dst, b...), packed...)
}

// decodeReservationRecord reads back the body of a record of
// appendReservationRecord (after its length); packed shares rec.
func decodeReservationRecord(rec []byte) (generation, state int64, lens auditLens, packed []byte, err error) {
	var fields [5]uint64
	at := 0
	for i := range fields {
		k := 0
		if i < 2 {
			var v int64
			v, k = binary.Varint(rec[at:])
			fields[i] = uint64(v)
		} else {
			fields[i], k = binary.Uvarint(rec[at:])
		}
		if k <= 0 {
			return 0, 0, lens, nil, fmt.Errorf("audit spill: a reservation's record of %d bytes is cut short", len(rec))
		}
		at += k
	}
	packed = rec[at:]
	n := uint64(len(packed))
	if fields[2] > n || fields[3] > n || fields[4] > n {
		return 0, 0, lens, nil, fmt.Errorf("audit spill: strings of %d, %d and %d bytes in a row of %d", fields[2], fields[3], fields[4], n)
	}
	return int64(fields[0]), int64(fields[1]), auditLens{int(fields[2]), int(fields[3]), int(fields[4])}, packed, nil
}

// journal calls each with the spilled journal, a batch at a time with its
// position; the slice is reused between calls.
func (sp *auditSpill) journal(ctx context.Context, each func(pos int64, batch []ledger.JournalEntry) error) error {
	if len(sp.legacy) > 0 {
		if err := each(0, sp.legacy); err != nil {
			return err
		}
	}
	r := bufio.NewReaderSize(io.NewSectionReader(sp.f, sp.reservationsEnd, sp.journalEnd-sp.reservationsEnd), spillBuffer)
	var (
		batch []ledger.JournalEntry
		blob  []byte
	)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		seq, err := binary.ReadUvarint(r)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return spillErr(err)
		}
		if blob, err = readSpilled(r, blob); err != nil {
			return err
		}
		if batch, err = decodeJournalBatch(batch[:0], blob); err != nil {
			return fmt.Errorf("journal batch %d: %w", seq, err)
		}
		if err := each(int64(seq), batch); err != nil {
			return err
		}
	}
}

// accounts calls yield with every spilled account, in key order.
func (sp *auditSpill) accounts(ctx context.Context, yield func(*ledger.Account) error) error {
	return spilledRows(ctx, sp, sp.journalEnd, sp.accountsEnd, scanAccount, yield)
}

// checkpointAccounts calls yield with every spilled account of the last
// checkpoint, in key order.
func (sp *auditSpill) checkpointAccounts(ctx context.Context, yield func(*ledger.CheckpointAccount) error) error {
	return spilledRows(ctx, sp, sp.accountsEnd, sp.size, scanCheckpointAccount, yield)
}

// spilledRows calls yield with each row spilled in [from, to), scanned
// by scan as if it came from the transaction.
func spilledRows[T any](ctx context.Context, sp *auditSpill, from, to int64, scan func(scanner) (T, error), yield func(*T) error) error {
	r := bufio.NewReaderSize(io.NewSectionReader(sp.f, from, to-from), spillBuffer)
	var (
		blob []byte
		row  = spilledRow{keys: newKeyStrings()}
	)
	for n := 0; ; n++ {
		if n%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if _, err := r.Peek(1); errors.Is(err, io.EOF) {
			return nil
		}
		var err error
		if blob, err = readSpilled(r, blob); err != nil {
			return err
		}
		if err := row.decode(blob); err != nil {
			return err
		}
		v, err := scan(&row)
		if err != nil {
			return fmt.Errorf("audit spill: %w", err)
		}
		if err := yield(&v); err != nil {
			return err
		}
	}
}

// estimate is Snapshot.Estimate once spilled: exact counts.
func (sp *auditSpill) estimate(reservations bool) int64 {
	n := sp.entries + int64(len(sp.legacy)) + sp.accountCount
	if reservations {
		n += sp.reservationCount
	}
	return n
}

func (sp *auditSpill) close() {
	sp.f.Close()
	if sp.path != "" {
		os.Remove(sp.path)
	}
}

// readSpilled reads a uvarint length and that many bytes into buf.
func readSpilled(r *bufio.Reader, buf []byte) ([]byte, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return buf, spillErr(err)
	}
	buf = slices.Grow(buf[:0], int(n))[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return buf, spillErr(err)
	}
	return buf, nil
}

func spillErr(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("audit spill: %w", err)
}

// The columns of accountCols and checkpointAccountCols.
const (
	accountColumns           = 11
	checkpointAccountColumns = 7
)

// spillRow is one row of the accounts or of checkpoint_accounts as the
// driver gave it (int64, string, []byte or nil per column), so that the
// spill can hand it to the very scan function that reads the table.
type spillRow struct{ values []any }

// Tags of a spilled column's type.
const (
	spillNull byte = iota
	spillInt
	spillText
	spillBlob
)

// scanSpillRow returns a scan function that copies a row of the given
// number of columns.
func scanSpillRow(columns int) func(scanner) (spillRow, error) {
	dest := make([]any, columns) // reused: only the values stay with the row
	return func(sc scanner) (spillRow, error) {
		row := spillRow{values: make([]any, columns)}
		for i := range dest {
			dest[i] = &row.values[i]
		}
		return row, sc.Scan(dest...)
	}
}

// spillRowKey is the account key of a row whose first four columns are
// subject, route, region and generation, as in both tables.
func spillRowKey(r *spillRow) ledger.AccountKey {
	var k ledger.AccountKey
	k.Subject, _ = r.values[0].(string)
	k.Route, _ = r.values[1].(string)
	k.Region, _ = r.values[2].(string)
	if g, ok := r.values[3].(int64); ok {
		k.Generation = uint64(g)
	}
	return k
}

// append encodes r: per column its tag, then a varint or a uvarint length
// and the bytes.
func (r *spillRow) append(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(r.values)))
	for _, v := range r.values {
		switch v := v.(type) {
		case nil:
			dst = append(dst, spillNull)
		case int64:
			dst = binary.AppendVarint(append(dst, spillInt), v)
		case string:
			dst = append(binary.AppendUvarint(append(dst, spillText), uint64(len(v))), v...)
		case []byte:
			dst = append(binary.AppendUvarint(append(dst, spillBlob), uint64(len(v))), v...)
		default:
			// The accounts' and checkpoints' columns are integers, text
			// and blobs; anything else is a schema this code does not know.
			panic(fmt.Sprintf("audit spill: column of type %T", v))
		}
	}
	return dst
}

var errMalformedRow = errors.New("audit spill: malformed row")

// spilledRow is a row of spillRow read back from the spill: per column
// its tag and its integer or its bytes, which share the buffer it was
// decoded from. Reading it back boxed each value into an interface and
// copied each blob, most of what an account cost a full audit.
type spilledRow struct {
	tags  []byte
	ints  []int64
	bytes [][]byte
	// keys, when set, gives the text columns' strings (most accounts
	// share their route and region with the row before).
	keys *keyStrings
}

// decode reads r back from src (an encoding of spillRow.append), reusing
// r's slices; r's bytes share src's memory.
func (r *spilledRow) decode(src []byte) error {
	bad := errMalformedRow
	n, k := binary.Uvarint(src)
	if k <= 0 || n > 64 {
		return bad
	}
	src = src[k:]
	r.tags = slices.Grow(r.tags[:0], int(n))[:n]
	r.ints = slices.Grow(r.ints[:0], int(n))[:n]
	r.bytes = slices.Grow(r.bytes[:0], int(n))[:n]
	for i := range r.tags {
		if len(src) == 0 {
			return bad
		}
		tag := src[0]
		src = src[1:]
		r.tags[i], r.ints[i], r.bytes[i] = tag, 0, nil
		switch tag {
		case spillNull:
		case spillInt:
			v, k := binary.Varint(src)
			if k <= 0 {
				return bad
			}
			r.ints[i], src = v, src[k:]
		case spillText, spillBlob:
			l, k := binary.Uvarint(src)
			if k <= 0 || uint64(len(src)-k) < l {
				return bad
			}
			r.bytes[i] = src[k : k+int(l) : k+int(l)]
			src = src[k+int(l):]
		default:
			return bad
		}
	}
	return nil
}

// Scan implements scanner over the row's values, for the column types of
// scanAccount and scanCheckpointAccount. A []byte destination shares the
// spill's buffer until the next row is decoded: those functions decode
// their blobs at once.
func (r *spilledRow) Scan(dest ...any) error {
	if len(dest) != len(r.tags) {
		return fmt.Errorf("audit spill: %d columns, scanned into %d", len(r.tags), len(dest))
	}
	for i, d := range dest {
		tag := r.tags[i]
		ok := true
		switch d := d.(type) {
		case *string:
			ok = tag == spillText || tag == spillBlob
			*d = r.keys.of(r.bytes[i])
		case *int64:
			ok = tag == spillInt
			*d = r.ints[i]
		case *[]byte:
			ok = tag == spillBlob || tag == spillNull
			*d = r.bytes[i]
		default:
			ok = false
		}
		if !ok {
			return fmt.Errorf("audit spill: column %d of tag %d, scanned into %T", i, tag, d)
		}
	}
	return nil
}
