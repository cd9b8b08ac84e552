package client

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/ledger"
)

var tokensEstimator = NewEstimator("sha256:fixed-tokens-100", func(*http.Request, []byte) (Units, error) {
	return Units{"tokens": 100}, nil
})

// streamingBackend answers an OpenAI-style stream: three chunks, then the
// usage event, then [DONE]. ?nousage stops before the usage event.
func streamingBackend(completion int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"part %d\"}}]}\n\n", i)
			http.NewResponseController(w).Flush()
		}
		if r.URL.Query().Has("nousage") {
			return
		}
		// Split across writes, as a proxy copying a stream may do.
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,")
		http.NewResponseController(w).Flush()
		fmt.Fprintf(w, "\"completion_tokens\":%d,\"total_tokens\":%d}}\r\n\r\ndata: [DONE]\n\n", completion, 9+completion)
	}
}

// Issue 23, items 4 and 5: the middleware settles a stream's usage from
// its final SSE event; a stream that ends without one is USAGE_UNKNOWN
// (held, never refunded); a handler aborts its response with
// panic(http.ErrAbortHandler), settled with the usage it reported first.
func TestMiddlewareSettlesStreamedUsage(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	var idFromHandler string
	mux := http.NewServeMux()
	mux.Handle("/v1/chat", streamingBackend(31))
	mux.HandleFunc("/v1/abort", func(w http.ResponseWriter, r *http.Request) {
		receipt, _ := ReceiptFrom(r.Context())
		idFromHandler = receipt.ReservationID
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("partial"))
		ReportUsage(r.Context(), Units{"tokens": 5})
		panic(http.ErrAbortHandler)
	})
	srv := gateway(t, c, MiddlewareConfig{Estimator: tokensEstimator, Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, mux)

	resp, body := send(t, srv.Client(), srv.URL+"/v1/chat", "tenant-7", "{}")
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	res, err := l.direct.GetReservation(context.Background(), resp.Header.Get(ReservationHeader))
	if err != nil {
		t.Fatal(err)
	}
	if !isState(res, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || res.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("streamed request settled as %s %v, want SETTLED 40 tokens", res.GetState(), res.GetActualUnits())
	}

	resp, _ = send(t, srv.Client(), srv.URL+"/v1/chat?nousage", "tenant-7", "{}")
	res, err = l.direct.GetReservation(context.Background(), resp.Header.Get(ReservationHeader))
	if err != nil {
		t.Fatal(err)
	}
	if !isState(res, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
		t.Fatalf("stream without usage: %s, want USAGE_UNKNOWN", res.GetState())
	}

	req, _ := http.NewRequest("POST", srv.URL+"/v1/abort", strings.NewReader("{}"))
	req.Header.Set("X-Tenant", "tenant-7")
	if resp, err := srv.Client().Do(req); err == nil {
		_, rerr := readAll(resp)
		if rerr == nil {
			t.Fatalf("aborted response arrived whole")
		}
	}
	if idFromHandler == "" {
		t.Fatal("the handler did not see its reservation id in ReceiptFrom(r.Context())")
	}
	res, err = l.direct.GetReservation(context.Background(), idFromHandler)
	if err != nil {
		t.Fatal(err)
	}
	if !isState(res, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || res.GetActualUnits()["tokens"] != 5 {
		t.Fatalf("aborted request settled as %s %v, want SETTLED 5 tokens", res.GetState(), res.GetActualUnits())
	}
}

func readAll(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			if err.Error() == "EOF" {
				return []byte(b.String()), nil
			}
			return []byte(b.String()), err
		}
	}
}

