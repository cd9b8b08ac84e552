package envoyrls_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlscommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/capledger/capledger/store"
)

// slowCommitStore makes every commit take delay: a disk (or PostgreSQL)
// slower than Envoy's timeout.
type slowCommitStore struct {
	store.Store
	delay atomic.Int64 // nanoseconds
}

func (s *slowCommitStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &slowCommitTx{Tx: tx, delay: time.Duration(s.delay.Load())}, nil
}

// slowHarness is a harness whose store commits after delay, with
// policies of burst requests for the subjects acme and global on search.
func slowHarness(t *testing.T, burst int64, delay time.Duration) *harness {
	t.Helper()
	slow := &slowCommitStore{}
	h := newHarness(t, options{config: testMapping(t), wrapStore: func(st store.Store) store.Store {
		slow.Store = st
		return slow
	}})
	h.publish("acme", "search", "requests", burst, 1, time.Hour, false)
	h.publish("global", "search", "requests", burst, 1, time.Hour, false)
	slow.delay.Store(int64(delay))
	return h
}

type slowCommitTx struct {
	store.Tx
	delay time.Duration
}

func (tx *slowCommitTx) Commit(ctx context.Context) error {
	time.Sleep(tx.delay)
	return tx.Tx.Commit(ctx)
}

// TestSeveralDescriptorsPastTheDeadlineKeepNoHold: a request of several
// descriptors runs their reserves in one engine call and their follow-ups
// (start and settle, or the releases of a refused request) in a second.
// When Envoy's deadline (its grpc-timeout) passes while the reserves
// commit, the outcome may be unknown to Envoy, but the ledger must not be
// left half-way: every reserve that committed is followed up, so no
// descriptor keeps a hold nobody will ever settle or release (with an id,
// its settle after the stream would find it never started). Seen failing
// with 16 concurrent callers, commits of 30 ms and a 10 ms deadline:
// thousands of units left reserved, since a caller whose deadline had
// passed dropped the follow-ups (or gave up waiting for the reserves) and
// answered DEADLINE_EXCEEDED.
func TestSeveralDescriptorsPastTheDeadlineKeepNoHold(t *testing.T) {
	h := slowHarness(t, 1_000_000, 30*time.Millisecond)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlscommon.RateLimitDescriptor{
		descriptor(nil, "tenant", "acme", "route", "search"),
		descriptor(nil, "tenant", "global", "route", "search")}}
	var wg sync.WaitGroup
	var late atomic.Int64
	end := time.Now().Add(time.Second)
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				if _, err := h.rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+gatewayToken), req); err != nil {
					late.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if late.Load() == 0 {
		t.Fatal("no call passed its deadline: the test tests nothing")
	}
	// The server may still be following up calls whose callers gave up.
	deadline := time.Now().Add(10 * time.Second)
	for {
		acme, global := h.balance("acme", "search"), h.balance("global", "search")
		if acme.Reserved == 0 && global.Reserved == 0 {
			if acme.Spent != global.Spent {
				t.Fatalf("acme spent %d, global %d: every request charges both or neither", acme.Spent, global.Spent)
			}
			t.Logf("%d calls past the deadline; %d charged", late.Load(), acme.Spent)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls past the deadline left holds: acme %+v, global %+v", late.Load(), acme, global)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
