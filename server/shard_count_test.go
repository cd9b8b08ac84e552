package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/capledger/capledger/server"
)

// capledger_shard_commands_total counts every shard command answered
// (API.md, Metrics), but a ReconcileShard answered 404 SHARD_NOT_FOUND
// (a shard never issued, or one retention removed after its
// reconciliation: the SDK's Emergency.Reconcile meets it) and an
// IssueShard answered SHARDS_DISABLED were not counted: /metrics showed
// nothing for them.
func TestShardRefusalsAfterTheDoorAreCounted(t *testing.T) {
	for _, withKeys := range []bool{true, false} {
		h := newHarness(t, harnessOptions{shards: withKeys})
		h.ok("PublishPolicy", tokensPolicy, "")
		shard := func(method, body string) response {
			req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			return h.do(req)
		}
		var want []string
		if withKeys {
			for range 2 {
				h.wantError(shard("ReconcileShard", `{"shardId":"never-issued","gatewayId":"gw","receipts":[]}`),
					http.StatusNotFound, "not_found", server.ReasonShardNotFound)
			}
			want = append(want, `capledger_shard_commands_total{kind="shard_reconcile",outcome="shard_not_found"} 2`)
		} else {
			h.wantError(shard("IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`),
				http.StatusBadRequest, "failed_precondition", server.ReasonShardsDisabled)
			want = append(want, `capledger_shard_commands_total{kind="shard_issue",outcome="shards_disabled"} 1`)
		}
		metrics := h.get("/metrics")
		for _, w := range want {
			if !strings.Contains(metrics, w+"\n") {
				t.Errorf("keys %v: metrics lack %s:\n%s", withKeys, w, grep(metrics, "shard_commands_total"))
			}
		}
	}
}
