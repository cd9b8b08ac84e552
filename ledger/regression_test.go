package ledger_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// A settle on a superseded generation used to refill that generation's
// account for the time since its last command and forward the minted
// capacity to the current account, which refills over the same time too:
// capacity minted twice for one interval, available above the burst.
func TestSupersededGenerationDoesNotRefill(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 500))
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switches the subject to g2, carrying 500
	c.must(c.start("b"))
	c.must(c.settle("b", 1))
	c.advance(10 * time.Second)
	c.must(c.settle("a", 500)) // on g1: refunds nothing, refills nothing
	old, current := c.account(g1), c.account(g2)
	if got := old.Balances[0].Available + current.Balances[0].Available; got != 1000 {
		t.Fatalf("available after ten seconds is %d over both generations, want the burst 1000 (g1 %+v, g2 %+v)",
			got, old.Balances[0], current.Balances[0])
	}
	if old.Balances[0].Minted != 0 {
		t.Fatalf("superseded generation minted %d", old.Balances[0].Minted)
	}
}

// After a rollback the earlier generation becomes current again; its refill
// cursor must restart then, or it mints for the time the newer generation
// held the capacity (and refilled it) as well.
func TestRollbackDoesNotRefillTheInterimTwice(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 1000))
	c.must(c.start("a"))
	c.must(c.settle("a", 1000)) // available 0 at t0
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	if res := c.reserve("b", 1); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) {
		t.Fatalf("reserve on an empty account: %+v", res)
	}
	c.advance(5 * time.Second)
	c.must(c.reserve("c", 1)) // g2 refills 500 over five seconds
	if res := c.rollback(testSubject, g2); res.Err != nil || res.Generation != g1 {
		t.Fatalf("rollback: %+v", res)
	}
	c.must(c.reserve("d", 1)) // back to g1, carrying g2's 499
	a := c.account(g1)
	if a.Balances[0].Available != 498 {
		t.Fatalf("g1 after the rollback holds %+v, want 498 available (500 minted in five seconds, 2 reserved)", a.Balances[0])
	}
}

// A new generation that limits a unit its predecessor did not opens that
// dimension with a full burst, like the subject's first account does.
func TestNewDimensionOpensWithBurst(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 100))
	g2 := c.publish(policyOf(tokens(1000, 100),
		ledger.Dimension{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Second}))
	res := c.reserve("b", 100, 1)
	if res.Err != nil {
		t.Fatalf("reserve under the new generation: %v", res.Err)
	}
	a := c.account(g2)
	if a.Balances[1].Opening != 10 || a.Balances[1].Available != 9 {
		t.Fatalf("requests dimension %+v, want opening 10 and 9 available", a.Balances[1])
	}
	if a.Balances[0].Opening != 0 || a.Balances[0].Available != 800 {
		t.Fatalf("tokens dimension %+v, want 900 carried over and 100 reserved", a.Balances[0])
	}
}

// A settle on a superseded generation forwards to the current account; the
// current account's refill done on the way must be put back to the book, or a
// store keeps the journal entry without the balance.
func TestForwardPutsTheTarget(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 600))
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	c.publish(p2)
	c.must(c.reserve("b", 400)) // switch, carrying 400, all reserved
	c.advance(3 * time.Second)
	c.must(c.settle("a", 600)) // nothing to forward, but the target refilled 300
}

// Drain that finds nothing to move still closes the elapsed epoch of the
// drained account; the account must be put back with its new epoch, or the
// statement chain breaks in a store.
func TestDrainPutsTheDrainedAccount(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 1000))
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	c.publish(p2)
	c.reserve("b", 1) // switch: nothing to carry
	c.advance(2 * time.Hour)
	res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key})
	if !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain: %+v", res)
	}
}

// Amounts beyond MaxUnits are refused before they can overflow a term.
func TestHugeUnitsAreInvalid(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 10))
	c.must(c.start("a"))
	if res := c.settle("a", ledger.MaxUnits+1); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Fatalf("settle of %d units: %+v", ledger.MaxUnits+1, res)
	}
	p := policyOf(tokens(ledger.MaxUnits+1, 1))
	if res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p}); !errors.Is(res.Err, ledger.ErrInvalidPolicy) {
		t.Fatalf("publish with burst %d: %+v", ledger.MaxUnits+1, res)
	}
	c.must(c.settle("a", ledger.MaxUnits)) // the largest usage is recorded in full
}