// Issue 23, item 4: with MiddlewareConfig.Emergency the middleware keeps
// serving from the gateway's shard while the ledger is blackholed, instead
// of answering 503, and settles each request's streamed usage locally.
func TestMiddlewarePartitionMode(t *testing.T) {
	l := startShardLedger(t)
	gw, em := emergencyGateway(t, l, WithTimeout(2*time.Second), WithBreaker(BreakerPolicy{DetectTimeout: 200 * time.Millisecond}))
	srv := gateway(t, gw, MiddlewareConfig{Estimator: tokensEstimator, Emergency: em,
		Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, streamingBackend(11))
	// The same middleware, its calls arming no watchdog: only the
	// requests in the partition are about the breaker's.
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.Config.Handler.ServeHTTP(w, r.WithContext(withoutWatchdog(r.Context())))
	}))
	defer healthy.Close()
	resp, _ := send(t, healthy.Client(), healthy.URL, "tenant-7", "{}")
	if resp.StatusCode != 200 || em.store.Has(resp.Header.Get(ReservationHeader)) {
		t.Fatalf("healthy request: %d, local %v", resp.StatusCode, em.store.Has(resp.Header.Get(ReservationHeader)))
	}
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	for i := range 20 {
		resp, body := send(t, srv.Client(), srv.URL, "tenant-7", "{}")
		id := resp.Header.Get(ReservationHeader)
		if resp.StatusCode != 200 || !em.store.Has(id) {
			t.Fatalf("request %d in the partition: %d %q, local %v", i, resp.StatusCode, body, em.store.Has(id))
		}
	}
	if st := gw.Breaker(); st.State == BreakerClosed {
		t.Fatalf("breaker %+v after 20 requests in a blackhole", st)
	}
	receipts, err := em.store.Receipts(em.store.Shards()[0].Shard.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(receipts) != 20 {
		t.Fatalf("%d local receipts, want 20", len(receipts))
	}
	for _, r := range receipts {
		if r.State != ledger.StateSettled || r.Actual["tokens"] != 20 {
			t.Fatalf("local receipt %+v, want settled with 20 tokens", r)
		}
	}
}

// A stream whose last usage event cannot be read, after an earlier one
// that could, is USAGE_UNKNOWN with its receipt kept (docs/CLIENTS.md,
// section 8): the earlier, partial figure is not settled as final (an
// undercharge), and why is in the error the middleware logs.
func TestMiddlewareStreamWithAnUnreadableLastUsageIsUnknown(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n")
		// The final usage, torn by the backend: not a figure.
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":\"7\n\ndata: [DONE]\n\n")
	})
	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	srv := gateway(t, c, MiddlewareConfig{Estimator: tokensEstimator, Logger: logger,
		Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, backend)

	resp, body := send(t, srv.Client(), srv.URL, "tenant-7", "{}")
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	wantUnknownAndKept(t, l, c, resp.Header.Get(ReservationHeader), "stream with an unreadable last usage", func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.String()
	})
}

