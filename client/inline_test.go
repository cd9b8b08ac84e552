package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// streamBody is a request body net/http cannot tell is in memory (as
// connect-go's payload reader), which makes it flush the headers first.
type streamBody struct {
	r      io.Reader
	closed *atomic.Bool
}

func (b streamBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b streamBody) Close() error               { b.closed.Store(true); return nil }

// writeCounter counts the writes on the connections it dials.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestInlineBodyOneWrite checks that a request whose body is a stream goes
// out in one write (headers and body together) through inlineBody and in
// two without it, that the server gets the whole body, and that the
// original body is closed.
func TestInlineBodyOneWrite(t *testing.T) {
	const payload = "a reserve request of about the usual size: 0123456789abcdef"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || string(body) != payload {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	for _, inline := range []bool{false, true} {
		var writes atomic.Int64
		dialer := &net.Dialer{}
		transport := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCounter{Conn: conn, writes: &writes}, nil
		}}
		var rt http.RoundTripper = transport
		if inline {
			rt = inlineBody{next: transport}
		}
		hc := &http.Client{Transport: rt}
		for i := range 3 {
			var closed atomic.Bool
			req, err := http.NewRequest("POST", srv.URL, streamBody{r: strings.NewReader(payload), closed: &closed})
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = int64(len(payload))
			before := writes.Load()
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(answer) != "ok" {
				t.Fatalf("inline %v, call %d: %d %q", inline, i, resp.StatusCode, answer)
			}
			if !closed.Load() {
				t.Fatalf("inline %v, call %d: request body not closed", inline, i)
			}
			want := int64(2)
			if inline {
				want = 1
			}
			if got := writes.Load() - before; got != want {
				t.Fatalf("inline %v, call %d: %d writes for one request, want %d", inline, i, got, want)
			}
		}
		hc.CloseIdleConnections()
	}
}

// TestInlineBodyShortBody checks that a body shorter than its declared
// length is an error, as net/http itself answers, and is closed.
func TestInlineBodyShortBody(t *testing.T) {
	var closed atomic.Bool
	req, err := http.NewRequest("POST", "http://127.0.0.1:1/", streamBody{r: strings.NewReader("short"), closed: &closed})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 100
	_, err = inlineBody{next: &http.Transport{}}.RoundTrip(req)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short body: %v, want unexpected EOF", err)
	}
	if !closed.Load() {
		t.Fatal("short body not closed")
	}
}

// TestNewInlinesBodies checks that the SDK's own HTTP/1.1 clients send
// bodies through inlineBody, and that gRPC (HTTP/2 frames) does not.
func TestNewInlinesBodies(t *testing.T) {
	for _, p := range []Protocol{ProtocolConnect, ProtocolConnectJSON, ProtocolGRPC} {
		c, err := New("127.0.0.1:1", WithProtocol(p))
		if err != nil {
			t.Fatal(err)
		}
		recorded, ok := c.http.Transport.(recordAnswer)
		if !ok {
			t.Fatalf("%s: transport %T, want recordAnswer around it", p, c.http.Transport)
		}
		_, inlined := recorded.next.(inlineBody)
		if inlined != (p != ProtocolGRPC) {
			t.Fatalf("%s: transport %T", p, recorded.next)
		}
		c.Close()
	}
}
