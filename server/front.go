package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
)

// Front serves one listener with two servers: a connection that speaks
// gRPC (HTTP/2 whose first request is application/grpc or
// application/grpc+proto) goes to grpc-go's own transport, everything else
// (HTTP/1.1, Connect, gRPC-Web, JSON, HTTP/2 without gRPC) to net/http,
// unchanged. grpc-go's transport costs about half the CPU per call of
// net/http's HTTP/2 server (docs/PERFORMANCE.md).
//
// A connection is sniffed once, at its start: the client preface, then
// HTTP/2 frames up to the first HEADERS, decoded with x/net/http2's Framer
// and hpack, within sniffTimeout and sniffMaxBytes; anything unexpected
// goes to net/http. The bytes read are replayed to the server chosen. A
// later request on a gRPC connection is served by grpc-go whatever its
// content type (grpc-go serves every method, see grpc.go).
type Front struct {
	HTTP *http.Server
	GRPC *grpc.Server
	// TLS, when set, makes the port speak TLS: the handshake happens here,
	// and a connection that negotiated h2 by ALPN is sniffed like a
	// cleartext one. HTTP must then serve unencrypted HTTP/2 too: the h2
	// connections it gets are already decrypted (its handlers see no
	// r.TLS; none reads it).
	TLS *tls.Config
	Log *slog.Logger

	// grpcConns and httpConns count the connections handed to each
	// server (Routed).
	grpcConns, httpConns atomic.Uint64

	mu       sync.Mutex
	ln       net.Listener
	closing  bool
	toHTTP   *connQueue
	toGRPC   *connQueue
	sniffing sync.WaitGroup
	// pending are the connections being sniffed; Shutdown cuts their
	// sniff short.
	pending map[net.Conn]struct{}
}

const (
	// sniffTimeout bounds the TLS handshake and the sniff together (as
	// HTTPServer's ReadHeaderTimeout bounds a request's headers).
	sniffTimeout = 10 * time.Second
	// sniffMaxBytes bounds what a sniff reads before it gives up and
	// hands the connection to net/http (MaxHeaderBytes of HTTPServer).
	sniffMaxBytes = 64 << 10
)

// Serve accepts connections on ln until Shutdown (then it returns
// http.ErrServerClosed) or until ln fails.
func (f *Front) Serve(ln net.Listener) error {
	f.mu.Lock()
	if f.closing {
		f.mu.Unlock()
		return http.ErrServerClosed
	}
	f.ln = ln
	f.toHTTP, f.toGRPC = newConnQueue(ln.Addr()), newConnQueue(ln.Addr())
	f.mu.Unlock()
	if f.Log == nil {
		f.Log = slog.Default()
	}
	served := make(chan error, 2)
	go func() { served <- f.HTTP.Serve(f.toHTTP) }()
	go func() { served <- f.GRPC.Serve(f.toGRPC) }()
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			f.mu.Lock()
			closing := f.closing
			f.mu.Unlock()
			if closing {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			f.toHTTP.Close()
			f.toGRPC.Close()
			return err
		}
		delay = 0
		f.mu.Lock()
		if f.closing {
			f.mu.Unlock()
			conn.Close()
			continue
		}
		if f.pending == nil {
			f.pending = map[net.Conn]struct{}{}
		}
		f.pending[conn] = struct{}{}
		f.sniffing.Add(1)
		f.mu.Unlock()
		go f.route(conn)
	}
}

// route sniffs conn and hands it to the server that speaks its protocol.
func (f *Front) route(raw net.Conn) {
	defer f.sniffing.Done()
	conn := raw
	conn.SetReadDeadline(time.Now().Add(sniffTimeout))
	// sniffed ends the sniff: false when Shutdown began meanwhile, and
	// the connection is then closed.
	sniffed := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.pending, raw)
		if f.closing {
			raw.Close()
			return false
		}
		return true
	}
	if f.TLS != nil {
		tc := tls.Server(conn, f.TLS)
		ctx, cancel := context.WithTimeout(context.Background(), sniffTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			// As net/http logs a failed handshake.
			if f.HTTP.ErrorLog != nil {
				f.HTTP.ErrorLog.Printf("http: TLS handshake error from %s: %v", conn.RemoteAddr(), err)
			}
			if sniffed() {
				conn.Close()
			}
			return
		}
		if tc.ConnectionState().NegotiatedProtocol != "h2" {
			// HTTP/1.1: net/http's own TLS path (it sees the *tls.Conn).
			tc.SetReadDeadline(time.Time{})
			if sniffed() {
				f.httpConns.Add(1)
				f.toHTTP.deliver(tc)
			}
			return
		}
		conn = tc
	}
	replay, grpcConn, err := sniff(conn)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		f.Log.Debug("connection start not understood; net/http serves it", "remote", raw.RemoteAddr().String(), "err", err)
	}
	if !sniffed() {
		return
	}
	if grpcConn {
		f.grpcConns.Add(1)
		f.toGRPC.deliver(replay)
		return
	}
	f.httpConns.Add(1)
	f.toHTTP.deliver(replay)
}

