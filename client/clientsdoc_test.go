// Tests of promises docs/CLIENTS.md makes about the Go SDK, each written
// when a review of the SDK against that page found it broken (or, for
// Close, to guard it), and seen failing before the fix.

package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/ledger"
)

// partitionedTwoUnitGateway returns an Emergency whose Client reaches the
// ledger through the fault proxy, with a shard of tokens and requests,
// and then closes the proxy: every later call is refused at connect, so
// Emergency admits from the shard.
func partitionedTwoUnitGateway(t *testing.T) *Emergency {
	t.Helper()
	l := startShardLedger(t)
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}, {Unit: "requests", Burst: 1_000}},
	}); err != nil {
		t.Fatal(err)
	}
	gw := l.viaProxy(t)
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(gw, store, EmergencyOptions{})
	if _, err := em.Provision(withoutWatchdog(context.Background()), ProvisionRequest{Subject: "tenant-7", Route: "chat.generate",
		Units: Units{"tokens": 1_000, "requests": 10}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	l.proxy.Close()
	return em
}

// Emergency.Run follows Client.Run's rules from the shard too: a reserved
// unit the work's usage leaves out is settled at its estimate (an
// unmeasured unit is no proof that nothing was used), never at zero.
func TestEmergencyRunLocalSettlesAnUnstatedUnitAtItsEstimate(t *testing.T) {
	em := partitionedTwoUnitGateway(t)
	res, err := em.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate",
		Units: Units{"tokens": 100, "requests": 1}}, func(context.Context) (Units, error) {
		return Units{"tokens": 40}, nil // measured tokens only
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Local == nil || res.Local.State != ledger.StateSettled {
		t.Fatalf("not settled locally: %+v", res)
	}
	if got := res.Local.Actual; got["tokens"] != 40 || got["requests"] != 1 {
		t.Fatalf("local actual %v, want tokens 40 and requests at its estimate 1", got)
	}
	if got := res.Receipt.Actual; got["requests"] != 1 {
		t.Fatalf("receipt actual %v, want requests 1", got)
	}
}

// LostReserves may be read while the background lookups run (a gateway
// polls it for its dashboard): the lookup's findings are published under
// the lock LostReserves reads under. Run with -race.
func TestLostReservesCanBeReadWhileTheLookupResolves(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	found := make(chan LostReserve, 1)
	c := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}),
		// One lost answer after 200 ms of silence opens the breaker, so
		// the lookup of the lost Reserve moves to the background.
		WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 200 * time.Millisecond, ProbeBase: 20 * time.Millisecond, ProbeMax: 50 * time.Millisecond}),
		WithLostReserveHandler(func(lr LostReserve) { found <- lr }))
	time.Sleep(250 * time.Millisecond) // no answer for longer than DetectTimeout
	stop := make(chan struct{})
	polled := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				polled <- n
				return
			default:
			}
			for _, lr := range c.LostReserves() {
				_ = lr.Reservation.GetState()
				_ = lr.Err
				n++
			}
		}
	}()
	l.proxy.DropNextResponses(1) // the Reserve lands; its answer is lost
	_, err := c.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 300}})
	unknown := mustErrAs[*ReservationUnknownError](t, err)
	if !unknown.LookingUp {
		t.Fatalf("the lookup did not move to the background: %v", err)
	}
	var lr LostReserve
	select {
	case lr = <-found:
	case <-time.After(30 * time.Second):
		t.Fatalf("the lookup never finished: %+v", c.LostReserves())
	}
	close(stop)
	t.Logf("LostReserves read %d entries while the lookup ran", <-polled)
	if !lr.Done || lr.Err != nil || lr.Reservation.GetReservationId() != unknown.ReservationID ||
		!isState(lr.Reservation, ledgerv1.ReservationState_RESERVATION_STATE_RESERVED) {
		t.Fatalf("lookup outcome %+v, want the admitted reservation", lr)
	}
}

