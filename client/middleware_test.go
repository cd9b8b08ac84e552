package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// A fixed estimator: every request is estimated at 100 tokens and 1
// request, whatever its body.
var fixedEstimator = NewEstimator("sha256:fixed-100", func(*http.Request, []byte) (Units, error) {
	return Units{"tokens": 100, "requests": 1}, nil
})

func tenantHeader(r *http.Request) (string, error) {
	if s := r.Header.Get("X-Tenant"); s != "" {
		return s, nil
	}
	return "", errors.New("no X-Tenant header")
}

// gateway serves next behind the middleware on a real socket.
func gateway(t *testing.T, c *Client, cfg MiddlewareConfig, next http.Handler) *httptest.Server {
	t.Helper()
	if cfg.Route == "" {
		cfg.Route = "chat.generate"
	}
	if cfg.Subject == nil {
		cfg.Subject = tenantHeader
	}
	if cfg.Estimator == nil {
		cfg.Estimator = fixedEstimator
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger
	}
	mw, err := c.Middleware(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(next))
	t.Cleanup(srv.Close)
	return srv
}

func send(t *testing.T, hc *http.Client, url, tenant, body string) (*http.Response, string) {
	t.Helper()
	resp, b, err := trySend(hc, url, tenant, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// trySend is send for goroutines other than the test's.
func trySend(hc *http.Client, url, tenant, body string) (*http.Response, string, error) {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("X-Tenant", tenant)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestMiddlewareReservesRunsAndSettlesFromHeaders(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // the body is still there after estimation
		w.Header().Set("X-Usage-Tokens", "42")
		w.Write([]byte("answer to " + string(body)))
	})
	gw := gateway(t, l.direct, MiddlewareConfig{Usage: UsageFromHeaders(map[string]string{"tokens": "X-Usage-Tokens"})}, backend)
	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "hello")
	if resp.StatusCode != 200 || body != "answer to hello" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	id := resp.Header.Get(ReservationHeader)
	got, err := l.direct.GetReservation(context.Background(), id)
	if err != nil {
		t.Fatalf("reservation %q: %v", id, err)
	}
	if !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 42 || got.GetReservedUnits()["tokens"] != 100 {
		t.Fatalf("reservation %v", got)
	}
	// The digest covers the estimator's digest and the body.
	want, _ := RequestDigest(DigestInput{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100, "requests": 1},
		EstimatorDigest: "sha256:fixed-100", BodyHash: BodyHash([]byte("hello"))})
	if got.GetRequestDigest() != want {
		t.Fatalf("digest %s, want %s", got.GetRequestDigest(), want)
	}
	if resp, _ := send(t, gw.Client(), gw.URL, "", "x"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no subject: %d, want 401", resp.StatusCode)
	}
	if resp, _ := send(t, gw.Client(), gw.URL, "tenant-without-policy", "x"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("no policy: %d, want 403", resp.StatusCode)
	}
}

func TestMiddlewareAnswers429WithRetryAfterAndDimension(t *testing.T) {
	l := startLedger(t)
	pol := l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 150, refill: 10, interval: time.Second})
	ran := 0
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		ReportUsage(r.Context(), Units{"tokens": 100, "requests": 1})
	})
	gw := gateway(t, l.direct, MiddlewareConfig{}, backend)
	if resp, _ := send(t, gw.Client(), gw.URL, "tenant-7", "first"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "second")
	if resp.StatusCode != http.StatusTooManyRequests || ran != 1 {
		t.Fatalf("second request: %d (handler ran %d times), want 429 without running", resp.StatusCode, ran)
	}
	var rej RejectionBody
	if err := json.Unmarshal([]byte(body), &rej); err != nil {
		t.Fatalf("429 body %q: %v", body, err)
	}
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	// 50 tokens left, 100 wanted, 10 per second: at least 5 seconds.
	if err != nil || secs < 5 || int64(secs) != rej.RetryAfterSeconds {
		t.Fatalf("Retry-After %q, body %+v", resp.Header.Get("Retry-After"), rej)
	}
	if rej.LimitingDimension != "tokens" || rej.PolicyGeneration != pol.GetGeneration() || rej.Reason != "INSUFFICIENT_CAPACITY" {
		t.Fatalf("429 body %+v", rej)
	}
}

