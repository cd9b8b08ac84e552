package ledger_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
)

// The checks must be able to fail: each case breaks one rule in an
// otherwise sound ledger and expects the check named for it.

// soundLedger returns a book with a settled, a settled-with-debt, a
// released, a started and a reserved reservation, a generation switch
// (a move) and a closed epoch.
func soundLedger(t *testing.T) *ledger.Memory {
	t.Helper()
	c := newChecked(t)
	c.m = ledger.NewMemory() // plain Memory: the cases below edit its rows in place
	c.book = c.m
	c.prev = c.m.Snapshot()
	c.publish(policyOf(tokens(1000, 100)))
	c.must(c.reserve("settled", 100))
	c.must(c.start("settled"))
	c.must(c.settle("settled", 40))
	c.must(c.reserve("released", 50))
	c.must(c.apply(ledger.Command{Kind: ledger.KindRelease, ReservationID: "released"}))
	c.must(c.reserve("started", 30))
	c.must(c.start("started"))
	c.advance(2 * time.Hour)
	p2 := policyOf(tokens(1000, 100))
	p2.EstimatorDigest = "sha256:v2"
	c.publish(p2)
	c.must(c.reserve("reserved", 20))
	c.must(c.reserve("debt", 10))
	c.must(c.start("debt"))
	c.must(c.settle("debt", 2000))
	if d := ledger.Audit(c.m.Snapshot()); len(d) != 0 {
		t.Fatalf("the sound ledger is not sound: %v", d)
	}
	return c.m
}

func firstAccount(t *testing.T, m *ledger.Memory) *ledger.Account {
	t.Helper()
	a, ok := m.Account(ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: 1})
	if !ok {
		t.Fatal("no account for generation 1")
	}
	return a
}

func TestAuditCatchesBrokenRows(t *testing.T) {
	cases := []struct {
		name    string
		check   string
		corrupt func(t *testing.T, m *ledger.Memory)
	}{
		{"capacity created from nothing", ledger.CheckConservation, func(t *testing.T, m *ledger.Memory) {
			firstAccount(t, m).Balances[0].Available += 5
		}},
		{"available below zero", ledger.CheckConservation, func(t *testing.T, m *ledger.Memory) {
			a := firstAccount(t, m)
			a.Balances[0].Available -= 2000
			a.Balances[0].Spent += 2000
		}},
		{"unknown usage treated as unconsumed", ledger.CheckReserved, func(t *testing.T, m *ledger.Memory) {
			r, _ := m.Reservation("started")
			r.State = ledger.StateUsageUnknown
			a := firstAccount(t, m)
			a.Balances[0].Reserved -= r.Reserved[0]
			a.Balances[0].Available += r.Reserved[0]
		}},
		{"spent without a settle", ledger.CheckSpent, func(t *testing.T, m *ledger.Memory) {
			a := firstAccount(t, m)
			a.Balances[0].Available -= 7
			a.Balances[0].Spent += 7
		}},
		{"unrecorded debt", ledger.CheckDebt, func(t *testing.T, m *ledger.Memory) {
			r, _ := m.Reservation("debt")
			r.Overdraft[0] += 1
		}},
		{"settled with debt but no overdraft", ledger.CheckDebt, func(t *testing.T, m *ledger.Memory) {
			r, _ := m.Reservation("settled")
			r.State = ledger.StateSettledWithDebt
		}},
		{"balance not in the journal", ledger.CheckJournal, func(t *testing.T, m *ledger.Memory) {
			a := firstAccount(t, m)
			a.Balances[0].Available -= 3
			a.Balances[0].RetiredForMove += 3
		}},
		{"refunded twice", ledger.CheckRefundOnce, func(t *testing.T, m *ledger.Memory) {
			for _, e := range m.Journal {
				if e.ReservationID == "released" && e.To == ledger.StateReleased {
					m.Journal = append(m.Journal, e) // the release applied a second time
					return
				}
			}
			t.Fatal("no release in the journal")
		}},
		{"move recorded at one end", ledger.CheckMove, func(t *testing.T, m *ledger.Memory) {
			kept := m.Journal[:0]
			for _, e := range m.Journal {
				if e.ReceiptID == "" || e.Account.Generation != 1 || e.Kind != ledger.KindDrain {
					kept = append(kept, e)
				}
			}
			m.Journal = kept
		}},
		{"move journaled twice at its destination", ledger.CheckMove, func(t *testing.T, m *ledger.Memory) {
			for _, e := range m.Journal {
				if e.Kind == ledger.KindDrain && e.Account.Generation == 2 {
					m.Journal = append(m.Journal, e) // the move applied a second time there
					return
				}
			}
			t.Fatal("no move in the journal")
		}},
		{"move journaled at a third account", ledger.CheckMoveAmounts, func(t *testing.T, m *ledger.Memory) {
			for _, e := range m.Journal {
				if e.Kind == ledger.KindDrain {
					e.Account.Subject = "someone-else" // a third account credited under the move's receipt
					m.Journal = append(m.Journal, e)
					return
				}
			}
			t.Fatal("no move in the journal")
		}},
		{"epoch opens elsewhere than the last closed", ledger.CheckStatement, func(t *testing.T, m *ledger.Memory) {
			m.Statements[0].Closing[0].Opening++
			m.Statements[0].Closing[0].Available++
		}},
		{"above the burst", ledger.CheckBurst, func(t *testing.T, m *ledger.Memory) {
			a := firstAccount(t, m)
			a.Balances[0].Available += 5000
			a.Balances[0].Minted += 5000
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := soundLedger(t)
			tc.corrupt(t, m)
			found := false
			for _, d := range ledger.Audit(m.Snapshot()) {
				found = found || d.Check == tc.check
			}
			if !found {
				t.Fatalf("Audit missed %s: %v", tc.check, ledger.Audit(m.Snapshot()))
			}
		})
	}
}

