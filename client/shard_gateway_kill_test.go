package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/childproc"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

// gatewayKillChildEnv carries the shard store directory and the ledger's
// (proxied) address to the child gateway of
// TestGatewayKilledWhileServingFromItsShard.
const gatewayKillChildEnv = "CAPLEDGER_GATEWAY_KILL_CHILD"

// The child gateway: provisions a 1,000-token shard while healthy, says
// "provisioned", waits for "go" (the parent has cut it off), then serves
// from the shard: a settles 70 of 100, b 200 of 200, c starts 300 and
// runs on, d holds 150 unstarted. It prints "ready" and the four ids, and
// waits to be killed.
func TestGatewayKillChild(t *testing.T) {
	env := os.Getenv(gatewayKillChildEnv)
	if env == "" {
		t.Skip("run by TestGatewayKilledWhileServingFromItsShard")
	}
	storeDir, addr, _ := strings.Cut(env, "|")
	ctx := context.Background()
	gw, err := newPartitionedGateway(addr)
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	em := NewEmergency(gw, store, EmergencyOptions{})
	if _, err := em.Provision(ctx, ProvisionRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("provisioned")
	stdin := bufio.NewReader(os.Stdin)
	if line, _ := stdin.ReadString('\n'); line != "go\n" {
		t.Fatalf("child read %q, want go", line)
	}
	offline := func(tokens int64) string {
		octx, cancel := context.WithTimeout(ctx, offlineTimeout)
		defer cancel()
		r, err := em.Reserve(octx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": tokens}})
		if err != nil || r.Local == nil {
			t.Fatalf("offline reserve of %d: %+v %v", tokens, r, err)
		}
		return r.ReservationID
	}
	step := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	a, b, c, d := offline(100), offline(200), offline(300), offline(150)
	step(em.Start(ctx, a, "op-a"))
	step(em.Settle(ctx, a, "op-a", Units{"tokens": 70}))
	step(em.Start(ctx, b, "op-b"))
	step(em.Settle(ctx, b, "op-b", Units{"tokens": 200}))
	step(em.Start(ctx, c, "op-c"))
	fmt.Println("ready", a, b, c, d)
	io.Copy(io.Discard, stdin) // until killed
}

// TestGatewayKilledWhileServingFromItsShard: a gateway process serving
// from its emergency shard while cut off from a real `capledger serve`
// is killed (SIGKILL) with work settled, running and held. The restarted
// process (a new boot epoch over the same shard store) never admits from
// the old shard, refuses its token, and keeps the running work's units
// USAGE_UNKNOWN. Once back in touch its reconciliation remints exactly the
// confirmed unused units (the unstarted hold included) and leaves the
// unknown ones retired; a reconciliation after another restart, and a
// second one, remint nothing; the late receipt of the running work
// remints the rest of its hold once. The account's terms are exact and
// conserve after every step, and `capledger audit` is clean.
func TestGatewayKilledWhileServingFromItsShard(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the ledger binary and kills a child gateway")
	}
	dir := t.TempDir()
	addr, proxy, direct, gw := newPartitionRig(t, dir, 11)
	ctx := context.Background()
	storeDir := filepath.Join(dir, "gw-a")

	child := exec.Command(os.Args[0], "-test.run=^TestGatewayKillChild$", "-test.count=1")
	child.Env = append(os.Environ(), gatewayKillChildEnv+"="+storeDir+"|"+proxy.Addr())
	childproc.DieWithParent(child)
	toChild, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChild, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var childErr strings.Builder
	child.Stderr = &childErr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })
	lines := bufio.NewScanner(fromChild)
	// expect reads the child's output up to a line starting with word and
	// returns that line's other fields; a child that ends first fails the
	// test.
	expect := func(word string) []string {
		t.Helper()
		for lines.Scan() {
			if fields := strings.Fields(lines.Text()); len(fields) > 0 && fields[0] == word {
				return fields[1:]
			}
		}
		child.Process.Kill()
		child.Wait()
		t.Fatalf("the child gateway ended before %q:\n%s", word, childErr.String())
		return nil
	}
	expect("provisioned")
	terms := func(want map[string]int64) {
		t.Helper()
		accounts, err := direct.GetAccount(ctx, "tenant-7", "chat.generate", "")
		if err != nil || len(accounts) != 1 {
			t.Fatalf("account: %v %v", accounts, err)
		}
		for _, b := range accounts[0].GetBalances() {
			in := b.GetOpening() + b.GetMinted() + b.GetOverdraftIssued()
			out := b.GetAvailable() + b.GetReserved() + b.GetSpent() + b.GetRetiredForEmergency() + b.GetRetiredForMove() + b.GetOverdraftRepaid()
			if in != out || b.GetAvailable() < 0 {
				t.Fatalf("%s: conservation broken: %v", b.GetUnit(), b)
			}
			got := map[string]int64{"available": b.GetAvailable(), "reserved": b.GetReserved(), "retiredForEmergency": b.GetRetiredForEmergency(), "minted": b.GetMinted(), "debt": b.GetDebt()}
			for term, v := range want {
				if got[term] != v {
					t.Fatalf("%s %s %d, want %d (%v)", b.GetUnit(), term, got[term], v, b)
				}
			}
		}
	}
	terms(map[string]int64{"available": 9000, "minted": 0, "retiredForEmergency": 1000})

	proxy.SetFaults(faultproxy.Faults{Partition: true})
	proxy.CutAll()
	fmt.Fprintln(toChild, "go")
	ids := expect("ready")
	if len(ids) != 4 {
		t.Fatalf("child said ready %v, want four ids", ids)
	}
	running, held := ids[2], ids[3]
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	terms(map[string]int64{"available": 9000, "reserved": 0, "retiredForEmergency": 1000})

	// The restart, still cut off.
	store, err := OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { store.Close() }()
	em := NewEmergency(gw, store, EmergencyOptions{})
	shards := store.Shards()
	if len(shards) != 1 || shards[0].Live || !shards[0].Sealed || shards[0].Shard.BootEpoch >= store.BootEpoch() {
		t.Fatalf("after the restart (boot %d) the old shards are %v, want one, sealed and not live", store.BootEpoch(), shardSummaries(shards))
	}
	receipts, err := store.Receipts(shards[0].Shard.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range receipts {
		want, ok := map[string]ledger.State{running: ledger.StateUsageUnknown, held: ledger.StateReleased}[r.ReservationID]
		if ok && r.State != want {
			t.Errorf("after the restart %s is %v, want %v", r.ReservationID, r.State, want)
		}
	}
	octx, cancel := context.WithTimeout(ctx, offlineTimeout)
	r, err := em.Reserve(octx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1}})
	cancel()
	if err == nil || r != nil && r.Local != nil {
		t.Fatalf("the restarted gateway admitted from the old shard: %+v %v", r, err)
	}

	// Back in touch: spent 70 + 200, 300 unknown, the other 430 reminted.
	heal(t, proxy, gw)
	keys, err := em.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Install(shards[0].Token, []string{"tokens"}, keys); !errors.Is(err, ledger.ErrShardBootEpoch) {
		t.Fatalf("the old shard replayed into the restarted process: %v", err)
	}
	results, err := em.Reconcile(ctx)
	if err != nil || len(results) != 1 {
		t.Fatalf("reconcile after the restart: %+v %v", results, err)
	}
	if got := results[0]; got.Reminted["tokens"] != 430 || got.Shard.GetUnknownUnits()["tokens"] != 300 || got.Shard.GetSpentUnits()["tokens"] != 270 {
		t.Fatalf("reconciliation after the restart: reminted %v, unknown %v, spent %v; want 430, 300, 270",
			got.Reminted, got.Shard.GetUnknownUnits(), got.Shard.GetSpentUnits())
	}
	// Reminting mints: what the shard retired stays retired.
	terms(map[string]int64{"available": 9430, "reserved": 0, "minted": 430, "retiredForEmergency": 1000, "debt": 0})

	// Another restart, and another reconciliation: nothing more.
	store.Close()
	if store, err = OpenShardStore(storeDir, ShardStoreOptions{GatewayID: "gw-a"}); err != nil {
		t.Fatal(err)
	}
	em = NewEmergency(gw, store, EmergencyOptions{})
	for range 2 {
		if results, err := em.Reconcile(ctx); err != nil || len(results) != 0 && results[0].Reminted["tokens"] != 0 {
			t.Fatalf("a reconciliation again: %+v %v", results, err)
		}
	}
	terms(map[string]int64{"available": 9430, "minted": 430})

	// The running work's receipt: 250 of its 300. The other 50 come back, once.
	if err := em.Settle(ctx, running, "op-c", Units{"tokens": 250}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := em.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	terms(map[string]int64{"available": 9480, "reserved": 0, "minted": 480, "retiredForEmergency": 1000, "debt": 0})

	out, err := exec.Command(ledgerBinary(t), "audit", "--addr", "http://"+addr, "--timeout", "60s").CombinedOutput()
	if err != nil {
		t.Fatalf("capledger audit: %v\n%s", err, out)
	}
}

// shardSummaries names each shard's id, boot epoch and whether it is
// sealed and live, for a failure message.
func shardSummaries(shards []ShardStatus) []string {
	var out []string
	for _, s := range shards {
		out = append(out, fmt.Sprintf("%s boot %d sealed %v live %v", s.Shard.ID, s.Shard.BootEpoch, s.Sealed, s.Live))
	}
	return out
}
