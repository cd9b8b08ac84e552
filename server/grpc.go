package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/gzip" // clients may send gzip, as they may to connect
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

// This file serves gRPC through grpc-go's own HTTP/2 transport (Front
// hands it the connections that speak gRPC). Every method the connect mux
// serves is reachable there, by one rule: a call grpc-go has no
// registration for goes through the bridge, which runs it in-process
// through Handler() as a gRPC request (the same connect handler, auth
// interceptor, body limit and error mapping a gRPC call over net/http
// gets) and carries its status, headers and trailers back. Only the hot
// unary methods are registered directly (grpcHotMethods, and what adapters
// add with RegisterGRPC): they skip connect's envelope and header handling,
// and pass the same checks through grpcUnary, which calls the functions
// the connect interceptors call.

// GRPCOptions tune the grpc-go server. The zero value takes the defaults
// documented in docs/OPERATIONS.md.
type GRPCOptions struct {
	// IdleTimeout closes a connection without calls for this long (as
	// HTTPServer's IdleTimeout does on net/http); default 120 s.
	IdleTimeout time.Duration
}

// grpcPingMinTime is the shortest keepalive ping interval a client may
// use, with or without calls in flight: grpc-go's default (5 minutes, and
// no pings without calls) would send GOAWAY "too_many_pings" to clients
// that net/http served without complaint.
const grpcPingMinTime = 10 * time.Second

// grpcStreamWorkers is how many goroutines serve calls and are kept for
// the next call; a call that finds none idle gets a goroutine of its own,
// as without them. A goroutine per call grows its stack from the minimum
// on every call, down to the engine's commit: 5-7 % of the server's CPU
// per Envoy check at 64 concurrent calls (docs/PERFORMANCE.md).
const grpcStreamWorkers = 64

// grpcMaxConcurrentStreams and grpcMaxHeaderListSize are net/http's
// HTTP/2 defaults under HTTPServer, kept for gRPC clients on grpc-go.
const (
	grpcMaxConcurrentStreams = 250
	grpcMaxHeaderListSize    = 64 << 10
)

// GRPCServer returns a grpc.Server that serves every method of the
// server's Handler (mounted adapters included): the hot LedgerService
// methods directly, everything else through the bridge. Call it after
// every Mount; adapters register their direct methods on the result with
// RegisterGRPC's help before it serves.
func (s *Server) GRPCServer(opts GRPCOptions) *grpc.Server {
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 120 * time.Second
	}
	gs := grpc.NewServer(
		grpc.ForceServerCodecV2(grpcCodec{}),
		grpc.NumStreamWorkers(grpcStreamWorkers),
		grpc.MaxRecvMsgSize(int(s.maxBody)),
		grpc.UnknownServiceHandler(s.bridgeStream),
		grpc.UnaryInterceptor(s.grpcUnary),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: grpcPingMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: opts.IdleTimeout}),
		// As net/http's HTTP/2 server (HTTPServer): 250 concurrent
		// streams per connection, 64 KiB of request headers.
		grpc.MaxConcurrentStreams(grpcMaxConcurrentStreams),
		grpc.MaxHeaderListSize(grpcMaxHeaderListSize),
	)
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: capledgerv1connect.LedgerServiceName,
		HandlerType: (*any)(nil),
		Methods:     grpcHotMethods(),
		Metadata:    "capledger/v1/capledger.proto",
	}, s)
	return gs
}

// grpcHotMethods are the LedgerService methods grpc-go serves directly.
func grpcHotMethods() []grpc.MethodDesc {
	return []grpc.MethodDesc{
		grpcMethod("Reserve", (*Server).Reserve),
		grpcMethod("Start", (*Server).Start),
		grpcMethod("Settle", (*Server).Settle),
		grpcMethod("Release", (*Server).Release),
		grpcMethod("ReserveBatch", (*Server).ReserveBatch),
		grpcMethod("SettleBatch", (*Server).SettleBatch),
		grpcMethod("RecordUsage", (*Server).RecordUsage),
	}
}

