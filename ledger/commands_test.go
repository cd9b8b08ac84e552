package ledger_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

func TestPublishMakesImmutableGenerations(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	again := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policyOf(tokens(1000, 100))})
	if again.Err != nil || !again.Replayed || again.Generation != g1 {
		t.Fatalf("republishing the same terms: %+v", again)
	}
	g2 := c.publish(policyOf(tokens(2000, 100)))
	if g2 != g1+1 {
		t.Fatalf("second generation %d after %d", g2, g1)
	}
	first, _ := c.m.Policy(g1)
	if first.Dimensions[0].Burst != 1000 || first.RolledBack {
		t.Fatalf("generation %d changed: %+v", g1, first)
	}
	bad := policyOf(tokens(1000, 100))
	bad.Dimensions[0].MaxReservation = 2000
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: bad}); !errors.Is(res.Err, ledger.ErrInvalidPolicy) {
		t.Fatalf("publishing max reservation above burst: %+v", res)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy}); !errors.Is(res.Err, ledger.ErrInvalidPolicy) {
		t.Fatalf("publishing nothing: %+v", res)
	}
	if res := c.rollback(testSubject, 99); !errors.Is(res.Err, ledger.ErrPolicyNotFound) {
		t.Fatalf("rollback of a missing generation: %+v", res)
	}
	if res := c.rollback(testSubject, g2); res.Err != nil || res.Generation != g1 {
		t.Fatalf("rollback: %+v", res)
	}
	if res := c.rollback(testSubject, g2); res.Err != nil || !res.Replayed {
		t.Fatalf("second rollback: %+v", res)
	}
	if res := c.rollback(testSubject, g1); res.Err != nil || res.Generation != 0 {
		t.Fatalf("rollback of the last generation: %+v", res)
	}
	if res := c.reserve("a", 1); !errors.Is(res.Err, ledger.ErrNoPolicy) {
		t.Fatalf("reserve with every generation rolled back: %+v", res)
	}
}

// A refused amount is named by its unit, as the caller wrote it (a map of
// unit names), not only by the policy's dimension index.
func TestInvalidUnitsNameTheUnit(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100), ledger.Dimension{Unit: "requests", Burst: 10, MaxReservation: 5,
		RefillUnits: 1, RefillInterval: time.Second}))
	if res := c.reserve("a", 5, -1); !errors.Is(res.Err, ledger.ErrInvalidCommand) ||
		!strings.Contains(res.Err.Error(), `"requests"`) {
		t.Errorf("negative requests: %v, want INVALID_COMMAND naming \"requests\"", res.Err)
	}
	c.must(c.reserve("b", 5, 1))
	c.must(c.start("b"))
	if res := c.settle("b", ledger.MaxUnits+1, 1); !errors.Is(res.Err, ledger.ErrInvalidCommand) ||
		!strings.Contains(res.Err.Error(), `"tokens"`) {
		t.Errorf("settle above MaxUnits: %v, want INVALID_COMMAND naming \"tokens\"", res.Err)
	}
}

