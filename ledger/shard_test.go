package ledger_test

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// shardKey is a fixed test signing key (a seed, so runs are reproducible).
var shardKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))

var shardKeys = ledger.ShardKeyRing{"k1": shardKey.Public().(ed25519.PublicKey)}

// emergencyPolicy is testSubject's policy with emergency mode on: burst
// 1000 tokens, refilling 10 per second.
func emergencyPolicy() *ledger.Policy {
	p := policyOf(tokens(1000, 10))
	p.EmergencyMode = true
	return p
}

func issueCmd(id, gateway string, boot uint64, units ledger.Units) ledger.Command {
	return ledger.Command{Kind: ledger.KindShardIssue, Subject: testSubject.Subject, Route: testSubject.Route,
		Region: testSubject.Region, Units: ledger.Amounts{units},
		Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, BootEpoch: boot, TTL: time.Minute,
			KeyID: "k1", Sign: ledger.Ed25519ShardSigner(shardKey)}}
}

func reconcileCmd(id, gateway string, receipts []ledger.ShardReceipt) ledger.Command {
	return ledger.Command{Kind: ledger.KindShardReconcile,
		Shard: &ledger.ShardArgs{ShardID: id, GatewayID: gateway, Receipts: receipts}}
}

func TestShardIssueRefusedWithoutEmergencyMode(t *testing.T) {
	c := newChecked(t)
	c.publish(policyOf(tokens(1000, 10)))
	res := c.apply(issueCmd("sh-1", "gw-a", 1, 100))
	if !errors.Is(res.Err, ledger.ErrEmergencyDisabled) {
		t.Fatalf("issuance under a policy with emergency mode off: %v", res.Err)
	}
	if len(c.m.Shards()) != 0 {
		t.Fatalf("a refused issuance recorded a shard")
	}
}

func TestShardIssueMovesAvailableToRetired(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	res := c.must(c.apply(issueCmd("sh-1", "gw-a", 3, 300)))
	s := res.Shard
	if s.Fence != 1 || s.Allocated[0] != 300 || s.BootEpoch != 3 || s.GatewayID != "gw-a" || s.KeyID != "k1" ||
		!s.ExpiresAt.Equal(c.now.Add(time.Minute)) || s.Account.Generation != g {
		t.Fatalf("issued shard: %+v", s)
	}
	if err := ledger.VerifyShard(s, shardKeys, ledger.ShardHolder{GatewayID: "gw-a", BootEpoch: 3}, c.now); err != nil {
		t.Fatalf("issued shard does not verify: %v", err)
	}
	bal := c.account(g).Balances[0]
	if bal.Available != 700 || bal.RetiredForEmergency != 300 {
		t.Fatalf("after issuing 300 of 1000: %+v", bal)
	}

	// A retry with the same id moves nothing again.
	again := c.must(c.apply(issueCmd("sh-1", "gw-a", 3, 300)))
	if !again.Replayed || again.Shard.Fence != 1 || !bytes.Equal(again.Shard.Signature, s.Signature) {
		t.Fatalf("retried issuance: %+v", again)
	}
	if c.account(g).Balances[0].RetiredForEmergency != 300 {
		t.Fatalf("a retried issuance retired twice")
	}
	// The same id for something else is refused.
	if res := c.apply(issueCmd("sh-1", "gw-b", 3, 300)); !errors.Is(res.Err, ledger.ErrShardIDReused) {
		t.Fatalf("shard id reused for another gateway: %v", res.Err)
	}
	// Each field the shard binds tells it apart: another boot, subject,
	// route, region or allocation under the same id is another shard.
	for what, change := range map[string]func(*ledger.Command){
		"boot":       func(cmd *ledger.Command) { cmd.Shard.BootEpoch = 4 },
		"subject":    func(cmd *ledger.Command) { cmd.Subject += "-other" },
		"route":      func(cmd *ledger.Command) { cmd.Route += "-other" },
		"region":     func(cmd *ledger.Command) { cmd.Region += "-other" },
		"allocation": func(cmd *ledger.Command) { cmd.Units[0] = 301 },
	} {
		cmd := issueCmd("sh-1", "gw-a", 3, 300)
		change(&cmd)
		if res := c.apply(cmd); !errors.Is(res.Err, ledger.ErrShardIDReused) {
			t.Fatalf("shard id reused for another %s: %v", what, res.Err)
		}
	}

	// Every issuance to the gateway bumps its fence; another gateway has
	// its own sequence.
	second := c.must(c.apply(issueCmd("sh-2", "gw-a", 3, 100)))
	other := c.must(c.apply(issueCmd("sh-3", "gw-b", 1, 100)))
	if second.Shard.Fence != 2 || other.Shard.Fence != 1 {
		t.Fatalf("fences: gw-a second %d, gw-b first %d", second.Shard.Fence, other.Shard.Fence)
	}
	// Shards never overlap: what is left is 500, a 600 shard does not fit.
	res = c.apply(issueCmd("sh-4", "gw-c", 1, 600))
	if !errors.Is(res.Err, ledger.ErrInsufficientCapacity) || res.Dimension != "tokens" || res.RetryAfter <= 0 {
		t.Fatalf("a shard larger than available: %+v", res)
	}
	if bal := c.account(g).Balances[0]; bal.RetiredForEmergency != 500 || bal.Available != 500 {
		t.Fatalf("after three shards: %+v", bal)
	}
}

func TestShardIssueRefusedUnderDebt(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	c.must(c.reserve("r1", 1000))
	c.must(c.start("r1"))
	c.must(c.settle("r1", 1100)) // 100 of debt
	if d := c.account(g).Balances[0].Debt(); d != 100 {
		t.Fatalf("debt %d", d)
	}
	res := c.apply(issueCmd("sh-1", "gw-a", 1, 1))
	if !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("issuance while the account owes: %v", res.Err)
	}
}

