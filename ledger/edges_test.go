package ledger_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The tests of this file pin boundaries and guards of the ledger that the
// broader tests (the model, the scenarios) pass through without deciding:
// each was found by breaking the line it guards and seeing every other
// test still pass.

// Units mapped for an older generation (a server whose policy cache had
// not seen the republish) are refused, naming the generation that decides,
// and nothing is reserved: the older generation may order its dimensions
// otherwise, so the amounts could land in the wrong unit.
func TestReserveOrderedForAnOlderGenerationIsRefused(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	g2 := c.publish(policyOf(tokens(2000, 100)))
	res := c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: "a", RequestDigest: "sha256:a",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region,
		Units: ledger.Amounts{10}, Generation: g1})
	if !errors.Is(res.Err, ledger.ErrInvalidCommand) || res.Generation != g2 {
		t.Fatalf("reserve ordered for generation %d while %d decides: %+v", g1, g2, res)
	}
	if _, ok := c.m.Reservation("a"); ok {
		t.Fatal("the refused reserve left a reservation")
	}
	// Ordered for the generation that decides, the same reserve admits.
	res = c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: "a", RequestDigest: "sha256:a",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region,
		Units: ledger.Amounts{10}, Generation: g2})
	if res.Err != nil || res.Generation != g2 {
		t.Fatalf("reserve ordered for the deciding generation %d: %+v", g2, res)
	}
}

// release ends an unstarted reservation.
func (c *checked) release(id string) ledger.Result {
	c.t.Helper()
	return c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: id})
}

// Debt survives a republish however small: one unit owed on the
// superseded generation moves to the new account, which admits nothing
// until it is repaid (a republished policy must not forget debt).
func TestOneUnitOfDebtMovesWithARepublish(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(100, 0))) // no refill: nothing repays the debt
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	c.must(c.settle("a", 101))
	g2 := c.publish(policyOf(tokens(200, 0)))
	if res := c.reserve("b", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("reserve after a republish with 1 unit owed: %v, want ErrAdmissionFrozen", res.Err)
	}
	if debt := c.account(g2).Balances[0].Debt(); debt != 1 {
		t.Fatalf("the new generation's account owes %d, want 1", debt)
	}
}

// A late overuse of one unit on a superseded generation arrives at the
// current account as debt, which that account's available capacity repays
// at once: the subject is not frozen while it has capacity to cover it.
func TestLateDebtOfOneUnitIsRepaidFromAvailable(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(100, 0)))
	c.must(c.reserve("a", 10))
	c.must(c.start("a"))
	g2 := c.publish(policyOf(tokens(120, 0))) // other terms: a new generation
	c.must(c.reserve("b", 1))                 // moves gen 1's 90 available to gen 2
	c.must(c.settle("a", 11))                 // 1 over the hold on gen 1, which has nothing available
	if debt := c.account(g1).Balances[0].Debt(); debt != 0 {
		t.Fatalf("generation %d kept %d units of debt", g1, debt)
	}
	got := c.account(g2).Balances[0]
	if got.Debt() != 0 || got.Available != 88 {
		t.Fatalf("generation %d: debt %d, available %d; want 0 and 88 (89 minus the unit repaid)", g2, got.Debt(), got.Available)
	}
	c.must(c.reserve("c", 1))
}

// A refund forwarded from a superseded generation fills the current
// account only up to its burst: counting what it holds for outstanding
// reservations, and after repaying its debt. The rest stays behind on the
// superseded account, where nothing is admitted.
func TestForwardedRefundFillsOnlyTheBurstsRoom(t *testing.T) {
	t.Run("counting holds", func(t *testing.T) {
		c := newChecked(t)
		g1 := c.publish(policyOf(tokens(100, 0)))
		c.must(c.reserve("a", 50))
		c.must(c.start("a"))
		g2 := c.publish(policyOf(tokens(60, 0)))
		c.must(c.reserve("c", 10)) // gen 2: 10 moved in (a holds 50 of its 60), 10 held
		c.must(c.settle("a", 0))   // refunds 50 on gen 1; gen 2 has room for 50
		got := c.account(g2).Balances[0]
		if got.Available+got.Reserved != 60 {
			t.Fatalf("generation %d holds %d available + %d reserved, above or below its burst 60", g2, got.Available, got.Reserved)
		}
		if left := c.account(g1).Balances[0].Available; left != 40 {
			t.Fatalf("generation %d kept %d available, want the 40 that did not fit", g1, left)
		}
	})
	t.Run("after repaying debt", func(t *testing.T) {
		c := newChecked(t)
		g1 := c.publish(policyOf(tokens(100, 0)))
		c.must(c.reserve("a", 50))
		c.must(c.start("a"))
		g2 := c.publish(policyOf(tokens(60, 0)))
		c.must(c.reserve("c", 5)) // gen 2: 10 moved in (a holds 50 of its 60)
		c.must(c.reserve("b", 5))
		c.must(c.start("b"))
		c.must(c.settle("b", 15)) // 10 owed on gen 2
		c.must(c.release("c"))    // 5 available beside the debt
		c.must(c.settle("a", 0))  // 90 available on gen 1: 10 repay, 55 fill up to the burst
		got := c.account(g2).Balances[0]
		if got.Debt() != 0 || got.Available != 60 {
			t.Fatalf("generation %d: debt %d, available %d; want 0 and its burst 60", g2, got.Debt(), got.Available)
		}
		if left := c.account(g1).Balances[0].Available; left != 25 {
			t.Fatalf("generation %d kept %d available, want the 25 that did not fit", g1, left)
		}
	})
}