// Every way Reserve says no, with what the rejection carries.
func TestReserveRejections(t *testing.T) {
	twoDims := func() *ledger.Policy {
		return policyOf(tokens(1000, 100), ledger.Dimension{Unit: "requests", Burst: 10, MaxReservation: 5,
			RefillUnits: 1, RefillInterval: time.Second})
	}
	base := ledger.Command{Kind: ledger.KindReserve, ReservationID: "x", RequestDigest: "sha256:x",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region}
	with := func(f func(*ledger.Command)) ledger.Command { cmd := base; f(&cmd); return cmd }
	cases := []struct {
		name      string
		setup     func(c *checked)
		cmd       ledger.Command
		err       error
		dimension string
		retry     time.Duration
	}{
		{name: "empty id", cmd: with(func(c *ledger.Command) { c.ReservationID = ""; c.Units = ledger.Amounts{1} }),
			err: ledger.ErrInvalidCommand},
		{name: "missing route", cmd: with(func(c *ledger.Command) { c.Route = ""; c.Units = ledger.Amounts{1} }),
			err: ledger.ErrInvalidCommand},
		{name: "wildcard subject", cmd: with(func(c *ledger.Command) { c.Subject = ledger.AnySubject; c.Units = ledger.Amounts{1} }),
			err: ledger.ErrInvalidCommand},
		{name: "no policy", cmd: with(func(c *ledger.Command) { c.Route = "other"; c.Units = ledger.Amounts{1} }),
			err: ledger.ErrNoPolicy},
		{name: "no units", cmd: base, err: ledger.ErrInvalidCommand},
		{name: "negative units", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{5, -1} }),
			err: ledger.ErrInvalidCommand},
		{name: "undeclared dimension", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{5, 1, 1} }),
			err: ledger.ErrInvalidCommand},
		// Above the per-command cap: larger than any policy allows, so it
		// can never fit (issue 13: it answered INVALID_COMMAND).
		{name: "units beyond MaxUnits", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{ledger.MaxUnits + 1} }),
			err: ledger.ErrReservationTooLarge, dimension: "tokens"},
		{name: "units of 2^63-1", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{math.MaxInt64, 1} }),
			err: ledger.ErrReservationTooLarge, dimension: "tokens"},
		{name: "ordered for another generation", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{1}; c.Generation = 7 }),
			err: ledger.ErrInvalidCommand},
		{name: "too large", cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{1, 6} }),
			err: ledger.ErrReservationTooLarge, dimension: "requests"},
		{name: "insufficient tokens", setup: func(c *checked) {
			c.must(c.reserve("a", 900, 1))
			c.must(c.start("a"))
			c.must(c.settle("a", 900, 1)) // spent, not held: refill can make room
		}, cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{301, 1} }),
			err: ledger.ErrInsufficientCapacity, dimension: "tokens", retry: 3 * time.Second},
		// Held, not spent: burst caps available + reserved, so refill can
		// never make room while the hold lasts: no retry-after.
		{name: "insufficient tokens behind a hold", setup: func(c *checked) { c.must(c.reserve("a", 900, 1)) },
			cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{301, 1} }),
			err: ledger.ErrInsufficientCapacity, dimension: "tokens", retry: 0},
		{name: "insufficient requests", setup: func(c *checked) {
			for _, id := range []string{"a", "b"} {
				c.must(c.reserve(id, 1, 5))
				c.must(c.start(id))
				c.must(c.settle(id, 1, 5))
			}
		},
			cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{1, 2} }),
			err: ledger.ErrInsufficientCapacity, dimension: "requests", retry: 2 * time.Second},
		{name: "frozen by debt", setup: func(c *checked) {
			c.must(c.reserve("a", 100, 1))
			c.must(c.start("a"))
			c.must(c.settle("a", 1250, 1)) // 1150 over: 900 from available, 250 owed
		}, cmd: with(func(c *ledger.Command) { c.Units = ledger.Amounts{50, 1} }),
			err: ledger.ErrAdmissionFrozen, dimension: "tokens", retry: 3 * time.Second}, // 250 + 50 at 100/s
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecked(t)
			g := c.publish(twoDims())
			if tc.setup != nil {
				tc.setup(c)
			}
			res := c.apply(tc.cmd)
			if !errors.Is(res.Err, tc.err) {
				t.Fatalf("got %v, want %v", res.Err, tc.err)
			}
			if res.Rejected() {
				if res.Generation != g || res.Dimension != tc.dimension || res.RetryAfter != tc.retry {
					t.Fatalf("rejection carries generation %d, dimension %q, retry-after %v; want %d, %q, %v",
						res.Generation, res.Dimension, res.RetryAfter, g, tc.dimension, tc.retry)
				}
			}
			if _, found := c.m.Reservation("x"); found {
				t.Fatalf("a rejected reserve wrote a reservation")
			}
			if res.Reservation != (ledger.Reservation{}) {
				t.Fatalf("a rejection carries a receipt: %+v", res.Reservation)
			}
		})
	}
}

// A rejection says nothing about any other subject: two tenants under one
// wildcard policy, one exhausted; the other's rejection and the exhausted
// one's carry only their own numbers.
func TestRejectionNamesNoOtherSubject(t *testing.T) {
	c := newChecked(t)
	p := policyOf(ledger.Dimension{Unit: "tokens", Burst: 1000, RefillUnits: 7, RefillInterval: time.Second, MaxOverdraft: 100})
	p.Key.Subject = ledger.AnySubject
	c.publish(p)
	reserveFor := func(subject, id string, units ledger.Units) ledger.Result {
		return c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: id,
			Subject: subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{units}})
	}
	c.must(reserveFor("tenant-secret", "s1", 100))
	c.must(c.apply(ledger.Command{Kind: ledger.KindStart, ReservationID: "s1", OperationID: "op"}))
	c.must(c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: "s1", OperationID: "op", Units: ledger.Amounts{1123}})) // 23 owed
	frozen := reserveFor("tenant-secret", "s2", 1)
	if !errors.Is(frozen.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("tenant-secret: %+v", frozen)
	}
	c.must(reserveFor("tenant-7", "a", 990))
	c.must(c.apply(ledger.Command{Kind: ledger.KindStart, ReservationID: "a", OperationID: "op"}))
	c.must(c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: "a", OperationID: "op", Units: ledger.Amounts{990}}))
	res := reserveFor("tenant-7", "b", 20)
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("tenant-7: %+v", res)
	}
	for _, r := range []ledger.Result{frozen, res} {
		text := r.Err.Error()
		// Nor the subject's own balance or debt (23 owed): those are for
		// GetAccount (issue 13).
		for _, leak := range []string{"tenant", "1123", "990", "23", "owed"} {
			if strings.Contains(text, leak) {
				t.Errorf("rejection %q mentions %q", text, leak)
			}
		}
	}
	if res.RetryAfter != 2*time.Second { // 10 short at 7 per second
		t.Fatalf("retry-after %v", res.RetryAfter)
	}
}