func TestShardIssueValidation(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	cases := map[string]func(*ledger.Command){
		"no args":        func(cmd *ledger.Command) { cmd.Shard = nil },
		"no id":          func(cmd *ledger.Command) { cmd.Shard.ShardID = "" },
		"no gateway":     func(cmd *ledger.Command) { cmd.Shard.GatewayID = "" },
		"no boot":        func(cmd *ledger.Command) { cmd.Shard.BootEpoch = 0 },
		"no ttl":         func(cmd *ledger.Command) { cmd.Shard.TTL = 0 },
		"no signer":      func(cmd *ledger.Command) { cmd.Shard.Sign = nil },
		"no key id":      func(cmd *ledger.Command) { cmd.Shard.KeyID = "" },
		"any subject":    func(cmd *ledger.Command) { cmd.Subject = ledger.AnySubject },
		"no units":       func(cmd *ledger.Command) { cmd.Units = ledger.Amounts{} },
		"negative units": func(cmd *ledger.Command) { cmd.Units = ledger.Amounts{-5} },
		"missing dim":    func(cmd *ledger.Command) { cmd.Units = ledger.Amounts{1, 1} },
		"wrong gen":      func(cmd *ledger.Command) { cmd.Generation = 99 },
	}
	for name, mutate := range cases {
		cmd := issueCmd("sh-"+name, "gw-a", 1, 10)
		mutate(&cmd)
		if res := c.apply(cmd); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
			t.Errorf("%s: %v, want ErrInvalidCommand", name, res.Err)
		}
	}
	cmd := issueCmd("sh-x", "gw-a", 1, 10)
	cmd.Subject = "tenant-without-policy"
	cmd.Route = "other.route"
	if res := c.apply(cmd); !errors.Is(res.Err, ledger.ErrNoPolicy) {
		t.Errorf("no policy: %v", res.Err)
	}
}

// spendOffline drives a local ledger the way a cut-off gateway does: two
// requests settle (120 and 80 of 100+100 reserved), one is released, one
// started request's usage stays unknown (50), and 400 of the 1000 are
// never touched.
func spendOffline(t *testing.T, s *ledger.Shard, now time.Time) *ledger.ShardLocal {
	t.Helper()
	l := ledger.NewShardLocal(s)
	must := func(res ledger.Result) {
		t.Helper()
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		if err := l.Check(); err != nil {
			t.Fatal(err)
		}
	}
	must(l.Reserve("a", "d-a", ledger.Amounts{100}, now))
	must(l.Start("a", "op-a", now))
	must(l.Settle("a", "op-a", ledger.Amounts{120}, now)) // 20 over: from available
	must(l.Reserve("b", "d-b", ledger.Amounts{100}, now))
	must(l.Start("b", "op-b", now))
	must(l.Settle("b", "op-b", ledger.Amounts{80}, now))
	must(l.Reserve("c", "d-c", ledger.Amounts{300}, now))
	must(l.Release("c", now))
	must(l.Reserve("d", "d-d", ledger.Amounts{50}, now))
	must(l.Start("d", "op-d", now))
	must(l.Reserve("e", "d-e", ledger.Amounts{30}, now)) // never started
	return l
}

func TestShardReconcileRemintsExactlyTheUnused(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 1000))).Shard
	if c.account(g).Balances[0].Available != 0 {
		t.Fatal("the whole burst should be in the shard")
	}
	l := spendOffline(t, s, c.now)
	if released := l.Seal(c.now); len(released) != 1 || released[0] != "e" {
		t.Fatalf("seal released %v, want [e]", released)
	}
	if l.Spent[0] != 200 || l.Reserved[0] != 50 || l.Retired[0] != 750 || l.Available[0] != 0 {
		t.Fatalf("local terms after seal: spent %d reserved %d retired %d available %d", l.Spent[0], l.Reserved[0], l.Retired[0], l.Available[0])
	}
	receipts, ok := l.Submission()
	if !ok || len(receipts) != 5 {
		t.Fatalf("submission: %v %+v", ok, receipts)
	}

	// No time passes, so nothing refills: what lands in available is the
	// remint alone.
	res := c.must(c.apply(reconcileCmd("sh-1", "gw-a", receipts)))
	l.Submitted(receipts)
	got := res.Shard
	if !got.Reconciled || got.Spent[0] != 200 || got.Unknown[0] != 50 || got.Reminted[0] != 750 {
		t.Fatalf("reconciled shard: %+v", got)
	}
	if res.Move == nil || res.Move.Units[0] != 750 || res.Move.Kind != ledger.MoveShardRemint || res.Move.To.Generation != g {
		t.Fatalf("remint move: %+v", res.Move)
	}
	bal := c.account(g).Balances[0]
	if bal.Available != 750 || bal.RetiredForEmergency != 1000 || bal.Minted != 750 {
		t.Fatalf("central after reconciliation: %+v", bal)
	}

	// A second submission remints nothing and is counted.
	again := c.apply(reconcileCmd("sh-1", "gw-a", receipts))
	if !errors.Is(again.Err, ledger.ErrShardAlreadyReconciled) || again.Shard == nil || !again.Shard.Reconciled {
		t.Fatalf("second submission: %+v", again)
	}
	// So is one from another gateway.
	if res := c.apply(reconcileCmd("sh-1", "gw-b", nil)); !errors.Is(res.Err, ledger.ErrShardForeign) {
		t.Fatalf("submission by another gateway: %v", res.Err)
	}
	if n := c.m.Meta(ledger.MetaShardRefused); n != 2 {
		t.Fatalf("refused submissions counted %d, want 2", n)
	}
	if n := c.m.Meta(ledger.MetaShardRefusedFor("sh-1")); n != 2 {
		t.Fatalf("refused submissions of sh-1 counted %d, want 2", n)
	}
	if c.account(g).Balances[0].Available != 750 {
		t.Fatalf("a refused submission changed the balance")
	}

	// The unknown work finishes: 30 used of its 50. The receipt moves 30 to
	// spent and remints 20, once.
	if _, ok := l.Submission(); ok {
		t.Fatal("nothing newly resolved, yet a submission is due")
	}
	if res := l.Settle("d", "op-d", ledger.Amounts{30}, c.now); res.Err != nil {
		t.Fatal(res.Err)
	}
	late, ok := l.Submission()
	if !ok || len(late) != 1 || late[0].ReservationID != "d" {
		t.Fatalf("late submission: %v %+v", ok, late)
	}
	res = c.must(c.apply(reconcileCmd("sh-1", "gw-a", late)))
	l.Submitted(late)
	if got := res.Shard; got.Spent[0] != 230 || got.Unknown[0] != 0 || got.Reminted[0] != 770 {
		t.Fatalf("after the late receipt: %+v", got)
	}
	if res.Move == nil || res.Move.Units[0] != 20 || res.Move.ReceiptID != ledger.ShardRemintReceipt(res.Shard, 2) {
		t.Fatalf("late remint move: %+v", res.Move)
	}
	if bal := c.account(g).Balances[0]; bal.Available != 770 {
		t.Fatalf("central after the late receipt: %+v", bal)
	}
	// Resolving it again is refused: capacity never moves twice, and never
	// back into unknown.
	if res := c.apply(reconcileCmd("sh-1", "gw-a", late)); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("second late receipt: %v", res.Err)
	}
	if done, pending := l.Reconciled(); !done || pending != 0 {
		t.Fatalf("local reconciliation state: %v %d", done, pending)
	}
	// A later receipt for an id that was settled in the first submission
	// is refused too (it was never unknown).
	if res := c.apply(reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{{ReservationID: "a", State: ledger.StateReleased}})); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) {
		t.Fatalf("late receipt for a settled id: %v", res.Err)
	}
}

