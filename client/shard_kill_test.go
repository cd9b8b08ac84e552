package client

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/ledger"
)

// killChildEnv names the store directory a child process of
// TestShardStoreKilledMidCompaction works on.
const killChildEnv = "CAPLEDGER_SHARD_KILL_CHILD"

// The child: ends shards of tenant-7 one by one in a store that compacts
// at every chance (compactAt 1), and appends each one's index to acks once
// the store returned (so what acks lists was synced), until killed.
func TestShardStoreKillChild(t *testing.T) {
	dir := os.Getenv(killChildEnv)
	if dir == "" {
		t.Skip("run by TestShardStoreKilledMidCompaction")
	}
	from, _ := strconv.Atoi(os.Getenv(killChildEnv + "_FROM"))
	clock := &testClock{now: shardT0}
	st := openCompactingStore(t, dir, clock, 1)
	acks, err := os.OpenFile(filepath.Join(dir, "acks"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("ready")
	for i := from; ; i++ {
		if err := endShards(st, i, i+1); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(acks, "%d\n", i)
	}
}

// ackLines counts the complete lines of the child's acks file in dir.
func ackLines(t *testing.T, dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, "acks"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// A gateway killed (SIGKILL) at random points while its store compacts
// over and over keeps every promise after a reopen: each reservation id
// it served (and acknowledged) is known and answered as before, never
// admitted again, its shard is never installed again, the newest fence
// still refuses an older one (here often carried by a shard the kill left
// held; TestShardStoreTornRecordAfterCompaction checks the fence records
// alone), and no unfinished new log is left.
func TestShardStoreKilledMidCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	dir := t.TempDir()
	clock := &testClock{now: shardT0}
	next := 0
	for round := range 12 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestShardStoreKillChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir, killChildEnv+"_FROM="+strconv.Itoa(next))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		childproc.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if strings.TrimSpace(line) != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("round %d: the child said %q", round, line)
		}
		// The kill lands a random moment after the child's first
		// acknowledgement of this round: on a loaded machine a fixed
		// delay after "ready" could pass before it ended one shard.
		ackedBefore := ackLines(t, dir)
		for deadline := time.Now().Add(2 * time.Minute); ackLines(t, dir) == ackedBefore; {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: the child acknowledged nothing in 2 minutes", round)
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()

		data, err := os.ReadFile(filepath.Join(dir, "acks"))
		if err != nil {
			t.Fatal(err)
		}
		var acked []int
		for _, f := range strings.Fields(string(data)) {
			i, err := strconv.Atoi(f)
			if err != nil {
				continue // a torn last line: not acknowledged
			}
			acked = append(acked, i)
		}
		if len(acked) == 0 {
			t.Fatalf("round %d: the child acknowledged nothing", round)
		}
		last := acked[len(acked)-1]
		next = last + 1000 // past any shard the child had begun

		st := openCompactingStore(t, dir, clock, 1)
		if _, err := os.Stat(filepath.Join(dir, shardLogCompacting)); !os.IsNotExist(err) {
			t.Fatalf("round %d: an unfinished new log is left (%v)", round, err)
		}
		boot := st.BootEpoch()
		if _, err := st.Install(signSubjectToken(fmt.Sprintf("sh-old-%d", round), "tenant-7", "gw-a", boot, uint64(99+last), 1000, clock.Now().Add(time.Hour)), testUnits, nil); !errors.Is(err, ledger.ErrShardFenced) {
			t.Fatalf("round %d: an older fence (%d) was installed: %v", round, 99+last, err)
		}
		live := fmt.Sprintf("sh-live-%d", round)
		if _, err := st.Install(signSubjectToken(live, "tenant-7", "gw-a", boot, uint64(100+next), 1000, clock.Now().Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var retired int
		for _, i := range acked {
			rid := fmt.Sprintf("r-end-%d", i)
			if !st.Has(rid) {
				t.Fatalf("round %d: %s is unknown after a reopen", round, rid)
			}
			r, err := st.Reserve(rid, "d", "tenant-7", "chat", "", Units{"tokens": 10})
			if err != nil || !r.Replayed || r.ShardID != fmt.Sprintf("sh-end-%d", i) {
				t.Fatalf("round %d: retry of %s: %+v, %v", round, rid, r, err)
			}
			if r.Retired {
				retired++
			}
			if _, err := st.Reserve(rid, "other", "tenant-7", "chat", "", Units{"tokens": 10}); !errors.Is(err, ledger.ErrDigestMismatch) {
				t.Fatalf("round %d: retry of %s with another digest: %v", round, rid, err)
			}
			// A retried settle replays on a held shard, and is
			// ALREADY_SETTLED from a tombstone (as the ledger's).
			s, err := st.Settle(rid, "op-"+rid, Units{"tokens": 7})
			if r.Retired && !errors.Is(err, ledger.ErrReservationAlreadySettled) || !r.Retired && (err != nil || !s.Replayed) {
				t.Fatalf("round %d: retried settle of %s (retired %v): %+v, %v", round, rid, r.Retired, s, err)
			}
			if _, err := st.Install(signSubjectToken(fmt.Sprintf("sh-end-%d", i), "tenant-7", "gw-a", boot, uint64(100+next+1), 1000, clock.Now().Add(time.Hour)), testUnits, nil); !errors.Is(err, ledger.ErrShardIDReused) {
				t.Fatalf("round %d: shard sh-end-%d installed again: %v", round, i, err)
			}
		}
		if retired == 0 && round > 0 {
			t.Fatalf("round %d: no reservation was answered from a tombstone: nothing was compacted", round)
		}
		// Nothing of the retries was charged to the live shard.
		for _, sh := range st.Shards() {
			if sh.Shard.ID == live && sh.Available["tokens"] != 1000 {
				t.Fatalf("round %d: the live shard lost capacity to retries: %+v", round, sh)
			}
		}
		st.Close()
		t.Logf("round %d: %d acknowledged, %d from tombstones", round, len(acked), retired)
	}
}

// The fence records every compaction writes (one per subject key ever
// held, for good) count as what the log keeps when deciding to compact:
// a gateway that served many subjects once does not rewrite all their
// fences for each small shard that ends (so each rewrite is still paid
// for by as many bytes dropped, and the log stays under twice what it
// keeps, fences included, plus the threshold). It used to compact
// whenever an ended shard's records outweighed the live shards and
// tombstones alone, rewriting every fence record each time.
func TestShardStoreFencesCountAgainstCompaction(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now,
		TombstoneRetention: time.Minute, compactAt: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	end := func(i int) {
		t.Helper()
		id, rid := fmt.Sprintf("sh-%d", i), fmt.Sprintf("r-%d", i)
		subject := fmt.Sprintf("tenant-%d", i)
		steps := []func() error{
			func() error {
				_, err := st.Install(signSubjectToken(id, subject, "gw-a", st.BootEpoch(), 1, 1000, clock.Now().Add(time.Minute)), testUnits, nil)
				return err
			},
			func() error { _, err := st.Reserve(rid, "d", subject, "chat", "", Units{"tokens": 10}); return err },
			func() error { _, err := st.Release(rid); return err },
			func() error { st.Seal(id); _, _, err := st.BeginSubmission(id); return err },
			func() error { return st.FinishSubmission(id) },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("shard %s: %v", id, err)
			}
		}
	}
	for i := range 300 {
		end(i)
	}
	clock.Advance(2 * time.Minute) // every tombstone may be forgotten now
	end(300)                       // its compaction forgets them (those of shards it compacts stay)
	ended := logOps(t, dir)["ended"]
	if ended == 0 || ended > 100 {
		t.Fatalf("%d ended records, want the few of the shards compacted last", ended)
	}
	clock.Advance(2 * time.Minute)
	end(301) // a few KB dropped, against 301 fence records kept
	if ops := logOps(t, dir); ops["install"] != 1 || ops["ended"] != ended {
		t.Fatalf("the log holds %v: 300 fences were rewritten for one small shard that ended", ops)
	}
}

// A torn last record after a compaction (a write the crash cut short,
// never acknowledged) is dropped at open; the tombstones and fences the
// compaction wrote before it all hold.
func TestShardStoreTornRecordAfterCompaction(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, 1)
	if err := endShards(st, 0, 5); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if logOps(t, dir)["ended"] == 0 {
		t.Fatal("nothing was compacted")
	}
	whole, err := os.ReadFile(filepath.Join(dir, shardLogName))
	if err != nil {
		t.Fatal(err)
	}
	for name, torn := range map[string][]byte{
		"header cut":  {0, 0, 1},
		"payload cut": {0, 0, 0, 100, 1, 2, 3, 4, '{', '"', 'o'},
	} {
		if err := os.WriteFile(filepath.Join(dir, shardLogName), append(slices.Clone(whole), torn...), 0o600); err != nil {
			t.Fatal(err)
		}
		st := openCompactingStore(t, dir, clock, 1)
		for i := range 5 {
			rid := fmt.Sprintf("r-end-%d", i)
			if r, err := st.Reserve(rid, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || !r.Replayed || !st.Has(rid) {
				t.Fatalf("%s: retry of %s: %+v, %v", name, rid, r, err)
			}
		}
		if _, err := st.Install(signSubjectToken("sh-old", "tenant-7", "gw-a", st.BootEpoch(), 103, 1000, clock.Now().Add(time.Hour)), testUnits, nil); !errors.Is(err, ledger.ErrShardFenced) {
			t.Fatalf("%s: an older fence was installed: %v", name, err)
		}
		st.Close()
	}
}

// The truncation of a torn last record at open is fsynced before anything
// is appended: the log file is synced while it has the truncated length,
// before the boot record extends it. Otherwise a crash between the boot
// record's write and its sync could keep the write and lose the
// truncation, leaving the torn bytes in front of (or after) the boot
// record: a log that no longer opens. A real power cut cannot be staged
// here; this checks the sync the durability rests on, through the real
// os.File.Sync, observed by the store's sync hook.
func TestShardStoreTornRecordTruncationIsSynced(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, -1)
	if err := endShards(st, 0, 1); err != nil {
		t.Fatal(err)
	}
	st.Close()
	path := filepath.Join(dir, shardLogName)
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, torn := range map[string][]byte{
		"header cut":  {0, 0, 1},
		"payload cut": {0, 0, 0, 100, 1, 2, 3, 4, '{', '"', 'o'},
	} {
		if err := os.WriteFile(path, append(slices.Clone(whole), torn...), 0o600); err != nil {
			t.Fatal(err)
		}
		var synced []int64 // the log's size at each sync
		st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now, compactAt: -1,
			syncFile: func(f *os.File) error {
				if f.Name() != path {
					t.Errorf("%s: synced %s, want the log %s", name, f.Name(), path)
				}
				info, err := f.Stat()
				if err != nil {
					return err
				}
				synced = append(synced, info.Size())
				return f.Sync()
			}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		st.Close()
		if len(synced) == 0 || synced[0] != int64(len(whole)) {
			t.Fatalf("%s: the log was synced at sizes %v: want a first sync at the truncated size %d, before the boot record (the torn record was %d bytes)",
				name, synced, len(whole), len(torn))
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) <= len(whole) || !slices.Equal(after[:len(whole)], whole) {
			t.Fatalf("%s: the log after the open is not the old one and a boot record", name)
		}
		if ops := logOps(t, dir); ops["boot"] < 2 {
			t.Fatalf("%s: log records %v: the boot record after the truncation is unreadable", name, ops)
		}
		whole = after
	}
}