// Multi-dimension reservations are all-or-nothing.
func TestReserveAllOrNothing(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100), ledger.Dimension{Unit: "requests", Burst: 2}))
	c.must(c.reserve("a", 10, 1))
	c.must(c.reserve("b", 10, 1))
	before := c.account(g).Balances
	if res := c.reserve("c", 10, 1); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.Dimension != "requests" ||
		res.RetryAfter != 0 {
		t.Fatalf("third reserve: %+v", res)
	}
	if c.account(g).Balances != before {
		t.Fatalf("a rejected multi-dimension reserve moved capacity: %+v -> %+v", before, c.account(g).Balances)
	}
	if res := c.reserve("d", 990, 0); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.Dimension != "tokens" {
		t.Fatalf("reserve beyond tokens: %+v", res)
	}
}

// Overuse takes available first, the rest becomes debt and spent; the
// account freezes until refills repay the debt, then refills fill
// available up to the burst.
func TestOveruseDebtAndRefill(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	c.must(c.reserve("b", 200))
	c.must(c.start("a"))
	res := c.must(c.settle("a", 1000)) // 700 over: 500 from available, 200 debt
	if res.Reservation.State != ledger.StateSettledWithDebt || res.Reservation.Overdraft[0] != 200 || res.Reservation.Breach {
		t.Fatalf("settle: %+v", res.Reservation)
	}
	bal := c.account(g).Balances[0]
	if bal.Available != 0 || bal.Spent != 1000 || bal.OverdraftIssued != 200 || bal.Reserved != 200 {
		t.Fatalf("after overuse: %+v", bal)
	}
	if res := c.reserve("c", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.RetryAfter != 3*time.Second {
		t.Fatalf("reserve with debt: %+v", res)
	}
	// A refund while frozen goes to available but does not unfreeze.
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"}))
	if res := c.reserve("c", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.RetryAfter != 2*time.Second {
		t.Fatalf("reserve with debt after a refund: %+v", res)
	}
	c.advance(time.Second) // 100 minted: all repays debt
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g).Key})
	bal = c.account(g).Balances[0]
	if bal.OverdraftRepaid != 100 || bal.Available != 200 || bal.Minted != 100 {
		t.Fatalf("after one second: %+v", bal)
	}
	if res := c.reserve("c", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("reserve with 100 owed: %+v", res)
	}
	c.advance(time.Second)
	c.must(c.reserve("c", 1)) // debt repaid by this reserve's refill: admitted
	c.advance(time.Hour)
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g).Key})
	bal = c.account(g).Balances[0]
	if bal.Available+bal.Reserved != 1000 || bal.Debt() != 0 {
		t.Fatalf("after an hour: %+v, want available + reserved at the burst", bal)
	}
}

// Beyond the max overdraft or after the execution limit the full usage is
// still recorded, as a breach, and the route frozen.
func TestBreachIsRecordedInFull(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 0))
	p.Dimensions[0].MaxOverdraft = 10
	p.ExecutionLimit = time.Minute
	g := c.publish(p)
	c.must(c.reserve("a", 1000))
	c.must(c.start("a"))
	res := c.must(c.settle("a", 5000))
	if !res.Reservation.Breach || res.Reservation.Overdraft[0] != 4000 {
		t.Fatalf("settle past the max overdraft: %+v", res.Reservation)
	}
	a := c.account(g)
	if a.Breaches != 1 || a.Balances[0].Debt() != 4000 || a.Balances[0].Spent != 5000 {
		t.Fatalf("account after the breach: %+v", a)
	}
	if res := c.reserve("b", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.RetryAfter != 0 {
		t.Fatalf("reserve after the breach: %+v (no refill: retry-after 0)", res)
	}

	c2 := newChecked(t)
	g2 := c2.publish(p)
	c2.must(c2.reserve("a", 100))
	c2.must(c2.start("a"))
	c2.advance(2 * time.Minute)
	c2.must(c2.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "a"}))
	res = c2.must(c2.settle("a", 50)) // late, under the hold
	if !res.Reservation.Breach || res.Reservation.State != ledger.StateSettled || res.Refunded[0] != 50 {
		t.Fatalf("settle after the execution limit: %+v", res)
	}
	if c2.account(g2).Breaches != 1 {
		t.Fatalf("breach not counted")
	}
}

