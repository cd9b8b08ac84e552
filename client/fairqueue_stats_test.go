package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// A request whose client left while it waited is released and never runs
// (FAIRNESS.md), so FairQueue.Stats no longer counts it as queued, though
// sched keeps its entry until its turn comes and skips it then.
func TestFairQueueStatsLeavesOutARequestWhoseClientLeft(t *testing.T) {
	l, q, gw, unblock, blockerDone := stalledQueue(t, policySpec{burst: 10_000}, FairQueueConfig{Concurrency: 1, CostUnit: "tokens"}, nil)
	leaveQueued(t, l, q, gw)
	if queued, running := q.Stats(); queued != 0 || running != 1 {
		t.Fatalf("Stats: %d queued, %d running; want 0 queued (its client left, it was released), 1 running", queued, running)
	}
	unblock()
	if err := <-blockerDone; err != nil {
		t.Fatal(err)
	}
	if queued, running := q.Stats(); queued != 0 || running != 0 {
		t.Fatalf("drained: %d queued, %d running", queued, running)
	}
	l.audit(t)
}

// Requests whose clients left do not count against MaxQueuePerTenant, but
// sched keeps their entries until their turn, in room for 4 ×
// MaxQueuePerTenant per tenant (FAIRNESS.md): with the backend stalled,
// a tenant whose three requests left still queues a fourth; once four
// entries are held, left ones included, it is refused QUEUE_FULL with
// nothing waiting, until the stalled slot frees and its turn skips them.
func TestFairQueueLeftRequestsHoldSchedRoomUntilTheirTurn(t *testing.T) {
	l, q, gw, unblock, blockerDone := stalledQueue(t, policySpec{burst: 10_000}, FairQueueConfig{Concurrency: 1, CostUnit: "tokens", MaxQueuePerTenant: 1}, nil)

	for range 3 {
		leaveQueued(t, l, q, gw)
	}
	leaveQueued(t, l, q, gw) // the fourth queues: the three left do not count against MaxQueuePerTenant
	if queued, _ := q.Stats(); queued != 0 {
		t.Fatalf("%d queued, want 0: every client left", queued)
	}
	type answer struct {
		code int
		body string
		err  error
	}
	fifth := make(chan answer, 1)
	go func() {
		resp, body, err := trySend(gw.Client(), gw.URL, "tenant-7", "y")
		if err != nil {
			fifth <- answer{err: err}
			return
		}
		fifth <- answer{code: resp.StatusCode, body: body}
	}()
	for {
		select {
		case a := <-fifth:
			if a.err != nil || a.code != http.StatusTooManyRequests || !strings.Contains(a.body, "QUEUE_FULL") {
				t.Fatalf("with 4 × MaxQueuePerTenant left entries held: %d %s %v, want 429 QUEUE_FULL", a.code, a.body, a.err)
			}
		case <-time.After(5 * time.Millisecond):
			if queued, _ := q.Stats(); queued != 0 {
				t.Fatal("with 4 × MaxQueuePerTenant left entries held, a fifth request queued: want 429 QUEUE_FULL")
			}
			continue
		}
		break
	}
	unblock()
	if err := <-blockerDone; err != nil {
		t.Fatal(err)
	}
	if resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "z"); resp.StatusCode != 200 {
		t.Fatalf("after the stall: %d %s, want 200 (the left entries were skipped)", resp.StatusCode, body)
	}
	l.audit(t)
}

// A request whose hold expired while it waited in the queue is refused
// by Start when dispatched: the middleware answers 503 with Retry-After: 1
// (the request did not run; a retry is a new request), the backend never
// sees it, and its slot goes to the next request.
func TestMiddlewareFairQueueAnswers503ForAHoldThatExpiredWhileQueued(t *testing.T) {
	var ranTenant7 sync.Once
	ran := make(chan struct{})
	l, q, gw, unblock, blockerDone := stalledQueue(t, policySpec{burst: 10_000, holdTTL: 200 * time.Millisecond},
		FairQueueConfig{Concurrency: 1, CostUnit: "tokens"}, func() { ranTenant7.Do(func() { close(ran) }) })

	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, body, err := trySend(gw.Client(), gw.URL, "tenant-7", "x")
		got <- answer{resp, body, err}
	}()
	waitQueued(t, q, 1)
	// Expiry gives the hold back while the request waits.
	for deadline := time.Now().Add(10 * time.Second); l.balance(t, "tenant-7", "chat.generate").GetReserved() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queued request's hold never expired")
		}
	}
	unblock()
	if err := <-blockerDone; err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.resp.StatusCode != http.StatusServiceUnavailable || a.resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("expired while queued: %d %s (Retry-After %q), want 503 with Retry-After: 1", a.resp.StatusCode, a.body, a.resp.Header.Get("Retry-After"))
	}
	select {
	case <-ran:
		t.Fatal("the backend ran a request whose hold had expired")
	default:
	}
	if queued, running := q.Stats(); queued != 0 || running != 0 {
		t.Fatalf("%d queued, %d running after the expired request", queued, running)
	}
	if resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "y"); resp.StatusCode != 200 {
		t.Fatalf("the next request: %d %s", resp.StatusCode, body)
	}
	l.audit(t)
}

// stalledQueue is a ledger with policies tenant (for tenant-7 on
// chat.generate) and one for blocker, and a gateway whose FairQueue (cfg)
// runs one request at a time, that slot held by a blocker request stalled
// in the backend until unblock; its answer comes on blockerDone. served,
// when set, sees every other request the backend runs.
func stalledQueue(t *testing.T, tenant policySpec, cfg FairQueueConfig, served func()) (l *testLedger, q *FairQueue, gw *httptest.Server, unblock func(), blockerDone chan error) {
	t.Helper()
	l = startLedger(t)
	tenant.subject, tenant.route = "tenant-7", "chat.generate"
	l.publish(t, tenant)
	l.publish(t, policySpec{subject: "blocker", route: "chat.generate", burst: 10_000})
	q, err := l.direct.NewFairQueue(cfg)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock = func() { releaseOnce.Do(func() { close(release) }) }
	blockerRunning := make(chan struct{})
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "blocker" {
			close(blockerRunning)
			<-release
		} else if served != nil {
			served()
		}
		ReportUsage(r.Context(), Units{"tokens": 10, "requests": 1})
	})
	gw = gateway(t, l.direct, MiddlewareConfig{Queue: q}, backend)
	t.Cleanup(unblock) // runs before the gateway's Close, which a blocked handler would hang
	blockerDone = make(chan error, 1)
	go func() { _, _, err := trySend(gw.Client(), gw.URL, "blocker", "x"); blockerDone <- err }()
	<-blockerRunning
	return l, q, gw, unblock, blockerDone
}

// leaveQueued queues one request of tenant-7, lets its client go, and
// waits until the middleware released its reservation.
func leaveQueued(t *testing.T, l *testLedger, q *FairQueue, gw *httptest.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL, strings.NewReader("x"))
	req.Header.Set("X-Tenant", "tenant-7")
	errc := make(chan error, 1)
	go func() { _, err := gw.Client().Do(req); errc <- err }()
	waitQueued(t, q, 1)
	cancel()
	<-errc
	for deadline := time.Now().Add(10 * time.Second); l.balance(t, "tenant-7", "chat.generate").GetReserved() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the left request still holds capacity: %v", l.balance(t, "tenant-7", "chat.generate"))
		}
	}
}
