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
// Layout: the reservations in [0, reservationsEnd), each as varint
// generation, varint state, uvarint length and the packed column; then
// the journal batches to the end, each as uvarint seq, uvarint length and
// the stored batch.
type auditSpill struct {
	f *os.File
	// path is the file to remove at close ("" once unlinked).
	path            string
	reservationsEnd int64
	size            int64
	// legacy holds the rows of the journal table (schema versions 1 and
	// 2) when there is no checkpoint: position 0, before every batch.
	legacy                    []ledger.JournalEntry
	reservationCount, entries int64
}

// spillBuffer is the spill's read and write buffer.
const spillBuffer = 64 << 10

// newAuditSpill copies tx's reservations and its journal after checkpoint
// last into a new spill file in dir.
func newAuditSpill(ctx context.Context, dir string, tx *sql.Tx, last *ledger.Checkpoint) (sp *auditSpill, err error) {
	f, err := os.CreateTemp(dir, ".capledger-audit-*")
	if err != nil {
		return nil, fmt.Errorf("audit spill: %w", err)
	}
	sp = &auditSpill{f: f}
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
	record := func(b []byte, body []byte) error {
		if _, err := w.Write(b); err != nil {
			return err
		}
		_, err := w.Write(body)
		sp.size += int64(len(b) + len(body))
		return err
	}
	err = auditRows(ctx, tx, func(generation, state int64, packed []byte) error {
		sp.reservationCount++
		b := binary.AppendVarint(head[:0], generation)
		b = binary.AppendVarint(b, state)
		b = binary.AppendUvarint(b, uint64(len(packed)))
		return record(b, packed)
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
		row    ledger.Reservation
		packed []byte
	)
	for i := int64(0); i < sp.reservationCount; i++ {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		generation, err := binary.ReadVarint(r)
		if err != nil {
			return spillErr(err)
		}
		state, err := binary.ReadVarint(r)
		if err != nil {
			return spillErr(err)
		}
		if packed, err = readSpilled(r, packed); err != nil {
			return err
		}
		if err := fillAuditRow(&row, generation, state, packed); err != nil {
			return err
		}
		if err := yield(&row); err != nil {
			return err
		}
	}
	return nil
}

// journal calls each with the spilled journal, a batch at a time with its
// position; the slice is reused between calls.
func (sp *auditSpill) journal(ctx context.Context, each func(pos int64, batch []ledger.JournalEntry) error) error {
	if len(sp.legacy) > 0 {
		if err := each(0, sp.legacy); err != nil {
			return err
		}
	}
	r := bufio.NewReaderSize(io.NewSectionReader(sp.f, sp.reservationsEnd, sp.size-sp.reservationsEnd), spillBuffer)
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

// estimate is Snapshot.Estimate once spilled: exact counts.
func (sp *auditSpill) estimate(reservations bool) int64 {
	n := sp.entries + int64(len(sp.legacy))
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