// With the default usage (Usage nil: ReportUsage, else the estimate), a
// handler that returns after its client went away without reporting
// usage is USAGE_UNKNOWN (docs/CLIENTS.md, section 8): the backend it
// called may still be working, so its usage is not known to be the
// estimate. Its capacity stays held and its receipt is kept.
func TestMiddlewareClientGoneWithoutUsageIsUnknown(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	started := make(chan struct{}, 1)
	handlerDone := make(chan struct{}, 1)
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("partial answer"))
		http.NewResponseController(w).Flush()
		started <- struct{}{}
		<-r.Context().Done() // the client hangs up mid-answer
		handlerDone <- struct{}{}
	})
	gw := gateway(t, l.direct, MiddlewareConfig{}, backend)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL, strings.NewReader("x"))
	req.Header.Set("X-Tenant", "tenant-7")
	resp, err := gw.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get(ReservationHeader)
	<-started
	cancel()
	resp.Body.Close()
	<-handlerDone
	var got *ledgerv1.Reservation
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err = l.direct.GetReservation(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if got.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_STARTED || time.Now().After(deadline) {
			break
		}
	}
	if !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
		t.Fatalf("reservation %s is %s (actual %v), want USAGE_UNKNOWN", id, got.GetState(), got.GetActualUnits())
	}
	// The ledger marks it before the middleware hears back and keeps the
	// receipt: wait for that too.
	pending := l.direct.PendingUnknown()
	for deadline := time.Now().Add(10 * time.Second); len(pending) == 0 && time.Now().Before(deadline); pending = l.direct.PendingUnknown() {
		time.Sleep(10 * time.Millisecond)
	}
	if len(pending) != 1 || pending[0].ReservationID != id || pending[0].Actual != nil {
		t.Fatalf("pending receipts %+v, want the one of %s without usage", pending, id)
	}
}

// A ReserveBatch whose answer was lost may be sent again unchanged
// (docs/CLIENTS.md, section 7): the LostError names every item's id, the
// ones the SDK minted included, and the batch sent again with them
// replays its admitted items instead of debiting them twice.
func TestLostReserveBatchRepeatedUnchangedReplays(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
	reqs := []ReserveRequest{
		{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 200}},
	}
	l.proxy.DropNextResponses(1) // the batch lands; its answer is lost
	_, err := c.ReserveBatch(context.Background(), reqs)
	lost := mustErrAs[*LostError](t, err)
	if st := l.proxy.Stats(); st.DroppedResponses != 1 {
		t.Fatalf("proxy stats %+v: the fault did not happen", st)
	}
	if len(lost.IDs) != len(reqs) {
		t.Fatalf("lost batch names ids %v, want one per item", lost.IDs)
	}
	out, err := c.ReserveBatch(context.Background(), WithIDs(reqs, lost.IDs))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Err != nil || !o.Result.Replayed || o.Result.ReservationID != lost.IDs[i] {
			t.Fatalf("item %d: %+v (err %v), want a replay of %q", i, o.Result, o.Err, lost.IDs[i])
		}
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 300 {
		t.Fatalf("reserved %d, want 300 (debited once)", b.GetReserved())
	}
}

// ReserveBatch only reads the caller's requests: a template slice sent
// twice is two batches, each charged (it once wrote its minted ids into
// the slice, so the second batch replayed the first), and goroutines may
// share one (go test -race).
func TestReserveBatchTemplateSentTwiceIsTwoBatches(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	template := []ReserveRequest{{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			out, err := c.ReserveBatch(context.Background(), template)
			if err != nil || out[0].Err != nil || out[0].Result.Replayed {
				t.Errorf("batch from the template: %+v, %v", out, err)
			}
		})
	}
	wg.Wait()
	if template[0].ReservationID != "" {
		t.Errorf("the template now holds id %q", template[0].ReservationID)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 200 {
		t.Fatalf("reserved %d after two batches of 100, want 200", b.GetReserved())
	}
}

