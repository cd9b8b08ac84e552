package server_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

type shardHarness struct {
	ledger  capledgerv1connect.LedgerServiceClient
	shards  capledgerv1connect.ShardServiceClient
	engine  *engine.Engine
	keys    *server.ShardKeys
	keyPath string
}

// newShardHarness serves a real server over a real engine on a SQLite file,
// with a key ring generated in the test's directory.
func newShardHarness(t *testing.T) *shardHarness {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	eng := engine.New(st, engine.Options{DisableWorkers: true, Logger: logger})
	t.Cleanup(func() { eng.Close(); st.Close() })
	keyPath := filepath.Join(dir, "shard-keys")
	keys, created, err := server.EnsureShardKeys(keyPath)
	if err != nil || !created {
		t.Fatalf("ensure keys: created %v, %v", created, err)
	}
	if info, _ := os.Stat(keyPath); info.Mode().Perm() != 0o600 {
		t.Fatalf("generated key file has mode %v", info.Mode().Perm())
	}
	url := serve(t, server.New(eng, server.Config{Logger: logger, Shards: &server.ShardConfig{Keys: keys, MaxTTL: time.Hour}}))
	hc := &http.Client{Timeout: 10 * time.Second}
	return &shardHarness{
		ledger: capledgerv1connect.NewLedgerServiceClient(hc, url),
		shards: capledgerv1connect.NewShardServiceClient(hc, url),
		engine: eng, keys: keys, keyPath: keyPath,
	}
}

func (h *shardHarness) publish(t *testing.T, emergency bool) uint64 {
	t.Helper()
	resp, err := h.ledger.PublishPolicy(context.Background(), connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", EmergencyMode: emergency,
		Dimensions: []*v1.Dimension{
			{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour)},
			{Unit: "requests", Burst: 10},
		},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg.Policy.Generation
}

func issueRequest(id, gateway string, tokens int64) *v1.IssueShardRequest {
	return &v1.IssueShardRequest{ShardId: id, Subject: "tenant-7", Route: "chat.generate", Region: "eu",
		Units: map[string]int64{"tokens": tokens, "requests": 4}, GatewayId: gateway, BootEpoch: 1,
		Ttl: durationpb.New(10 * time.Minute)}
}

// wantShardError asserts a connect code and ErrorDetail reason.
func wantShardError(t *testing.T, err error, code connect.Code, reason string) {
	t.Helper()
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != code {
		t.Fatalf("want %s, got %v", code, err)
	}
	for _, d := range cerr.Details() {
		if msg, derr := d.Value(); derr == nil {
			if ed, ok := msg.(*v1.ErrorDetail); ok {
				if ed.Reason != reason {
					t.Fatalf("want reason %s, got %s (%v)", reason, ed.Reason, err)
				}
				return
			}
		}
	}
	t.Fatalf("%v carries no ErrorDetail (want reason %s)", err, reason)
}