// wantUnknownAndKept fails unless the stream's reservation id is
// USAGE_UNKNOWN in the ledger (not settled at an earlier figure), its
// receipt is kept in c.PendingUnknown, and the middleware's log (read
// last) says why.
func wantUnknownAndKept(t *testing.T, l *testLedger, c *Client, id, stream string, log func() string) {
	t.Helper()
	res, err := l.direct.GetReservation(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !isState(res, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
		t.Fatalf("%s: %s %v, want USAGE_UNKNOWN (not settled at the earlier 10 tokens)", stream, res.GetState(), res.GetActualUnits())
	}
	kept := false
	for _, r := range c.PendingUnknown() {
		kept = kept || r.ReservationID == id
	}
	if !kept {
		t.Fatalf("receipt of %s not kept in PendingUnknown: %+v", id, c.PendingUnknown())
	}
	if logged := log(); !strings.Contains(logged, id) || !strings.Contains(logged, "unreadable usage event") {
		t.Fatalf("the middleware's log does not say why %s is unknown:\n%s", id, logged)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// The upstream closes its stream right after the final usage event, with
// no line end after it, and the gateway passes the stream on through a
// reverse proxy (two real servers on real sockets). That last line is the
// stream's end: whole, it is settled (40 tokens, not the earlier 10); cut
// mid-JSON, the usage is unknown: USAGE_UNKNOWN, the receipt kept and the
// log saying why, as for any unreadable usage event.
func TestMiddlewareStreamEndingWithoutALineEnd(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	const final = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":31,\"total_tokens\":40}}"
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"more\"}}]}\n\n")
		http.NewResponseController(w).Flush()
		if r.URL.Query().Has("cut") {
			fmt.Fprint(w, final[:len(final)-12]) // the upstream died mid-line
			return
		}
		fmt.Fprint(w, final) // and closed: no "\n"
	}))
	t.Cleanup(upstream.Close)
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	srv := gateway(t, c, MiddlewareConfig{Estimator: tokensEstimator, Logger: logger,
		Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, httputil.NewSingleHostReverseProxy(target))

	resp, body := send(t, srv.Client(), srv.URL+"/v1/chat", "tenant-7", "{}")
	if resp.StatusCode != 200 || !strings.HasSuffix(body, final) {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	res, err := l.direct.GetReservation(context.Background(), resp.Header.Get(ReservationHeader))
	if err != nil {
		t.Fatal(err)
	}
	if !isState(res, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || res.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("stream ending in its usage event without a line end: %s %v, want SETTLED 40 tokens", res.GetState(), res.GetActualUnits())
	}

	resp, body = send(t, srv.Client(), srv.URL+"/v1/chat?cut", "tenant-7", "{}")
	if resp.StatusCode != 200 || !strings.HasSuffix(body, final[:len(final)-12]) {
		t.Fatalf("cut stream: %d %q", resp.StatusCode, body)
	}
	wantUnknownAndKept(t, l, c, resp.Header.Get(ReservationHeader), "stream cut inside its usage event", func() string {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.String()
	})
}

// The SSE specification's line ends and events, through the middleware
// and a reverse proxy on real sockets: bare-CR line ends are read, a usage
// object split over several data lines of one event is read whole, and a
// stream cut between the data lines of its final event is USAGE_UNKNOWN,
// never settled at the earlier 10 tokens.
func TestMiddlewareStreamReadsEventsAsTheSSESpecSays(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	const early = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}"
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		flush := http.NewResponseController(w).Flush
		switch {
		case r.URL.Query().Has("cr"):
			fmt.Fprint(w, early+"\r\r")
			flush()
			fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":31,\"total_tokens\":40}}\r\rdata: [DONE]\r\r")
		case r.URL.Query().Has("split"):
			fmt.Fprint(w, early+"\n\n")
			fmt.Fprint(w, "data: {\"choices\":[],\n")
			flush()
			fmt.Fprint(w, "data: \"usage\":{\"prompt_tokens\":9,\"completion_tokens\":31,\n")
			fmt.Fprint(w, "data: \"total_tokens\":40}}\n\ndata: [DONE]\n\n")
		case r.URL.Query().Has("cut"):
			fmt.Fprint(w, early+"\n\n")
			flush()                                   // chunked: the client's read ends when the gateway's handler does
			fmt.Fprint(w, "data: {\"choices\":[],\n") // the upstream died here, at a line end
		}
	}))
	t.Cleanup(upstream.Close)
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := gateway(t, c, MiddlewareConfig{Estimator: tokensEstimator,
		Usage: UsageFromStream(map[string]string{"tokens": "total_tokens"}, nil)}, httputil.NewSingleHostReverseProxy(target))
	for _, tc := range []struct {
		query  string
		state  ledgerv1.ReservationState
		tokens int64
	}{
		{"cr", ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, 40},
		{"split", ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, 40},
		{"cut", ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, 0},
	} {
		resp, body := send(t, srv.Client(), srv.URL+"/v1/chat?"+tc.query, "tenant-7", "{}")
		if resp.StatusCode != 200 || !strings.HasPrefix(body, early) {
			t.Fatalf("%s: %d %q", tc.query, resp.StatusCode, body)
		}
		res, err := l.direct.GetReservation(context.Background(), resp.Header.Get(ReservationHeader))
		if err != nil {
			t.Fatal(err)
		}
		if !isState(res, tc.state) || res.GetActualUnits()["tokens"] != tc.tokens {
			t.Errorf("%s: %s %v, want %s %d tokens", tc.query, res.GetState(), res.GetActualUnits(), tc.state, tc.tokens)
		}
	}
}