// A Reserve whose caller's context ended before anything was sent lost
// nothing: it returns the context's error, not RESERVATION_UNKNOWN, and
// leaves no background lookup of an id the ledger never saw.
func TestReserveWithAnEndedContextSendsNothingAndLosesNothing(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := l.proxy.Stats()
	_, err := c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	var unknown *ReservationUnknownError
	if errors.As(err, &unknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("reserve with an ended context: %v, want context.Canceled", err)
	}
	if lost := c.LostReserves(); len(lost) != 0 {
		t.Fatalf("lost reserves %+v, want none", lost)
	}
	if after := l.proxy.Stats(); after.Accepted != before.Accepted {
		t.Fatalf("proxy stats %+v then %+v: a connection was opened", before, after)
	}
}

// When a lost central Reserve is served from the shard, the central hold
// the background lookup finds is released (docs/CLIENTS.md, section 5),
// also when the local admission is slow (here a slow shard store: its
// clock takes 1.5 s, as a slow fsync would). The lookup once started
// before the shard decided and could find the hold first; it now starts
// once the shard admitted.
func TestEmergencyReleasesTheCentralHoldTheLookupFindsFirst(t *testing.T) {
	l := startShardLedger(t)
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}},
	}); err != nil {
		t.Fatal(err)
	}
	gw := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}),
		// One lost answer after 200 ms of silence opens the breaker; a
		// probe closes it again 10-20 ms later.
		WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 200 * time.Millisecond, ProbeBase: 20 * time.Millisecond, ProbeMax: 50 * time.Millisecond}))
	var slow atomic.Bool
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a", Clock: func() time.Time {
		if slow.Load() {
			time.Sleep(1500 * time.Millisecond)
		}
		return time.Now()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(gw, store, EmergencyOptions{})
	if _, err := em.Provision(withoutWatchdog(context.Background()), ProvisionRequest{Subject: "tenant-7", Route: "chat.generate",
		Units: Units{"tokens": 1_000}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(250 * time.Millisecond) // no answer for longer than DetectTimeout
	slow.Store(true)
	l.proxy.DropNextResponses(1) // the central Reserve lands; its answer is lost
	r, err := em.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
	slow.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	var unknown *ReservationUnknownError
	if r.Local == nil || !errors.As(r.LedgerErr, &unknown) || !unknown.LookingUp {
		t.Fatalf("reserve %+v: want it served from the shard while its lost central Reserve is looked up", r)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := l.direct.GetReservation(context.Background(), r.ReservationID)
		if err != nil {
			t.Fatal(err)
		}
		if isState(got, ledgerv1.ReservationState_RESERVATION_STATE_RELEASED) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the central hold of %s served from the shard is %s, want RELEASED (lost reserves %+v)",
				r.ReservationID, got.GetState(), gw.LostReserves())
		}
	}
}

// clientGoroutines returns the stacks of the goroutines running the
// Client's own background code: the breaker's prober, the resend loop of
// kept settles and the lookups of lost Reserves.
func clientGoroutines() []string {
	return goroutinesIn("client/breaker.go:", "client/resettle.go:", "client/lookups.go:")
}

// Close ends every goroutine the Client started, also in the middle of an
// outage: the prober of the open breaker, the resend loop of a kept
// settle and the background lookup of a lost Reserve, all waiting for a
// ledger that does not come back.
func TestCloseEndsTheClientsGoroutinesDuringAnOutage(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	before := runtime.NumGoroutine()
	c, err := New(l.proxy.Addr(), WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}),
		WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 300 * time.Millisecond, ProbeBase: 20 * time.Millisecond, ProbeMax: 50 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	var lost error
	_, err = c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(ctx context.Context) (Units, error) {
			time.Sleep(350 * time.Millisecond) // no answer for longer than DetectTimeout
			l.proxy.DropNextResponses(1)       // this Reserve lands, its answer is lost: the breaker opens
			_, lost = c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
			l.proxy.SetFaults(faultsPartition) // and the ledger stays away
			return Units{"tokens": 40}, nil
		})
	mustErrAs[*UsageUnknownError](t, err) // the settle was not sent: kept and resent later
	if unknown := mustErrAs[*ReservationUnknownError](t, lost); !unknown.LookingUp {
		t.Fatalf("the lost Reserve is not looked up in the background: %v", lost)
	}
	if g := clientGoroutines(); len(g) < 3 {
		t.Fatalf("%d client goroutines during the outage, want the prober, the resend loop and the lookup:\n%s", len(g), strings.Join(g, "\n\n"))
	}
	c.Close()
	for deadline := time.Now().Add(5 * time.Second); len(clientGoroutines()) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after Close:\n%s", strings.Join(clientGoroutines(), "\n\n"))
		}
	}
	t.Logf("goroutines: %d before New, %d after Close (the proxy's blackholed links included)", before, runtime.NumGoroutine())
}

