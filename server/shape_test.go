package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// A command of a bad shape (negative units, above 2^53 in a settle) is
// 400 INVALID_COMMAND whatever its id names: unknown, removed by
// retention, settled or released. The shape is checked before the
// reservation is looked up (API.md, "Order of checks"), alone and in
// batches, so a gateway's bug never reads as a lost reservation or a
// finished one.
func TestShapeBeforeLookup(t *testing.T) {
	h := newHarness(t, harnessOptions{retention: time.Hour})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("removed", 600), "")
	h.ok("Start", `{"reservationId":"removed","operationId":"op-1"}`, "")
	h.ok("Settle", `{"reservationId":"removed","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, "")
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.ok("Reserve", reserveBody("done", 600), "")
	h.ok("Start", `{"reservationId":"done","operationId":"op-1"}`, "")
	h.ok("Settle", `{"reservationId":"done","operationId":"op-1","actualUnits":{"tokens":200,"requests":1}}`, "")
	h.ok("Reserve", reserveBody("freed", 600), "")
	h.ok("Release", `{"reservationId":"freed"}`, "")

	bad := []string{`{"tokens":-1,"requests":1}`, `{"tokens":"9007199254740993","requests":1}`, `{"":1}`}
	for _, id := range []string{"unknown", "removed", "done", "freed"} {
		for _, units := range bad {
			body := `{"reservationId":"` + id + `","operationId":"op-1","actualUnits":` + units + `}`
			h.wantError(h.call("Settle", body, ""), 400, "invalid_argument", server.ReasonInvalidCommand)
			res := h.ok("SettleBatch", `{"requests":[`+body+`]}`, "")
			if o := field(res["outcomes"].([]any)[0].(map[string]any), "error", "detail", "reason"); o != server.ReasonInvalidCommand {
				t.Errorf("SettleBatch %s %s: %v, want INVALID_COMMAND", id, units, res)
			}
		}
	}
	// Reserve: negative units are INVALID_COMMAND even where no policy
	// admits (NO_POLICY needs the policy; the shape does not).
	nowhere := `{"reservationId":"r-1","subject":"tenant-7","route":"no.such.route","units":{"tokens":-1}}`
	h.wantError(h.call("Reserve", nowhere, ""), 400, "invalid_argument", server.ReasonInvalidCommand)
	res := h.ok("ReserveBatch", `{"requests":[`+nowhere+`]}`, "")
	if o := field(res["outcomes"].([]any)[0].(map[string]any), "error", "detail", "reason"); o != server.ReasonInvalidCommand {
		t.Errorf("ReserveBatch with negative units and no policy: %v, want INVALID_COMMAND", res)
	}
}

// ReconcileShard: a receipt of a bad shape (negative units, no id, an id
// twice, a RESERVED receipt) is INVALID_COMMAND before the shard is
// looked up: for an unknown shard, and for another gateway's, which
// counts no refused submission for it. IssueShard of nothing is
// INVALID_COMMAND before its shard id is looked up.
func TestShardReceiptShapeBeforeLookup(t *testing.T) {
	h := newShardHarness(t)
	h.publish(t, true)
	ctx := context.Background()
	if _, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-b", "gw-b", 10))); err != nil {
		t.Fatal(err)
	}
	settled := v1.ReservationState_RESERVATION_STATE_SETTLED
	bad := map[string][]*v1.ShardReceipt{
		"negative": {{ReservationId: "l-1", State: settled,
			ReservedUnits: map[string]int64{"tokens": 5}, ActualUnits: map[string]int64{"tokens": -1}}},
		"no id":    {{State: settled}},
		"id twice": {{ReservationId: "l-1", State: settled}, {ReservationId: "l-1", State: settled}},
		"reserved": {{ReservationId: "l-1", State: v1.ReservationState_RESERVATION_STATE_RESERVED}},
	}
	for _, shard := range []string{"no-such-shard", "sh-b"} {
		for name, receipts := range bad {
			_, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{
				ShardId: shard, GatewayId: "gw-a", Receipts: receipts}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("ReconcileShard %s, receipts %s: %v, want invalid_argument", shard, name, err)
			}
		}
	}
	got, err := h.shards.GetShard(ctx, connect.NewRequest(&v1.GetShardRequest{ShardId: "sh-b"}))
	if err != nil {
		t.Fatal(err)
	}
	if n := got.Msg.GetShard().GetRefusedSubmissions(); n != 0 {
		t.Errorf("malformed submissions counted %d refusals on another gateway's shard", n)
	}
	for _, id := range []string{"sh-b", "sh-new"} {
		req := issueRequest(id, "gw-b", 0)
		req.Units = map[string]int64{"tokens": 0}
		_, err := h.shards.IssueShard(ctx, connect.NewRequest(req))
		wantShardError(t, err, connect.CodeInvalidArgument, server.ReasonInvalidCommand)
	}
}

// A Reserve without a subject, a route or anything to reserve is 400
// INVALID_COMMAND whatever its id names: a live reservation and one
// removed by retention answer it as an unknown id does (never
// DIGEST_MISMATCH, never a replay), and for a scoped token it is not the
// out-of-scope NO_POLICY either (API.md, "Order of checks": the shape
// before the scope and before the reservation).
func TestReserveShapeBeforeLookup(t *testing.T) {
	h := newHarness(t, harnessOptions{retention: time.Hour, auth: true, tokens: scopedTokens})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("removed", 600), adminToken)
	h.ok("Release", `{"reservationId":"removed"}`, adminToken)
	h.clock.Advance(2 * time.Hour)
	if err := h.engine.RunRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	live := h.ok("Reserve", reserveBody("live", 600), adminToken)
	digest := field(live, "reservation", "requestDigest")

	bad := map[string]string{
		"no subject":    `"route":"chat.generate","units":{"tokens":600,"requests":1}`,
		"no route":      `"subject":"tenant-7","units":{"tokens":600,"requests":1}`,
		"no units":      `"subject":"tenant-7","route":"chat.generate","units":{}`,
		"only zeros":    `"subject":"tenant-7","route":"chat.generate","units":{"tokens":0}`,
		"units omitted": `"subject":"tenant-7","route":"chat.generate"`,
	}
	for _, id := range []string{"unknown", "removed", "live"} {
		for name, rest := range bad {
			// The live reservation's own digest too: a malformed request
			// is refused even when its digest would replay.
			for _, dig := range []string{"", `"requestDigest":"` + digest.(string) + `",`} {
				body := `{"reservationId":"` + id + `",` + dig + rest + `}`
				r := h.call("Reserve", body, adminToken)
				if r.status != http.StatusBadRequest || detailReason(t, r) != server.ReasonInvalidCommand {
					t.Errorf("Reserve %s (%s): %d %s, want 400 INVALID_COMMAND", id, name, r.status, r.raw)
				}
				res := h.ok("ReserveBatch", `{"requests":[`+body+`]}`, adminToken)
				if o := field(res["outcomes"].([]any)[0].(map[string]any), "error", "detail", "reason"); o != server.ReasonInvalidCommand {
					t.Errorf("ReserveBatch %s (%s): %v, want INVALID_COMMAND", id, name, res)
				}
			}
		}
	}
	// A scoped gateway: nothing to reserve for a subject outside its
	// scope is still the shape's answer, not NO_POLICY.
	r := h.call("Reserve", `{"reservationId":"b-1","subject":"tenant-7","route":"chat.generate","units":{}}`, gwBToken)
	if r.status != http.StatusBadRequest || detailReason(t, r) != server.ReasonInvalidCommand {
		t.Errorf("scoped Reserve of no units outside the scope: %d %s, want 400 INVALID_COMMAND", r.status, r.raw)
	}
}

// A gateway token acting for another gateway is refused (403) before the
// request's shape is looked at, as for any method its role may not call
// (API.md, "Order of checks": 401 and 403 first): IssueShard and
// ReconcileShard for gw-b with gw-a's token are 403 whatever their shard
// id, never a 400 that tells gw-a how gw-b's request would fare.
func TestOtherGatewayRefusedBeforeShape(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, shards: true})
	for _, c := range []struct{ method, body string }{
		{"IssueShard", `{"shardId":"sh\u0000","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":5},"gatewayId":"gw-b","bootEpoch":"1","ttl":"60s"}`},
		{"IssueShard", `{"shardId":"","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":5},"gatewayId":"gw-b","bootEpoch":"1","ttl":"60s"}`},
		{"ReconcileShard", `{"shardId":"sh\u0000","gatewayId":"gw-b"}`},
		{"ReconcileShard", `{"shardId":"","gatewayId":"gw-b","receipts":[{"reservationId":"a\u0000","state":"RESERVATION_STATE_RELEASED"}]}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+c.method, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+gwAToken)
		h.wantError(h.do(req), http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	}
}