func TestShardRemintGoesToTheActiveGeneration(t *testing.T) {
	c := newChecked(t)
	g1 := c.publish(emergencyPolicy())
	s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 400))).Shard
	// During the partition a new generation is published; the subject's
	// capacity moves to it on its next reservation.
	p2 := emergencyPolicy()
	p2.Dimensions[0].RefillUnits = 20
	g2 := c.publish(p2)
	c.must(c.reserve("r-after-switch", 10))
	l := ledger.NewShardLocal(s)
	l.Seal(c.now)
	receipts, _ := l.Submission()
	res := c.must(c.apply(reconcileCmd("sh-1", "gw-a", receipts)))
	if res.Move == nil || res.Move.From.Generation != g1 || res.Move.To.Generation != g2 || res.Move.Units[0] != 400 {
		t.Fatalf("remint: %+v", res.Move)
	}
	if old := c.account(g1).Balances[0]; old.RetiredForEmergency != 400 {
		t.Fatalf("the shard's own account must keep its retiredForEmergency: %+v", old)
	}
	if cur := c.account(g2).Balances[0]; cur.Available != 600-10+400 {
		t.Fatalf("the active account after remint: %+v", cur)
	}
}

func TestShardOveruseBecomesDebt(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100))).Shard
	// Everything else is reserved centrally, so the overuse cannot be
	// taken from available and becomes debt.
	c.must(c.reserve("rest", 900))
	l := ledger.NewShardLocal(s)
	l.Reserve("a", "d", ledger.Amounts{100}, c.now)
	l.Start("a", "op", c.now)
	res := l.Settle("a", "op", ledger.Amounts{160}, c.now)
	if res.Reservation.State != ledger.StateSettledWithDebt || l.Overdraft[0] != 60 || l.Spent[0] != 100 {
		t.Fatalf("local overuse: %+v, overdraft %v", res.Reservation, l.Overdraft)
	}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	if res := l.Reserve("b", "d", ledger.Amounts{1}, c.now); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("an overdrawn shard admitted: %v", res.Err)
	}
	l.Seal(c.now)
	receipts, _ := l.Submission()
	rec := c.must(c.apply(reconcileCmd("sh-1", "gw-a", receipts)))
	if rec.Shard.Spent[0] != 100 || rec.Shard.Reminted[0] != 0 || rec.Move == nil || rec.Move.Debt[0] != 60 {
		t.Fatalf("reconciled overuse: %+v move %+v", rec.Shard, rec.Move)
	}
	if d := c.account(g).Balances[0].Debt(); d != 60 {
		t.Fatalf("central debt %d, want 60", d)
	}
	if res := c.reserve("r", 1); !errors.Is(res.Err, ledger.ErrAdmissionFrozen) {
		t.Fatalf("admission with shard debt outstanding: %v", res.Err)
	}
}

func TestShardOveruseTakesAvailableFirst(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100))).Shard
	l := ledger.NewShardLocal(s)
	l.Reserve("a", "d", ledger.Amounts{100}, c.now)
	l.Start("a", "op", c.now)
	l.Settle("a", "op", ledger.Amounts{160}, c.now)
	l.Seal(c.now)
	receipts, _ := l.Submission()
	rec := c.must(c.apply(reconcileCmd("sh-1", "gw-a", receipts)))
	if rec.Move == nil || rec.Move.Debt[0] != 60 {
		t.Fatalf("move: %+v", rec.Move)
	}
	bal := c.account(g).Balances[0]
	if bal.Debt() != 0 || bal.Available != 900-60 {
		t.Fatalf("overuse of 60 with 900 available: %+v", bal)
	}
	c.must(c.reserve("r", 1))
}

