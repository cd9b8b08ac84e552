package sqlite

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Warming the row cache off the committer (store.AccountsWarmer).
//
// Over many subjects most reserves miss the row cache, and the batch's
// transaction reads their currents and accounts on the write connection
// (AccountsPrefetch): B-tree descents and page reads inside the one
// write transaction, which is serial. The engine hands the subjects of a
// batch that has to wait for the committer to WarmAccounts; a goroutine
// reads the ones the cache misses on a read connection, with the
// prefetch's statement, while the committer works on the batches before,
// and caches them. The batch's transaction then finds them cached and
// reads only what its own writes touch.
//
// The cache holds the rows as last committed, and a read connection may
// have read a row before the writer committed a change to it. So the
// warmer notes the cache's commit count (rowCache.seq) before its read and
// caches a row only if no commit recorded since wrote that subject (its
// touched slot) and the cache was not reset since, and only if the cache
// does not hold the row already (a row there is at least as new). A
// commit recorded after the row is cached replaces it as before. What the
// warmer read may not be durable yet in a pipelined store, as the rows the
// writer caches at its commits may not be: nothing it reads is answered
// to a caller.

// warmQueue bounds the subjects waiting for the warmer; WarmAccounts
// drops what does not fit (the transaction reads those itself).
const warmQueue = 4096

type warmer struct {
	keys    chan ledger.PolicyKey
	stop    chan struct{}
	stopped chan struct{}
	stmts   map[int]*sql.Stmt // by key count; the warmer goroutine's own
	// warmed counts the subjects the warmer cached; skipped those it read
	// but did not cache because a commit may have changed them since.
	warmed, skipped atomic.Uint64
	// afterRead, when set (tests), runs between the read and the caching.
	afterRead func()
}

var _ store.AccountsWarmer = (*Store)(nil)

func (s *Store) startWarmer() {
	s.warm = &warmer{keys: make(chan ledger.PolicyKey, warmQueue), stop: make(chan struct{}),
		stopped: make(chan struct{}), stmts: map[int]*sql.Stmt{}}
	go s.warmLoop()
}

func (s *Store) stopWarmer() {
	if s.warm == nil {
		return
	}
	close(s.warm.stop)
	<-s.warm.stopped
	for _, st := range s.warm.stmts {
		st.Close()
	}
}

// WarmAccounts hands the subjects the row cache does not hold to the
// warmer, without waiting; it drops what the queue has no room for.
func (s *Store) WarmAccounts(subjects []ledger.PolicyKey) {
	if s.warm == nil || s.closed.Load() {
		return
	}
	c := s.cache
	var missing []ledger.PolicyKey
	c.mu.Lock()
	for _, k := range subjects {
		if _, ok := c.currents.index[k]; !ok {
			missing = append(missing, k)
		}
	}
	c.mu.Unlock()
	for _, k := range missing {
		select {
		case s.warm.keys <- k:
		default:
			return
		}
	}
}

// warmLoop is the warmer goroutine: it takes the waiting subjects, up to
// one statement's worth, and warms them, until stopped.
func (s *Store) warmLoop() {
	w := s.warm
	defer close(w.stopped)
	keys := make([]ledger.PolicyKey, 0, accountPrefetchSizes[0])
	for {
		select {
		case <-w.stop:
			return
		case k := <-w.keys:
			keys = append(keys[:0], k)
		}
	fill:
		for len(keys) < cap(keys) {
			select {
			case k := <-w.keys:
				keys = append(keys, k)
			default:
				break fill
			}
		}
		s.warmRead(keys) // a failed read leaves the rows to the transaction
	}
}

// warmRead reads the currents and accounts of the subjects of keys the
// cache does not hold on a read connection and caches those no commit
// recorded since the read began may have changed.
func (s *Store) warmRead(keys []ledger.PolicyKey) error {
	c := s.cache
	c.mu.Lock()
	since := c.seq
	missing := keys[:0]
	for _, k := range keys {
		if _, ok := c.currents.index[k]; !ok {
			missing = append(missing, k)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	slices.SortFunc(missing, ledger.PolicyKey.Compare)
	missing = slices.Compact(missing)
	var rows []prefetched
	cols := make([]any, 5+len(strings.Split(accountCols, ", ")))
	row := make(driverRow, len(cols))
	dest := make([]any, len(cols))
	for i := range cols {
		dest[i] = &cols[i]
	}
	err := prefetchChunks(missing, func(n int, _ []ledger.PolicyKey, args []any) error {
		st, err := s.warmStmt(n)
		if err != nil {
			return err
		}
		// Not cancellable: the driver would watch the context with a
		// goroutine of its own.
		rs, err := st.QueryContext(context.Background(), args...)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			if err := rs.Scan(dest...); err != nil {
				return err
			}
			for i, v := range cols {
				row[i] = v
			}
			r, err := scanPrefetched(row)
			if err != nil {
				return err
			}
			rows = append(rows, r)
		}
		return rs.Err()
	})
	if err != nil {
		return err
	}
	if s.warm.afterRead != nil {
		s.warm.afterRead()
	}
	var warmed, skipped uint64
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.resetAt > since {
		s.warm.skipped.Add(uint64(len(missing)))
		return nil
	}
	// may reports whether k may be cached as read: no commit recorded
	// since the read wrote it, and the cache does not hold it.
	may := func(k ledger.PolicyKey) bool {
		if c.touched[c.subjectSlot(k)] > since {
			skipped++
			return false
		}
		_, held := c.currents.index[k]
		return !held
	}
	found := make(map[ledger.PolicyKey]bool, len(rows))
	for i := range rows {
		r := &rows[i]
		if found[r.subject] {
			continue // a chunk's last key repeated (prefetchChunks)
		}
		found[r.subject] = true
		if !may(r.subject) {
			continue
		}
		g := r.key.Generation
		c.currents.put(r.subject, cached[uint64]{row: &g})
		if _, held := c.accounts.index[r.key]; !held {
			c.accounts.put(r.key, cached[ledger.Account]{row: r.account})
		}
		warmed++
	}
	for _, k := range missing {
		if !found[k] && may(k) {
			c.currents.put(k, cached[uint64]{}) // no current row
			warmed++
		}
	}
	s.warm.warmed.Add(warmed)
	s.warm.skipped.Add(skipped)
	return nil
}

// warmStmt returns the prefetch statement for n keys on the read pool,
// prepared on first use.
func (s *Store) warmStmt(n int) (*sql.Stmt, error) {
	if st, ok := s.warm.stmts[n]; ok {
		return st, nil
	}
	st, err := s.readDB.PrepareContext(context.Background(), accountPrefetchSQL(n))
	if err != nil {
		return nil, err
	}
	s.warm.stmts[n] = st
	return st, nil
}
