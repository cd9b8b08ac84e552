package sqlite

// EXPERIMENT (branch sqlmem, issue 15): account rows written behind.
//
// A commit does not update the rows of the accounts it wrote: it appends
// them, packed (accountCodec), as one row of account_log, and after the
// COMMIT they wait in memory (acctPending.dirty), which the commit path
// reads before the row cache and the file. The flusher writes them to
// accounts in key order, acctFlushChunk a transaction, once acctFlushCount
// are dirty or the oldest is acctFlushAge old, and with its last chunk
// deletes the log rows that the flushed set covers. Open reads the log
// back into dirty (a process killed before its flush loses nothing).
//
// Readers outside the commit path: Store.AccountGet reads through dirty;
// AuditSnapshot and Snapshot flush everything first, holding the writer
// until their read transaction has its snapshot. The other readers
// (AccountList, AccountsOfSubjects, AccountsInDebt, AccountsByEpoch,
// compaction) are NOT covered: this is a measurement, not a finished
// change (docs/PERFORMANCE.md, "Tried and not kept").

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/codec"
)

const (
	acctFlushCount = 100_000
	acctFlushAge   = 30 * time.Second
	acctFlushChunk = 2048
)

// acctPending is the accounts committed and not yet in their rows.
type acctPending struct {
	mu sync.Mutex
	// dirty holds the packed row of every account written since the last
	// freeze; frozen the set being flushed (nil when none), which covers
	// the log rows up to cut.
	dirty, frozen map[ledger.AccountKey]string
	cut           int64
	// lastSeq is the last account_log seq a commit used (the writer's).
	lastSeq int64
	// reload: a COMMIT's outcome was unknown; read the log again.
	reload bool
	// ticks counts the flusher's seconds, oldestTick the tick at which
	// dirty got its oldest entry (-1: empty); the store reads no clock.
	ticks, oldestTick int64
	wake              chan struct{}
	stop              chan struct{}
	done              chan struct{}
}

