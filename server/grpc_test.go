package server_test

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/server"
)

// grpcConn is a grpc-go client connection to url (http://host:port).
func grpcConn(t testing.TB, url string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// grpcAnswer is what a grpc-go client sees of one unary call.
type grpcAnswer struct {
	Code    codes.Code
	Message string
	Details []any
	Header  metadata.MD
	Trailer metadata.MD
	Resp    proto.Message
}

// invoke calls method with a grpc-go client, as a gRPC gateway in another
// language would, and returns what it saw, leaving out the metadata only
// the transport adds.
func invoke(t testing.TB, conn *grpc.ClientConn, method, token string, req, resp proto.Message) grpcAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	var header, trailer metadata.MD
	err := conn.Invoke(ctx, method, req, resp, grpc.Header(&header), grpc.Trailer(&trailer))
	st := status.Convert(err)
	answer := grpcAnswer{Code: st.Code(), Message: st.Message(), Details: st.Details(), Header: callMetadata(header), Trailer: callMetadata(trailer)}
	if err == nil {
		answer.Resp = resp
	}
	return answer
}

// callMetadata drops what the transport adds (content type, encodings).
func callMetadata(md metadata.MD) metadata.MD {
	out := metadata.MD{}
	for k, v := range md {
		switch k {
		case "content-type", "grpc-accept-encoding", "grpc-encoding":
			continue
		}
		out[k] = v
	}
	return out
}