// Retry-After is conservative: a rejection lacking capacity in two
// dimensions names the one that refills last.
func TestRetryAfterIsTheSlowestDimension(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 100),
		ledger.Dimension{Unit: "requests", Burst: 10, RefillUnits: 1, RefillInterval: time.Second}))
	c.must(c.reserve("a", 1000, 10))
	c.must(c.start("a"))
	c.must(c.settle("a", 1000, 10)) // spent, not held: refill can make room
	res := c.reserve("b", 100, 5)
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.Dimension != "requests" || res.RetryAfter != 5*time.Second {
		t.Fatalf("rejection %+v, want requests limiting with a 5s retry-after", res)
	}
}

// Overuse settled late on a superseded generation takes the subject's
// available capacity first, as any overuse does: the debt it forwards is
// repaid from the current account's available before anything is frozen.
func TestLateOveruseTakesCurrentAvailableFirst(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 0)))
	c.must(c.reserve("a", 100))
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 0))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switch: 900 carried, 899 left
	c.must(c.settle("a", 300))
	if bal := c.account(g2).Balances[0]; bal.Debt() != 0 || bal.Available != 699 {
		t.Fatalf("current account after a late overuse of 200: %+v, want no debt and 699 available", bal)
	}
	c.must(c.reserve("c", 1))
}

// A generation that becomes current again closes its elapsed epoch before
// capacity moves in, so the statement of the old epoch does not show what
// arrived after it ended.
func TestReactivatedAccountClosesEpochBeforeMove(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 0)))
	c.must(c.reserve("a", 100))
	p2 := policyOf(tokens(1000, 0))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switch to g2 at t0
	c.advance(2 * time.Hour)
	c.rollback(testSubject, g2)
	c.must(c.reserve("c", 1)) // back to g1 at t0+2h
	for _, st := range c.m.Statements {
		if st.Account.Generation == g1 && st.EpochStart.Equal(t0) && st.Closing[0].Minted != 0 {
			t.Fatalf("g1's first epoch closes with %d minted, moved in after it ended", st.Closing[0].Minted)
		}
	}
}

// A refund settled on a superseded generation while the current one has
// refilled meanwhile is forwarded only up to the burst: Burst caps
// available + reserved, and a forwarded refund used to lift the subject to
// twice the burst.
func TestForwardedRefundStaysWithinBurst(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 1000))
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.reserve("b", 1) // switch: nothing to carry
	c.advance(10 * time.Second)
	c.must(c.settle("a", 0)) // 1000 refunded on g1
	current, old := c.account(g2).Balances[0], c.account(g1).Balances[0]
	if current.Available+current.Reserved != 1000 {
		t.Fatalf("current account %+v exceeds the burst of 1000", current)
	}
	if old.Available != 1000 {
		t.Fatalf("superseded account %+v: the refund that did not fit should stay there", old)
	}
	if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key}); !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain into a full account: %+v", res)
	}
	// A smaller burst in a new generation takes effect at the switch.
	p3 := policyOf(tokens(300, 100))
	g3 := c.publish(p3)
	c.must(c.reserve("c", 1))
	if bal := c.account(g3).Balances[0]; bal.Available+bal.Reserved != 300 {
		t.Fatalf("generation with burst 300 holds %+v", bal)
	}
}

// The rest of a Reserve's shape decides before the id is looked up too
// (ledger.ReserveShapeProblem, which the server calls as well): a retry
// without a subject, route or region, for AnySubject, or without a unit
// above 0 is ErrInvalidCommand whether its id exists or not, never its
// receipt or a digest mismatch, and names no generation (no policy is
// read). It used to be checked after the lookup, so the ledger answered a
// malformed retry with its receipt while the server refused it.
func TestReserveShapeIsInvalidBeforeTheLookup(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.reserve("a", 10))
	malformed := map[string]func(*ledger.Command){
		"no subject":      func(cmd *ledger.Command) { cmd.Subject = "" },
		"any subject":     func(cmd *ledger.Command) { cmd.Subject = ledger.AnySubject },
		"no route":        func(cmd *ledger.Command) { cmd.Route = "" },
		"no region":       func(cmd *ledger.Command) { cmd.Region = "" },
		"no unit above 0": func(cmd *ledger.Command) { cmd.Units = ledger.Amounts{} },
	}
	for name, spoil := range malformed {
		for _, id := range []string{"a", "unknown"} {
			cmd := ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
				Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{10}}
			spoil(&cmd)
			if res := c.apply(cmd); !errors.Is(res.Err, ledger.ErrInvalidCommand) || res.Replayed || res.Generation != 0 {
				t.Errorf("%s, id %s: %v (replayed %v, generation %d), want ErrInvalidCommand naming no generation", name, id, res.Err, res.Replayed, res.Generation)
			}
		}
	}
	if res := c.reserve("a", 10); res.Err != nil || !res.Replayed {
		t.Fatalf("a well-formed retry: %+v, want its receipt", res)
	}
}