// An IssueShard's bootEpoch above 2^63-1, which the stores cannot keep
// (signed 64-bit columns), is 400 INVALID_COMMAND naming bootEpoch,
// decided with the shape: it was a 503 STORE_UNAVAILABLE telling the
// gateway to retry with the same ids, which fails the same way forever.
// The largest storable one is issued.
func TestIssueShardBootEpochAboveStorable(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", strings.Replace(tokensPolicy, `"holdTtl"`, `"emergencyMode":true,"holdTtl"`, 1), "")
	issue := func(id, bootEpoch string) response {
		body := `{"shardId":"` + id + `","subject":"tenant-7","route":"chat.generate",
			"units":{"tokens":1},"gatewayId":"gw","bootEpoch":"` + bootEpoch + `","ttl":"60s"}`
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	for _, bootEpoch := range []string{"9223372036854775808", "18446744073709551615"} {
		r := issue("sh-"+bootEpoch, bootEpoch)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if message, _ := r.body["message"].(string); !strings.HasPrefix(message, "bootEpoch "+bootEpoch+" is above") {
			t.Errorf("bootEpoch %s: %s", bootEpoch, r.raw)
		}
		if f := field(r.body["details"].([]any)[0].(map[string]any), "debug", "field"); f != "bootEpoch" {
			t.Errorf("bootEpoch %s: detail field %v, want bootEpoch: %s", bootEpoch, f, r.raw)
		}
	}
	if r := issue("sh-max", "9223372036854775807"); r.status != http.StatusOK || field(r.body, "shard", "bootEpoch") != "9223372036854775807" {
		t.Errorf("bootEpoch 2^63-1: %d %s", r.status, r.raw)
	}
}