// Refill mints whole intervals and keeps the fraction of one that has
// passed: 1.5 intervals then 0.5 more mint two intervals' worth.
func TestRefillKeepsThePartOfAnIntervalThatPassed(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(100, 10)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	c.must(c.settle("a", 100))
	c.advance(1500 * time.Millisecond)
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g).Key})
	if got := c.account(g).Balances[0].Available; got != 10 {
		t.Fatalf("after 1.5 intervals: %d available, want 10", got)
	}
	c.advance(500 * time.Millisecond)
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g).Key})
	if got := c.account(g).Balances[0].Available; got != 20 {
		t.Fatalf("after 2 intervals: %d available, want 20", got)
	}
}

// One unit owed freezes admission, even while capacity a release gave back
// is available beside it.
func TestOneUnitOfDebtFreezesAdmission(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(100, 10)))
	c.must(c.reserve("a", 60))
	c.must(c.reserve("b", 40))
	c.must(c.start("a"))
	c.must(c.settle("a", 61)) // nothing available: 1 unit owed
	c.must(c.release("b"))    // 40 available beside the debt
	if res := c.reserve("c", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("reserve with 1 unit owed and 40 available: %v, want ErrAdmissionFrozen", res.Err)
	}
}

// An estimate that fits in burst minus what is held can be filled by
// refill: its rejection promises a Retry-After, also when it asks for
// exactly burst minus the holds, and the request fits after it.
func TestEstimateOfExactlyBurstMinusHoldsGetsARetryAfter(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("held", 500))
	c.must(c.reserve("spent", 400))
	c.must(c.start("spent"))
	c.must(c.settle("spent", 400)) // 100 available, 500 held
	res := c.reserve("x", 500)
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.RetryAfter != 4*time.Second {
		t.Fatalf("reserve of burst minus holds: %v, retry-after %v; want ErrInsufficientCapacity after 4s", res.Err, res.RetryAfter)
	}
	c.advance(res.RetryAfter)
	c.must(c.reserve("x", 500))
}

// Usage that takes the debt to exactly maxOverdraft is within the policy;
// one unit more is a breach. (API.md: breach is a settle that exceeded
// maxOverdraft.)
func TestDebtOfExactlyMaxOverdraftIsNoBreach(t *testing.T) {
	for _, tc := range []struct {
		used   ledger.Units
		breach bool
	}{{150, false}, {151, true}} {
		c := newChecked(t)
		c.publish(policyOf(tokens(100, 10))) // maxOverdraft 50
		c.must(c.reserve("a", 100))
		c.must(c.start("a"))
		res := c.must(c.settle("a", tc.used))
		if res.Reservation.State != ledger.StateSettledWithDebt || res.Reservation.Breach != tc.breach {
			t.Errorf("settle of %d against a hold of 100 and maxOverdraft 50: %s, breach %v; want SETTLED_WITH_DEBT, breach %v",
				tc.used, res.Reservation.State, res.Reservation.Breach, tc.breach)
		}
	}
}

// A settle at the execution limit is in time; one after it is a breach
// (API.md: breach is a settle that came after the execution limit).
func TestSettleAfterTheExecutionLimitIsABreach(t *testing.T) {
	for _, tc := range []struct {
		after  time.Duration
		breach bool
	}{{30 * time.Second, false}, {30*time.Second + time.Nanosecond, true}} {
		c := newChecked(t)
		p := policyOf(tokens(100, 10))
		p.HoldTTL, p.ExecutionLimit = time.Minute, 30*time.Second
		c.publish(p)
		c.must(c.reserve("a", 10))
		c.must(c.start("a"))
		c.advance(tc.after)
		res := c.must(c.settle("a", 10))
		if res.Reservation.Breach != tc.breach {
			t.Errorf("settle %v after the start with a 30s execution limit: breach %v, want %v", tc.after, res.Reservation.Breach, tc.breach)
		}
	}
}