// grpcMethod is a direct registration of one unary connect handler
// method. A call whose codec is not protobuf (application/grpc+json) goes
// through the bridge, which serves it as connect would.
func grpcMethod[Req, Resp any](name string, call func(*Server, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)) grpc.MethodDesc {
	procedure := "/" + capledgerv1connect.LedgerServiceName + "/" + name
	info := &grpc.UnaryServerInfo{FullMethod: procedure}
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		s := srv.(*Server)
		if !protobufCall(ctx) {
			return s.bridgeUnary(ctx, procedure, dec)
		}
		in := new(Req)
		if err := DecodeGRPC(dec, any(in).(proto.Message)); err != nil {
			return nil, err
		}
		handler := func(ctx context.Context, req any) (any, error) {
			resp, err := call(s, ctx, connect.NewRequest(req.(*Req)))
			if err != nil {
				return nil, err
			}
			if err := grpcResponseMetadata(ctx, resp.Header(), resp.Trailer()); err != nil {
				return nil, err
			}
			return resp.Msg, nil
		}
		return interceptor(ctx, in, info, handler)
	}}
}

// DecodeGRPC decodes the request of a method registered directly on the
// server's grpc-go server (GRPCServer) into msg, with dec, the method
// handler's: a message that does not decode (a string that is not UTF-8)
// is INVALID_ARGUMENT, as connect answers it on every other path, where
// grpc-go's own decoding answers INTERNAL (a bug, API.md). Adapters'
// direct methods (RegisterGRPC) decode with it too.
func DecodeGRPC(dec func(any) error, msg proto.Message) error {
	raw := new(rawMessage)
	if err := dec(raw); err != nil {
		return err
	}
	if err := proto.Unmarshal(raw.data, msg); err != nil {
		// Worded as connect's protobuf codec and envelope word it, so
		// the message is the same on every path.
		return status.Errorf(codes.InvalidArgument, "unmarshal message: unmarshal into %T: %v", msg, err)
	}
	return nil
}

// protobufCall reports whether the call's messages are protobuf as
// protobufGRPC spells them; the bridge serves any other content type
// grpc-go passed (+json, parameters) as connect would.
func protobufCall(ctx context.Context) bool {
	ct := metadata.ValueFromIncomingContext(ctx, "content-type")
	return len(ct) == 0 || protobufGRPC(ct[0])
}

// grpcUnary is the interceptor of every directly registered method: the
// checks the connect interceptors make (authCheck, console counts, the
// store cap of storecap.go), by the same functions, and connect errors turned into the status, details
// and trailers connect's gRPC protocol would answer.
func (s *Server) grpcUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.auth != nil {
		var authorization string
		if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
			authorization = v[0]
		}
		id, err := s.auth.authorize(authorization, info.FullMethod)
		if err != nil {
			return nil, grpcError(ctx, err)
		}
		ctx = context.WithValue(ctx, identityKey{}, id)
	}
	if cerr := s.checkRequestText(ctx, info.FullMethod, req); cerr != nil {
		s.console.count(info.FullMethod, nil, cerr)
		return nil, grpcError(ctx, cerr)
	}
	capped, cancel := s.capStore(ctx, info.FullMethod)
	defer cancel()
	resp, err := handler(capped, req)
	err = s.storeCapError(ctx, err, false) // the direct methods all write
	s.console.count(info.FullMethod, resp, err)
	if err != nil {
		return nil, grpcError(ctx, err)
	}
	return resp, nil
}

// grpcError returns err as connect's gRPC protocol puts it on the wire:
// the code, the message without the code's prefix, the details as
// google.rpc.Status details, and the error's metadata (e.g. Retry-After)
// as trailers. A non-connect error is UNKNOWN, as connect answers it.
func grpcError(ctx context.Context, err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		cerr = connect.NewError(connect.CodeUnknown, err)
	}
	st := &spb.Status{Code: int32(cerr.Code()), Message: cerr.Message()}
	for _, d := range cerr.Details() {
		st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	if md := grpcMetadata(cerr.Meta()); len(md) > 0 {
		grpc.SetTrailer(ctx, md)
	}
	return status.FromProto(st).Err()
}

