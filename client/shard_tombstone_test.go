package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// logOps counts the records of a store's log by op.
func logOps(t *testing.T, dir string) map[string]int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, shardLogName))
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for len(data) >= 8 {
		n := int(uint32(data[0])<<24 | uint32(data[1])<<16 | uint32(data[2])<<8 | uint32(data[3]))
		var rec shardRecord
		if err := json.Unmarshal(data[8:8+n], &rec); err != nil {
			t.Fatal(err)
		}
		ops[rec.Op]++
		data = data[8+n:]
	}
	return ops
}

// A retry of a reservation id of a shard that ended and was compacted
// away is answered from its tombstone, as the ledger answers from its own
// (docs/CLIENTS.md, section 5): a Reserve with the same digest replays
// (Retired: no units), with another is a digest mismatch, and a settle,
// start or release gets the error of its terminal state; none of them
// admits or changes anything, though a live shard of the same subject
// has room. It holds in memory, after a reopen, and after a crash at
// each step of the compaction. It used to be unknown to the store once
// compacted: the retried Reserve was admitted again from the live shard
// (the capacity charged twice) and the settle was sent to the ledger,
// which answers NOT_FOUND.
func TestShardStoreRetryOfAnEndedShardsReservationIsNeverAdmittedAgain(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	st := openCompactingStore(t, dir, clock, -1) // compacted by hand below
	if err := endShards(st, 0, 3); err != nil {
		t.Fatal(err)
	}
	planned := planCompaction(t, st, clock.Now())
	before := copyLog(t, dir) // the log before the compaction
	st.mu.Lock()
	err := st.compact(planned.drop, planned.tail, clock.Now())
	st.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.Shards()); n != 0 {
		t.Fatalf("%d shards after the compaction, want 0", n)
	}

	check := func(name string, st *ShardStore) {
		t.Helper()
		if _, err := st.Install(signSubjectToken("sh-live-"+fmt.Sprint(st.BootEpoch()), "tenant-7", "gw-a", st.BootEpoch(), 1000, 1000, clock.Now().Add(time.Hour)), testUnits, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for i := range 3 {
			id := fmt.Sprintf("r-end-%d", i)
			if !st.Has(id) {
				t.Errorf("%s: Has(%s) false: its calls would go to the ledger", name, id)
			}
			r, err := st.Reserve(id, "d", "tenant-7", "chat", "", Units{"tokens": 10})
			if err != nil || !r.Replayed || !r.Retired || r.State != ledger.StateSettled || r.ShardID != fmt.Sprintf("sh-end-%d", i) {
				t.Errorf("%s: retried reserve of %s: %+v %v, want a retired replay, SETTLED, of its shard", name, id, r, err)
			}
			if _, err := st.Reserve(id, "other", "tenant-7", "chat", "", Units{"tokens": 10}); !errors.Is(err, ledger.ErrDigestMismatch) || !errors.Is(err, ledger.ErrReservationRetired) {
				t.Errorf("%s: reserve of %s with another digest: %v, want a retired digest mismatch", name, id, err)
			}
			if _, err := st.Settle(id, "op-"+id, Units{"tokens": 7}); !errors.Is(err, ledger.ErrReservationAlreadySettled) || !errors.Is(err, ledger.ErrReservationRetired) {
				t.Errorf("%s: retried settle of %s: %v, want already settled (retired)", name, id, err)
			}
			if _, err := st.Start(id, "op-"+id); !errors.Is(err, ledger.ErrReservationAlreadySettled) {
				t.Errorf("%s: start of %s: %v, want already settled", name, id, err)
			}
			if _, err := st.Release(id); !errors.Is(err, ledger.ErrReservationAlreadySettled) {
				t.Errorf("%s: release of %s: %v, want already settled", name, id, err)
			}
		}
		for _, status := range st.Shards() {
			if status.Available["tokens"]+status.Retired["tokens"] != 1000 {
				t.Fatalf("%s: shard %s admitted something: available %v, reserved %v, spent %v", name, status.Shard.ID, status.Available, status.Reserved, status.Spent)
			}
		}
	}
	check("in memory", st)
	st.Close()
	check("reopened", openCompactingStore(t, dir, clock, -1))

	// Killed during the compaction: the old log (its shards still held)
	// or the new one (their tombstones) answers the same.
	for name, leftover := range planned.interrupted {
		crashed := copyLog(t, before)
		if err := os.WriteFile(filepath.Join(crashed, shardLogCompacting), leftover, 0o600); err != nil {
			t.Fatal(err)
		}
		st := openCompactingStore(t, crashed, clock, -1)
		for i := range 3 {
			id := fmt.Sprintf("r-end-%d", i)
			if r, err := st.Reserve(id, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || !r.Replayed || r.State != ledger.StateSettled {
				t.Errorf("killed %s: retried reserve of %s: %+v %v", name, id, r, err)
			}
		}
		st.Close()
	}
	renamed := t.TempDir()
	if err := os.WriteFile(filepath.Join(renamed, shardLogName), planned.compacted, 0o600); err != nil {
		t.Fatal(err)
	}
	check("killed after the rename", openCompactingStore(t, renamed, clock, -1))
}

// The newest fence of a subject outlives the shard that carried it: after
// that shard ended and was compacted away, a reopened store still refuses
// an older fence for the subject, also once the shard's tombstones are
// forgotten, and each compaction writes one fence record per subject key
// in place of the previous ones (the log does not grow with compactions
// or boots). It used to be read from the shards' install records only,
// so the reopen forgot it.
func TestShardStoreFenceOfAnEndedShardSurvivesReopen(t *testing.T) {
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	open := func() *ShardStore {
		st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now,
			TombstoneRetention: time.Hour, compactAt: 1})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := open()
	if err := endShards(st, 0, 3); err != nil { // fences 100, 101, 102
		t.Fatal(err)
	}
	if n := len(st.Shards()); n != 0 {
		t.Fatalf("%d shards, want every one compacted away", n)
	}
	st.Close()
	refused := func(st *ShardStore, when string) {
		t.Helper()
		_, err := st.Install(signSubjectToken("sh-stale", "tenant-7", "gw-a", st.BootEpoch(), 101, 1000, clock.Now().Add(time.Hour)), testUnits, nil)
		if !errors.Is(err, ledger.ErrShardFenced) {
			t.Fatalf("%s: a shard with an older fence than the ended shard's: %v, want ErrShardFenced", when, err)
		}
	}
	st = open()
	refused(st, "reopened")
	// Past the tombstones' retention and the shards' expiry: a shard of
	// another subject ends, and the compaction forgets the old tombstones.
	clock.Advance(2 * time.Hour)
	if _, err := st.Install(signSubjectToken("sh-other", "tenant-9", "gw-a", st.BootEpoch(), 200, 1000, clock.Now().Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.BeginSubmission("sh-other"); err != nil {
		t.Fatal(err)
	}
	if err := st.FinishSubmission("sh-other"); err != nil {
		t.Fatal(err)
	}
	if st.Has("r-end-0") {
		t.Fatal("the tombstones past their retention were kept")
	}
	st.Close()
	for range 3 {
		st = open()
		refused(st, "reopened after the tombstones were forgotten")
		st.Close()
	}
	if ops := logOps(t, dir); ops["fence"] != 2 || ops["ended"] != 1 {
		t.Fatalf("log records %v: want 2 fence records (one per subject key) and the one ended shard not forgettable yet", ops)
	}
}

// What the store keeps of ended shards is bounded by their retention,
// whatever the number of boots: a gateway that ends shards in boot after
// boot keeps the tombstones of those that ended within the retention
// (their ids are answered, across reopens), forgets the older ones, and
// its log and memory stay bounded.
func TestShardStoreTombstonesAreForgottenAfterTheirRetention(t *testing.T) {
	const retention = 3 * time.Hour
	clock := &testClock{now: shardT0}
	dir := t.TempDir()
	open := func() *ShardStore {
		st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now,
			TombstoneRetention: retention, compactAt: 4 << 10})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	const boots, perBoot = 30, 5
	var largest int64
	for boot := range boots {
		st := open()
		if err := endShards(st, boot*perBoot, (boot+1)*perBoot); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		ended, retired := len(st.ended), len(st.retired)
		st.mu.Unlock()
		// The shards of the last retention (this boot's and the three
		// before), and at most the compaction's worth more.
		if ended > 5*perBoot || retired != ended {
			t.Fatalf("boot %d: %d ended shards and %d tombstones kept, want at most %d", boot, ended, retired, 5*perBoot)
		}
		checkLogBound(t, st, 4<<10)
		largest = max(largest, fileSize(t, filepath.Join(dir, shardLogName)))
		st.Close()
		st = open()
		for i := range (boot + 1) * perBoot {
			id := fmt.Sprintf("r-end-%d", i)
			endedAt := shardT0.Add(time.Duration(i/perBoot) * time.Hour)
			if clock.Now().Before(endedAt.Add(retention)) && !st.Has(id) {
				t.Fatalf("boot %d: %s, of a shard ended within the retention, is unknown after a reopen", boot, id)
			}
			if !clock.Now().Before(endedAt.Add(retention+2*time.Hour)) && st.Has(id) {
				t.Fatalf("boot %d: %s, of a shard ended %s ago, is still kept", boot, id, clock.Now().Sub(endedAt))
			}
		}
		st.Close()
		clock.Advance(time.Hour)
	}
	if largest > 24<<10 {
		t.Fatalf("the log reached %d bytes", largest)
	}
	t.Logf("largest log over %d boots: %d bytes", boots, largest)
}