// USAGE_UNKNOWN keeps its hold (never counted as unconsumed), cannot be
// released or expired, and only a settle with the operation receipt
// resolves it.
func TestUsageUnknownHoldsUntilReceipt(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 400))
	c.must(c.start("a"))
	c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "a"}))
	c.advance(time.Hour)
	for _, kind := range []ledger.Kind{ledger.KindRelease, ledger.KindExpireClaim, ledger.KindExpire} {
		if res := c.apply(ledger.Command{Kind: kind, ReservationID: "a"}); !errors.Is(res.Err, ledger.ErrReservationAlreadyStarted) {
			t.Fatalf("%s of USAGE_UNKNOWN: %+v", kind, res)
		}
	}
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g).Key})
	if bal := c.account(g).Balances[0]; bal.Reserved != 400 || bal.Available != 600 {
		t.Fatalf("unknown usage released its hold: %+v", bal)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: "a", Units: ledger.Amounts{1}}); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("settle without a receipt: %+v", res)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindSettle, ReservationID: "a", OperationID: "op-forged", Units: ledger.Amounts{1}}); !errors.Is(res.Err, ledger.ErrOperationMismatch) {
		t.Fatalf("settle with another operation: %+v", res)
	}
	res := c.must(c.settle("a", 150))
	if res.Refunded[0] != 250 || res.Reservation.State != ledger.StateSettled {
		t.Fatalf("resolution: %+v", res)
	}
}

// MarkUsageUnknown records when the outcome became unknown, not when the
// work started: the backlog ages from that moment. A replayed mark keeps
// the first time, and the settle that resolves the reservation keeps it,
// like StartedAt.
func TestUsageUnknownRecordsMarkingTime(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	started := c.now
	if res := c.must(c.reserve("b", 100)); !res.Reservation.UnknownAt.IsZero() {
		t.Fatalf("fresh reservation already marked: %+v", res.Reservation)
	}
	c.advance(20 * time.Minute)
	marked := c.now
	res := c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "a"}))
	if !res.Reservation.UnknownAt.Equal(marked) || !res.Reservation.StartedAt.Equal(started) {
		t.Fatalf("marked at %s (started %s): %+v", marked, started, res.Reservation)
	}
	c.advance(time.Minute)
	res = c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "a"}))
	if !res.Replayed || !res.Reservation.UnknownAt.Equal(marked) {
		t.Fatalf("replayed mark moved the time: %+v", res)
	}
	res = c.must(c.settle("a", 60))
	if res.Reservation.State != ledger.StateSettled || !res.Reservation.UnknownAt.Equal(marked) {
		t.Fatalf("settle dropped the marking time: %+v", res.Reservation)
	}
}

// A lost reserve answer (RESERVATION_UNKNOWN on the caller's side) resolves
// by retrying with the original id: the same receipt, no second debit.
func TestReservationUnknownResolvesByID(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100)))
	first := c.must(c.reserve("a", 300))
	for range 3 {
		retry := c.must(c.reserve("a", 300))
		if !retry.Replayed || retry.Reservation != first.Reservation {
			t.Fatalf("retry: %+v", retry)
		}
	}
	if bal := c.account(g).Balances[0]; bal.Reserved != 300 || bal.Available != 700 {
		t.Fatalf("retries debited again: %+v", bal)
	}
}

// Expiry races: a start that wins keeps the reservation from expiry; an
// expiry claim that wins makes the start fail; STARTED never expires.
func TestStartExpiryRace(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 100))
	c.must(c.reserve("b", 100))
	c.advance(31 * time.Second)
	c.must(c.start("a"))
	if res := c.apply(ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "a"}); !errors.Is(res.Err, ledger.ErrReservationAlreadyStarted) {
		t.Fatalf("claim after start: %+v", res)
	}
	c.must(c.apply(ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "b"}))
	if res := c.start("b"); !errors.Is(res.Err, ledger.ErrReservationExpired) {
		t.Fatalf("start after claim: %+v", res)
	}
	res := c.must(c.apply(ledger.Command{Kind: ledger.KindExpire, ReservationID: "b"}))
	if res.Refunded[0] != 100 {
		t.Fatalf("expiry refund: %+v", res)
	}
	if bal := c.account(g).Balances[0]; bal.Reserved != 100 {
		t.Fatalf("after the race: %+v", bal)
	}
}