// grpcResponseMetadata sends a connect response's headers and trailers as
// the call's header and trailer metadata.
func grpcResponseMetadata(ctx context.Context, header, trailer http.Header) error {
	if md := grpcMetadata(header); len(md) > 0 {
		if err := grpc.SetHeader(ctx, md); err != nil {
			return err
		}
	}
	if md := grpcMetadata(trailer); len(md) > 0 {
		return grpc.SetTrailer(ctx, md)
	}
	return nil
}

// grpcMetadata converts HTTP headers to metadata, leaving out what the
// gRPC protocol itself carries (content type, encodings, status) and
// decoding -bin values, which grpc-go encodes again.
func grpcMetadata(h http.Header) metadata.MD {
	var md metadata.MD
	for key, values := range h {
		lower := strings.ToLower(key)
		if protocolHeader(lower) {
			continue
		}
		if md == nil {
			md = make(metadata.MD, len(h))
		}
		for _, v := range values {
			if strings.HasSuffix(lower, "-bin") {
				if raw, err := decodeBinaryHeader(v); err == nil {
					v = string(raw)
				}
			}
			md[lower] = append(md[lower], v)
		}
	}
	return md
}

// protocolHeader reports whether a (lower-case) header belongs to the
// HTTP or gRPC protocol rather than to the call's metadata.
func protocolHeader(key string) bool {
	switch key {
	case "content-type", "content-length", "content-encoding", "date", "trailer", "te", "connection",
		"grpc-status", "grpc-message", "grpc-status-details-bin", "grpc-encoding", "grpc-accept-encoding", "grpc-timeout":
		return true
	}
	return false
}

func decodeBinaryHeader(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// --- the bridge ---

// rawMessage is a message the bridge carries as its wire bytes.
type rawMessage struct{ data []byte }

// grpcCodec is protobuf for the directly registered methods and a
// pass-through of the wire bytes for the bridge.
type grpcCodec struct{}

var protoCodec = encoding.GetCodecV2("proto")

func (grpcCodec) Name() string { return "proto" }

func (grpcCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*rawMessage); ok {
		return mem.BufferSlice{mem.SliceBuffer(m.data)}, nil
	}
	return protoCodec.Marshal(v)
}

func (grpcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if m, ok := v.(*rawMessage); ok {
		m.data = data.Materialize()
		return nil
	}
	return protoCodec.Unmarshal(data, v)
}

// bridgeCall is what the bridge needs of a call: a grpc.ServerStream, or
// unaryCall for a directly registered method's non-protobuf call.
type bridgeCall interface {
	Context() context.Context
	RecvMsg(m any) error
	SendMsg(m any) error
	SetHeader(metadata.MD) error
	SendHeader(metadata.MD) error
	SetTrailer(metadata.MD)
}

// bridgeStream is the grpc.Server's UnknownServiceHandler.
func (s *Server) bridgeStream(_ any, stream grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(stream)
	if !ok {
		return status.Error(codes.Internal, "no method in the stream")
	}
	return s.bridge(method, stream)
}

// bridgeUnary runs a directly registered method's call through the
// bridge, returning the one answer message.
func (s *Server) bridgeUnary(ctx context.Context, method string, dec func(any) error) (any, error) {
	var in rawMessage
	if err := dec(&in); err != nil {
		return nil, err
	}
	call := &unaryCall{ctx: ctx, in: &in}
	if err := s.bridge(method, call); err != nil {
		return nil, err
	}
	if call.out == nil {
		return nil, status.Error(codes.Internal, method+": no response message")
	}
	return call.out, nil
}