// Routed returns how many connections went to grpc-go and to net/http.
func (f *Front) Routed() (grpcConns, httpConns uint64) {
	return f.grpcConns.Load(), f.httpConns.Load()
}

// Shutdown stops accepting, then stops both servers gracefully: net/http
// waits for its in-flight handlers, grpc-go for its calls. When ctx ends
// first, grpc-go's calls are cancelled and ctx's error is returned.
func (f *Front) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	f.closing = true
	ln := f.ln
	f.mu.Unlock()
	if ln == nil {
		return nil
	}
	ln.Close()
	f.mu.Lock()
	for conn := range f.pending {
		conn.SetReadDeadline(time.Now())
	}
	f.mu.Unlock()
	f.sniffing.Wait()
	grpcDone := make(chan struct{})
	go func() {
		f.GRPC.GracefulStop()
		close(grpcDone)
	}()
	err := f.HTTP.Shutdown(ctx)
	select {
	case <-grpcDone:
	case <-ctx.Done():
		f.GRPC.Stop()
		<-grpcDone
		if err == nil {
			err = ctx.Err()
		}
	}
	f.toGRPC.Close()
	return err
}

// --- sniffing ---

// sniff reads the start of conn and returns a conn that replays what was
// read, and whether it speaks gRPC. It writes one empty SETTINGS frame
// (grpc-go clients send no request before the server's SETTINGS) and
// drops the client's ACK of it, which the server conn is handed to never
// asked for (net/http would hang up on it). err says why a connection
// that began as HTTP/2 (or began to) could not be sniffed.
func sniff(conn net.Conn) (replay net.Conn, grpcConn bool, err error) {
	rec := &recorder{r: conn}
	preface := []byte(http2.ClientPreface)
	for len(rec.buf) < len(preface) {
		if _, err := rec.readUpTo(len(preface) - len(rec.buf)); err != nil {
			return rec.replay(conn, false), false, err
		}
		if !bytes.HasPrefix(preface, rec.buf) {
			return rec.replay(conn, false), false, nil // HTTP/1.x
		}
	}
	framer := http2.NewFramer(conn, rec)
	framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	framer.MaxHeaderListSize = sniffMaxBytes
	if err := framer.WriteSettings(); err != nil {
		return rec.replay(conn, false), false, err
	}
	acked := false
	for {
		start := len(rec.buf)
		frame, err := framer.ReadFrame()
		if err != nil {
			return rec.replay(conn, !acked), false, err
		}
		switch fr := frame.(type) {
		case *http2.SettingsFrame:
			if fr.IsAck() && !acked {
				acked = true
				rec.buf = rec.buf[:start]
			}
		case *http2.WindowUpdateFrame, *http2.PriorityFrame, *http2.PingFrame:
		case *http2.MetaHeadersFrame:
			return rec.replay(conn, !acked), grpcContentType(fr.PseudoValue("method"), fr.Fields), nil
		default:
			return rec.replay(conn, !acked), false, fmt.Errorf("sniff: %v frame before the first request", fr.Header().Type)
		}
	}
}

// grpcContentType reports whether a request's headers are gRPC with
// protobuf messages that grpc-go serves as net/http would: a POST of
// protobufGRPC's content type.
func grpcContentType(method string, fields []hpack.HeaderField) bool {
	if method != http.MethodPost {
		return false
	}
	for _, f := range fields {
		if f.Name == "content-type" {
			return protobufGRPC(f.Value)
		}
	}
	return false
}