// Closing an epoch writes a statement; the next epoch opens where it
// closed (the audit checks the chain after every command too).
func TestEpochStatementsChain(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	key := c.account(g).Key
	if res := c.apply(ledger.Command{Kind: ledger.KindCloseEpoch, Account: key}); res.Err != nil || !res.Replayed {
		t.Fatalf("close of the open epoch: %+v", res)
	}
	c.advance(time.Hour)
	c.must(c.apply(ledger.Command{Kind: ledger.KindCloseEpoch, Account: key}))
	c.must(c.start("a"))
	c.must(c.settle("a", 100))
	c.advance(3 * time.Hour)
	c.must(c.reserve("b", 50))
	if len(c.m.Statements) != 2 {
		t.Fatalf("%d statements, want 2", len(c.m.Statements))
	}
	first, second := c.m.Statements[0], c.m.Statements[1]
	if second.Opening != first.Closing || !second.EpochStart.Equal(first.EpochEnd) {
		t.Fatalf("epoch chain broken: %+v then %+v", first, second)
	}
	if first.Closing[0].Reserved != 300 || second.Closing[0].Spent != 100 {
		t.Fatalf("statement contents: %+v / %+v", first.Closing[0], second.Closing[0])
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindCloseEpoch, Account: ledger.AccountKey{Subject: "nobody"}}); !errors.Is(res.Err, ledger.ErrAccountNotFound) {
		t.Fatalf("close of a missing account: %+v", res)
	}
}

// A generation switch moves available and debt once, recorded at both
// ends; a settle on the old generation forwards its refund; drain moves
// what is left; a second drain finds nothing.
func TestGenerationSwitchMovesExactlyOnce(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 300))
	c.must(c.start("a"))
	c.must(c.reserve("b", 100))
	g2 := c.publish(policyOf(tokens(2000, 100)))
	c.must(c.reserve("c", 50)) // the switch: 600 move to g2
	old, current := c.account(g1).Balances[0], c.account(g2).Balances[0]
	if old.Available != 0 || old.RetiredForMove != 600 || current.Minted != 600 || current.Available != 550 {
		t.Fatalf("after the switch: g1 %+v, g2 %+v", old, current)
	}
	c.must(c.settle("a", 100)) // 200 refunded on g1, forwarded to g2
	c.must(c.settle("a", 100)) // replay: nothing forwarded twice
	if bal := c.account(g2).Balances[0]; bal.Available != 750 {
		t.Fatalf("after the forwarded refund: %+v", bal)
	}
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "b"}))
	if bal := c.account(g2).Balances[0]; bal.Available != 850 {
		t.Fatalf("after the forwarded release: %+v", bal)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key}); !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain of an empty account: %+v", res)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g2).Key}); !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain of the current account: %+v", res)
	}
	moves := c.m.Moves()
	if len(moves) != 3 {
		t.Fatalf("%d move receipts, want 3 (switch, two forwards): %+v", len(moves), moves)
	}
}

// Debt follows the subject through a generation switch: the new
// generation's account is frozen until its refills repay it.
func TestDebtSurvivesGenerationSwitch(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 1000))
	c.must(c.start("a"))
	c.must(c.settle("a", 1300)) // 300 owed
	g2 := c.publish(policyOf(tokens(1000, 50)))
	if res := c.reserve("b", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Generation != g2 ||
		res.RetryAfter != 7*time.Second {
		t.Fatalf("reserve after the switch: %+v", res)
	}
	if old := c.account(g1).Balances[0]; old.Debt() != 0 {
		t.Fatalf("old generation still owes: %+v", old)
	}
	if bal := c.account(g2).Balances[0]; bal.Debt() != 300 {
		t.Fatalf("new generation owes %d, want 300", bal.Debt())
	}
	c.advance(6 * time.Second) // 300 minted: the debt is repaid, nothing is available yet
	if res := c.reserve("b", 1); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != time.Second {
		t.Fatalf("reserve with 0 available after 6 s: %+v", res)
	}
	c.advance(time.Second)
	c.must(c.reserve("b", 1))
}

// Shadow mode: a rejection is journaled and answered with Shadow set;
// nothing is reserved and the decision leaves balances alone.
func TestShadowRejection(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(100, 10))
	p.Rollout = ledger.RolloutShadow
	g := c.publish(p)
	c.must(c.reserve("a", 100))
	journaled := len(c.m.Journal)
	before := c.account(g).Balances
	res := c.reserve("b", 10)
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || !res.Shadow || !res.Rejected() {
		t.Fatalf("shadow rejection: %+v", res)
	}
	if len(c.m.Journal) != journaled+1 || c.m.Journal[journaled].ReservationID != "b" {
		t.Fatalf("shadow decision not journaled")
	}
	if c.account(g).Balances != before {
		t.Fatalf("shadow rejection changed balances")
	}
}

