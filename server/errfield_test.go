package server_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// methodInput is the request type of method ("RolloutService/CreateRollout").
func methodInput(t testing.TB, method string) protoreflect.MessageType {
	t.Helper()
	service, name, _ := strings.Cut(method, "/")
	for _, f := range []protoreflect.FileDescriptor{v1.File_capledger_v1_capledger_proto, v1.File_capledger_v1_rollout_proto, v1.File_capledger_v1_shard_proto, v1.File_capledger_v1_console_proto} {
		if sd := f.Services().ByName(protoreflect.Name(service)); sd != nil {
			mt, err := protoregistry.GlobalTypes.FindMessageByName(sd.Methods().ByName(protoreflect.Name(name)).Input().FullName())
			if err != nil {
				t.Fatal(err)
			}
			return mt
		}
	}
	t.Fatalf("no service %s", service)
	return nil
}

// onlyErrorDetail returns the one detail of an answer, which must be an
// ErrorDetail.
func onlyErrorDetail[D any](t testing.TB, what string, list []D) *v1.ErrorDetail {
	t.Helper()
	if len(list) != 1 {
		t.Errorf("%s: %d details, want one ErrorDetail: %v", what, len(list), list)
		return &v1.ErrorDetail{}
	}
	detail, ok := any(list[0]).(*v1.ErrorDetail)
	if !ok {
		t.Errorf("%s: detail %T, want an ErrorDetail", what, list[0])
		return &v1.ErrorDetail{}
	}
	return detail
}

// Every validation refusal that TestValidationMessagesNameARequestPath
// covers carries the path its message starts with in ErrorDetail.field,
// exactly, beside its reason: over Connect JSON, Connect protobuf and
// gRPC (grpc-go's rich status details), from a real server on a real
// socket. A gateway in any language reads the field, not the text.
func TestValidationRefusalsCarryTheirField(t *testing.T) {
	h := newHarness(t, harnessOptions{shards: true})
	h.ok("PublishPolicy", tokensPolicy, "")
	conn := grpcConn(t, h.url)
	refusals := validationRefusals()
	if len(refusals) != 56 {
		t.Fatalf("%d refusals; this test was written for the 56 of TestValidationMessagesNameARequestPath: count again", len(refusals))
	}
	for _, c := range refusals {
		path := leadingPath.FindString(c.message)
		if path == "" {
			t.Fatalf("%s: message %q starts with no path", c.method, c.message)
		}
		mt := methodInput(t, c.method)
		msg := mt.New().Interface()
		if err := protojson.Unmarshal([]byte(c.body), msg); err != nil {
			t.Fatalf("%s %.100s: %v", c.method, c.body, err)
		}
		wire, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}

		// Connect, JSON and protobuf bodies: the error body is JSON.
		for _, enc := range []struct{ contentType, body string }{{"application/json", c.body}, {"application/proto", string(wire)}} {
			req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1."+c.method, strings.NewReader(enc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", enc.contentType)
			r := h.do(req)
			what := c.method + " " + enc.contentType + " " + c.message
			if r.status != http.StatusBadRequest || r.body["message"] != c.message {
				t.Errorf("%s: got %d %.300s", what, r.status, r.raw)
				continue
			}
			detail := onlyErrorDetail(t, what, details(t, r))
			if detail.GetField() != path {
				t.Errorf("%s: field %q, want %q", what, detail.GetField(), path)
			}
			if detail.GetReason() != server.ReasonInvalidPolicy && detail.GetReason() != server.ReasonInvalidRollout && detail.GetReason() != server.ReasonInvalidCommand {
				t.Errorf("%s: reason %q", what, detail.GetReason())
			}
			// The JSON of the detail (debug) spells it "field" too.
			if enc.contentType == "application/json" {
				debug, _ := r.body["details"].([]any)[0].(map[string]any)["debug"].(map[string]any)
				if debug["field"] != path {
					t.Errorf("%s: debug %v, want field %q", what, debug, path)
				}
			}
		}

		// gRPC, as grpc-go decodes the rich status.
		answer := invoke(t, conn, "/capledger.v1."+c.method, "", msg, mt.New().Interface())
		what := "gRPC " + c.method + " " + c.message
		if answer.Code != codes.InvalidArgument || answer.Message != c.message {
			t.Errorf("%s: got %v %q", what, answer.Code, answer.Message)
			continue
		}
		if detail := onlyErrorDetail(t, what, answer.Details); detail.GetField() != path {
			t.Errorf("%s: field %q, want %q", what, detail.GetField(), path)
		}
	}
}