func TestShardServiceIssueReconcile(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, false)
	_, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-1", "gw-a", 300)))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonEmergencyDisabled)

	g := h.publish(t, true)
	issued, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-1", "gw-a", 300)))
	if err != nil {
		t.Fatal(err)
	}
	sh := issued.Msg.Shard
	if sh.Fence != 1 || sh.AllocatedUnits["tokens"] != 300 || sh.AllocatedUnits["requests"] != 4 || !sh.SignatureValid ||
		len(sh.Units) != 2 || sh.Units[0] != "tokens" || sh.PolicyGeneration != g {
		t.Fatalf("issued: %+v", sh)
	}
	// The gateway verifies the token with the keys the server publishes.
	keys, err := h.shards.ListShardKeys(ctx, connect.NewRequest(&v1.ListShardKeysRequest{}))
	if err != nil || len(keys.Msg.Keys) != 1 || !keys.Msg.Keys[0].Signing {
		t.Fatalf("keys: %v %v", keys, err)
	}
	ring := ledger.ShardKeyRing{keys.Msg.Keys[0].KeyId: ed25519.PublicKey(keys.Msg.Keys[0].PublicKey)}
	decoded, err := ledger.DecodeShardToken(sh.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.VerifyShard(decoded, ring, ledger.ShardHolder{GatewayID: "gw-a", BootEpoch: 1}, time.Now()); err != nil {
		t.Fatalf("token from the API does not verify: %v", err)
	}

	replay, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-1", "gw-a", 300)))
	if err != nil || !replay.Msg.Replayed || replay.Msg.Shard.Fence != 1 {
		t.Fatalf("replayed issuance: %v %v", replay, err)
	}
	_, err = h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-1", "gw-b", 300)))
	wantShardError(t, err, connect.CodeAlreadyExists, server.ReasonShardIDReused)

	// 700 tokens are left: 800 do not fit, with a Retry-After.
	_, err = h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-2", "gw-a", 800)))
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted || cerr.Meta().Get("Retry-After") == "" {
		t.Fatalf("oversized shard: %v", err)
	}
	badTTL := issueRequest("sh-3", "gw-a", 1)
	badTTL.Ttl = durationpb.New(2 * time.Hour)
	_, err = h.shards.IssueShard(ctx, connect.NewRequest(badTTL))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)
	badUnit := issueRequest("sh-3", "gw-a", 1)
	badUnit.Units["dollars"] = 1
	_, err = h.shards.IssueShard(ctx, connect.NewRequest(badUnit))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonUnknownUnit)

	account, err := h.ledger.GetAccount(ctx, connect.NewRequest(&v1.GetAccountRequest{Subject: "tenant-7", Route: "chat.generate", Region: "eu"}))
	if err != nil {
		t.Fatal(err)
	}
	current := account.Msg.Accounts[len(account.Msg.Accounts)-1].Balances[0]
	if current.RetiredForEmergency != 300 || current.Available != 700 {
		t.Fatalf("central tokens after issuance: %+v", current)
	}

	// The gateway used 120 tokens and 2 requests, and one request (50
	// tokens, 1 request) is unknown.
	receipts := []*v1.ShardReceipt{
		{ReservationId: "l1", State: v1.ReservationState_RESERVATION_STATE_SETTLED,
			ReservedUnits: map[string]int64{"tokens": 150, "requests": 1}, ActualUnits: map[string]int64{"tokens": 120, "requests": 1}},
		{ReservationId: "l2", State: v1.ReservationState_RESERVATION_STATE_SETTLED,
			ReservedUnits: map[string]int64{"requests": 1}, ActualUnits: map[string]int64{"requests": 1}},
		{ReservationId: "l3", State: v1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN,
			ReservedUnits: map[string]int64{"tokens": 50, "requests": 1}},
	}
	// A negative amount is refused, naming the unit as the request did.
	negative := []*v1.ShardReceipt{{ReservationId: "l1", State: v1.ReservationState_RESERVATION_STATE_SETTLED,
		ReservedUnits: map[string]int64{"tokens": 150, "requests": 1}, ActualUnits: map[string]int64{"tokens": 120, "requests": -1}}}
	_, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: negative}))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)
	if !strings.Contains(err.Error(), `"requests"`) {
		t.Errorf("negative receipt amount: %v, want it to name \"requests\"", err)
	}
	rec, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: receipts}))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Msg.RemintedUnits["tokens"] != 130 || rec.Msg.RemintedUnits["requests"] != 1 || rec.Msg.RemintGeneration != g ||
		rec.Msg.Shard.UnknownUnits["tokens"] != 50 || rec.Msg.Shard.SpentUnits["tokens"] != 120 || !rec.Msg.Shard.Reconciled {
		t.Fatalf("reconciled: %+v", rec.Msg)
	}
	_, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: receipts}))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonShardAlreadyReconciled)
	_, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-b"}))
	wantShardError(t, err, connect.CodeFailedPrecondition, server.ReasonShardForeign)
	_, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-none", GatewayId: "gw-a"}))
	wantShardError(t, err, connect.CodeNotFound, server.ReasonShardNotFound)
	got, err := h.shards.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-1"}))
	if err != nil || got.Msg.Shard.RefusedSubmissions != 2 {
		t.Fatalf("refusals counted: %v %v", got, err)
	}

	// The late receipt for l3 resolves it: 20 used, 30 reminted.
	late := []*v1.ShardReceipt{{ReservationId: "l3", State: v1.ReservationState_RESERVATION_STATE_SETTLED,
		ReservedUnits: map[string]int64{"tokens": 50, "requests": 1}, ActualUnits: map[string]int64{"tokens": 20, "requests": 1}}}
	rec, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-1", GatewayId: "gw-a", Receipts: late}))
	if err != nil || rec.Msg.RemintedUnits["tokens"] != 30 || rec.Msg.Shard.UnknownUnits["tokens"] != 0 {
		t.Fatalf("late receipt: %v %v", rec, err)
	}

	list, err := h.shards.ListShards(ctx, connect.NewRequest(&v1.ListShardsRequest{GatewayId: "gw-a"}))
	if err != nil || len(list.Msg.Shards) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	// The list carries the refusals too: the console's Shards page sums
	// them from ListShards (it showed 0 while GetShard said 2).
	if n := list.Msg.Shards[0].GetRefusedSubmissions(); n != 2 {
		t.Errorf("ListShards refusedSubmissions %d, want 2 as GetShard", n)
	}
	list, err = h.shards.ListShards(ctx, connect.NewRequest(&v1.ListShardsRequest{UnreconciledOnly: true}))
	if err != nil || len(list.Msg.Shards) != 0 {
		t.Fatalf("list unreconciled: %v %v", list, err)
	}
	audit, err := h.ledger.Audit(ctx, connect.NewRequest(&v1.AuditRequest{}))
	if err != nil || len(audit.Msg.Discrepancies) != 0 {
		t.Fatalf("audit: %v %v", audit, err)
	}
}

