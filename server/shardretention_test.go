package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/server"
)

// Retention removes an emergency shard a window after it was reconciled
// with nothing left unknown: /statusz counts it (retention.shardsRemoved)
// and /metrics (kind="shard"); ListShards no longer lists it, and
// GetShard and a reconciliation sent again answer 404 SHARD_NOT_FOUND,
// reminting nothing; IssueShard under its id carves a new shard.
func TestShardRemovedByRetentionOverJSON(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true, retention: time.Hour})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"1","refillInterval":"3600s"}]}}`, "")
	post := func(method, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	for _, id := range []string{"sh-old", "sh-open"} {
		if r := post("IssueShard", `{"shardId":"`+id+`","subject":"tenant-7","route":"chat.generate","units":{"tokens":100},"gatewayId":"gw","bootEpoch":"1","ttl":"60s"}`); r.status != http.StatusOK {
			t.Fatalf("issue %s: %d %s", id, r.status, r.raw)
		}
	}
	reconcile := `{"shardId":"sh-old","gatewayId":"gw","receipts":[{"reservationId":"l1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":30},"actualUnits":{"tokens":30}}]}`
	if r := post("ReconcileShard", reconcile); r.status != http.StatusOK {
		t.Fatalf("reconcile: %d %s", r.status, r.raw)
	}
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	var st server.Status
	if err := json.Unmarshal([]byte(h.get("/statusz")), &st); err != nil {
		t.Fatal(err)
	}
	if r := st.Retention; r == nil || r.ShardsRemoved != 1 || r.Retired != 0 {
		t.Fatalf("/statusz retention: %+v", st.Retention)
	}
	if m := h.get("/metrics"); !strings.Contains(m, `capledger_retention_removed_total{kind="shard"} 1`) ||
		!strings.Contains(m, `capledger_retention_removed_total{kind="reservation"} 0`) {
		t.Fatalf("/metrics: %s", grep(m, "capledger_retention_removed_total"))
	}
	if r := post("ListShards", `{}`); r.status != http.StatusOK || strings.Contains(string(r.raw), "sh-old") || !strings.Contains(string(r.raw), "sh-open") {
		t.Fatalf("list shards: %d %s", r.status, r.raw)
	}
	before := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	for method, body := range map[string]string{"GetShard": `{"shardId":"sh-old"}`, "ReconcileShard": reconcile} {
		if r := post(method, body); r.status != http.StatusNotFound || !strings.Contains(string(r.raw), "SHARD_NOT_FOUND") {
			t.Fatalf("%s of a removed shard: %d %s", method, r.status, r.raw)
		}
	}
	if after := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, ""); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a reconciliation of a removed shard changed the account: %v, was %v", after, before)
	}
	// Its id is free again: IssueShard carves a new shard under it.
	r := post("IssueShard", `{"shardId":"sh-old","subject":"tenant-7","route":"chat.generate","units":{"tokens":7},"gatewayId":"gw","bootEpoch":"1","ttl":"60s"}`)
	if r.status != http.StatusOK || r.body["replayed"] == true || !strings.Contains(string(r.raw), `"tokens":"7"`) {
		t.Fatalf("issue under a removed shard's id: %d %s", r.status, r.raw)
	}
}
