package sqlite_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/sqlite"
)

const (
	crashPathEnv  = "CAPLEDGER_SQLITE_CRASH_DB"
	crashStartEnv = "CAPLEDGER_SQLITE_CRASH_START"
	crashSeedEnv  = "CAPLEDGER_SQLITE_CRASH_SEED"
	// crashPipelinedEnv runs the helper WithPipelinedSync: it commits
	// pipelineDepth batches with CommitDeferred, then Syncs and only then
	// acknowledges them.
	crashPipelinedEnv = "CAPLEDGER_SQLITE_CRASH_PIPELINED"
	pipelineDepth     = 3
	batchSize         = 10
)

var crashAccount = ledger.AccountKey{Subject: "tenant7", Route: "chat", Region: "eu", Generation: 1}

func batchID(batch, i int) string { return fmt.Sprintf("b%06d-r%02d", batch, i) }

// crashBatch is one transaction of the crash test: batchSize new
// reservations, a journal entry for each, the account's version set to the
// batch number and the meta counter last_batch.
func crashBatch(batch int) *store.Changes {
	c := &store.Changes{NewReservations: map[string]bool{}, Meta: map[string]int64{"last_batch": int64(batch)}}
	for i := 0; i < batchSize; i++ {
		r := reservation(batchID(batch, i))
		r.Account = crashAccount
		c.Reservations = append(c.Reservations, r)
		c.NewReservations[r.ID] = true
		c.Journal = append(c.Journal, ledger.JournalEntry{At: t0, Kind: ledger.KindReserve, Account: crashAccount,
			ReservationID: r.ID, From: ledger.StateRequested, To: ledger.StateReserved,
			Delta: ledger.Balances{{Available: -600, Reserved: 600}}})
	}
	c.Accounts = []ledger.Account{{Key: crashAccount, Dims: 1, EpochStart: t0, Version: uint64(batch),
		Balances: ledger.Balances{{Opening: 1 << 40, Available: 1<<40 - int64(600*batchSize*batch), Reserved: int64(600 * batchSize * batch)}}}}
	return c
}

// TestCrashHelperProcess is not a test: TestCrashDurability runs the test
// binary again with crashPathEnv set, and this function then commits
// batches until it is killed, printing "committed N" after each Commit
// returned nil.
func TestCrashHelperProcess(t *testing.T) {
	path := os.Getenv(crashPathEnv)
	if path == "" {
		t.Skip("helper process of TestCrashDurability")
	}
	start, err := strconv.Atoi(os.Getenv(crashStartEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad start:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	pipelined := os.Getenv(crashPipelinedEnv) != ""
	var opts []sqlite.Option
	if pipelined {
		opts = append(opts, sqlite.WithPipelinedSync())
	}
	s, err := sqlite.Open(ctx, path, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(2)
	}
	var unsynced []int
	for batch := start; batch < start+100_000; batch++ {
		tx, err := s.Begin(ctx)
		if err == nil {
			if err = tx.Write(ctx, crashBatch(batch)); err == nil {
				if pipelined {
					err = tx.(store.DeferredCommitter).CommitDeferred(ctx)
				} else {
					err = tx.Commit(ctx)
				}
			}
			tx.Rollback(ctx)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "batch", batch, err)
			os.Exit(2)
		}
		unsynced = append(unsynced, batch)
		if pipelined && len(unsynced) < pipelineDepth {
			continue // the next batch is written before this one is synced
		}
		if err := s.Sync(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "sync", batch, err)
			os.Exit(2)
		}
		// os.Stdout is unbuffered: the line leaves the process only after
		// Commit (pipelined: Sync) returned, so every line the parent
		// reads is an ack.
		for _, b := range unsynced {
			fmt.Fprintf(os.Stdout, "committed %d\n", b)
		}
		unsynced = unsynced[:0]
	}
	os.Exit(3) // never killed: the parent failed to kill us
}

// TestCrashDurability kills a writer process with SIGKILL at a random
// moment, several times over one file, and checks after each reopen that
// every batch the writer acknowledged is present in full, that no batch is
// half-present, and that at most one batch beyond the last acknowledged
// one (committed, ack not printed yet) exists.
func TestCrashDurability(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Run("full", func(t *testing.T) { testCrashDurability(t, false) })
	t.Run("pipelined", func(t *testing.T) { testCrashDurability(t, true) })
}

