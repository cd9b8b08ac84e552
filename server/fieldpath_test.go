package server_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// leadingPath is the field path a refusal's message starts with: JSON
// names joined by ".", each optionally indexed ("policy.dimensions[0].unit").
var leadingPath = regexp.MustCompile(`^[a-z][A-Za-z0-9]*(\[[0-9]+\])?(\.[a-z][A-Za-z0-9]*(\[[0-9]+\])?)*`)

// pathInSchema reports whether path names a field of md as the request's
// JSON spells it, an index only on a repeated field, a "." only after a
// message field; it returns why not.
func pathInSchema(md protoreflect.MessageDescriptor, path string) error {
	segments := strings.Split(path, ".")
	for i, segment := range segments {
		name, index, indexed := strings.Cut(segment, "[")
		fd := md.Fields().ByJSONName(name)
		if fd == nil {
			return fmt.Errorf("%s has no field %q", md.FullName(), name)
		}
		if indexed {
			if !fd.IsList() {
				return fmt.Errorf("%s.%s is indexed but not repeated", md.FullName(), name)
			}
			if _, err := strconv.Atoi(strings.TrimSuffix(index, "]")); err != nil {
				return fmt.Errorf("%s: index %q", segment, index)
			}
		}
		if i == len(segments)-1 {
			return nil
		}
		if fd.Kind() != protoreflect.MessageKind || fd.IsMap() || fd.IsList() && !indexed {
			return fmt.Errorf("%s.%s holds no fields to name", md.FullName(), name)
		}
		md = fd.Message()
	}
	return nil
}

// validationRefusal is one validation refusal: a request to method
// (service/method) with a JSON body, and the message it is refused with.
type validationRefusal struct {
	method, body, message string
}

