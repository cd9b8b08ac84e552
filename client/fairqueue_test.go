package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
	"github.com/capledger/capledger/sched"
)

// In a partition the fair queue does not make a request wait for its
// policy read (GetPolicy with the caller's context and its retries, up to
// six attempts of the call timeout while the breaker stays closed): it
// waits at most PolicyWait, takes the weight last read for the subject,
// route and region, and the read goes on in the background and is cached
// once the ledger answers. Here the breaker never opens (no watchdog, a
// call timeout of a minute): only the bound ends the wait.
func TestFairQueueWeightDoesNotWaitThroughAPartition(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, weight: 4})
	gw := l.viaProxy(t, WithTimeout(time.Minute), WithBreaker(BreakerPolicy{DetectTimeout: time.Minute}))
	q, err := gw.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens", PolicyWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}}
	first, err := l.direct.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if w, _ := q.weight(ctx, "tenant-7", first.Reservation); w != 4 {
		t.Fatalf("weight %d, want the policy's 4", w)
	}
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, weight: 6})
	second, err := l.direct.Reserve(ctx, req) // under the new generation, not read yet
	if err != nil {
		t.Fatal(err)
	}
	if second.Reservation.GetPolicyGeneration() == first.Reservation.GetPolicyGeneration() {
		t.Fatal("the second policy did not make a new generation")
	}

	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	type answer struct {
		weight int64
		done   func(Units)
		err    error
	}
	got := make(chan answer, 1)
	go func() {
		w, _ := q.weight(ctx, "tenant-7", second.Reservation)
		done, err := q.acquire(ctx, second)
		got <- answer{w, done, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatalf("acquire in the partition: %v", a.err)
		}
		a.done(nil)
		if a.weight != 4 {
			t.Fatalf("weight %d in the partition, want 4, the last read for tenant-7", a.weight)
		}
	case <-time.After(30 * time.Second): // a hang guard: the read alone may take minutes
		t.Fatal("the fair queue waits for the policy read while the ledger is partitioned")
	}

	l.proxy.SetFaults(faultproxy.Faults{}) // healed: the read in the background lands
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if w, _ := q.weight(ctx, "tenant-7", second.Reservation); w == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new generation's weight was never read after the partition healed")
		}
	}
}

// A reservation of more of the cost unit than sched charges (MaxCost,
// 2^32) is refused, not clamped: charged 2^32, a request of 2^33 would cost
// its tenant half its size and give it twice its share against one whose
// requests are 2^32. The middleware answers 429 RESERVATION_TOO_LARGE
// without Retry-After, the backend never sees it and the reservation is
// released; one of exactly 2^32 runs.
func TestMiddlewareFairQueueRefusesACostAboveMaxCost(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1 << 40})
	q, err := l.direct.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens"})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		ReportUsage(r.Context(), Units{"tokens": 10, "requests": 1})
	})
	estimate := NewEstimator("sha256:body-tokens", func(_ *http.Request, body []byte) (Units, error) {
		n, err := strconv.ParseInt(string(body), 10, 64)
		return Units{"tokens": n, "requests": 1}, err
	})
	gw := gateway(t, l.direct, MiddlewareConfig{Queue: q, Estimator: estimate}, backend)

	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", strconv.FormatInt(sched.MaxCost+1, 10))
	var rej RejectionBody
	_ = json.Unmarshal([]byte(body), &rej)
	if resp.StatusCode != http.StatusTooManyRequests || rej.Reason != "RESERVATION_TOO_LARGE" || rej.LimitingDimension != "tokens" || resp.Header.Get("Retry-After") != "" {
		t.Fatalf("a cost above MaxCost: %d %s (Retry-After %q): want 429 RESERVATION_TOO_LARGE on tokens, no Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the backend ran %d times for a refused request", n)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 0 || b.GetSpent() != 0 {
		t.Fatalf("the refused request still holds capacity: %v", b)
	}
	if resp, body := send(t, gw.Client(), gw.URL, "tenant-7", strconv.FormatInt(sched.MaxCost, 10)); resp.StatusCode != 200 || ran.Load() != 1 {
		t.Fatalf("a cost of exactly MaxCost: %d %s, ran %d", resp.StatusCode, body, ran.Load())
	}
	if queued, running := q.Stats(); queued != 0 || running != 0 {
		t.Fatalf("%d queued, %d running", queued, running)
	}
	l.audit(t)
}

// Close ends a FairQueue policy read still in flight (docs: Client.Close
// cancels the background work and waits for it): in a partition the
// breaker never detects (no watchdog, a call timeout of a minute) the
// read would run for its whole budget, six minute-long attempts, but
// Close cancels it and returns, with no goroutine of the read left.
func TestCloseEndsAFairQueuePolicyReadInFlight(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000, weight: 4})
	res, err := l.direct.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(l.proxy.Addr(), noBreakerWatchdog, WithTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			gw.Close()
		}
	})
	q, err := gw.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens", PolicyWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	if w, _ := q.weight(context.Background(), "tenant-7", res.Reservation); w != 1 {
		t.Fatalf("weight %d in the partition with nothing read, want 1", w)
	}
	if g := goroutinesIn("client/fairqueue.go:"); len(g) == 0 {
		t.Fatal("no policy read in flight")
	}
	done := make(chan struct{})
	go func() { gw.Close(); close(done) }()
	select {
	case <-done:
		closed = true
	case <-time.After(30 * time.Second): // half a call timeout: a hang guard, not a speed limit
		t.Fatalf("Client.Close waits for the fair queue's policy read:\n%s", strings.Join(goroutinesIn("client/fairqueue.go:"), "\n\n"))
	}
	if g := goroutinesIn("client/fairqueue.go:"); len(g) > 0 {
		t.Fatalf("policy reads left after Close:\n%s", strings.Join(g, "\n\n"))
	}
}