func TestCheckAccount(t *testing.T) {
	m := soundLedger(t)
	a := firstAccount(t, m)
	if err := ledger.CheckAccount(a); err != nil {
		t.Fatalf("sound account: %v", err)
	}
	unbalanced := *a
	unbalanced.Balances[0].Available++
	if ledger.CheckAccount(&unbalanced) == nil {
		t.Fatal("CheckAccount missed an unbalanced equation")
	}
	overRepaid := *a
	overRepaid.Balances[0].OverdraftRepaid = overRepaid.Balances[0].OverdraftIssued + 1
	overRepaid.Balances[0].Opening += overRepaid.Balances[0].OverdraftRepaid - a.Balances[0].OverdraftRepaid
	if err := ledger.CheckAccount(&overRepaid); err == nil || !strings.Contains(err.Error(), "more than issued") {
		t.Fatalf("CheckAccount missed repaid above issued: %v", err)
	}
	negative := *a
	negative.Balances[0].Available = -1
	negative.Balances[0].Spent += a.Balances[0].Available + 1
	if err := ledger.CheckAccount(&negative); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("CheckAccount missed a negative available: %v", err)
	}
}

// CheckStep, given a before and an after that a faulty ledger could
// produce, names the broken rule.
func TestCheckStepCatchesBrokenSteps(t *testing.T) {
	reserveCmd := func(id string) *ledger.Command {
		return &ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: "sha256:" + id,
			Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Units: ledger.Amounts{5}}
	}
	cases := []struct {
		name  string
		check string
		step  func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result)
	}{
		{"replay refunds", ledger.CheckStepReplay, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindRelease, ReservationID: "released"}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			res.Refunded[0] = 50
			return cmd, res
		}},
		{"replay moves capacity", ledger.CheckStepReplay, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindRelease, ReservationID: "released"}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			a := firstAccount(t, m)
			a.Balances[0].Available += 50
			a.Balances[0].Opening += 50
			return cmd, res
		}},
		{"admission while owing", ledger.CheckStepAdmission, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := reserveCmd("while-frozen")
			res := ledger.Apply(m, cmd, t0.Add(2*time.Hour))
			if res.Err == nil {
				t.Fatal("the ledger admitted while frozen")
			}
			// What a ledger without the debt check would have written:
			key := ledger.AccountKey{Subject: testSubject.Subject, Route: testSubject.Route, Region: testSubject.Region, Generation: 2}
			a, _ := m.Account(key)
			a.Balances[0].Available -= 5
			a.Balances[0].Reserved += 5
			m.ReservationPut(&ledger.Reservation{ID: "while-frozen", RequestDigest: "sha256:while-frozen", Account: key,
				Reserved: ledger.Amounts{5}, State: ledger.StateReserved})
			return cmd, ledger.Result{Reservation: ledger.Reservation{ID: "while-frozen"}, Generation: 2}
		}},
		{"started work expired", ledger.CheckStepTransition, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: "started"}
			r, _ := m.Reservation("started")
			r.State = ledger.StateExpiring
			return cmd, ledger.Result{Reservation: *r}
		}},
		{"terminal reservation reopened", ledger.CheckStepTransition, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindStart, ReservationID: "settled", OperationID: "op-settled"}
			r, _ := m.Reservation("settled")
			r.State = ledger.StateStarted
			return cmd, ledger.Result{Reservation: *r}
		}},
		{"marked unknown without its time", ledger.CheckStepTransition, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: "started"}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			r, _ := m.Reservation("started")
			r.UnknownAt = r.StartedAt // what a ledger aging from the start would record
			return cmd, res
		}},
		{"unknown time set by a settle", ledger.CheckStepTransition, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindSettle, ReservationID: "started", OperationID: "op-started", Units: ledger.Amounts{10}}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			r, _ := m.Reservation("started")
			r.UnknownAt = t0.Add(3 * time.Hour)
			return cmd, res
		}},
		{"refund differs from the transition", ledger.CheckStepRefund, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindSettle, ReservationID: "started", OperationID: "op-started", Units: ledger.Amounts{10}}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			res.Refunded[0]++
			return cmd, res
		}},
		{"spent taken back", ledger.CheckStepMonotone, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindRefill, Account: firstAccount(t, m).Key}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			a := firstAccount(t, m)
			a.Balances[0].Spent -= 10
			a.Balances[0].Available += 10
			return cmd, res
		}},
		{"move receipt rewritten", ledger.CheckStepMove, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindRefill, Account: firstAccount(t, m).Key}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			mv := m.Moves()[0]
			mv.Units[0]++
			return cmd, res
		}},
		{"published terms changed", ledger.CheckStepPolicy, func(t *testing.T, m *ledger.Memory) (*ledger.Command, ledger.Result) {
			cmd := &ledger.Command{Kind: ledger.KindRefill, Account: firstAccount(t, m).Key}
			res := ledger.Apply(m, cmd, t0.Add(3*time.Hour))
			p, _ := m.Policy(1)
			p.Dimensions[0].Burst++
			return cmd, res
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := soundLedger(t)
			before := deepSnapshot(m)
			cmd, res := tc.step(t, m)
			found := false
			for _, d := range ledger.CheckStep(before, deepSnapshot(m), cmd, &res) {
				found = found || d.Check == tc.check
			}
			if !found {
				t.Fatalf("CheckStep missed %s: %v", tc.check, ledger.CheckStep(before, deepSnapshot(m), cmd, &res))
			}
		})
	}
}

