package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// conflictingStore fails the commits it is told to with store.ErrConflict
// (a row lock another replica held past the lock timeout).
type conflictingStore struct {
	*memstore.Store
	conflicts atomic.Int64 // commits left to fail
}

func (s *conflictingStore) Begin(ctx context.Context) (store.Tx, error) {
	tx, err := s.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return conflictingTx{Tx: tx, s: s}, nil
}

type conflictingTx struct {
	store.Tx
	s *conflictingStore
}

func (tx conflictingTx) Commit(ctx context.Context) error {
	if tx.s.conflicts.Add(-1) >= 0 {
		tx.Tx.Rollback(ctx)
		return fmt.Errorf("simulated lock timeout: %w", store.ErrConflict)
	}
	return tx.Tx.Commit(ctx)
}

// TestConflictsRetriedInsideTheServer: a conflicting commit is rerun by
// the server, so the caller sees only the answer, and a conflict that
// outlives the reruns is a 503 with reason STORE_CONFLICT (outcome
// unknown: the caller retries with the same ids).
func TestConflictsRetriedInsideTheServer(t *testing.T) {
	st := &conflictingStore{Store: memstore.New()}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(st, engine.Options{DisableWorkers: true, Logger: logger,
		MaxConflictRetries: 5, ConflictRetryBudget: 50 * time.Millisecond})
	defer eng.Close()
	h := &harness{t: t, store: st, engine: eng, http: &http.Client{Timeout: 10 * time.Second}}
	h.url = serve(t, server.New(eng, server.Config{Metrics: server.NewMetrics(), Logger: logger}))
	h.ok("PublishPolicy", tokensPolicy, "")

	st.conflicts.Store(3)
	h.ok("Reserve", reserveBody("rl-retried", 10), "")
	if left := st.conflicts.Load(); left >= 0 {
		t.Fatalf("%d simulated conflicts left: the reserve was not rerun past them", left+1)
	}

	st.conflicts.Store(1 << 30)
	h.wantError(h.call("Reserve", reserveBody("rl-conflicted", 10), ""), http.StatusServiceUnavailable, "unavailable", server.ReasonStoreConflict)
	st.conflicts.Store(0)
	h.ok("Reserve", reserveBody("rl-conflicted", 10), "") // the same id, now admitted
}
