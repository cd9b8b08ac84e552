package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// The console's subject index, written behind the commits (schema
// version 12).
//
// reservation_subjects (subject, created_at, id) serves only the console's
// listing of one subject's reservations, and every key in it is derived
// from a row of reservations. A commit therefore does not write it: the
// committed transaction hands its new reservations' keys to pending (in
// memory), and the flusher inserts them in key order, subjectFlushChunk a
// transaction, once pending holds flushCount entries or its oldest entry
// is flushAge old. Over a million subjects a reserve no longer writes a
// random leaf of the index (and the checkpointer no longer copies it);
// the flush writes each leaf once for all the entries that reached it
// meanwhile.
//
// Nothing is lost that cannot be rebuilt: the meta row
// subject_index_through is a journal_batches seq such that every kept
// reservation whose journal names it at or before that batch has its
// entry in the table. A flush takes its snapshot of pending and that seq
// while it holds the writer (so every committed transaction has handed its
// keys over), and writes the seq with its last chunk. Open reads the
// journal batches after it (a process killed before its flush) and
// inserts the entries of the reservations they name that still exist;
// journal compaction keeps those batches (compaction.go). The listing
// reads pending first, then the table, so an acknowledged reservation is
// always in one of them.
//
// Two events leave entries neither pending nor in the table, and set
// catchUp: a COMMIT whose outcome is unknown (its entries may be in the
// file; they are not pending), and pending reaching its cap (4 times the
// flush count) because flushes keep failing (a full disk), when pending
// is dropped so that memory stays bounded. The listing then answers
// store.ErrUnavailable rather than a page that may lack acknowledged
// reservations, and the flusher's next run does under the writer what
// Open does: it inserts the entries of the journal batches after the
// watermark, subjectCatchUpBatches a transaction, moving the watermark
// with each, and clears catchUp with the last. Nothing is lost: the
// journal holds every batch after the watermark until then.

// Defaults of the flusher: at 5,000 reserves/s over ~15,000 leaves of the
// table (a million subjects), 10 s of entries touch each leaf about 3
// times less often than an insert per commit; 100,000 entries (about
// 15 MB of pending keys) make a flush due when reserves come faster, and
// 4 times that (subjectPendingCap) bound the memory when flushes fail.
const (
	DefaultSubjectFlushAge   = 10 * time.Second
	DefaultSubjectFlushCount = 100_000
	// subjectFlushChunk is the most entries one flush transaction
	// inserts: short enough (a few ms) that admission waits for it no
	// longer than for a batch of its own.
	subjectFlushChunk = 512
	// subjectCatchUpBatches is the most journal batches one catch-up
	// transaction reads.
	subjectCatchUpBatches = 256
	// subjectPendingCap times the flush count is the most entries pending
	// holds: beyond it they are dropped for a catch-up from the journal.
	subjectPendingCap = 4
	subjectIndexMeta  = "subject_index_through"
)

// WithSubjectIndexFlush sets when the flusher writes pending subject index
// entries: once the oldest is age old or count are pending (defaults
// DefaultSubjectFlushAge, DefaultSubjectFlushCount).
func WithSubjectIndexFlush(age time.Duration, count int) Option {
	return func(c *config) { c.subjectFlushAge, c.subjectFlushCount = age, count }
}

// subjectKey is one entry of reservation_subjects, as the table stores it.
type subjectKey struct {
	subject string
	created int64
	id      string
}

func compareSubjectKeys(a, b subjectKey) int {
	return cmp.Or(strings.Compare(a.subject, b.subject), cmp.Compare(a.created, b.created), strings.Compare(a.id, b.id))
}