func TestShardKeyRotation(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, true)
	first, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-old", "gw-a", 100)))
	if err != nil {
		t.Fatal(err)
	}
	oldKey := first.Msg.Shard.KeyId

	// Rotate: append a new private key, as `capledger shard keygen >> file`.
	line, err := server.NewShardKeyLine("k-next", randReader{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(h.keyPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(line)
	f.Close()
	rotated, err := server.LoadShardKeys(h.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if id, _, ok := rotated.Signer(); !ok || id != "k-next" {
		t.Fatalf("after rotation the signer is %q", id)
	}
	if _, ok := rotated.ShardPublicKey(oldKey); !ok {
		t.Fatal("the old key no longer verifies after rotation")
	}
	// The running server picks the new key up by itself (it checks the
	// file at most once a second).
	deadline := time.Now().Add(10 * time.Second)
	for {
		req := issueRequest("sh-new-"+time.Now().Format("150405.000000000"), "gw-a", 1)
		req.Units = map[string]int64{"tokens": 1}
		resp, err := h.shards.IssueShard(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Msg.Shard.KeyId == "k-next" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server kept signing with the old key")
		}
		time.Sleep(100 * time.Millisecond)
	}
	old, err := h.shards.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-old"}))
	if err != nil || !old.Msg.Shard.SignatureValid {
		t.Fatalf("a shard of the old key after rotation: %v %v", old, err)
	}
	// Removing the old key revokes it.
	os.WriteFile(h.keyPath, []byte(line), 0o600)
	revoked, err := server.LoadShardKeys(h.keyPath)
	if err != nil {
		t.Fatal(err)
	}
	decoded, _ := ledger.DecodeShardToken(first.Msg.Shard.Token)
	if err := ledger.VerifyShardSignature(decoded, revoked); !errors.Is(err, ledger.ErrShardUnknownKey) {
		t.Fatalf("a shard of a removed key: %v", err)
	}
}

func TestShardKeysFileErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, mode)
		return path
	}
	line, _ := server.NewShardKeyLine("k1", randReader{}, time.Now())
	cases := map[string]string{
		"readable":  write("readable", line, 0o644),
		"garbage":   write("garbage", "k1 private\n", 0o600),
		"bad kind":  write("kind", "k1 secret AAAA\n", 0o600),
		"short key": write("short", "k1 private AAAA\n", 0o600),
		"dup":       write("dup", line+line, 0o600),
		"empty":     write("empty", "# nothing\n", 0o600),
		"bad id":    write("badid", "k/1 public AAAA\n", 0o600),
		"missing":   filepath.Join(dir, "missing"),
	}
	for name, path := range cases {
		if _, err := server.LoadShardKeys(path); err == nil {
			t.Errorf("%s: loaded without error", name)
		}
	}
	// A directory of key files: the last private key in name order signs.
	keyDir := filepath.Join(dir, "ring")
	os.Mkdir(keyDir, 0o700)
	a, _ := server.NewShardKeyLine("a-key", randReader{}, time.Now())
	b, _ := server.NewShardKeyLine("b-key", randReader{seed: 1}, time.Now())
	os.WriteFile(filepath.Join(keyDir, "1.keys"), []byte(a), 0o600)
	os.WriteFile(filepath.Join(keyDir, "2.keys"), []byte(b), 0o600)
	os.WriteFile(filepath.Join(keyDir, ".hidden"), []byte("garbage"), 0o600)
	keys, err := server.LoadShardKeys(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	if id, _, _ := keys.Signer(); id != "b-key" || len(keys.Keys()) != 2 {
		t.Fatalf("directory ring: signer %q, %d keys", id, len(keys.Keys()))
	}
}

// randReader is a deterministic byte source for test keys.
type randReader struct{ seed byte }

func (r randReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r.seed + byte(i)
	}
	return len(p), nil
}

