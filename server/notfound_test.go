package server_test

import (
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// Every not_found answer has one shape, whichever method and whoever
// decides it (the server before the ledger, the ledger, a scoped token's
// refusal): 404 not_found, the message "<what> not found: <name>" naming
// what was asked for, and one ErrorDetail carrying the reason alone
// (API.md, "Not found"). They said "get reservation x: reservation x: not
// found", "reservation not found: x", "settle: reservation not found: x",
// "policy generation not found: generation 9" and "rollout x: rollout x:
// not found" depending on the method.
func TestNotFoundAnswersHaveOneShape(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, shards: true})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, adminToken)
	// tenant-a's reservation and shard, outside gw-b's scope.
	h.ok("Reserve", `{"reservationId":"theirs","subject":"tenant-a/1","route":"chat.generate","units":{"tokens":5}}`, adminToken)
	post := func(path, body, token string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		return h.do(req)
	}
	if r := post("ShardService/IssueShard", `{"shardId":"their-shard","subject":"tenant-a/1","route":"chat.generate","units":{"tokens":5},"gatewayId":"gw-a","bootEpoch":"1","ttl":"60s"}`, adminToken); r.status != http.StatusOK {
		t.Fatalf("issue a shard: %d %s", r.status, r.raw)
	}
	cases := []struct {
		path, body, token, reason, message string
	}{
		{"LedgerService/GetReservation", `{"reservationId":"nope"}`, adminToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		{"LedgerService/Start", `{"reservationId":"nope","operationId":"op"}`, adminToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		{"LedgerService/Settle", `{"reservationId":"nope","operationId":"op","actualUnits":{"tokens":1}}`, adminToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		{"LedgerService/Release", `{"reservationId":"nope"}`, adminToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		{"LedgerService/MarkUsageUnknown", `{"reservationId":"nope"}`, adminToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		// A scoped token: outside the scope and missing read the same.
		{"LedgerService/GetReservation", `{"reservationId":"theirs"}`, gwBToken, "RESERVATION_NOT_FOUND", "reservation not found: theirs"},
		{"LedgerService/GetReservation", `{"reservationId":"nope"}`, gwBToken, "RESERVATION_NOT_FOUND", "reservation not found: nope"},
		{"LedgerService/Settle", `{"reservationId":"theirs","operationId":"op","actualUnits":{"tokens":1}}`, gwBToken, "RESERVATION_NOT_FOUND", "reservation not found: theirs"},
		{"LedgerService/Release", `{"reservationId":"theirs"}`, gwBToken, "RESERVATION_NOT_FOUND", "reservation not found: theirs"},
		{"LedgerService/GetPolicy", `{"generation":"9"}`, adminToken, "POLICY_NOT_FOUND", "policy generation not found: 9"},
		{"LedgerService/RollbackPolicy", `{"generation":"9"}`, adminToken, "POLICY_NOT_FOUND", "policy generation not found: 9"},
		{"LedgerService/Reserve", `{"reservationId":"r","subject":"tenant-b/1","route":"other","units":{"tokens":1}}`, adminToken, "NO_POLICY", "no active policy: tenant-b/1/other@global"},
		{"LedgerService/Reserve", `{"reservationId":"r","subject":"tenant-a/1","route":"chat.generate","units":{"tokens":1}}`, gwBToken, "NO_POLICY", "no active policy: tenant-a/1/chat.generate@global"},
		{"ShardService/GetShard", `{"shardId":"nope"}`, adminToken, "SHARD_NOT_FOUND", "shard not found: nope"},
		{"ShardService/GetShard", `{"shardId":"their-shard"}`, gwBToken, "SHARD_NOT_FOUND", "shard not found: their-shard"},
		{"ShardService/ReconcileShard", `{"shardId":"nope","gatewayId":"gw-b"}`, gwBToken, "SHARD_NOT_FOUND", "shard not found: nope"},
		{"RolloutService/GetRollout", `{"name":"nope"}`, adminToken, "ROLLOUT_NOT_FOUND", "rollout not found: nope"},
		{"RolloutService/SetRolloutShare", `{"name":"nope","percent":5}`, adminToken, "ROLLOUT_NOT_FOUND", "rollout not found: nope"},
		{"RolloutService/UndoRolloutStep", `{"name":"nope"}`, adminToken, "ROLLOUT_NOT_FOUND", "rollout not found: nope"},
		{"RolloutService/RollbackGenerations", `{"generations":["1","9"]}`, adminToken, "POLICY_NOT_FOUND", "policy generation not found: 9"},
		{"RolloutService/DrainProgress", `{"generations":["9"]}`, adminToken, "POLICY_NOT_FOUND", "policy generation not found: 9"},
	}
	for _, c := range cases {
		r := post(c.path, c.body, c.token)
		if r.status != http.StatusNotFound || r.body["code"] != "not_found" || r.body["message"] != c.message {
			t.Errorf("%s %s: got %d %s, want 404 not_found %q", c.path, c.body, r.status, r.raw, c.message)
			continue
		}
		got := details(t, r)
		want := []proto.Message{&v1.ErrorDetail{Reason: c.reason}}
		if len(got) != 1 || !proto.Equal(got[0], want[0]) {
			t.Errorf("%s %s: details %v, want one ErrorDetail with reason %s alone", c.path, c.body, got, c.reason)
		}
	}
	// A batch item says the same.
	r := h.ok("SettleBatch", `{"requests":[{"reservationId":"nope","operationId":"op","actualUnits":{"tokens":1}}]}`, adminToken)
	item := r["outcomes"].([]any)[0].(map[string]any)["error"].(map[string]any)
	if item["code"] != "not_found" || item["message"] != "reservation not found: nope" {
		t.Errorf("settle batch item: %v", item)
	}
}
