package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"path/filepath"

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
//
// The first call of ReservationStream (a full audit) copies the database
// as the read transaction sees it into a file with SQLite's online
// backup (copyForAudit), ends the transaction, and from then on every
// stream reads the copy in a read transaction of its own. An audit is
// paced beside admission for many times its CPU time, and while a read
// transaction is open SQLite cannot reset its WAL past it: the WAL grew
// by everything committed during the audit, and every commit and read
// beside it paid for the longer WAL (docs/PERFORMANCE.md, "Bounded
// history"). Inside the live read a page copy runs 0.045x the
// instructions of a copy of the rows, but 0.88x their CPU with the
// kernel's reads and writes; the audit then reads the rows through SQLite
// from the copy, at its paced share (docs/PERFORMANCE.md, "Audit";
// reserve p99 beside audits improved). The audit is just as consistent:
// the copy is the one transaction's view. A since-checkpoint audit reads
// only the journal since the last checkpoint, which compaction bounds,
// from the transaction itself.
func (s *Store) AuditSnapshot(ctx context.Context, cut bool, f func(*ledger.Snapshot, int64) error) (err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return errClosed
	}
	// A connection of its own, so that the backup can step inside the
	// transaction's read (copyForAudit).
	conn, err := s.readDB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("snapshot: %w", translate(ctx, err))
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
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
	last := snap.LastCheckpoint()
	// read is the transaction the streams read: tx, or the copy's once a
	// full audit has copied.
	read := tx
	var (
		cp       *auditCopy
		copySnap ledger.Snapshot // the account streams over the copy
		// estimated is the last Estimate, for the copy's progress.
		estimated int64
	)
	defer func() {
		if cp != nil {
			cp.close()
		}
	}()
	// copyErr is a failed copy's error, which every stream answers from
	// then on: the ledger reads the journal and the accounts after the
	// reservations, and from the live read they would hold it open (the
	// WAL growing into what space a full disk has left) for an audit that
	// fails anyway.
	var copyErr error
	// copied copies the transaction's view and ends the transaction, once.
	// A read-only store reads in place (OpenReadOnly says why).
	copied := func() error {
		if cp != nil || copyErr != nil || s.readOnly {
			return copyErr
		}
		c, err := copyForAudit(ctx, filepath.Dir(s.path), conn, s.auditCopyPages, func(done, total int) int64 {
			// The copy's progress in the estimate's rows, the unit of
			// store.Pause.
			if estimated > 0 && total > 0 {
				return estimated * int64(done) / int64(total)
			}
			return int64(done)
		})
		if err != nil {
			copyErr = err
			_ = tx.Rollback()
			return err
		}
		cp, read = c, c.tx
		copySnap.Checkpoints = snap.Checkpoints
		streamAccounts(ctx, read, &copySnap)
		// database/sql rolls the transaction back itself when ctx ends:
		// ErrTxDone then is the caller's deadline, not the store's fault.
		return translate(ctx, tx.Rollback())
	}
	// The ledger reads the accounts after the reservations and the
	// journal; once a full audit has copied and ended the transaction,
	// they come from the copy.
	txAccounts, txKeys, txCheckpointAccounts := snap.AccountStream, snap.AccountKeyStream, snap.CheckpointAccountStream
	snap.AccountStream = func(yield func(*ledger.Account) error) error {
		if copyErr != nil {
			return copyErr
		}
		if cp != nil {
			return copySnap.AccountStream(yield)
		}
		return txAccounts(yield)
	}
	snap.AccountKeyStream = func(yield func(*ledger.AccountKey) error) error {
		if copyErr != nil {
			return copyErr
		}
		if cp != nil {
			return copySnap.AccountKeyStream(yield)
		}
		return txKeys(yield)
	}
	if txCheckpointAccounts != nil {
		snap.CheckpointAccountStream = func(yield func(*ledger.CheckpointAccount) error) error {
			if copyErr != nil {
				return copyErr
			}
			if cp != nil {
				return copySnap.CheckpointAccountStream(yield)
			}
			return txCheckpointAccounts(yield)
		}
	}
	snap.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
		if copyErr != nil {
			return nil, copyErr
		}
		return snapshotPoliciesOf(ctx, read, generations)
	}
	snap.ReservationStream = func(yield func(*ledger.Reservation) error) error {
		if err := copied(); err != nil {
			return err
		}
		return auditReservations(ctx, read, yield)
	}
	snap.Estimate = func(reservations bool) (int64, error) {
		n, err := estimateRows(ctx, read, last, reservations)
		if err == nil {
			estimated = n
		}
		return n, err
	}
	snap.JournalStream = func(yield func(int64, *ledger.JournalEntry) error) error {
		if copyErr != nil {
			return copyErr
		}
		return journalSince(ctx, read, last, func(pos int64, batch []ledger.JournalEntry) error {
			for i := range batch {
				if err := yield(pos, &batch[i]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	// A staged cut (ledger.AuditOptions.Stage) ends the read before it
	// writes the checkpoint's rows, so the checkpointer can copy and
	// restart the WAL meanwhile instead of it growing with every row.
	snap.TempDir = filepath.Dir(s.path)
	snap.Release = func() { _ = tx.Rollback() }
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

// CheckpointLast implements store.CheckpointStore.
func (s *Store) CheckpointLast(ctx context.Context) (_ ledger.Checkpoint, _ bool, err error) {
	defer s.readBarrier(ctx, &err)
	if s.closed.Load() {
		return ledger.Checkpoint{}, false, errClosed
	}
	last, err := queryAll(ctx, s.reader("SELECT "+checkpointCols+" FROM checkpoints ORDER BY seq DESC LIMIT 1"), scanCheckpoint, "last checkpoint")
	if err != nil || len(last) == 0 {
		return ledger.Checkpoint{}, false, err
	}
	return last[0], true, nil
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

// estimateExactBatches is how many journal batches estimateRows reads
// the entry counts of all of; past it, it samples estimateSamples of them.
// Reading a batch's count reads its row inside the audit's live read
// (measured only on batches small enough to have no overflow pages). Over 200,000 batches
// of 160 bytes (2 cores, load 5-8, one run of three rounds each): the
// exact count 137-235 ms, the sampled estimate (the journal's bytes and
// 1,024 samples) 83-92 ms, the former 32 samples with the count of
// batches 30-75 ms; the exact count stops where it costs about what the
// sampled one does.
const estimateExactBatches = 50_000

// estimateSamples is how many journal batches estimateRows reads the
// entry counts of when there are more than estimateExactBatches.
const estimateSamples = 1024

// estimateRows estimates the journal entries after checkpoint last, plus
// the accounts and, when asked, the reservations (both counted). The
// entries are counted exactly, from each batch's count (each blob starts
// with it), up to estimateExactBatches batches; past that, they are the
// journal's bytes times the entries per byte of estimateSamples batches,
// one at a pseudo-random place in each of estimateSamples equal stretches
// of their sequence (evenly spaced samples alias with batches that come
// at a steady period, as a worker's pages do). The newest batches alone would not do: a
// prefill's or a burst's batches of hundreds of entries followed by quiet
// ones of a few made a since-checkpoint audit's progress stick at 99%
// from its first rows. Nor did 32 samples: batch sizes are heavy-tailed
// (a worker's page of hundreds of commands among gateways' singles, often
// at a steady period), and a few samples landing on the large ones (or
// none) put the estimate several times off the rows present, which
// showed once retention had removed the reservations, whose count is
// exact (328,443 estimated for far fewer rows; 53,938 for 7,992 in
// TestAuditEstimateTracksRowsPresent before). The accounts, which the
// audit reads after the journal, once left out, kept it at 99% for that
// whole pass (some 24 s over a million accounts).
func estimateRows(ctx context.Context, tx *sql.Tx, last *ledger.Checkpoint, reservations bool) (int64, error) {
	return estimateRowsWith(ctx, tx, last, reservations, estimateExactBatches, estimateSamples)
}

// estimateRowsWith is estimateRows counting exactly up to exactUpTo
// batches and sampling samples of them past that.
func estimateRowsWith(ctx context.Context, tx *sql.Tx, last *ledger.Checkpoint, reservations bool, exactUpTo, samples int64) (int64, error) {
	var after, rows, batches int64
	if last != nil {
		after = last.Through
	} else if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM journal").Scan(&rows); err != nil {
		return 0, translate(ctx, err)
	}
	var lo, hi sql.NullInt64
	if err := tx.QueryRowContext(ctx, "SELECT count(*), min(seq), max(seq) FROM journal_batches WHERE seq > ?", after).Scan(&batches, &lo, &hi); err != nil {
		return 0, translate(ctx, err)
	}
	entryCount := func(head []byte) (int64, bool) {
		if len(head) > 1 {
			if count, k := binary.Uvarint(head[1:]); k > 0 {
				return int64(count), true
			}
		}
		return 0, false
	}
	if batches <= exactUpTo {
		heads, err := tx.QueryContext(ctx, "SELECT substr(entries, 1, 11) FROM journal_batches WHERE seq > ?", after)
		if err != nil {
			return 0, translate(ctx, err)
		}
		var head []byte
		for heads.Next() {
			if err := heads.Scan(&head); err != nil {
				heads.Close()
				return 0, translate(ctx, err)
			}
			if count, ok := entryCount(head); ok {
				rows += count
			}
		}
		if err := heads.Close(); err != nil {
			return 0, translate(ctx, err)
		}
		if err := heads.Err(); err != nil {
			return 0, translate(ctx, err)
		}
	} else {
		// The entries per byte of sampled batches times the journal's
		// bytes: a batch's bytes grow with its entries, so the few
		// batches of hundreds weigh what they hold, where a mean count
		// per batch swung with how many samples landed on them.
		// length() of a blob reads no overflow page.
		var bytes sql.NullInt64
		if err := tx.QueryRowContext(ctx, "SELECT sum(length(entries)) FROM journal_batches WHERE seq > ?", after).Scan(&bytes); err != nil {
			return 0, translate(ctx, err)
		}
		var entries, sampledBytes int64
		n := min(batches, samples)
		span := hi.Int64 - lo.Int64 + 1
		for i := range n {
			// Stretch i is [lo + span*i/n, lo + span*(i+1)/n); the place
			// in it comes from a fixed mix of i (no clock, no rand).
			start, end := lo.Int64+span*i/n, lo.Int64+span*(i+1)/n
			at := start
			if end > start {
				x := uint64(i+1) * 0x9E3779B97F4A7C15
				x ^= x >> 31
				at += int64(x % uint64(end-start))
			}
			var head []byte
			var size int64
			err := tx.QueryRowContext(ctx, "SELECT substr(entries, 1, 11), length(entries) FROM journal_batches WHERE seq >= ? ORDER BY seq LIMIT 1", at).Scan(&head, &size)
			if errors.Is(err, sql.ErrNoRows) {
				continue
			}
			if err != nil {
				return 0, translate(ctx, err)
			}
			if count, ok := entryCount(head); ok {
				entries += count
				sampledBytes += size
			}
		}
		if sampledBytes > 0 {
			rows += int64(float64(bytes.Int64) * float64(entries) / float64(sampledBytes))
		}
	}
	var accounts int64
	if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM accounts").Scan(&accounts); err != nil {
		return 0, translate(ctx, err)
	}
	rows += accounts
	if reservations {
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM reservations").Scan(&n); err != nil {
			return 0, translate(ctx, err)
		}
		rows += n
	}
	return rows, nil
}

// auditReservationsQuery reads, per reservation in id order, what the
// audit needs (ledger.Snapshot.ReservationStream) in three columns: the
// generation, the state, and one packed column: the three amounts (each
// encoding ends itself), then the id, subject, route and region, each
// string but the last followed by a zero byte. The driver makes two or
// three calls into SQLite per column, each behind the connection's mutex,
// and allocates a copy of every text and blob: with the nine columns read
// apiece (1.29x the instructions of this query), those calls and copies
// were most of a full audit's CPU. Each SQL function or operator of the
// packing costs about half a column in the VDBE: prefixing each string
// with its byte length, char(length(CAST(s AS BLOB))), took 1.43x (a
// program reading the rows alone, callgrind, for commit e56bb23). A string that holds a zero byte makes the split ambiguous;
// auditRows then reads that row's strings apart.
const auditReservationsQuery = "SELECT generation, state, " +
	"reserved || actual || overdraft || id || x'00' || subject || x'00' || route || x'00' || region " +
	"FROM reservations ORDER BY id"

// auditKeysQuery reads the strings of the first reservation after an id,
// exactly, for a packed row whose split is ambiguous
// (auditReservationsQuery); auditFirstKeysQuery those of the first one.
const (
	auditKeysQuery      = "SELECT id, subject, route, region FROM reservations WHERE id > ? ORDER BY id LIMIT 1"
	auditFirstKeysQuery = "SELECT id, subject, route, region FROM reservations ORDER BY id LIMIT 1"
)

// auditLens are the byte lengths of the id, subject and route of a packed
// row of auditReservationsQuery (the region is the rest).
type auditLens struct{ id, subject, route int }

// auditRows calls each with every row of auditReservationsQuery read in
// tx, in id order, and the lengths of its strings; packed is reused
// between calls.
func auditRows(ctx context.Context, tx *sql.Tx, each func(generation, state int64, packed []byte, lens auditLens) error) error {
	rows, err := tx.QueryContext(ctx, auditReservationsQuery)
	if err != nil {
		return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
	}
	defer rows.Close()
	var (
		packed            sql.RawBytes
		generation, state any // the driver's int64: no conversion through reflect
		prev              []byte
		first             = true
	)
	for rows.Next() {
		if err := rows.Scan(&generation, &state, &packed); err != nil {
			return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
		}
		g, ok1 := generation.(int64)
		st, ok2 := state.(int64)
		if !ok1 || !ok2 {
			return fmt.Errorf("snapshot reservations: generation %T, state %T after %q", generation, state, prev)
		}
		at, lens, unique, err := splitAuditRow(packed)
		if err != nil {
			return fmt.Errorf("snapshot reservations: the row after %q: %w", prev, err)
		}
		if !unique {
			if lens, err = auditRowKeys(ctx, tx, prev, first, packed[at:]); err != nil {
				return err
			}
		}
		if err := each(g, st, packed, lens); err != nil {
			return err
		}
		prev = append(prev[:0], packed[at:at+lens.id]...)
		first = false
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("snapshot reservations: %w", translate(ctx, err))
	}
	return nil
}

// splitAuditRow finds the strings of a packed row of
// auditReservationsQuery: they start at packed[at], after the amounts;
// unique is false when they hold more zero bytes than the three
// separators (lens is then only where the first three are).
func splitAuditRow(packed []byte) (at int, lens auditLens, unique bool, err error) {
	rest := packed
	for range 3 {
		if _, rest, err = codec.CutAmounts(rest); err != nil {
			return 0, lens, false, fmt.Errorf("reservation amounts: %w", err)
		}
	}
	at = len(packed) - len(rest)
	for _, n := range []*int{&lens.id, &lens.subject, &lens.route} {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return 0, lens, false, fmt.Errorf("a packed row of %d bytes is cut short", len(packed))
		}
		*n, rest = i, rest[i+1:]
	}
	return at, lens, bytes.IndexByte(rest, 0) < 0, nil
}

// auditRowKeys reads, in tx, the strings of the reservation after id prev
// (the first one when first) apart, whose packed strings strs hold a zero
// byte of their own, and returns their lengths. They are the same row's:
// both reads are in one transaction, in id order.
func auditRowKeys(ctx context.Context, tx *sql.Tx, prev []byte, first bool, strs []byte) (auditLens, error) {
	row := tx.QueryRowContext(ctx, auditKeysQuery, string(prev))
	if first {
		row = tx.QueryRowContext(ctx, auditFirstKeysQuery)
	}
	var id, subject, route, region string
	if err := row.Scan(&id, &subject, &route, &region); err != nil {
		return auditLens{}, fmt.Errorf("snapshot reservations: the keys after %q: %w", prev, translate(ctx, err))
	}
	if id+"\x00"+subject+"\x00"+route+"\x00"+region != string(strs) {
		return auditLens{}, fmt.Errorf("snapshot reservations: reservation %q read apart is not its packed row", id)
	}
	return auditLens{id: len(id), subject: len(subject), route: len(route)}, nil
}

// fillAuditRow fills r, the audit's one reused row, from a row of
// auditReservationsQuery and its strings' lengths: only the audit's
// fields (reading the 19 columns of each reservation and allocating a
// row apiece cost the audit of a large store more than everything else
// it does).
func fillAuditRow(r *ledger.Reservation, keys *keyStrings, generation, state int64, packed []byte, lens auditLens) error {
	if err := decodeAuditRow(r, keys, packed, lens); err != nil {
		return err
	}
	var conv codec.Conv
	r.Account.Generation = conv.Uint(generation)
	r.State = conv.State(state)
	if err := conv.Err(); err != nil {
		return fmt.Errorf("reservation %s: %w", r.ID, err)
	}
	return nil
}

// decodeAuditRow fills r's amounts, id and account key from the packed
// column of auditReservationsQuery, whose strings have the lengths lens
// and are followed by zero bytes. The account's strings are kept when
// they are the row before's (most rows name the same account), else taken
// from keys (nil: allocated).
func decodeAuditRow(r *ledger.Reservation, keys *keyStrings, packed []byte, lens auditLens) error {
	strs := packed
	for _, a := range []*ledger.Amounts{&r.Reserved, &r.Actual, &r.Overdraft} {
		var err error
		if *a, strs, err = codec.CutAmounts(strs); err != nil {
			return fmt.Errorf("snapshot reservations: reservation amounts: %w", err)
		}
	}
	if n := len(strs); lens.id < 0 || lens.subject < 0 || lens.route < 0 || lens.id > n || lens.subject > n || lens.route > n {
		return fmt.Errorf("snapshot reservations: string lengths %d, %d, %d", lens.id, lens.subject, lens.route)
	}
	s, r1, r2 := lens.id, lens.id+1+lens.subject, lens.id+lens.subject+lens.route+2
	if r2 >= len(strs) || strs[s] != 0 || strs[r1] != 0 || strs[r2] != 0 {
		return fmt.Errorf("snapshot reservations: a packed row of %d bytes does not hold strings of %d, %d and %d bytes", len(packed), lens.id, lens.subject, lens.route)
	}
	r.ID = string(strs[:s])
	if subject := strs[s+1 : r1]; string(subject) != r.Account.Subject {
		r.Account.Subject = keys.of(subject)
	}
	if route := strs[r1+1 : r2]; string(route) != r.Account.Route {
		r.Account.Route = keys.of(route)
	}
	if region := strs[r2+1:]; string(region) != r.Account.Region {
		r.Account.Region = keys.of(region)
	}
	return nil
}

// keyStringSlots is how many strings a keyStrings keeps.
const keyStringSlots = 512

// keyStrings keeps the account strings of recent reservations, one per
// slot of a hash of their bytes, so that a reservation of an account seen
// a few rows before takes its strings without allocating them (a row's
// strings are compared whole with the slot's).
type keyStrings struct {
	seed  maphash.Seed
	slots [keyStringSlots]string
}

func newKeyStrings() *keyStrings { return &keyStrings{seed: maphash.MakeSeed()} }

// of returns b as a string, the slot's when it holds the same bytes.
func (k *keyStrings) of(b []byte) string {
	if k == nil {
		return string(b)
	}
	slot := &k.slots[maphash.Bytes(k.seed, b)%keyStringSlots]
	if *slot != string(b) {
		*slot = string(b)
	}
	return *slot
}