// protobufGRPC reports whether a content type is gRPC with protobuf
// messages spelt exactly as grpc-go takes it and answers as connect does:
// application/grpc or application/grpc+proto. Not gRPC-Web, not +json,
// which connect serves; nor another case (media types allow it: grpc-go
// refuses it with 415, connect serves it) or parameters (grpc-go reads
// "application/grpc;charset=utf-8" as a codec named "charset=utf-8" and
// answers in it, connect refuses it with 415).
func protobufGRPC(contentType string) bool {
	return contentType == "application/grpc" || contentType == "application/grpc+proto"
}

// recorder reads from r and keeps what it read, up to sniffMaxBytes. Its
// reads never go beyond what the caller asks for, so a frame read through
// it ends where the next begins.
type recorder struct {
	r   io.Reader
	buf []byte
}

var errSniffTooLong = errors.New("sniff: more than the sniff limit before the first request")

func (r *recorder) Read(p []byte) (int, error) {
	if len(r.buf)+len(p) > sniffMaxBytes {
		if len(r.buf) >= sniffMaxBytes {
			return 0, errSniffTooLong
		}
		p = p[:sniffMaxBytes-len(r.buf)]
	}
	n, err := r.r.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}

func (r *recorder) readUpTo(n int) (int, error) {
	var p [32]byte
	return r.Read(p[:min(n, len(p))])
}

// replay returns conn with the recorded bytes in front of what comes next,
// dropping the client's next SETTINGS ACK when dropAck.
func (r *recorder) replay(conn net.Conn, dropAck bool) net.Conn {
	rc := &replayConn{Conn: conn, replay: r.buf}
	if dropAck {
		rc.stripper = &ackStripper{r: conn}
	}
	return rc
}

// replayConn reads the sniffed bytes, then the connection.
type replayConn struct {
	net.Conn
	replay   []byte
	stripper *ackStripper
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.replay) > 0 {
		n := copy(p, c.replay)
		c.replay = c.replay[n:]
		return n, nil
	}
	if c.stripper != nil {
		if c.stripper.done && len(c.stripper.pending) == 0 && c.stripper.remaining == 0 {
			c.stripper = nil
		} else {
			return c.stripper.Read(p)
		}
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the connection, as net/http does before it
// closes one (when the connection can).
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// ackStripper passes HTTP/2 frames through, except the first SETTINGS
// frame with the ACK flag, which it drops; after that it is a plain
// reader. It starts at a frame boundary.
type ackStripper struct {
	r         io.Reader
	header    [9]byte
	pending   []byte // rest of a frame header to pass on
	remaining int    // payload bytes of the current frame to pass on
	done      bool
}

func (s *ackStripper) Read(p []byte) (int, error) {
	for {
		switch {
		case len(s.pending) > 0:
			n := copy(p, s.pending)
			s.pending = s.pending[n:]
			return n, nil
		case s.remaining > 0:
			n, err := s.r.Read(p[:min(len(p), s.remaining)])
			s.remaining -= n
			return n, err
		case s.done:
			return s.r.Read(p)
		}
		if _, err := io.ReadFull(s.r, s.header[:]); err != nil {
			return 0, err
		}
		length := int(s.header[0])<<16 | int(s.header[1])<<8 | int(s.header[2])
		if http2.FrameType(s.header[3]) == http2.FrameSettings && http2.Flags(s.header[4]).Has(http2.FlagSettingsAck) && length == 0 {
			s.done = true
			continue
		}
		s.pending, s.remaining = s.header[:], length
	}
}

// --- listener adapters ---

// connQueue is a net.Listener whose connections Front delivers.
type connQueue struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnQueue(addr net.Addr) *connQueue {
	return &connQueue{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (q *connQueue) deliver(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.closed:
		c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.closed:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.closed) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// ObserveFront exports f's routing on /metrics as
// capledger_connections_total{server="grpc-go"|"net/http"}: the
// connections handed to each server.
func (s *Server) ObserveFront(f *Front) {
	for _, to := range []string{"grpc-go", "net/http"} {
		s.metrics.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "capledger_connections_total",
			Help:        "Connections accepted on the serve port, by the server that got them (grpc-go for gRPC, net/http for the rest).",
			ConstLabels: prometheus.Labels{"server": to},
		}, func() float64 {
			grpcConns, httpConns := f.Routed()
			if to == "grpc-go" {
				return float64(grpcConns)
			}
			return float64(httpConns)
		}))
	}
}
