package server_test

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// grpcWebTextAnswer is a gRPC-Web text-mode answer as a browser's grpc-web
// client (mode "grpcwebtext") reads it: the messages, and the status from
// the trailer frame or, for a trailers-only answer, the headers.
type grpcWebTextAnswer struct {
	contentType string
	messages    [][]byte
	trailers    http.Header
}

// grpcWebTextCall POSTs wire (base64 text, already encoded) to path as
// gRPC-Web text over the harness's real socket and decodes the answer the
// way the grpc-web JavaScript client does: base64 four characters at a
// time, so padded chunks may follow one another.
func (h *harness) grpcWebTextCall(path, wire, token string) grpcWebTextAnswer {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.url+path, strings.NewReader(wire))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc-web-text")
	req.Header.Set("Accept", "application/grpc-web-text")
	req.Header.Set("X-Grpc-Web", "1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := h.http.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("%s: HTTP %d %s", path, resp.StatusCode, text)
	}
	var body []byte
	for i := 0; i+4 <= len(text); i += 4 {
		quantum, err := base64.StdEncoding.DecodeString(string(text[i : i+4]))
		if err != nil {
			h.t.Fatalf("%s: answer is not base64 at %d: %v (%q)", path, i, err, text)
		}
		body = append(body, quantum...)
	}
	if len(text)%4 != 0 {
		h.t.Fatalf("%s: answer of %d base64 characters", path, len(text))
	}
	answer := grpcWebTextAnswer{contentType: resp.Header.Get("Content-Type"), trailers: http.Header{}}
	for k, v := range resp.Header {
		if strings.HasPrefix(strings.ToLower(k), "grpc-") || strings.EqualFold(k, "Retry-After") {
			answer.trailers[k] = v
		}
	}
	for len(body) >= 5 {
		flag, size := body[0], binary.BigEndian.Uint32(body[1:5])
		frame := body[5 : 5+size]
		body = body[5+size:]
		if flag&0x80 == 0 {
			answer.messages = append(answer.messages, frame)
			continue
		}
		trailers, err := textproto.NewReader(bufio.NewReader(io.MultiReader(bytes.NewReader(frame), strings.NewReader("\r\n")))).ReadMIMEHeader()
		if err != nil {
			h.t.Fatalf("%s: trailers %q: %v", path, frame, err)
		}
		for k, v := range trailers {
			answer.trailers[k] = v
		}
	}
	return answer
}

// grpcWebFrame is msg as one uncompressed gRPC-Web data frame.
func grpcWebFrame(t *testing.T, msg proto.Message) []byte {
	t.Helper()
	payload, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	frame := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(frame[1:], uint32(len(payload)))
	return append(frame, payload...)
}

// gRPC-Web's text mode (application/grpc-web-text), the grpc-web
// JavaScript client's default and its only mode for server streams, is
// served like binary gRPC-Web: docs/API.md promises "any gRPC-Web client",
// and connect-go alone answered it 415.
func TestGRPCWebTextMode(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, maxBody: 4096})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	const reservePath = "/capledger.v1.LedgerService/Reserve"
	reserve := func(id string, tokens int64) []byte {
		return grpcWebFrame(t, &v1.ReserveRequest{ReservationId: id, Subject: "tenant-7", Route: "chat.generate",
			Units: map[string]int64{"tokens": tokens, "requests": 1}})
	}

	a := h.grpcWebTextCall(reservePath, base64.StdEncoding.EncodeToString(reserve("text-a", 800)), gatewayToken)
	if a.trailers.Get("Grpc-Status") != "0" || len(a.messages) != 1 || !strings.HasPrefix(a.contentType, "application/grpc-web-text") {
		t.Fatalf("reserve: %+v", a)
	}
	var reserved v1.ReserveResponse
	if err := proto.Unmarshal(a.messages[0], &reserved); err != nil || reserved.GetReservation().GetState() != v1.ReservationState_RESERVATION_STATE_RESERVED {
		t.Fatalf("reserve answer %v: %v", &reserved, err)
	}

	// The request may come as several padded base64 chunks.
	frame := grpcWebFrame(t, &v1.StartRequest{ReservationId: "text-a", OperationId: "op"})
	chunked := base64.StdEncoding.EncodeToString(frame[:4]) + base64.StdEncoding.EncodeToString(frame[4:])
	if a := h.grpcWebTextCall("/capledger.v1.LedgerService/Start", chunked, gatewayToken); a.trailers.Get("Grpc-Status") != "0" {
		t.Fatalf("start from chunked base64: %+v", a)
	}
	settle := grpcWebFrame(t, &v1.SettleRequest{ReservationId: "text-a", OperationId: "op", ActualUnits: map[string]int64{"tokens": 800, "requests": 1}})
	if a := h.grpcWebTextCall("/capledger.v1.LedgerService/Settle", base64.StdEncoding.EncodeToString(settle), gatewayToken); a.trailers.Get("Grpc-Status") != "0" {
		t.Fatalf("settle: %+v", a)
	}

	// A capacity rejection: RESOURCE_EXHAUSTED, its detail and Retry-After
	// (300 short at 100 a second: 3 seconds), as on binary gRPC-Web.
	a = h.grpcWebTextCall(reservePath, base64.StdEncoding.EncodeToString(reserve("text-b", 500)), gatewayToken)
	if a.trailers.Get("Grpc-Status") != "8" || a.trailers.Get("Retry-After") != "3" || a.trailers.Get("Grpc-Status-Details-Bin") == "" {
		t.Fatalf("rejection: %+v", a)
	}

	// Auth is the binary path's.
	if a := h.grpcWebTextCall(reservePath, base64.StdEncoding.EncodeToString(reserve("text-c", 1)), ""); a.trailers.Get("Grpc-Status") != "16" {
		t.Fatalf("without a token: %+v", a)
	}

	// A server stream: StreamAudit ends with a clean result.
	a = h.grpcWebTextCall("/capledger.v1.AuditService/StreamAudit", base64.StdEncoding.EncodeToString(grpcWebFrame(t, &v1.StreamAuditRequest{})), adminToken)
	if a.trailers.Get("Grpc-Status") != "0" || len(a.messages) == 0 {
		t.Fatalf("stream audit: %+v", a)
	}
	var last v1.AuditEvent
	if err := proto.Unmarshal(a.messages[len(a.messages)-1], &last); err != nil || last.GetResult() == nil || len(last.GetResult().GetDiscrepancies()) > 0 {
		t.Fatalf("stream audit's last event %v: %v", &last, err)
	}

	// Bad input: not base64 is INVALID_ARGUMENT; a message over the body
	// limit RESOURCE_EXHAUSTED; neither applies anything.
	if a := h.grpcWebTextCall(reservePath, "not base64!", gatewayToken); a.trailers.Get("Grpc-Status") != "3" {
		t.Fatalf("not base64: %+v", a)
	}
	big := grpcWebFrame(t, &v1.ReserveRequest{ReservationId: "text-big", RequestDigest: strings.Repeat("x", 8000),
		Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1}})
	if a := h.grpcWebTextCall(reservePath, base64.StdEncoding.EncodeToString(big), gatewayToken); a.trailers.Get("Grpc-Status") != "8" {
		t.Fatalf("over the body limit: %+v", a)
	}
	huge := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0}, 200<<10))
	if a := h.grpcWebTextCall(reservePath, huge, gatewayToken); a.trailers.Get("Grpc-Status") != "8" {
		t.Fatalf("base64 body over the wire bound: %+v", a)
	}
	h.wantError(h.call("GetReservation", `{"reservationId":"text-big"}`, gatewayToken), 404, "not_found", "RESERVATION_NOT_FOUND")
}