// The execution-limit worker's unknown-marking holds only while its cause
// does: STARTED work with a deadline that has passed at apply time. Without
// an execution limit, or before the deadline, it is ErrReservationNotDue and
// nothing changes; an explicit request marks at any time (issue 13).
func TestWorkerUnknownMarkingNeedsAPassedExecutionLimit(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 100))
	c.publish(p)
	c.must(c.reserve("no-limit", 100))
	c.must(c.start("no-limit"))
	c.advance(time.Hour)
	worker := ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "no-limit", Cause: ledger.CauseExecutionLimit}
	if res := c.apply(worker); !errors.Is(res.Err, ledger.ErrReservationNotDue) || res.Reservation.State != ledger.StateStarted {
		t.Fatalf("worker marking without an execution limit: %v %s", res.Err, res.Reservation.State)
	}

	limited := policyOf(tokens(1000, 100))
	limited.ExecutionLimit = time.Minute
	c.publish(limited)
	c.must(c.reserve("limited", 100))
	c.must(c.start("limited"))
	c.advance(59 * time.Second)
	worker.ReservationID = "limited"
	if res := c.apply(worker); !errors.Is(res.Err, ledger.ErrReservationNotDue) {
		t.Fatalf("worker marking before the deadline: %v", res.Err)
	}
	c.advance(time.Second)
	if res := c.must(c.apply(worker)); res.Reservation.State != ledger.StateUsageUnknown {
		t.Fatalf("worker marking at the deadline: %s", res.Reservation.State)
	}
	if res := c.must(c.apply(ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "no-limit"})); res.Reservation.State != ledger.StateUsageUnknown {
		t.Fatalf("explicit marking: %s", res.Reservation.State)
	}
}

// A malformed start or settle is ErrInvalidCommand whatever its id names:
// the command's shape is checked before the reservation's existence or
// state, so a bad retry never reads as "not found" or "already settled".
func TestShapeBeforeState(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("done", 5))
	c.must(c.start("done"))
	c.must(c.settle("done", 3))
	c.must(c.reserve("freed", 5))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "freed"}))
	for _, id := range []string{"unknown", "done", "freed"} {
		for name, units := range map[string]ledger.Units{"negative": -1, "above MaxUnits": ledger.MaxUnits + 1} {
			if res := c.settle(id, units); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
				t.Errorf("settle %s with %s units: %v, want INVALID_COMMAND", id, name, res.Err)
			}
		}
		for _, kind := range []ledger.Kind{ledger.KindStart, ledger.KindSettle} {
			if res := c.apply(ledger.Command{Kind: kind, ReservationID: id, Units: ledger.Amounts{1}}); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
				t.Errorf("%s %s without an operation id: %v, want INVALID_COMMAND", kind, id, res.Err)
			}
		}
	}
}

// Only a subject can be "*": a route or region "*" is refused at publish
// instead of being kept as a literal name no gateway sends, which would
// leave the routes the operator meant without a policy.
func TestPublishRefusesAWildcardRouteOrRegion(t *testing.T) {
	c := newChecked(t)
	for _, tc := range []struct{ route, region, want string }{
		{"*", "global", `route "*" is not a wildcard`},
		{"chat.generate", "*", `region "*" is not a wildcard`},
	} {
		p := policyOf(tokens(1000, 100))
		p.Key.Subject = ledger.AnySubject
		p.Key.Route, p.Key.Region = tc.route, tc.region
		res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
		if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), tc.want) {
			t.Errorf("route %q region %q: %+v, want %s", tc.route, tc.region, res, tc.want)
		}
	}
	p := policyOf(tokens(1000, 100))
	p.Key.Subject = ledger.AnySubject
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); res.Err != nil {
		t.Fatalf("a subject \"*\" policy of a named route: %+v", res)
	}
}

// A policy's accounting epoch is at least ledger.MinEpochLength (1s):
// each epoch in which an account changed closes with a statement kept
// forever, so 1 ms closed one on nearly every command. The ledger refuses
// a shorter one whichever way the policy came (the server refuses it at
// the door too).
func TestPublishRefusesAnEpochUnderASecond(t *testing.T) {
	c := newChecked(t)
	for _, length := range []time.Duration{time.Millisecond, ledger.MinEpochLength - time.Nanosecond} {
		p := policyOf(tokens(1000, 100))
		p.EpochLength = length
		res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
		if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "epochLength "+ledger.DurationText(length)+" is shorter than the minimum 1s") {
			t.Fatalf("epoch length %s: %+v", length, res)
		}
	}
	p := policyOf(tokens(1000, 100))
	p.EpochLength = ledger.MinEpochLength
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); res.Err != nil {
		t.Fatalf("epoch length %s: %+v", ledger.MinEpochLength, res)
	}
}

