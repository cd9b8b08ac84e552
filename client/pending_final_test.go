package client

import (
	"context"
	"errors"
	"fmt"
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
)

// Kept receipts (PendingUnknown) leave once the ledger's answer to them is
// final (ErrReceiptRefused), and only then: docs/CLIENTS.md, "USAGE_UNKNOWN".

// refusals collects what WithRefusedReceipts reports.
type refusals struct {
	mu       sync.Mutex
	receipts []OperationReceipt
	errs     []error
}

func (r *refusals) option() Option {
	return WithRefusedReceipts(func(receipt OperationReceipt, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.receipts = append(r.receipts, receipt)
		r.errs = append(r.errs, err)
	})
}

func (r *refusals) get() ([]OperationReceipt, []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]OperationReceipt(nil), r.receipts...), append([]error(nil), r.errs...)
}

// waitResendsDone waits until c's background resend has no receipt left
// to resend (its loop ended).
func waitResendsDone(c *Client) {
	for {
		c.lookups.mu.Lock()
		running := c.resends.running
		c.lookups.mu.Unlock()
		if !running {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitSettled polls the reservation until it is settled.
func waitSettled(t *testing.T, c *Client, id string) *ledgerv1.Reservation {
	t.Helper()
	for {
		got, err := c.GetReservation(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if isSettled(got.GetState()) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// unknownWork is work whose usage is lost.
func unknownWork(context.Context) (Units, error) {
	return nil, fmt.Errorf("the backend lost the count: %w", ErrUsageUnknown)
}

// The ledger binary's USAGE_UNKNOWN resolver (serve --resolver-config)
// settles work the gateway left USAGE_UNKNOWN, from the gateway's
// operation record (70 tokens). The gateway's ResolveUnknown with the
// figure it learned elsewhere (90) then gets the ledger's final answer:
// ErrReceiptRefused and ErrAlreadySettled, the recorded settle in the
// detail, and the receipt leaves PendingUnknown. (It used to stay there,
// and ResolveUnknown failed on it, forever.) The gateway's background
// check is kept from seeing the settle first (its reads are lost).
func TestResolveUnknownAfterTheResolverSettledIsFinal(t *testing.T) {
	ctx := context.Background()
	ops, p, direct := resolverLedger(t)
	// The gateway's background check (its reads) gets no answer here, so
	// it cannot learn of the resolver's settle before ResolveUnknown does.
	c, err := New(p.addr, WithBreaker(BreakerPolicy{Disabled: true}), WithOperationStore(ops),
		WithHTTPClient(&http.Client{Transport: faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{getCall: requestLost}}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	publishTenantPolicy(t, c, false)

	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	// The executor's log turns the usage up and the gateway records it;
	// the resolver asks the endpoint and settles with it.
	if err := Finish(ctx, ops, receipt.ReservationID, receipt.OperationID, Units{"tokens": 70}); err != nil {
		t.Fatal(err)
	}
	if got := waitSettled(t, direct, receipt.ReservationID); got.GetActualUnits()["tokens"] != 70 || got.GetOperationId() != receipt.OperationID {
		t.Fatalf("settled by the resolver: %v", got)
	}
	if p := c.PendingUnknown(); len(p) != 1 {
		t.Fatalf("pending before the gateway asked: %+v, want its receipt (it does not know yet)", p)
	}

	_, err = c.ResolveUnknown(ctx, receipt, Units{"tokens": 90})
	le := mustErrAs[*LedgerError](t, err)
	if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrAlreadySettled) || le.Reservation.GetActualUnits()["tokens"] != 70 {
		t.Fatalf("resolve after the resolver settled: %v (recorded %v)", err, le.Reservation.GetActualUnits())
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after a final answer: %+v", p)
	}
	if n := c.PendingRefused(); n != 0 {
		t.Fatalf("PendingRefused %d: ResolveUnknown's caller got the answer, the resend did not drop it", n)
	}
	if got := availableTokens(t, direct); got != 10_000-70 {
		t.Fatalf("available %d, want %d: the resolver's settle stands, once", got, 10_000-70)
	}
}

// A settle the gateway could not send (the ledger unreachable) is kept
// and resent; meanwhile an operator settled the work with other figures.
// The resend gets ALREADY_SETTLED: the receipt leaves PendingUnknown,
// PendingRefused counts it and WithRefusedReceipts gets it with the
// error. (It used to stay pending, resent no more, until the limit
// dropped it as "still USAGE_UNKNOWN".)
func TestResendDropsAReceiptSettledByAnotherSettle(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var refused refusals
	c := l.viaProxy(t, append(resendTestOptions, refused.option())...)
	receipt := runWithSettleUnsent(t, l, c, Units{"tokens": 40})
	if p := c.PendingUnknown(); len(p) != 1 || p[0].Actual["tokens"] != 40 {
		t.Fatalf("pending %+v, want the unsent settle", p)
	}
	if _, err := l.direct.Settle(context.Background(), receipt.ReservationID, receipt.OperationID, Units{"tokens": 70, "requests": 0}); err != nil {
		t.Fatal(err)
	}
	l.proxy.SetFaults(faultsNone)
	waitResendsDone(c)

	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after the resend got a final answer: %+v", p)
	}
	receipts, errs := refused.get()
	if c.PendingRefused() != 1 || len(receipts) != 1 || receipts[0].ReservationID != receipt.ReservationID ||
		receipts[0].OperationID != receipt.OperationID || receipts[0].Actual["tokens"] != 40 {
		t.Fatalf("refused %d %+v, want the receipt with its 40 tokens", c.PendingRefused(), receipts)
	}
	if !errors.Is(errs[0], ErrReceiptRefused) || !errors.Is(errs[0], ErrAlreadySettled) {
		t.Fatalf("reported error %v", errs[0])
	}
	got, err := l.direct.GetReservation(context.Background(), receipt.ReservationID)
	if err != nil || got.GetActualUnits()["tokens"] != 70 {
		t.Fatalf("reservation %v %v, want the operator's 70 tokens", got, err)
	}
	wantNothingHeld(t, l, 70)
}

// Once the ledger binary's retention removed a settled reservation and
// forgot its tombstone (serve --retention and --tombstone-retention of a
// second), it answers RESERVATION_NOT_FOUND: final. A kept settle resent
// then is dropped and reported; a receipt of unknown usage is dropped and
// reported by the background check (which read it settled or, later, not
// found); ResolveUnknown of it then gets ErrReceiptRefused and
// ErrNotFound and reports nothing more.
func TestReceiptsOfForgottenReservationsAreFinal(t *testing.T) {
	ctx := context.Background()
	p := newLedgerProcess(t, t.TempDir(), "--retention", "1s", "--tombstone-retention", "1s", "--retention-interval", "50ms")
	proxy, err := faultproxy.Start(p.addr, faultSeed(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	direct, err := New(p.addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	publishTenantPolicy(t, direct, false)
	var refused refusals
	c, err := New(proxy.Addr(), append(resendTestOptions, refused.option())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}

	// Work of unknown usage, settled by an operator (60 tokens).
	_, err = c.Run(ctx, req, unknownWork)
	unknown := mustErrAs[*UsageUnknownError](t, err).Receipt
	if _, err := direct.Settle(ctx, unknown.ReservationID, unknown.OperationID, Units{"tokens": 60}); err != nil {
		t.Fatal(err)
	}
	// A settle not sent (the ledger unreachable), kept and resent; the
	// operator settles that work too, with the same figures.
	_, err = c.Run(ctx, req, func(ctx context.Context) (Units, error) {
		proxy.SetFaults(faultproxy.Faults{Partition: true})
		for c.Breaker().State != BreakerOpen {
			c.GetReservation(ctx, "rl-anything")
		}
		return Units{"tokens": 40}, nil
	})
	kept := mustErrAs[*UsageUnknownError](t, err).Receipt
	if _, err := direct.Settle(ctx, kept.ReservationID, kept.OperationID, Units{"tokens": 40}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{unknown.ReservationID, kept.ReservationID} {
		for {
			if _, err := direct.GetReservation(ctx, id); err != nil {
				if !errors.Is(err, ErrNotFound) {
					t.Fatal(err)
				}
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	proxy.SetFaults(faultproxy.Faults{})
	waitResendsDone(c)
	receipts, errs := refused.get()
	if c.PendingRefused() != 2 || len(receipts) != 2 {
		t.Fatalf("refused %d %+v %v, want both receipts", c.PendingRefused(), receipts, errs)
	}
	for i, r := range receipts {
		err := errs[i]
		switch r.ReservationID {
		case kept.ReservationID:
			if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrNotFound) {
				t.Fatalf("kept settle reported with %v, want not found", err)
			}
		case unknown.ReservationID:
			if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrAlreadySettled) {
				t.Fatalf("receipt of unknown usage reported with %v, want settled or not found", err)
			}
		default:
			t.Fatalf("reported %+v", r)
		}
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending %+v, want none", p)
	}

	_, err = c.ResolveUnknown(withoutWatchdog(ctx), unknown, Units{"tokens": 60})
	if le := mustErrAs[*LedgerError](t, err); !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrNotFound) || le.Reason != ReasonReservationNotFound {
		t.Fatalf("resolve of a forgotten reservation: %v", err)
	}
	if n := c.PendingRefused(); n != 2 {
		t.Fatalf("PendingRefused %d after ResolveUnknown, want still 2", n)
	}
	if got := availableTokens(t, direct); got != 10_000-100 {
		t.Fatalf("available %d, want %d: the operator's two settles, once each", got, 10_000-100)
	}
}

// Answers that are not final leave the receipt pending: lost answers
// while the ledger is unreachable, 503s and a plain 404 or 429 from a
// proxy in between (no ledger reason), the ledger refusing the usage
// given (invalid_argument: a unit the policy does not have). Then the
// receipt still settles, once.
func TestResolveUnknownKeepsTheReceiptOnAnswersThatAreNotFinal(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	in, inAddr := startIntermediary(t, l.proxy.Addr())
	var refused refusals
	c := newViaIntermediary(t, inAddr, refused.option())
	_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	usage := Units{"tokens": 40, "requests": 0}

	stillPending := func(what string, err error) {
		t.Helper()
		if err == nil || errors.Is(err, ErrReceiptRefused) {
			t.Fatalf("%s: %v, want an error that is not final", what, err)
		}
		if p := c.PendingUnknown(); len(p) != 1 || p[0].ReservationID != receipt.ReservationID {
			t.Fatalf("%s (%v): pending %+v, want the receipt kept", what, err, p)
		}
	}
	l.proxy.SetFaults(faultsPartition)
	_, err = c.ResolveUnknown(ctx, receipt, usage)
	stillPending("the ledger unreachable", err)
	l.proxy.SetFaults(faultsNone)
	in.answerNext("", http.StatusServiceUnavailable, http.StatusServiceUnavailable)
	_, err = c.ResolveUnknown(ctx, receipt, usage)
	stillPending("503s from a proxy", err)
	in.answerNext("", http.StatusNotFound)
	_, err = c.ResolveUnknown(ctx, receipt, usage)
	stillPending("a plain 404 from a proxy", err)
	in.answerNext("5", http.StatusTooManyRequests)
	_, err = c.ResolveUnknown(ctx, receipt, usage)
	stillPending("a 429 from a proxy", err)
	_, err = c.ResolveUnknown(ctx, receipt, Units{"tokens": 40, "requests": 0, "gpu-seconds": 3})
	stillPending("a unit the policy does not have", err)

	res, err := c.ResolveUnknown(ctx, receipt, usage)
	if err != nil || res.Reservation.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("resolve once the ledger answers: %+v %v", res, err)
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after it settled: %+v", p)
	}
	if receipts, _ := refused.get(); len(receipts) != 0 || c.PendingRefused() != 0 {
		t.Fatalf("refused %+v", receipts)
	}
	wantNothingHeld(t, l, 40)
}

// A settle a proxy in between refused (HTTP 429: the ledger never
// answers a settle so) is not applied: Run keeps it. A kept settle whose
// resends get no answer (503s) or a 429 again stays pending and is
// resent until it lands with its usage; nothing is reported refused.
func TestSettlesAProxyRefusedOrLostAreKeptUntilTheyLand(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	in, inAddr := startIntermediary(t, l.addr)
	var refused refusals
	c := newViaIntermediary(t, inAddr, refused.option())
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) {
			// The settle meets a 429; the first resends get 503s (two
			// attempts each) and a 429 again.
			s, busy := http.StatusServiceUnavailable, http.StatusTooManyRequests
			in.answerNext("1", busy, s, s, busy, s, s)
			return Units{"tokens": 40}, nil
		})
	unknown := mustErrAs[*UsageUnknownError](t, err)
	receipt := unknown.Receipt
	if unknown.Marked || !errors.As(err, new(*RejectedError)) {
		t.Fatalf("run: %v (marked %v), want the proxy's 429, not marked", err, unknown.Marked)
	}
	if p := c.PendingUnknown(); len(p) != 1 || p[0].Actual["tokens"] != 40 {
		t.Fatalf("pending %+v, want the refused settle with its usage", p)
	}
	waitResendsDone(c)
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after the resends: %+v", p)
	}
	if receipts, _ := refused.get(); len(receipts) != 0 || c.PendingRefused() != 0 {
		t.Fatalf("refused %+v", receipts)
	}
	got, err := l.direct.GetReservation(context.Background(), receipt.ReservationID)
	if err != nil || got.GetOperationId() != receipt.OperationID || got.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("reservation %v %v, want settled with the 40 tokens resent", got, err)
	}
	l.audit(t)
}

// ResolveUnknown with a receipt of another operation (a gateway that
// mixed up its persisted receipts) is refused for good
// (ErrOperationMismatch), but the receipt kept for the operation that
// did start the reservation stays and still settles it.
func TestResolveUnknownOfAnotherOperationKeepsTheRightReceipt(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t)
	_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	other := receipt
	other.OperationID = NewOperationID()
	_, err = c.ResolveUnknown(ctx, other, Units{"tokens": 30, "requests": 0})
	if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrOperationMismatch) {
		t.Fatalf("resolve with another operation's receipt: %v", err)
	}
	if p := c.PendingUnknown(); len(p) != 1 || p[0].OperationID != receipt.OperationID {
		t.Fatalf("pending %+v, want the receipt of the operation that started it", p)
	}
	if _, err := c.ResolveUnknown(ctx, receipt, Units{"tokens": 40, "requests": 0}); err != nil {
		t.Fatal(err)
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending after it settled: %+v", p)
	}
	l.audit(t)
}

// A Run whose Start answers are lost, on a reservation another request
// (reusing the caller's reservation id) started first under its own
// operation, undoes nothing and keeps nothing: the ledger's answer to
// this operation's zero settle, OPERATION_MISMATCH, is final (this Start
// never landed and never will). It used to keep the receipt pending, for
// good.
func TestAbandonedStartOfAReservationAnotherOperationStartedIsNotKept(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}),
		WithBreaker(BreakerPolicy{Disabled: true}))
	ran := false
	_, err := c.run(ctx, ReserveRequest{ReservationID: "rl-shared-id", Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { ran = true; return nil, nil },
		func(ctx context.Context, rr *ReserveResult) (func(Units), error) {
			if _, err := l.direct.Start(ctx, rr.ReservationID, "op-the-other"); err != nil {
				return nil, err
			}
			l.proxy.DropNextResponses(2) // this Run's two Start attempts
			return func(Units) {}, nil
		})
	mustErrAs[*LostError](t, err)
	if ran {
		t.Fatal("the work ran")
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending %+v, want none: nothing of this operation is held", p)
	}
	got, err := l.direct.GetReservation(ctx, "rl-shared-id")
	if err != nil || got.GetOperationId() != "op-the-other" || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_STARTED) {
		t.Fatalf("reservation %v %v, want still started by the other operation", got, err)
	}
}

