package main

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// heldCall is one gRPC call to ShouldRateLimit over a raw HTTP/2
// connection whose request message is sent in two parts, so that it is
// in flight (its stream open on grpc-go's server) for as long as the test
// holds the second part back. Its reader answers the server's PINGs and
// SETTINGS and reports the call's answer.
type heldCall struct {
	conn    net.Conn
	mu      sync.Mutex // guards writes to framer
	framer  *http2.Framer
	pingAck chan struct{}
	done    chan struct{} // closed once the trailers came, or the connection ended
	status  string        // grpc-status of the trailers ("" when none came)
	message []byte        // the response message's bytes, after the 5-byte prefix
	readErr error
}

func startHeldCall(t *testing.T, addr string, req *rlsv3.RateLimitRequest) (*heldCall, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &heldCall{conn: conn, framer: http2.NewFramer(conn, conn), pingAck: make(chan struct{}, 1), done: make(chan struct{})}
	c.framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)

	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", addr},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	err = c.framer.WriteSettings()
	if err == nil {
		err = c.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	}
	if err == nil {
		err = c.framer.WriteData(1, false, body[:3]) // part of the prefix: the message cannot be read yet
	}
	if err == nil {
		// grpc-go reads frames in order: its ACK of this PING says it
		// has the stream.
		err = c.framer.WritePing(false, [8]byte{'h', 'e', 'l', 'd'})
	}
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	go c.read()
	return c, body[3:]
}

func (c *heldCall) read() {
	defer close(c.done)
	var data []byte
	for {
		f, err := c.framer.ReadFrame()
		if err != nil {
			c.readErr = err
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.mu.Lock()
				c.framer.WriteSettingsAck()
				c.mu.Unlock()
			}
		case *http2.PingFrame:
			if f.IsAck() {
				select {
				case c.pingAck <- struct{}{}:
				default:
				}
				continue
			}
			c.mu.Lock()
			c.framer.WritePing(true, f.Data)
			c.mu.Unlock()
		case *http2.DataFrame:
			data = append(data, f.Data()...)
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					c.status = hf.Value
				}
			}
			if f.StreamEnded() {
				if len(data) >= 5 {
					c.message = data[5:]
				}
				return
			}
		case *http2.RSTStreamFrame:
			c.readErr = http2.StreamError{StreamID: f.StreamID, Code: f.ErrCode}
			return
		}
	}
}

// finish sends the rest of the request message, ending the stream.
func (c *heldCall) finish(t *testing.T, rest []byte) {
	t.Helper()
	c.mu.Lock()
	err := c.framer.WriteData(1, true, rest)
	c.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
}

// TestEnvoyCheckInFlightAtSIGTERM: a ShouldRateLimit in flight when serve
// gets SIGTERM (its stream open, its message not yet all sent) keeps the
// server draining: new connections are refused meanwhile, the call gets
// its answer (OK, the check charged) once its message is complete, and
// serve then exits 0 with its clean stop (docs/OPERATIONS.md: SIGTERM
// drains in-flight requests; gRPC and net/http stop within the same 30 s).
func TestEnvoyCheckInFlightAtSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"), "--envoy-config", writeFile(t, dir, "mapping.yaml", contractEnvoyMapping))
	if status, body := post(&http.Client{Timeout: 10 * time.Second}, srv.url, "PublishPolicy",
		`{"policy":{"subject":"t1","route":"chat","holdTtl":"60s","dimensions":[{"unit":"tokens","burst":"10000"}]}}`); status != http.StatusOK {
		t.Fatalf("publish: %d %v", status, body)
	}
	addr := strings.TrimPrefix(srv.url, "http://")
	held, rest := startHeldCall(t, addr, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: "t1"}, {Key: "x-request-id", Value: "held"}},
	}}})
	select {
	case <-held.pingAck:
	case <-held.done:
		t.Fatalf("the held call ended before SIGTERM: status %q, %v", held.status, held.readErr)
	}

	exited := make(chan error, 1)
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		exited <- srv.cmd.Wait()
	}()
	// Before startServer's cleanup, which must not Wait for the process
	// a second time: a serve still running when the test fails is killed
	// and reaped here.
	t.Cleanup(func() {
		srv.cmd.Process.Kill()
		<-waited
	})
	// New connections are refused while the held call keeps serve draining.
	for {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		conn.Close()
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-exited:
		t.Fatalf("serve exited (%v) with a call in flight; logs:\n%s", err, srv.logs.String())
	default:
	}

	held.finish(t, rest)
	<-held.done
	var resp rlsv3.RateLimitResponse
	if held.status != "0" || proto.Unmarshal(held.message, &resp) != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the call in flight at SIGTERM: grpc-status %q (%v), response %v; want 0, OK", held.status, held.readErr, &resp)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("serve after SIGTERM: %v; logs:\n%s", err, srv.logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not exit within the 30 s drain after its last call was answered; logs:\n%s", srv.logs.String())
	}
	if logs := srv.logs.String(); !strings.Contains(logs, "shutting down: draining in-flight requests") || !strings.Contains(logs, "msg=stopped") {
		t.Fatalf("no drain and clean stop in the logs:\n%s", logs)
	}
}