// deepSnapshot copies what the cases edit in place (policies' dimensions).
func deepSnapshot(m *ledger.Memory) *ledger.Snapshot {
	s := m.Snapshot()
	for i := range s.Policies {
		s.Policies[i].Dimensions = append([]ledger.Dimension(nil), s.Policies[i].Dimensions...)
	}
	return s
}

// TestAuditProgressCountsAccounts: an audit's progress counts the
// accounts it reads after the reservations and the journal, so that a
// store's Estimate, which counts them, is reached only at the end (over a
// million accounts the bar otherwise stood at 99% for the whole pass).
func TestAuditProgressCountsAccounts(t *testing.T) {
	snap := soundLedger(t).Snapshot()
	if !snap.JournalComplete || len(snap.Accounts) < 2 {
		t.Fatalf("the sound ledger: journal complete %v, %d accounts", snap.JournalComplete, len(snap.Accounts))
	}
	want := int64(len(snap.Reservations) + len(snap.Journal) + len(snap.Accounts))
	var last int64
	found, _ := ledger.AuditWith(snap, ledger.AuditOptions{Progress: func(rows int64) { last = rows }})
	if len(found) > 0 {
		t.Fatalf("the sound ledger: %v", found)
	}
	if last != want {
		t.Fatalf("progress ended at %d rows; want %d reservations + %d journal entries + %d accounts",
			last, len(snap.Reservations), len(snap.Journal), len(snap.Accounts))
	}
}