func TestShardReconcileValidation(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	bad := map[string][]ledger.ShardReceipt{
		"reserved":     {{ReservationID: "a", State: ledger.StateReserved, Reserved: ledger.Amounts{10}}},
		"empty id":     {{State: ledger.StateReleased}},
		"duplicate":    {{ReservationID: "a", State: ledger.StateReleased}, {ReservationID: "a", State: ledger.StateReleased}},
		"negative":     {{ReservationID: "a", State: ledger.StateSettled, Actual: ledger.Amounts{-1}}},
		"unknown>all":  {{ReservationID: "a", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{101}}},
		"bogus state":  {{ReservationID: "a", State: ledger.StateExpiring}},
		"huge amounts": {{ReservationID: "a", State: ledger.StateSettled, Actual: ledger.Amounts{ledger.MaxUnits + 1}}},
	}
	for name, receipts := range bad {
		if res := c.apply(reconcileCmd("sh-1", "gw-a", receipts)); !errors.Is(res.Err, ledger.ErrInvalidCommand) {
			t.Errorf("%s: %v, want ErrInvalidCommand", name, res.Err)
		}
	}
	if res := c.apply(reconcileCmd("sh-missing", "gw-a", nil)); !errors.Is(res.Err, ledger.ErrShardNotFound) {
		t.Errorf("unknown shard: %v", res.Err)
	}
	if s, _ := c.m.Shard("sh-1"); s.Reconciled {
		t.Fatal("an invalid submission reconciled the shard")
	}
	// After all that, the gateway's real submission is still accepted.
	unknown := []ledger.ShardReceipt{{ReservationID: "u", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{10}}}
	if res := c.apply(reconcileCmd("sh-1", "gw-a", unknown)); res.Err != nil || res.Shard.Reminted[0] != 90 {
		t.Fatalf("valid submission after invalid ones: %+v", res)
	}
	// The first submission sent again (its answer was lost) is a repeat:
	// refused as already reconciled, with the stored shard in the answer.
	if res := c.apply(reconcileCmd("sh-1", "gw-a", unknown)); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) ||
		res.Shard == nil || !res.Shard.Reconciled || res.Shard.Unknown[0] != 10 {
		t.Errorf("resent first submission: %+v", res)
	}
	// A later submission may not mix terminal receipts with unknown ones.
	mixed := []ledger.ShardReceipt{
		{ReservationID: "u", State: ledger.StateSettled, Actual: ledger.Amounts{4}},
		{ReservationID: "v", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{1}},
	}
	if res := c.apply(reconcileCmd("sh-1", "gw-a", mixed)); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) && !errors.Is(res.Err, ledger.ErrInvalidCommand) {
		t.Errorf("mixed late receipts: %v", res.Err)
	}
	if res := c.apply(reconcileCmd("sh-1", "gw-a", nil)); !errors.Is(res.Err, ledger.ErrShardAlreadyReconciled) {
		t.Errorf("empty second submission: %v", res.Err)
	}
}

// A shard whose gateway died with work in flight: the next boot inherits
// it, and everything it cannot prove stays retired.
func TestShardInheritedByRestartKeepsUnknownRetired(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 500))).Shard
	l := ledger.NewShardLocal(s)
	l.Reserve("started", "d", ledger.Amounts{200}, c.now)
	l.Start("started", "op", c.now)
	l.Reserve("held", "d", ledger.Amounts{100}, c.now)
	l.Inherit(c.now)
	if r, _ := l.Reservation("started"); r.State != ledger.StateUsageUnknown {
		t.Fatalf("started work of a dead process is %s", r.State)
	}
	if r, _ := l.Reservation("held"); r.State != ledger.StateReleased {
		t.Fatalf("an unstarted hold of a dead process is %s", r.State)
	}
	if res := l.Reserve("new", "d", ledger.Amounts{1}, c.now); !errors.Is(res.Err, ledger.ErrShardSealed) {
		t.Fatalf("an inherited shard admitted: %v", res.Err)
	}
	receipts, _ := l.Submission()
	res := c.must(c.apply(reconcileCmd("sh-1", "gw-a", receipts)))
	if res.Shard.Unknown[0] != 200 || res.Shard.Reminted[0] != 300 || res.Shard.Spent[0] != 0 {
		t.Fatalf("reconciled inherited shard: %+v", res.Shard)
	}
	if bal := c.account(g).Balances[0]; bal.Available != 800 {
		t.Fatalf("central available %d, want 500 + 300 reminted", bal.Available)
	}
}