// A hold is due for expiry at its ExpiresAt, not a moment later: the claim
// one nanosecond before is ErrReservationNotDue, the claim at ExpiresAt
// takes it.
func TestHoldIsDueAtItsExpiresAt(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(100, 10))) // hold TTL 30s
	res := c.must(c.reserve("a", 10))
	c.advance(res.Reservation.ExpiresAt.Sub(c.now) - time.Nanosecond)
	claim := ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "a", Cause: ledger.CauseHoldExpired}
	if res := c.apply(claim); !errors.Is(res.Err, ledger.ErrReservationNotDue) {
		t.Fatalf("claim 1ns before ExpiresAt: %v, want ErrReservationNotDue", res.Err)
	}
	c.advance(time.Nanosecond)
	if res := c.must(c.apply(claim)); res.Reservation.State != ledger.StateExpiring {
		t.Fatalf("claim at ExpiresAt: %s, want EXPIRING", res.Reservation.State)
	}
}

// Only the account that holds the subject's capacity refills: a Refill of
// a superseded generation's account mints nothing (its successor refills
// for the same time; both minting would hand the period out twice).
func TestSupersededAccountDoesNotRefill(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(100, 10)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	c.publish(policyOf(tokens(200, 10)))
	c.reserve("b", 1)         // rejected (nothing available yet), but switches to gen 2
	c.must(c.settle("a", 20)) // gen 1 refunds 80 and forwards them
	minted := c.account(g1).Balances[0].Minted
	c.advance(5 * time.Second)
	c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g1).Key})
	if got := c.account(g1).Balances[0].Minted; got != minted {
		t.Fatalf("the superseded account minted %d on a refill", got-minted)
	}
}

// Usage a shard's settled receipts report beyond what its unknown work
// leaves of the allocation is charged as debt: the unknown holds stay
// retired, so spent + unknown + reminted never exceed the allocation.
func TestShardOveruseBesideUnknownWorkIsCharged(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	c.must(c.reserve("rest", 900)) // nothing available: the charge becomes debt
	rec := c.must(c.apply(reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{
		{ReservationID: "u", State: ledger.StateStarted, Reserved: ledger.Amounts{40}},
		{ReservationID: "s", State: ledger.StateSettled, Reserved: ledger.Amounts{60}, Actual: ledger.Amounts{80}},
	})))
	s := rec.Shard
	if s.Unknown[0] != 40 || s.Spent[0] != 60 || s.Reminted[0] != 0 || rec.Move == nil || rec.Move.Debt[0] != 20 {
		t.Fatalf("80 used beside 40 unknown of 100: unknown %d, spent %d, reminted %d, move %+v; want 40, 60, 0 and 20 charged",
			s.Unknown[0], s.Spent[0], s.Reminted[0], rec.Move)
	}
	if d := c.account(g).Balances[0].Debt(); d != 20 {
		t.Fatalf("central debt %d, want 20", d)
	}
}

// A later submission that resolves one unknown receipt but still reports
// another as unknown is invalid (not "already reconciled", which tells the
// gateway its submission took effect): nothing of it applies, and the
// terminal receipt sent alone then resolves its hold.
func TestShardSubmissionMixingResolvedAndStillUnknownIsInvalid(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	c.must(c.apply(reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{
		{ReservationID: "u1", State: ledger.StateStarted, Reserved: ledger.Amounts{30}},
		{ReservationID: "u2", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{20}},
	})))
	settled := ledger.ShardReceipt{ReservationID: "u1", State: ledger.StateSettled, Reserved: ledger.Amounts{30}, Actual: ledger.Amounts{10}}
	mixed := c.apply(reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{settled,
		{ReservationID: "u2", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{20}}}))
	if !errors.Is(mixed.Err, ledger.ErrInvalidCommand) || errors.Is(mixed.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("a resolved and a still unknown receipt together: %v, want ErrInvalidCommand", mixed.Err)
	}
	if sh, _ := c.m.Shard("sh-1"); sh.Unknown[0] != 50 {
		t.Fatalf("the refused submission changed the shard: unknown %d, want 50", sh.Unknown[0])
	}
	rec := c.must(c.apply(reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{settled})))
	if rec.Shard.Unknown[0] != 20 || rec.Shard.Reminted[0] != 50+20 {
		t.Fatalf("u1 resolved alone: unknown %d, reminted %d; want 20 and 70", rec.Shard.Unknown[0], rec.Shard.Reminted[0])
	}
}

// A retry under a taken id without a request digest is another request
// (no digest matches the stored one): ErrDigestMismatch with the stored
// receipt, never a replay of it.
func TestReserveRetryWithoutDigestIsADigestMismatch(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(100, 10)))
	c.must(c.reserve("a", 10))
	res := c.apply(ledger.Command{Kind: ledger.KindReserve, ReservationID: "a",
		Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{10}})
	if !errors.Is(res.Err, ledger.ErrDigestMismatch) || res.Replayed || res.Reservation.ID != "a" {
		t.Fatalf("retry of a taken id without a digest: %+v, want ErrDigestMismatch with the stored receipt", res)
	}
}

