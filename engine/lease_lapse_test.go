package engine

import (
	"context"
	"testing"
	"time"

	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// slowLease is an in-memory store whose LeaseAcquire answers only after
// delay, as a store across a slow network does.
type slowLease struct {
	*memstore.Store
	delay time.Duration
}

func (s slowLease) LeaseAcquire(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	time.Sleep(s.delay)
	return s.Store.LeaseAcquire(ctx, name, holder, ttl)
}

// The worker lease is believed for ttl from when the acquire that won it
// was sent, never from when its answer came: the store's expiry is
// measured from later than the send, so this replica stops believing it
// leads before another may take over. Once that belief lapsed without a
// renewal, the engine does not lead (IsLeader, leaderTerm, Leader), and
// a renewal that wins the lease again starts a new term, in which the
// workers start afresh (tick). (Planted breaks passed every other test:
// the belief counted from the answer; IsLeader or leaderTerm ignoring the
// lapse; a re-acquire after a lapse continuing the old term.)
func TestWorkerLeaseBeliefLapsesFromTheAcquiresSend(t *testing.T) {
	const ttl, delay = time.Minute, 20 * time.Millisecond
	e := New(slowLease{Store: memstore.New(), delay: delay}, Options{DisableWorkers: true, LeaseTTL: ttl})
	defer e.Close()
	ctx := context.Background()

	e.renewLease(ctx, ttl)
	answered := time.Now()
	if !e.IsLeader() || e.leaderTerm() != 1 || !e.Leader().Leader {
		t.Fatalf("after the first acquire: leader %v, term %d, status %+v; want leading in term 1", e.IsLeader(), e.leaderTerm(), e.Leader())
	}
	e.lead.mu.Lock()
	until := e.lead.until
	e.lead.mu.Unlock()
	// The acquire was sent at least delay before its answer came.
	if latest := answered.Add(ttl - delay/2); until.After(latest) {
		t.Errorf("believed until %v: counted from the answer (want at most %v, the send + ttl)", until, latest)
	}

	// The belief lapses without a renewal (every renewal lost).
	e.lead.mu.Lock()
	e.lead.until = time.Now().Add(-time.Millisecond)
	e.lead.mu.Unlock()
	if e.IsLeader() {
		t.Error("IsLeader after the lease lapsed")
	}
	if term := e.leaderTerm(); term != 0 {
		t.Errorf("leaderTerm %d after the lease lapsed, want 0", term)
	}
	if s := e.Leader(); s.Leader || !s.Since.IsZero() {
		t.Errorf("Leader() after the lease lapsed: %+v, want not leading, no since", s)
	}

	// Won again: another replica may have led meanwhile, so a new term.
	e.renewLease(ctx, ttl)
	if !e.IsLeader() || e.leaderTerm() != 2 {
		t.Fatalf("after winning the lease again: leader %v, term %d; want leading in term 2", e.IsLeader(), e.leaderTerm())
	}
}