// The audit catches what the commands never produce: a second remint of
// the same shard (duplicate recovery), a split on an unreconciled shard,
// two shards of one gateway under one fence, and retiredForEmergency that
// does not match the shards.
func TestShardAuditCatchesBrokenRecords(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	c.must(c.apply(issueCmd("sh-2", "gw-a", 1, 100)))
	c.must(c.apply(reconcileCmd("sh-1", "gw-a", nil)))
	sound := c.m.Snapshot()
	if d := ledger.Audit(sound); len(d) != 0 {
		t.Fatalf("sound ledger: %v", d)
	}
	has := func(ds []ledger.Discrepancy, check string) bool {
		for _, d := range ds {
			if d.Check == check {
				return true
			}
		}
		return false
	}
	// A snapshot lists moves and shards in no set order: find sh-1's
	// remint and a shard by id.
	remint := func(snap *ledger.Snapshot) *ledger.Move {
		for i := range snap.Moves {
			if snap.Moves[i].Kind == ledger.MoveShardRemint {
				return &snap.Moves[i]
			}
		}
		t.Fatalf("no remint among %+v", snap.Moves)
		return nil
	}
	shard := func(snap *ledger.Snapshot, id string) *ledger.Shard {
		for i := range snap.Shards {
			if snap.Shards[i].ID == id {
				return &snap.Shards[i]
			}
		}
		t.Fatalf("no shard %s", id)
		return nil
	}

	dup := c.m.Snapshot()
	again := *remint(dup)
	again.ReceiptID = ledger.ShardRemintReceipt(shard(dup, "sh-1"), 2)
	dup.Moves = append(dup.Moves, again)
	if ds := ledger.Audit(dup); !has(ds, ledger.CheckShardRemint) {
		t.Errorf("duplicate remint not caught: %v", ds)
	}

	split := c.m.Snapshot()
	for i := range split.Shards {
		if split.Shards[i].ID == "sh-2" {
			split.Shards[i].Reminted[0] = 5
		}
	}
	if ds := ledger.Audit(split); !has(ds, ledger.CheckShardRecord) {
		t.Errorf("split on an unreconciled shard not caught: %v", ds)
	}

	fenced := c.m.Snapshot()
	for i := range fenced.Shards {
		fenced.Shards[i].Fence = 7
	}
	if ds := ledger.Audit(fenced); !has(ds, ledger.CheckShardRecord) {
		t.Errorf("shared fence not caught: %v", ds)
	}

	// One unit minted past what the shard confirmed unused is caught.
	overminted := c.m.Snapshot()
	remint(overminted).Units[0] = shard(overminted, "sh-1").Reminted[0] + 1
	if ds := ledger.Audit(overminted); !has(ds, ledger.CheckShardRemint) {
		t.Errorf("remint one unit above the confirmed unused not caught: %v", ds)
	}

	// A shard must expire after it was issued, not at the same instant.
	instant := c.m.Snapshot()
	shard(instant, "sh-2").ExpiresAt = shard(instant, "sh-2").IssuedAt
	if ds := ledger.Audit(instant); !has(ds, ledger.CheckShardRecord) {
		t.Errorf("a shard expiring at its issuance not caught: %v", ds)
	}

	dropped := c.m.Snapshot()
	dropped.Shards = dropped.Shards[:1]
	if ds := ledger.Audit(dropped); !has(ds, ledger.CheckShard) {
		t.Errorf("retiredForEmergency without its shard not caught: %v", ds)
	}
}

// While a shard is out the bucket refills around it; unused shard capacity
// coming back fills the bucket only up to its burst, like refill tokens,
// and the overflow is retired (recorded in RetiredForMove).
func TestShardRemintFillsUpToTheBurst(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy()) // burst 1000, 10 per second
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 300)))
	c.advance(20 * time.Second) // refill 200 of the 300 carved out
	c.must(c.reserve("r", 50))
	if bal := c.account(g).Balances[0]; bal.Available != 850 || bal.Reserved != 50 {
		t.Fatalf("before reconciliation: %+v", bal)
	}
	res := c.must(c.apply(reconcileCmd("sh-1", "gw-a", nil)))
	if res.Shard.Reminted[0] != 300 || res.Move == nil || res.Move.Units[0] != 300 {
		t.Fatalf("300 unused: shard %+v move %+v", res.Shard, res.Move)
	}
	bal := c.account(g).Balances[0]
	if bal.Available+bal.Reserved != 1000 || bal.RetiredForEmergency != 300 || bal.RetiredForMove != 200 {
		t.Fatalf("after reconciliation, 100 fit under the burst and 200 overflow: %+v", bal)
	}
}

// blindBook answers every account and policy read as absent once blind is
// set, as a store-backed book does after a read error.
type blindBook struct {
	*ledger.Memory
	blind bool
}

func (b *blindBook) Account(k ledger.AccountKey) (*ledger.Account, bool) {
	if b.blind {
		return nil, false
	}
	return b.Memory.Account(k)
}

func (b *blindBook) Policy(g uint64) (*ledger.Policy, bool) {
	if b.blind {
		return nil, false
	}
	return b.Memory.Policy(g)
}

// A read failure during reconciliation is an error answer for the batch's
// owner to discard, never a panic that takes the server down.
func TestShardReconcileWithUnreadableRowsDoesNotPanic(t *testing.T) {
	b := &blindBook{Memory: ledger.NewMemory()}
	now := time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)
	if res := ledger.PublishPolicy(b, emergencyPolicy(), now); res.Err != nil {
		t.Fatal(res.Err)
	}
	issue := issueCmd("sh-1", "gw-a", 1, 100)
	if res := ledger.Apply(b, &issue, now); res.Err != nil {
		t.Fatal(res.Err)
	}
	b.blind = true
	reconcile := reconcileCmd("sh-1", "gw-a", []ledger.ShardReceipt{{ReservationID: "a", State: ledger.StateReleased, Reserved: ledger.Amounts{10}}})
	res := ledger.Apply(b, &reconcile, now)
	if !errors.Is(res.Err, ledger.ErrAccountNotFound) && !errors.Is(res.Err, ledger.ErrPolicyNotFound) {
		t.Fatalf("reconcile over unreadable rows: %+v", res)
	}
}