// TestGRPCGoAnswersAsConnectDid drives the grpc-go path (the serve port)
// and connect-go's gRPC on net/http (serve --grpc-transport net/http,
// today's answers) with one grpc-go client and the same calls, directly
// registered methods and bridged ones, and wants identical answers: auth,
// scopes, capacity rejections with their details and Retry-After, state
// errors, unknown methods, oversized messages.
func TestGRPCGoAnswersAsConnectDid(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, maxBody: 4096})
	viaGRPCGo := grpcConn(t, h.url)
	viaNetHTTP := grpcConn(t, serveNetHTTP(t, h.srv))
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate",
	  "dimensions":[{"unit":"tokens","burst":"10","refillUnits":"1","refillInterval":"2s"}]}}`, adminToken)

	const ledger = "/" + capledgerv1connect.LedgerServiceName + "/"
	reserve := func(id, subject string, n int64) *v1.ReserveRequest {
		return &v1.ReserveRequest{ReservationId: id, Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": n}}
	}
	// Fill tenant-a/u1's bucket and spend it, so its next reserve is
	// refused with a Retry-After (3 short at 1 per 2 s: 6 s).
	h.ok("Reserve", `{"reservationId":"fill","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":8}}`, gwAToken)
	h.ok("Start", `{"reservationId":"fill","operationId":"op"}`, gwAToken)
	h.ok("Settle", `{"reservationId":"fill","operationId":"op","actualUnits":{"tokens":8}}`, gwAToken)

	cases := []struct {
		name, method, token string
		req, resp           func() proto.Message
		code                codes.Code
		// sameMessage is false where the two transports word a refusal
		// differently (an oversized message: grpc-go's limit answers
		// before connect's, with the same code).
		differentMessage bool
	}{
		{name: "no token, direct", method: "Reserve", req: func() proto.Message { return reserve("x1", "tenant-a/u1", 1) },
			resp: func() proto.Message { return new(v1.ReserveResponse) }, code: codes.Unauthenticated},
		{name: "unknown token, direct", method: "Settle", token: "not-a-token-0123456789",
			req:  func() proto.Message { return &v1.SettleRequest{ReservationId: "fill", OperationId: "op"} },
			resp: func() proto.Message { return new(v1.SettleResponse) }, code: codes.Unauthenticated},
		{name: "no token, bridged", method: "GetReservation", req: func() proto.Message { return &v1.GetReservationRequest{ReservationId: "fill"} },
			resp: func() proto.Message { return new(v1.GetReservationResponse) }, code: codes.Unauthenticated},
		{name: "gateway on an admin method", method: "PublishPolicy", token: gwAToken,
			req:  func() proto.Message { return &v1.PublishPolicyRequest{} },
			resp: func() proto.Message { return new(v1.PublishPolicyResponse) }, code: codes.PermissionDenied},
		{name: "scoped token, other tenant's reserve", method: "Reserve", token: gwBToken,
			req:  func() proto.Message { return reserve("x2", "tenant-a/u1", 1) },
			resp: func() proto.Message { return new(v1.ReserveResponse) }, code: codes.NotFound},
		{name: "scoped token, other tenant's reservation", method: "Release", token: gwBToken,
			req:  func() proto.Message { return &v1.ReleaseRequest{ReservationId: "fill"} },
			resp: func() proto.Message { return new(v1.ReleaseResponse) }, code: codes.NotFound},
		{name: "scoped token, other tenant's account", method: "GetAccount", token: gwBToken,
			req:  func() proto.Message { return &v1.GetAccountRequest{Subject: "tenant-a/u1", Route: "chat.generate"} },
			resp: func() proto.Message { return new(v1.GetAccountResponse) }, code: codes.OK},
		{name: "capacity rejection", method: "Reserve", token: gwAToken,
			req:  func() proto.Message { return reserve("x3", "tenant-a/u1", 5) },
			resp: func() proto.Message { return new(v1.ReserveResponse) }, code: codes.ResourceExhausted},
		{name: "state error with the reservation", method: "Start", token: gwAToken,
			req:  func() proto.Message { return &v1.StartRequest{ReservationId: "fill", OperationId: "other"} },
			resp: func() proto.Message { return new(v1.StartResponse) }, code: codes.FailedPrecondition},
		{name: "invalid argument", method: "Settle", token: gwAToken,
			req:  func() proto.Message { return &v1.SettleRequest{} },
			resp: func() proto.Message { return new(v1.SettleResponse) }, code: codes.InvalidArgument},
		{name: "batch with a refused item", method: "ReserveBatch", token: gwAToken,
			req: func() proto.Message {
				return &v1.ReserveBatchRequest{Requests: []*v1.ReserveRequest{reserve("x4", "tenant-a/u1", 5), reserve("x5", "tenant-b/u1", 1)}}
			},
			resp: func() proto.Message { return new(v1.ReserveBatchResponse) }, code: codes.OK},
		{name: "unknown method", method: "Reserv", token: gwAToken,
			req:  func() proto.Message { return reserve("x6", "tenant-a/u1", 1) },
			resp: func() proto.Message { return new(v1.ReserveResponse) }, code: codes.Unimplemented, differentMessage: true},
		{name: "oversized message, direct", method: "Reserve", token: gwAToken,
			req:  func() proto.Message { return reserve(strings.Repeat("x", 5000), "tenant-a/u1", 1) },
			resp: func() proto.Message { return new(v1.ReserveResponse) }, code: codes.ResourceExhausted, differentMessage: true},
		{name: "oversized message, bridged", method: "GetReservation", token: gwAToken,
			req:  func() proto.Message { return &v1.GetReservationRequest{ReservationId: strings.Repeat("x", 5000)} },
			resp: func() proto.Message { return new(v1.GetReservationResponse) }, code: codes.ResourceExhausted, differentMessage: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := invoke(t, viaNetHTTP, ledger+c.method, c.token, c.req(), c.resp())
			got := invoke(t, viaGRPCGo, ledger+c.method, c.token, c.req(), c.resp())
			if want.Code != c.code {
				t.Fatalf("net/http answered %v (%s), want %v", want.Code, want.Message, c.code)
			}
			if c.differentMessage {
				want.Message, got.Message = "", ""
			}
			// Header metadata: net/http's gRPC answers always carry headers
			// before trailers; a grpc-go error without headers is
			// trailers-only. What a client reads (status, details,
			// trailers, response) must be the same.
			want.Header, got.Header = nil, nil
			if diff := want.diff(got); diff != "" {
				t.Errorf("grpc-go answers otherwise than net/http (net/http's first):\n%s", diff)
			}
		})
	}
	// The rejection carries its detail and Retry-After on the grpc-go path
	// (not only "the same as before").
	got := invoke(t, viaGRPCGo, ledger+"Reserve", gwAToken, reserve("x7", "tenant-a/u1", 5), new(v1.ReserveResponse))
	if got.Code != codes.ResourceExhausted || len(got.Details) != 1 || got.Trailer.Get("retry-after")[0] != "6" {
		t.Fatalf("rejection over grpc-go: %+v", got)
	}
	if d, ok := got.Details[0].(*v1.RejectionDetail); !ok || d.GetLimitingDimension() != "tokens" || d.GetReason() != server.ReasonInsufficientCapacity {
		t.Fatalf("rejection detail over grpc-go: %v", got.Details[0])
	}
	if grpcConns, _ := h.front.Routed(); grpcConns == 0 {
		t.Fatalf("no connection was routed to grpc-go")
	}
}

// TestGRPCGoStreamsAudit: StreamAudit (server streaming, bridged) over a
// grpc-go client streams its events and refuses a gateway token.
func TestGRPCGoStreamsAudit(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("r", 10), gatewayToken)
	conn := grpcConn(t, h.url)
	desc := &grpc.StreamDesc{StreamName: "StreamAudit", ServerStreams: true}
	run := func(token string) ([]*v1.AuditEvent, error) {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
		stream, err := conn.NewStream(ctx, desc, capledgerv1connect.AuditServiceStreamAuditProcedure)
		if err != nil {
			return nil, err
		}
		if err := stream.SendMsg(&v1.StreamAuditRequest{}); err != nil {
			return nil, err
		}
		if err := stream.CloseSend(); err != nil {
			return nil, err
		}
		var events []*v1.AuditEvent
		for {
			ev := new(v1.AuditEvent)
			if err := stream.RecvMsg(ev); err != nil {
				if errors.Is(err, io.EOF) {
					return events, nil
				}
				return events, err
			}
			events = append(events, ev)
		}
	}
	if events, err := run(gatewayToken); status.Code(err) != codes.PermissionDenied || len(events) > 0 {
		t.Fatalf("gateway token: %d events, %v", len(events), err)
	}
	events, err := run(adminToken)
	if err != nil || len(events) < 2 {
		t.Fatalf("admin: %d events, %v", len(events), err)
	}
	if last := events[len(events)-1].GetResult(); last == nil || len(last.GetDiscrepancies()) > 0 {
		t.Fatalf("last event %v", events[len(events)-1])
	}
}

// TestOnePortServesEveryProtocol: beside grpc-go's gRPC, the serve port
// still answers HTTP/1.1 JSON, Connect (binary, over h2c), gRPC-Web and
// gRPC with JSON messages on net/http, and each connection went where its
// protocol belongs.
func TestOnePortServesEveryProtocol(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	ctx := context.Background()
	reserveReq := func(id string) *connect.Request[v1.ReserveRequest] {
		return connect.NewRequest(&v1.ReserveRequest{ReservationId: id, Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1, "requests": 1}})
	}
	_, httpBefore := h.front.Routed()
	for _, c := range []struct {
		name string
		opts []connect.ClientOption
	}{
		{"connect", nil},
		{"connect-json", []connect.ClientOption{connect.WithProtoJSON()}},
		{"grpc-web", []connect.ClientOption{connect.WithGRPCWeb()}},
		{"grpc-json", []connect.ClientOption{connect.WithGRPC(), connect.WithProtoJSON()}},
	} {
		if _, err := h.grpcClient(c.opts...).Reserve(ctx, reserveReq("p-"+c.name)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}
	h.ok("Reserve", reserveBody("p-http1", 1), "")
	grpcConns, httpConns := h.front.Routed()
	// Each connect client has a transport of its own (4 connections);
	// the HTTP/1.1 call may reuse the harness's connection.
	if grpcConns != 0 || httpConns-httpBefore < 4 {
		t.Fatalf("routed %d connections to grpc-go, %d to net/http; want 0 and at least 4", grpcConns, httpConns-httpBefore)
	}
	// Connect's gRPC client and grpc-go's both land on grpc-go.
	if _, err := h.grpcClient(connect.WithGRPC()).Reserve(ctx, reserveReq("p-grpc-connect")); err != nil {
		t.Fatal(err)
	}
	var resp v1.ReserveResponse
	if a := invoke(t, grpcConn(t, h.url), "/capledger.v1.LedgerService/Reserve", "", reserveReq("p-grpc-go").Msg, &resp); a.Code != codes.OK {
		t.Fatalf("grpc-go client: %+v", a)
	}
	if grpcConns, _ := h.front.Routed(); grpcConns != 2 {
		t.Fatalf("routed %d gRPC connections to grpc-go, want 2", grpcConns)
	}
	// Health and metrics over HTTP/1.1 still work.
	if got := h.get("/healthz"); got != "ok\n" {
		t.Fatalf("healthz %q", got)
	}
	if !strings.Contains(h.get("/metrics"), `capledger_commands_total{kind="reserve",outcome="ok"} 7`) {
		t.Errorf("metrics do not count the 7 reserves:\n%s", grep(h.get("/metrics"), "capledger_commands_total"))
	}
}

// TestGRPCGoShutdownIsGraceful: Shutdown lets a call in flight on grpc-go
// finish, and refuses new connections after.
func TestGRPCGoShutdownIsGraceful(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	conn := grpcConn(t, h.url)
	var resp v1.ReserveResponse
	if a := invoke(t, conn, "/capledger.v1.LedgerService/Reserve", "", &v1.ReserveRequest{ReservationId: "s1", Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1, "requests": 1}}, &resp); a.Code != codes.OK {
		t.Fatalf("reserve: %+v", a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.front.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := http.Get(h.url + "/healthz"); err == nil {
		t.Fatalf("the port still answers after Shutdown")
	}
}

// diff describes how two answers differ ("" when they do not).
func (a grpcAnswer) diff(b grpcAnswer) string {
	var out []string
	if a.Code != b.Code || a.Message != b.Message {
		out = append(out, fmt.Sprintf("status %v %q, then %v %q", a.Code, a.Message, b.Code, b.Message))
	}
	if len(a.Details) != len(b.Details) {
		out = append(out, fmt.Sprintf("details %v, then %v", a.Details, b.Details))
	} else {
		for i := range a.Details {
			da, okA := a.Details[i].(proto.Message)
			db, okB := b.Details[i].(proto.Message)
			if !okA || !okB || !proto.Equal(da, db) {
				out = append(out, fmt.Sprintf("detail %d: %v, then %v", i, a.Details[i], b.Details[i]))
			}
		}
	}
	if ma, mb := mdString(a.Header), mdString(b.Header); ma != mb {
		out = append(out, "header "+ma+", then "+mb)
	}
	if ma, mb := mdString(a.Trailer), mdString(b.Trailer); ma != mb {
		out = append(out, "trailer "+ma+", then "+mb)
	}
	if (a.Resp == nil) != (b.Resp == nil) || (a.Resp != nil && !proto.Equal(a.Resp, b.Resp)) {
		out = append(out, fmt.Sprintf("response %v, then %v", a.Resp, b.Resp))
	}
	return strings.Join(out, "\n")
}

func mdString(md metadata.MD) string {
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q ", k, md[k])
	}
	return b.String()
}

// TestSniffFallsBackToNetHTTP: a connection that is not gRPC, or whose
// HTTP/2 start is malformed (a DATA frame before any HEADERS), goes to
// net/http, which answers it as it always did.
func TestSniffFallsBackToNetHTTP(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	addr := strings.TrimPrefix(h.url, "http://")
	dial := func() net.Conn {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conn.SetDeadline(time.Now().Add(10 * time.Second)) // a hang fails instead of blocking the run
		return conn
	}
	// HTTP/1.1 on a raw socket.
	conn := dial()
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: capledger\r\nConnection: close\r\n\r\n")
	answer, err := io.ReadAll(conn)
	if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 200") || !strings.HasSuffix(string(answer), "ok\n") {
		t.Fatalf("HTTP/1.1 on a raw socket: %q, %v", answer, err)
	}
	// An HTTP/2 preface, then DATA on stream 1: net/http's HTTP/2 server
	// gets it and ends the connection with GOAWAY PROTOCOL_ERROR.
	_, httpBefore := h.front.Routed()
	conn = dial()
	io.WriteString(conn, http2.ClientPreface)
	framer := http2.NewFramer(conn, conn)
	framer.WriteSettings()
	framer.WriteData(1, true, []byte("not a request"))
	var goAway *http2.GoAwayFrame
	for goAway == nil {
		frame, err := framer.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer to a malformed HTTP/2 start: %v", err)
		}
		goAway, _ = frame.(*http2.GoAwayFrame)
	}
	if goAway.ErrCode != http2.ErrCodeProtocol {
		t.Fatalf("GOAWAY %v, want PROTOCOL_ERROR", goAway.ErrCode)
	}
	if grpcConns, httpConns := h.front.Routed(); grpcConns != 0 || httpConns != httpBefore+1 {
		t.Fatalf("routed to grpc-go %d, to net/http %d more; want 0 and 1", grpcConns, httpConns-httpBefore)
	}
}

// h2cAnswer is what one gRPC request over a raw HTTP/2 connection got.
type h2cAnswer struct {
	HTTPStatus  int
	ContentType string
	GRPCStatus  string // from the trailers, or the headers of a trailers-only answer
	GRPCMessage string
	Encoding    string // grpc-encoding
	Body        string // hex: the answer's frames
}

// grpcCode is the status a gRPC client derives from the answer: its
// grpc-status, else its HTTP status as gRPC's "HTTP to gRPC status code
// mapping" has it (what matters here: 415 and other unlisted codes are
// UNKNOWN).
func (a h2cAnswer) grpcCode() codes.Code {
	if a.GRPCStatus != "" {
		var c int
		fmt.Sscan(a.GRPCStatus, &c)
		return codes.Code(c)
	}
	if a.HTTPStatus == http.StatusNotFound {
		return codes.Unimplemented
	}
	return codes.Unknown
}

// h2cCall sends one gRPC request with the given content type over rt
// (an HTTP/2 transport without TLS) and reads the whole answer.
func h2cCall(t *testing.T, rt http.RoundTripper, url, method, token, contentType string, msg proto.Message) h2cAnswer {
	t.Helper()
	payload, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	return h2cSend(t, rt, url, method, http.Header{"Content-Type": {contentType}, "Authorization": {"Bearer " + token}}, grpcFrame(payload, false))
}

// grpcFrame is one gRPC length-prefixed message.
func grpcFrame(payload []byte, compressed bool) []byte {
	frame := make([]byte, 5+len(payload))
	if compressed {
		frame[0] = 1
	}
	binary.BigEndian.PutUint32(frame[1:], uint32(len(payload)))
	copy(frame[5:], payload)
	return frame
}

// h2cSend sends one request of a LedgerService method with the headers
// and body given over rt and reads the whole answer.
func h2cSend(t *testing.T, rt http.RoundTripper, url, method string, header http.Header, body []byte) h2cAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/"+capledgerv1connect.LedgerServiceName+"/"+method, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	req.Header.Set("Te", "trailers")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s with %v: %v", method, header, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s with %v: reading the answer: %v", method, header, err)
	}
	a := h2cAnswer{HTTPStatus: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Encoding: resp.Header.Get("Grpc-Encoding"), Body: fmt.Sprintf("%x", raw)}
	for _, h := range []http.Header{resp.Trailer, resp.Header} {
		if s := h.Get("Grpc-Status"); s != "" && a.GRPCStatus == "" {
			a.GRPCStatus, a.GRPCMessage = s, h.Get("Grpc-Message")
		}
	}
	return a
}

// h2cTransport is an HTTP/2 client without TLS (prior knowledge); every
// transport opens connections of its own.
func h2cTransport(t *testing.T) *http2.Transport {
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// TestGRPCContentTypesAnswerAsOnNetHTTP: a gRPC request whose content
// type grpc-go does not take as it is (another case, which media types
// allow, or parameters) is answered on the serve port as on
// `--grpc-transport net/http` (API.md: "the answers are the same on
// both"), for a directly registered method and a bridged one alike: on
// a new connection it goes to net/http, and on a connection grpc-go
// already serves it is never served as protobuf by the direct methods
// while the bridged ones refuse it.
func TestGRPCContentTypesAnswerAsOnNetHTTP(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens})
	netHTTP := serveNetHTTP(t, h.srv)
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"10"}]}}`, adminToken)
	h.ok("Reserve", `{"reservationId":"ct","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":1}}`, gwAToken)
	calls := []struct {
		method string
		msg    proto.Message
	}{
		// A replay of the reservation above: the same answer every time.
		{"Reserve", &v1.ReserveRequest{ReservationId: "ct", Subject: "tenant-a/u1", Route: "chat.generate", Units: map[string]int64{"tokens": 1}}},
		{"GetReservation", &v1.GetReservationRequest{ReservationId: "ct"}},
	}
	for _, contentType := range []string{"Application/gRPC", "application/GRPC+PROTO", "application/grpc;charset=utf-8", "application/grpc; charset=utf-8"} {
		for _, c := range calls {
			t.Run(c.method+" "+contentType, func(t *testing.T) {
				want := h2cCall(t, h2cTransport(t), netHTTP, c.method, gwAToken, contentType, c.msg)
				got := h2cCall(t, h2cTransport(t), h.url, c.method, gwAToken, contentType, c.msg)
				if got != want {
					t.Errorf("first request of a connection:\n serve port: %+v\n net/http:   %+v", got, want)
				}
				// The same request on a connection grpc-go serves (its
				// first request was plain application/grpc).
				rt := h2cTransport(t)
				if first := h2cCall(t, rt, h.url, c.method, gwAToken, "application/grpc", c.msg); first.GRPCStatus != "0" {
					t.Fatalf("plain application/grpc: %+v", first)
				}
				if strings.Contains(contentType, ";") {
					if got := h2cCall(t, rt, h.url, c.method, gwAToken, contentType, c.msg); got.grpcCode() != want.grpcCode() {
						t.Errorf("on a grpc-go connection: %v (%+v); net/http: %v", got.grpcCode(), got, want.grpcCode())
					}
				}
			})
		}
	}
}