func TestMiddlewareUnknownUsageIsHeldNotRefunded(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	backendStarted := make(chan struct{}, 1)
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hang") != "" {
			backendStarted <- struct{}{}
			<-r.Context().Done() // the client hangs up mid-request
			return
		}
		w.Write([]byte("no usage header")) // the backend forgot to report usage
	})
	gw := gateway(t, l.direct, MiddlewareConfig{Usage: UsageFromHeaders(map[string]string{"tokens": "X-Usage-Tokens"})}, backend)
	if resp, _ := send(t, gw.Client(), gw.URL, "tenant-7", "x"); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL, strings.NewReader("hang"))
	req.Header.Set("X-Tenant", "tenant-7")
	req.Header.Set("X-Hang", "1")
	go func() { <-backendStarted; cancel() }()
	if _, err := gw.Client().Do(req); err == nil {
		t.Fatal("the hung request answered")
	}
	// The middleware notices the hang-up after the client did: poll.
	var pending []OperationReceipt
	for deadline := time.Now().Add(10 * time.Second); len(pending) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("pending receipts %+v, want 2", pending)
		}
		time.Sleep(10 * time.Millisecond)
		pending = l.direct.PendingUnknown()
	}
	for _, r := range pending {
		got, err := l.direct.GetReservation(context.Background(), r.ReservationID)
		if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
			t.Fatalf("reservation %v, %v", got, err)
		}
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 200 {
		t.Fatalf("reserved %d, want both estimates held (200)", b.GetReserved())
	}
}

// TestMiddlewareFairQueueDispatchesByWeight holds the backend's only slot,
// queues 8 requests of a weight-3 tenant and 8 of a weight-1 tenant, and
// checks that the first 8 dispatched split 6:2.
func TestMiddlewareFairQueueDispatchesByWeight(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "heavy", route: "chat.generate", burst: 10_000, weight: 3})
	l.publish(t, policySpec{subject: "light", route: "chat.generate", burst: 10_000, weight: 1})
	l.publish(t, policySpec{subject: "blocker", route: "chat.generate", burst: 10_000, weight: 1})
	q, err := l.direct.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens"})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	blockerRunning := make(chan struct{})
	var mu sync.Mutex
	var order []string
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "blocker" {
			close(blockerRunning)
			<-release
		}
		mu.Lock()
		order = append(order, tenant)
		mu.Unlock()
		ReportUsage(r.Context(), Units{"tokens": 100, "requests": 1})
	})
	gw := gateway(t, l.direct, MiddlewareConfig{Queue: q}, backend)
	hc := gw.Client()

	var wg sync.WaitGroup
	fire := func(tenant string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := trySend(hc, gw.URL, tenant, "x")
			if err != nil {
				t.Errorf("%s: %v", tenant, err)
			} else if resp.StatusCode != 200 {
				t.Errorf("%s: %d %s", tenant, resp.StatusCode, body)
			}
		}()
	}
	fire("blocker")
	<-blockerRunning
	for i := 0; i < 8; i++ {
		fire("heavy")
		fire("light")
	}
	waitQueued(t, q, 16) // behind the blocker
	close(release)
	wg.Wait()
	if len(order) != 17 {
		t.Fatalf("order %v", order)
	}
	heavy := 0
	for _, tenant := range order[1:9] {
		if tenant == "heavy" {
			heavy++
		}
	}
	if heavy != 6 {
		t.Fatalf("first 8 dispatches %v: %d heavy, want 6 (weights 3:1)", order[1:9], heavy)
	}
	if queued, running := q.Stats(); queued != 0 || running != 0 {
		t.Fatalf("queue not drained: %d queued, %d running", queued, running)
	}
}

func TestMiddlewareFairQueueReleasesAbandonedAndRefusesWhenFull(t *testing.T) {
	l, q, gw, unblock, _ := stalledQueue(t, policySpec{burst: 10_000}, FairQueueConfig{Concurrency: 1, CostUnit: "tokens", MaxQueuePerTenant: 1}, nil)

	// A queued request whose client gives up: its reservation is released.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL, strings.NewReader("x"))
	req.Header.Set("X-Tenant", "tenant-7")
	errc := make(chan error, 1)
	go func() { _, err := gw.Client().Do(req); errc <- err }()
	waitQueued(t, q, 1)
	// The tenant's queue (1) is full now: 429 QUEUE_FULL, nothing held.
	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "y")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "QUEUE_FULL") || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("full queue: %d %s", resp.StatusCode, body)
	}
	cancel()
	<-errc
	for deadline := time.Now().Add(10 * time.Second); ; {
		if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() == 0 && b.GetSpent() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("abandoned and refused requests still hold capacity: %v", l.balance(t, "tenant-7", "chat.generate"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	unblock()
	// The abandoned request's slot is skipped; a new one runs.
	if resp, _ := send(t, gw.Client(), gw.URL, "tenant-7", "z"); resp.StatusCode != 200 {
		t.Fatalf("after the blocker: %d", resp.StatusCode)
	}
	if queued, running := q.Stats(); queued != 0 || running != 0 {
		t.Fatalf("%d queued, %d running", queued, running)
	}
	l.audit(t)
}

func waitQueued(t *testing.T, q *FairQueue, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if queued, _ := q.Stats(); queued == n {
			return
		}
		if time.Now().After(deadline) {
			queued, running := q.Stats()
			t.Fatalf("%d queued, %d running; want %d queued", queued, running, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