func newAcctPending() *acctPending {
	return &acctPending{dirty: map[ledger.AccountKey]string{}, oldestTick: -1, wake: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// get returns the account's newest committed value when it waits for a
// flush.
func (p *acctPending) get(key ledger.AccountKey) (*ledger.Account, bool) {
	p.mu.Lock()
	b, ok := p.dirty[key]
	if !ok {
		b, ok = p.frozen[key]
	}
	p.mu.Unlock()
	if !ok {
		return nil, false
	}
	a, err := accountCodec.decodeRow(b, key)
	if err != nil {
		panic(fmt.Sprintf("account log: %v", err))
	}
	return a, true
}

// appendAccountLog appends one account to a log blob: the packed key and
// row, length-prefixed.
func appendAccountLog(dst []byte, a *ledger.Account) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = appendAccountKey(dst, a.Key)
	keyLen := len(dst) - start - 4
	dst = accountCodec.appendRow(dst, a)
	binary.LittleEndian.PutUint16(dst[start:], uint16(keyLen))
	binary.LittleEndian.PutUint16(dst[start+2:], uint16(len(dst)-start-4-keyLen))
	return dst
}

// decodeAccountLog calls f with each account of a log blob, its key and
// packed row.
func decodeAccountLog(b []byte, f func(key ledger.AccountKey, row string)) error {
	for len(b) > 0 {
		if len(b) < 4 {
			return errors.New("account log: short")
		}
		kl, rl := int(binary.LittleEndian.Uint16(b)), int(binary.LittleEndian.Uint16(b[2:]))
		b = b[4:]
		if len(b) < kl+rl {
			return errors.New("account log: short")
		}
		r := packedReader{b: string(b[:kl])}
		key := ledger.AccountKey{Subject: r.str(), Route: r.str(), Region: r.str()}
		key.Generation = r.uvarint()
		if r.err != nil {
			return r.err
		}
		f(key, string(b[kl:kl+rl]))
		b = b[kl+rl:]
	}
	return nil
}

func (r *packedReader) str() string {
	n := int(r.uvarint())
	if n > len(r.b) {
		r.err = errPackedShort
		return ""
	}
	s := r.b[:n]
	r.b = r.b[n:]
	return s
}

// logAccounts appends the accounts to the transaction's account_log row
// and notes them for the commit.
func (tx *Tx) logAccounts(ctx context.Context, accounts []ledger.Account, conv *codec.Conv) error {
	if len(accounts) == 0 {
		return nil
	}
	blob := tx.w.acctBuf[:0]
	for i := range accounts {
		a := &accounts[i]
		start := len(blob)
		blob = appendAccountLog(blob, a)
		tx.acctLogged = append(tx.acctLogged, loggedAccount{a.Key, string(blob[start:])})
	}
	tx.w.acctBuf = blob
	p := tx.s.acct
	seq := p.lastSeq + 1
	p.lastSeq = seq // never reused, whatever the outcome
	tx.acctSeq = seq
	return tx.run(ctx, wAccountLogInsert, func() string { return "account log" }, conv, []any{seq, blob})
}

type loggedAccount struct {
	key ledger.AccountKey
	rec string // appendAccountLog's record
}

// committedAccounts moves what a committed transaction logged into
// dirty; the writer is held.
func (p *acctPending) committed(logged []loggedAccount) {
	if len(logged) == 0 {
		return
	}
	p.mu.Lock()
	if p.oldestTick < 0 {
		p.oldestTick = p.ticks
	}
	for _, l := range logged {
		kl, rl := int(binary.LittleEndian.Uint16([]byte(l.rec[:2]))), int(binary.LittleEndian.Uint16([]byte(l.rec[2:4])))
		p.dirty[l.key] = l.rec[4+kl : 4+kl+rl]
	}
	full := len(p.dirty) >= acctFlushCount
	p.mu.Unlock()
	if full {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// loadAccountLog reads every log row into dirty (Open, and after a COMMIT
// whose outcome was unknown); the writer is held.
func (s *Store) loadAccountLog(ctx context.Context, w *writer) error {
	p := s.acct
	dirty := map[ledger.AccountKey]string{}
	var last int64
	st, err := w.stmt(stmtCtx(ctx), "SELECT seq, accounts FROM account_log ORDER BY seq")
	if err != nil {
		return err
	}
	err = w.query(stmtCtx(ctx), st, nil, func(sc scanner) error {
		var blob []byte
		if err := sc.Scan(&last, &blob); err != nil {
			return err
		}
		return decodeAccountLog(blob, func(key ledger.AccountKey, row string) { dirty[key] = row })
	})
	if err != nil {
		return fmt.Errorf("account log: %w", err)
	}
	p.mu.Lock()
	p.dirty, p.frozen, p.reload = dirty, nil, false
	p.lastSeq = max(p.lastSeq, last)
	p.oldestTick = p.ticks
	p.mu.Unlock()
	return nil
}

// runAccountFlusher flushes dirty accounts when due, until Close.
func (s *Store) runAccountFlusher() {
	p := s.acct
	defer close(p.done)
	tick := time.NewTicker(time.Second)
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
		p.mu.Lock()
		if ticked {
			p.ticks++
		}
		due := len(p.dirty) >= acctFlushCount || p.oldestTick >= 0 && time.Duration(p.ticks-p.oldestTick)*time.Second >= acctFlushAge
		p.mu.Unlock()
		if !due {
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
		_ = s.flushAccounts(ctx)
		cancel()
	}
}

// flushAccounts writes every dirty account to its row, acctFlushChunk a
// transaction (commits run between them), and deletes the log rows they
// cover with the last.
func (s *Store) flushAccounts(ctx context.Context) error {
	var keys []ledger.AccountKey
	started := false
	for {
		last := false
		err := s.withWriter(ctx, func(w *writer) error {
			if !started {
				var err error
				if keys, err = s.freezeAccounts(ctx, w); err != nil {
					return err
				}
				started = true
			}
			var err error
			keys, err = s.flushChunk(ctx, w, keys)
			last = len(keys) == 0
			return err
		})
		if err != nil || last {
			return err
		}
	}
}

// flushAccountsThen flushes every dirty account holding the writer
// throughout, and then calls read (a reader taking its snapshot: every
// committed account is in its row) before it lets the writer go.
func (s *Store) flushAccountsThen(ctx context.Context, read func() error) error {
	return s.withWriter(ctx, func(w *writer) error {
		keys, err := s.freezeAccounts(ctx, w)
		for err == nil && len(keys) > 0 {
			keys, err = s.flushChunk(ctx, w, keys)
		}
		if err != nil {
			return err
		}
		return read()
	})
}

// freezeAccounts makes dirty the frozen set (merged into one being
// flushed) covering the log up to the last seq, and returns its keys in
// order; the writer is held.
func (s *Store) freezeAccounts(ctx context.Context, w *writer) ([]ledger.AccountKey, error) {
	p := s.acct
	if p.reload {
		if err := s.loadAccountLog(ctx, w); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen == nil {
		p.frozen = p.dirty
	} else {
		maps.Copy(p.frozen, p.dirty)
	}
	p.dirty, p.cut, p.oldestTick = map[ledger.AccountKey]string{}, p.lastSeq, -1
	keys := slices.SortedFunc(maps.Keys(p.frozen), ledger.AccountKey.Compare)
	if len(keys) == 0 {
		p.frozen = nil
	}
	return keys, nil
}

// flushChunk writes the first acctFlushChunk of keys (frozen) in one
// transaction, with the log deletion when they are the last, and returns
// the rest; the writer is held.
func (s *Store) flushChunk(ctx context.Context, w *writer, keys []ledger.AccountKey) ([]ledger.AccountKey, error) {
	p := s.acct
	chunk := keys[:min(len(keys), acctFlushChunk)]
	rest := keys[len(chunk):]
	last := len(rest) == 0
	err := s.inWriteTx(ctx, w, "flush accounts", func(wt *writeTx) error {
		tx := &Tx{s: s, w: w, ctx: ctx}
		rows := make([]*ledger.Account, 0, len(chunk))
		p.mu.Lock()
		for _, k := range chunk {
			if _, newer := p.dirty[k]; newer {
				continue // a later flush writes it
			}
			a, err := accountCodec.decodeRow(p.frozen[k], k)
			if err != nil {
				p.mu.Unlock()
				return err
			}
			rows = append(rows, a)
		}
		p.mu.Unlock()
		var conv codec.Conv
		missed, err := execChunks(ctx, tx, &conv, nil, rows, wAccountUpdateRows,
			func(args []any, a *ledger.Account) []any { return append(args, accountArgs(a, &conv)...) },
			func(a *ledger.Account) string { return "account " + a.Key.String() })
		if err != nil {
			return err
		}
		for _, a := range missed {
			if err := tx.run(ctx, wAccountPut, func() string { return "account " + a.Key.String() }, &conv, accountPutArgs(a, &conv)); err != nil {
				return err
			}
		}
		if last {
			_, err := wt.exec("DELETE FROM account_log WHERE seq <= ?", p.cut)
			return err
		}
		return nil
	})
	if err != nil {
		return keys, err
	}
	if last {
		p.mu.Lock()
		p.frozen = nil
		p.mu.Unlock()
	}
	return rest, nil
}

// beginAccountsRead begins a read transaction whose snapshot holds every
// committed account in its row: it flushes them all holding the writer
// and takes the snapshot before it lets the writer go.
func (s *Store) beginAccountsRead(ctx context.Context, begin func(context.Context, *sql.TxOptions) (*sql.Tx, error)) (*sql.Tx, error) {
	var tx *sql.Tx
	err := s.flushAccountsThen(ctx, func() error {
		var err error
		if tx, err = begin(ctx, nil); err != nil {
			return err
		}
		var n int64
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM account_log").Scan(&n); err != nil {
			_ = tx.Rollback()
			return err
		}
		return nil
	})
	return tx, err
}