// validationRefusals is one request per check of every layer that refuses
// a field (TestValidationMessagesNameARequestPath); a server with shards
// and tokensPolicy published answers each so.
func validationRefusals() []validationRefusal {
	policy := func(terms, dimensions string) string {
		if dimensions == "" {
			dimensions = `{"unit":"tokens","burst":"10"}`
		}
		return `{"policy":{"subject":"t","route":"r"` + terms + `,"dimensions":[` + dimensions + `]}}`
	}
	dim := func(terms string) string { return policy("", `{"unit":"tokens","burst":"10"`+terms+`}`) }
	manyRoutes := make([]string, 10001)
	for i := range manyRoutes {
		manyRoutes[i] = fmt.Sprintf(`{"route":"r%d"}`, i)
	}
	rollout := func(routes string) string { return `{"name":"c","hashBy":"route","routes":[` + routes + `]}` }
	receipt := func(id, state string) string {
		return `{"reservationId":"` + id + `","state":"RESERVATION_STATE_` + state + `","reservedUnits":{"tokens":1},"actualUnits":{"tokens":1}}`
	}
	reconcile := func(receipts ...string) string {
		return `{"shardId":"s","gatewayId":"gw","receipts":[` + strings.Join(receipts, ",") + `]}`
	}
	const (
		publish    = "LedgerService/PublishPolicy"
		create     = "RolloutService/CreateRollout"
		reconcileM = "ShardService/ReconcileShard"
		issue      = "ShardService/IssueShard"
	)
	return []validationRefusal{
		// PublishPolicy: PolicyFromProto.
		{publish, `{}`, "policy is required"},
		{publish, policy(`,"schema":"other.v2"`, ""), `policy.schema "other.v2": want admissionBudget.v1 (or leave it out)`},
		{publish, policy(`,"holdTtl":"0.05s"`, ""), "policy.holdTtl 0.050s is shorter than the minimum 0.100s (leave it out for the default 60s)"},
		{publish, policy(`,"holdTtl":"9223372036.5s"`, ""), "policy.holdTtl 9223372036.500s is longer than the maximum 9223372036s (about 292 years)"},
		{publish, policy(`,"executionLimit":"-9223372036.5s"`, ""), "policy.executionLimit -9223372036.500s is below the minimum -9223372036s"},
		{publish, policy(`,"epochLength":"0.5s"`, ""), "policy.epochLength 0.500s is shorter than the minimum 1s (leave it out for the default 3600s)"},
		{publish, policy(`,"rollout":7`, ""), "policy.rollout 7 is neither ROLLOUT_MODE_ENFORCE nor ROLLOUT_MODE_SHADOW"},
		{publish, dim(`,"refillUnits":"1","refillInterval":"9223372037s"`), "policy.dimensions[0].refillInterval 9223372037s is longer than the maximum 9223372036s (about 292 years)"},
		// PublishPolicy: the door's text check.
		{publish, `{"policy":{"subject":"t\u0000","route":"r","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "policy.subject contains a NUL byte"},
		{publish, policy("", `{"unit":"tok\u0000","burst":"10"}`), "policy.dimensions[0].unit contains a NUL byte"},
		// PublishPolicy: the ledger's Policy.Validate.
		{publish, `{"policy":{"route":"r","dimensions":[{"unit":"tokens","burst":"10"}]}}`, `policy.subject is empty (use "*" for every subject)`},
		{publish, `{"policy":{"subject":"t","dimensions":[{"unit":"tokens","burst":"10"}]}}`, "policy.route is empty"},
		{publish, `{"policy":{"subject":"t","route":"*","dimensions":[{"unit":"tokens","burst":"10"}]}}`, `policy.route "*" is not a wildcard (only a subject can be): publish one policy per route`},
		{publish, `{"policy":{"subject":"t","route":"r","region":"*","dimensions":[{"unit":"tokens","burst":"10"}]}}`, `policy.region "*" is not a wildcard (only a subject can be): publish one policy per region`},
		{publish, `{"policy":{"subject":"t","route":"r"}}`, "policy.dimensions: none given (a policy limits at least one unit)"},
		{publish, policy("", `{"unit":"a","burst":"1"},{"unit":"b","burst":"1"},{"unit":"c","burst":"1"},{"unit":"d","burst":"1"},{"unit":"e","burst":"1"}`), "policy.dimensions: 5 given; at most 4"},
		{publish, policy(`,"executionLimit":"-1s"`, ""), "policy.executionLimit -1s is negative"},
		{publish, policy(`,"executionLimit":"0.5s"`, ""), "policy.executionLimit 0.500s is shorter than the minimum 1s (leave it out for no limit)"},
		{publish, policy(`,"epochLength":"1577880001s"`, ""), "policy.epochLength 1577880001s is longer than the maximum 1577880000s (50 years)"},
		{publish, policy(`,"fairnessWeight":"-1"`, ""), "policy.fairnessWeight -1 is outside [1, 1048576]"},
		{publish, policy(`,"fairnessBudget":"NaN"`, ""), "policy.fairnessBudget NaN is outside [0, 1]"},
		{publish, policy(`,"estimatorDigest":"`+strings.Repeat("d", 513)+`"`, ""), "policy.estimatorDigest is 513 bytes long; at most 512"},
		{publish, policy("", `{"burst":"10"}`), "policy.dimensions[0].unit is empty"},
		{publish, policy("", `{"unit":"`+strings.Repeat("u", 129)+`","burst":"10"}`), "policy.dimensions[0].unit is 129 bytes long; at most 128"},
		{publish, policy("", `{"unit":"tokens","burst":"10"},{"unit":"tokens","burst":"10"}`), `policy.dimensions[1].unit "tokens" appears twice (also policy.dimensions[0])`},
		{publish, policy("", `{"unit":"tokens","burst":"10"},{"unit":"requests","burst":"0"}`), `policy.dimensions[1].burst 0 is outside (0, 9007199254740992] (unit "requests")`},
		{publish, dim(`,"refillUnits":"-1"`), `policy.dimensions[0].refillUnits -1 is outside [0, 9007199254740992] (unit "tokens")`},
		{publish, dim(`,"refillUnits":"1"`), `policy.dimensions[0].refillInterval 0s must be above 0 to mint refillUnits (unit "tokens")`},
		{publish, dim(`,"refillUnits":"1","refillInterval":"0.0005s"`), `policy.dimensions[0].refillInterval 0.000500s is shorter than the minimum 0.001s (unit "tokens")`},
		{publish, dim(`,"maxReservation":"11"`), `policy.dimensions[0].maxReservation 11 is outside (0, burst 10] (unit "tokens")`},
		{publish, dim(`,"maxOverdraft":"-1"`), `policy.dimensions[0].maxOverdraft -1 is outside [0, 9007199254740992] (unit "tokens")`},
		// CreateRollout: the door and NewRollout.
		{create, `{"hashBy":"route","routes":[{"route":"r"}]}`, "name is empty"},
		{create, `{"name":"bad name!","hashBy":"route","routes":[{"route":"r"}]}`, "name holds ' ' at byte 3: use only ASCII letters, digits, '.', '_' and '-'"},
		{create, `{"name":"` + strings.Repeat("n", 129) + `","hashBy":"route","routes":[{"route":"r"}]}`, "name is 129 bytes long; at most 128"},
		{create, `{"name":"c","hashBy":"x","routes":[{"route":"r"}]}`, `hashBy "x" is neither "route" nor "subject"`},
		{create, rollout(``), "routes: none given (a rollout covers at least one route)"},
		{create, rollout(strings.Join(manyRoutes, ",")), "routes: 10001 given; at most 10000"},
		{create, rollout(`{"route":"r"},{"region":"eu"}`), "routes[1].route is empty"},
		{create, rollout(`{"route":"r\u0000"}`), "routes[0].route contains a NUL byte"},
		{create, rollout(`{"route":"r"},{"route":"*"}`), `routes[1].route "*" is not a wildcard (only a subject can be): publish one policy per route`},
		{create, rollout(`{"route":"r","region":"*"}`), `routes[0].region "*" is not a wildcard (only a subject can be): publish one policy per region`},
		{create, rollout(`{"route":"r"},{"route":"q"},{"route":"r","region":"global"}`), "routes[2] r@global appears twice (also routes[0])"},
		// The other RolloutService methods name the rollout by the same
		// field: checked at the door, before the store is asked.
		{"RolloutService/GetRollout", `{}`, "name is empty"},
		{"RolloutService/SetRolloutShare", `{"name":"c\u0000","percent":5}`, "name contains a NUL byte"},
		{"RolloutService/EndRollout", `{"name":"` + strings.Repeat("n", 129) + `"}`, "name is 129 bytes long; at most 128"},
		{"RolloutService/SetRolloutShare", `{"name":"c","percent":100.5}`, "percent 100.5: want 0 to 100 in steps of 0.01 (at most two decimals)"},
		{"RolloutService/RollbackGenerations", `{}`, "generations: 0 given; give 1 to 1000"},
		{"ConsoleService/GetResolverAnswers", `{"reservationIds":[` + strings.TrimSuffix(strings.Repeat(`"a",`, 1001), ",") + `]}`, "reservationIds: 1001 given; at most 1000"},
		// ReconcileShard and IssueShard: the server's checks and the ledger's.
		{reconcileM, reconcile(`{"state":"RESERVATION_STATE_RELEASED"}`), "receipts[0].reservationId is required"},
		{reconcileM, reconcile(receipt("a", "SETTLED"), receipt("a", "SETTLED")), `receipts[1].reservationId "a" appears twice (also receipts[0])`},
		{reconcileM, reconcile(receipt("a", "RESERVED")), "receipts[0].state is RESERVED (receipt a): release unstarted holds before reconciling"},
		{reconcileM, reconcile(`{"reservationId":"a"}`), "receipts[0].state is required"},
		{reconcileM, reconcile(`{"reservationId":"a","state":"RESERVATION_STATE_RELEASED","reservedUnits":{"tokens":-1}}`), `receipts[0].reservedUnits: "tokens" is negative (-1)`},
		{"ShardService/GetShard", `{"shardId":"s","receiptIds":[` + strings.TrimSuffix(strings.Repeat(`"a",`, 10001), ",") + `]}`, "receiptIds: 10001 given; at most 10000 per call"},
		{issue, `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"gw","bootEpoch":1,"ttl":"9999999999s"}`, "ttl 9999999999s is longer than the maximum 9223372036s (about 292 years)"},
		{issue, `{"shardId":"s","subject":"tenant-7","route":"chat.generate","units":{"tokens":1},"gatewayId":"legacy:old-limiter","bootEpoch":1,"ttl":"60s"}`,
			`gatewayId "legacy:old-limiter" names a legacy limiter: its budget is carved by the operator (CarveLegacyBudget), not issued as a shard`},
	}
}

// Every validation refusal of a request with nested fields names the
// refused field by its path in the request as the JSON spells it, from
// the request's root (policy.holdTtl, policy.dimensions[0].burst,
// routes[1].route, receipts[1].reservationId), first in the message,
// whichever layer decided it (the door's text check, PolicyFromProto, the
// ledger's Policy.Validate, NewRollout, the shard receipts' check): it
// said policy.subject but holdTtl and "tokens: burst". One row per check
// of those layers; each path is looked up in the request's schema.
// Over gRPC the message is the same text.
func TestValidationMessagesNameARequestPath(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, c := range validationRefusals() {
		req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+c.method, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		r := h.do(req)
		if r.status != http.StatusBadRequest || r.body["code"] != "invalid_argument" {
			t.Errorf("%s %.100s: want 400 invalid_argument, got %d: %.300s", c.method, c.body, r.status, r.raw)
			continue
		}
		message, _ := r.body["message"].(string)
		if message != c.message {
			t.Errorf("%s %.100s:\n got message %q\nwant message %q", c.method, c.body, message, c.message)
		}
		path := leadingPath.FindString(message)
		service, method, _ := strings.Cut(c.method, "/")
		sd := v1.File_capledger_v1_capledger_proto.Services().ByName(protoreflect.Name(service))
		for _, f := range []protoreflect.FileDescriptor{v1.File_capledger_v1_rollout_proto, v1.File_capledger_v1_shard_proto, v1.File_capledger_v1_console_proto} {
			if sd == nil {
				sd = f.Services().ByName(protoreflect.Name(service))
			}
		}
		md := sd.Methods().ByName(protoreflect.Name(method)).Input()
		if err := pathInSchema(md, path); path == "" || err != nil {
			t.Errorf("%s: message %q names no path of %s (%q): %v", c.method, message, md.FullName(), path, err)
		}
		if reason := detailReason(t, r); reason != server.ReasonInvalidPolicy && reason != server.ReasonInvalidRollout && reason != server.ReasonInvalidCommand {
			t.Errorf("%s %.100s: reason %q", c.method, c.body, reason)
		}
	}

	// The same text over gRPC (protobuf), for a policy refused at each layer.
	client := h.grpcClient(connect.WithGRPC())
	for _, c := range validationRefusals() {
		if !strings.HasPrefix(c.message, "policy.holdTtl 0.050s") && !strings.HasPrefix(c.message, "policy.dimensions[0].maxReservation") && !strings.HasPrefix(c.message, "policy.subject contains") {
			continue
		}
		var msg v1.PublishPolicyRequest
		if err := protojson.Unmarshal([]byte(c.body), &msg); err != nil {
			t.Fatal(err)
		}
		r := h.call("PublishPolicy", c.body, "")
		_, err := client.PublishPolicy(context.Background(), connect.NewRequest(&msg))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || err.(*connect.Error).Message() != r.body["message"] {
			t.Errorf("gRPC %s: %v, want the JSON answer's message %q", c.body, err, r.body["message"])
		}
	}
}
