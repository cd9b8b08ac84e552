package server

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// A console read that scans every account costs time in proportion to
// the accounts: at a million of them, seconds of the server's CPU. The
// console asks every 5 s in every open tab, and `rollback --wait` every
// 2 s, so such a read is computed once per distinct question at a time,
// shared with every caller asking the same while it runs, and answered
// again until it is sharedReuseFactor times as old as its computation
// took: however many callers poll, the scans take at most about a tenth
// of a core, and a small ledger (a scan of milliseconds) is answered
// fresh. Each answer says when its accounts were read (asOf).
// ListAccountStandings (standings.go), GetFairness (fairness.go) and
// DrainProgress (rollout.go) share answers this way.
const sharedReuseFactor = 9

// An answer that scans every account is read with each account's
// deciding generation (and active or rolled-back marks) as they stood
// when its page was read. A publish or rollback committed through this
// server since changes which generation decides, so the ranking
// (ListAccountStandings) and GetFairness do not reuse an answer whose
// computation began before the last such commit (sharedNotBefore): what
// an operator sees right after `policy publish` or `rollback` is the new
// state. Invalidating costs nothing until such a commit, then one new
// scan; re-reading the marks of the page's policies instead would cost
// every answer a read of their keys' heads, the reads the sharing saves,
// for commits an operator makes a few times a day. A commit through
// another replica shows once the answer is no longer reused there (at
// most sharedReuseFactor times its computation's time).

// policyCommitted notes that a publish or rollback committed through s.
func (s *Server) policyCommitted() { s.noteCommit(time.Now()) }

// noteCommit notes a commit at at, unless a later one is noted already:
// handlers of two publishes answering at once may note them in either
// order, and an answer begun between the two commits must not be reused
// after the later one.
func (s *Server) noteCommit(at time.Time) {
	for {
		old := s.policyCommittedAt.Load()
		if old != nil && !old.Before(at) {
			return
		}
		if s.policyCommittedAt.CompareAndSwap(old, &at) {
			return
		}
	}
}

// sharedNotBefore is the time a reusable answer to a scan of every
// account (or a route's) must have begun at or after: the last publish
// or rollback committed here (zero before any).
func (s *Server) sharedNotBefore() time.Time {
	if at := s.policyCommittedAt.Load(); at != nil {
		return *at
	}
	return time.Time{}
}

// sharedAnswers holds, per question Q, the computation of an answer A
// being run or still reused. Its zero value is ready to use.
type sharedAnswers[Q comparable, A any] struct {
	mu      sync.Mutex
	answers map[Q]*sharedAnswer[A]
	// limit, when positive, bounds each computation's wait for a page
	// (scanBound, the server's StoreTimeout): it runs apart from its
	// callers' contexts, so without it a computation whose store hangs
	// would hold every caller asking the same forever.
	limit time.Duration
}

// sharedAnswer is one computation: running until done is closed, then
// its value (or error) until reuseUntil. began is when it started (on
// this process's monotonic clock).
type sharedAnswer[A any] struct {
	done       chan struct{}
	began      time.Time
	value      A
	err        *connect.Error
	reuseUntil time.Time
}

// answer returns the answer to q: the one being computed (waiting for
// it), or one still young enough to reuse, if it began at notBefore or
// later; else a new one computed by compute (which runs apart from this
// caller's cancellation: others may share it; but within limit of its
// last page read).
// Callers must not change the value. A failed computation is not
// reused; it answers its error to the callers that waited for it. A caller whose ctx ends while it waits
// gets readError's answer for it (deadline_exceeded when its deadline
// passed, canceled when it went away). The zero notBefore takes any.
func (sh *sharedAnswers[Q, A]) answer(ctx context.Context, q Q, notBefore time.Time, compute func(ctx context.Context, value *A) *connect.Error) (*A, *connect.Error) {
	sh.mu.Lock()
	if sh.answers == nil {
		sh.answers = map[Q]*sharedAnswer[A]{}
	}
	r := sh.answers[q]
	if r != nil && r.began.Before(notBefore) {
		r = nil // read too early for this caller: a new one replaces it
	}
	if r != nil {
		select {
		case <-r.done:
			if r.err != nil || !time.Now().Before(r.reuseUntil) {
				r = nil
			}
		default: // still running: wait for it below
		}
	}
	if r == nil {
		for k, old := range sh.answers { // forget the stale ones
			select {
			case <-old.done:
				if !time.Now().Before(old.reuseUntil) {
					delete(sh.answers, k)
				}
			default:
			}
		}
		r = &sharedAnswer[A]{done: make(chan struct{}), began: time.Now()}
		sh.answers[q] = r
		sh.mu.Unlock()
		computeCtx, cancel := context.WithoutCancel(ctx), context.CancelFunc(func() {})
		if sh.limit > 0 {
			computeCtx, cancel = scanBound(computeCtx, sh.limit)
		}
		r.err = scanTimedOut(computeCtx, compute(computeCtx, &r.value))
		cancel()
		r.reuseUntil = time.Now().Add(sharedReuseFactor * time.Since(r.began))
		close(r.done)
	} else {
		sh.mu.Unlock()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		// The caller's own deadline or cancellation: deadline_exceeded
		// or canceled, as every other read answers it (readError).
		return nil, readError("", "", ctx.Err())
	}
	if r.err != nil {
		return nil, r.err
	}
	return &r.value, nil
}

// best keeps the limit best items offered (by before: whether a ranks
// before b), in a heap whose root is the one that ranks last, pushed out
// when a better one comes. Its memory is limit items however many are
// offered.
type best[T any] struct {
	items  []T
	limit  int
	before func(a, b T) bool
}

func newBest[T any](limit int, before func(a, b T) bool) *best[T] {
	return &best[T]{items: make([]T, 0, min(limit, 1024)), limit: limit, before: before}
}

func (b *best[T]) Len() int           { return len(b.items) }
func (b *best[T]) Less(i, j int) bool { return b.before(b.items[j], b.items[i]) }
func (b *best[T]) Swap(i, j int)      { b.items[i], b.items[j] = b.items[j], b.items[i] }
func (b *best[T]) Push(x any)         { b.items = append(b.items, x.(T)) }
func (b *best[T]) Pop() any {
	x := b.items[len(b.items)-1]
	b.items = b.items[:len(b.items)-1]
	return x
}

// wants reports whether c would be kept: fewer than limit are kept, or c
// ranks before the last one kept. A caller may check it before building
// the item in full.
func (b *best[T]) wants(c T) bool {
	return len(b.items) < b.limit || (b.limit > 0 && b.before(c, b.items[0]))
}

// offer keeps c if it ranks among the best limit so far.
func (b *best[T]) offer(c T) {
	switch {
	case len(b.items) < b.limit:
		heap.Push(b, c)
	case b.limit > 0 && b.before(c, b.items[0]):
		b.items[0] = c
		heap.Fix(b, 0)
	}
}

// ranked returns the items kept, best first, and empties b.
func (b *best[T]) ranked() []T {
	out := make([]T, len(b.items))
	for i := len(b.items) - 1; i >= 0; i-- {
		out[i] = heap.Pop(b).(T)
	}
	return out
}
