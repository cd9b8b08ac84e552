package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// docs/CLIENTS.md, section 5: the Client reads the reservations of its
// kept receipts of unknown usage in the background, and drops (and
// reports) those the ledger shows ended; it never settles them.

// getCounter counts the GetReservation calls a Client sends through it
// (the background check is the only caller in these tests), running
// before, when set, before the n-th (from 1) is forwarded.
type getCounter struct {
	n      atomic.Int64
	before func(n int64)
}

func (g *getCounter) hooks() map[string]func() {
	return map[string]func(){getCall: func() {
		n := g.n.Add(1)
		if g.before != nil {
			g.before(n)
		}
	}}
}

// waitNotPending waits until no receipt of ids is in c's PendingUnknown
// (at most a minute: the check backs off to 5 s per receipt).
func waitNotPending(t *testing.T, c *Client, ids ...string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		left := 0
		for _, r := range c.PendingUnknown() {
			for _, id := range ids {
				if r.ReservationID == id {
					left++
				}
			}
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %v still pending: %+v", left, ids, c.PendingUnknown())
		}
	}
}

// resolverLedger starts a ledger whose USAGE_UNKNOWN resolver asks,
// every 100 ms, the operation status endpoint of route chat.generate
// (served from ops, the returned gateway operation store), and returns
// the store, the ledger and a Client of it without a token.
func resolverLedger(t *testing.T) (*FileOperationStore, *ledgerProcess, *Client) {
	t.Helper()
	dir := t.TempDir()
	ops, err := OpenOperationStore(filepath.Join(dir, "ops"))
	if err != nil {
		t.Fatal(err)
	}
	secret := []byte("the-route-secret-0123456789")
	endpoint := httptest.NewServer(OperationStatusHandler(ops, secret))
	t.Cleanup(endpoint.Close)
	if err := os.WriteFile(filepath.Join(dir, "secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(cfg, []byte(`{"interval":"100ms","routes":{"chat.generate":{"statusUrl":"`+endpoint.URL+`","secretFile":"secret"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newLedgerProcess(t, dir, "--resolver-config", cfg)
	direct, err := New(p.addr, noBreakerWatchdog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { direct.Close() })
	return ops, p, direct
}

// The tokens of scopedLedger: an admin token, and a gateway token scoped
// to the subjects last given.
const scopeAdminToken, scopeGatewayToken = "admin-token-0123456789", "gateway-token-0123456789"

// scopedLedger starts a ledger whose tokens file gives the gateway token
// tenant-7 only and publishes the tenant policy with the admin token. It
// returns the ledger, the admin Client and restart, which rewrites the
// gateway token's subjects and restarts the ledger (SIGTERM) to read them.
func scopedLedger(t *testing.T) (*ledgerProcess, *Client, func(subjects string)) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	scope := func(subjects string) {
		t.Helper()
		if err := os.WriteFile(tokens, []byte(scopeAdminToken+" admin ops\n"+scopeGatewayToken+" gateway gw-a subjects="+subjects+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	scope("tenant-7")
	p := newLedgerProcess(t, dir, "--tokens", tokens)
	restart := func(subjects string) {
		t.Helper()
		scope(subjects)
		p.stop(syscall.SIGTERM)
		p.start()
	}
	op, err := New(p.addr, noBreakerWatchdog, WithBearerToken(scopeAdminToken))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Close() })
	publishTenantPolicy(t, op, false)
	return p, op, restart
}

// Three runs leave USAGE_UNKNOWN work. The ledger's resolver settles the
// first (the gateway's record says 70 tokens), an operator settles the
// second with the CLI (55 tokens), nobody knows the third. Without the
// gateway calling anything, the first two leave PendingUnknown, each
// reported once (ErrReceiptRefused, ErrAlreadySettled, the recorded
// settle in the *LedgerError); the third stays, checked again and again.
// ResolveUnknown of the first afterwards still gets the final answer and
// reports nothing more. Nothing was settled by the check.
func TestUnknownReceiptsSettledElsewhereLeavePendingOnTheirOwn(t *testing.T) {
	ctx := context.Background()
	ops, p, direct := resolverLedger(t)
	publishTenantPolicy(t, direct, false)
	var gets getCounter
	var refused refusals
	c, err := New(p.addr, noBreakerWatchdog, WithOperationStore(ops), refused.option(),
		WithHTTPClient(&http.Client{Transport: faultyCalls{next: http.DefaultTransport, before: gets.hooks()}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var receipts [3]OperationReceipt
	for i := range receipts {
		_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
		receipts[i] = mustErrAs[*UsageUnknownError](t, err).Receipt
	}
	byResolver, byOperator, unknown := receipts[0], receipts[1], receipts[2]

	if err := Finish(ctx, ops, byResolver.ReservationID, byResolver.OperationID, Units{"tokens": 70}); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(ledgerBinary(t), "settle", byOperator.ReservationID, "--operation", byOperator.OperationID,
		"--units", "tokens=55", "--addr", "http://"+p.addr).CombinedOutput(); err != nil {
		t.Fatalf("capledger settle: %v\n%s", err, out)
	}
	waitNotPending(t, c, byResolver.ReservationID, byOperator.ReservationID)

	got, errs := refused.get()
	if c.PendingRefused() != 2 || len(got) != 2 {
		t.Fatalf("refused %d %+v, want the two receipts settled elsewhere, once each", c.PendingRefused(), got)
	}
	want := map[string]int64{byResolver.ReservationID: 70, byOperator.ReservationID: 55}
	for i, r := range got {
		le := mustErrAs[*LedgerError](t, errs[i])
		if !errors.Is(errs[i], ErrReceiptRefused) || !errors.Is(errs[i], ErrAlreadySettled) ||
			le.Reservation.GetActualUnits()["tokens"] != want[r.ReservationID] || r.Actual != nil {
			t.Fatalf("reported %+v with %v (recorded %v), want ErrAlreadySettled and %d tokens",
				r, errs[i], le.Reservation.GetActualUnits(), want[r.ReservationID])
		}
		delete(want, r.ReservationID)
	}
	// The third is still USAGE_UNKNOWN: kept through more checks.
	for seen := gets.n.Load(); gets.n.Load() < seen+3; time.Sleep(20 * time.Millisecond) {
	}
	if p := c.PendingUnknown(); len(p) != 1 || p[0].ReservationID != unknown.ReservationID {
		t.Fatalf("pending %+v, want the receipt still USAGE_UNKNOWN", p)
	}
	if r, err := direct.GetReservation(ctx, unknown.ReservationID); err != nil || r.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Fatalf("reservation %v %v, want USAGE_UNKNOWN: the check never settles", r, err)
	}

	_, err = c.ResolveUnknown(ctx, byResolver, Units{"tokens": 90})
	if !errors.Is(err, ErrReceiptRefused) || !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("resolve after the check dropped it: %v", err)
	}
	if n, got := c.PendingRefused(), len(refused.errs); n != 2 || got != 2 {
		t.Fatalf("refused %d reported %d after ResolveUnknown, want still 2", n, got)
	}
	if got := availableTokens(t, direct); got != 10_000-70-55-100 {
		t.Fatalf("available %d, want %d", got, 10_000-70-55-100)
	}
}

// A check whose answers are lost, or are 503s from a proxy in between,
// keeps the receipt even though the reservation has ended (an operator
// settled it before the first check): only the ledger's own answer
// drops it, reported once.
func TestUnknownReceiptCheckKeepsItWithoutTheLedgersAnswer(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	in, inAddr := startIntermediary(t, l.addr)
	var healed atomic.Bool
	var gets getCounter
	var receipt OperationReceipt
	var keptLost, keptUnavailable atomic.Int64 // pending receipts before the 5th and the 9th Get
	var c *Client                              // set before its first Get
	gets.before = func(n int64) {
		switch n {
		case 1: // the first check: the operator settled it just before
			if _, err := l.direct.Settle(ctx, receipt.ReservationID, receipt.OperationID, Units{"tokens": 30, "requests": 0}); err != nil {
				t.Error(err)
			}
		case 5: // two checks (two attempts each) lost: now two get 503s
			keptLost.Store(int64(len(c.PendingUnknown())))
			healed.Store(true)
			in.answerNext("", http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable)
		case 9:
			keptUnavailable.Store(int64(len(c.PendingUnknown())))
		}
	}
	var refused refusals
	c = newViaIntermediary(t, inAddr, refused.option(),
		WithHTTPClient(&http.Client{Transport: faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{getCall: answerLost},
			healed: &healed, before: gets.hooks()}}))
	_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt = mustErrAs[*UsageUnknownError](t, err).Receipt
	waitNotPending(t, c, receipt.ReservationID)

	if keptLost.Load() != 1 || keptUnavailable.Load() != 1 {
		t.Fatalf("pending %d after lost answers and %d after 503s, want the receipt kept (1) through both", keptLost.Load(), keptUnavailable.Load())
	}
	got, errs := refused.get()
	if c.PendingRefused() != 1 || len(got) != 1 || got[0].ReservationID != receipt.ReservationID ||
		!errors.Is(errs[0], ErrReceiptRefused) || !errors.Is(errs[0], ErrAlreadySettled) {
		t.Fatalf("refused %d %+v %v, want the receipt once, already settled", c.PendingRefused(), got, errs)
	}
	wantNothingHeld(t, l, 30)
}

// A Run whose Start answer was lost, and whose token no longer has the
// subject in scope when it undoes the Start (the ledger restarted with
// another tokens file), gets RESERVATION_NOT_FOUND to its release: the
// receipt is not kept, but it is reported (ErrReceiptRefused,
// ErrNotFound), for the landed Start holds its capacity; once the scope
// is back the reported receipt settles it.
func TestAbandonedStartNotFoundIsReported(t *testing.T) {
	ctx := context.Background()
	p, op, restart := scopedLedger(t)
	var refused refusals
	f := faultyCalls{next: http.DefaultTransport, faults: map[string]callFault{startCall: answerLost},
		after: map[string]func(){startCall: func() { restart("tenant-8") }}}
	c, err := New(p.addr, WithBearerToken(scopeGatewayToken), refused.option(), WithHTTPClient(&http.Client{Transport: f}),
		WithTimeout(2*time.Second), WithRetryPolicy(RetryPolicy{MaxAttempts: 1}), WithBreaker(BreakerPolicy{Disabled: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(context.Context) (Units, error) { t.Error("work ran"); return nil, nil })
	mustErrAs[*LostError](t, err)
	if pending := c.PendingUnknown(); len(pending) != 0 {
		t.Fatalf("pending %+v, want none", pending)
	}
	got, errs := refused.get()
	if c.PendingRefused() != 1 || len(got) != 1 || !errors.Is(errs[0], ErrReceiptRefused) || !errors.Is(errs[0], ErrNotFound) {
		t.Fatalf("refused %d %+v %v, want the abandoned start, not found", c.PendingRefused(), got, errs)
	}
	receipt := got[0]
	r, err := op.GetReservation(ctx, receipt.ReservationID)
	if err != nil || r.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_STARTED || r.GetOperationId() != receipt.OperationID {
		t.Fatalf("reservation %v %v, want it started by the reported operation", r, err)
	}

	f.after[startCall] = nil
	restart("tenant-7")
	if _, err := c.ResolveUnknown(ctx, receipt, receipt.Actual); err != nil {
		t.Fatalf("resolve with the scope back: %v", err)
	}
	if got := availableTokens(t, op); got != 10_000 {
		t.Fatalf("available %d, want all back: the work never ran", got)
	}
}

// A ResolveUnknown whose settle landed while the background check read
// the reservation (settled, under the receipt's own operation) gets the
// settle's answer; the check does not drop or report the receipt while
// that call is in flight.
func TestResolveUnknownRacingTheCheckIsNotReported(t *testing.T) {
	ctx := context.Background()
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	var gets getCounter
	var armed atomic.Bool
	var c *Client
	var receipt OperationReceipt
	// Once the settle landed, two more checks read it settled (the
	// second starts after the first is done) before its answer returns,
	// unless a check dropped the receipt.
	after := map[string]func(){settleCall: func() {
		if armed.Load() {
			for seen := gets.n.Load(); gets.n.Load() < seen+2 && c.pending.has(receipt.ReservationID); time.Sleep(5 * time.Millisecond) {
			}
		}
	}}
	var refused refusals
	c, err := New(l.addr, refused.option(), WithBreaker(BreakerPolicy{Disabled: true}),
		WithHTTPClient(&http.Client{Transport: faultyCalls{next: http.DefaultTransport, before: gets.hooks(), after: after}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt = mustErrAs[*UsageUnknownError](t, err).Receipt
	armed.Store(true)
	res, err := c.ResolveUnknown(ctx, receipt, Units{"tokens": 40, "requests": 0})
	if err != nil || res.Reservation.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("resolve: %+v %v", res, err)
	}
	if got, errs := refused.get(); c.PendingRefused() != 0 || len(got) != 0 {
		t.Fatalf("refused %d %+v %v, want none: the caller's own settle", c.PendingRefused(), got, errs)
	}
	if p := c.PendingUnknown(); len(p) != 0 {
		t.Fatalf("pending %+v", p)
	}
	wantNothingHeld(t, l, 40)
}

// The checks of a round are the resendParallel due earliest, and none
// before the time the previous round allows: however many receipts of
// unknown usage are kept, at most resendParallel reads go out per
// resendFirstWait.
func TestPickChecksIsBounded(t *testing.T) {
	now := time.Now()
	var due []*resend
	for i := range 3 * resendParallel {
		due = append(due, &resend{check: true, next: now.Add(-time.Duration((7*i)%(3*resendParallel)+1) * time.Millisecond)})
	}
	picked, later := pickChecks(due, now, now)
	if len(picked) != resendParallel || !later {
		t.Fatalf("picked %d (later %v), want %d and more later", len(picked), later, resendParallel)
	}
	for i, s := range picked {
		if want := now.Add(-time.Duration(3*resendParallel-i) * time.Millisecond); !s.next.Equal(want) {
			t.Fatalf("picked[%d] due %v, want the earliest due first (%v)", i, now.Sub(s.next), now.Sub(want))
		}
	}
	if picked, later := pickChecks(due, now, now.Add(time.Millisecond)); len(picked) != 0 || !later {
		t.Fatalf("picked %d before the round allows it (later %v)", len(picked), later)
	}
	if picked, later := pickChecks(due[:2], now, now); len(picked) != 2 || later {
		t.Fatalf("picked %d of 2 (later %v)", len(picked), later)
	}
}

// The check reads a receipt out of its token's scope as the ledger
// answers it, RESERVATION_NOT_FOUND: final (rule 5), so the receipt
// leaves PendingUnknown and is reported with ErrNotFound, though the
// reservation still holds its capacity, USAGE_UNKNOWN.
func TestUnknownReceiptOutOfScopeIsReportedNotFound(t *testing.T) {
	ctx := context.Background()
	p, op, restart := scopedLedger(t)
	var refused refusals
	c, err := New(p.addr, noBreakerWatchdog, WithBearerToken(scopeGatewayToken), refused.option())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, err = c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}}, unknownWork)
	receipt := mustErrAs[*UsageUnknownError](t, err).Receipt
	restart("tenant-8")
	waitNotPending(t, c, receipt.ReservationID)
	got, errs := refused.get()
	if c.PendingRefused() != 1 || len(got) != 1 || got[0].OperationID != receipt.OperationID ||
		!errors.Is(errs[0], ErrReceiptRefused) || !errors.Is(errs[0], ErrNotFound) {
		t.Fatalf("refused %d %+v %v, want the receipt, not found", c.PendingRefused(), got, errs)
	}
	if r, err := op.GetReservation(ctx, receipt.ReservationID); err != nil || r.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN {
		t.Fatalf("reservation %v %v, want still USAGE_UNKNOWN", r, err)
	}
}

// What the check makes of each reservation it reads for a receipt of
// unknown usage: final (the reason a Settle with the receipt would get)
// or kept (nil).
func TestEndedAnswerOfACheck(t *testing.T) {
	r := OperationReceipt{ReservationID: "rl-1", OperationID: "op-1"}
	for _, tc := range []struct {
		state ledgerv1.ReservationState
		op    string
		want  error // nil: kept
	}{
		{ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, "op-1", nil},
		{ledgerv1.ReservationState_RESERVATION_STATE_STARTED, "op-1", nil},
		{ledgerv1.ReservationState_RESERVATION_STATE_RESERVED, "", nil},
		{ledgerv1.ReservationState_RESERVATION_STATE_EXPIRING, "", nil},
		{ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, "op-1", ErrAlreadySettled},
		{ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT, "op-1", ErrAlreadySettled},
		{ledgerv1.ReservationState_RESERVATION_STATE_SETTLED, "", ErrAlreadySettled}, // a tombstone
		{ledgerv1.ReservationState_RESERVATION_STATE_RELEASED, "", ErrReleased},
		{ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED, "", ErrExpired},
		{ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, "op-2", ErrOperationMismatch},
		{ledgerv1.ReservationState_RESERVATION_STATE_STARTED, "op-2", ErrOperationMismatch},
	} {
		got := endedAnswer(r, &ledgerv1.Reservation{ReservationId: "rl-1", State: tc.state, OperationId: tc.op})
		if (got == nil) != (tc.want == nil) || tc.want != nil && !errors.Is(got, tc.want) {
			t.Errorf("%s under %q: %v, want %v", tc.state, tc.op, got, tc.want)
		}
		var le *LedgerError
		if got != nil && (!errors.As(got, &le) || le.Reservation.GetState() != tc.state) {
			t.Errorf("%s: %v carries no reservation", tc.state, got)
		}
	}
}
