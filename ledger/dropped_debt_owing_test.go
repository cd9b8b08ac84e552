package ledger_test

import (
	"errors"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Debt in a dropped unit on two generations at once: the subject's owing
// set (ledger/owing.go). The harness's CheckStep refuses any admission
// while any account of the subject owes, so every test here also proves
// nothing is admitted early.

// imagesDim is a third unit: 2 images of burst, refilling 1 a second.
var imagesDim = ledger.Dimension{Unit: "images", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}

// mustFrozenBy fails unless res is ErrAdmissionFrozen by debt in unit,
// under generation g, retrying after wait.
func mustFrozenBy(t *testing.T, res ledger.Result, unit string, g uint64, wait time.Duration) {
	t.Helper()
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Dimension != unit || res.Generation != g || res.RetryAfter != wait {
		t.Fatalf("refusal: err %v, dimension %q, generation %d, retry after %s; want %v, %s, %d, %s",
			res.Err, res.Dimension, res.Generation, res.RetryAfter, ledger.ErrAdmissionFrozen, unit, g, wait)
	}
}

// twoOwing leaves the subject with two owing accounts: generation g1
// (tokens, requests) owes 3 requests and is current again, g0 (tokens,
// images) owes imagesUsed-2 images, and g2 (tokens only) decides, so
// neither debt can move. Both debts are late: work reserved under g0 and
// g1 settles 10 seconds after the subject switched to g2 (so a refill
// counted from the switch would repay them at once).
func twoOwing(t *testing.T, imagesUsed ledger.Units) (c *checked, g0, g1, g2 uint64) {
	c = newChecked(t)
	g0 = c.publish(policyOf(tokens(1000, 100), imagesDim))
	c.must(c.reserve("a", 10, 1)) // on g0: 1 image held, 1 available
	c.must(c.start("a"))
	g1 = c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("b", 10, 1)) // switches to g1: 1 request held
	c.must(c.start("b"))
	p2 := policyOf(tokens(1000, 100))
	p2.EmergencyMode = true // a shard issuance is refused as frozen, not as disabled
	g2 = c.publish(p2)
	c.must(c.reserve("c", 10))            // switches to g2
	c.advance(10 * time.Second)           // g0 and g1 refill nothing meanwhile
	c.must(c.settle("b", 10, 5))          // late: g1 owes 3 requests and is current again
	c.must(c.settle("a", 10, imagesUsed)) // late: g0 owes images, which neither g1 nor g2 limits
	return c, g0, g1, g2
}

// Late debt in a unit that neither the subject's owing current account
// nor the deciding generation limits keeps the subject frozen after the
// current account is repaid: the account that owes it refills that unit
// (only to repay), and
// the subject switches to the deciding generation once both are repaid;
// the retry-after is the slowest owing account's. Before the owing set, g0's images stayed owed on an account nothing
// refilled, and the subject was admitted once g1's requests were repaid.
func TestDroppedDebtLateDebtWhileAnotherAccountOwes(t *testing.T) {
	c, g0, g1, g2 := twoOwing(t, 6) // 4 images owed
	if d := c.account(g0).Balances[1].Debt(); d != 4 {
		t.Fatalf("generation %d owes %d images, want 4", g0, d)
	}
	// g1 is current; the retry-after is the slowest owing account's.
	mustFrozenBy(t, c.reserve("d", 10), "images", g2, 4*time.Second)
	c.advance(3 * time.Second)
	mustFrozenBy(t, c.reserve("e", 10), "images", g2, time.Second) // g1 repaid, g0 owes 1
	if d := c.account(g1).Balances[1].Debt(); d != 0 {
		t.Fatalf("generation %d owes %d requests, want them repaid", g1, d)
	}
	if res := c.apply(issueCmd("sh-1", "gw-a", 1, 10)); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) || res.Dimension != "images" {
		t.Fatalf("shard issued while images are owed: %v", res.Err)
	}
	c.advance(time.Second)
	if res := c.must(c.reserve("f", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g2)
	}
	old := c.account(g0).Balances[1]
	if old.Debt() != 0 || old.Available != 0 || old.Minted != 4 {
		t.Fatalf("images on generation %d: %+v; want the 4 owed repaid by refill and nothing more minted", g0, old)
	}
}

// Two owing accounts repaid in the other order: g0's image is repaid
// first and leaves the set, g1 (current) keeps the subject frozen until
// its requests are repaid.
func TestDroppedDebtTwoOwingRepaidOtherOrder(t *testing.T) {
	c, g0, _, g2 := twoOwing(t, 3) // 1 image owed
	mustFrozenBy(t, c.reserve("d", 10), "requests", g2, 3*time.Second)
	c.advance(time.Second)
	mustFrozenBy(t, c.reserve("e", 10), "requests", g2, 2*time.Second)
	if d := c.account(g0).Balances[1].Debt(); d != 0 {
		t.Fatalf("generation %d owes %d images after a second, want 0", g0, d)
	}
	c.advance(2 * time.Second)
	if res := c.must(c.reserve("f", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g2)
	}
	if old := c.account(g0).Balances[1]; old.Debt() != 0 || old.Available != 0 || old.Minted != 1 {
		t.Fatalf("images on generation %d: %+v; want the 1 owed repaid and nothing more minted", g0, old)
	}
}