// Issue 23, item 3: a late receipt may not release (or expire) work an
// earlier submission reported started with its usage unknown, which would
// remint capacity that may have been used. Only a settled receipt resolves
// it, and the refusal changes nothing.
func TestShardLateReceiptMayNotReleaseStartedWork(t *testing.T) {
	for _, state := range []ledger.State{ledger.StateReleased, ledger.StateExpired} {
		t.Run(state.String(), func(t *testing.T) {
			c := newChecked(t)
			g := c.publish(emergencyPolicy())
			s := c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 1000))).Shard
			l := ledger.NewShardLocal(s)
			l.Reserve("started", "d1", ledger.Amounts{400}, c.now)
			l.Start("started", "op-1", c.now)
			l.Reserve("unknown", "d2", ledger.Amounts{2}, c.now)
			l.Start("unknown", "op-2", c.now)
			l.MarkUsageUnknown("unknown", c.now)
			l.Seal(c.now)
			first, _ := l.Submission()
			res := c.must(c.apply(reconcileCmd("sh-1", "gw-a", first)))
			if res.Shard.Unknown[0] != 402 {
				t.Fatalf("first split: %+v", res.Shard)
			}
			available := c.account(g).Balances[0].Available
			refused := c.m.Meta(ledger.MetaShardRefusedFor("sh-1"))

			for _, id := range []string{"started", "unknown"} {
				late := []ledger.ShardReceipt{{ReservationID: id, State: state, Reserved: ledger.Amounts{400}}}
				res := c.apply(reconcileCmd("sh-1", "gw-a", late))
				if !errors.Is(res.Err, ledger.ErrShardReceiptContradicts) {
					t.Fatalf("%s receipt for %s work: %v", state, id, res.Err)
				}
				if res.Move != nil || res.Shard.Unknown[0] != 402 {
					t.Fatalf("a refused receipt moved capacity: %+v %+v", res.Move, res.Shard)
				}
			}
			if got := c.account(g).Balances[0].Available; got != available {
				t.Fatalf("available %d after refused receipts, was %d", got, available)
			}
			if got := c.m.Meta(ledger.MetaShardRefusedFor("sh-1")); got != refused+2 {
				t.Fatalf("refusals counted %d, want %d", got, refused+2)
			}
			// A settle still resolves both, with their usage.
			settled := []ledger.ShardReceipt{
				{ReservationID: "started", State: ledger.StateSettled, Reserved: ledger.Amounts{400}, Actual: ledger.Amounts{350}},
				{ReservationID: "unknown", State: ledger.StateSettled, Reserved: ledger.Amounts{2}, Actual: ledger.Amounts{2}},
			}
			res = c.must(c.apply(reconcileCmd("sh-1", "gw-a", settled)))
			if res.Shard.Unknown[0] != 0 || res.Shard.Spent[0] != 352 || res.Move == nil || res.Move.Units[0] != 50 {
				t.Fatalf("settled late receipts: %+v %+v", res.Shard, res.Move)
			}
			if got := ledger.ShardReceiptStandingOf(c.m.Meta(ledger.MetaShardReceipt("sh-1", "started"))); got != ledger.ShardReceiptResolved {
				t.Fatalf("standing of a resolved receipt: %v", got)
			}
		})
	}
}

// Shard errors and audit details name a dimension by its unit, which is
// what the caller wrote (units are maps of names in the API and the SDK),
// not only by its index.
func TestShardErrorsNameTheUnit(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	for name, receipts := range map[string][]ledger.ShardReceipt{
		"negative":    {{ReservationID: "a", State: ledger.StateSettled, Actual: ledger.Amounts{-1}}},
		"unknown>all": {{ReservationID: "a", State: ledger.StateUsageUnknown, Reserved: ledger.Amounts{101}}},
	} {
		if res := c.apply(reconcileCmd("sh-1", "gw-a", receipts)); !errors.Is(res.Err, ledger.ErrInvalidCommand) ||
			!strings.Contains(res.Err.Error(), `"tokens"`) {
			t.Errorf("%s: %v, want ErrInvalidCommand naming \"tokens\"", name, res.Err)
		}
	}

	issued, _ := c.m.Shard("sh-1")
	local := ledger.NewShardLocal(issued)
	local.Units = []string{"tokens"}
	if res := local.Reserve("r1", "d", ledger.Amounts{101}, c.now); !errors.Is(res.Err, ledger.ErrInsufficientCapacity) ||
		!strings.Contains(res.Err.Error(), `"tokens"`) {
		t.Errorf("local reserve above the shard: %v, want it to name \"tokens\"", res.Err)
	}
	if res := local.Reserve("r2", "d", ledger.Amounts{-1}, c.now); !errors.Is(res.Err, ledger.ErrInvalidCommand) ||
		!strings.Contains(res.Err.Error(), `"tokens"`) {
		t.Errorf("local reserve of a negative amount: %v, want it to name \"tokens\"", res.Err)
	}
	// Without names (the simulator's shards), by index.
	if res := ledger.NewShardLocal(issued).Reserve("r1", "d", ledger.Amounts{101}, c.now); res.Err == nil ||
		!strings.Contains(res.Err.Error(), "dimension 0") {
		t.Errorf("local reserve without unit names: %v, want it to name dimension 0", res.Err)
	}

	c.must(c.apply(reconcileCmd("sh-1", "gw-a", nil)))
	for name, broken := range map[string]func(*ledger.Snapshot){
		"duplicate remint": func(s *ledger.Snapshot) {
			again := s.Moves[0]
			again.ReceiptID = ledger.ShardRemintReceipt(&s.Shards[0], 2)
			s.Moves = append(s.Moves, again)
		},
		"split": func(s *ledger.Snapshot) { s.Shards[0].Spent[0] = 1 },
	} {
		snap := c.m.Snapshot()
		broken(snap)
		ds := ledger.Audit(snap)
		named := false
		for _, d := range ds {
			named = named || (strings.HasPrefix(d.Check, "shard") && strings.Contains(d.Detail, `"tokens"`))
		}
		if !named {
			t.Errorf("%s: %v, want a shard discrepancy naming \"tokens\"", name, ds)
		}
	}
}