// Work that reports a usage the ledger cannot take (a negative amount, a
// unit the policy does not have) used something nobody can state: Run
// marks it USAGE_UNKNOWN and hands back its operation receipt, the only
// thing that can settle it later, instead of leaving it STARTED with the
// receipt lost.
func TestRunMarksUnknownWhenTheReportedUsageIsRefused(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	for name, usage := range map[string]Units{"negative": {"tokens": -5}, "unknown unit": {"tokenz": 5}} {
		t.Run(name, func(t *testing.T) {
			_, err := l.direct.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
				func(context.Context) (Units, error) { return usage, nil })
			unknown := mustErrAs[*UsageUnknownError](t, err)
			if unknown.Receipt.OperationID == "" || !unknown.Marked || unknown.Receipt.Actual != nil {
				t.Fatalf("unknown %+v: want a marked receipt with its operation id and no usage", unknown)
			}
			if le := mustErrAs[*LedgerError](t, err); le.Code != connect.CodeInvalidArgument || le.Op != "settle" {
				t.Fatalf("error %v does not carry the settle's refusal", err)
			}
			got, gerr := l.direct.GetReservation(context.Background(), unknown.Receipt.ReservationID)
			if gerr != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
				t.Fatalf("reservation %v %v, want USAGE_UNKNOWN", got, gerr)
			}
			if _, err := l.direct.ResolveUnknown(context.Background(), unknown.Receipt, Units{"tokens": 7}); err != nil {
				t.Fatalf("the receipt does not resolve it: %v", err)
			}
		})
	}
}

// From a shard too: a usage the local ledger refuses leaves the work
// USAGE_UNKNOWN with its receipt returned, never STARTED and forgotten.
func TestEmergencyRunLocalMarksUnknownWhenTheReportedUsageIsRefused(t *testing.T) {
	em := partitionedTwoUnitGateway(t)
	for name, usage := range map[string]Units{"negative": {"tokens": -5}, "unknown unit": {"tokenz": 5}} {
		t.Run(name, func(t *testing.T) {
			_, err := em.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate",
				Units: Units{"tokens": 100, "requests": 1}}, func(context.Context) (Units, error) { return usage, nil })
			unknown := mustErrAs[*UsageUnknownError](t, err)
			if unknown.Receipt.OperationID == "" || !unknown.Marked || unknown.Receipt.Actual != nil {
				t.Fatalf("unknown %+v: want a marked receipt with its operation id and no usage", unknown)
			}
			if !errors.Is(err, ledger.ErrInvalidCommand) {
				t.Fatalf("error %v does not carry the local refusal", err)
			}
			receipts, rerr := em.Store().Receipts(em.Store().Shards()[0].Shard.ID)
			if rerr != nil {
				t.Fatal(rerr)
			}
			for _, r := range receipts {
				if r.ReservationID == unknown.Receipt.ReservationID && r.State != ledger.StateUsageUnknown {
					t.Fatalf("local reservation is %s, want USAGE_UNKNOWN", r.State)
				}
			}
			if err := em.Settle(context.Background(), unknown.Receipt.ReservationID, unknown.Receipt.OperationID, Units{"tokens": 7, "requests": 1}); err != nil {
				t.Fatalf("the receipt does not settle it: %v", err)
			}
		})
	}
}