// A 415 answer's Accept-Post lists exactly what the port serves: the text
// forms of gRPC-Web (translated in front of connect-go) with the rest, and
// each listed type is served (a POST with it is not 415).
func TestAcceptPostListsTheGrpcWebTextTypes(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	post := func(contentType string) response {
		req, err := http.NewRequest(http.MethodPost, h.url+"/capledger.v1.LedgerService/GetReservation", strings.NewReader(""))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		return h.do(req)
	}
	refused := post("text/plain")
	if refused.status != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain: %d %q", refused.status, refused.raw)
	}
	listed := strings.Split(refused.header.Get("Accept-Post"), ", ")
	for _, want := range []string{"application/grpc-web-text", "application/grpc-web-text+proto", "application/grpc-web", "application/json"} {
		if !slices.Contains(listed, want) {
			t.Errorf("Accept-Post %q lacks %s", refused.header.Get("Accept-Post"), want)
		}
	}
	if !slices.IsSorted(listed) || len(slices.Compact(slices.Clone(listed))) != len(listed) {
		t.Errorf("Accept-Post %q is not a sorted list without repeats", refused.header.Get("Accept-Post"))
	}
	for _, contentType := range listed {
		if r := post(contentType); r.status == http.StatusUnsupportedMediaType {
			t.Errorf("Accept-Post lists %s, which is answered 415", contentType)
		}
	}
	// A text-mode type of a codec nobody serves is refused with the
	// same list.
	if r := post("application/grpc-web-text+xml"); r.status != http.StatusUnsupportedMediaType || r.header.Get("Accept-Post") != refused.header.Get("Accept-Post") {
		t.Errorf("grpc-web-text+xml: %d, Accept-Post %q", r.status, r.header.Get("Accept-Post"))
	}
}

// A trailers-only answer (an error decided before any message: no token, a
// reservation not found, a capacity rejection) to a text-mode call is
// labelled as text like every other answer to one, its content type
// application/grpc-web-text: the grpc-web JavaScript client picks how to
// read an answer by its content type, and docs/API.md serves text mode
// "both ways".
func TestGRPCWebTextTrailersOnlyAnswerIsLabelledText(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	get := base64.StdEncoding.EncodeToString(grpcWebFrame(t, &v1.GetReservationRequest{ReservationId: "nobody-used-it"}))
	reserve := base64.StdEncoding.EncodeToString(grpcWebFrame(t, &v1.ReserveRequest{ReservationId: "text-too-large",
		Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1 << 40}}))
	for _, c := range []struct {
		name, path, wire, token, status string
	}{
		{"not found", "/capledger.v1.LedgerService/GetReservation", get, gatewayToken, "5"},
		{"no token", "/capledger.v1.LedgerService/GetReservation", get, "", "16"},
		{"rejection", "/capledger.v1.LedgerService/Reserve", reserve, gatewayToken, "8"},
	} {
		a := h.grpcWebTextCall(c.path, c.wire, c.token)
		if a.trailers.Get("Grpc-Status") != c.status || len(a.messages) != 0 {
			t.Fatalf("%s: %+v", c.name, a)
		}
		if !strings.HasPrefix(a.contentType, "application/grpc-web-text") {
			t.Errorf("%s: a trailers-only answer to a text-mode call is labelled %q, want application/grpc-web-text", c.name, a.contentType)
		}
	}
}