// A shard above the burst never fits, however long refill runs and
// whatever holds end; it was refused INSUFFICIENT_CAPACITY saying "only
// outstanding holds ending can make room" on an account with no hold at
// all. It is refused as a reservation above the policy's bound is
// (ErrReservationTooLarge: no wait helps), naming the burst; a shard of
// the whole burst, above the largest single reservation, is still issued.
func TestShardAboveTheBurstIsTooLarge(t *testing.T) {
	c := newChecked(t)
	p := emergencyPolicy()
	p.Dimensions[0].MaxReservation = 100
	g := c.publish(p)
	res := c.apply(issueCmd("sh-1", "gw-a", 1, 1001))
	if !errors.Is(res.Err, ledger.ErrReservationTooLarge) || res.RetryAfter != 0 || res.Dimension != "tokens" ||
		!strings.Contains(res.Err.Error(), "1001 tokens requested, at most 1000") || strings.Contains(res.Err.Error(), "holds") {
		t.Fatalf("a shard above the burst: %+v", res)
	}
	if len(c.m.Shards()) != 0 || c.account(g).Balances[0].RetiredForEmergency != 0 {
		t.Fatal("a refused issuance retired capacity or recorded a shard")
	}
	c.must(c.apply(issueCmd("sh-2", "gw-a", 1, 1000)))
}

// A shard above the per-command cap (MaxUnits, 2^53) never fits either,
// since no burst is above it: ErrReservationTooLarge as for a Reserve of
// that size, not ErrInvalidCommand, which it answered while Reserve had
// been moved to TooLarge (docs/API.md: IssueShard's 429 is "as Reserve",
// RESERVATION_TOO_LARGE above the burst).
func TestShardAboveTheUnitCapIsTooLarge(t *testing.T) {
	c := newChecked(t)
	g := c.publish(emergencyPolicy())
	for _, units := range []ledger.Units{ledger.MaxUnits + 1, math.MaxInt64} {
		res := c.apply(issueCmd("sh-cap", "gw-a", 1, units))
		if !errors.Is(res.Err, ledger.ErrReservationTooLarge) || res.RetryAfter != 0 || res.Dimension != "tokens" ||
			res.Generation != g || !strings.Contains(res.Err.Error(), "no shard may exceed 9007199254740992 units") {
			t.Fatalf("a shard of %d units: %+v", units, res)
		}
	}
	if len(c.m.Shards()) != 0 {
		t.Fatal("a refused issuance recorded a shard")
	}
	// Refused before the account was read: the whole burst is still there.
	c.must(c.apply(issueCmd("sh-cap", "gw-a", 1, 1000)))
}

// serve --shard-max-ttl may allow up to the longest Duration (about 292
// years), but the stores and the signed token keep a shard's expiry as
// int64 Unix nanoseconds, which end in 2262: now + such a TTL failed every
// issuance as a 503 that no retry cured. The expiry is LatestTime instead,
// as a hold's is (TestDeadlinesBeyondTheStorableRangeAreLatestTime), and
// the token carries it exactly.
func TestShardExpiryBeyondTheStorableRangeIsLatestTime(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	cmd := issueCmd("sh-far", "gw-a", 1, 100)
	cmd.Shard.TTL = time.Duration(math.MaxInt64)
	s := c.must(c.apply(cmd)).Shard
	if !s.ExpiresAt.Equal(ledger.LatestTime) {
		t.Fatalf("expiresAt %s for a %s TTL, want LatestTime %s", s.ExpiresAt, cmd.Shard.TTL, ledger.LatestTime)
	}
	decoded, err := ledger.DecodeShardToken(ledger.EncodeShardToken(s))
	if err != nil || !decoded.ExpiresAt.Equal(ledger.LatestTime) {
		t.Fatalf("token decodes to expiresAt %v (%v), want LatestTime", decoded, err)
	}
	if err := ledger.VerifyShard(decoded, shardKeys, ledger.ShardHolder{GatewayID: "gw-a", BootEpoch: 1}, c.now); err != nil {
		t.Fatalf("the decoded shard does not verify: %v", err)
	}
}

// A shard TTL not above 0 is refused naming it as the API writes
// Durations ("-1.500s", not Go's "-1.5s"), so a client finds what it sent.
func TestShardTTLNotAboveZeroIsNamedAsTheAPIWritesIt(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	cmd := issueCmd("sh-neg", "gw-a", 1, 100)
	cmd.Shard.TTL = -1500 * time.Millisecond
	if res := c.apply(cmd); res.Err == nil || !strings.Contains(res.Err.Error(), "ttl must be above 0 (-1.500s)") {
		t.Fatalf("ttl %s: %+v, want refused naming -1.500s", cmd.Shard.TTL, res)
	}
}

// A shard id may hold colons (the remint receipt "shard-remint:ID:N" is
// split at its last one): its reconciliation's remint audits clean.
func TestShardAuditShardIDWithColons(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("gw-a:boot-1:sh-1", "gw-a", 1, 100)))
	res := c.must(c.apply(reconcileCmd("gw-a:boot-1:sh-1", "gw-a", nil)))
	if res.Move == nil || res.Move.Units[0] != 100 {
		t.Fatalf("reconciliation of an unused shard: %+v", res)
	}
	if d := ledger.Audit(c.m.Snapshot()); len(d) != 0 {
		t.Fatalf("sound ledger with a colon in a shard id: %v", d)
	}
}