// When every central Reserve answer was lost but the lookup after them
// answered not found, the request is served from the shard, and a Reserve
// still in flight that lands later is released by the background lookup
// (docs/CLIENTS.md, section 5), not left holding central capacity until
// its hold TTL. The late landing is a real HTTP proxy in front of the
// ledger that holds the Reserve until the client gave up on it, then
// delivers it.
func TestEmergencyReleasesACentralReserveThatLandsAfterANotFoundLookup(t *testing.T) {
	l := startShardLedger(t)
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}},
	}); err != nil {
		t.Fatal(err)
	}
	forward := func(ctx context.Context, r *http.Request, body []byte) (*http.Response, error) {
		out, err := http.NewRequestWithContext(ctx, r.Method, "http://"+l.addr+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		out.Header = r.Header.Clone()
		out.Header.Del("Connect-Timeout-Ms")
		return http.DefaultClient.Do(out)
	}
	landed := make(chan error, 1)
	late := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		if strings.HasSuffix(r.URL.Path, "/Reserve") {
			// In flight: delivered once the client gave up on it and its
			// lookup has been answered.
			<-r.Context().Done()
			time.Sleep(500 * time.Millisecond)
			resp, err := forward(context.Background(), r, body)
			if err == nil {
				resp.Body.Close()
			}
			landed <- err
			return
		}
		resp, err := forward(r.Context(), r, body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		maps.Copy(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(late.Close)
	gw, err := New(strings.TrimPrefix(late.URL, "http://"), noBreakerWatchdog, WithTimeout(300*time.Millisecond), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(gw, store, EmergencyOptions{})
	if _, err := em.Provision(withoutWatchdog(context.Background()), ProvisionRequest{Subject: "tenant-7", Route: "chat.generate",
		Units: Units{"tokens": 1_000}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	r, err := em.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
	if err != nil {
		t.Fatal(err)
	}
	if unknown := mustErrAs[*ReservationUnknownError](t, r.LedgerErr); r.Local == nil || !unknown.LookingUp {
		t.Fatalf("reserve %+v (%v): want it served from the shard while its id is still looked up", r, r.LedgerErr)
	}
	if err := <-landed; err != nil {
		t.Fatalf("the late Reserve did not reach the ledger: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := l.direct.GetReservation(context.Background(), r.ReservationID)
		if err != nil {
			t.Fatal(err)
		}
		if isState(got, ledgerv1.ReservationState_RESERVATION_STATE_RELEASED) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late central hold of %s served from the shard is %s, want RELEASED", r.ReservationID, got.GetState())
		}
	}
}

// A lost central Reserve that the shard then refuses too (here: no shard
// for the subject) was not served locally, so Emergency has no central
// hold to release: it watches nothing. The lookup after the lost answers
// said not found, so, as for Client.Reserve, no lookup continues in the
// background and no goroutine of it is left (the watch used to start
// before the shard decided and asked the ledger for ten minutes).
func TestEmergencyRefusedByTheShardLeavesNoWatch(t *testing.T) {
	l := startShardLedger(t)
	if _, _, err := l.direct.PublishPolicy(context.Background(), &ledgerv1.Policy{
		Subject: "tenant-7", Route: "chat.generate", EmergencyMode: true,
		Dimensions: []*ledgerv1.Dimension{{Unit: "tokens", Burst: 1_000_000}},
	}); err != nil {
		t.Fatal(err)
	}
	gw := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}))
	store, err := OpenShardStore(filepath.Join(t.TempDir(), "gw"), ShardStoreOptions{GatewayID: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	em := NewEmergency(gw, store, EmergencyOptions{}) // no shard provisioned
	l.proxy.DropNextRequests(1)                       // the Reserve is cut on its way: lost, never admitted
	_, err = em.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 10}})
	if !errors.Is(err, ErrNoShard) {
		t.Fatalf("reserve: %v, want the shard's refusal", err)
	}
	unknown := mustErrAs[*ReservationUnknownError](t, err)
	if unknown.LookingUp {
		t.Fatalf("%v: says it is still looked up, though the ledger answered not found and nothing was served", err)
	}
	if st := l.proxy.Stats(); st.DroppedRequests != 1 {
		t.Fatalf("proxy stats %+v: the fault did not happen", st)
	}
	for deadline := time.Now().Add(3 * time.Second); len(goroutinesIn("client/lookups.go:")) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("lookups left after the shard refused:\n%s", strings.Join(goroutinesIn("client/lookups.go:"), "\n\n"))
		}
	}
	if lost := gw.LostReserves(); len(lost) != 0 {
		t.Fatalf("lost reserves %+v, want none", lost)
	}
}

