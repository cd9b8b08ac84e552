package client

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

var (
	testShardKey  = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	testShardRing = ledger.ShardKeyRing{"k1": testShardKey.Public().(ed25519.PublicKey)}
	shardT0       = time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
)

// testClock is a settable clock for the store.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// signToken signs a shard of tenant-7/chat on gateway/boot as the ledger
// would (tokens, requests).
func signToken(id, gateway string, boot, fence uint64, tokens int64, expires time.Time) []byte {
	s := &ledger.Shard{
		ID:        id,
		Account:   ledger.AccountKey{Subject: "tenant-7", Route: "chat", Region: "global", Generation: 1},
		GatewayID: gateway, BootEpoch: boot, Fence: fence, Allocated: ledger.Amounts{tokens, 10},
		IssuedAt: shardT0, ExpiresAt: expires, KeyID: "k1",
	}
	s.Signature = ed25519.Sign(testShardKey, ledger.ShardCanonical(s))
	return ledger.EncodeShardToken(s)
}

var testUnits = []string{"tokens", "requests"}

func openTestStore(t *testing.T, dir, gateway string, clock *testClock) *ShardStore {
	t.Helper()
	st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: gateway, Keys: testShardRing, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestShardStoreInstallRefusals(t *testing.T) {
	clock := &testClock{now: shardT0}
	st := openTestStore(t, t.TempDir(), "gw-a", clock)
	defer st.Close()
	boot := st.BootEpoch()
	exp := shardT0.Add(time.Minute)
	good := signToken("sh-1", "gw-a", boot, 5, 100, exp)
	// The gateway doubles its own allocation without re-signing.
	forged, _ := ledger.DecodeShardToken(good)
	forged.Allocated[0] *= 2
	tampered := ledger.EncodeShardToken(forged)

	cases := []struct {
		name  string
		token []byte
		want  error
	}{
		{"another gateway", signToken("sh-x", "gw-b", boot, 5, 100, exp), ledger.ErrShardForeign},
		{"another boot", signToken("sh-x", "gw-a", boot-1, 5, 100, exp), ledger.ErrShardBootEpoch},
		{"tampered", tampered, ledger.ErrShardSignature},
		{"expired", signToken("sh-x", "gw-a", boot, 5, 100, shardT0), ledger.ErrShardExpired},
		{"garbage", []byte("not a shard"), ledger.ErrShardMalformed},
	}
	for _, tc := range cases {
		if _, err := st.Install(tc.token, testUnits, nil); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := st.Install(good, testUnits, ledger.ShardKeyRing{}); !errors.Is(err, ledger.ErrShardUnknownKey) {
		t.Errorf("unknown key: %v", err)
	}
	if _, err := st.Install(good, testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Install(good, testUnits, nil); !errors.Is(err, ledger.ErrShardIDReused) {
		t.Errorf("installed twice: %v", err)
	}
	if _, err := st.Install(signToken("sh-old", "gw-a", boot, 4, 100, exp), testUnits, nil); !errors.Is(err, ledger.ErrShardFenced) {
		t.Errorf("older fence: %v", err)
	}
	if len(st.Shards()) != 1 {
		t.Fatalf("refused shards were kept: %d", len(st.Shards()))
	}
}

func TestShardStoreLocalLedgerAndRestart(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: shardT0}
	st := openTestStore(t, dir, "gw-a", clock)
	boot := st.BootEpoch()
	if _, err := st.Install(signToken("sh-1", "gw-a", boot, 1, 300, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	must := func(r *LocalReceipt, err error) *LocalReceipt {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Shards() {
			if s.Conservation != nil {
				t.Fatal(s.Conservation)
			}
		}
		return r
	}
	must(st.Reserve("r1", "d1", "tenant-7", "chat", "", Units{"tokens": 100, "requests": 1}))
	must(st.Start("r1", "op1"))
	settled := must(st.Settle("r1", "op1", Units{"tokens": 40, "requests": 1}))
	if settled.Refunded["tokens"] != 60 || settled.State != ledger.StateSettled {
		t.Fatalf("settle: %+v", settled)
	}
	must(st.Reserve("r2", "d2", "tenant-7", "chat", "global", Units{"tokens": 200}))
	must(st.Start("r2", "op2")) // in flight when the process dies
	must(st.Reserve("r3", "d3", "tenant-7", "chat", "", Units{"tokens": 50}))
	// The bound holds: 300 - 40 - 200 - 50 = 10 left.
	// The error names the unit as the caller wrote it, not its index.
	if _, err := st.Reserve("r4", "d4", "tenant-7", "chat", "", Units{"tokens": 11}); !errors.Is(err, ledger.ErrInsufficientCapacity) ||
		!strings.Contains(err.Error(), `"tokens"`) {
		t.Fatalf("beyond the shard: %v, want it to name \"tokens\"", err)
	}
	if _, err := st.Reserve("r5", "d5", "tenant-9", "chat", "", Units{"tokens": 1}); !errors.Is(err, ErrNoShard) {
		t.Fatalf("subject without a shard: %v", err)
	}
	if _, err := st.Reserve("r6", "d6", "tenant-7", "chat", "", Units{"dollars": 1}); !errors.Is(err, ledger.ErrInvalidCommand) {
		t.Fatalf("unknown unit: %v", err)
	}
	if r := must(st.Reserve("r1", "d1", "tenant-7", "chat", "", Units{"tokens": 100, "requests": 1})); !r.Replayed {
		t.Fatal("a repeated reserve was not a replay")
	}
	before := st.Shards()[0]
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	// A new process: new boot epoch, the old shard is inherited and never
	// spent again, but its receipts are all there.
	clock.Advance(time.Minute)
	st = openTestStore(t, dir, "gw-a", clock)
	defer st.Close()
	if st.BootEpoch() <= boot {
		t.Fatalf("boot epoch %d after %d", st.BootEpoch(), boot)
	}
	after := st.Shards()[0]
	if !after.Sealed || after.Live || after.Spent["tokens"] != before.Spent["tokens"] || after.Conservation != nil {
		t.Fatalf("inherited shard: %+v (before %+v)", after, before)
	}
	if _, err := st.Reserve("r7", "d7", "tenant-7", "chat", "", Units{"tokens": 1}); !errors.Is(err, ErrNoShard) {
		t.Fatalf("spent an inherited shard: %v", err)
	}
	// Replaying the old token into the new process is refused.
	if _, err := st.Install(signToken("sh-1b", "gw-a", boot, 2, 300, shardT0.Add(time.Hour)), testUnits, nil); !errors.Is(err, ledger.ErrShardBootEpoch) {
		t.Fatalf("old boot's shard installed: %v", err)
	}
	receipts, err := st.Receipts("sh-1")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]ledger.State{}
	for _, r := range receipts {
		states[r.ReservationID] = r.State
	}
	if states["r1"] != ledger.StateSettled || states["r2"] != ledger.StateUsageUnknown || states["r3"] != ledger.StateReleased {
		t.Fatalf("receipts after restart: %v", states)
	}
	sub, ok, err := st.BeginSubmission("sh-1")
	if err != nil || !ok || len(sub.Receipts) != 3 {
		t.Fatalf("submission: %v %v %+v", ok, err, sub)
	}
	// The work of r2 finishes after all, reported by the operation
	// receipt: allowed on the inherited shard.
	must(st.Settle("r2", "op2", Units{"tokens": 150}))
}

func TestShardStoreSubmissionSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: shardT0}
	st := openTestStore(t, dir, "gw-a", clock)
	if _, err := st.Install(signToken("sh-1", "gw-a", st.BootEpoch(), 1, 300, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	st.Reserve("r1", "d1", "tenant-7", "chat", "", Units{"tokens": 100})
	st.Start("r1", "op1")
	first, ok, err := st.BeginSubmission("sh-1")
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	// r1 settles after the submission was logged but before its answer
	// came: the retry must still send what was logged.
	if _, err := st.Settle("r1", "op1", Units{"tokens": 30}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTestStore(t, dir, "gw-a", clock)
	defer st.Close()
	again, ok, err := st.BeginSubmission("sh-1")
	if err != nil || !ok || len(again.Receipts) != 1 || again.Receipts[0] != first.Receipts[0] || again.Receipts[0].State != ledger.StateStarted {
		t.Fatalf("resumed submission %+v, first %+v (%v %v)", again, first, ok, err)
	}
	if err := st.FinishSubmission("sh-1"); err != nil {
		t.Fatal(err)
	}
	// Now the settled r1 is due as a late receipt.
	late, ok, err := st.BeginSubmission("sh-1")
	if err != nil || !ok || len(late.Receipts) != 1 || late.Receipts[0].State != ledger.StateSettled || late.Receipts[0].Actual[0] != 30 {
		t.Fatalf("late submission: %+v %v %v", late, ok, err)
	}
	if err := st.FinishSubmission("sh-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := st.BeginSubmission("sh-1"); ok {
		t.Fatal("a fully reported shard still has a submission")
	}
	status := st.Shards()[0]
	if !status.Submitted || status.Pending != 0 {
		t.Fatalf("status: %+v", status)
	}
}

func TestShardStoreExpiryAndFence(t *testing.T) {
	clock := &testClock{now: shardT0}
	st := openTestStore(t, t.TempDir(), "gw-a", clock)
	defer st.Close()
	boot := st.BootEpoch()
	if _, err := st.Install(signToken("sh-1", "gw-a", boot, 1, 100, shardT0.Add(time.Minute)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("r1", "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if _, err := st.Reserve("r2", "d", "tenant-7", "chat", "", Units{"tokens": 10}); !errors.Is(err, ledger.ErrShardExpired) {
		t.Fatalf("reserve after expiry: %v", err)
	}
	if _, err := st.Start("r1", "op"); !errors.Is(err, ledger.ErrShardExpired) {
		t.Fatalf("start after expiry: %v", err)
	}
	// A newer shard for the subject fences the old one.
	if _, err := st.Install(signToken("sh-2", "gw-a", boot, 2, 50, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	shards := st.Shards()
	if !shards[0].Sealed || !shards[1].Live {
		t.Fatalf("after a newer fence: old sealed %v, new live %v", shards[0].Sealed, shards[1].Live)
	}
	if r, err := st.Reserve("r3", "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil || r.ShardID != "sh-2" {
		t.Fatalf("reserve from the new shard: %+v %v", r, err)
	}
}

func TestShardStoreLogDamage(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: shardT0}
	st := openTestStore(t, dir, "gw-a", clock)
	if _, err := st.Install(signToken("sh-1", "gw-a", st.BootEpoch(), 1, 100, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	st.Reserve("r1", "d", "tenant-7", "chat", "", Units{"tokens": 10})
	// Another process may not open the directory meanwhile.
	if _, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Clock: clock.Now}); !errors.Is(err, ErrShardStoreLocked) {
		t.Fatalf("second open: %v", err)
	}
	st.Close()
	// Opening it as another gateway is an identity mismatch, not damage.
	if _, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-b", Clock: clock.Now}); !errors.Is(err, ErrShardStoreIdentity) ||
		errors.Is(err, ErrShardStoreCorrupt) || !strings.Contains(err.Error(), `"gw-a"`) {
		t.Fatalf("open as another gateway: %v", err)
	}

	// A torn last record (a crash mid-write) is dropped.
	logPath := filepath.Join(dir, shardLogName)
	good, _ := os.ReadFile(logPath)
	f, _ := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte{0, 0, 1, 0, 1, 2, 3})
	f.Close()
	st = openTestStore(t, dir, "gw-a", clock)
	receipts, _ := st.Receipts("sh-1")
	if len(receipts) != 1 {
		t.Fatalf("after a torn tail: %d receipts", len(receipts))
	}
	st.Close()

	// A damaged record in the middle is corruption, not a torn tail.
	damaged := bytes.Clone(good)
	damaged[20] ^= 0xFF
	os.WriteFile(logPath, damaged, 0o600)
	if _, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Clock: clock.Now}); !errors.Is(err, ErrShardStoreCorrupt) {
		t.Fatalf("damaged log: %v", err)
	}
}

// BenchmarkShardStoreReserveSettle measures one durable local admission
// cycle (reserve, start, settle: three fsync'ed log records) on the test
// machine's disk.
func BenchmarkShardStoreReserveSettle(b *testing.B) {
	clock := &testClock{now: shardT0}
	st, err := OpenShardStore(b.TempDir(), ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Install(signToken("sh-1", "gw-a", st.BootEpoch(), 1, ledger.MaxUnits, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		b.Fatal(err)
	}
	n := 0
	for b.Loop() {
		id := "r" + strconv.Itoa(n)
		n++
		if _, err := st.Reserve(id, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil {
			b.Fatal(err)
		}
		st.Start(id, "op")
		if _, err := st.Settle(id, "op", Units{"tokens": 7}); err != nil {
			b.Fatal(err)
		}
	}
}

// Concurrent gateways' requests never admit more than the shard holds.
func TestShardStoreConcurrentAdmissionStaysBounded(t *testing.T) {
	clock := &testClock{now: shardT0}
	st := openTestStore(t, t.TempDir(), "gw-a", clock)
	defer st.Close()
	if _, err := st.Install(signToken("sh-1", "gw-a", st.BootEpoch(), 1, 1000, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := int64(0)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				if _, err := st.Reserve(id, "d", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil {
					if !errors.Is(err, ledger.ErrInsufficientCapacity) {
						t.Error(err)
					}
					continue
				}
				st.Start(id, "op")
				if _, err := st.Settle(id, "op", Units{"tokens": 10}); err != nil {
					t.Error(err)
				}
				mu.Lock()
				admitted += 10
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	status := st.Shards()[0]
	if admitted != 1000 || status.Spent["tokens"] != 1000 || status.Available["tokens"] != 0 || status.Conservation != nil {
		t.Fatalf("admitted %d; shard %+v", admitted, status)
	}
}

// appendOldRecord appends rec to the store's log in its format (4-byte
// length, 4-byte CRC-32C, JSON payload), as an older SDK wrote it,
// without going through today's checks.
func appendOldRecord(t *testing.T, dir string, rec shardRecord) {
	t.Helper()
	payload, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, shardLogName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	header := make([]byte, 8)
	binary.BigEndian.PutUint32(header[:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(header[4:], crc32.Checksum(payload, crcTable))
	if _, err := f.Write(append(header, payload...)); err != nil {
		t.Fatal(err)
	}
}

// A log written by an SDK older than the id rule (ledger.IDProblem: at
// most 256 bytes, no NUL byte) may hold reservations under ids the rule
// refuses today. It opened as ErrShardStoreCorrupt, so the gateway could
// not boot after the upgrade. It opens: what the store accepted once is
// history, loaded as it was (receipts, conservation, later operations on
// those ids), and only new reservations are checked.
func TestShardStoreOpensALogWithIDsTodaysRuleRefuses(t *testing.T) {
	dir := t.TempDir()
	clock := &testClock{now: shardT0}
	st := openTestStore(t, dir, "gw-a", clock)
	if _, err := st.Install(signToken("sh-1", "gw-a", st.BootEpoch(), 1, 300, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Reserve("r1", "d1", "tenant-7", "chat", "", Units{"tokens": 10}); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	long, nul := strings.Repeat("x", ledger.MaxIDBytes+44), "old\x00id"
	at := shardT0.Add(time.Second).UnixNano()
	appendOldRecord(t, dir, shardRecord{Op: "reserve", At: at, Shard: "sh-1", ID: long, Digest: "d-long", Amounts: ledger.Amounts{100, 1}})
	appendOldRecord(t, dir, shardRecord{Op: "start", At: at, Shard: "sh-1", ID: long, Operation: "op-long"})
	appendOldRecord(t, dir, shardRecord{Op: "settle", At: at, Shard: "sh-1", ID: long, Operation: "op-long", Amounts: ledger.Amounts{60, 1}})
	appendOldRecord(t, dir, shardRecord{Op: "reserve", At: at, Shard: "sh-1", ID: nul, Digest: "d-nul", Amounts: ledger.Amounts{20, 0}})
	appendOldRecord(t, dir, shardRecord{Op: "start", At: at, Shard: "sh-1", ID: nul, Operation: "op-nul"})

	clock.Advance(time.Minute)
	st, err := OpenShardStore(dir, ShardStoreOptions{GatewayID: "gw-a", Keys: testShardRing, Clock: clock.Now})
	if err != nil {
		t.Fatalf("a log an older SDK wrote does not open: %v", err)
	}
	defer st.Close()
	receipts, err := st.Receipts("sh-1")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]ledger.State{}
	for _, r := range receipts {
		states[r.ReservationID] = r.State
	}
	if len(receipts) != 3 || states[long] != ledger.StateSettled || states[nul] != ledger.StateUsageUnknown || states["r1"] != ledger.StateReleased {
		t.Fatalf("receipts after the upgrade: %v", states)
	}
	shard := st.Shards()[0]
	if shard.Conservation != nil || shard.Spent["tokens"] != 60 {
		t.Fatalf("the shard after the upgrade: %+v", shard)
	}
	// Work under an old id still finishes; a new reservation is checked.
	if r, err := st.Settle(nul, "op-nul", Units{"tokens": 15, "requests": 0}); err != nil || r.State != ledger.StateSettled {
		t.Fatalf("settle of an old id after the upgrade: %+v %v", r, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openTestStore(t, dir, "gw-a", clock)
	if _, err := st.Install(signToken("sh-2", "gw-a", st.BootEpoch(), 2, 300, shardT0.Add(time.Hour)), testUnits, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{long, "new\x00id"} {
		if _, err := st.Reserve(id, "d", "tenant-7", "chat", "", Units{"tokens": 1}); !errors.Is(err, ledger.ErrInvalidCommand) {
			t.Errorf("a new reservation under id %.20q: %v, want ErrInvalidCommand", id, err)
		}
	}
}