// A policy's execution limit, when set, is at least
// ledger.MinExecutionLimit (1s), its hold TTL at least ledger.MinHoldTTL
// (100ms), and a dimension's refill interval at least
// ledger.MinRefillInterval (1ms): below them the message names the field
// and the minimum, as the API writes Durations. The minimums themselves
// publish.
func TestPublishRefusesExecutionLimitsAndRefillIntervalsBelowTheMinimum(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 100))
	p.HoldTTL = ledger.MinHoldTTL - time.Millisecond
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "holdTtl 0.099s is shorter than the minimum 0.100s") {
		t.Errorf("hold TTL %s: %+v", p.HoldTTL, res)
	}
	for _, limit := range []time.Duration{time.Nanosecond, ledger.MinExecutionLimit - time.Nanosecond} {
		p := policyOf(tokens(1000, 100))
		p.ExecutionLimit = limit
		res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
		if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "executionLimit "+ledger.DurationText(limit)+" is shorter than the minimum 1s") {
			t.Errorf("execution limit %s: %+v", limit, res)
		}
	}
	for _, interval := range []time.Duration{time.Nanosecond, ledger.MinRefillInterval - time.Nanosecond} {
		d := tokens(1000, 100)
		d.RefillInterval = interval
		res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: policyOf(d)})
		if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "dimensions[0].refillInterval "+ledger.DurationText(interval)+" is shorter than the minimum 0.001s") {
			t.Errorf("refill interval %s: %+v", interval, res)
		}
	}
	d := tokens(1000, 100)
	d.RefillInterval = ledger.MinRefillInterval
	p = policyOf(d)
	p.ExecutionLimit, p.HoldTTL = ledger.MinExecutionLimit, ledger.MinHoldTTL
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); res.Err != nil {
		t.Fatalf("the minimums: %+v", res)
	}
}

// Accounting epochs start at whole multiples of the epoch length counted
// from 0001-01-01T00:00:00Z, a Monday, in UTC (docs/API.md, PublishPolicy):
// not from the Unix epoch (a Thursday) and not from the first command. So
// the 7-day epoch holding Wednesday 2026-12-02 15:04 started on Monday
// 2026-11-30 at 00:00 UTC and closes on Monday 2026-12-07, and a 1-day
// epoch starts at 00:00 UTC, whatever the location of the time given.
func TestEpochsStartAtMultiplesOfTheirLengthFromYearOne(t *testing.T) {
	berlin := time.FixedZone("CET", 3600)
	wednesday := time.Date(2026, 12, 2, 16, 4, 5, 0, berlin) // 15:04:05 UTC
	for _, tc := range []struct {
		length    time.Duration
		start     time.Time
		nextStart time.Time // of the epoch holding wednesday + length
	}{
		{7 * 24 * time.Hour, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)},
		{24 * time.Hour, time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)},
	} {
		c := newChecked(t)
		c.now = wednesday
		p := policyOf(tokens(1000, 100))
		p.EpochLength = tc.length
		c.publish(p)
		res := c.must(c.reserve("a", 10))
		if got := res.Reservation.AccountingEpoch; !got.Equal(tc.start) || got.Location() != time.UTC {
			t.Fatalf("%s epoch holding %s: starts %s, want %s", tc.length, wednesday, got, tc.start)
		}
		c.advance(tc.length)
		res = c.must(c.reserve("b", 10))
		if got := res.Reservation.AccountingEpoch; !got.Equal(tc.nextStart) {
			t.Fatalf("%s epoch holding %s: starts %s, want %s", tc.length, c.now, got, tc.nextStart)
		}
		if n := len(c.m.Statements); n != 1 || !c.m.Statements[0].EpochStart.Equal(tc.start) || !c.m.Statements[0].EpochEnd.Equal(tc.nextStart) {
			t.Fatalf("%s epochs: statements %+v, want one from %s to %s", tc.length, c.m.Statements, tc.start, tc.nextStart)
		}
	}
	if monday := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC); monday.Weekday() != time.Monday || (time.Time{}).Weekday() != time.Monday {
		t.Fatalf("the calendar: %s is a %s, year 1 began on a %s", monday, monday.Weekday(), (time.Time{}).Weekday())
	}
}