// subjectPending is the entries committed and not yet in the table.
type subjectPending struct {
	mu sync.Mutex
	// bySubject holds each subject's entries in the order they were
	// committed, keyOf each live entry by id (for retention's removal
	// and to tell whether an entry is still pending): an entry of
	// bySubject whose key keyOf no longer holds is dead, and a subject's
	// entries are compacted once half are dead, so that forgetting a
	// flushed chunk costs its own entries, not a scan of a hot subject's.
	// About 110 bytes an entry beside its strings (a map per subject
	// took 340).
	bySubject map[string]*subjectEntries
	keyOf     map[string]subjectKey
	// ticks counts the flusher's ticks, oldestTick the tick at which the
	// oldest pending entry arrived (-1 when none): the store reads no
	// clock (internal/archtest), so an entry's age is in ticks, each
	// tickEvery long, and known to within one.
	ticks, oldestTick int64
	tickEvery         time.Duration
	// catchUp is set when the table and pending may lack entries of
	// committed reservations (a COMMIT whose outcome is unknown, pending
	// dropped at its cap): no flush advances the watermark past them, the
	// listing answers store.ErrUnavailable, and the flusher catches up
	// from the journal (catchUpSubjects), which clears it.
	catchUp atomic.Bool
	// catchUps counts the catch-ups begun (catchUp set from clear): a
	// read that began with catchUp clear and sees the same count after it
	// read raced with no catch-up (complete). lastErr is the last flush or
	// catch-up error, nil once one worked (both for SubjectIndexStatus).
	catchUps atomic.Uint64
	lastErr  atomic.Pointer[string]
	// fault, when set (tests), fails each flush and catch-up transaction
	// with its error.
	fault atomic.Pointer[error]
	// readDone, when set (tests), runs once a listing has read, before
	// complete decides whether its page may lack entries.
	readDone atomic.Pointer[func()]

	age   time.Duration
	count int
	limit int           // the cap: subjectPendingCap * count
	wake  chan struct{} // count reached
	stop  chan struct{}
	done  chan struct{}
}

type pendingEntry struct {
	id      string
	created int64
}

type subjectEntries struct {
	entries []pendingEntry
	dead    int
}