// TestIssueShardNewUnitFromOtherReplica: another replica publishes a
// generation with a unit this server's cached generation lacks; an
// IssueShard naming it reloads the cache and carves from the new
// generation instead of answering UNKNOWN_UNIT against the stale one.
// Its units are mapped as a Reserve's and a RecordUsage's (mapActive),
// so the reload is the same rate-limited one (API.md: within 100 ms).
func TestIssueShardNewUnitFromOtherReplica(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, true) // cached here: tokens and requests
	if _, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-warm", "gw-a", 10))); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	other := capledgerv1connect.NewLedgerServiceClient(&http.Client{Timeout: 10 * time.Second},
		serve(t, server.New(h.engine, server.Config{Logger: logger, Shards: &server.ShardConfig{Keys: h.keys, MaxTTL: time.Hour}})))
	pub, err := other.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", EmergencyMode: true,
		Dimensions: []*v1.Dimension{
			{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour)},
			{Unit: "gpus", Burst: 4},
		},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // past the reload interval of this replica's own publish
	req := issueRequest("sh-gpu", "gw-a", 20)
	req.Units = map[string]int64{"tokens": 20, "gpus": 1}
	issued, err := h.shards.IssueShard(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatalf("issue naming the other replica's new unit: %v", err)
	}
	if sh := issued.Msg.Shard; sh.PolicyGeneration != pub.Msg.Policy.Generation || sh.AllocatedUnits["gpus"] != 1 || sh.AllocatedUnits["tokens"] != 20 {
		t.Fatalf("issued: %+v", sh)
	}
	req = issueRequest("sh-tpu", "gw-a", 20)
	req.Units = map[string]int64{"tpus": 1}
	_, err = h.shards.IssueShard(ctx, connect.NewRequest(req))
	wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonUnknownUnit)
}

