package client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"connectrpc.com/connect"
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

// An intermediary (a proxy or load balancer between the SDK and the
// ledger) answers in plain HTTP, not in the protocol's error form. connect
// then maps the status alone to a code (429, 502, 503, 504: unavailable)
// and keeps none of the response headers, so its Retry-After (CLIENTS.md
// section 4, rule 3) and the fact that a 429 refused the call (rule 5)
// would be lost. recordAnswer keeps them for the attempt that sent the
// request (do puts an httpAnswer in each attempt's context), and
// httpAnswer.explain puts them back into its error.
type recordAnswer struct {
	next http.RoundTripper
}

type httpAnswerKey struct{}

// httpAnswer is the status and Retry-After of one attempt's HTTP answer
// when it was not 200. The round trip may still write it after the
// attempt gave up waiting, hence the lock.
type httpAnswer struct {
	mu         sync.Mutex
	status     int
	retryAfter string
}

func (t recordAnswer) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(r)
	if err == nil && resp.StatusCode != http.StatusOK {
		if a, ok := r.Context().Value(httpAnswerKey{}).(*httpAnswer); ok {
			a.mu.Lock()
			a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
			a.mu.Unlock()
		}
	}
	return resp, err
}

// CloseIdleConnections reaches the wrapped transport's (Client.Close).
func (t recordAnswer) CloseIdleConnections() {
	if ci, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// withRecordedAnswers returns hc with its transport wrapped in
// recordAnswer (hc itself is not changed: it may be the caller's).
func withRecordedAnswers(hc *http.Client) *http.Client {
	wrapped := *hc
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	wrapped.Transport = recordAnswer{next: next}
	return &wrapped
}

// explain returns err with what the HTTP answer said that connect left
// out: the Retry-After of an unavailable answer, and, for an HTTP 429
// that connect mapped to unavailable (an intermediary's: the ledger's own
// arrives as resource_exhausted), the refusal it is, as
// resource_exhausted, so it is surfaced as a *RejectedError and never
// retried.
func (a *httpAnswer) explain(err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeUnavailable {
		return err
	}
	a.mu.Lock()
	status, retryAfter := a.status, a.retryAfter
	a.mu.Unlock()
	if status == http.StatusTooManyRequests {
		refused := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("HTTP 429 from an intermediary: %w", err))
		if retryAfter != "" {
			refused.Meta().Set("Retry-After", retryAfter)
		}
		return refused
	}
	if retryAfter != "" && ce.Meta().Get("Retry-After") == "" {
		ce.Meta().Set("Retry-After", retryAfter)
	}
	return err
}
