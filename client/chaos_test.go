package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
)

// belief is what the client side knows about one reservation id.
type belief struct {
	estimate int64
	// settled: the client knows the final usage.
	settled bool
	actual  int64
	// outcome of the Run, for the report.
	outcome string
	// kept is the usage of a settle the Client kept to resend itself
	// (its answer lost, or not applied); nil otherwise.
	kept Units
}

// TestChaosNoDoubleDebitAndEveryLostAnswerConverges runs concurrent Run
// calls through a proxy that loses, tears and delays answers and requests,
// and cancels some callers while their work runs. Afterwards, with the
// network healed and the unknowns resolved from their receipts, it checks
// the ledger against what the client believes: every id ends in a terminal
// state (or was never admitted), every settled reservation carries the usage
// the client reported, the account's spent equals the client's sum and
// nothing stays reserved, no cancelled started request was refunded, and the
// audit finds zero discrepancies.
func TestChaosNoDoubleDebitAndEveryLostAnswerConverges(t *testing.T) {
	for _, p := range []Protocol{ProtocolConnect, ProtocolGRPC} {
		t.Run(p.String(), func(t *testing.T) { runChaos(t, p) })
	}
}

func runChaos(t *testing.T, protocol Protocol) {
	const (
		workers   = 8
		perWorker = 20
		estimate  = 100
	)
	l := startLedger(t)
	// A short hold TTL lets reservations whose answer stayed unknown come
	// back through expiry within the test.
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 1 << 40, holdTTL: time.Second})
	c := l.viaProxy(t, WithProtocol(protocol), WithTimeout(300*time.Millisecond),
		WithRetryPolicy(RetryPolicy{MaxAttempts: 3, BaseDelay: 2 * time.Millisecond, MaxDelay: 20 * time.Millisecond}))
	l.proxy.SetFaults(faultproxy.Faults{
		DropResponse: 0.08, TruncateResponse: 0.04, DropRequest: 0.04,
		Delay: 3 * time.Millisecond, DelayProbability: 0.05,
	})

	var mu sync.Mutex
	beliefs := map[string]*belief{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perWorker; i++ {
				id := NewReservationID()
				b := &belief{estimate: estimate}
				mu.Lock()
				beliefs[id] = b
				mu.Unlock()
				actual := rng.Int64N(estimate + 1)
				cancelMidWork := i%5 == 4
				ctx, cancel := context.WithCancel(context.Background())
				res, err := c.Run(ctx, ReserveRequest{ReservationID: id, Subject: "tenant-7", Route: "chat.generate",
					Units: Units{"tokens": estimate, "requests": 1}, BodyHash: fmt.Sprintf("w%d-%d", w, i)},
					func(ctx context.Context) (Units, error) {
						if cancelMidWork {
							cancel() // the caller gives up; the backend keeps going
							return nil, ctx.Err()
						}
						return Units{"tokens": actual, "requests": 1}, nil
					})
				cancel()
				mu.Lock()
				var unknown *UsageUnknownError
				switch {
				case err == nil:
					b.settled, b.actual, b.outcome = true, res.Reservation.GetActualUnits()["tokens"], "settled"
					if b.actual != actual {
						t.Errorf("%s settled with %d, work reported %d", id, b.actual, actual)
					}
				case errors.As(err, &unknown):
					b.outcome, b.kept = "usage-unknown", unknown.Receipt.Actual
				default:
					var lost *LostError
					var resUnknown *ReservationUnknownError
					switch {
					case errors.As(err, &resUnknown):
						b.outcome = "reservation-unknown"
					case errors.As(err, &lost):
						b.outcome = "not run: " + lost.Op + " answer lost"
					case errors.Is(err, ErrExpired) || strings.Contains(err.Error(), "EXPIRED"):
						// Retries outlasted the hold TTL (slow under -race).
						b.outcome = "not run: expired before start"
					default:
						b.outcome = "not run: other"
						t.Logf("%s: %v", id, err)
					}
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	st := l.proxy.Stats()
	l.proxy.SetFaults(faultproxy.Faults{})
	if st.Faulted() < 20 {
		t.Fatalf("only %d faults injected (%+v): the test did not test anything", st.Faulted(), st)
	}

	ctx := context.Background()
	// The Client resends the settles it kept (usage known: lost or not
	// applied) by itself once the ledger answers; wait for them to land.
	for {
		resending := 0
		for _, r := range c.PendingUnknown() {
			if r.Actual != nil {
				resending++
			}
		}
		if resending == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	for _, b := range beliefs {
		if b.kept != nil {
			b.settled, b.actual = true, b.kept["tokens"]
		}
	}
	mu.Unlock()
	// Work whose usage is unknown was not refunded: each pending receipt's
	// reservation is still held (USAGE_UNKNOWN or STARTED), or was settled
	// by a settle whose answer was lost (then it carries the reported usage).
	pending := c.PendingUnknown()
	var heldByPending int64
	for _, r := range pending {
		got, err := l.direct.GetReservation(ctx, r.ReservationID)
		if err != nil {
			t.Fatalf("pending %s: %v", r.ReservationID, err)
		}
		switch got.GetState() {
		case ledgerv1.ReservationState_RESERVATION_STATE_USAGE_UNKNOWN, ledgerv1.ReservationState_RESERVATION_STATE_STARTED:
			heldByPending += got.GetReservedUnits()["tokens"]
		case ledgerv1.ReservationState_RESERVATION_STATE_SETTLED:
			if r.Actual == nil {
				t.Errorf("%s with unknown usage is SETTLED before resolution: refunded on cancellation", r.ReservationID)
			}
		case ledgerv1.ReservationState_RESERVATION_STATE_RESERVED, ledgerv1.ReservationState_RESERVATION_STATE_RELEASED,
			ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED:
			// An abandoned start's receipt says "used nothing" of
			// every reserved unit (a settle must name them all).
			if r.Actual == nil || !usedNothing(r.Actual) {
				t.Errorf("%s is %s but its receipt is not an abandoned start", r.ReservationID, got.GetState())
			}
		default:
			t.Errorf("pending %s is %s", r.ReservationID, got.GetState())
		}
	}
	if b := l.balance(t, "tenant-7", "chat.generate"); b.GetReserved() < heldByPending {
		t.Fatalf("reserved %d < %d held by unknown work: unknown usage was refunded", b.GetReserved(), heldByPending)
	}

	// Resolve every receipt: a lost settle with the usage it reported,
	// unknown usage with the full estimate (what the backend's billing
	// record would say in this test).
	for _, r := range pending {
		actual := Units{"tokens": estimate, "requests": 1}
		if r.Actual != nil {
			actual = r.Actual
		}
		sr, err := c.ResolveUnknown(ctx, r, actual)
		if err != nil {
			t.Fatalf("resolve %s: %v", r.ReservationID, err)
		}
		mu.Lock()
		b := beliefs[r.ReservationID]
		b.settled, b.actual = true, sr.Reservation.GetActualUnits()["tokens"]
		if isState(sr.Reservation, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) && b.actual != actual["tokens"] {
			t.Errorf("%s resolved with %d, settled %d", r.ReservationID, actual["tokens"], b.actual)
		}
		mu.Unlock()
	}
	if left := c.PendingUnknown(); len(left) != 0 {
		t.Fatalf("%d receipts left after resolution", len(left))
	}

	// Every id converges to a terminal state (reservations whose answer
	// stayed unknown expire after the hold TTL), or was never admitted.
	terminal := map[ledgerv1.ReservationState]bool{
		ledgerv1.ReservationState_RESERVATION_STATE_SETTLED:           true,
		ledgerv1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT: true,
		ledgerv1.ReservationState_RESERVATION_STATE_RELEASED:          true,
		ledgerv1.ReservationState_RESERVATION_STATE_EXPIRED:           true,
	}
	deadline := time.Now().Add(20 * time.Second)
	var wantSpent, settledCount, neverAdmitted, endedUnstarted int
	outcomes := map[string]int{}
	for id, b := range beliefs {
		outcomes[b.outcome]++
		for {
			got, err := l.direct.GetReservation(ctx, id)
			if errors.Is(err, ErrNotFound) {
				neverAdmitted++
				if b.settled {
					t.Errorf("%s: client believes it settled, ledger has no such id", id)
				}
				break
			}
			if err != nil {
				t.Fatalf("get %s: %v", id, err)
			}
			if terminal[got.GetState()] {
				spent := got.GetActualUnits()["tokens"]
				if isState(got, ledgerv1.ReservationState_RESERVATION_STATE_SETTLED) {
					settledCount++
					// A run whose Start answer was lost never calls its work;
					// if the Start did land, the SDK settles zero usage.
					if (b.settled && spent != b.actual) || (!b.settled && spent != 0) {
						t.Errorf("%s: ledger settled %d, client believes settled=%v actual=%d (%s)", id, spent, b.settled, b.actual, b.outcome)
					}
					wantSpent += int(spent)
				} else {
					endedUnstarted++
					if b.settled && b.actual != 0 {
						t.Errorf("%s: ledger says %s, client believes it spent %d", id, got.GetState(), b.actual)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s is still %s long after the network healed (%s)", id, got.GetState(), b.outcome)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	b := l.balance(t, "tenant-7", "chat.generate")
	if b.GetSpent() != int64(wantSpent) || b.GetReserved() != 0 {
		t.Fatalf("account spent %d reserved %d; the client believes spent %d reserved 0", b.GetSpent(), b.GetReserved(), wantSpent)
	}
	l.audit(t)
	t.Logf("%d runs: outcomes %v; %d settled, %d ended unstarted, %d never admitted; %d receipts resolved; proxy %+v",
		len(beliefs), outcomes, settledCount, endedUnstarted, neverAdmitted, len(pending), st)
}

// usedNothing reports whether every unit of actual is zero.
func usedNothing(actual Units) bool {
	for _, v := range actual {
		if v != 0 {
			return false
		}
	}
	return true
}
