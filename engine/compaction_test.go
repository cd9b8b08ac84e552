package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
	"github.com/capledger/capledger/store/sqlite"
)

// lifecycle runs n reserve/start/settle lifecycles through e.
func lifecycle(t *testing.T, e *Engine, prefix string, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("%s%04d", prefix, i)
		cmds := []ledger.Command{reserveCmd(id, 10), {Kind: ledger.KindStart, ReservationID: id, OperationID: "op"},
			{Kind: ledger.KindSettle, ReservationID: id, OperationID: "op", Units: ledger.Amounts{4}}}
		if _, err := e.DoBatch(context.Background(), cmds); err != nil {
			t.Fatal(err)
		}
	}
}

func journalLen(t *testing.T, st store.Store) int {
	t.Helper()
	snap, err := st.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(snap.Journal)
}

// The compaction pass cuts a checkpoint once per Every and deletes the
// journal it summarises; the audit stays clean in both modes, the
// journal since the checkpoint stays, and an account changed behind the
// journal's back stops compaction: no checkpoint, nothing deleted.
func TestCompactionCutsVerifiedCheckpoints(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) store.Store{
		"memstore": func(*testing.T) store.Store { return memstore.New() },
		"sqlite": func(t *testing.T) store.Store {
			st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "compaction.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := open(t)
			clk := newClock()
			e := New(st, Options{Clock: clk.Now, DisableWorkers: true, Compaction: &CompactionOptions{Every: time.Hour, Batch: 7}})
			defer e.Close()
			publish(t, e, 1_000_000, time.Minute, 0)
			lifecycle(t, e, "a", 50)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 1 || s.Deleted == 0 || s.LastSeq != 1 {
				t.Fatalf("after the first pass: %+v", s)
			}
			if n := journalLen(t, st); n != 0 {
				t.Fatalf("%d entries left after compaction", n)
			}
			lifecycle(t, e, "b", 20)
			since := journalLen(t, st)
			e.runCompaction(ctx) // same hour: no new checkpoint
			if s := e.CompactionStats(); s.Checkpoints != 1 || journalLen(t, st) != since {
				t.Fatalf("a second pass within the hour: %+v, %d entries of %d", s, journalLen(t, st), since)
			}
			auditClean(t, e)
			for _, mode := range []bool{false, true} {
				var last AuditProgress
				found, err := e.AuditWith(ctx, AuditOptions{SinceCheckpoint: mode, Progress: func(p AuditProgress) { last = p }})
				if err != nil || len(found) > 0 {
					t.Fatalf("audit (since checkpoint %v): %v %v", mode, found, err)
				}
				if !last.Done || last.Fraction != 1 || last.Rows < int64(since) || last.Estimate <= 0 {
					t.Fatalf("audit (since checkpoint %v) ended with progress %+v, %d entries since", mode, last, since)
				}
			}
			clk.Advance(time.Hour)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 2 || journalLen(t, st) != 0 {
				t.Fatalf("after the next hour: %+v, %d entries", s, journalLen(t, st))
			}
			auditClean(t, e)

			// Change an account behind the journal: the next cut refuses.
			lifecycle(t, e, "c", 5)
			accounts, err := st.AccountList(ctx, ledger.PolicyKey{})
			if err != nil || len(accounts) != 1 {
				t.Fatalf("accounts %v %v", accounts, err)
			}
			a := accounts[0]
			a.Balances[0].Opening++
			a.Balances[0].Available++
			tx, err := st.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.Write(ctx, &store.Changes{Accounts: []ledger.Account{a}}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			left := journalLen(t, st)
			clk.Advance(time.Hour)
			e.runCompaction(ctx)
			if s := e.CompactionStats(); s.Checkpoints != 2 || s.Refused != 1 || journalLen(t, st) != left || left == 0 {
				t.Fatalf("a pass over a broken ledger: %+v, %d entries of %d", s, journalLen(t, st), left)
			}
		})
	}
}
