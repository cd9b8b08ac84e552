package sqlite

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/store"
)

// A read never waits for a write outside a batch that has not reached its
// COMMIT (it cannot see that write yet), as it never waits for a batch
// before its COMMIT: pipelined, the maintenance transactions are counted
// from their COMMIT, like Tx.commit's. The read below runs inside such a
// transaction, holding the writer: counted from BEGIN, it would wait for
// a COMMIT that waits for it, until its context ends.
func TestPipelinedReadsDoNotWaitForAMaintenanceTransactionBeforeItsCommit(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "capledger.db"), WithPipelinedSync())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var readErr error
	execWrite(t, s, "INSERT OR REPLACE INTO meta (name, value) VALUES ('maintenance_test', 1)", func() {
		// The bound only ends a deadlock: the read answers at once.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, readErr = s.ReservationGet(rctx, "no-such")
	})
	if !errors.Is(readErr, store.ErrNotFound) {
		t.Fatalf("a read inside a maintenance transaction: %v, want not found", readErr)
	}
	// The transaction's commit is synced before execWrite returned.
	if started, synced := s.sync.started.Load(), s.sync.synced.Load(); started == 0 || synced != started {
		t.Fatalf("after the maintenance commit: %d writes counted, %d synced", started, synced)
	}
}