// A rollback names a generation of its own key, and rolling back the
// active generation falls back to the newest earlier generation of that
// key still live: not another key's, not one rolled back already.
func TestRollbackFallsBackToTheNewestLiveGenerationOfItsKey(t *testing.T) {
	c := newChecked(t)
	other := ledger.PolicyKey{Subject: "tenant-8", Route: testSubject.Route, Region: testSubject.Region}
	g1 := c.publish(policyOf(tokens(100, 10)))
	g2 := c.publish(policyOf(tokens(200, 10)))
	otherPolicy := policyOf(tokens(300, 10))
	otherPolicy.Key = other
	g3 := c.publish(otherPolicy)
	g4 := c.publish(policyOf(tokens(400, 10)))
	if res := c.rollback(testSubject, g3); !errors.Is(res.Err, ledger.ErrPolicyNotFound) {
		t.Fatalf("rollback of %s's generation %d under %s: %v, want ErrPolicyNotFound", other, g3, testSubject, res.Err)
	}
	if p, _ := c.m.Policy(g3); p.RolledBack {
		t.Fatalf("a refused rollback rolled back %s's generation %d", other, g3)
	}
	c.must(c.rollback(testSubject, g2))
	if res := c.must(c.rollback(testSubject, g4)); res.Generation != g1 {
		t.Fatalf("rollback of the active generation %d: %d active, want %d (generation %d is rolled back, %d is %s's)",
			g4, res.Generation, g1, g2, g3, other)
	}
}

// Retention keeps, per account, the usage and the overdraft of what it
// removes, so the audit can still check that the account's debt covers
// its reservations' overdraft after their rows are gone.
func TestRetireKeepsTheOverdraftOfWhatItRemoves(t *testing.T) {
	c := newChecked(t)
	g := c.publish(policyOf(tokens(100, 10)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	c.must(c.settle("a", 130)) // 30 owed
	c.advance(time.Minute)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRetire, ReservationID: "a", Before: c.now}))
	rt, ok := c.m.Retained(c.account(g).Key)
	if !ok || rt.Reservations != 1 || rt.Spent[0] != 130 || rt.Overdraft[0] != 30 {
		t.Fatalf("retained after retiring a settle of 130 against 100 held: %+v, want 1 reservation, 130 spent, 30 overdraft", rt)
	}
}

// A policy may hold a hold TTL and an execution limit up to the longest
// Duration (about 292 years; API.md, Durations), but a store keeps times
// as int64 Unix nanoseconds, which end in 2262: a deadline computed as
// now + 292 years could not be stored, and every Reserve (or Start) under
// such a policy failed as a 503 that no retry could cure. The deadline is
// given as LatestTime instead, which every store keeps and which is as
// unreachable.
func TestDeadlinesBeyondTheStorableRangeAreLatestTime(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(100, 10))
	p.HoldTTL, p.ExecutionLimit = time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	c.publish(p)
	storable := func(what string, at time.Time) {
		t.Helper()
		if !at.Equal(ledger.LatestTime) || !time.Unix(0, at.UnixNano()).Equal(at) {
			t.Fatalf("%s %s: want LatestTime %s, a time int64 Unix nanoseconds hold", what, at, ledger.LatestTime)
		}
	}
	res := c.must(c.reserve("a", 10))
	storable("expiresAt", res.Reservation.ExpiresAt)
	res = c.must(c.start("a"))
	storable("executionDeadline", res.Reservation.ExecutionDeadline)
	if !ledger.LatestTime.Equal(time.Unix(0, math.MaxInt64)) {
		t.Fatalf("LatestTime %s is not the last int64 Unix nanosecond", ledger.LatestTime)
	}
	// Short limits keep now + the limit.
	c2 := newChecked(t)
	p2 := policyOf(tokens(100, 10))
	p2.HoldTTL, p2.ExecutionLimit = time.Minute, time.Hour
	c2.publish(p2)
	res = c2.must(c2.reserve("a", 10))
	if want := c2.now.Add(time.Minute); !res.Reservation.ExpiresAt.Equal(want) {
		t.Fatalf("expiresAt %s, want %s", res.Reservation.ExpiresAt, want)
	}
	res = c2.must(c2.start("a"))
	if want := c2.now.Add(time.Hour); !res.Reservation.ExecutionDeadline.Equal(want) {
		t.Fatalf("executionDeadline %s, want %s", res.Reservation.ExecutionDeadline, want)
	}
}
