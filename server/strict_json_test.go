package server_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// Every unary method of every service refuses an unknown JSON field with
// invalid_argument naming it (issue 13: connect's JSON codec discarded
// unknown fields, so a misspelt field was silently ignored).
func TestUnknownJSONFieldIsRefusedOnEveryMethod(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	// Every unary method of every service on the port (the console's and
	// the rollouts' too); streams speak Connect's enveloped JSON instead.
	var methods []string
	for _, file := range []protoreflect.FileDescriptor{v1.File_capledger_v1_capledger_proto, v1.File_capledger_v1_shard_proto,
		v1.File_capledger_v1_console_proto, v1.File_capledger_v1_rollout_proto, v1.File_capledger_v1_audit_proto} {
		services := file.Services()
		for i := 0; i < services.Len(); i++ {
			s := services.Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				if md := s.Methods().Get(j); !md.IsStreamingClient() && !md.IsStreamingServer() {
					methods = append(methods, "/"+string(s.FullName())+"/"+string(md.Name()))
				}
			}
		}
	}
	if len(methods) < 36 {
		t.Fatalf("only %d methods found: %v", len(methods), methods)
	}
	for _, m := range methods {
		for _, contentType := range []string{"application/json", "application/json; charset=utf-8"} {
			req, _ := http.NewRequest(http.MethodPost, h.url+m, strings.NewReader(`{"bogusField":true}`))
			req.Header.Set("Content-Type", contentType)
			r := h.do(req)
			if r.status != http.StatusBadRequest || r.body["code"] != "invalid_argument" || !strings.Contains(r.body["message"].(string), "bogusField") {
				t.Errorf("%s (%s) with an unknown field: %d %s", m, contentType, r.status, r.raw)
			}
		}
	}
	// Connect GET decodes its message parameter with the same codec.
	r := h.do(mustRequest(t, http.MethodGet, h.url+"/capledger.v1.LedgerService/GetAccount?encoding=json&message="+
		url.QueryEscape(`{"subject":"tenant-7","route":"chat.generate","bogus":true}`)))
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), "bogus") {
		t.Errorf("GET with an unknown field: %d %s", r.status, r.raw)
	}
	// A nested one too.
	h.wantError(h.call("PublishPolicy", `{"policy":{"subject":"tenant-7","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"10","brust":"5"}]}}`, ""),
		http.StatusBadRequest, "invalid_argument", "")
}

func mustRequest(t *testing.T, method, u string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// The under-billing settle: a misspelt actualUnits is refused and
// changes nothing; a settle must state every reserved unit (0 is fine).
func TestSettleMustStateEveryReservedUnit(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("st-1", 100), "")
	h.ok("Start", `{"reservationId":"st-1","operationId":"op-1"}`, "")

	r := h.call("Settle", `{"reservationId":"st-1","operationId":"op-1","actualUnit":{"tokens":15}}`, "")
	h.wantError(r, http.StatusBadRequest, "invalid_argument", "")
	if !strings.Contains(r.body["message"].(string), `actualUnit`) {
		t.Fatalf("message does not name the field: %s", r.raw)
	}
	for _, body := range []string{
		`{"reservationId":"st-1","operationId":"op-1"}`,
		`{"reservationId":"st-1","operationId":"op-1","actualUnits":{}}`,
		`{"reservationId":"st-1","operationId":"op-1","actualUnits":{"tokens":15}}`,
	} {
		r := h.call("Settle", body, "")
		h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
		if !strings.Contains(r.body["message"].(string), `"requests"`) {
			t.Fatalf("%s: message does not name the missing unit: %s", body, r.raw)
		}
	}
	batch := h.ok("SettleBatch", `{"requests":[{"reservationId":"st-1","operationId":"op-1","actualUnits":{"tokens":15}}]}`, "")
	if field(batch["outcomes"].([]any)[0].(map[string]any), "error", "detail", "reason") != server.ReasonInvalidCommand {
		t.Fatalf("batch item missing a unit: %v", batch)
	}
	if got := h.ok("GetReservation", `{"reservationId":"st-1"}`, ""); field(got, "reservation", "state") != "RESERVATION_STATE_STARTED" {
		t.Fatalf("a refused settle changed the reservation: %v", got)
	}
	settled := h.ok("Settle", `{"reservationId":"st-1","operationId":"op-1","actualUnits":{"tokens":15,"requests":0}}`, "")
	if num(field(settled, "reservation", "actualUnits", "tokens")) != 15 || num(field(settled, "refundedUnits", "tokens")) != 85 {
		t.Fatalf("settle with an explicit 0: %v", settled)
	}
}

// A batch's list given twice is refused as protojson refuses any field
// given twice, also when the first is empty (the hand-written codec once
// took the second list then).
func TestBatchListGivenTwiceIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct{ method, body string }{
		{"ReserveBatch", `{"requests":[],"requests":[{"reservationId":"d-1","subject":"tenant-7","route":"chat.generate","units":{"tokens":1}}]}`},
		{"SettleBatch", `{"requests":[],"requests":[{"reservationId":"d-1","operationId":"op","actualUnits":{"tokens":1}}]}`},
	} {
		r := h.call(c.method, c.body, "")
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.raw), `duplicate field`) {
			t.Errorf("%s with its list twice: %d %s", c.method, r.status, r.raw)
		}
	}
}

// An empty batch is a 400 naming the field, whichever way the list is
// empty: JSON null, [] and a missing field all decode to no items, and a
// 200 `{}` once hid a client that lost its list. Over gRPC too.
func TestEmptyBatchIsRefused(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	for _, method := range []string{"ReserveBatch", "SettleBatch"} {
		for _, body := range []string{`{"requests":null}`, `{"requests":[]}`, `{}`} {
			r := h.call(method, body, "")
			h.wantError(r, http.StatusBadRequest, "invalid_argument", server.ReasonInvalidCommand)
			if msg, _ := r.body["message"].(string); !strings.Contains(msg, "requests") || !strings.Contains(msg, "at least one item") {
				t.Errorf("%s %s: the message does not name the field: %s", method, body, r.raw)
			}
		}
	}
	rpc := h.grpcClient(connect.WithGRPC())
	_, err := rpc.ReserveBatch(context.Background(), connect.NewRequest(&v1.ReserveBatchRequest{}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("gRPC ReserveBatch without items: %v", err)
	}
	_, err = rpc.SettleBatch(context.Background(), connect.NewRequest(&v1.SettleBatchRequest{}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("gRPC SettleBatch without items: %v", err)
	}
}