// A Run whose settle answers are lost while an operator settles the same
// operation with another usage learns it from MarkUsageUnknown's
// ALREADY_SETTLED: an error matching ErrReceiptRefused and
// ErrAlreadySettled, nothing kept. It used to report success, as if its
// own lost settle had landed.
func TestRunWhoseLostSettleWasOvertakenIsRefused(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var mu sync.Mutex
	var receipt OperationReceipt
	lose := 0 // settle requests still to answer 503, after the operator's settle
	forward := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: l.addr})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		overtake := strings.HasSuffix(r.URL.Path, "/Settle") && lose > 0
		if overtake {
			lose--
		}
		first, rcpt := lose == 1, receipt
		mu.Unlock()
		if !overtake {
			forward.ServeHTTP(w, r)
			return
		}
		if first {
			if _, err := l.direct.Settle(ctx, rcpt.ReservationID, rcpt.OperationID, Units{"tokens": 70, "requests": 0}); err != nil {
				t.Error(err)
			}
		}
		http.Error(w, "upstream gone", http.StatusServiceUnavailable)
	}))
	t.Cleanup(front.Close)
	c, err := New(strings.TrimPrefix(front.URL, "http://"), noBreakerWatchdog,
		WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(ctx context.Context) (Units, error) {
			r, _ := ReceiptFrom(ctx)
			mu.Lock()
			receipt, lose = r, 2
			mu.Unlock()
			return Units{"tokens": 40}, nil
		})
	if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("run: %v, want refused: another usage is recorded", err)
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending %+v", p)
	}
	got, err := l.direct.GetReservation(ctx, receipt.ReservationID)
	if err != nil || got.GetActualUnits()["tokens"] != 70 {
		t.Fatalf("reservation %v %v, want the operator's 70 tokens", got, err)
	}
	l.audit(t)
}

// runWithSettleUnsent runs a Run of 100 tokens of tenant-7/chat.generate
// on c (a Client through l's proxy) whose work cuts the ledger off and
// waits for c's breaker to open before it reports usage, so the settle
// is not sent; it wants a *UsageUnknownError and returns its receipt.
func runWithSettleUnsent(t *testing.T, l *testLedger, c *Client, usage Units) OperationReceipt {
	t.Helper()
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(ctx context.Context) (Units, error) {
			l.proxy.SetFaults(faultsPartition)
			for c.Breaker().State != BreakerOpen {
				c.GetReservation(ctx, "rl-anything")
			}
			return usage, nil
		})
	return mustErrAs[*UsageUnknownError](t, err).Receipt
}

// newViaIntermediary returns a Client of addr (an intermediary's) that
// waits a second for an answer, tries a call twice and has no breaker,
// closed at cleanup.
func newViaIntermediary(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	c, err := New(addr, append([]Option{WithTimeout(time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}),
		WithBreaker(BreakerPolicy{Disabled: true})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
