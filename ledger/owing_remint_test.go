package ledger_test

import (
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// Promise (seed gate OVERSPEND; docs/API.md PublishPolicy: the owing
// current account refills "only into the room the new generation's
// account leaves ..., so the subject's capacity refills once";
// remintShard: what a remint lifts past the burst overflows and is
// retired). g1 (tokens) decides and holds the subject's tokens at burst
// (989 available, 11 reserved) after refilling around a 500-token shard.
// A late settle leaves g0 (tokens, images) owing 5 images, so g0 is made
// current. The shard is then reconciled with 10 used: remintShard mints
// the 490 unused into g0, the current account, and checks the overflow
// against g0's balance only (0 + 490 <= 1000), not against what g1's
// account holds (1,000): the subject holds 1,490 on a 1,000 burst. At the
// switch back the 490 do not fit in g1's burst and stay on g0; the
// subject reserves all of g1's 979 available, and a rollback of g1 makes
// g0 decide: with no time passed it admits 400 of its 490 stranded
// tokens (1,400 reserved on a 1,000 burst). Without the late debt the
// remint goes to g1, where the 490 overflow and are retired; with it they
// overflow at g0 the same way, counting what g1's account holds
// (decidingShare). Found by the third review of the owing set.
func TestOwingShardRemintWhileFrozenLeavesRoomForTheDecidingAccount(t *testing.T) {
	c := newChecked(t)
	g0 := c.publish(droppedShardPolicy(tokens(1000, 100), imagesDim))
	c.must(c.reserve("a", 10, 1))
	c.must(c.start("a"))
	g1 := c.publish(droppedShardPolicy(tokens(1000, 100)))
	c.must(c.reserve("c", 10)) // switches to g1
	c.advance(10 * time.Second)
	issueUnits(c, "sh", 500)
	c.advance(10 * time.Second)  // g1 refills around the shard
	c.must(c.reserve("c2", 1))   // g1: 989 available, 11 reserved
	c.must(c.settle("a", 10, 7)) // late: g0 owes 5 images and is made current
	if !isCurrentGen(c, g0) {
		t.Fatalf("generation %d owing images is not current", g0)
	}
	c.must(c.apply(reconcileCmd("sh", "gw-a", []ledger.ShardReceipt{{ReservationID: "x", State: ledger.StateSettled,
		Reserved: ledger.Amounts{10}, Actual: ledger.Amounts{10}}})))
	c.advance(5 * time.Second) // g0's images repaid
	c.must(c.reserve("d", 10)) // switches back to g1
	all := c.account(g1).Balances[0].Available
	c.must(c.reserve("all", all)) // the subject's whole burst is reserved on g1
	c.must(c.rollback(testSubject, g1))
	if res := c.reserve("more", 400); res.Err == nil {
		t.Fatalf("reserved 400 tokens on %s with generation %d's whole burst reserved and no time passed (generation %d tokens %+v after the remint into it while generation %d held the burst)",
			res.Reservation.Account, g1, g0, c.account(g0).Balances[0], g1)
	}
}

// A remint into the owing current account and that account's refill
// leave the same room for the deciding account (decidingShare, burstRoom):
// what it holds available; what it owes in a unit the current account
// refills is the current account's own debt while the subject is frozen
// (intoDeciding), repaid first. g0 (tokens, images) owes images and is
// current with 190 tokens, g1 holding 300 tokens reserved; a record while
// frozen leaves 400 tokens owed on g1's account (it alone limits videos).
// In 3 s g0 refills 300 tokens (490); the debt moves to g0 and takes 400
// of them; the shard's 490 unused tokens then fit: g0 holds 580, one
// bucket's count (1,000 less 10 spent, 10 used on the shard and 400
// recorded, plus 300 refilled), and 580 beside 300 held elsewhere stays
// within its burst of 1,000 (the audit's above_burst). Left on g1, the
// debt gave g0's refill no room (room for it would put g0 at 980 beside
// 300 held, above its burst), and the remint was retired past 700.
func TestOwingShardRemintLeavesNoRoomForTheDecidingAccountsDebt(t *testing.T) {
	videos := ledger.Dimension{Unit: "videos", Burst: 2, RefillUnits: 1, RefillInterval: time.Second, MaxOverdraft: 5}
	c := newChecked(t)
	g0 := c.publish(droppedShardPolicy(tokens(1000, 100), imagesDim))
	c.must(c.reserve("a", 10, 1))
	c.must(c.start("a"))
	g1 := c.publish(droppedShardPolicy(tokens(1000, 100), videos))
	c.must(c.reserve("c", 300)) // switches to g1
	issueUnits(c, "sh", 500)
	c.must(c.settle("a", 10, 7)) // late: g0 owes 5 images and is made current
	if !isCurrentGen(c, g0) {
		t.Fatalf("generation %d owing images is not current", g0)
	}
	c.must(c.record("r", 400, 1)) // videos: charged to g1, which owes 400 tokens
	if debt := c.account(g1).Balances[0].Debt(); debt != 400 {
		t.Fatalf("generation %d owes %d tokens after the record, want 400", g1, debt)
	}
	c.advance(3 * time.Second) // g0 refills 300 tokens; 2 images still owed
	c.must(c.apply(reconcileCmd("sh", "gw-a", []ledger.ShardReceipt{{ReservationID: "x", State: ledger.StateSettled,
		Reserved: ledger.Amounts{10}, Actual: ledger.Amounts{10}}})))
	if !isCurrentGen(c, g0) {
		t.Fatalf("generation %d is not current at the remint", g0)
	}
	tk := c.account(g0).Balances[0]
	if debt := c.account(g1).Balances[0].Debt(); debt != 0 || tk.Debt() != 0 {
		t.Fatalf("tokens owed after 3 s: generation %d %d, generation %d %d; want the 400 moved to the current account and repaid", g1, debt, g0, tk.Debt())
	}
	if tk.Available != 580 || tk.Available+tk.Reserved+c.account(g0).HeldElsewhere[0] > 1000 {
		t.Fatalf("generation %d's tokens after refill and remint: %+v, %d held elsewhere; want 580 available within its burst beside generation %d's 300 held", g0, tk, c.account(g0).HeldElsewhere[0], g1)
	}
}
