package client

import (
	"bytes"
	"io"
	"net/http"
)

// maxInlineBody is the largest request body inlineBody copies into memory:
// a reserve is about 150 bytes, a ReserveBatch of 1000 about 150 KiB.
const maxInlineBody = 256 << 10

// inlineBody hands net/http's HTTP/1.1 writer the request body as an
// in-memory reader. net/http flushes the headers in a write of their own
// before copying a body it does not know to be in memory (connect-go's
// payload reader is such a body), so every call cost the client two write
// system calls and two TCP segments, and the server a second read for the
// body. With a *bytes.Reader the headers and the body go out in one write.
// The body is copied (its length is known up front: connect sets
// ContentLength); the request is otherwise passed on unchanged, GetBody
// included, so net/http can still replay it on a connection that failed
// before anything was written.
type inlineBody struct {
	next *http.Transport
}

// CloseIdleConnections closes the transport's idle connections (Client.Close
// reaches them through http.Client.CloseIdleConnections).
func (t inlineBody) CloseIdleConnections() { t.next.CloseIdleConnections() }

func (t inlineBody) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > maxInlineBody {
		return t.next.RoundTrip(req)
	}
	buf := make([]byte, req.ContentLength)
	_, err := io.ReadFull(req.Body, buf)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	inlined := *req
	inlined.Body = io.NopCloser(bytes.NewReader(buf))
	inlined.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	return t.next.RoundTrip(&inlined)
}