// The command's shape decides before the id is looked up (docs/API.md,
// "Order of checks"): a command carrying negative units is
// ErrInvalidCommand whether its id exists or not, whichever entry point
// (server, Envoy adapter, simulator, in-process engine) brought it. A
// reserve used to replay, an issue to say ErrShardIDReused and a
// reconcile ErrShardNotFound or ErrShardForeign.
func TestNegativeUnitsAreInvalidBeforeTheLookup(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.reserve("a", 10))
	for _, id := range []string{"a", "unknown"} {
		if res := c.reserve(id, -5); !errors.Is(res.Err, ledger.ErrInvalidCommand) || res.Replayed {
			t.Fatalf("reserve %s with -5 units: %+v, want ErrInvalidCommand", id, res)
		}
	}

	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	for _, id := range []string{"sh-1", "sh-unknown"} {
		if res := c.apply(issueCmd(id, "gw-a", 1, -100)); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
			t.Fatalf("issue shard %s with -100 units: %v, want ErrInvalidCommand", id, res.Err)
		}
	}
	bad := []ledger.ShardReceipt{{ReservationID: "r1", State: ledger.StateSettled, Actual: ledger.Amounts{-1}}}
	for _, id := range []string{"sh-1", "sh-unknown"} {
		for _, gateway := range []string{"gw-a", "gw-b"} {
			if res := c.apply(reconcileCmd(id, gateway, bad)); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
				t.Fatalf("reconcile shard %s as %s with a negative receipt: %v, want ErrInvalidCommand", id, gateway, res.Err)
			}
		}
	}
}

// An IssueShard's shape decides before the shard id is looked up too
// (ledger.ShardShapeProblem, which the server calls as well): a retry
// without a subject, route or region, for AnySubject, with boot epoch 0,
// a TTL not above 0 or no unit above 0 is ErrInvalidCommand whether its
// id exists or not, never ErrShardIDReused or a replay. It used to be
// checked after the lookup, so the ledger answered such a retry with
// ErrShardIDReused (409 SHARD_ID_REUSED) while the server refused it
// (400 INVALID_COMMAND).
func TestShardShapeIsInvalidBeforeTheLookup(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	malformed := map[string]func(*ledger.Command){
		"no subject":      func(cmd *ledger.Command) { cmd.Subject = "" },
		"any subject":     func(cmd *ledger.Command) { cmd.Subject = ledger.AnySubject },
		"no route":        func(cmd *ledger.Command) { cmd.Route = "" },
		"no region":       func(cmd *ledger.Command) { cmd.Region = "" },
		"boot epoch 0":    func(cmd *ledger.Command) { cmd.Shard.BootEpoch = 0 },
		"TTL 0":           func(cmd *ledger.Command) { cmd.Shard.TTL = 0 },
		"no unit above 0": func(cmd *ledger.Command) { cmd.Units = ledger.Amounts{} },
	}
	for name, spoil := range malformed {
		for _, id := range []string{"sh-1", "sh-unknown"} {
			cmd := issueCmd(id, "gw-a", 1, 100)
			spoil(&cmd)
			if res := c.apply(cmd); !errors.Is(res.Err, ledger.ErrInvalidCommand) || res.Replayed || res.Shard != nil {
				t.Errorf("%s, id %s: %v (replayed %v, shard %v), want ErrInvalidCommand", name, id, res.Err, res.Replayed, res.Shard != nil)
			}
		}
	}
	if res := c.apply(issueCmd("sh-1", "gw-a", 1, 100)); res.Err != nil || !res.Replayed {
		t.Fatalf("a well-formed retry: %+v, want its shard", res)
	}
}

