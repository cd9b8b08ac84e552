package client

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
)

// resendTestOptions open the breaker on the first call that times out
// during a partition (1 s), and never sooner: no watchdog (DetectTimeout
// is the call timeout), so a slow answer before the partition on a loaded
// machine does not open it (with a 50 ms DetectTimeout a Reserve under
// -race beside two busy loops did). Probes are quick once the ledger is
// back.
var resendTestOptions = []Option{WithTimeout(time.Second),
	WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}),
	WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: time.Second, ProbeBase: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond})}

// A settle refused without being sent (the breaker opened while the work
// ran) is not applied: its usage must not be lost. Run keeps the receipt
// (PendingUnknown, with the usage) and resends the settle with the same
// ids once the ledger is reachable; then the reservation is SETTLED with
// that usage and the receipt is gone.
func TestSettleNotAppliedIsKeptAndResent(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, resendTestOptions...)
	_, err := c.Run(context.Background(), ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
		func(ctx context.Context) (Units, error) {
			// The ledger goes away while the work runs; the breaker opens.
			l.proxy.SetFaults(faultsPartition)
			for c.Breaker().State != BreakerOpen {
				c.GetReservation(ctx, "rl-anything")
			}
			return Units{"tokens": 40}, nil
		})
	unknown := mustErrAs[*UsageUnknownError](t, err)
	if !errors.Is(err, ErrLedgerUnreachable) || unknown.Receipt.Actual["tokens"] != 40 {
		t.Fatalf("run: %v (receipt %+v)", err, unknown.Receipt)
	}
	if p := c.PendingUnknown(); len(p) != 1 || p[0].ReservationID != unknown.Receipt.ReservationID || p[0].Actual["tokens"] != 40 {
		t.Fatalf("pending %+v, want the unsettled receipt with its usage", p)
	}
	got, err := l.direct.GetReservation(context.Background(), unknown.Receipt.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_STARTED) {
		t.Fatalf("while the ledger is unreachable: %v %v", got, err)
	}
	l.proxy.SetFaults(faultsNone)
	for len(c.PendingUnknown()) != 0 {
		time.Sleep(10 * time.Millisecond)
	}
	got, err = l.direct.GetReservation(context.Background(), unknown.Receipt.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetOperationId() != unknown.Receipt.OperationID {
		t.Fatalf("after the ledger came back: %v %v", got, err)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetSpent() != 40 || b.GetReserved() != 0 {
		t.Fatalf("spent %d reserved %d, want 40 and 0", b.GetSpent(), b.GetReserved())
	}
	l.audit(t)
}

// During an outage every settle not applied is kept, and the Client
// resends them with one loop, at most resendParallel at a time, not with a
// goroutine each; once the ledger is back they all land with their usage
// and the loop ends.
func TestKeptSettlesAreResentByOneBoundedLoop(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1_000_000})
	// 40 reserves at once under -race on a loaded machine took more than
	// resendTestOptions' 1 s twice (RESERVATION_UNKNOWN before the outage):
	// here a call waits 5 s, and the breaker opens on the first that times
	// out in the partition, as there.
	c := l.viaProxy(t, append(resendTestOptions, WithTimeout(5*time.Second),
		WithBreaker(BreakerPolicy{FailureThreshold: 1, DetectTimeout: 5 * time.Second, ProbeBase: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond}))...)
	const runs = 40
	ctx := context.Background()
	started := make(chan struct{}, runs)
	finish := make(chan struct{})
	errs := make(chan error, runs)
	for range runs {
		go func() {
			_, err := c.Run(ctx, ReserveRequest{Subject: "tenant-7", Route: "chat.generate", Units: Units{"tokens": 100}},
				func(context.Context) (Units, error) {
					started <- struct{}{}
					<-finish
					return Units{"tokens": 40}, nil
				})
			errs <- err
		}()
	}
	for range runs {
		select {
		case <-started:
		case err := <-errs:
			t.Fatalf("run before the outage: %v", err)
		}
	}
	// The ledger goes away while the work runs; the breaker opens, and
	// every settle is refused unsent.
	l.proxy.SetFaults(faultsPartition)
	for c.Breaker().State != BreakerOpen {
		c.GetReservation(ctx, "rl-anything")
	}
	close(finish)
	for range runs {
		if err := <-errs; !errors.Is(err, ErrLedgerUnreachable) {
			t.Fatalf("run during the outage: %v, want its settle refused by the open breaker", err)
		}
	}
	if p := c.PendingUnknown(); len(p) != runs {
		t.Fatalf("%d receipts kept, want %d", len(p), runs)
	}
	most := resendGoroutines()
	// Back with slow answers, so that rounds of resends overlap the
	// samples.
	faults := faultsNone
	faults.Delay = 5 * time.Millisecond
	l.proxy.SetFaults(faults)
	for len(c.PendingUnknown()) != 0 {
		most = max(most, resendGoroutines())
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("at most %d goroutines resending %d receipts", most, runs)
	if most > 1+resendParallel {
		t.Fatalf("%d goroutines resending %d receipts, want at most the loop and %d", most, runs, resendParallel)
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetSpent() != 40*runs || b.GetReserved() != 0 {
		t.Fatalf("spent %d reserved %d, want %d and 0", b.GetSpent(), b.GetReserved(), 40*runs)
	}
	for resendGoroutines() != 0 {
		time.Sleep(time.Millisecond) // the loop ends once nothing is left
	}
	l.audit(t)
}

// resendGoroutines counts the goroutines running code of resettle.go.
func resendGoroutines() int {
	return len(goroutinesIn("client/resettle.go:"))
}

// goroutinesIn returns the stacks of the goroutines running code of any
// of files (a "dir/name.go:" of their frames).
func goroutinesIn(files ...string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if slices.ContainsFunc(files, func(file string) bool { return strings.Contains(g, file) }) {
			out = append(out, g)
		}
	}
	return out
}