func testCrashDurability(t *testing.T, pipelined bool) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(crashSeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (replay the kill points with %s=%d)", seed, crashSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0x5ca1ab1e))
	path := filepath.Join(t.TempDir(), "crash.db")
	next := 1
	for round := 0; round < 4; round++ {
		acked := runUntilKilled(t, path, pipelined, next, 1+rng.IntN(40), time.Duration(rng.IntN(3000))*time.Microsecond)
		next = checkAfterCrash(t, path, pipelined, next, acked) + 1
	}
}

// runUntilKilled starts the helper at batch start, kills it with SIGKILL
// after it acknowledged killAfter batches plus a delay, and returns every
// batch it acknowledged.
func runUntilKilled(t *testing.T, path string, pipelined bool, start, killAfter int, delay time.Duration) []int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$")
	cmd.Env = append(os.Environ(), crashPathEnv+"="+path, crashStartEnv+"="+strconv.Itoa(start))
	if pipelined {
		cmd.Env = append(cmd.Env, crashPipelinedEnv+"=1")
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []int
	lines := bufio.NewScanner(out)
	killed := false
	for lines.Scan() {
		n, ok := strings.CutPrefix(lines.Text(), "committed ")
		if !ok {
			continue
		}
		batch, err := strconv.Atoi(n)
		if err != nil {
			t.Fatalf("helper printed %q", lines.Text())
		}
		acked = append(acked, batch)
		if !killed && len(acked) >= killAfter {
			time.Sleep(delay) // land somewhere inside a later commit
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if !killed {
		t.Fatalf("helper exited before it was killed: %v\n%s", err, stderr.String())
	}
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("helper was not killed by the signal: %v\n%s", err, stderr.String())
	}
	return acked
}

// checkAfterCrash reopens the file and returns the last batch present.
func checkAfterCrash(t *testing.T, path string, pipelined bool, start int, acked []int) int {
	t.Helper()
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("reopen after kill: %v", err)
	}
	defer s.Close()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reservations := map[int]int{}
	for _, r := range snap.Reservations {
		var batch, i int
		if _, err := fmt.Sscanf(r.ID, "b%06d-r%02d", &batch, &i); err != nil {
			t.Fatalf("unexpected reservation %s", r.ID)
		}
		reservations[batch]++
	}
	journal := map[int]int{}
	for _, e := range snap.Journal {
		var batch, i int
		fmt.Sscanf(e.ReservationID, "b%06d-r%02d", &batch, &i)
		journal[batch]++
	}
	last := 0
	for batch := range reservations {
		last = max(last, batch)
	}
	for batch := 1; batch <= last; batch++ {
		if reservations[batch] != batchSize || journal[batch] != batchSize {
			t.Fatalf("batch %d is half-present: %d of %d reservations, %d of %d journal entries",
				batch, reservations[batch], batchSize, journal[batch], batchSize)
		}
	}
	for _, batch := range acked {
		if reservations[batch] != batchSize {
			t.Fatalf("acknowledged batch %d lost: %d reservations present", batch, reservations[batch])
		}
	}
	lastAcked := acked[len(acked)-1]
	ahead := 1 // the batch being committed when the kill came
	if pipelined {
		ahead = pipelineDepth // committed, not yet synced nor acknowledged
	}
	if last > lastAcked+ahead {
		t.Fatalf("batches up to %d present, but the writer had only reached %d", last, lastAcked+ahead)
	}
	account, err := s.AccountGet(ctx, crashAccount)
	if err != nil || account.Version != uint64(last) {
		t.Fatalf("account version %d, %v; want the last batch %d (account and reservations in one commit)", account.Version, err, last)
	}
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if v, err := tx.MetaGet(ctx, "last_batch"); err != nil || v != int64(last) {
		t.Fatalf("meta last_batch %d, %v; want %d", v, err, last)
	}
	t.Logf("killed after batch %d acknowledged; %d batches present, %d unacknowledged", lastAcked, last, last-lastAcked)
	return last
}