// Remints made before their receipts carried the shard's issue time
// ("shard-remint:ID:N") are still the stored shard's when made at or
// after its issuance, or up to a minute before it (the reconciling
// replica's clock behind the issuer's); one made earlier is a removed shard's
// under the same id, which the audit does not add to the stored one (and
// reports here, as no retained shard totals account for it). A receipt
// with another issue time than the stored shard's is never the stored
// shard's.
func TestShardAuditLegacyRemintReceipts(t *testing.T) {
	c := newChecked(t)
	c.publish(emergencyPolicy())
	c.must(c.apply(issueCmd("sh-1", "gw-a", 1, 100)))
	c.must(c.apply(reconcileCmd("sh-1", "gw-a", nil)))
	remintOf := func(snap *ledger.Snapshot) (*ledger.Move, *ledger.Shard) {
		t.Helper()
		for i := range snap.Moves {
			if snap.Moves[i].Kind == ledger.MoveShardRemint && len(snap.Shards) == 1 {
				return &snap.Moves[i], &snap.Shards[0]
			}
		}
		t.Fatalf("no remint of one shard among %+v", snap.Moves)
		return nil, nil
	}
	// Renaming a move also unpairs it from its journal entries
	// (move_both_ends): only the remint check is looked at.
	remintFound := func(snap *ledger.Snapshot) bool {
		for _, d := range ledger.Audit(snap) {
			if d.Check == ledger.CheckShardRemint {
				return true
			}
		}
		return false
	}
	snap := c.m.Snapshot()
	m, sh := remintOf(snap)
	if m.ReceiptID != ledger.ShardRemintReceipt(sh, 1) {
		t.Fatalf("remint receipt %s, want %s", m.ReceiptID, ledger.ShardRemintReceipt(sh, 1))
	}
	m.ReceiptID = ledger.LegacyShardRemintReceipt("sh-1", 1)
	if remintFound(snap) {
		t.Errorf("a legacy receipt of the stored shard's remint: %v", ledger.Audit(snap))
	}
	m.At = sh.IssuedAt.Add(-30 * time.Second) // the reconciling replica's clock behind the issuer's
	if remintFound(snap) {
		t.Errorf("a legacy receipt of the stored shard's remint, its replica's clock 30 s behind: %v", ledger.Audit(snap))
	}
	m.At = sh.IssuedAt.Add(-time.Minute) // "up to a minute before": the minute itself included
	if remintFound(snap) {
		t.Errorf("a legacy receipt of the stored shard's remint, its replica's clock a minute behind: %v", ledger.Audit(snap))
	}
	m.At = sh.IssuedAt.Add(-time.Minute - time.Nanosecond)
	if !remintFound(snap) {
		t.Errorf("a legacy receipt of a remint over a minute before the stored shard was issued: %v, want %s", ledger.Audit(snap), ledger.CheckShardRemint)
	}
	m.At = sh.IssuedAt.Add(-2 * time.Minute)
	if !remintFound(snap) {
		t.Errorf("a legacy receipt of a remint before the stored shard was issued: %v, want %s", ledger.Audit(snap), ledger.CheckShardRemint)
	}
	snap = c.m.Snapshot()
	m, sh = remintOf(snap)
	other := *sh
	other.IssuedAt = sh.IssuedAt.Add(-time.Hour)
	m.ReceiptID = ledger.ShardRemintReceipt(&other, 1)
	if !remintFound(snap) {
		t.Errorf("a receipt of another shard under the id: %v, want %s", ledger.Audit(snap), ledger.CheckShardRemint)
	}
	// A receipt whose issue time does not read as a number is no shard's,
	// not a legacy one (which would be the stored shard's by its time).
	snap = c.m.Snapshot()
	m, _ = remintOf(snap)
	m.ReceiptID = "shard-remint:sh-1:x17.1"
	if !remintFound(snap) {
		t.Errorf("a receipt with a malformed issue time: %v, want %s", ledger.Audit(snap), ledger.CheckShardRemint)
	}
}

// Remint receipt ids read back: the shard id (colons included) and the
// issue time of ShardRemintReceipt, none for LegacyShardRemintReceipt,
// -1 for an issue time that is not a number, and no shard for an id of
// another form.
func TestShardRemintReceiptsReadBack(t *testing.T) {
	issued := time.Date(2026, 12, 5, 20, 0, 0, 123, time.UTC)
	for _, c := range []struct {
		receipt string
		shard   string
		issued  int64
		marked  bool
	}{
		{ledger.ShardRemintReceipt(&ledger.Shard{ID: "sh-1", IssuedAt: issued}, 3), "sh-1", issued.UnixNano(), true},
		{ledger.ShardRemintReceipt(&ledger.Shard{ID: "gw:b1:sh.2", IssuedAt: issued}, 1), "gw:b1:sh.2", issued.UnixNano(), true},
		{ledger.LegacyShardRemintReceipt("sh-1", 2), "sh-1", 0, false},
		{ledger.LegacyShardRemintReceipt("gw:b1:sh.2", 2), "gw:b1:sh.2", 0, false},
		{"shard-remint:sh-1:x17.1", "sh-1", -1, true},
	} {
		if id, ok := ledger.ShardOfRemint(c.receipt); !ok || id != c.shard {
			t.Errorf("ShardOfRemint(%q) = %q %v, want %q", c.receipt, id, ok, c.shard)
		}
		if n, marked := ledger.ShardRemintIssued(c.receipt); n != c.issued || marked != c.marked {
			t.Errorf("ShardRemintIssued(%q) = %d %v, want %d %v", c.receipt, n, marked, c.issued, c.marked)
		}
	}
	if got := ledger.LegacyShardRemintReceipt("sh-1", 2); got != "shard-remint:sh-1:2" {
		t.Errorf("legacy receipt %q, want shard-remint:sh-1:2 (the form stored before receipts carried the issue time)", got)
	}
	for _, receipt := range []string{"move-1", "shard-remint-sh-1:1", "shard-remint:sh-1"} {
		if id, ok := ledger.ShardOfRemint(receipt); ok {
			t.Errorf("ShardOfRemint(%q) = %q, want no shard", receipt, id)
		}
	}
}
