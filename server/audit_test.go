package server_test

import (
	"context"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

// streamAudit runs StreamAudit over the harness's real HTTP server with
// token and returns the events received and the stream's error.
func (h *harness) streamAudit(token string, since bool) ([]*v1.AuditEvent, error) {
	h.t.Helper()
	client := capledgerv1connect.NewAuditServiceClient(http.DefaultClient, h.url)
	req := connect.NewRequest(&v1.StreamAuditRequest{SinceCheckpoint: since})
	if token != "" {
		req.Header().Set("Authorization", "Bearer "+token)
	}
	stream, err := client.StreamAudit(context.Background(), req)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var events []*v1.AuditEvent
	for stream.Receive() {
		events = append(events, stream.Msg())
	}
	return events, stream.Err()
}

// StreamAudit is admin-only like Audit (the auth interceptor checks
// streaming handlers too), and ends with the audit's result: none for a
// sound ledger, in both modes.
func TestStreamAuditRolesAndResult(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("r", 10), gatewayToken)
	h.ok("Release", `{"reservationId":"r"}`, gatewayToken)
	for token, code := range map[string]connect.Code{"": connect.CodeUnauthenticated, "wrong-token-0123456789": connect.CodeUnauthenticated,
		gatewayToken: connect.CodePermissionDenied} {
		if events, err := h.streamAudit(token, false); connect.CodeOf(err) != code || len(events) > 0 {
			t.Errorf("token %q: %d events, %v; want %s", token, len(events), err, code)
		}
	}
	for _, since := range []bool{false, true} {
		events, err := h.streamAudit(adminToken, since)
		if err != nil || len(events) == 0 {
			t.Fatalf("admin (since checkpoint %v): %d events, %v", since, len(events), err)
		}
		last := events[len(events)-1].GetResult()
		if last == nil || len(last.GetDiscrepancies()) > 0 || last.GetCheckedAt() == nil {
			t.Fatalf("admin (since checkpoint %v): last event %v", since, events[len(events)-1])
		}
	}
}
