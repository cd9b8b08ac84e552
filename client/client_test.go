package client

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/testport"
)

func TestRunLifecycleOverEveryProtocol(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	for _, p := range []Protocol{ProtocolConnect, ProtocolConnectJSON, ProtocolGRPC} {
		t.Run(p.String(), func(t *testing.T) {
			c, err := New(l.addr, WithProtocol(p), noBreakerWatchdog)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			before := l.balance(t, "tenant-7", "chat.generate")
			res, err := c.Run(context.Background(), ReserveRequest{
				Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 600, "requests": 1},
				EstimatorDigest: "sha256:e57", BodyHash: BodyHash([]byte("hello")),
			}, func(ctx context.Context) (Units, error) {
				receipt, ok := ReceiptFrom(ctx)
				if !ok || receipt.OperationID == "" {
					t.Errorf("work runs without a receipt in its context")
				}
				return Units{"tokens": 200, "requests": 1}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			r := res.Reservation
			if !isState(r, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || r.GetActualUnits()["tokens"] != 200 {
				t.Fatalf("reservation after Run: %v", r)
			}
			if r.GetOperationId() != res.Receipt.OperationID || r.GetReservationId() != res.Receipt.ReservationID {
				t.Fatalf("receipt %+v does not match reservation %v", res.Receipt, r)
			}
			if res.Refunded["tokens"] != 400 {
				t.Fatalf("refunded %v, want 400 tokens", res.Refunded)
			}
			after := l.balance(t, "tenant-7", "chat.generate")
			if after.GetSpent()-before.GetSpent() != 200 || after.GetReserved() != before.GetReserved() {
				t.Fatalf("spent %d -> %d, reserved %d -> %d", before.GetSpent(), after.GetSpent(), before.GetReserved(), after.GetReserved())
			}
		})
	}
	l.audit(t)
}

func TestRejectionIsTypedSurfacedAndNotRetried(t *testing.T) {
	l := startLedger(t)
	pol := l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1000, refill: 10, interval: time.Second})
	var sent atomic.Int64
	c, err := New(l.addr, noBreakerWatchdog, WithHTTPClient(&http.Client{Transport: countingTransport{next: http.DefaultTransport, n: &sent}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spent, err := c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 1000}})
	if err != nil {
		t.Fatal(err)
	}
	// Spent, not held: while a hold lasts refill cannot make room (burst
	// caps available + reserved) and no Retry-After is promised.
	if _, err := c.Start(ctx, spent.ReservationID, "op-spent"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, spent.ReservationID, "op-spent", Units{"tokens": 1000, "requests": 0}); err != nil {
		t.Fatal(err)
	}
	sent.Store(0)
	_, err = c.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 500}})
	rej := mustErrAs[*RejectedError](t, err)
	if n := sent.Load(); n != 1 {
		t.Fatalf("a 429 was sent %d times; it must not be retried", n)
	}
	if rej.Dimension != "tokens" || rej.Generation != pol.GetGeneration() || rej.Reason != "INSUFFICIENT_CAPACITY" {
		t.Fatalf("rejection %+v, want dimension tokens, generation %d", rej, pol.GetGeneration())
	}
	// 500 tokens at 10 per second: about 50 seconds, rounded up, never less.
	if rej.RetryAfter < 49*time.Second || rej.RetryAfter > 60*time.Second || rej.RetryAfterSeconds() < 49 {
		t.Fatalf("retry after %s for 500 tokens at 10/s", rej.RetryAfter)
	}
}

func TestReusedIDWithAnotherRequestIsRefused(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	ctx := context.Background()
	first, err := l.direct.Reserve(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil {
		t.Fatal(err)
	}
	// The same id and request again: the same receipt, nothing debited.
	again, err := l.direct.Reserve(ctx, ReserveRequest{ReservationID: first.ReservationID, Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}})
	if err != nil || !again.Replayed || again.Reservation.GetCreatedAt().AsTime() != first.Reservation.GetCreatedAt().AsTime() {
		t.Fatalf("retry of the same request: %+v, %v", again, err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 100 {
		t.Fatalf("reserved %d after a replay, want 100", b.GetReserved())
	}
	// The same id for a changed request is refused.
	_, err = l.direct.Reserve(ctx, ReserveRequest{ReservationID: first.ReservationID, Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 101}})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("changed request under a used id: %v, want ErrDigestMismatch", err)
	}
	_, err = l.direct.Reserve(ctx, ReserveRequest{ReservationID: first.ReservationID, Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}, BodyHash: "sha256:other"})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("changed body under a used id: %v, want ErrDigestMismatch", err)
	}
}

