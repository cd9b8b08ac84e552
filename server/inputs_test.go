package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

// Bad policy terms found by an outside pass: a fairness budget of NaN
// passed the [0, 1] check (every comparison with NaN is false) and reached
// the store, where SQLite refused the row (503 STORE_UNAVAILABLE) and
// PostgreSQL kept it, so the same terms published twice made two
// generations (NaN != NaN). Each is 400 INVALID_POLICY and publishes
// nothing.
func TestPolicyNaNFairnessBudgetIsInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, budget := range []string{`"NaN"`, `"Infinity"`, `"-Infinity"`} {
		r := h.call("PublishPolicy", `{"policy":{"subject":"t","route":"r","fairnessBudget":`+budget+`,
			"dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), "fairness budget") {
			t.Errorf("fairnessBudget %s: the message does not name the field: %s", budget, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
}

// A Duration the proto allows (up to 10,000 years) but Go's time.Duration
// cannot hold (about 292 years) was saturated silently: a refill interval
// of 315576000000s was stored as 9223372036.854775807s. Each policy
// duration beyond the range is 400 INVALID_POLICY naming the field, and
// the longest one that fits is kept exactly.
func TestPolicyDurationBeyondRangeIsInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const tooLong = `"315576000000s"`
	for field, body := range map[string]string{
		"refill_interval": `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":` + tooLong + `}]}}`,
		"hold_ttl":        `{"policy":{"subject":"t","route":"r","holdTtl":` + tooLong + `,"dimensions":[{"unit":"tokens","burst":"10"}]}}`,
		"execution_limit": `{"policy":{"subject":"t","route":"r","executionLimit":` + tooLong + `,"dimensions":[{"unit":"tokens","burst":"10"}]}}`,
		"epoch_length":    `{"policy":{"subject":"t","route":"r","epochLength":"9223372037s","dimensions":[{"unit":"tokens","burst":"10"}]}}`,
	} {
		r := h.call("PublishPolicy", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), field) {
			t.Errorf("%s: the message does not name the field: %s", field, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
	pub := h.ok("PublishPolicy", `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"9223372036s"}]}}`, "")
	if got := field(pub, "policy", "dimensions"); fmt.Sprint(got) != "[map[burst:10 maxReservation:10 refillInterval:9223372036s refillUnits:1 unit:tokens]]" {
		t.Errorf("the longest interval that fits was published as %v", got)
	}
}

// A Reserve's request_digest was unbounded: a 1 MiB digest was stored
// with the reservation (and its tombstone for 30 days) and returned by
// every read of it. A digest over ledger.MaxDigestBytes is 400
// INVALID_COMMAND and reserves nothing; one at the bound is kept.
func TestRequestDigestOverTheLimitIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	body := func(id, digest string) string {
		return fmt.Sprintf(`{"reservationId":%q,"requestDigest":%q,"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, id, digest)
	}
	r := h.call("Reserve", body("long", "sha256:"+strings.Repeat("a", ledger.MaxDigestBytes)), "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	if !strings.Contains(r.body["message"].(string), "request_digest") {
		t.Errorf("the message does not name the field: %s", r.raw)
	}
	h.wantError(h.call("GetReservation", `{"reservationId":"long"}`, ""), http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
	// ReserveBatch items go through the same check.
	batch := h.ok("ReserveBatch", `{"requests":[`+body("long", strings.Repeat("b", ledger.MaxDigestBytes+1))+`]}`, "")
	if got := field(batch, "outcomes"); !strings.Contains(fmt.Sprint(got), "INVALID_COMMAND") {
		t.Errorf("batch item with a long digest: %v", got)
	}
	account := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, "")
	if strings.Contains(fmt.Sprint(account), "reserved") {
		t.Errorf("a refused reserve held capacity: %v", account)
	}
	atBound := strings.Repeat("c", ledger.MaxDigestBytes)
	got := h.ok("Reserve", body("bound", atBound), "")
	if field(got, "reservation", "requestDigest") != atBound {
		t.Errorf("a digest at the bound was not kept: %v", field(got, "reservation", "requestDigest"))
	}
}

// capledger_commands_total counts "commands answered" with their reason
// (API.md, Metrics), and Reserve, Settle and RecordUsage counted the
// refusals decided at the door (400 INVALID_COMMAND, an out-of-scope 404),
// but Start, Release and MarkUsageUnknown did not, and neither did
// IssueShard and ReconcileShard in capledger_shard_commands_total (an
// outside pass sent 13 malformed IssueShards and saw one counted). Each
// refusal now counts once under its reason.
func TestDoorRefusalsAreCounted(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.wantError(h.call("Start", `{"reservationId":"r"}`, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(h.call("Start", `{"reservationId":"","operationId":"op"}`, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(h.call("Release", `{"reservationId":""}`, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(h.call("MarkUsageUnknown", `{"reservationId":"`+strings.Repeat("x", 257)+`"}`, ""), http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	shard := func(method, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	h.wantError(shard("IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":-1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(shard("IssueShard", `{"shardId":"","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	// Refused at the door's text check (an over-long shard id), before the handler.
	h.wantError(shard("IssueShard", `{"shardId":"`+strings.Repeat("s", 257)+`","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"60s"}`),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	h.wantError(shard("ReconcileShard", `{"shardId":"s","gatewayId":"gw","receipts":[{"reservationId":"","state":"RESERVATION_STATE_SETTLED"}]}`),
		http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	metrics := h.get("/metrics")
	for _, want := range []string{
		`capledger_commands_total{kind="start",outcome="invalid_command"} 2`,
		`capledger_commands_total{kind="release",outcome="invalid_command"} 1`,
		`capledger_commands_total{kind="mark_usage_unknown",outcome="invalid_command"} 1`,
		`capledger_shard_commands_total{kind="shard_issue",outcome="invalid_command"} 3`,
		`capledger_shard_commands_total{kind="shard_reconcile",outcome="invalid_command"} 1`,
	} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "commands_total"))
		}
	}
}

// GetAccount's subject, route and region are at most 512 bytes each, as
// everywhere (API.md, Limits; GetAccount's errors: 400 INVALID_COMMAND),
// but a longer one answered 200 with no accounts, as for a subject that
// never reserved: a gateway with a key-building bug read "no account"
// where every write with the same key was refused.
func TestGetAccountRefusesOverlongKeys(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	long := strings.Repeat("k", ledger.MaxKeyBytes+1)
	for _, body := range []string{
		`{"subject":"` + long + `","route":"chat.generate"}`,
		`{"subject":"tenant-7","route":"` + long + `"}`,
		`{"subject":"tenant-7","route":"chat.generate","region":"` + long + `"}`,
	} {
		r := h.call("GetAccount", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if !strings.Contains(r.body["message"].(string), "at most 512") {
			t.Errorf("the message does not say the bound: %s", r.raw)
		}
	}
	atBound := strings.Repeat("k", ledger.MaxKeyBytes)
	if got := h.ok("GetAccount", `{"subject":"`+atBound+`","route":"chat.generate"}`, ""); len(got) != 0 {
		t.Errorf("a subject at the bound that never reserved: %v", got)
	}
}
