package server_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// TestHTTP2AnswerWaitsForTheBody: over cleartext HTTP/2, an answer given
// without reading the request body (415 for a Content-Type nobody
// serves, 404 for an unknown path) still waits for the body the client
// is sending and ends the stream without RST_STREAM, so a client that
// drops an answer on a reset (curl 7.88: exit 92) reads the 415 or 404.
// The body is sent a second after the headers: an answer that did not
// wait for it has gone out (with its reset) by then.
func TestHTTP2AnswerWaitsForTheBody(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	for _, c := range []struct {
		path, contentType, status string
	}{
		{"/capledger.v1.LedgerService/Reserve", "text/plain", "415"},
		{"/nowhere", "application/json", "404"},
	} {
		t.Run(c.status, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(h.url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, http2.ClientPreface)
			framer := http2.NewFramer(conn, conn)
			framer.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			framer.WriteSettings()
			var block bytes.Buffer
			enc := hpack.NewEncoder(&block)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", c.path},
				{":authority", "capledger"}, {"content-type", c.contentType}, {"content-length", "2"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			framer.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})

			// readConn reads frames until a PING's ACK (sent once stream
			// 1's answer ended: a reset that follows an answer that did
			// not wait for the body comes before it), stream 1's reset or
			// the deadline, and returns the answer's status.
			readConn := func(deadline time.Duration) (string, bool, bool) {
				conn.SetReadDeadline(time.Now().Add(deadline))
				var status string
				for {
					frame, err := framer.ReadFrame()
					var netErr net.Error
					if errors.As(err, &netErr) && netErr.Timeout() {
						return status, false, true
					}
					if err != nil {
						t.Fatalf("reading the answer: %v", err)
					}
					switch f := frame.(type) {
					case *http2.PingFrame:
						if f.IsAck() {
							return status, false, false
						}
					case *http2.RSTStreamFrame:
						if f.StreamID == 1 {
							return status, true, false
						}
					case *http2.MetaHeadersFrame:
						if f.StreamID == 1 {
							status = f.PseudoValue("status")
							if f.StreamEnded() {
								framer.WritePing(false, [8]byte{1})
							}
						}
					case *http2.DataFrame:
						if f.StreamID == 1 && f.StreamEnded() {
							framer.WritePing(false, [8]byte{1})
						}
					}
				}
			}
			if status, reset, timedOut := readConn(time.Second); !timedOut {
				t.Fatalf("before the body was sent: answer %q, stream reset %v; want no answer until the body is read", status, reset)
			}
			framer.WriteData(1, true, []byte("{}"))
			status, reset, timedOut := readConn(10 * time.Second)
			if timedOut || reset || status != c.status {
				t.Fatalf("after the body: answer %q, stream reset %v, timed out %v; want %s and no reset", status, reset, timedOut, c.status)
			}
		})
	}
}