// The default Weight's caches are LRUs of FairQueueConfig.PolicyCache
// entries, not maps that grow with every tenant and generation: with a
// cache of 3 and 6 tenants (a generation each) neither holds more than 3;
// a generation still cached is not read again, an evicted one is (and
// gives its policy's weight again). In a partition, a new generation of a
// subject whose last weight is still cached takes it; one whose last
// weight was evicted falls back to weight 1, priority 0, as documented.
// At most MaxPolicyReads reads run at once; a generation met beyond them
// is not read (no goroutine) and takes the fallback.
func TestFairQueuePolicyCachesAreBoundedLRUs(t *testing.T) {
	l := startLedger(t)
	const tenants, cacheSize = 6, 3
	var policyReads atomic.Int64
	counting := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/GetPolicy") {
			policyReads.Add(1)
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	gw := l.viaProxy(t, WithHTTPClient(counting), WithTimeout(time.Minute), WithBreaker(BreakerPolicy{DetectTimeout: time.Minute}))
	q, err := gw.NewFairQueue(FairQueueConfig{Concurrency: 1, PolicyCache: cacheSize, PolicyWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reserve := func(subject string) *ledgerv1.Reservation {
		t.Helper()
		r, err := l.direct.Reserve(ctx, ReserveRequest{Subject: subject, Route: "chat.generate", Units: Units{"tokens": 1}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Reservation
	}
	// weightOf waits out a read slower than PolicyWait on a loaded
	// machine: the read goes on in the background and lands in the cache.
	weightOf := func(res *ledgerv1.Reservation, want int64, wantPriority int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			w, p := q.weight(ctx, res.GetSubject(), res)
			if w == want && p == wantPriority {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s generation %d: weight %d priority %d, want %d, %d", res.GetSubject(), res.GetPolicyGeneration(), w, p, want, wantPriority)
			}
		}
	}
	cached := func() (generations, keys, reads int) {
		q.policyMu.Lock()
		defer q.policyMu.Unlock()
		return q.policies.Len(), q.lastShare.Len(), len(q.reads)
	}
	res := make([]*ledgerv1.Reservation, tenants)
	for i := range tenants {
		subject := fmt.Sprintf("tenant-%d", i)
		l.publish(t, policySpec{subject: subject, route: "chat.generate", burst: 10_000, weight: int64(i + 2), priority: 2})
		res[i] = reserve(subject)
	}
	for range 2 {
		for i := range tenants {
			weightOf(res[i], int64(i+2), 2)
			if g, k, _ := cached(); g > cacheSize || k > cacheSize {
				t.Fatalf("after tenant %d: %d generations and %d keys cached, want at most %d each", i, g, k, cacheSize)
			}
		}
	}
	if n := policyReads.Load(); n != 2*tenants {
		t.Fatalf("%d policy reads for %d generations met twice through a cache of %d, want every one read again (%d)", n, tenants, cacheSize, 2*tenants)
	}
	// Cached now: tenants 3, 4 and 5, 3 the oldest. Used, 3 is kept and
	// 4 evicted by the next generation read (least recently used, not
	// first in).
	weightOf(res[3], 5, 2)
	if n := policyReads.Load(); n != 2*tenants {
		t.Fatalf("a cached generation was read again: %d reads", n)
	}
	weightOf(res[0], 2, 2) // evicted: read again
	if n := policyReads.Load(); n != 2*tenants+1 {
		t.Fatalf("an evicted generation was not read again: %d reads, want %d", n, 2*tenants+1)
	}
	weightOf(res[3], 5, 2)
	if n := policyReads.Load(); n != 2*tenants+1 {
		t.Fatalf("the generation used last but one was evicted (first in, first out?): %d reads", n)
	}

	// New generations, not read yet; tenant-0, tenant-3 and tenant-5 are
	// the keys cached now, tenant-1 and tenant-2 were evicted.
	for _, i := range []int{1, 2, 5} {
		l.publish(t, policySpec{subject: fmt.Sprintf("tenant-%d", i), route: "chat.generate", burst: 10_000, weight: 50, priority: 3})
	}
	renewed5, renewed1, renewed2 := reserve("tenant-5"), reserve("tenant-1"), reserve("tenant-2")
	l.proxy.SetFaults(faultproxy.Faults{Partition: true})
	l.proxy.CutAll()
	if w, p := q.weight(ctx, "tenant-5", renewed5); w != int64(tenants+1) || p != 2 {
		t.Fatalf("tenant-5's new generation in the partition: weight %d priority %d, want its last cached %d, 2", w, p, tenants+1)
	}
	q.policyMu.Lock()
	q.maxReads = 2 // tenant-5's read and tenant-1's
	q.policyMu.Unlock()
	if w, p := q.weight(ctx, "tenant-1", renewed1); w != 1 || p != 0 {
		t.Fatalf("tenant-1's new generation in the partition, its last weight evicted: weight %d priority %d, want 1, 0", w, p)
	}
	if w, p := q.weight(ctx, "tenant-2", renewed2); w != 1 || p != 0 {
		t.Fatalf("tenant-2's new generation beyond the reads allowed: weight %d priority %d, want 1, 0", w, p)
	}
	if _, _, reads := cached(); reads != 2 {
		t.Fatalf("%d policy reads in flight, want 2 (tenant-2's not started beyond maxReads)", reads)
	}
	if g := goroutinesIn("client/fairqueue.go:"); len(g) != 2 {
		t.Fatalf("%d policy read goroutines, want 2:\n%s", len(g), strings.Join(g, "\n\n"))
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
