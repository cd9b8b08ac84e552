package client

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// signSubjectToken signs a shard of subject/chat on gateway/boot.
func signSubjectToken(id, subject, gateway string, boot, fence uint64, tokens int64, expires time.Time) []byte {
	s := &ledger.Shard{
		ID:        id,
		Account:   ledger.AccountKey{Subject: subject, Route: "chat", Region: "global", Generation: 1},
		GatewayID: gateway, BootEpoch: boot, Fence: fence, Allocated: ledger.Amounts{tokens, 10},
		IssuedAt: shardT0, ExpiresAt: expires, KeyID: "k1",
	}
	s.Signature = ed25519.Sign(testShardKey, ledger.ShardCanonical(s))
	return ledger.EncodeShardToken(s)
}

func openCompactingStore(t *testing.T, dir string, clock *testClock, compactAt int64) *ShardStore {
	t.Helper()
	st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now, compactAt: compactAt})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// endShards installs shards from..to-1 of tenant-7 (fence 100+i), serves
// one request from each and reconciles it fully: they end.
func endShards(st *ShardStore, from, to int) error {
	for i := from; i < to; i++ {
		id := fmt.Sprintf("sh-end-%d", i)
		rid := fmt.Sprintf("r-end-%d", i)
		steps := []func() error{
			func() error {
				_, err := st.Install(signSubjectToken(id, "tenant-7", "gw-a", st.BootEpoch(), uint64(100+i), 1000, st.clock().Add(time.Hour)), testUnits, nil)
				return err
			},
			func() error { _, err := st.Reserve(rid, "d", "tenant-7", "chat", "", Units{"tokens": 10}); return err },
			func() error { _, err := st.Start(rid, "op-"+rid); return err },
			func() error { _, err := st.Settle(rid, "op-"+rid, Units{"tokens": 7}); return err },
			func() error { _, _, err := st.BeginSubmission(id); return err },
			func() error { return st.FinishSubmission(id) },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return fmt.Errorf("shard %s: %w", id, err)
			}
		}
	}
	return nil
}

