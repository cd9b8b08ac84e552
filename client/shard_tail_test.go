package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A crash after a record's write but before its fsync can leave, on ext4
// with data=writeback or on XFS, a file that grew over the record while
// its bytes stayed zero. That record was never acknowledged: the open
// drops the zeros as it drops a torn record (truncated and synced before
// the boot record), whatever their length, and keeps every complete
// record. Zeros followed by a record again are damage in the middle of
// the log, not a tail: the open refuses (ErrShardStoreCorrupt), saying
// where. Zeros of 8 bytes or more used to read as an empty record and
// refuse the whole log as corrupt.
func TestShardStoreZeroFilledTail(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, -1)
	if err := endShards(st, 0, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Install(signSubjectToken("sh-live", "tenant-live", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("l1", "d", "tenant-live", "chat", "", Units{"tokens": 50}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	path := filepath.Join(dir, shardLogName)
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The log's last record, to write again after zeros.
	last := lastRecord(t, whole)

	for _, zeros := range []int{1, 7, 8, 9, 64, 511, 4096, 70000} {
		name := fmt.Sprintf("%d zero bytes", zeros)
		if err := os.WriteFile(path, append(slices.Clone(whole), make([]byte, zeros)...), 0o600); err != nil {
			t.Fatal(err)
		}
		var synced []int64
		st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now, compactAt: -1,
			syncFile: func(f *os.File) error {
				info, err := f.Stat()
				if err != nil {
					return err
				}
				synced = append(synced, info.Size())
				return f.Sync()
			}})
		if err != nil {
			t.Fatalf("%s after the log: %v", name, err)
		}
		got := allState(t, st)
		for i := range 3 {
			rid := fmt.Sprintf("r-end-%d", i)
			if r, err := st.Reserve(rid, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || !r.Replayed {
				t.Fatalf("%s: retry of %s: %+v, %v", name, rid, r, err)
			}
		}
		st.Close()
		// The inherited shards are sealed by the new boot; compare what
		// a reopen of the undamaged log reads.
		clean := t.TempDir()
		if err := os.WriteFile(filepath.Join(clean, shardLogName), whole, 0o600); err != nil {
			t.Fatal(err)
		}
		ref := openCompactingStore(t, clean, clock, -1)
		wantNow := allState(t, ref)
		ref.Close()
		if got != wantNow || !strings.Contains(got, "sh-live") {
			t.Fatalf("%s: the store reads\n%s\nwant\n%s", name, got, wantNow)
		}
		if len(synced) == 0 || synced[0] != int64(len(whole)) {
			t.Fatalf("%s: synced at sizes %v, want a first sync at the truncated size %d", name, synced, len(whole))
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(after[:len(whole)], whole) || logOps(t, dir)["boot"] != logOpsOf(t, whole)["boot"]+1 {
			t.Fatalf("%s: the log after the open is not the old one and a boot record", name)
		}
		if err := os.WriteFile(path, whole, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// Zeros with a record after them are not a tail, also when the
	// record lies beyond the first read of the zeros (70000 > 64 KiB).
	for _, zeros := range []int{8, 4096, 70000} {
		damaged := append(append(slices.Clone(whole), make([]byte, zeros)...), last...)
		if err := os.WriteFile(path, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now, compactAt: -1})
		if !errors.Is(err, ErrShardStoreCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", len(whole))) {
			t.Fatalf("%d zero bytes then a record: %v, want ErrShardStoreCorrupt at offset %d", zeros, err, len(whole))
		}
		if after, _ := os.ReadFile(path); !slices.Equal(after, damaged) {
			t.Fatalf("%d zero bytes then a record: the refused log was changed", zeros)
		}
	}
}

// lastRecord returns the last record (header and payload) of a log.
func lastRecord(t *testing.T, log []byte) []byte {
	t.Helper()
	var last []byte
	for len(log) >= 8 {
		n := 8 + int(uint32(log[0])<<24|uint32(log[1])<<16|uint32(log[2])<<8|uint32(log[3]))
		last, log = log[:n], log[n:]
	}
	if len(log) != 0 || last == nil {
		t.Fatal("not a whole log")
	}
	return slices.Clone(last)
}

// logOpsOf counts the records of log by op.
func logOpsOf(t *testing.T, log []byte) map[string]int {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, shardLogName), log, 0o600); err != nil {
		t.Fatal(err)
	}
	return logOps(t, dir)
}

// A compaction's syncs (of the new log, then of the directory after the
// rename) go through the store's sync hook, as the log's own do, so a
// fault injected there reaches them. A failed sync of the new log comes
// back as compact's error and leaves the old log the store, byte for
// byte, readable, with nothing acknowledged lost; the store goes on
// working on it. A failed sync of the directory (the old log already
// renamed away) comes back too and breaks the store, whose log then
// reopens with every record that was acknowledged. The compaction used
// to call Sync itself, out of the hook's reach.
func TestShardStoreCompactionSyncFailure(t *testing.T) {
	injected := errors.New("injected sync failure")
	for _, target := range []string{"new log", "directory"} {
		clock := &testClock{now: shardT0}
		dir := t.TempDir()
		var fail string // the file whose next sync fails
		var syncs []string
		st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now, compactAt: -1,
			syncFile: func(f *os.File) error {
				syncs = append(syncs, filepath.Base(f.Name()))
				if f.Name() == fail {
					return injected
				}
				return f.Sync()
			}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Install(signSubjectToken("sh-live", "tenant-live", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Reserve("l1", "d", "tenant-live", "chat", "", Units{"tokens": 50}); err != nil {
			t.Fatal(err)
		}
		if err := endShards(st, 0, 10); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, shardLogName)
		before, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if target == "new log" {
			fail = filepath.Join(dir, shardLogCompacting)
		} else {
			fail = dir
		}
		syncs = nil
		st.mu.Lock()
		drop, tail, _, _ := st.compactionPlan(clock.Now())
		err = st.compact(drop, tail, clock.Now())
		broken := st.broken
		st.mu.Unlock()
		if !errors.Is(err, injected) {
			t.Fatalf("%s: compact returned %v, want the injected sync failure (syncs seen: %v)", target, err, syncs)
		}
		if _, err := os.Stat(filepath.Join(dir, shardLogCompacting)); !os.IsNotExist(err) {
			t.Fatalf("%s: the unfinished new log is left (%v)", target, err)
		}
		if target == "new log" {
			if broken != nil {
				t.Fatalf("%s: the store broke (%v), though its old log is whole", target, broken)
			}
			if after, _ := os.ReadFile(path); !slices.Equal(after, before) {
				t.Fatalf("%s: the old log changed", target)
			}
			if _, err := st.Reserve("l2", "d", "tenant-live", "chat", "", Units{"tokens": 5}); err != nil {
				t.Fatalf("%s: the store stopped working: %v", target, err)
			}
		} else {
			if _, err := st.Reserve("l2", "d", "tenant-live", "chat", "", Units{"tokens": 5}); !errors.Is(err, ErrShardStoreBroken) {
				t.Fatalf("%s: a reserve after the failed directory sync: %v, want ErrShardStoreBroken", target, err)
			}
		}
		st.Close()
		st = openCompactingStore(t, dir, clock, -1)
		for i := range 10 {
			rid := fmt.Sprintf("r-end-%d", i)
			if r, err := st.Reserve(rid, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || !r.Replayed {
				t.Fatalf("%s: after a reopen, retry of %s: %+v, %v", target, rid, r, err)
			}
		}
		receipts, err := st.Receipts("sh-live")
		if err != nil || len(receipts) == 0 || receipts[0].ReservationID != "l1" {
			t.Fatalf("%s: after a reopen, sh-live's receipts: %+v, %v", target, receipts, err)
		}
		st.Close()
	}
}

// Each open appends a boot record; a store restarted over and over
// without a shard ending still compacts once the boot records a
// compaction merges (each run of them with nothing between keeps one)
// reach the threshold and outweigh what the log keeps, so its log does
// not grow with restarts. The boot epoch still grows at every open (a
// merged run keeps its last), and a shard inherited from the first boot,
// with work started, reads the same after every restart (a merged run
// keeps its first time, when that boot sealed the shards before it). The
// boot records used to pile up until a shard ended.
func TestShardStoreRestartsDoNotGrowTheLog(t *testing.T) {
	const compactAt = 4 << 10
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, compactAt)
	if _, err := st.Install(signSubjectToken("sh-held", "tenant-held", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"h1", "h2"} {
		if _, err := st.Reserve(id, "d", "tenant-held", "chat", "", Units{"tokens": 50}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Start("h1", "op-h1"); err != nil {
		t.Fatal(err)
	}
	boot := st.BootEpoch()
	st.Close()
	path := filepath.Join(dir, shardLogName)
	var want string
	var largest int64
	maxBoots := 0
	for i := range 200 {
		clock.Advance(time.Second)
		st := openCompactingStore(t, dir, clock, compactAt)
		if st.BootEpoch() <= boot {
			t.Fatalf("open %d: boot epoch %d after %d", i, st.BootEpoch(), boot)
		}
		boot = st.BootEpoch()
		got := allState(t, st)
		st.Close()
		if i == 0 {
			want = got
		} else if got != want {
			t.Fatalf("open %d: the store reads\n%s\nwant, as after the first restart,\n%s", i, got, want)
		}
		largest = max(largest, fileSize(t, path))
		maxBoots = max(maxBoots, logOps(t, dir)["boot"])
	}
	// A boot record here is under 100 bytes: the log holds at most the
	// threshold of them, and the held shard's records and its fence.
	kept := int64(2 << 10)
	if largest > kept+compactAt+200 || maxBoots > compactAt/70+2 {
		t.Fatalf("over 200 restarts the log reached %d bytes and %d boot records (threshold %d)", largest, maxBoots, compactAt)
	}
	t.Logf("over 200 restarts: at most %d bytes, %d boot records", largest, maxBoots)
}