// lockedBuffer is a log destination the test reads while the gateway's
// goroutines write it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// In partition mode a request served from the shard whose usage is
// unknown stays USAGE_UNKNOWN in the shard store, not in the Client's
// PendingUnknown (docs/CLIENTS.md, section 5), and the middleware's log
// says so, with the operation id Emergency.Settle needs (it told the
// gateway to use ResolveUnknown, which asks the central ledger, where
// the reservation does not exist).
func TestMiddlewareLocalUsageUnknownIsLeftInTheShard(t *testing.T) {
	em := partitionedTwoUnitGateway(t)
	var logs lockedBuffer
	mw, err := em.client.Middleware(MiddlewareConfig{
		Route: "chat.generate", Subject: tenantHeader, Emergency: em,
		Estimator: NewEstimator("sha256:e57", func(*http.Request, []byte) (Units, error) { return Units{"tokens": 100, "requests": 1}, nil }),
		Usage:     UsageFromHeaders(map[string]string{"tokens": "X-Usage-Tokens"}), // the backend sends none
		Logger:    slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })))
	t.Cleanup(srv.Close)
	resp, _ := send(t, srv.Client(), srv.URL, "tenant-7", "{}")
	id := resp.Header.Get(ReservationHeader)
	if resp.StatusCode != 200 || !em.Store().Has(id) {
		t.Fatalf("answer %d for %q: want it served from the shard", resp.StatusCode, id)
	}
	var op string
	receipts, err := em.Store().Receipts(em.Store().Shards()[0].Shard.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range receipts {
		if r.ReservationID == id && r.State == ledger.StateUsageUnknown {
			op = r.OperationID
		}
	}
	if op == "" {
		t.Fatalf("local receipts %+v: want %s USAGE_UNKNOWN", receipts, id)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "Emergency.Settle"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("log %q does not say that Emergency.Settle resolves it", logs.String())
		}
	}
	if !strings.Contains(logs.String(), op) {
		t.Fatalf("log %q does not name the operation id %s", logs.String(), op)
	}
	if pending := em.client.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending receipts %+v, want none (the shard keeps it)", pending)
	}
	if err := em.Settle(context.Background(), id, op, Units{"tokens": 7, "requests": 1}); err != nil {
		t.Fatalf("Emergency.Settle with the logged operation id: %v", err)
	}
}

// A ReserveBatch retried after a lost answer reports, per item, the
// Reserve calls sent (ReserveResult.Attempts), as Reserve does: here two,
// the second replaying what the first admitted (it said 1).
func TestReserveBatchResultsCountTheAttempts(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	l.proxy.DropNextResponses(1) // the batch lands; its first answer is lost
	out, err := c.ReserveBatch(context.Background(), []ReserveRequest{{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}})
	if err != nil {
		t.Fatal(err)
	}
	if st := l.proxy.Stats(); st.DroppedResponses != 1 {
		t.Fatalf("proxy stats %+v: the fault did not happen", st)
	}
	if r := out[0].Result; out[0].Err != nil || !r.Replayed || r.Attempts != 2 {
		t.Fatalf("outcome %+v (err %v), want a replay after 2 attempts", r, out[0].Err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 100 {
		t.Fatalf("reserved %d, want 100 (debited once)", b.GetReserved())
	}
}
