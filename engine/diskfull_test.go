package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/tmpfs"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

// On SQLite with the disk full, a one-row probe can fit where batches do
// not (the failed batch grew the WAL file before it hit the limit, so the
// next small write reuses that room). Ready must not turn ready between
// failed batches: its probe is as large as the batch that failed. Once the
// disk has room again it comes back without traffic. Needs root to mount
// a size-limited tmpfs; skipped otherwise.
func TestReadyStaysOutOnAFullDiskBetweenFailedBatches(t *testing.T) {
	dir := tmpfs.Mount(t, "4m")
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	e := New(st, Options{DisableWorkers: true})
	defer e.Close()
	publish(t, e, 1_000_000_000, time.Hour, 0)
	for i := range 20 {
		if res, err := e.Do(context.Background(), reserveCmd(fmt.Sprintf("warm-%d", i), 1)); err != nil || res.Err != nil {
			t.Fatalf("warm-up reserve: %v %v", err, res.Err)
		}
	}
	// Fill the disk.
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	// Then leave room for a small write but not for a batch of 64.
	if err := f.Truncate(mustSize(t, f) - 16<<10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// One request of 64 reserves: one batch, all or nothing.
	batch := func(round int) error {
		cmds := make([]ledger.Command, 64)
		for i := range cmds {
			cmds[i] = reserveCmd(fmt.Sprintf("r%d-%d", round, i), 1)
		}
		_, err := e.DoBatch(context.Background(), cmds)
		return err
	}
	// A batch can still commit now and then (a checkpoint lets the WAL
	// reuse its file from the start); after each one that failed, Ready
	// must say not ready unless the next batch commits.
	failedRounds := 0
	for round := 0; round < 20 && failedRounds < 5; round++ {
		if err := batch(round); err == nil {
			continue
		}
		failedRounds++
		e.lastProbe.Store(0) // as if readyProbeEvery had passed
		err := e.Ready()
		if err == nil {
			// Ready is right only if a batch fits now.
			if berr := batch(1000 + round); berr != nil {
				t.Fatalf("round %d: ready between failed batches on a full disk (the next one: %v)", round, berr)
			}
			continue
		}
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("round %d: Ready: %v", round, err)
		}
	}
	if failedRounds < 5 {
		t.Fatalf("only %d of 20 batches of 64 reserves failed on a full disk", failedRounds)
	}
	// Room again: ready without traffic.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	e.lastProbe.Store(0)
	if err := e.Ready(); err != nil {
		t.Fatalf("Ready after the disk has room again: %v", err)
	}
	if err := batch(99); err != nil {
		t.Fatalf("a batch after the disk has room again: %v", err)
	}
	auditClean(t, e)
}

func mustSize(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// On SQLite a COMMIT that runs out of disk (SQLITE_FULL) wrote no valid
// commit frame: the batch is known not applied (ErrNotApplied, "not
// applied" to the caller, not "outcome unknown"), and indeed nothing of
// it is there, not even after the store is opened again (the WAL
// recovered). With room again the same reserve is admitted anew, not
// replayed. Needs root to mount a size-limited tmpfs; skipped otherwise.
func TestFullDiskAtCommitIsNotApplied(t *testing.T) {
	dir := tmpfs.Mount(t, "4m")
	path := filepath.Join(dir, "ledger.db")
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	e := New(st, Options{DisableWorkers: true})
	closed := false
	closeFirst := func() {
		if !closed {
			closed = true
			e.Close()
			st.Close()
		}
	}
	t.Cleanup(closeFirst) // before the tmpfs is unmounted
	publish(t, e, 1_000_000_000, time.Hour, 0)
	for i := range 20 {
		if res, err := e.Do(context.Background(), reserveCmd(fmt.Sprintf("warm-%d", i), 1)); err != nil || res.Err != nil {
			t.Fatalf("warm-up reserve: %v %v", err, res.Err)
		}
	}
	filler := filepath.Join(dir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4096); ; {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()

	// A reserve may still commit into room the WAL file has (a checkpoint
	// lets it reuse its start): the first that fails is the one looked at.
	failed := ""
	for i := 0; i < 1000 && failed == ""; i++ {
		id := fmt.Sprintf("full-%d", i)
		if _, err = e.Do(context.Background(), reserveCmd(id, 1)); err != nil {
			failed = id
		}
	}
	if failed == "" {
		t.Fatal("1000 reserves committed on a full disk")
	}
	if !strings.Contains(err.Error(), "commit: ") || !strings.Contains(err.Error(), "full") {
		t.Skipf("the full disk failed the batch before its COMMIT (%v): not the case under test", err)
	}
	if !errors.Is(err, ErrNotApplied) || !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, store.ErrRolledBack) {
		t.Fatalf("a COMMIT refused for a full disk: %v, want ErrNotApplied, store.ErrRolledBack and store.ErrUnavailable", err)
	}
	closeFirst()

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	reopened, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	e = New(reopened, Options{DisableWorkers: true})
	t.Cleanup(func() { e.Close(); reopened.Close() })
	if _, err := e.Reservation(context.Background(), failed); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the reservation of the COMMIT refused for a full disk, after a reopen: %v, want not found", err)
	}
	res, err := e.Do(context.Background(), reserveCmd(failed, 1))
	if err != nil || res.Err != nil || res.Replayed {
		t.Fatalf("the reserve again with room: %v %v (replayed %v), want admitted anew", err, res.Err, res.Replayed)
	}
	auditClean(t, e)
}