// A lost answer of a call without a reservation id names the call alone:
// "audit: answer lost ...", not "audit : answer lost ...".
func TestLostErrorWithoutIDHasNoStraySpace(t *testing.T) {
	l := startLedger(t)
	c := l.viaProxy(t, WithTimeout(500*time.Millisecond), WithRetryPolicy(RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond}),
		WithBreaker(BreakerPolicy{Disabled: true}))
	l.proxy.DropNextResponses(2)
	_, err := c.Audit(context.Background())
	lost := mustErrAs[*LostError](t, err)
	if got := err.Error(); !strings.HasPrefix(got, "audit: answer lost after 2 attempts: ") {
		t.Fatalf("error %q (%+v)", got, lost)
	}
	if got := (&LostError{Op: "settle", ReservationID: "rl-1", Attempts: 3, Err: errors.New("x")}).Error(); got != "settle rl-1: answer lost after 3 attempts: x" {
		t.Fatalf("with an id: %q", got)
	}
}

// A kept receipt is resent with the usage the work reported when it
// ended, also when the work's map changes afterwards (a gateway that
// reuses its Units maps, say from a pool): Run keeps a copy. It kept the
// work's own map, so the resend settled whatever the map held by then.
func TestKeptSettleIsResentWithTheUsageReportedThen(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	c := l.viaProxy(t, resendTestOptions...)
	usage := Units{"tokens": 40, "requests": 0}
	receipt := runWithSettleUnsent(t, l, c, usage)
	usage["tokens"] = 90 // the gateway reuses its map for the next request
	if p := c.PendingUnknown(); len(p) != 1 || p[0].Actual["tokens"] != 40 {
		t.Fatalf("pending %+v, want the receipt with the 40 tokens reported", p)
	}
	l.proxy.SetFaults(faultsNone)
	for len(c.PendingUnknown()) != 0 {
		time.Sleep(10 * time.Millisecond)
	}
	got, err := l.direct.GetReservation(context.Background(), receipt.ReservationID)
	if err != nil || !isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) || got.GetActualUnits()["tokens"] != 40 {
		t.Fatalf("after the ledger came back: %v %v, want settled with 40 tokens", got, err)
	}
}