func TestLostReserveAnswerIsRetriedWithTheSameID(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(2*time.Second))
	l.proxy.DropNextResponses(1)
	res, err := c.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 300}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 2 || !res.Replayed || res.Resolved {
		t.Fatalf("want the second attempt to replay the first one's receipt, got attempts %d replayed %v resolved %v", res.Attempts, res.Replayed, res.Resolved)
	}
	if st := l.proxy.Stats(); st.DroppedResponses != 1 {
		t.Fatalf("proxy stats %+v: the fault did not happen", st)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 300 {
		t.Fatalf("reserved %d, want 300 (debited once)", b.GetReserved())
	}
	l.audit(t)
}

func TestReservationUnknownResolvesByLookup(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond}))
	// Every Reserve answer is lost; the lookup after them gets through.
	l.proxy.DropNextResponses(3)
	res, err := c.Reserve(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 300}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Resolved || res.Attempts != 3 || !isState(res.Reservation, ledgerv1.ReservationState_RESERVATION_STATE_RESERVED) {
		t.Fatalf("want RESERVATION_UNKNOWN resolved by lookup, got %+v", res)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 300 {
		t.Fatalf("reserved %d, want 300", b.GetReserved())
	}
}

func TestReservationUnknownInAPartitionKeepsTheID(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, WithTimeout(100*time.Millisecond), WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	l.proxy.SetFaults(faultsPartition)
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 300}}
	_, err := c.Reserve(context.Background(), req)
	unknown := mustErrAs[*ReservationUnknownError](t, err)
	if unknown.ReservationID == "" || unknown.RequestDigest == "" || unknown.Attempts != 2 {
		t.Fatalf("unknown error %+v", unknown)
	}
	// Heal and repeat with the SAME id and digest: admitted exactly once.
	// The repeat must succeed, so it comes from a client (another replica)
	// that waits for its answer longer than 100 ms.
	l.proxy.SetFaults(faultsNone)
	req.ReservationID = unknown.ReservationID
	res, err := l.viaProxy(t).Reserve(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.ReservationID != unknown.ReservationID || res.RequestDigest != unknown.RequestDigest {
		t.Fatalf("repeat used id %s digest %s, want %s %s", res.ReservationID, res.RequestDigest, unknown.ReservationID, unknown.RequestDigest)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() != 300 {
		t.Fatalf("reserved %d, want 300", b.GetReserved())
	}
}

func TestTimedOutStartedWorkIsNotRefunded(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	go func() { <-started; cancel() }()
	_, err := l.direct.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 600}},
		func(ctx context.Context) (Units, error) {
			close(started)
			<-ctx.Done() // the caller gave up; the backend may still be working
			return nil, ctx.Err()
		})
	unknown := mustErrAs[*UsageUnknownError](t, err)
	if !unknown.Marked || !errors.Is(err, context.Canceled) {
		t.Fatalf("unknown error %+v", unknown)
	}
	got, err := l.direct.GetReservation(context.Background(), unknown.Receipt.ReservationID)
	if err != nil {
		t.Fatal(err)
	}
	if !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
		t.Fatalf("state %s, want USAGE_UNKNOWN", got.GetState())
	}
	b := l.balance(t, "tenant-7", "chat.generate")
	if b.GetReserved() != 600 || b.GetAvailable() != 10_000-600 {
		t.Fatalf("cancelled started work was refunded: reserved %d available %d", b.GetReserved(), b.GetAvailable())
	}
	if p := l.direct.PendingUnknown(); len(p) != 1 || p[0].OperationID != unknown.Receipt.OperationID {
		t.Fatalf("pending receipts %+v", p)
	}

	// Only the operation receipt resolves it.
	if _, err := l.direct.ResolveUnknown(context.Background(), OperationReceipt{ReservationID: unknown.Receipt.ReservationID, OperationID: "op-wrong"}, Units{"tokens": 1}); !errors.Is(err, ErrOperationMismatch) {
		t.Fatalf("resolve with a wrong operation id: %v", err)
	}
	sr, err := l.direct.ResolveUnknown(context.Background(), unknown.Receipt, Units{"tokens": 450})
	if err != nil {
		t.Fatal(err)
	}
	if !isState(sr.Reservation, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || sr.Refunded["tokens"] != 150 {
		t.Fatalf("resolved %v refunded %v", sr.Reservation, sr.Refunded)
	}
	if p := l.direct.PendingUnknown(); len(p) != 0 {
		t.Fatalf("receipt still pending after resolution: %+v", p)
	}
	l.audit(t)
}