// A fairness weight above what the gateway's scheduler takes (sched's
// MaxWeight, 2^20) was published, and client.FairQueue clamped it to 2^20
// without a word: a tenant of weight 2^21 got the share of one of 2^20,
// while the console's fairness page divided by 2^21. It is refused at
// publish, like every other term out of range; 2^20 itself is accepted.
func TestFairnessWeightAboveTheSchedulersIsInvalid(t *testing.T) {
	c := newChecked(t)
	p := policyOf(tokens(1000, 100))
	p.FairnessWeight = ledger.MaxFairnessWeight + 1
	res := c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p})
	if !errors.Is(res.Err, ledger.ErrInvalidPolicy) || !strings.Contains(res.Err.Error(), "fairnessWeight 1048577 is outside [1, 1048576]") {
		t.Fatalf("publish with fairness weight %d: %+v", p.FairnessWeight, res)
	}
	p = policyOf(tokens(1000, 100))
	p.FairnessWeight = ledger.MaxFairnessWeight
	c.publish(p)
}

// A drain that cannot move anything, because the current account's burst
// has no room for the capacity a late refund left on the superseded one,
// writes nothing: no statement for an epoch in which the drained account's
// balances did not change, no new version of either account. The drain
// worker tries such an account every pass; closing its epoch each time
// wrote a statement every epoch for as long as the current account stayed
// full (OPERATIONS.md, "What grows with what": statements grow with the
// epochs in which balances changed).
func TestDrainWithNoRoomWritesNothing(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("a", 500))
	c.must(c.start("a"))
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.must(c.reserve("b", 1)) // switch: carries the 500 available
	c.advance(time.Minute)    // generation 2 refills to its burst
	c.must(c.settle("a", 100))
	if avail := c.account(g1).Balances[0].Available; avail != 400 {
		t.Fatalf("generation 1 holds %d available after the late refund, want 400 (no room on generation 2)", avail)
	}
	c.advance(2 * time.Hour)
	c.must(c.apply(ledger.Command{Kind: ledger.KindCloseEpoch, Account: c.account(g1).Key})) // the refund's epoch
	statements, v1, v2 := len(c.m.Statements), c.account(g1).Version, c.account(g2).Version
	for pass := range 3 {
		c.advance(2 * time.Hour)
		if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key}); !errors.Is(res.Err, ledger.ErrNothingToDrain) {
			t.Fatalf("drain %d: %+v, want ErrNothingToDrain", pass, res)
		}
	}
	if n := len(c.m.Statements) - statements; n != 0 || c.account(g1).Version != v1 || c.account(g2).Version != v2 {
		t.Errorf("three drains with nothing to move wrote %d statements, versions %d -> %d (generation 1) and %d -> %d (generation 2); want none",
			n, v1, c.account(g1).Version, v2, c.account(g2).Version)
	}
	// The same when generation 2's stored balance has room that its
	// refill due by now fills: a busy subject's current account is seldom
	// stored full, but it refills faster than the worker comes by.
	c.must(c.reserve("c", 300)) // takes 300 of generation 1's 400 on the way
	c.must(c.start("c"))
	c.must(c.settle("c", 300))
	if avail, bal := c.account(g1).Balances[0].Available, c.account(g2).Balances[0]; avail == 0 || bal.Available+bal.Reserved >= 1000 {
		t.Fatalf("generation 1 holds %d, generation 2 %+v: want capacity waiting and room stored", avail, bal)
	}
	c.advance(2 * time.Hour)
	for _, g := range []uint64{g1, g2} {
		c.must(c.apply(ledger.Command{Kind: ledger.KindCloseEpoch, Account: c.account(g).Key}))
	}
	statements, v1, v2 = len(c.m.Statements), c.account(g1).Version, c.account(g2).Version
	c.advance(2 * time.Hour)
	if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g1).Key}); !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain into a current account its refill fills: %+v, want ErrNothingToDrain", res)
	}
	if n := len(c.m.Statements) - statements; n != 0 || c.account(g1).Version != v1 || c.account(g2).Version != v2 {
		t.Errorf("a drain into a current account its refill fills wrote %d statements, versions %d -> %d and %d -> %d; want none",
			n, v1, c.account(g1).Version, v2, c.account(g2).Version)
	}
}
