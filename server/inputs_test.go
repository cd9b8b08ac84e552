package server_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
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
		if !strings.Contains(r.body["message"].(string), "fairnessBudget") {
			t.Errorf("fairnessBudget %s: the message does not name the field: %s", budget, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
}

// A refused policy's message names the refused term as the JSON spells
// it (holdTtl, refillUnits, dimensions[0].unit), the way a client wrote
// it: the ledger's checks wrote "hold TTL", "refill units", "max
// reservation" while the server's wrote hold_ttl, and a client had to
// guess which field either meant.
func TestPolicyRefusalsNameTheJSONField(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	policy := func(terms, dimension string) string {
		return `{"policy":{"subject":"t","route":"r"` + terms + `,"dimensions":[{"unit":"tokens","burst":"10"` + dimension + `}]}}`
	}
	for want, body := range map[string]string{
		"holdTtl 0.050s is shorter":                                   policy(`,"holdTtl":"0.05s"`, ""),
		"executionLimit -1s is negative":                              policy(`,"executionLimit":"-1s"`, ""),
		"epochLength 0.500s is shorter":                               policy(`,"epochLength":"0.5s"`, ""),
		"fairnessWeight -1 is outside [1, 1048576]":                   policy(`,"fairnessWeight":"-1"`, ""),
		"fairnessBudget 2 is outside [0, 1]":                          policy(`,"fairnessBudget":2`, ""),
		"policy.dimensions[0].refillUnits -1 is outside":              policy("", `,"refillUnits":"-1"`),
		"policy.dimensions[0].refillInterval 0s must be above 0":      policy("", `,"refillUnits":"1"`),
		"policy.dimensions[0].maxReservation 11 is outside (0, burst": policy("", `,"maxReservation":"11"`),
		"policy.dimensions[0].maxOverdraft -1 is outside":             policy("", `,"maxOverdraft":"-1"`),
		"dimensions[0].unit is empty":                                 `{"policy":{"subject":"t","route":"r","dimensions":[{"burst":"10"}]}}`,
		"rollout 7 is neither ROLLOUT_MODE_ENFORCE nor":               policy(`,"rollout":7`, ""),
		"policy is required":                                          `{}`,
		"policy.dimensions[0].refillInterval -1.500s must be above 0": policy("", `,"refillInterval":"-1.5s","refillUnits":"1"`),
	} {
		r := h.call("PublishPolicy", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if message, _ := r.body["message"].(string); !strings.Contains(message, want) {
			t.Errorf("want a message with %q: %s", want, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
}

// A refused command's message names the field as the JSON spells it
// (reservationId, actualUnits, pageToken), as policy refusals do: they
// named it by its proto name (reservation_id), which no JSON client
// sends or reads back.
func TestCommandRefusalsNameTheJSONField(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("named", 1), "")
	for _, c := range []struct{ method, body, want, reason string }{
		{"Reserve", `{"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "reservationId is required", ""},
		{"Reserve", `{"reservationId":"n1","requestDigest":"record:x","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "requestDigest: ", ""},
		{"Reserve", `{"reservationId":"n1","legacyDecision":"maybe","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, `legacyDecision "maybe"`, ""},
		{"Reserve", `{"reservation_id":"n1\u0000","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`, "reservationId contains a NUL byte", ""},
		{"Start", `{"reservationId":"named"}`, "operationId is required", ""},
		{"Settle", `{"reservationId":"named","operationId":"op","actualUnits":{"tokens":-1}}`, `actualUnits: "tokens" is negative`, ""},
		{"RecordUsage", `{"reservationId":"n2","operationId":"op","subject":"tenant-7","route":"chat.generate"}`, "actualUnits: no usage to record", ""},
		{"ListUsageUnknown", `{"pageSize":5000}`, "pageSize 5000: want 1 to 1000", ""},
		{"ListDebts", `{"pageToken":"nonsense"}`, "pageToken: ", ""},
		{"ShardService/IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","ttl":"60s"}`, "bootEpoch is required", ""},
		{"ShardService/IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1}`, "ttl must be above 0", ""},
		{"RolloutService/CreateRollout", `{"name":"c","hashBy":"x","routes":[{"route":"chat.generate"}]}`, `hashBy "x" is neither`, server.ReasonInvalidRollout},
		{"RolloutService/CreateRollout", `{"name":"c","hashBy":"route","routes":[{"route":"chat.generate"},{"route":"*"}]}`, `routes[1].route "*" is not a wildcard`, server.ReasonInvalidRollout},
		{"RolloutService/CreateRollout", `{"name":"c","hashBy":"route","routes":[{"region":"eu"}]}`, "routes[0].route is empty", server.ReasonInvalidRollout},
	} {
		if c.reason == "" {
			c.reason = server.ReasonInvalidCommand
		}
		path := "LedgerService/" + c.method
		if strings.Contains(c.method, "/") {
			path = c.method
		}
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+path, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", c.reason)
		if message, _ := r.body["message"].(string); !strings.Contains(message, c.want) {
			t.Errorf("%s %s: want a message with %q: %s", c.method, c.body, c.want, r.raw)
		}
	}
}

// A Duration the proto allows (up to 10,000 years) but Go's time.Duration
// cannot hold (about 292 years) was saturated silently: a refill interval
// of 315576000000s was stored as 9223372036.854775807s. Each policy
// duration above the one maximum, 9223372036s (docs/API.md, Durations),
// is 400 INVALID_POLICY naming the field as the JSON spells it and the
// value as it was sent; a fraction past the maximum is past it too (it
// was accepted up to .854775807s, what a time.Duration holds, while the
// docs said 9223372036s), and the maximum itself is kept exactly.
func TestPolicyDurationBeyondRangeIsInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	const dimension = `"dimensions":[{"unit":"tokens","burst":"10"}]`
	for _, c := range []struct{ field, value, body string }{
		{"dimensions[0].refillInterval", "315576000000s", `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"315576000000s"}]}}`},
		{"dimensions[0].refillInterval", "9223372036.500s", `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"9223372036.5s"}]}}`},
		{"holdTtl", "315576000000s", `{"policy":{"subject":"t","route":"r","holdTtl":"315576000000s",` + dimension + `}}`},
		{"holdTtl", "9223372036.500s", `{"policy":{"subject":"t","route":"r","holdTtl":"9223372036.5s",` + dimension + `}}`},
		{"holdTtl", "9223372036.000000001s", `{"policy":{"subject":"t","route":"r","hold_ttl":"9223372036.000000001s",` + dimension + `}}`},
		{"executionLimit", "315576000000s", `{"policy":{"subject":"t","route":"r","executionLimit":"315576000000s",` + dimension + `}}`},
		{"executionLimit", "9223372036.999999999s", `{"policy":{"subject":"t","route":"r","executionLimit":"9223372036.999999999s",` + dimension + `}}`},
		{"executionLimit", "-9223372036.500s", `{"policy":{"subject":"t","route":"r","executionLimit":"-9223372036.5s",` + dimension + `}}`},
		{"epochLength", "9223372037s", `{"policy":{"subject":"t","route":"r","epochLength":"9223372037s",` + dimension + `}}`},
	} {
		r := h.call("PublishPolicy", c.body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		message, _ := r.body["message"].(string)
		if !strings.Contains(message, c.field+" "+c.value+" is ") || !strings.Contains(message, "9223372036s") {
			t.Errorf("%s %s: the message does not name the field, the value sent and the maximum: %s", c.field, c.value, r.raw)
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

// A policy with an execution limit under 1s or a refill interval under
// 1ms (both were accepted down to 1ns) is 400 INVALID_POLICY naming the
// field and the minimum; the minimums publish.
func TestPolicyDurationsBelowTheirMinimumAreInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for want, body := range map[string]string{
		"executionLimit 0.000000001s is shorter than the minimum 1s":                          `{"policy":{"subject":"t","route":"r","executionLimit":"0.000000001s","dimensions":[{"unit":"tokens","burst":"10"}]}}`,
		"executionLimit 0.999s is shorter than the minimum 1s":                                `{"policy":{"subject":"t","route":"r","executionLimit":"0.999s","dimensions":[{"unit":"tokens","burst":"10"}]}}`,
		"policy.dimensions[0].refillInterval 0.000000001s is shorter than the minimum 0.001s": `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"0.000000001s"}]}}`,
		"policy.dimensions[0].refillInterval 0.000999s is shorter than the minimum 0.001s":    `{"policy":{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"0.000999s"}]}}`,
	} {
		r := h.call("PublishPolicy", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), want) {
			t.Errorf("want a message with %q: %s", want, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
	h.ok("PublishPolicy", `{"policy":{"subject":"t","route":"r","executionLimit":"1s","dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"0.001s"}]}}`, "")
}

// A refusal names a duration and its limit as the API writes Durations
// (ledger.DurationText, the form protojson gives), so a client reads back
// what it sent: an epochLength over the 50-year maximum said
// "438300h0m0s", Go's form, while the request said "1577880001s".
func TestDurationRefusalsSpeakTheAPIsDurations(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, 999 * time.Microsecond, 100 * time.Millisecond, 1500 * time.Millisecond,
		time.Second, ledger.MaxEpochLength, -time.Nanosecond, -1500 * time.Millisecond, time.Duration(math.MaxInt64), time.Duration(math.MinInt64)} {
		wire, err := protojson.Marshal(durationpb.New(d))
		if err != nil {
			t.Fatal(err)
		}
		if got := ledger.DurationText(d); `"`+got+`"` != string(wire) {
			t.Errorf("DurationText(%s) = %s, the API writes %s", d, got, wire)
		}
	}
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	for want, body := range map[string]string{
		"epochLength 1577880001s is longer than the maximum 1577880000s (50 years)":            `{"policy":{"subject":"t","route":"r","epochLength":"1577880001s","dimensions":[{"unit":"tokens","burst":"10"}]}}`,
		"holdTtl 0.099s is shorter than the minimum 0.100s (leave it out for the default 60s)": `{"policy":{"subject":"t","route":"r","holdTtl":"0.099s","dimensions":[{"unit":"tokens","burst":"10"}]}}`,
	} {
		r := h.call("PublishPolicy", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if !strings.Contains(r.body["message"].(string), want) {
			t.Errorf("want a message with %q: %s", want, r.raw)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/IssueShard",
		strings.NewReader(`{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"3600.5s"}`))
	req.Header.Set("Content-Type", "application/json")
	r := h.do(req)
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	if want := "ttl 3600.500s is outside (0, 3600s]"; !strings.Contains(r.body["message"].(string), want) {
		t.Errorf("want a message with %q: %s", want, r.raw)
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
	if !strings.Contains(r.body["message"].(string), "requestDigest") {
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

// A policy's unit names and estimatorDigest were unbounded: a 10,000-byte
// unit name and a 100 kB digest were published, stored and shown in every
// policy read, metric label and console table. Each over its bound
// (ledger.MaxUnitBytes, ledger.MaxDigestBytes) is 400 INVALID_POLICY
// naming the field and publishes nothing; each at its bound is kept.
func TestPolicyUnitAndEstimatorDigestBounded(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	policy := func(unit, digest string) string {
		return fmt.Sprintf(`{"policy":{"subject":"t","route":"r","estimatorDigest":%q,"dimensions":[{"unit":%q,"burst":"10"}]}}`, digest, unit)
	}
	for name, c := range map[string]struct{ body, want string }{
		"long unit": {policy(strings.Repeat("u", 10000), "d"),
			fmt.Sprintf("dimensions[0].unit is 10000 bytes long; at most %d", ledger.MaxUnitBytes)},
		"unit one over": {policy(strings.Repeat("u", ledger.MaxUnitBytes+1), "d"),
			fmt.Sprintf("dimensions[0].unit is %d bytes long; at most %d", ledger.MaxUnitBytes+1, ledger.MaxUnitBytes)},
		"long digest": {policy("tokens", strings.Repeat("d", 100000)),
			fmt.Sprintf("estimatorDigest is 100000 bytes long; at most %d", ledger.MaxDigestBytes)},
	} {
		r := h.call("PublishPolicy", c.body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, c.want) {
			t.Errorf("%s: message %q does not say %q", name, msg, c.want)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
	atBound := strings.Repeat("u", ledger.MaxUnitBytes)
	h.ok("PublishPolicy", policy(atBound, strings.Repeat("d", ledger.MaxDigestBytes)), "")
	h.ok("Reserve", fmt.Sprintf(`{"reservationId":"r1","subject":"t","route":"r","units":{%q:1}}`, atBound), "")
}

// A policy stored before the bounds (published with a longer unit name
// and estimatorDigest) still loads: it is listed and admits, since only
// publishing checks the bounds (README, upgrade note).
func TestPolicyStoredBeforeTheBoundsStillLoads(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	ctx := context.Background()
	longUnit := strings.Repeat("u", 1000)
	old := ledger.Policy{
		Key: ledger.PolicyKey{Subject: "*", Route: "r", Region: ledger.DefaultRegion}, Generation: 1,
		EstimatorDigest: strings.Repeat("d", 2000),
		Dimensions:      []ledger.Dimension{{Unit: longUnit, Burst: 10, MaxReservation: 10}},
		PublishedAt:     h.clock.Now(),
	}.WithDefaults()
	tx, err := h.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Write(ctx, &store.Changes{
		Meta:     map[string]int64{ledger.MetaGeneration: 1},
		Policies: []ledger.Policy{old},
		Heads:    []ledger.PolicyHead{{Key: old.Key, Active: 1, Latest: 1}},
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := field(h.ok("GetPolicy", `{"generation":"1"}`, ""), "policy", "estimatorDigest"); got != old.EstimatorDigest {
		t.Errorf("the stored estimatorDigest reads back as %.40v", got)
	}
	h.ok("Reserve", fmt.Sprintf(`{"reservationId":"r1","subject":"s","route":"r","units":{%q:3}}`, longUnit), "")
	h.ok("Start", `{"reservationId":"r1","operationId":"op1"}`, "")
	h.ok("Settle", fmt.Sprintf(`{"reservationId":"r1","operationId":"op1","actualUnits":{%q:2}}`, longUnit), "")
}

// Messages found by an outside pass: RollbackPolicy of an unknown
// generation said `policy generation 9: policy generation 9: not found`
// (the server wrapped the store's words in its own), and RecordUsage
// without usage began `units:`, a field RecordUsage does not have (it is
// actual_units). Each message names the thing once, by its field.
func TestMessagesNameTheirSubjectOnce(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	r := h.call("RollbackPolicy", `{"generation":"9"}`, "")
	h.wantError(r, http.StatusNotFound, "not_found", server.ReasonPolicyNotFound)
	if msg, _ := r.body["message"].(string); msg != "policy generation not found: 9" {
		t.Errorf("RollbackPolicy of an unknown generation: message %q", msg)
	}
	r = h.call("RecordUsage", `{"reservationId":"rec-1","operationId":"op-rec-1","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":0}}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
	if msg, _ := r.body["message"].(string); !strings.HasPrefix(msg, "actualUnits: no usage to record") {
		t.Errorf("RecordUsage without usage: message %q", msg)
	}
}

// A shard write a gateway token makes for another gateway is 403 at the
// door and is not a command answered: capledger_shard_commands_total
// counts no permission_denied (API.md, Metrics: not 401/403).
func TestDoorDoesNotCountForbiddenShardWrites(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, shards: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	shard := func(method, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+gatewayToken)
		return h.do(req)
	}
	h.wantError(shard("IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw-2","bootEpoch":1,"ttl":"60s"}`),
		http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	h.wantError(shard("ReconcileShard", `{"shardId":"s","gatewayId":"gw-2","receipts":[]}`),
		http.StatusForbidden, "permission_denied", server.ReasonPermissionDenied)
	req, _ := http.NewRequest(http.MethodGet, h.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	metrics := string(h.do(req).raw)
	if !strings.Contains(metrics, "capledger_commands_total") {
		t.Fatalf("no metrics read:\n%s", metrics)
	}
	if strings.Contains(metrics, "permission_denied") {
		t.Errorf("a 403 was counted as a command answered:\n%s", grep(metrics, "commands_total"))
	}
}

// An empty gateway id of a shard write is refused by the door, the one
// place that checks it, before the token's right to act for a gateway
// (API.md, Order of checks: only a gatewayId that is no valid id is 400
// before the 403): 400 INVALID_COMMAND "gatewayId is required", counted
// as a shard command answered, over Connect JSON and gRPC, for a gateway
// token (which would otherwise be 403 for gateway "") and an admin token.
func TestEmptyGatewayIDIsRefusedAtTheDoor(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, shards: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	issue := &v1.IssueShardRequest{ShardId: "s", Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1},
		BootEpoch: 1, Ttl: durationpb.New(time.Minute)}
	reconcile := &v1.ReconcileShardRequest{ShardId: "s"}
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	transport := &http.Transport{Protocols: protocols, TLSClientConfig: &tls.Config{}}
	t.Cleanup(transport.CloseIdleConnections)
	answers := 0
	for _, token := range []string{gatewayToken, adminToken} {
		for _, c := range []struct{ method, body string }{
			{"IssueShard", `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"","bootEpoch":1,"ttl":"60s"}`},
			{"ReconcileShard", `{"shardId":"s","receipts":[]}`},
		} {
			req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+c.method, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			r := h.do(req)
			h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
			if msg, _ := r.body["message"].(string); msg != "gatewayId is required" {
				t.Errorf("%s with an empty gateway id (JSON): message %q", c.method, msg)
			}
			answers++
		}
		grpcShards := capledgerv1connect.NewShardServiceClient(&http.Client{Transport: transport, Timeout: 10 * time.Second}, h.url,
			connect.WithGRPC(), connect.WithInterceptors(bearer(token)))
		_, errIssue := grpcShards.IssueShard(context.Background(), connect.NewRequest(issue))
		_, errReconcile := grpcShards.ReconcileShard(context.Background(), connect.NewRequest(reconcile))
		for method, err := range map[string]error{"IssueShard": errIssue, "ReconcileShard": errReconcile} {
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "gatewayId is required") {
				t.Errorf("%s with an empty gateway id (gRPC): %v; want invalid_argument gatewayId is required", method, err)
			}
			answers++
		}
	}
	req, _ := http.NewRequest(http.MethodGet, h.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	metrics := string(h.do(req).raw)
	for _, kind := range []string{"shard_issue", "shard_reconcile"} {
		want := fmt.Sprintf(`capledger_shard_commands_total{kind=%q,outcome="invalid_command"} %d`, kind, answers/2)
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, grep(metrics, "shard_commands_total"))
		}
	}
}

// A unit name over a policy unit's bound (128 bytes) that the deciding
// generation does not have can be no unit of any policy published now: it
// is refused as 400 INVALID_COMMAND naming the field, without quoting the
// name, by every method that takes a units map (it was UNKNOWN_UNIT
// quoting all of it, here 10,000 bytes). A name at the bound is still
// UNKNOWN_UNIT naming it; a longer one a stored generation has keeps
// working (TestPolicyStoredBeforeTheBoundsStillLoads).
func TestOverlongUnitNameIsInvalidCommand(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","emergencyMode":true,
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"10","refillInterval":"1s"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"held","subject":"tenant-7","route":"chat.generate","units":{"tokens":5}}`, "")
	h.ok("Start", `{"reservationId":"held","operationId":"op"}`, "")
	post := func(path, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	if r := post("ShardService/IssueShard", `{"shardId":"sh","subject":"tenant-7","route":"chat.generate","units":{"tokens":5},"gatewayId":"gw","bootEpoch":"1","ttl":"60s"}`); r.status != http.StatusOK {
		t.Fatalf("issue a shard: %d %s", r.status, r.raw)
	}
	long := strings.Repeat("u", 10_000)
	reserve := `{"reservationId":"new","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"` + long + `":1}}`
	settle := `{"reservationId":"held","operationId":"op","actualUnits":{"tokens":1,"` + long + `":0}}`
	reconcileReserved := `{"shardId":"sh","gatewayId":"gw","receipts":[{"reservationId":"local-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1,"` + long + `":0},"actualUnits":{"tokens":1}}]}`
	reconcileActual := `{"shardId":"sh","gatewayId":"gw","receipts":[{"reservationId":"local-1","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1},"actualUnits":{"tokens":1,"` + long + `":0}}]}`
	want := "a unit name is 10000 bytes long; at most 128"
	for _, c := range []struct {
		path, body, field string
		batch             bool
	}{
		{"LedgerService/Reserve", reserve, "units", false},
		{"LedgerService/ReserveBatch", `{"requests":[` + reserve + `]}`, "units", true},
		{"LedgerService/Settle", settle, "actualUnits", false},
		{"LedgerService/SettleBatch", `{"requests":[` + settle + `]}`, "actualUnits", true},
		{"LedgerService/RecordUsage", `{"reservationId":"rec","operationId":"op-rec","subject":"tenant-7","route":"chat.generate","actualUnits":{"tokens":1,"` + long + `":1}}`, "actualUnits", false},
		{"ShardService/IssueShard", `{"shardId":"sh-2","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"` + long + `":1},"gatewayId":"gw","bootEpoch":"1","ttl":"60s"}`, "units", false},
		{"ShardService/ReconcileShard", reconcileReserved, "receipts[0].reservedUnits", false},
		{"ShardService/ReconcileShard", reconcileActual, "receipts[0].actualUnits", false},
		{"RolloutService/CarveLegacyBudget", `{"budgetId":"b1","identity":"old-limiter","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"` + long + `":1},"ttl":"60s"}`, "units", false},
	} {
		r := post(c.path, c.body)
		code, reason, message := connectError(r.raw)
		if c.batch {
			code, reason, message = batchItemError(t, r.raw, "application/json", protoreflect.Name(strings.TrimPrefix(c.path, "LedgerService/")))
		}
		if code != "invalid_argument" || reason != server.ReasonInvalidCommand || !strings.Contains(message, c.field+": "+want) {
			t.Errorf("%s: %d %s %s %.300q; want invalid_argument INVALID_COMMAND naming %q", c.path, r.status, code, reason, message, c.field+": "+want)
		}
		if strings.Contains(string(r.raw), strings.Repeat("u", 200)) {
			t.Errorf("%s: the answer quotes the unit name (%d bytes)", c.path, len(r.raw))
		}
	}
	if got := field(h.ok("GetReservation", `{"reservationId":"held"}`, ""), "reservation", "state"); got != "RESERVATION_STATE_STARTED" {
		t.Errorf("a refused settle changed the reservation: %v", got)
	}
	// At the bound: a name a policy could have, so UNKNOWN_UNIT naming it.
	atBound := strings.Repeat("b", ledger.MaxUnitBytes)
	r := h.call("Reserve", `{"reservationId":"new","subject":"tenant-7","route":"chat.generate","units":{"tokens":1,"`+atBound+`":1}}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonUnknownUnit)
	if msg, _ := r.body["message"].(string); !strings.Contains(msg, atBound) {
		t.Errorf("UNKNOWN_UNIT at the bound does not name the unit: %s", r.raw)
	}
	// Beside an unknown name within the bound, the over-long one answers,
	// every time: the answer does not follow the map's order.
	for i := range 50 {
		r := h.call("Reserve", `{"reservationId":"mixed","subject":"tenant-7","route":"chat.generate","units":{"requests":1,"`+long+`":1}}`, "")
		if r.status != http.StatusBadRequest || r.body["message"] == nil || !strings.Contains(r.body["message"].(string), "units: "+want) {
			t.Fatalf("call %d with an unknown and an over-long unit: %d %.200s", i, r.status, r.raw)
		}
	}
}

// PublishPolicy ignored a schema other than admissionBudget.v1 and
// published the terms as admissionBudget.v1 (the CLI's file parser refused
// them). Another schema is 400 INVALID_POLICY naming `schema` and publishes
// nothing; an empty schema and admissionBudget.v1 are accepted as before.
func TestPolicyOtherSchemaIsInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, schema := range []string{"admissionBudget.v2", "limitReservation.v1", "admissionbudget.v1"} {
		r := h.call("PublishPolicy", `{"policy":{"schema":"`+schema+`","subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if msg, _ := r.body["message"].(string); !strings.Contains(msg, "schema") || !strings.Contains(msg, schema) {
			t.Errorf("schema %q: the message does not name the field and value: %s", schema, r.raw)
		}
	}
	if list := h.ok("ListPolicies", `{}`, ""); len(list) != 0 {
		t.Errorf("refused policies were published: %v", list)
	}
	for i, schema := range []string{"", ledger.SchemaPolicy} {
		pub := h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"schema":%q,"subject":"t%d","route":"r","dimensions":[{"unit":"tokens","burst":"10"}]}}`, schema, i), "")
		if got := field(pub, "policy", "schema"); got != ledger.SchemaPolicy {
			t.Errorf("schema %q: published with schema %v", schema, got)
		}
	}
}

// An INVALID_COMMAND refusal said "invalid command: " first when a shard's
// ttl was decided by durationFromProto, or a receipt by the ledger, and
// nothing before what was wrong when decided at the door ("ttl must be
// above 0"): one reason read two ways by the layer that decided it. Each
// now says what is wrong alone, under the same code and reason.
func TestInvalidCommandMessagesSayWhatIsWrongAlone(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	shard := func(method, body string) response {
		req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.ShardService/"+method, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		return h.do(req)
	}
	issue := func(ttl string) string {
		return `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"` + ttl + `"}`
	}
	settled := `{"reservationId":"a","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1},"actualUnits":{"tokens":1}}`
	for _, c := range []struct{ method, body, message string }{
		{"IssueShard", issue("9999999999s"), "ttl 9999999999s is longer than the maximum 9223372036s (about 292 years)"},
		{"IssueShard", issue("9223372036.5s"), "ttl 9223372036.500s is longer than the maximum 9223372036s (about 292 years)"},
		{"IssueShard", issue("-9999999999s"), "ttl -9999999999s is below the minimum -9223372036s"},
		{"IssueShard", issue("0s"), "ttl must be above 0 (0s)"},
		{"ReconcileShard", `{"shardId":"s","gatewayId":"gw","receipts":[` + settled + `,` + settled + `]}`, `receipts[1].reservationId "a" appears twice (also receipts[0])`},
		{"ReconcileShard", `{"shardId":"s","gatewayId":"gw","receipts":[{"reservationId":"b","state":"RESERVATION_STATE_RESERVED","reservedUnits":{"tokens":1}}]}`,
			"receipts[0].state is RESERVED (receipt b): release unstarted holds before reconciling"},
	} {
		r := shard(c.method, c.body)
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if message, _ := r.body["message"].(string); message != c.message {
			t.Errorf("%s %s: message %q, want %q", c.method, c.body, message, c.message)
		}
	}
}

// An INVALID_POLICY refusal said "invalid policy: " first when the ledger
// or durationFromProto decided it ("invalid policy: tokens: burst 0 is
// outside ..."), and nothing before what was wrong when decided at the
// door ("policy.subject is 513 bytes long; at most 512"), while
// docs/API.md quotes the messages bare. Each now says what is wrong
// alone, under the same code and reason, as INVALID_COMMAND does.
func TestInvalidPolicyMessagesSayWhatIsWrongAlone(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	policy := func(fields, dimension string) string {
		return `{"policy":{"subject":"s","route":"r",` + fields + `"dimensions":[` + dimension + `]}}`
	}
	tokens := `{"unit":"tokens","burst":"5"}`
	for _, c := range []struct{ body, message string }{
		{`{}`, "policy is required"},
		{policy(``, `{"unit":"tokens","burst":"0"}`), `policy.dimensions[0].burst 0 is outside (0, 9007199254740992] (unit "tokens")`},
		{policy(``, `{"unit":"`+strings.Repeat("u", 129)+`","burst":"5"}`), "policy.dimensions[0].unit is 129 bytes long; at most 128"},
		{policy(`"epochLength":"1577880001s",`, tokens), "policy.epochLength 1577880001s is longer than the maximum 1577880000s (50 years)"},
		{policy(`"holdTtl":"9223372036.5s",`, tokens), "policy.holdTtl 9223372036.500s is longer than the maximum 9223372036s (about 292 years)"},
		{`{"policy":{"subject":"` + strings.Repeat("s", 513) + `","route":"r","dimensions":[` + tokens + `]}}`, "policy.subject is 513 bytes long; at most 512"},
	} {
		r := h.call("PublishPolicy", c.body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidPolicy)
		if message, _ := r.body["message"].(string); message != c.message {
			t.Errorf("PublishPolicy %.80s: message %q, want %q", c.body, message, c.message)
		}
	}
}

// A JSON escape of a lone surrogate encodes no character, so no UTF-8
// string holds it: like invalid UTF-8 it is a body that does not decode,
// 400 invalid_argument without a detail, its message saying "invalid
// escape code" (API.md, Limits), never a string the server keeps.
func TestLoneSurrogateEscapeDoesNotDecode(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, escaped := range []string{`\udc80`, `\ud800`, `\ud800\u0041`} {
		body := `{"reservationId":"r` + escaped + `","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}`
		r := h.call("Reserve", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", "")
		if message, _ := r.body["message"].(string); !strings.Contains(message, "invalid escape code") || r.body["details"] != nil {
			t.Errorf("%s: %s", escaped, r.raw)
		}
	}
}
