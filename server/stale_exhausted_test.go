package server_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/internal/racingstore"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// publisher returns a function that publishes a new generation of
// tenant-7's policy straight to the engine (past the server's cache, as
// another replica does), its burst one higher each time (equal terms
// would replay the active generation), with emergency mode for shards.
func publisher(t *testing.T, eng *engine.Engine, emergency bool) (publish func(), last func() uint64) {
	var mu sync.Mutex
	burst, generation := int64(1000), uint64(0)
	publish = func() {
		mu.Lock()
		defer mu.Unlock()
		burst++
		p, err := server.PolicyFromProto(&v1.Policy{Subject: "tenant-7", Route: "chat.generate", EmergencyMode: emergency,
			Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: burst}, {Unit: "requests", Burst: 10}}})
		if err != nil {
			t.Error(err)
			return
		}
		res, err := eng.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p})
		if err != nil || res.Err != nil {
			t.Errorf("publish: %+v %v", res, err)
			return
		}
		generation = res.Generation
	}
	return publish, func() uint64 { mu.Lock(); defer mu.Unlock(); return generation }
}

// wantStaleExhausted checks the answer to a command the ledger refused as
// stale on every attempt: 503 unavailable, STORE_CONFLICT with no field,
// a message saying nothing was applied, why, and to retry with the same
// ids.
func wantStaleExhausted(t *testing.T, h *harness, r response) {
	t.Helper()
	h.wantError(r, 503, "unavailable", server.ReasonStoreConflict)
	msg, _ := r.body["message"].(string)
	for _, says := range []string{"not applied", "the deciding policy generation changed while the call ran", "retry with the same ids"} {
		if !strings.Contains(msg, says) {
			t.Fatalf("message %q does not say %q", msg, says)
		}
	}
	for _, d := range details(t, r) {
		if ed, ok := d.(*v1.ErrorDetail); ok && ed.GetField() != "" {
			t.Fatalf("detail names field %q for a request that was fine: %s", ed.GetField(), r.raw)
		}
	}
}

// A Reserve, RecordUsage, ReserveBatch item and IssueShard whose policy
// key is published on (another replica) before every attempt reaches the
// ledger is refused as stale each time; after the last remapping
// (server.StaleRetries) the answer is 503 unavailable STORE_CONFLICT, "not
// applied", counted as unavailable, and the same request sent again once
// the publishes stop succeeds under the newest generation. It answered the
// ledger's refusal, 400 INVALID_COMMAND: a malformed request, though a
// retry succeeds.
func TestStaleOnEveryAttemptIsUnavailable(t *testing.T) {
	var racing *racingstore.Store
	h := newHarness(t, harnessOptions{shards: true, wrapStore: func(st store.Store) store.Store {
		racing = racingstore.New(st)
		return racing
	}})
	emergency := strings.Replace(tokensPolicy, `"holdTtl"`, `"emergencyMode":true,"holdTtl"`, 1)
	h.ok("PublishPolicy", emergency, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-8","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"1000"},{"unit":"requests","burst":"10"}]}}`, "")
	h.ok("Reserve", reserveBody("warm", 10), "") // caches generation 1
	publish, last := publisher(t, h.engine, true)

	// Reserve.
	racing.Arm(publish)
	before := h.commandCounts()
	wantStaleExhausted(t, h, h.call("Reserve", reserveBody("raced", 7), ""))
	if n := racing.Disarm(); n != server.StaleRetries {
		t.Fatalf("%d publishes raced the reserve's remappings, want %d (one per remapping)", n, server.StaleRetries)
	}
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 1})
	if got := h.call("GetReservation", `{"reservationId":"raced"}`, ""); got.status != 404 {
		t.Fatalf("the raced reserve was applied: %s", got.raw)
	}
	if res := h.ok("Reserve", reserveBody("raced", 7), ""); uint64(num(field(res, "reservation", "policyGeneration"))) != last() {
		t.Fatalf("retry of the raced reserve: %v, want generation %d", res, last())
	}

	// RecordUsage.
	record := `{"reservationId":"rec","operationId":"op-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":7,"requests":1}}`
	racing.Arm(publish)
	before = h.commandCounts()
	wantStaleExhausted(t, h, h.call("RecordUsage", record, ""))
	racing.Disarm()
	h.wantCounted(before, map[string]float64{"record/unavailable": 1})
	if res := h.ok("RecordUsage", record, ""); res["replayed"] == true || uint64(num(field(res, "reservation", "policyGeneration"))) != last() {
		t.Fatalf("retry of the raced record: %v, want recorded now under generation %d", res, last())
	}

	// ReserveBatch: the raced item answers its own 503; another key's
	// item is admitted.
	other := `{"reservationId":"calm","subject":"tenant-8","route":"chat.generate","units":{"tokens":5,"requests":1}}`
	racing.Arm(publish)
	before = h.commandCounts()
	batch := h.ok("ReserveBatch", `{"requests":[`+reserveBody("b-raced", 5)+`,`+other+`]}`, "")
	racing.Disarm()
	outcomes := batch["outcomes"].([]any)
	item := field(outcomes[0].(map[string]any), "error").(map[string]any)
	if item["code"] != "unavailable" || field(item, "detail", "reason") != server.ReasonStoreConflict ||
		field(item, "detail", "field") != nil || !strings.Contains(item["message"].(string), "not applied") {
		t.Fatalf("raced batch item: %v", outcomes[0])
	}
	if field(outcomes[1].(map[string]any), "ok", "reservation", "reservationId") != "calm" {
		t.Fatalf("the other key's item: %v", outcomes[1])
	}
	h.wantCounted(before, map[string]float64{"reserve/unavailable": 1, "reserve/ok": 1})
	if got := h.call("GetReservation", `{"reservationId":"b-raced"}`, ""); got.status != 404 {
		t.Fatalf("the raced batch item was applied: %s", got.raw)
	}
	h.ok("ReserveBatch", `{"requests":[`+reserveBody("b-raced", 5)+`]}`, "")

	// IssueShard.
	const metric = "capledger_shard_commands_total"
	issue := func() response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard", strings.NewReader(
			`{"shardId":"sh-1","subject":"tenant-7","route":"chat.generate","units":{"tokens":100,"requests":2},"gatewayId":"gw-1","bootEpoch":"1","ttl":"600s"}`))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	racing.Arm(publish)
	shardsBefore := h.kindOutcomeCounts(metric)
	wantStaleExhausted(t, h, issue())
	racing.Disarm()
	h.wantGrown(metric, shardsBefore, map[string]float64{"shard_issue/unavailable": 1})
	if r := issue(); r.status != 200 || uint64(num(field(r.body, "shard", "policyGeneration"))) != last() {
		t.Fatalf("retry of the raced issue: %d %s", r.status, r.raw)
	}
	if audit := h.ok("Audit", `{}`, ""); audit["discrepancies"] != nil {
		t.Fatalf("audit: %v", audit)
	}
}