// The Refill worker's Refill of an owing account that is not current
// repays its debt in the dropped unit (and mints nothing beyond it);
// a Refill of the current one then switches the subject.
func TestDroppedDebtRefillRepaysEachOwingAccount(t *testing.T) {
	c, g0, g1, g2 := twoOwing(t, 6)
	c.advance(5 * time.Second)
	c.must(c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g0).Key}))
	if old := c.account(g0).Balances[1]; old.Debt() != 0 || old.Available != 0 || old.Minted != 4 {
		t.Fatalf("images on generation %d after its Refill: %+v; want the 4 owed repaid, nothing more", g0, old)
	}
	c.must(c.apply(ledger.Command{Kind: ledger.KindRefill, Account: c.account(g1).Key}))
	if old := c.account(g1).Balances[1]; old.Debt() != 0 || old.Available != 0 {
		t.Fatalf("requests on generation %d after its Refill: %+v; want the 3 owed repaid, nothing more", g1, old)
	}
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g2)
	}
}

// A rollback of the deciding generation while two accounts owe: g1
// decides again, so its requests are its own debt, and g0's images, which
// g1 does not limit, still freeze the subject (g0 becomes current, its
// retry-after answers). g1's account repays its own debt meanwhile;
// admission resumes on g1 once both are repaid.
func TestDroppedDebtRollbackWhileTwoOwe(t *testing.T) {
	c, g0, g1, g2 := twoOwing(t, 7) // 5 images owed
	c.must(c.rollback(testSubject, g2))
	mustFrozenBy(t, c.reserve("d", 10), "images", g1, 5*time.Second)
	c.advance(3 * time.Second)
	mustFrozenBy(t, c.reserve("e", 10), "images", g1, 2*time.Second)
	if d := c.account(g1).Balances[1].Debt(); d != 0 {
		t.Fatalf("generation %d owes %d requests, want them repaid", g1, d)
	}
	c.advance(2 * time.Second)
	if res := c.must(c.reserve("f", 10)); res.Reservation.Account.Generation != g1 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g1)
	}
	if old := c.account(g0).Balances[1]; old.Debt() != 0 || old.Available != 0 {
		t.Fatalf("images on generation %d: %+v; want the 5 owed repaid, nothing more", g0, old)
	}
}

// A record while frozen that uses a unit the owing current account does
// not limit is charged to the deciding generation's account, and the debt
// it leaves there keeps the subject frozen after a rollback of that
// generation: the rolled-back account refills only to repay it. Before
// the owing set, the rollback left it behind, and g1 admitted once its own
// requests were repaid.
func TestDroppedDebtRecordDebtSurvivesRollback(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("a", 100, 1))
	c.must(c.start("a"))
	c.must(c.settle("a", 100, 5))                           // 3 requests owed on g1
	g2 := c.publish(policyOf(tokens(1000, 100), imagesDim)) // drops requests: frozen
	rec := c.must(c.record("r", 0, 7))                      // 2 images available on g2's account, 5 owed
	if rec.Reservation.Account.Generation != g2 || rec.Reservation.State != ledger.StateSettledWithDebt {
		t.Fatalf("record while frozen: %s on %s; want SETTLED_WITH_DEBT on generation %d", rec.Reservation.State, rec.Reservation.Account, g2)
	}
	// The retry-after counts g2's images debt too (5 s at 1/s): retried
	// when g1's requests are repaid (3 s), the subject would switch to
	// g2 and be refused by the 2 images still owed there.
	mustFrozenBy(t, c.reserve("b", 10), "images", g2, 5*time.Second)
	c.must(c.rollback(testSubject, g2)) // g1 decides again; it does not limit images
	c.advance(3 * time.Second)          // g1's requests are repaid
	mustFrozenBy(t, c.reserve("c", 10), "images", g1, 2*time.Second)
	c.advance(2 * time.Second)
	if res := c.must(c.reserve("d", 10)); res.Reservation.Account.Generation != g1 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g1)
	}
	if rolled := c.account(g2).Balances[1]; rolled.Debt() != 0 || rolled.Available != 0 {
		t.Fatalf("images on rolled-back generation %d: %+v; want the 5 owed repaid, nothing more", g2, rolled)
	}
}

// An owing account whose debt the deciding generation limits, while
// another owes debt it does not: the subject is frozen by the other, and
// the first one's debt moves to the deciding generation's account at
// once (settleOwing), where that account's refill repays it while the
// subject is frozen, so no account is left owing where nothing repays it
// and the retry-after counts it. (Until the fourth review it moved only
// at the switch: the refusal said retry after 3 s, and the retry was
// refused again, frozen by the images the switch had just moved.)
func TestDroppedDebtMemberDebtMovesToTheDecidingAccount(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(policyOf(tokens(1000, 100), imagesDim))
	c.must(c.reserve("a", 10, 1)) // on g0: 1 image held
	c.must(c.start("a"))
	c.publish(policyOf(tokens(1000, 100), requestsDim))
	c.must(c.reserve("b", 10, 1)) // switches to g1: 1 request held
	c.must(c.start("b"))
	g2 := c.publish(policyOf(tokens(1000, 100), imagesDim)) // images again, no requests
	c.must(c.reserve("c", 10))                              // switches to g2: images open at 0 (left behind on g0)
	c.must(c.settle("b", 10, 5))                            // late: g1 owes 3 requests, current again
	c.must(c.settle("a", 10, 6))                            // late: g0 owes 4 images, which g1 does not limit but g2 does
	if d := c.account(g0).Balances[1].Debt(); d != 0 {
		t.Fatalf("generation %d still owes %d images, want them moved to generation %d", g0, d, g2)
	}
	if d := c.account(g2).Balances[1].Debt(); d != 4 {
		t.Fatalf("generation %d owes %d images, want 4", g2, d)
	}
	// g1's 3 requests are repaid at 3 s, g2's 4 images at 4 s: the slower.
	mustFrozenBy(t, c.reserve("d", 10), "images", g2, 4*time.Second)
	c.advance(4 * time.Second)
	if res := c.must(c.reserve("f", 10)); res.Reservation.Account.Generation != g2 {
		t.Fatalf("admitted on %s, want generation %d", res.Reservation.Account, g2)
	}
}