// keptState renders the shards that have not ended (with their receipts)
// for comparison.
func keptState(t *testing.T, st *ShardStore) string {
	t.Helper()
	var b strings.Builder
	for _, status := range st.Shards() {
		if status.Sealed && status.Submitted && status.Pending == 0 {
			continue
		}
		status.Token, status.Shard.Signature = nil, nil // in the shard's fields already
		receipts, err := st.Receipts(status.Shard.ID)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%+v\n%+v\n", status, receipts)
	}
	return b.String()
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

// The same history goes to a store that compacts (at 16 KiB of ended
// shards' records) and one that never does. The shards that have not
// ended — one still admitting, one inherited from an earlier boot with
// work started and unknown, one sealed by the newer fence of a shard that
// ended since, with its work still started — read the same from both, in
// memory and after every reopen; the ended ones leave the compacting
// store; and its log stays within twice its kept shards' records plus
// the threshold, while the other's grows with every shard.
func TestShardStoreCompactionKeepsWhatIsLiveAndBoundsTheLog(t *testing.T) {
	const compactAt = 16 << 10
	clock := &testClock{now: shardT0}
	compacting, reference := t.TempDir(), t.TempDir()
	both := func(do func(st *ShardStore)) {
		t.Helper()
		var inMemory []string
		var inMemoryIDs string
		for _, dir := range []string{compacting, reference} {
			at := int64(compactAt)
			if dir == reference {
				at = -1
			}
			st := openCompactingStore(t, dir, clock, at)
			do(st)
			if dir == compacting {
				checkLogBound(t, st, compactAt)
			}
			inMemory = append(inMemory, keptState(t, st))
			if dir == compacting {
				inMemoryIDs = shardIDs(st)
			}
			st.Close()
		}
		if inMemory[0] != inMemory[1] {
			t.Fatalf("in memory, the kept shards differ:\ncompacted:\n%s\nnever compacted:\n%s", inMemory[0], inMemory[1])
		}
		reopened := openAndClose(t, compacting, clock)
		if a, b := shardIDs(reopened), inMemoryIDs; a != b {
			t.Fatalf("the compacting store held shards %s in memory, its log %s", b, a)
		}
		if a, b := keptState(t, reopened), keptState(t, openAndClose(t, reference, clock)); a != b {
			t.Fatalf("reopened, the kept shards differ:\ncompacted:\n%s\nnever compacted:\n%s", a, b)
		}
	}
	must := func(_ *LocalReceipt, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	both(func(st *ShardStore) {
		boot := st.BootEpoch()
		if _, err := st.Install(signSubjectToken("sh-live", "tenant-live", "gw-a", boot, 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatal(err)
		}
		must(st.Reserve("l1", "d", "tenant-live", "chat", "", Units{"tokens": 50}))
		must(st.Start("l1", "op-l1"))
		must(st.Settle("l1", "op-l1", Units{"tokens": 20}))
		must(st.Reserve("l2", "d", "tenant-live", "chat", "", Units{"tokens": 50}))
		must(st.Start("l2", "op-l2"))
		must(st.Reserve("l3", "d", "tenant-live", "chat", "", Units{"tokens": 50}))
		if _, err := st.Install(signSubjectToken("sh-old", "tenant-7", "gw-a", boot, 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatal(err)
		}
		must(st.Reserve("o1", "d", "tenant-7", "chat", "", Units{"tokens": 30}))
		must(st.Start("o1", "op-o1"))
		if err := endShards(st, 0, 30); err != nil { // the first seals sh-old: o1 stays STARTED
			t.Fatal(err)
		}
	})
	// Restarts with nothing in between: a run of boot records.
	both(func(*ShardStore) {})
	both(func(*ShardStore) {})
	both(func(st *ShardStore) {
		if _, err := st.Install(signSubjectToken("sh-live2", "tenant-live", "gw-a", st.BootEpoch(), 2, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatal(err)
		}
		must(st.Reserve("l4", "d", "tenant-live", "chat", "", Units{"tokens": 40}))
		if err := endShards(st, 30, 60); err != nil {
			t.Fatal(err)
		}
		must(st.Settle("l2", "op-l2", Units{"tokens": 45})) // inherited, unknown: resolved locally
		if err := endShards(st, 60, 90); err != nil {
			t.Fatal(err)
		}
	})

	// The compacting store dropped the ended shards, and its log is a
	// fraction of the other's (the ended shards' tombstones, about 0.2 KB
	// each here, are most of what is left: they go once past their
	// retention, TestShardStoreTombstonesAreForgottenAfterTheirRetention).
	st := openCompactingStore(t, compacting, clock, compactAt)
	if n := len(st.Shards()); n >= 30 {
		t.Fatalf("compacting store still holds %d shards", n)
	}
	if !st.Has("l1") || !st.Has("o1") || !st.Has("r-end-0") {
		t.Fatalf("reservations after compaction: l1 %v o1 %v r-end-0 %v", st.Has("l1"), st.Has("o1"), st.Has("r-end-0"))
	}
	// An ended shard's reservation is its tombstone now.
	if r, err := st.Reserve("r-end-0", "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || !r.Retired || !r.Replayed {
		t.Fatalf("retry of an ended shard's reservation: %+v %v, want a retired replay", r, err)
	}
	st.Close()
	small, large := fileSize(t, filepath.Join(compacting, shardLogName)), fileSize(t, filepath.Join(reference, shardLogName))
	if small*2 > large {
		t.Fatalf("compacted log %d bytes, never compacted %d", small, large)
	}
	t.Logf("log after 90 ended shards: %d bytes compacted, %d not", small, large)
}

func openAndClose(t *testing.T, dir string, clock *testClock) *ShardStore {
	t.Helper()
	st := openCompactingStore(t, dir, clock, -1)
	st.Close()
	return st
}

func shardIDs(st *ShardStore) string {
	var ids []string
	for _, status := range st.Shards() {
		ids = append(ids, status.Shard.ID)
	}
	return strings.Join(ids, " ")
}

// allState renders every shard of the store with its receipts.
func allState(t *testing.T, st *ShardStore) string {
	t.Helper()
	var b strings.Builder
	for _, status := range st.Shards() {
		status.Token, status.Shard.Signature = nil, nil
		receipts, err := st.Receipts(status.Shard.ID)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%+v\n%+v\n", status, receipts)
	}
	return b.String()
}

// copyLog makes a new store directory holding the log of dir.
func copyLog(t *testing.T, dir string) string {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(dir, shardLogName))
	if err != nil {
		t.Fatal(err)
	}
	copied := t.TempDir()
	if err := os.WriteFile(filepath.Join(copied, shardLogName), log, 0o600); err != nil {
		t.Fatal(err)
	}
	return copied
}

// plannedCompaction is a compaction of st's log at now, planned and
// written once to a copy of the log (st and its log are left as they
// are): its plan, the new log it writes, and what a kill during it leaves
// of the new log, by the step the kill struck at.
type plannedCompaction struct {
	drop        map[string]bool
	tail        []*shardRecord
	compacted   []byte
	interrupted map[string][]byte
}

func planCompaction(t *testing.T, st *ShardStore, now time.Time) plannedCompaction {
	t.Helper()
	st.mu.Lock()
	drop, tail, _, _ := st.compactionPlan(now)
	st.mu.Unlock()
	scratch := copyLog(t, st.dir)
	if _, err := writeCompacted(filepath.Join(scratch, shardLogName), filepath.Join(scratch, shardLogCompacting), drop, tail, (*os.File).Sync); err != nil {
		t.Fatal(err)
	}
	compacted, err := os.ReadFile(filepath.Join(scratch, shardLogCompacting))
	if err != nil {
		t.Fatal(err)
	}
	return plannedCompaction{drop: drop, tail: tail, compacted: compacted, interrupted: map[string][]byte{
		"while writing the new log":         compacted[:len(compacted)/2],
		"after syncing it, before renaming": compacted,
	}}
}

// A compaction is crash-safe at every step. Killed while it writes the
// new log, or after it synced it but before the rename, the old log is
// whole and is the store: the new one is removed at open and the store
// reads exactly as without it. Killed after the rename (synced or not),
// the new log is whole and holds every shard that has not ended as the
// old one did.
func TestShardStoreCompactionInterruptedAtEveryStep(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, -1)
	if _, err := st.Install(signSubjectToken("sh-live", "tenant-live", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"l1", "l2"} {
		if _, err := st.Reserve(id, "d", "tenant-live", "chat", "", Units{"tokens": 50}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Start(id, "op-"+id); err != nil {
			t.Fatal(err)
		}
	}
	if err := endShards(st, 0, 20); err != nil {
		t.Fatal(err)
	}
	planned := planCompaction(t, st, clock.Now())
	st.Close()

	reopen := func(dir string) string {
		st := openCompactingStore(t, dir, clock, -1)
		defer st.Close()
		return allState(t, st)
	}
	want := reopen(copyLog(t, dir))
	for name, leftover := range planned.interrupted {
		crashed := copyLog(t, dir)
		if err := os.WriteFile(filepath.Join(crashed, shardLogCompacting), leftover, 0o600); err != nil {
			t.Fatal(err)
		}
		if got := reopen(crashed); got != want {
			t.Fatalf("killed %s: the store reads\n%s\nwant\n%s", name, got, want)
		}
		if _, err := os.Stat(filepath.Join(crashed, shardLogCompacting)); !os.IsNotExist(err) {
			t.Fatalf("killed %s: the unfinished new log is still there (%v)", name, err)
		}
	}
	renamed := t.TempDir()
	if err := os.WriteFile(filepath.Join(renamed, shardLogName), planned.compacted, 0o600); err != nil {
		t.Fatal(err)
	}
	st = openCompactingStore(t, renamed, clock, -1)
	got := keptState(t, st)
	st.Close()
	st = openCompactingStore(t, copyLog(t, dir), clock, -1)
	wantKept := keptState(t, st)
	st.Close()
	if got != wantKept || !strings.Contains(got, "sh-live") {
		t.Fatalf("killed after the rename: the new log reads\n%s\nwant\n%s", got, wantKept)
	}
}

// A compaction that fails before its rename (here: the new log cannot be
// created) leaves the store working on its old log, and it is tried again
// at the next shard that ends.
func TestShardStoreCompactionFailureLeavesTheStoreWorking(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, 4<<10)
	defer st.Close()
	blocker := filepath.Join(dir, shardLogCompacting)
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := endShards(st, 0, 20); err != nil {
		t.Fatalf("with compaction failing: %v", err)
	}
	if n := len(st.Shards()); n != 20 {
		t.Fatalf("%d shards, want all 20 (nothing compacted)", n)
	}
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	if err := endShards(st, 20, 21); err != nil {
		t.Fatal(err)
	}
	if n := len(st.Shards()); n != 0 {
		t.Fatalf("%d shards after the next one ended, want 0 (compacted)", n)
	}
	if _, err := st.Install(signSubjectToken("sh-new", "tenant-live", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("n1", "d", "tenant-live", "chat", "", Units{"tokens": 5}); err != nil {
		t.Fatal(err)
	}
}

// Compactions run while other goroutines admit from a live shard and read
// the store (go test -race): every local reservation lands once, every
// shard conserves, and the log reopens to the same receipts.
func TestShardStoreCompactionUnderConcurrentUse(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, 4<<10)
	if _, err := st.Install(signSubjectToken("sh-live", "tenant-live", "gw-a", st.BootEpoch(), 1, 100_000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	const requests, shards = 50, 100
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	wg.Add(3)
	go func() {
		defer wg.Done()
		errs <- endShards(st, 0, shards)
	}()
	go func() {
		defer wg.Done()
		for i := range requests {
			id := fmt.Sprintf("l%d", i)
			if _, err := st.Reserve(id, "d", "tenant-live", "chat", "", Units{"tokens": 10}); err != nil {
				errs <- err
				return
			}
			if _, err := st.Start(id, "op-"+id); err != nil {
				errs <- err
				return
			}
			if _, err := st.Settle(id, "op-"+id, Units{"tokens": 3}); err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range 300 {
			for _, status := range st.Shards() {
				if status.Conservation != nil {
					errs <- status.Conservation
					return
				}
				st.Receipts(status.Shard.ID)
			}
			st.Has("l1")
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := len(st.Shards()); n > shards/2 {
		t.Fatalf("%d shards held: the ended ones were not compacted away", n)
	}
	checkLogBound(t, st, 4<<10)
	before, err := st.Receipts("sh-live")
	if err != nil || len(before) != requests {
		t.Fatalf("%d receipts of sh-live, want %d (%v)", len(before), requests, err)
	}
	st.Close()
	st = openCompactingStore(t, dir, clock, -1)
	defer st.Close()
	after, err := st.Receipts("sh-live")
	if err != nil || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("reopened, sh-live's receipts differ (%v):\n%v\nwant\n%v", err, after, before)
	}
}

// checkLogBound fails when the store's log is over twice its kept shards'
// records and its tombstones not yet forgettable plus the compaction
// threshold (and a little for boot and fence records).
func checkLogBound(t *testing.T, st *ShardStore, compactAt int64) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	size, kept := fileSize(t, filepath.Join(st.dir, shardLogName)), int64(0)
	for id, sh := range st.shards {
		if !sh.ended() {
			kept += st.logBytes[id]
		}
	}
	now := st.clock()
	for id, e := range st.ended {
		if !e.forgettable(now, st.tombstoneRetention) {
			kept += st.logBytes[id]
		}
	}
	if bound := 2*kept + compactAt + 4096; size > bound {
		t.Fatalf("log is %d bytes, over %d (kept shards' records %d)", size, bound, kept)
	}
}