// TestIssueShardStaleMapping: as TestStaleUnitMapping, for IssueShard:
// generation 2, published through another replica with the units in
// another order, decides; the issue mapped by the cached generation 1 is
// refused as stale by the ledger, and the server reloads and maps again.
func TestIssueShardStaleMapping(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, true) // cached here: tokens and requests
	if _, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-warm", "gw-a", 10))); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	other := capledgerv1connect.NewLedgerServiceClient(&http.Client{Timeout: 10 * time.Second},
		serve(t, server.New(h.engine, server.Config{Logger: logger, Shards: &server.ShardConfig{Keys: h.keys, MaxTTL: time.Hour}})))
	pub, err := other.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-7", Route: "chat.generate", Region: "eu", EmergencyMode: true,
		Dimensions: []*v1.Dimension{
			{Unit: "requests", Burst: 10},
			{Unit: "tokens", Burst: 1000, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour)},
		},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	issued, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-after", "gw-a", 20)))
	if err != nil {
		t.Fatalf("issue after the other replica's publish: %v", err)
	}
	if sh := issued.Msg.Shard; sh.PolicyGeneration != pub.Msg.Policy.Generation || sh.AllocatedUnits["tokens"] != 20 || sh.AllocatedUnits["requests"] != 4 {
		t.Fatalf("issued: %+v", sh)
	}
}

// A rotation line that does not load (pasted half, say) was ignored
// without a word: the ring kept the previous keys, as it should, but
// nothing told the operator that the new key was not signing. The ring
// logs it once per change of the file, keeps signing with the previous
// key, and logs the reload once the file loads again.
func TestShardKeysLogAReloadThatFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shard-keys")
	first, err := server.NewShardKeyLine("k-first", randReader{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(first), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := server.LoadShardKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	var logged strings.Builder
	keys.LogReloads(slog.New(slog.NewTextHandler(&logged, nil)))
	appendLine := func(line string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(line)
		f.Close()
	}
	appendLine("k-next private notbase64\n")
	for i := 0; i < 3; i++ { // the ring checks the file at most once a second
		time.Sleep(1100 * time.Millisecond)
		if id, _, ok := keys.Signer(); !ok || id != "k-first" {
			t.Fatalf("after a bad rotation line the signer is %q", id)
		}
	}
	failed := `msg="shard keys not reloaded: keeping the previous ones"`
	if n := strings.Count(logged.String(), failed); n != 1 || !strings.Contains(logged.String(), "k-next") {
		t.Fatalf("the failed reload was logged %d times (want once, naming the line's key):\n%s", n, logged.String())
	}
	good, err := server.NewShardKeyLine("k-good", randReader{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(first+good), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	if id, _, ok := keys.Signer(); !ok || id != "k-good" {
		t.Fatalf("after a good rotation the signer is %q", id)
	}
	if !strings.Contains(logged.String(), `msg="shard keys reloaded"`) || !strings.Contains(logged.String(), "signing=k-good") {
		t.Fatalf("the reload was not logged:\n%s", logged.String())
	}
}

// An IssueShard above the per-command cap of 2^53 units answers as a
// Reserve of that size does and as docs/API.md says IssueShard's 429 does
// above the burst: resource_exhausted, RESERVATION_TOO_LARGE, naming the
// unit, no Retry-After. It answered invalid_argument INVALID_COMMAND.
func TestIssueShardAboveTheUnitCapIsTooLarge(t *testing.T) {
	h := newShardHarness(t)
	ctx := context.Background()
	h.publish(t, true)
	_, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-cap", "gw-a", ledger.MaxUnits+1)))
	var cerr *connect.Error
	if !errors.As(err, &cerr) || cerr.Code() != connect.CodeResourceExhausted || cerr.Meta().Get("Retry-After") != "" {
		t.Fatalf("want RESOURCE_EXHAUSTED without Retry-After, got %v", err)
	}
	var rejection *v1.RejectionDetail
	for _, d := range cerr.Details() {
		if msg, derr := d.Value(); derr == nil {
			if r, ok := msg.(*v1.RejectionDetail); ok {
				rejection = r
			}
		}
	}
	if rejection.GetReason() != server.ReasonReservationTooLarge || rejection.GetLimitingDimension() != "tokens" || rejection.GetRetryAfter() != nil {
		t.Fatalf("rejection detail %v (%v)", rejection, err)
	}
	if list, err := h.shards.ListShards(ctx, connect.NewRequest(&v1.ListShardsRequest{})); err != nil || len(list.Msg.Shards) != 0 {
		t.Fatalf("a refused issuance recorded a shard: %v %v", list, err)
	}
}