// bridge serves one call through the connect handler: the call's metadata
// become request headers, its messages the gRPC-framed request body; the
// answer's frames become messages, its headers and trailers metadata, its
// grpc-status the call's status.
func (s *Server) bridge(method string, call bridgeCall) error {
	ctx := call.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	header := make(http.Header, len(md)+1)
	host := ""
	for key, values := range md {
		switch {
		case key == ":authority":
			if len(values) > 0 {
				host = values[0]
			}
			continue
		case strings.HasPrefix(key, ":"), key == "grpc-accept-encoding", key == "grpc-encoding", key == "te":
			continue
		}
		binary := strings.HasSuffix(key, "-bin")
		canonical := http.CanonicalHeaderKey(key)
		for _, v := range values {
			if binary {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			header[canonical] = append(header[canonical], v)
		}
	}
	if header.Get("Content-Type") == "" {
		header.Set("Content-Type", "application/grpc")
	}
	header.Set("Te", "trailers")
	body := &bridgeBody{call: call}
	req := &http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: method},
		RequestURI:    method,
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        header,
		Body:          body,
		ContentLength: -1,
		Host:          host,
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		req.RemoteAddr = p.Addr.String()
	}
	w := &bridgeWriter{call: call, header: make(http.Header, 4)}
	s.handler.ServeHTTP(w, req.WithContext(ctx))
	if body.err != nil && body.err != io.EOF {
		// The request's messages could not be read (too large, the
		// client went away): grpc-go's status says why.
		if _, ok := status.FromError(body.err); ok {
			return body.err
		}
	}
	return w.finish(method)
}

// unaryCall is bridgeCall for one message in and one out, on a directly
// registered method's context.
type unaryCall struct {
	ctx  context.Context
	in   *rawMessage
	out  *rawMessage
	read bool
}

func (c *unaryCall) Context() context.Context { return c.ctx }

func (c *unaryCall) RecvMsg(m any) error {
	if c.read {
		return io.EOF
	}
	c.read = true
	*m.(*rawMessage) = *c.in
	return nil
}

func (c *unaryCall) SendMsg(m any) error {
	if c.out != nil {
		return status.Error(codes.Internal, "a unary method answered more than one message")
	}
	c.out = m.(*rawMessage)
	return nil
}

func (c *unaryCall) SetHeader(md metadata.MD) error  { return grpc.SetHeader(c.ctx, md) }
func (c *unaryCall) SendHeader(md metadata.MD) error { return grpc.SetHeader(c.ctx, md) }
func (c *unaryCall) SetTrailer(md metadata.MD)       { grpc.SetTrailer(c.ctx, md) }

// bridgeBody is the request body: the call's messages, each with the
// gRPC length prefix, read from the call as the handler reads.
type bridgeBody struct {
	call   bridgeCall
	prefix [5]byte
	head   []byte // rest of the current prefix
	data   []byte // rest of the current message
	err    error  // io.EOF after the last message, or why receiving failed
}

func (b *bridgeBody) Read(p []byte) (int, error) {
	for len(b.head) == 0 && len(b.data) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		var m rawMessage
		if err := b.call.RecvMsg(&m); err != nil {
			b.err = err
			continue
		}
		binary.BigEndian.PutUint32(b.prefix[1:], uint32(len(m.data)))
		b.head, b.data = b.prefix[:], m.data
	}
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	n := copy(p, b.data)
	b.data = b.data[n:]
	return n, nil
}

func (b *bridgeBody) Close() error { return nil }

// bridgeWriter is the handler's ResponseWriter: it cuts the body into
// gRPC messages and sends each as it completes, after the headers.
type bridgeWriter struct {
	call        bridgeCall
	header      http.Header
	code        int
	wroteHeader bool
	sentHeader  bool
	messages    int
	buf         []byte // an incomplete frame
	body        []byte // a non-gRPC answer's body, for its message
	err         error
}

func (w *bridgeWriter) Header() http.Header { return w.header }

func (w *bridgeWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader, w.code = true, code
}

func (w *bridgeWriter) Flush() {}