// Epochs count from the zero time (year 1), so an epoch length that
// divides the 62,135,596,800 s from there to 1970-01-01 and is longer
// than the years since puts the current epoch's start exactly on the Unix
// epoch, which the stores keep as "no time" (int64 Unix nanoseconds 0):
// every command under such a policy (epochLength "3106779840s", 98
// years) then failed with a 503 no retry cured. No epoch of at most
// MaxEpochLength (50 years) starts there from 2021 on, so publishing refuses
// longer ones; the maximum publishes and admits.
func TestPublishRefusesEpochsLongerThanTheMaximum(t *testing.T) {
	c := newChecked(t)
	for _, length := range []time.Duration{3106779840 * time.Second, ledger.MaxEpochLength + time.Nanosecond, time.Duration(math.MaxInt64)} {
		p := policyOf(tokens(1000, 100))
		p.EpochLength = length
		res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
		if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "epochLength "+ledger.DurationText(length)+" is longer than the maximum 1577880000s (50 years)") {
			t.Errorf("epoch length %s: %+v", length, res)
		}
	}
	// The message speaks the API's Durations, as a client sends them
	// ("3106779840s"), not Go's (862994h24m0s against 438300h0m0s).
	p := policyOf(tokens(1000, 100))
	p.EpochLength = 3106779840 * time.Second
	if want := "epochLength 3106779840s is longer than the maximum 1577880000s (50 years)"; !strings.HasSuffix(c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}).Err.Error(), want) {
		t.Errorf("98 years: want the message to end %q", want)
	}
	if ledger.MaxEpochLength > time.Duration(time.Date(2021, 1, 1, 0, 0, 0, 0, time.UTC).Sub(time.Unix(0, 0))) {
		t.Fatalf("MaxEpochLength %s: an epoch of it could start at the Unix epoch in 2021 or later", ledger.MaxEpochLength)
	}
	p = policyOf(tokens(1000, 100))
	p.EpochLength = ledger.MaxEpochLength
	c.publish(p)
	res := c.must(c.reserve("a", 10))
	if start := res.Reservation.AccountingEpoch; start.UnixNano() == 0 || start.After(c.now) || !c.now.Before(start.Add(ledger.MaxEpochLength)) {
		t.Fatalf("accounting epoch %s for now %s under a %s epoch", start, c.now, ledger.MaxEpochLength)
	}
}

// A publish edited from a generation goes through once that generation is
// active again: a newer one published and rolled back since leaves it
// active, and the edit publishes (OPERATIONS.md, "Editing a live policy").
func TestPublishEditedFromAGenerationActiveAgainAfterARollbackPublishes(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	edited := func(burst ledger.Units, from uint64) ledger.Result { return c.publishEdited(tokens(burst, 100), from) }
	g2 := edited(2000, g1)
	if g2.Err != nil || g2.Replayed {
		t.Fatalf("publish edited from the active generation %d: %+v", g1, g2)
	}
	c.rollback(testSubject, g2.Generation)
	res := edited(3000, g1)
	if res.Err != nil || res.Replayed || res.Generation <= g2.Generation {
		t.Fatalf("publish edited from generation %d, active again after %d was rolled back: %+v, want a new generation", g1, g2.Generation, res)
	}
}

// A publish edited from a generation (Command.Generation) goes through
// only while that generation is the active one of its key: an edit of a
// stale copy does not undo what was published since. Its exact terms
// replay whatever it names, so a retried publish still replays.
func TestPublishEditedFromAStaleGenerationIsRefused(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	edited := func(burst ledger.Units, from uint64) ledger.Result { return c.publishEdited(tokens(burst, 100), from) }
	g2 := edited(2000, g1)
	if g2.Err != nil || g2.Replayed {
		t.Fatalf("publish edited from the active generation %d: %+v", g1, g2)
	}
	if res := edited(3000, g1); !errors.Is(res.Err, ledger.ErrPolicyGenerationChanged) ||
		!strings.Contains(res.Err.Error(), "generation 2 is active now") {
		t.Fatalf("publish edited from generation %d after %d was published: %+v", g1, g2.Generation, res)
	}
	if res := edited(2000, g1); res.Err != nil || !res.Replayed || res.Generation != g2.Generation {
		t.Fatalf("a retry of the publish edited from %d: %+v, want a replay of %d", g1, res, g2.Generation)
	}
	if res := edited(3000, 99); !errors.Is(res.Err, ledger.ErrPolicyGenerationChanged) ||
		!strings.Contains(res.Err.Error(), "generation 99 is no generation of") ||
		!strings.Contains(res.Err.Error(), fmt.Sprintf("generation %d is active", g2.Generation)) {
		t.Fatalf("publish edited from a generation that does not exist: %+v", res)
	}
	c.rollback(testSubject, g2.Generation)
	c.rollback(testSubject, g1)
	if res := edited(3000, g2.Generation); !errors.Is(res.Err, ledger.ErrPolicyGenerationChanged) ||
		!strings.Contains(res.Err.Error(), "no active generation") {
		t.Fatalf("publish edited from a rolled-back generation: %+v", res)
	}
	if res := edited(3000, 0); res.Err != nil || res.Replayed {
		t.Fatalf("publish edited from nothing in particular: %+v", res)
	}
}
