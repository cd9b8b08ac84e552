package ledger_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// requestsOf is a second unit, so that two generations can list their
// units in different orders.
func requestsOf(burst, refill ledger.Units) ledger.Dimension {
	return ledger.Dimension{Unit: "requests", Burst: burst, RefillUnits: refill, RefillInterval: time.Second, MaxOverdraft: burst / 2}
}

// movesHistory returns two checked ledgers whose histories hold every kind
// of move: generation switches between policies listing their units in
// different orders (capacity and assumed debt), forwards of a late refund
// and of late debt, a switch back after a rollback, and shard remints into
// the shard's own account and into a later generation's, one charging
// debt.
func movesHistory(t *testing.T) []*ledger.Memory {
	c := newChecked(t)
	p1 := policyOf(tokens(1000, 100), requestsOf(100, 10))
	g1 := c.publish(p1)
	c.must(c.reserve("late-refund", 300, 5))
	c.must(c.start("late-refund"))
	c.must(c.reserve("late-debt", 100, 5))
	c.must(c.start("late-debt"))
	c.must(c.reserve("owes", 100, 5))
	c.must(c.start("owes"))
	c.must(c.settle("owes", 800, 5)) // debt on g1: the switch moves it
	p2 := policyOf(requestsOf(100, 10), tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	g2 := c.publish(p2)
	c.advance(time.Second)
	c.reserve("switch", 1, 1)              // switch g1 -> g2, carrying capacity and the debt
	c.must(c.settle("late-refund", 10, 1)) // a late refund forwarded to g2
	c.must(c.settle("late-debt", 450, 5))  // late debt forwarded to g2
	c.advance(time.Minute)
	c.must(c.reserve("on-g2", 50, 2))
	c.must(c.start("on-g2"))
	c.rollback(testSubject, g2) // g1 decides again: the next command switches back
	c.advance(time.Minute)
	c.reserve("back", 1, 1)
	c.must(c.settle("on-g2", 10, 1)) // a late refund on the rolled-back generation
	if res := c.apply(ledger.Command{Kind: ledger.KindDrain, Account: c.account(g2).Key}); res.Err != nil && !errors.Is(res.Err, ledger.ErrNothingToDrain) {
		t.Fatalf("drain: %v", res.Err)
	}
	_ = g1

	s := newChecked(t)
	s.publish(emergencyPolicy())
	s.must(s.apply(issueCmd("sh-own", "gw-a", 1, 100)))
	s.must(s.apply(reconcileCmd("sh-own", "gw-a", nil))) // reminted into its own account
	s.must(s.apply(issueCmd("sh-next", "gw-a", 1, 100)))
	e2 := emergencyPolicy()
	e2.EstimatorDigest = "sha256:v2"
	s.publish(e2)
	s.advance(time.Second)
	s.must(s.apply(reconcileCmd("sh-next", "gw-a", []ledger.ShardReceipt{
		{ReservationID: "over", State: ledger.StateSettled, Reserved: ledger.Amounts{100}, Actual: ledger.Amounts{130}},
	}))) // charged 30 debt into the next generation's account
	return []*ledger.Memory{c.m, s.m}
}

// forgedMoveAudits runs both audits (the in-memory one, and the streamed
// one with its policies read by PoliciesOf, as capledger audit reads a
// store) over snap.
func forgedMoveAudits(snap *ledger.Snapshot) map[string][]ledger.Discrepancy {
	streamed := ledger.Streams(snap)
	policies := snap.Policies
	streamed.Policies = nil
	streamed.PoliciesOf = func(generations []uint64) (map[uint64]ledger.Policy, error) {
		out := map[uint64]ledger.Policy{}
		for _, p := range policies {
			if slices.Contains(generations, p.Generation) {
				out[p.Generation] = p
			}
		}
		return out, nil
	}
	return map[string][]ledger.Discrepancy{"in memory": ledger.Audit(snap), "streamed": ledger.Audit(streamed)}
}

// A move whose ends disagree is found by move_conservation and named by
// its receipt, by both audits, though each account's own books balance
// (the forgery edits the account with its journal entry): capacity minted
// at the destination beyond what left the source (an outside fault test's
// rollback drain minting +1), capacity kept at the source, and assumed
// debt dropped on the way. Every move of real histories of every kind is
// forged in turn, and the real histories audit clean.
func TestAuditFindsMovesWithUnequalEnds(t *testing.T) {
	type forgery struct {
		name  string
		atDst bool
		when  func(m *ledger.Move) bool
		edit  func(b *ledger.Balance)
	}
	forgeries := []forgery{
		{"destination minted one more", true, func(*ledger.Move) bool { return true },
			func(b *ledger.Balance) { b.Minted++; b.Available++ }},
		{"source kept one back", false, func(m *ledger.Move) bool { return m.Kind != ledger.MoveShardRemint && m.Units != ledger.Amounts{} },
			func(b *ledger.Balance) { b.RetiredForMove--; b.Available++ }},
		{"assumed debt dropped by one", true, func(m *ledger.Move) bool { return m.Debt != ledger.Amounts{} },
			func(b *ledger.Balance) { b.OverdraftIssued--; b.OverdraftRepaid-- }},
	}
	kinds := map[string]bool{}
	for _, m := range movesHistory(t) {
		clean := m.Snapshot()
		for how, found := range forgedMoveAudits(clean) {
			if len(found) != 0 {
				t.Fatalf("%s audit of the real history: %v", how, found)
			}
		}
		for _, mv := range clean.Moves {
			kind := mv.Kind.String()
			if mv.Debt != (ledger.Amounts{}) {
				kind += " with debt"
			}
			if mv.From == mv.To {
				kind += " into its own account"
			}
			kinds[kind] = true
			for _, f := range forgeries {
				if !f.when(&mv) {
					continue
				}
				snap := m.Snapshot()
				snap.Journal = slices.Clone(snap.Journal)
				at := mv.From
				if f.atDst {
					at = mv.To
				}
				p, _ := m.Policy(at.Generation)
				e := slices.IndexFunc(snap.Journal, func(e ledger.JournalEntry) bool { return e.ReceiptID == mv.ReceiptID && e.Account == at })
				a := slices.IndexFunc(snap.Accounts, func(a ledger.Account) bool { return a.Key == at })
				if e < 0 || a < 0 {
					t.Fatalf("move %s has no entry or account at %s", mv.ReceiptID, at)
				}
				// The unit the move moved most of, in at's dimensions.
				d := 0
				for i := range mv.Units {
					if mv.Units[i]+mv.Debt[i] > mv.Units[d]+mv.Debt[d] {
						d = i
					}
				}
				fp, _ := m.Policy(mv.From.Generation)
				d = p.DimensionIndex(fp.Dimensions[d].Unit)
				f.edit(&snap.Journal[e].Delta[d])
				f.edit(&snap.Accounts[a].Balances[d])
				for how, found := range forgedMoveAudits(snap) {
					named := false
					for _, x := range found {
						if x.Check == ledger.CheckJournal || x.Check == ledger.CheckConservation {
							t.Errorf("%s, %s: the forgery left the account's books unbalanced: %s", mv.ReceiptID, f.name, x)
						}
						named = named || x.Check == ledger.CheckMoveAmounts && strings.Contains(x.Detail, mv.ReceiptID) && x.Account == at.String()
					}
					if !named {
						t.Errorf("%s audit missed %s of %s move %s: %v", how, f.name, kind, mv.ReceiptID, found)
					}
				}
			}
		}
	}
	for _, want := range []string{"generation_switch", "generation_switch with debt", "forward", "forward with debt",
		"shard_remint into its own account", "shard_remint with debt"} {
		if !kinds[want] {
			t.Errorf("the histories hold no %s move: %v", want, kinds)
		}
	}
}
