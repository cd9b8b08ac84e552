package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/open"
	"github.com/capledger/capledger/store/sqlite"
)

// The tests of this file are the outside client of what README.md,
// docs/API.md, docs/OPERATIONS.md and docs/CLIENTS.md promise about
// retention removing settled emergency shards: they run the real binary
// with the smallest windows the flags allow (--retention 1s, a pass every
// 50 ms) and speak HTTP/JSON, or the Go SDK, to it over a socket.

// shardRetentionFlags: a settled shard goes about a second after it ended.
var shardRetentionFlags = []string{"--retention", "1s", "--tombstone-retention", "1s", "--retention-interval", "50ms", "--compaction", "0"}

// shardCall sends one call and returns its status and body as a client
// sees them; reason is the error's detail reason ("" for none).
func shardCall(t *testing.T, url, method, body string) (status int, out map[string]any, reason string) {
	t.Helper()
	a := contractCall(t, url, http.MethodPost, method, []byte(body), nil)
	return a.status, a.body, a.reason()
}

// waitShardsRemoved waits until /statusz counts n shards removed (at most
// 30 s), failing the test if it counts more.
func waitShardsRemoved(t *testing.T, srv *serverProcess, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := counter(statusz(t, srv.url), "retention", "shardsRemoved")
		if got == n {
			return
		}
		if got > n || time.Now().After(deadline) {
			t.Fatalf("/statusz retention.shardsRemoved %d, want %d\n%s", got, n, srv.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestContractSettledShardsRemovedByRetention: API.md (ShardService) and
// OPERATIONS.md ("Emergency shards" under retention) promise that the
// retention pass removes a shard reconciled with nothing left unknown
// once it ended (expired, or last reminted if later) longer ago than
// --retention, and never a live, unreconciled or unknown-holding one;
// /statusz retention.shardsRemoved and
// capledger_retention_removed_total{kind="shard"} count it; a removed
// shard is answered as an id never issued: GetShard and a resent
// ReconcileShard 404 SHARD_NOT_FOUND, reminting nothing, ListShards
// leaves it out, the audit stays clean; its id is free again: another
// gateway's IssueShard carves a new shard under it, answers under the id
// are about the new one, and the first gateway's ReconcileShard is
// refused SHARD_FOREIGN, moving nothing; a gateway reusing a removed
// shard's id and resending an old submission reconciles the new shard
// with it (API.md's warning).
func TestContractSettledShardsRemovedByRetention(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir(), shardRetentionFlags...)
	must := func(method, body string) map[string]any {
		t.Helper()
		status, out, _ := shardCall(t, srv.url, method, body)
		if status != http.StatusOK {
			t.Fatalf("%s %s: %d %v", method, body, status, out)
		}
		return out
	}
	must("PublishPolicy", `{"policy":{"subject":"t1","route":"chat","emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"100000"}]}}`)
	issue := func(id, gateway, ttl string, units int) map[string]any {
		t.Helper()
		return must("ShardService/IssueShard", fmt.Sprintf(
			`{"shardId":%q,"subject":"t1","route":"chat","units":{"tokens":%d},"gatewayId":%q,"bootEpoch":1,"ttl":%q}`, id, units, gateway, ttl))
	}
	settled := func(id, gateway string) string {
		return fmt.Sprintf(`{"shardId":%q,"gatewayId":%q,"receipts":[{"reservationId":"l-%s","state":"RESERVATION_STATE_SETTLED",
		  "reservedUnits":{"tokens":40},"actualUnits":{"tokens":30}}]}`, id, gateway, id)
	}
	account := func() string {
		raw, _ := json.Marshal(must("GetAccount", `{"subject":"t1","route":"chat"}`)["accounts"])
		return string(raw)
	}

	// Removed a second after they expired: settled, and settled by an
	// operator's empty reconciliation.
	issue("settled", "gw-a", "1s", 100)
	must("ShardService/ReconcileShard", settled("settled", "gw-a"))
	issue("reused", "gw-a", "1s", 100)
	must("ShardService/ReconcileShard", settled("reused", "gw-a"))
	// Kept: unknown work left, never reconciled, live, and reconciled
	// before its expiry an hour away (it ends when it expires).
	issue("unknown", "gw-a", "1s", 50)
	must("ShardService/ReconcileShard", `{"shardId":"unknown","gatewayId":"gw-a","receipts":[{"reservationId":"l-u",
	  "state":"RESERVATION_STATE_USAGE_UNKNOWN","reservedUnits":{"tokens":20}}]}`)
	issue("unreconciled", "gw-a", "1s", 10)
	issue("live", "gw-b", "3600s", 10)
	issue("early", "gw-b", "3600s", 10)
	must("ShardService/ReconcileShard", settled("early", "gw-b"))

	waitShardsRemoved(t, srv, 2)
	if got := metricValue(t, srv.url, `capledger_retention_removed_total{kind="shard"}`); got != 2 {
		t.Errorf(`capledger_retention_removed_total{kind="shard"} %v, want 2`, got)
	}
	var listed []string
	for _, s := range must("ShardService/ListShards", `{}`)["shards"].([]any) {
		listed = append(listed, s.(map[string]any)["shardId"].(string))
	}
	slices.Sort(listed)
	if want := []string{"early", "live", "unknown", "unreconciled"}; !slices.Equal(listed, want) {
		t.Errorf("ListShards after retention: %v, want %v", listed, want)
	}

	before := account()
	for _, c := range [][2]string{
		{"ShardService/GetShard", `{"shardId":"settled"}`},
		{"ShardService/ReconcileShard", settled("settled", "gw-a")},
		{"ShardService/ReconcileShard", `{"shardId":"settled","gatewayId":"gw-a"}`},
	} {
		if status, out, reason := shardCall(t, srv.url, c[0], c[1]); status != http.StatusNotFound || reason != "SHARD_NOT_FOUND" {
			t.Errorf("%s %s of a removed shard: %d %s %v; want 404 SHARD_NOT_FOUND", c[0], c[1], status, reason, out)
		}
	}
	if after := account(); after != before {
		t.Errorf("the reconciliation of a removed shard changed the account:\nbefore %s\nafter  %s", before, after)
	}
	if d, _ := must("Audit", `{}`)["discrepancies"].([]any); len(d) > 0 {
		t.Fatalf("audit after shard retention: %v", d)
	}

	// Another gateway takes the free id; the first one's resend is
	// foreign, moving nothing.
	if out := issue("settled", "gw-c", "3600s", 60); out["shard"].(map[string]any)["gatewayId"] != "gw-c" || out["replayed"] == true {
		t.Fatalf("IssueShard under a removed id: %v, want a new shard of gw-c", out)
	}
	got := must("ShardService/GetShard", `{"shardId":"settled"}`)["shard"].(map[string]any)
	if alloc, _ := got["allocatedUnits"].(map[string]any); got["gatewayId"] != "gw-c" || alloc["tokens"] != "60" || got["reconciled"] == true {
		t.Errorf("GetShard of the id taken again: %v, want gw-c's unreconciled shard of 60 tokens", got)
	}
	before = account()
	if status, out, reason := shardCall(t, srv.url, "ShardService/ReconcileShard", settled("settled", "gw-a")); status != http.StatusBadRequest || reason != "SHARD_FOREIGN" {
		t.Errorf("gw-a's resend for the id gw-c took: %d %s %v; want 400 SHARD_FOREIGN", status, reason, out)
	}
	if after := account(); after != before {
		t.Errorf("a SHARD_FOREIGN refusal changed the account:\nbefore %s\nafter  %s", before, after)
	}

	// The same gateway reusing a removed id: its old submission
	// reconciles the new shard.
	issue("reused", "gw-a", "3600s", 70)
	out := must("ShardService/ReconcileShard", settled("reused", "gw-a"))
	if reminted, _ := out["remintedUnits"].(map[string]any); reminted["tokens"] != "40" {
		t.Errorf("an old submission resent for a new shard under a reused id: %v; want it to reconcile the new shard (70 - 30 spent = 40 reminted)", out)
	}
	if d, _ := must("Audit", `{}`)["discrepancies"].([]any); len(d) > 0 {
		t.Fatalf("audit at the end: %v", d)
	}
}

// TestContractRetentionCountersOnlyWithRetention: API.md (metrics) says
// capledger_retention_removed_total, by kind reservation, tombstone,
// shard_fence, shard and statement, is there only with serve --retention
// above 0; OPERATIONS.md lists statementsRemoved and shardsRemoved among
// /statusz's retention fields.
func TestContractRetentionCountersOnlyWithRetention(t *testing.T) {
	bin := buildBinary(t)
	on := startServer(t, bin, t.TempDir(), "--retention", "1h")
	for _, kind := range []string{"reservation", "tombstone", "shard_fence", "shard", "statement"} {
		if got := metricValue(t, on.url, `capledger_retention_removed_total{kind="`+kind+`"}`); got != 0 {
			t.Errorf(`with --retention 1h: capledger_retention_removed_total{kind=%q} %v, want 0 (-1: no series)`, kind, got)
		}
	}
	st := statusz(t, on.url)
	for _, name := range []string{"statementsRemoved", "shardsRemoved"} {
		if counter(st, "retention", name) != 0 {
			t.Errorf("with --retention 1h: /statusz retention %v, want %s 0", st["retention"], name)
		}
	}
	off := startServer(t, bin, t.TempDir(), "--retention", "0")
	if got := metricValue(t, off.url, `capledger_retention_removed_total{kind="shard"}`); got != -1 {
		t.Errorf(`with --retention 0: capledger_retention_removed_total{kind="shard"} %v, want no series`, got)
	}
}

// TestContractGoSDKReconcileOfARemovedShard: CLIENTS.md ("emergency
// shards") and OPERATIONS.md ("For gateway authors", step 3): a
// reconciliation answered 404 SHARD_NOT_FOUND for a shard the gateway
// holds finishes that submission (it is not sent again, the shard ends
// locally): as the success of the gateway's own earlier attempt whose
// answer was lost, else a client.ShardReceiptsError naming every receipt
// as not taken. Here with the SDK over a socket to the real binary,
// through a proxy that loses one answer.
func TestContractGoSDKReconcileOfARemovedShard(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir(), shardRetentionFlags...)
	if status, out, _ := shardCall(t, srv.url, "PublishPolicy", `{"policy":{"subject":"t1","route":"chat","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"100000"}]}}`); status != http.StatusOK {
		t.Fatalf("publish: %d %v", status, out)
	}
	proxy, err := faultproxy.Start(strings.TrimPrefix(srv.url, "http://"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	ctx := context.Background()

	// gateway opens a shard store and an Emergency for id, provisions a
	// shard of 3 s, and serves two requests from it locally.
	type gateway struct {
		em    *client.Emergency
		store *client.ShardStore
		shard string
		ids   []string
	}
	open := func(id string) *gateway {
		t.Helper()
		c, err := client.New("http://"+proxy.Addr(), client.WithRetryPolicy(client.RetryPolicy{MaxAttempts: 1}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		store, err := client.OpenShardStore(filepath.Join(t.TempDir(), id), client.ShardStoreOptions{GatewayID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		g := &gateway{em: client.NewEmergency(c, store, client.EmergencyOptions{}), store: store}
		shard, err := g.em.Provision(ctx, client.ProvisionRequest{Subject: "t1", Route: "chat", Units: client.Units{"tokens": 9000}, TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		g.shard = shard.ID
		for i := range 2 {
			rid := fmt.Sprintf("%s-r%d", id, i)
			if _, err := store.Reserve(rid, "d-"+rid, "t1", "chat", "", client.Units{"tokens": 1000}); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Start(rid, "op-"+rid); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Settle(rid, "op-"+rid, client.Units{"tokens": int64(400 + i)}); err != nil {
				t.Fatal(err)
			}
			g.ids = append(g.ids, rid)
		}
		return g
	}
	lost, other := open("gw-lost"), open("gw-other")

	// gw-lost's submission lands, its answer is lost.
	proxy.DropNextResponses(1)
	if _, _, err := lost.em.ReconcileShard(ctx, lost.shard); err == nil {
		t.Fatal("the reconciliation whose answer the proxy dropped succeeded")
	}
	if proxy.Stats().DroppedResponses != 1 {
		t.Fatalf("the proxy dropped %d answers, want 1", proxy.Stats().DroppedResponses)
	}
	// gw-other's shard is reconciled by an operator, with no receipts.
	if status, out, _ := shardCall(t, srv.url, "ShardService/ReconcileShard", fmt.Sprintf(`{"shardId":%q,"gatewayId":"gw-other"}`, other.shard)); status != http.StatusOK {
		t.Fatalf("operator's reconciliation: %d %v", status, out)
	}
	waitShardsRemoved(t, srv, 2)

	res, ok, err := lost.em.ReconcileShard(ctx, lost.shard)
	if err != nil || !ok || !res.AlreadyReconciled || res.Receipts != 2 || res.Shard != nil {
		t.Errorf("gw-lost's resend to a removed shard: %+v ok=%v err=%v; want the success of its lost attempt (AlreadyReconciled, 2 receipts)", res, ok, err)
	}

	res, ok, err = other.em.ReconcileShard(ctx, other.shard)
	var refused *client.ShardReceiptsError
	if !errors.As(err, &refused) || !ok || res.AlreadyReconciled {
		t.Fatalf("gw-other's submission to a shard reconciled by another and removed: %+v ok=%v err=%v; want a ShardReceiptsError", res, ok, err)
	}
	var named []string
	for _, r := range refused.Receipts {
		named = append(named, r.ReservationID)
	}
	if !slices.Equal(named, other.ids) {
		t.Errorf("the ShardReceiptsError names %v, want every receipt %v", named, other.ids)
	}
	var le *client.LedgerError
	if !errors.As(err, &le) || le.Reason != "SHARD_NOT_FOUND" {
		t.Errorf("the error does not carry the ledger's SHARD_NOT_FOUND: %v", err)
	}

	// Both submissions are finished: nothing is sent again, the shards
	// end locally.
	for _, g := range []*gateway{lost, other} {
		if r, ok, err := g.em.ReconcileShard(ctx, g.shard); ok || err != nil {
			t.Errorf("%s: a further reconciliation: %+v ok=%v err=%v; want nothing to report", g.shard, r, ok, err)
		}
		if st := g.store.Shards()[0]; !st.Sealed || !st.Submitted || st.Pending != 0 {
			t.Errorf("%s: the local shard after the reconciliation: %+v", g.shard, st)
		}
	}
}

// TestContractStatementRetention: README (serve flags), API.md
// (ListStatements) and OPERATIONS.md ("Epoch statements"): with serve
// --statement-retention DUR each retention pass removes the statements
// whose epoch ended more than DUR ago, counted in /statusz
// retention.statementsRemoved and
// capledger_retention_removed_total{kind="statement"}; ListStatements
// lists the kept ones, and an account whose statements all went lists
// none, without an error; the audit's statement chain starts at the
// oldest kept statement (clean). The smallest window is 24h, so the
// statements are closed in-process by the engine under a clock four days
// back, into the data directory the real binary then serves.
func TestContractStatementRetention(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, open.DefaultFile))
	if err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-96 * time.Hour)
	e := engine.New(st, engine.Options{Clock: func() time.Time { return then }, DisableWorkers: true})
	do := func(cmd ledger.Command) {
		t.Helper()
		if res, err := e.Do(ctx, cmd); err != nil || res.Err != nil {
			t.Fatalf("%s: %+v %v", cmd.Kind, res, err)
		}
	}
	for _, subject := range []string{"busy", "gone"} {
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: subject, Route: "chat", Region: ledger.DefaultRegion},
			Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 1000}}, EpochLength: time.Hour}.WithDefaults()
		do(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
	}
	// Each subject's reserves an hour apart close two hourly epochs,
	// ended about 95 and 94 hours ago.
	for i := range 3 {
		for _, subject := range []string{"busy", "gone"} {
			id := fmt.Sprintf("%s-%d", subject, i)
			do(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
				Subject: subject, Route: "chat", Region: ledger.DefaultRegion, Units: ledger.Amounts{10}})
		}
		then = then.Add(time.Hour)
	}
	e.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	srv := startServer(t, bin, dir, "--statement-retention", "24h", "--retention-interval", "50ms", "--compaction", "0")
	statements := func(subject string) []any {
		t.Helper()
		status, out, _ := shardCall(t, srv.url, "ConsoleService/ListStatements", `{"subject":"`+subject+`","route":"chat","policyGeneration":"`+
			map[string]string{"busy": "1", "gone": "2"}[subject]+`"}`)
		if status != http.StatusOK {
			t.Fatalf("ListStatements %s: %d %v; want 200", subject, status, out)
		}
		list, _ := out["statements"].([]any)
		return list
	}
	// busy closes its last epoch now, in one statement with the idle
	// stretch after it, which ended this hour: kept.
	mustPost(t, srv.url, "Reserve", `{"reservationId":"busy-now","subject":"busy","route":"chat","units":{"tokens":10}}`)
	deadline := time.Now().Add(30 * time.Second)
	for counter(statusz(t, srv.url), "retention", "statementsRemoved") < 4 || len(statements("gone")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("/statusz retention %v: want 4 statements removed\n%s", statusz(t, srv.url)["retention"], srv.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Another pass or two, which must remove nothing more.
	passes := counter(statusz(t, srv.url), "retention", "passes")
	for counter(statusz(t, srv.url), "retention", "passes") < passes+2 {
		time.Sleep(20 * time.Millisecond)
	}
	if got := counter(statusz(t, srv.url), "retention", "statementsRemoved"); got != 4 {
		t.Errorf("/statusz retention.statementsRemoved %d, want 4", got)
	}
	if got := metricValue(t, srv.url, `capledger_retention_removed_total{kind="statement"}`); got != 4 {
		t.Errorf(`capledger_retention_removed_total{kind="statement"} %v, want 4`, got)
	}
	list := statements("busy")
	if len(list) != 1 {
		t.Fatalf("ListStatements of busy: %v, want the one statement that ended this hour", list)
	}
	if end, err := time.Parse(time.RFC3339, list[0].(map[string]any)["epochEnd"].(string)); err != nil || time.Since(end) > 2*time.Hour {
		t.Errorf("busy's kept statement %v ended at %v (%v), want within the last hour", list[0], end, err)
	}
	if d, _ := mustPost(t, srv.url, "Audit", `{}`)["discrepancies"].([]any); len(d) > 0 {
		t.Fatalf("audit after statement retention: %v", d)
	}
}