// The field of a batch item's error is within the item, as its message
// is; UNKNOWN_UNIT's is the units map; a request missing several required
// fields is refused for the first, one field per refusal; an answer that
// is no validation refusal has none, and a body that does not decode has
// no detail at all.
func TestErrorDetailFieldOfItemsUnitsAndOthers(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")

	batch := h.ok("ReserveBatch", `{"requests":[
	  {"reservationId":"b1","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}},
	  {"subject":"tenant-7","route":"chat.generate","units":{"tokens":1}},
	  {"reservationId":"b3","subject":"tenant-7","route":"chat.generate","units":{"gpus":1}}]}`, "")
	outcomes := batch["outcomes"].([]any)
	for i, want := range []struct{ message, reason, field string }{
		{},
		{"reservationId is required", server.ReasonInvalidCommand, "reservationId"},
		{`units: unknown unit "gpus": policy generation 1 limits "tokens", "requests"`, server.ReasonUnknownUnit, "units"},
	} {
		item, _ := outcomes[i].(map[string]any)["error"].(map[string]any)
		if want.message == "" {
			if item != nil {
				t.Errorf("item %d: %v", i, item)
			}
			continue
		}
		detail, _ := item["detail"].(map[string]any)
		if item["message"] != want.message || detail["reason"] != want.reason || detail["field"] != want.field {
			t.Errorf("item %d: %v, want message %q, detail reason %s field %q", i, item, want.message, want.reason, want.field)
		}
	}

	h.ok("Start", `{"reservationId":"b1","operationId":"op"}`, "")
	r := h.call("Settle", `{"reservationId":"b1","operationId":"op","actualUnits":{"tokens":1,"gpus":0}}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonUnknownUnit)
	if d := onlyErrorDetail(t, "settle", details(t, r)); d.GetField() != "actualUnits" || !strings.HasPrefix(r.body["message"].(string), "actualUnits: unknown unit") {
		t.Errorf("settle of an unknown unit: field %q, message %q", d.GetField(), r.body["message"])
	}

	// One field per refusal, the first missing one named.
	for _, c := range []struct {
		r             response
		message, path string
	}{
		{h.call("Reserve", `{"reservationId":"m1","units":{"tokens":1}}`, ""), "subject is required", "subject"},
		{h.call("Reserve", `{"reservationId":"m1","subject":"tenant-7","units":{"tokens":1}}`, ""), "route is required", "route"},
		{h.call("RecordUsage", `{"reservationId":"m1","operationId":"op","subject":"tenant-7","actualUnits":{"tokens":1}}`, ""), "route is required", "route"},
		{h.consoleCall("ListStatements", `{"subject":"tenant-7"}`, ""), "route is required", "route"},
		{h.consoleCall("ListStatements", `{"subject":"tenant-7","route":"chat.generate"}`, ""), "policyGeneration is required", "policyGeneration"},
	} {
		h.wantError(c.r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if d := onlyErrorDetail(t, c.message, details(t, c.r)); c.r.body["message"] != c.message || d.GetField() != c.path {
			t.Errorf("%s: message %q field %q, want field %q", c.message, c.r.body["message"], d.GetField(), c.path)
		}
	}

	r = h.call("GetReservation", `{"reservationId":"nobody"}`, "")
	h.wantError(r, http.StatusNotFound, "not_found", server.ReasonReservationNotFound)
	if d := onlyErrorDetail(t, "not found", details(t, r)); d.GetField() != "" {
		t.Errorf("not found: field %q", d.GetField())
	}

	req, _ := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/Reserve", bytes.NewReader([]byte(`{"reservationId":7`)))
	req.Header.Set("Content-Type", "application/json")
	if r := h.do(req); r.status != http.StatusBadRequest || len(details(t, r)) != 0 {
		t.Errorf("malformed body: %d %s, want 400 without a detail", r.status, r.raw)
	}
}

// A ReconcileShard refused for what its receipts say together against the
// stored shard (more unknown work than the shard allocated) names no one
// field: INVALID_COMMAND without ErrorDetail.field (API.md, "Field
// paths"), where a refusal of one receipt's field has it.
func TestReconcileRefusedAsAWholeHasNoField(t *testing.T) {
	h := newShardHarness(t)
	h.publish(t, true)
	ctx := context.Background()
	if _, err := h.shards.IssueShard(ctx, connect.NewRequest(issueRequest("sh-f", "gw-a", 10))); err != nil {
		t.Fatal(err)
	}
	fieldOf := func(err error) (string, string) {
		var cerr *connect.Error
		if !errors.As(err, &cerr) || cerr.Code() != connect.CodeInvalidArgument {
			t.Fatalf("want invalid_argument, got %v", err)
		}
		var list []any
		for _, d := range cerr.Details() {
			msg, err := d.Value()
			if err != nil {
				t.Fatal(err)
			}
			list = append(list, msg)
		}
		return onlyErrorDetail(t, cerr.Message(), list).GetField(), cerr.Message()
	}
	started := func(id string, tokens int64) *v1.ShardReceipt {
		return &v1.ShardReceipt{ReservationId: id, State: v1.ReservationState_RESERVATION_STATE_STARTED, ReservedUnits: map[string]int64{"tokens": tokens}}
	}
	_, err := h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-f", GatewayId: "gw-a",
		Receipts: []*v1.ShardReceipt{started("a", 6), started("b", 6)}}))
	if field, message := fieldOf(err); field != "" || !strings.HasPrefix(message, "receipts hold at least 12 units of unknown work in") {
		t.Errorf("receipts over the allocation: field %q, message %q; want no field", field, message)
	}
	_, err = h.shards.ReconcileShard(ctx, connect.NewRequest(&v1.ReconcileShardRequest{ShardId: "sh-f", GatewayId: "gw-a",
		Receipts: []*v1.ShardReceipt{started("a", 6), {ReservationId: "b"}}}))
	if field, message := fieldOf(err); field != "receipts[1].state" || message != "receipts[1].state is required" {
		t.Errorf("a receipt without a state: field %q, message %q", field, message)
	}
}