func (w *bridgeWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	if w.code != http.StatusOK || !strings.HasPrefix(w.header.Get("Content-Type"), "application/grpc") {
		if len(w.body) < 4<<10 {
			w.body = append(w.body, p[:min(len(p), 4<<10-len(w.body))]...)
		}
		return len(p), nil
	}
	w.buf = append(w.buf, p...)
	for len(w.buf) >= 5 {
		n := int(binary.BigEndian.Uint32(w.buf[1:5]))
		if len(w.buf) < 5+n {
			break
		}
		if w.buf[0]&1 != 0 {
			w.err = status.Error(codes.Internal, "bridge: compressed answer")
			return 0, w.err
		}
		if !w.sentHeader {
			w.sentHeader = true
			if md := grpcMetadata(w.header); len(md) > 0 {
				if err := w.call.SendHeader(md); err != nil {
					w.err = err
					return 0, err
				}
			}
		}
		// grpc-go may hold a message until its writer runs: a copy of its
		// own, not the handler's buffer.
		msg := &rawMessage{data: append([]byte(nil), w.buf[5:5+n]...)}
		w.buf = w.buf[5+n:]
		if err := w.call.SendMsg(msg); err != nil {
			w.err = err
			return 0, err
		}
		w.messages++
	}
	return len(p), nil
}

// finish returns the call's status from the answer's trailers (or, for an
// answer that is not gRPC, from its HTTP status, as the gRPC spec maps
// one), after setting the header metadata not yet sent and the trailers.
func (w *bridgeWriter) finish(method string) error {
	if w.err != nil {
		return w.err
	}
	trailer := http.Header{}
	declared := map[string]bool{}
	for _, v := range w.header.Values("Trailer") {
		for _, k := range strings.Split(v, ",") {
			declared[http.CanonicalHeaderKey(strings.TrimSpace(k))] = true
		}
	}
	for key, values := range w.header {
		if name, ok := strings.CutPrefix(key, http.TrailerPrefix); ok {
			trailer[http.CanonicalHeaderKey(name)] = values
			delete(w.header, key)
		} else if declared[key] {
			trailer[key] = values
			delete(w.header, key)
		}
	}
	grpcStatus := trailer.Get("Grpc-Status")
	if grpcStatus == "" {
		// A trailers-only answer.
		grpcStatus = w.header.Get("Grpc-Status")
		if grpcStatus != "" {
			trailer, w.header = w.header, http.Header{}
		}
	}
	if !w.sentHeader {
		if md := grpcMetadata(w.header); len(md) > 0 {
			if err := w.call.SetHeader(md); err != nil {
				return err
			}
		}
	}
	if md := grpcMetadata(trailer); len(md) > 0 {
		w.call.SetTrailer(md)
	}
	if grpcStatus == "" {
		return httpStatusError(method, w.code, w.body)
	}
	if len(w.buf) > 0 {
		return status.Errorf(codes.Internal, "%s: answer ends inside a message", method)
	}
	code, err := strconv.Atoi(grpcStatus)
	if err != nil {
		return status.Errorf(codes.Internal, "%s: grpc-status %q", method, grpcStatus)
	}
	if code == 0 {
		return nil
	}
	if bin := trailer.Get("Grpc-Status-Details-Bin"); bin != "" {
		if raw, err := decodeBinaryHeader(bin); err == nil {
			st := new(spb.Status)
			if proto.Unmarshal(raw, st) == nil {
				return status.FromProto(st).Err()
			}
		}
	}
	message, err := url.PathUnescape(trailer.Get("Grpc-Message"))
	if err != nil {
		message = trailer.Get("Grpc-Message")
	}
	return status.Error(codes.Code(code), message)
}

// httpStatusError maps an answer that is not gRPC (e.g. the 404 of an
// unknown method) to the status a gRPC client derives from its HTTP status
// (gRPC's "HTTP to gRPC status code mapping"), with the message of a
// Connect error body when there is one.
func httpStatusError(method string, code int, body []byte) error {
	c := codes.Unknown
	switch code {
	case http.StatusBadRequest:
		c = codes.Internal
	case http.StatusUnauthorized:
		c = codes.Unauthenticated
	case http.StatusForbidden:
		c = codes.PermissionDenied
	case http.StatusNotFound:
		c = codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		c = codes.Unavailable
	}
	var connectBody struct {
		Message string `json:"message"`
	}
	message := fmt.Sprintf("%s: HTTP status %d", method, code)
	if json.Unmarshal(body, &connectBody) == nil && connectBody.Message != "" {
		message = connectBody.Message
	} else if text := strings.TrimSpace(string(body)); text != "" {
		message += ": " + text
	}
	return status.Error(c, message)
}