// TestGRPCGoCompression: on grpc-go, a gzip-compressed request is
// served and answered gzip-compressed, directly registered methods and
// bridged ones alike; an uncompressed one is answered uncompressed even
// when it offers gzip (grpc-accept-encoding); deflate is UNIMPLEMENTED;
// and a message over --max-body once decompressed is RESOURCE_EXHAUSTED
// in grpc-go's words (API.md, "Transports").
func TestGRPCGoCompression(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, maxBody: 4096})
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"10"}]}}`, adminToken)
	h.ok("Reserve", `{"reservationId":"gz","subject":"tenant-a/u1","route":"chat.generate","units":{"tokens":1}}`, gwAToken)
	compress := func(t *testing.T, msg proto.Message, write func(io.Writer) io.WriteCloser) []byte {
		payload, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		w := write(&buf)
		w.Write(payload)
		w.Close()
		return grpcFrame(buf.Bytes(), true)
	}
	gzipped := func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) }
	deflated := func(w io.Writer) io.WriteCloser { fw, _ := flate.NewWriter(w, flate.DefaultCompression); return fw }
	header := func(extra ...string) http.Header {
		hd := http.Header{"Content-Type": {"application/grpc"}, "Authorization": {"Bearer " + gwAToken}}
		for i := 0; i < len(extra); i += 2 {
			hd.Set(extra[i], extra[i+1])
		}
		return hd
	}
	for _, c := range []struct {
		method string
		msg    proto.Message
		big    proto.Message
	}{
		{"Reserve", // a replay: served without reserving again
			&v1.ReserveRequest{ReservationId: "gz", Subject: "tenant-a/u1", Route: "chat.generate", Units: map[string]int64{"tokens": 1}},
			&v1.ReserveRequest{ReservationId: strings.Repeat("x", 5000), Subject: "tenant-a/u1", Route: "chat.generate", Units: map[string]int64{"tokens": 1}}},
		{"GetReservation",
			&v1.GetReservationRequest{ReservationId: "gz"},
			&v1.GetReservationRequest{ReservationId: strings.Repeat("x", 5000)}},
	} {
		t.Run(c.method, func(t *testing.T) {
			rt := h2cTransport(t)
			a := h2cSend(t, rt, h.url, c.method, header("Grpc-Encoding", "gzip", "Grpc-Accept-Encoding", "gzip"), compress(t, c.msg, gzipped))
			if a.GRPCStatus != "0" || a.Encoding != "gzip" || !strings.HasPrefix(a.Body, "01") {
				t.Errorf("gzip request: want OK, answered gzip-compressed; got %+v", a)
			}
			payload, _ := proto.Marshal(c.msg)
			a = h2cSend(t, rt, h.url, c.method, header("Grpc-Accept-Encoding", "gzip"), grpcFrame(payload, false))
			if a.GRPCStatus != "0" || a.Encoding != "" || !strings.HasPrefix(a.Body, "00") {
				t.Errorf("uncompressed request offering gzip: want OK, answered uncompressed; got %+v", a)
			}
			a = h2cSend(t, rt, h.url, c.method, header("Grpc-Encoding", "deflate"), compress(t, c.msg, deflated))
			if a.grpcCode() != codes.Unimplemented {
				t.Errorf("deflate: want UNIMPLEMENTED, got %+v", a)
			}
			a = h2cSend(t, rt, h.url, c.method, header("Grpc-Encoding", "gzip"), compress(t, c.big, gzipped))
			if want := "grpc: received message after decompression larger than max 4096"; a.grpcCode() != codes.ResourceExhausted || a.GRPCMessage != want {
				t.Errorf("gzip message over --max-body once decompressed: want RESOURCE_EXHAUSTED %q, got %+v", want, a)
			}
		})
	}
	if grpcConns, _ := h.front.Routed(); grpcConns != 2 {
		t.Fatalf("routed %d connections to grpc-go, want 2", grpcConns)
	}
}

// TestGRPCGoUndecodableAnswersAsConnectDid: a request message that does
// not decode (a string that is not UTF-8) is INVALID_ARGUMENT with the
// same message on grpc-go's direct methods, its bridged ones and
// connect's gRPC on net/http, with a token or without (decoding comes
// before auth).
func TestGRPCGoUndecodableAnswersAsConnectDid(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens})
	netHTTP := serveNetHTTP(t, h.srv)
	notUTF8 := grpcFrame([]byte{0x0a, 0x02, 'r', 0xff}, false) // field 1 (the reservation id of both requests): "r\xff"
	for _, method := range []string{"Reserve", "GetReservation"} {
		for _, token := range []string{"", gwAToken} {
			header := http.Header{"Content-Type": {"application/grpc"}}
			if token != "" {
				header.Set("Authorization", "Bearer "+token)
			}
			want := h2cSend(t, h2cTransport(t), netHTTP, method, header, notUTF8)
			got := h2cSend(t, h2cTransport(t), h.url, method, header, notUTF8)
			if want.grpcCode() != codes.InvalidArgument || !strings.Contains(want.GRPCMessage, "invalid UTF-8") {
				t.Fatalf("%s on net/http: %+v", method, want)
			}
			if got.grpcCode() != want.grpcCode() || got.GRPCMessage != want.GRPCMessage {
				t.Errorf("%s (token %q) on grpc-go: %v %q; on net/http: %v %q", method, token, got.grpcCode(), got.GRPCMessage, want.grpcCode(), want.GRPCMessage)
			}
		}
	}
}

// TestGRPCGoConnectionLimits: grpc-go tells a client it takes up to
// 250 concurrent calls per connection and 64 KiB of request headers
// (hpack's count: names, values and 32 bytes each), as net/http's HTTP/2
// server does for Connect (which says 65856, its 64 KiB padded for 10
// fields: TestNetHTTPConnectionSettings) (API.md, "Transports"), and
// serves a call with 58 KiB of headers.
func TestGRPCGoConnectionLimits(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens})
	framer := h2cFramer(t, h.url)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/capledger.v1.LedgerService/GetReservation"},
		{":authority", "capledger"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", "Bearer " + gwAToken}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := range 80 { // 80 * (13 + 700 + 32) bytes: about 58 KiB
		enc.WriteField(hpack.HeaderField{Name: fmt.Sprintf("x-padding-%02d", i), Value: strings.Repeat("p", 700)})
	}
	// In frames of at most 16 KiB, the default frame size.
	fragment := block.Next(16 << 10)
	framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fragment, EndHeaders: block.Len() == 0})
	for block.Len() > 0 {
		fragment = block.Next(16 << 10)
		framer.WriteContinuation(1, block.Len() == 0, fragment)
	}
	payload, _ := proto.Marshal(&v1.GetReservationRequest{ReservationId: "none"})
	framer.WriteData(1, true, grpcFrame(payload, false))
	settings := map[http2.SettingID]uint32{}
	for {
		frame, err := framer.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v (settings so far %v)", err, settings)
		}
		switch f := frame.(type) {
		case *http2.SettingsFrame:
			f.ForeachSetting(func(s http2.Setting) error { settings[s.ID] = s.Val; return nil })
		case *http2.MetaHeadersFrame:
			var grpcStatus string
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					grpcStatus = hf.Value
				}
			}
			if grpcStatus != "5" { // NOT_FOUND: the call was served
				t.Errorf("a call with 58 KiB of headers: %v", f.Fields)
			}
			if settings[http2.SettingMaxConcurrentStreams] != 250 || settings[http2.SettingMaxHeaderListSize] != 64<<10 {
				t.Errorf("grpc-go's settings %v: want MAX_CONCURRENT_STREAMS 250, MAX_HEADER_LIST_SIZE 65536", settings)
			}
			return
		}
	}
}

// h2cFramer opens an HTTP/2 connection without TLS to url and returns
// its framer, the client preface and SETTINGS sent.
func h2cFramer(t *testing.T, url string) *http2.Framer {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second)) // a hang fails instead of blocking the run
	io.WriteString(conn, http2.ClientPreface)
	framer := http2.NewFramer(conn, conn)
	framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	framer.WriteSettings()
	return framer
}

// TestGRPCGoRefusesTooManyPings: a gRPC client that pings more often
// than every 10 s, here without a call in flight, gets GOAWAY
// ENHANCE_YOUR_CALM "too_many_pings" (API.md, "Transports").
func TestGRPCGoRefusesTooManyPings(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	framer := h2cFramer(t, h.url)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/capledger.v1.LedgerService/GetReservation"},
		{":authority", "capledger"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	payload, _ := proto.Marshal(&v1.GetReservationRequest{ReservationId: "none"})
	framer.WriteData(1, true, grpcFrame(payload, false))
	pings := 0
	for {
		frame, err := framer.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY after %d pings: %v", pings, err)
		}
		switch f := frame.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				framer.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				continue
			}
			// The call is over: ping, with nothing else sent, until
			// grpc-go has had enough.
			for range 5 {
				framer.WritePing(false, [8]byte{})
				pings++
			}
		case *http2.GoAwayFrame:
			if f.ErrCode != http2.ErrCodeEnhanceYourCalm || string(f.DebugData()) != "too_many_pings" {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM \"too_many_pings\"", f.ErrCode, f.DebugData())
			}
			if pings == 0 {
				t.Fatalf("GOAWAY before any ping")
			}
			return
		}
	}
}

// TestGRPCGoProtocolErrors: what grpc-go's transport answers before any
// handler (API.md, "Transports"), for a directly registered method
// (Reserve) and a bridged one (GetReservation): a grpc-timeout already
// passed (0n) is DEADLINE_EXCEEDED and applies nothing; a malformed one
// is INTERNAL with HTTP 400; no request message or two is INTERNAL
// (cardinality violation) on the direct method, UNIMPLEMENTED on the
// bridged one.
func TestGRPCGoProtocolErrors(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	reserve, _ := proto.Marshal(&v1.ReserveRequest{ReservationId: "late", Subject: "tenant-7", Route: "chat.generate", Units: map[string]int64{"tokens": 1, "requests": 1}})
	get, _ := proto.Marshal(&v1.GetReservationRequest{ReservationId: "late"})
	messages := map[string][]byte{"Reserve": reserve, "GetReservation": get}
	rt := h2cTransport(t)
	for _, c := range []struct {
		name, method, timeout string
		body                  func(msg []byte) []byte
		code                  codes.Code
		httpStatus            int
		message               string
	}{
		{"timeout 0n", "Reserve", "0n", func(m []byte) []byte { return grpcFrame(m, false) }, codes.DeadlineExceeded, 200, "context deadline exceeded"},
		{"timeout 0n", "GetReservation", "0n", func(m []byte) []byte { return grpcFrame(m, false) }, codes.DeadlineExceeded, 200, "context deadline exceeded"},
		{"timeout abc", "Reserve", "abc", func(m []byte) []byte { return grpcFrame(m, false) }, codes.Internal, 400, `malformed grpc-timeout: transport: timeout unit is not recognized: "abc"`},
		{"timeout abc", "GetReservation", "abc", func(m []byte) []byte { return grpcFrame(m, false) }, codes.Internal, 400, `malformed grpc-timeout: transport: timeout unit is not recognized: "abc"`},
		{"no message", "Reserve", "", func([]byte) []byte { return nil }, codes.Internal, 200, "cardinality violation: received no request message from non-client-streaming RPC"},
		{"no message", "GetReservation", "", func([]byte) []byte { return nil }, codes.Unimplemented, 200, "unary request has zero messages"},
		{"two messages", "Reserve", "", func(m []byte) []byte { return append(grpcFrame(m, false), grpcFrame(m, false)...) }, codes.Internal, 200, "cardinality violation: received multiple request messages for non-client-streaming RPC"},
		{"two messages", "GetReservation", "", func(m []byte) []byte { return append(grpcFrame(m, false), grpcFrame(m, false)...) }, codes.Unimplemented, 200, "unary request has multiple messages"},
	} {
		header := http.Header{"Content-Type": {"application/grpc"}}
		if c.timeout != "" {
			header.Set("Grpc-Timeout", c.timeout)
		}
		a := h2cSend(t, rt, h.url, c.method, header, c.body(messages[c.method]))
		if a.grpcCode() != c.code || a.HTTPStatus != c.httpStatus || a.GRPCMessage != c.message {
			t.Errorf("%s, %s: %+v; want %v %q, HTTP %d", c.name, c.method, a, c.code, c.message, c.httpStatus)
		}
	}
	// Nothing was reserved.
	if a := h2cSend(t, rt, h.url, "GetReservation", http.Header{"Content-Type": {"application/grpc"}}, grpcFrame(get, false)); a.grpcCode() != codes.NotFound {
		t.Errorf("the refused reserves left a reservation: %+v", a)
	}
	if grpcConns, _ := h.front.Routed(); grpcConns != 1 {
		t.Errorf("routed %d connections to grpc-go, want 1", grpcConns)
	}
}