func newSubjectPending(age time.Duration, count int) *subjectPending {
	return &subjectPending{bySubject: map[string]*subjectEntries{}, keyOf: map[string]subjectKey{},
		oldestTick: -1, tickEvery: min(time.Second, max(age/4, time.Millisecond)),
		age: age, count: count, limit: subjectPendingCap * max(count, 1),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// behind records that committed entries may be neither pending nor in the
// table, and wakes the flusher to catch up from the journal.
func (p *subjectPending) behind() {
	if !p.catchUp.Swap(true) {
		p.catchUps.Add(1)
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// subjectRead is the index's state when a read began (begin), for
// complete.
type subjectRead struct {
	behind   bool
	catchUps uint64
}

// begin returns the index's state for complete; a read calls it before
// it reads pending or the table (as a deferred complete's argument).
func (p *subjectPending) begin() subjectRead {
	catchUps := p.catchUps.Load() // before catchUp: a behind between the two sets catchUp
	return subjectRead{behind: p.catchUp.Load(), catchUps: catchUps}
}

// complete replaces a read's nil *err with store.ErrUnavailable when the
// index may have lacked committed reservations while it read: catchUp set
// when the read began (begin), set now, or set and cleared meanwhile. Its
// end alone is not enough: a catch-up that ends during the read inserts
// entries the read's snapshot of the table predates.
func (p *subjectPending) complete(what string, began subjectRead, err *error) {
	if f := p.readDone.Load(); f != nil {
		(*f)()
	}
	if *err == nil && (began.behind || p.catchUp.Load() || p.catchUps.Load() != began.catchUps) {
		*err = fmt.Errorf("%s: the subject index is catching up from the journal (a commit's outcome was unknown, or flushes failed): %w", what, store.ErrUnavailable)
	}
}

// injected returns the fault a test set, if any.
func (p *subjectPending) injected() error {
	if err := p.fault.Load(); err != nil {
		return *err
	}
	return nil
}

// add records keys a transaction committed.
func (p *subjectPending) add(keys []subjectKey) {
	if len(keys) == 0 {
		return
	}
	p.mu.Lock()
	for _, k := range keys {
		if old, ok := p.keyOf[k.id]; ok {
			if old == k {
				continue // written again with the same key
			}
			p.forget(k.id) // written again (a blind write): the new key wins
		}
		se := p.bySubject[k.subject]
		if se == nil {
			se = &subjectEntries{}
			p.bySubject[k.subject] = se
		}
		se.entries = append(se.entries, pendingEntry{k.id, k.created})
		p.keyOf[k.id] = k
	}
	if p.oldestTick < 0 {
		p.oldestTick = p.ticks
	}
	if len(p.keyOf) >= p.limit {
		// Flushes keep failing: drop what is pending (its journal batches
		// are after the watermark) and catch up from the journal.
		p.bySubject, p.keyOf, p.oldestTick = map[string]*subjectEntries{}, map[string]subjectKey{}, -1
		p.mu.Unlock()
		p.behind()
		return
	}
	full := len(p.keyOf) >= p.count
	p.mu.Unlock()
	if full {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// remove forgets the entries of ids (reservations deleted).
func (p *subjectPending) remove(ids []string) {
	if len(ids) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		p.forget(id)
	}
}

// forget drops id's entry; p.mu is held.
func (p *subjectPending) forget(id string) {
	if k, ok := p.keyOf[id]; ok {
		p.drop(k.subject, []subjectKey{k})
	}
}

// drop forgets those of the subject's keys still pending unchanged;
// p.mu is held.
func (p *subjectPending) drop(subject string, keys []subjectKey) {
	se := p.bySubject[subject]
	for _, k := range keys {
		if p.keyOf[k.id] == k {
			delete(p.keyOf, k.id)
			se.dead++
		}
	}
	if se != nil && 2*se.dead >= len(se.entries) {
		kept := se.entries[:0]
		seen := make(map[string]bool, len(se.entries)-se.dead)
		for _, e := range se.entries {
			// A dead entry's key may be live again (flushed, then
			// written again): keep one.
			if p.keyOf[e.id] == (subjectKey{subject, e.created, e.id}) && !seen[e.id] {
				seen[e.id] = true
				kept = append(kept, e)
			}
		}
		clear(se.entries[len(kept):]) // keep no id alive
		se.entries, se.dead = kept, 0
		if len(kept) == 0 {
			delete(p.bySubject, subject)
		}
	}
	if len(p.keyOf) == 0 {
		p.oldestTick = -1
	}
}

// flushed forgets the keys a flush wrote, unless an entry changed since.
func (p *subjectPending) flushed(keys []subjectKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// keys are in key order: each subject's are one run.
	for from := 0; from < len(keys); {
		to := from + 1
		for to < len(keys) && keys[to].subject == keys[from].subject {
			to++
		}
		p.drop(keys[from].subject, keys[from:to])
		from = to
	}
}

// current returns those of keys still pending unchanged (retention may
// have removed some since the flush took them).
func (p *subjectPending) current(keys []subjectKey) []subjectKey {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := keys[:0:0]
	for _, k := range keys {
		if p.keyOf[k.id] == k {
			out = append(out, k)
		}
	}
	return out
}

// all returns every pending entry in key order.
func (p *subjectPending) all() []subjectKey {
	p.mu.Lock()
	out := make([]subjectKey, 0, len(p.keyOf))
	for _, k := range p.keyOf {
		out = append(out, k)
	}
	p.mu.Unlock()
	slices.SortFunc(out, compareSubjectKeys)
	return out
}

// of returns subject's pending entries before the cursor (all when
// before is nil), newest first.
func (p *subjectPending) of(subject string, before *subjectKey) []subjectKey {
	p.mu.Lock()
	var out []subjectKey
	if se := p.bySubject[subject]; se != nil {
		out = make([]subjectKey, 0, len(se.entries)-se.dead)
		seen := make(map[string]bool, len(se.entries)-se.dead)
		for _, e := range se.entries {
			k := subjectKey{subject, e.created, e.id}
			if p.keyOf[e.id] == k && !seen[e.id] && (before == nil || compareSubjectKeys(k, *before) < 0) {
				seen[e.id] = true
				out = append(out, k)
			}
		}
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b subjectKey) int { return compareSubjectKeys(b, a) })
	return out
}

// due counts a tick of the flusher when tick is set, and reports whether
// the flusher should write pending now.
func (p *subjectPending) due(tick bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tick {
		p.ticks++
	}
	if p.catchUp.Load() {
		return true
	}
	return len(p.keyOf) > 0 && (len(p.keyOf) >= p.count ||
		time.Duration(p.ticks-p.oldestTick)*p.tickEvery >= p.age)
}

func (p *subjectPending) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keyOf)
}

// noteSubjects records the subject index keys of the reservation rows c
// inserts, or may insert (a write of a row this transaction did not read
// as it is stored is an upsert), for pending once the transaction commits.
func (tx *Tx) noteSubjects(reservations []ledger.Reservation, isNew map[string]bool) {
	for i := range reservations {
		r := &reservations[i]
		var c codec.Conv
		if !isNew[r.ID] {
			if stored, ok := tx.storedReservations[r.ID]; ok && stored == fixedOf(r, &c) {
				continue
			}
		}
		created := c.Nanos(r.CreatedAt)
		if c.Err() != nil {
			continue // Write refused it
		}
		tx.subjectKeys = append(tx.subjectKeys, subjectKey{r.Account.Subject, created, r.ID})
	}
}

// noteSubjectsRemoved records the ids of the reservation rows a Write
// removed, whose entries Commit takes out of pending before it adds the
// keys noteSubjects recorded. A key an earlier Write of this transaction
// recorded for one of them is dropped, so that what Commit hands over
// follows the order of the writes: a row inserted and later removed has
// no entry, a row removed and inserted again (a reuse of a forgotten id
// in one batch) has its new one.
func (tx *Tx) noteSubjectsRemoved(ids []string) {
	if len(ids) == 0 {
		return
	}
	if len(tx.subjectKeys) > 0 {
		gone := make(map[string]bool, len(ids))
		for _, id := range ids {
			gone[id] = true
		}
		tx.subjectKeys = slices.DeleteFunc(tx.subjectKeys, func(k subjectKey) bool { return gone[k.id] })
	}
	tx.subjectsRemoved = append(tx.subjectsRemoved, ids...)
}

// subjectDeleteSQL deletes the index entries of n reservations, read from
// their rows (before retention deletes them).
func subjectDeleteSQL(n int) string {
	return "DELETE FROM reservation_subjects WHERE (subject, created_at, id) IN" +
		" (SELECT subject, created_at, id FROM reservations WHERE id IN (" + params(n) + "))"
}

// SubjectIndexStatus implements store.SubjectIndexReporter: whether the
// subject index catches up from the journal (its listings answer
// store.ErrUnavailable meanwhile), how many catch-ups began since Open,
// how many entries wait for a flush, and the last flush's error.
func (s *Store) SubjectIndexStatus() store.SubjectIndexStatus {
	p := s.subjects
	st := store.SubjectIndexStatus{CatchingUp: p.catchUp.Load(), CatchUps: p.catchUps.Load(), Pending: p.len()}
	if e := p.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// runSubjectFlusher writes pending entries whenever they are due, until
// Close.
func (s *Store) runSubjectFlusher() {
	p := s.subjects
	defer close(p.done)
	tick := time.NewTicker(p.tickEvery)
	defer tick.Stop()
	for {
		ticked := false
		select {
		case <-p.stop:
			return
		case <-tick.C:
			ticked = true
		case <-p.wake:
		}
		if !p.due(ticked) {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-p.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		_ = s.flushSubjects(ctx) // what failed stays pending: the next tick retries
		cancel()
	}
}

// flushSubjects inserts every entry pending when it starts into
// reservation_subjects, subjectFlushChunk a transaction (admission's
// batches run between them), and with the last chunk records the journal
// position the table is now complete to. It returns the first error; the
// entries not written stay pending.
func (s *Store) flushSubjects(ctx context.Context) (err error) {
	p := s.subjects
	defer func() {
		if err != nil {
			msg := err.Error()
			p.lastErr.Store(&msg)
		} else {
			p.lastErr.Store(nil)
		}
	}()
	if p.catchUp.Load() {
		if err := s.catchUpSubjects(ctx); err != nil {
			return err
		}
	}
	var (
		keys    []subjectKey
		through int64
		started bool
	)
	for !started || len(keys) > 0 {
		err := s.withWriter(ctx, func(w *writer) error {
			var chunk []subjectKey
			err := s.inWriteTx(ctx, w, "flush subject index", func(tx *writeTx) error {
				if !started {
					// Holding the writer: every committed transaction has
					// handed its keys to pending.
					keys = p.all()
					if _, err := tx.queryRow("SELECT COALESCE(MAX(seq), 0) FROM journal_batches", nil,
						func(sc scanner) error { return sc.Scan(&through) }); err != nil {
						return err
					}
					started = true
				}
				if err := p.injected(); err != nil {
					return err
				}
				chunk = p.current(keys[:min(len(keys), subjectFlushChunk)])
				keys = keys[min(len(keys), subjectFlushChunk):]
				err := inChunks(len(chunk), func(from, n int) error {
					args := make([]any, 0, 3*n)
					for _, k := range chunk[from : from+n] {
						args = append(args, k.subject, k.created, k.id)
					}
					_, err := tx.exec(subjectInsertSQL(n), args...)
					return err
				})
				if err != nil {
					return err
				}
				if len(keys) == 0 && !p.catchUp.Load() {
					_, err := tx.exec("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", subjectIndexMeta, through)
					return err
				}
				return nil
			})
			if err == nil {
				p.flushed(chunk)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// catchUpSubjects inserts the entries of the reservations named by the
// journal batches after subject_index_through that still exist,
// subjectCatchUpBatches a transaction, each moving the watermark to its
// last batch, and clears catchUp with the transaction that reads the last
// batch (holding the writer: no commit can fall behind meanwhile). What
// Open's rebuildSubjectIndex does, in bounded transactions on the writer.
func (s *Store) catchUpSubjects(ctx context.Context) error {
	p := s.subjects
	for done := false; !done; {
		err := s.withWriter(ctx, func(w *writer) error {
			err := s.inWriteTx(ctx, w, "subject index catch-up", func(tx *writeTx) error {
				if err := p.injected(); err != nil {
					return err
				}
				var through int64
				if _, err := tx.queryRow("SELECT value FROM meta WHERE name = ?", []any{subjectIndexMeta},
					func(sc scanner) error { return sc.Scan(&through) }); err != nil {
					return err
				}
				ids := map[string]bool{}
				last, read := through, 0
				var batch []ledger.JournalEntry
				err := tx.query("SELECT seq, entries FROM journal_batches WHERE seq > ? ORDER BY seq LIMIT ?",
					[]any{through, subjectCatchUpBatches}, func(sc scanner) error {
						var entries []byte
						if err := sc.Scan(&last, &entries); err != nil {
							return err
						}
						read++
						var err error
						if batch, err = decodeJournalBatch(batch[:0], entries); err != nil {
							return fmt.Errorf("journal batch %d: %w", last, err)
						}
						for i := range batch {
							if id := batch[i].ReservationID; id != "" {
								ids[id] = true
							}
						}
						return nil
					})
				if err != nil {
					return err
				}
				sorted := slices.Sorted(maps.Keys(ids))
				err = inChunks(len(sorted), func(from, n int) error {
					args := make([]any, n)
					for i, id := range sorted[from : from+n] {
						args[i] = id
					}
					_, err := tx.exec("INSERT OR IGNORE INTO reservation_subjects (subject, created_at, id)"+
						" SELECT subject, created_at, id FROM reservations WHERE id IN ("+params(n)+")", args...)
					return err
				})
				if err != nil {
					return err
				}
				done = read < subjectCatchUpBatches
				_, err = tx.exec("UPDATE meta SET value = ? WHERE name = ?", last, subjectIndexMeta)
				return err
			})
			if err == nil && done {
				p.catchUp.Store(false) // still holding the writer
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func subjectInsertSQL(n int) string {
	return "INSERT OR IGNORE INTO reservation_subjects (subject, created_at, id) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", n), ", ")
}

// rebuildSubjectIndex inserts the entries of the reservations named by the
// journal batches after subject_index_through (those a killed process had
// pending) and moves it to the last batch, in one transaction on db.
func rebuildSubjectIndex(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("rebuild subject index: %w", translate(ctx, err))
	}
	defer tx.Rollback()
	var through, last int64
	if err := tx.QueryRowContext(ctx, "SELECT value FROM meta WHERE name = ?", subjectIndexMeta).Scan(&through); err != nil {
		return fmt.Errorf("rebuild subject index: %w", translate(ctx, err))
	}
	if err := tx.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM journal_batches").Scan(&last); err != nil {
		return fmt.Errorf("rebuild subject index: %w", translate(ctx, err))
	}
	if last <= through {
		return nil
	}
	ids := map[string]bool{}
	err = journalSince(ctx, tx, &ledger.Checkpoint{Through: through}, func(_ int64, batch []ledger.JournalEntry) error {
		for i := range batch {
			if id := batch[i].ReservationID; id != "" {
				ids[id] = true
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild subject index: %w", err)
	}
	sorted := slices.Sorted(maps.Keys(ids))
	err = inChunks(len(sorted), func(from, n int) error {
		args := make([]any, n)
		for i, id := range sorted[from : from+n] {
			args[i] = id
		}
		_, err := tx.ExecContext(ctx, "INSERT OR IGNORE INTO reservation_subjects (subject, created_at, id)"+
			" SELECT subject, created_at, id FROM reservations WHERE id IN ("+params(n)+")", args...)
		return err
	})
	if err == nil {
		_, err = tx.ExecContext(ctx, "UPDATE meta SET value = ? WHERE name = ?", last, subjectIndexMeta)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return fmt.Errorf("rebuild subject index: %w", translate(ctx, err))
	}
	return nil
}