// TestAuditRefundOncePerLife: refund_once counts endings per life of an
// id. A life ends for good at its forget entry (retention forgot its
// tombstone); an admission after it is a reuse (API.md, "Retention:
// removed reservations") and is judged apart, so reuse is clean, while a
// second ending within any one life is reported with its count, and so
// is an admission after an ending with no forget entry between (a
// tombstone ignored), unless that ending is older than the store's
// forget entries (ForgetsJournaledAfter: an upgraded store). The planted
// entries (copies of the admission and the release of "released", and a
// forget of it) move nothing, so only refund_once can see them.
func TestAuditRefundOncePerLife(t *testing.T) {
	type upgrade int
	const (
		notUpgraded upgrade = iota
		upgradedBeforeAppended
		upgradedAtRelease
	)
	const (
		begin  = "begin"
		end    = "end"
		forget = "forget"
		reborn = "admitted again"
		twice  = "ended 2 times"
		thrice = "ended 3 times"
	)
	cases := []struct {
		name          string
		before, after []string // planted just before and after the first life's release
		appended      []string // planted after the sound ledger's entries
		// upgraded: where ForgetsJournaledAfter lies (a store that
		// journals forgets since): none, before the appended entries,
		// or at the first life's release itself.
		upgraded upgrade
		want     []string
	}{
		{"reused after its tombstone was forgotten", nil, nil, []string{forget, begin, end}, notUpgraded, nil},
		{"reused twice", nil, nil, []string{forget, begin, end, forget, begin, end}, notUpgraded, nil},
		{"reused, not ended yet", nil, nil, []string{forget, begin}, notUpgraded, nil},
		{"reused while its tombstone lived", nil, nil, []string{begin, end}, notUpgraded, []string{reborn}},
		{"reused while its tombstone lived, not ended yet", nil, nil, []string{begin}, notUpgraded, []string{reborn}},
		{"reused twice, once while its tombstone lived", nil, nil, []string{forget, begin, end, begin, end}, notUpgraded, []string{reborn}},
		{"forgotten twice, reused", nil, nil, []string{forget, forget, begin, end}, notUpgraded, nil},
		{"reused before the store journaled forgets", nil, nil, []string{begin, end}, upgradedBeforeAppended, nil},
		// The release at ForgetsJournaledAfter itself was written before the
		// upgrade: a reuse after it is judged the old way.
		{"reused after a release at the upgrade's position", nil, nil, []string{begin, end}, upgradedAtRelease, nil},
		{"reused after the upgrade while its tombstone lived", nil, nil, []string{begin, end, begin, end}, upgradedBeforeAppended, []string{reborn}},
		{"ended twice in the new life", nil, nil, []string{forget, begin, end, end}, notUpgraded, []string{twice}},
		{"ended three times in the new life", nil, nil, []string{forget, begin, end, end, end}, notUpgraded, []string{thrice}},
		{"ended twice, no reuse", nil, []string{end}, nil, notUpgraded, []string{twice}},
		{"ended twice in the first life, then reused", nil, []string{end}, []string{forget, begin, end}, notUpgraded, []string{twice}},
		{"ended twice in both lives", nil, []string{end}, []string{forget, begin, end, end, end}, notUpgraded, []string{twice, thrice}},
		{"admitted again while live, ended twice", []string{begin}, []string{end}, nil, notUpgraded, []string{twice}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := soundLedger(t)
			var admit, release ledger.JournalEntry
			at := -1
			for i, e := range m.Journal {
				switch {
				case e.ReservationID == "released" && e.Begins():
					admit = e
				case e.ReservationID == "released" && e.Ends():
					release, at = e, i
				}
			}
			if at < 0 || admit.ReservationID == "" {
				t.Fatal("no admission and release of \"released\" in the journal")
			}
			admit.Delta, release.Delta = ledger.Balances{}, ledger.Balances{}
			forgotten := ledger.JournalEntry{At: release.At, Kind: ledger.KindForget, Account: release.Account,
				ReservationID: release.ReservationID, From: release.To, To: release.To}
			entries := func(steps []string) []ledger.JournalEntry {
				var out []ledger.JournalEntry
				for _, step := range steps {
					switch step {
					case begin:
						out = append(out, admit)
					case end:
						out = append(out, release)
					default:
						out = append(out, forgotten)
					}
				}
				return out
			}
			journal := slices.Concat(m.Journal[:at], entries(tc.before), m.Journal[at:at+1], entries(tc.after),
				m.Journal[at+1:])
			upgradedAt := int64(len(journal)) // Memory's journal[i] is at position i+1
			if tc.upgraded == upgradedAtRelease {
				upgradedAt = int64(at + len(tc.before) + 1)
				if e := journal[upgradedAt-1]; e.ReservationID != "released" || !e.Ends() {
					t.Fatalf("journal position %d is not the release", upgradedAt)
				}
			}
			m.Journal = append(journal, entries(tc.appended)...)
			snap := m.Snapshot()
			if tc.upgraded != notUpgraded {
				snap.ForgetsJournaledAfter = upgradedAt
			}
			var got []string
			for _, d := range ledger.Audit(snap) {
				if d.Check != ledger.CheckRefundOnce || d.Reservation != "released" {
					t.Errorf("unexpected discrepancy: %s", d)
					continue
				}
				if strings.HasPrefix(d.Detail, reborn) {
					d.Detail = reborn
				}
				got = append(got, d.Detail)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("refund_once found %q, want %q", got, tc.want)
			}
		})
	}
}