func TestPanickingWorkIsMarkedUnknownAndRepanics(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the work's panic", p)
			}
		}()
		l.direct.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 70}},
			func(context.Context) (Units, error) { panic("boom") })
	}()
	pending := l.direct.PendingUnknown()
	if len(pending) != 1 {
		t.Fatalf("pending %+v, want the panicked work's receipt", pending)
	}
	got, err := l.direct.GetReservation(context.Background(), pending[0].ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN) {
		t.Fatalf("reservation %v, %v", got, err)
	}
}

func TestWorkReportsUsageOrUnknown(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	req := ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}
	backendErr := errors.New("backend said 500")

	// A failure that reports its usage settles it and passes the error on.
	res, err := l.direct.Run(context.Background(), req, func(context.Context) (Units, error) { return Units{"tokens": 30}, backendErr })
	if !errors.Is(err, backendErr) || res == nil || res.Reservation.GetActualUnits()["tokens"] != 30 {
		t.Fatalf("partial failure: %+v, %v", res, err)
	}
	// ErrUsageUnknown marks the reservation.
	_, err = l.direct.Run(context.Background(), req, func(context.Context) (Units, error) {
		return nil, errors.Join(backendErr, ErrUsageUnknown)
	})
	mustErrAs[*UsageUnknownError](t, err)
	// An inner timeout without usage is unknown too: the backend may have run.
	_, err = l.direct.Run(context.Background(), req, func(context.Context) (Units, error) {
		return nil, context.DeadlineExceeded
	})
	mustErrAs[*UsageUnknownError](t, err)
	if n := len(l.direct.PendingUnknown()); n != 2 {
		t.Fatalf("%d pending receipts, want 2", n)
	}
}

func TestShadowRejectionRunsWithoutReservation(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 100, shadow: true})
	ran := false
	res, err := l.direct.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 500}},
		func(context.Context) (Units, error) { ran = true; return Units{"tokens": 500}, nil })
	if err != nil || !ran || !res.Shadow || res.ShadowRejection == nil || res.ShadowRejection.Dimension != "tokens" {
		t.Fatalf("shadow run: ran %v, %+v, %v", ran, res, err)
	}
}

func TestUnreachableLedgerIsNotAnUnknownReservation(t *testing.T) {
	// A port nothing listens on: connecting is refused.
	addr := testport.Addr(t)
	c, err := New(addr, WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Reserve(context.Background(), ReserveRequest{Subject: "s", Route: "r", Units: Units{"tokens": 1}})
	var unknown *ReservationUnknownError
	if errors.As(err, &unknown) || connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("refused connection: %v (%T), want a plain UNAVAILABLE: nothing was sent", err, err)
	}
}

func TestNewRejectsBadAddresses(t *testing.T) {
	for _, addr := range []string{"", "ftp://x:1", "http://"} {
		if _, err := New(addr); err == nil {
			t.Errorf("New(%q) accepted", addr)
		}
	}
	if _, err := New("127.0.0.1:1", WithTimeout(0)); err == nil {
		t.Error("zero timeout accepted")
	}
	if c, err := New("127.0.0.1:1", WithTLS(nil)); err != nil || c.baseURL != "https://127.0.0.1:1" {
		t.Errorf("TLS without scheme: %v", err)
	}
}

// An empty batch makes no call (the ledger refuses one as
// invalid_argument) and answers no outcomes.
func TestEmptyBatchMakesNoCall(t *testing.T) {
	l := startLedger(t)
	var sent atomic.Int64
	c, err := New(l.addr, noBreakerWatchdog, WithHTTPClient(&http.Client{Transport: countingTransport{next: http.DefaultTransport, n: &sent}}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reserved, err := c.ReserveBatch(context.Background(), nil)
	if err != nil || len(reserved) != 0 {
		t.Fatalf("ReserveBatch of none: %v, %v", reserved, err)
	}
	settled, err := c.SettleBatch(context.Background(), []SettleItem{})
	if err != nil || len(settled) != 0 {
		t.Fatalf("SettleBatch of none: %v, %v", settled, err)
	}
	if n := sent.Load(); n != 0 {
		t.Fatalf("%d calls sent for empty batches", n)
	}
}
