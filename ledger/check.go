package ledger

import (
	"fmt"
	"slices"
)

// Snapshot is a whole ledger's rows, as an audit reads them from any store.
type Snapshot struct {
	Policies     []Policy
	Accounts     []Account
	Reservations []Reservation
	Moves        []Move
	Shards       []Shard
	Statements   []Statement
	Journal      []JournalEntry
	// JournalComplete says Journal holds every entry since the beginning, so
	// replay checks apply.
	JournalComplete bool
}

// Discrepancy is one failed audit check.
type Discrepancy struct {
	Check       string // short name of the rule, e.g. "conservation"
	Account     string
	Reservation string
	Detail      string
}

func (d Discrepancy) String() string {
	s := d.Check
	if d.Account != "" {
		s += " account=" + d.Account
	}
	if d.Reservation != "" {
		s += " reservation=" + d.Reservation
	}
	return s + ": " + d.Detail
}

// Audit names of the checks.
const (
	CheckConservation = "conservation"
	CheckNegative     = "negative_term"
	CheckReserved     = "reserved_vs_holds"
	CheckSpent        = "spent_vs_settled"
	CheckDebt         = "unrecorded_debt"
	CheckJournal      = "journal_replay"
	CheckRefundOnce   = "refund_once"
	CheckMove         = "move_both_ends"
	CheckStatement    = "statement_chain"
	CheckShard        = "shard_conservation"
)

// CheckAccount returns nil when the account satisfies the conservation
// equation in every dimension and no term is negative.
func CheckAccount(a *Account) error {
	for i := 0; i < a.Dims; i++ {
		if err := checkBalance(&a.Balances[i]); err != nil {
			return fmt.Errorf("%s dimension %d: %w", a.Key, i, err)
		}
	}
	return nil
}

func checkBalance(b *Balance) error {
	if b.Sources() != b.Uses() {
		return fmt.Errorf("opening %d + minted %d + overdraftIssued %d = %d, but available %d + reserved %d + spent %d + retiredForEmergency %d + retiredForMove %d + overdraftRepaid %d = %d",
			b.Opening, b.Minted, b.OverdraftIssued, b.Sources(),
			b.Available, b.Reserved, b.Spent, b.RetiredForEmergency, b.RetiredForMove, b.OverdraftRepaid, b.Uses())
	}
	terms := [...]Units{b.Opening, b.Minted, b.OverdraftIssued, b.Available, b.Reserved, b.Spent,
		b.RetiredForEmergency, b.RetiredForMove, b.OverdraftRepaid}
	for _, t := range terms {
		if t < 0 {
			return fmt.Errorf("negative term in %+v", *b)
		}
	}
	if b.OverdraftRepaid > b.OverdraftIssued {
		return fmt.Errorf("repaid %d more than issued %d", b.OverdraftRepaid, b.OverdraftIssued)
	}
	return nil
}

// Audit checks a whole ledger and returns every discrepancy (none when the
// ledger is sound):
//   - every account's conservation equation, per dimension, and no negative
//     term;
//   - each account's Reserved equals the holds of its RESERVED, STARTED,
//     EXPIRING and USAGE_UNKNOWN reservations (unknown usage is never
//     counted as unconsumed);
//   - each account's Spent equals the actual usage of its settled
//     reservations, and its OverdraftIssued covers their overdraft (no
//     unrecorded debt);
//   - each shard account's RetiredForEmergency equals its shards' allocation,
//     and each reconciled shard splits its allocation exactly;
//   - with a complete journal: replaying it gives every account's balances,
//     no reservation was refunded twice, every move is journaled at both
//     ends;
//   - statements chain: each epoch opens with the previous closing.
func Audit(s *Snapshot) []Discrepancy {
	var out []Discrepancy
	add := func(check string, account AccountKey, reservation, format string, args ...any) {
		acc := ""
		if account != (AccountKey{}) {
			acc = account.String()
		}
		out = append(out, Discrepancy{Check: check, Account: acc, Reservation: reservation, Detail: fmt.Sprintf(format, args...)})
	}

	type sums struct{ held, spent, overdraft, shards Amounts }
	per := map[AccountKey]*sums{}
	get := func(k AccountKey) *sums {
		if per[k] == nil {
			per[k] = &sums{}
		}
		return per[k]
	}
	for i := range s.Reservations {
		r := &s.Reservations[i]
		t := get(r.Account)
		for d := range r.Reserved {
			switch {
			case r.State.Holds():
				t.held[d] += r.Reserved[d]
			case r.State == StateSettled || r.State == StateSettledWithDebt:
				t.spent[d] += r.Actual[d]
				t.overdraft[d] += r.Overdraft[d]
			}
		}
		if r.State == StateSettledWithDebt && r.Overdraft == (Amounts{}) {
			add(CheckDebt, r.Account, r.ID, "SETTLED_WITH_DEBT without overdraft")
		}
	}
	for i := range s.Shards {
		sh := &s.Shards[i]
		t := get(sh.Account)
		for d := range sh.Allocated {
			t.shards[d] += sh.Allocated[d]
		}
		if sh.Reconciled {
			for d := range sh.Allocated {
				if sh.Spent[d]+sh.Unknown[d]+sh.Reminted[d] != sh.Allocated[d] || sh.Spent[d] < 0 || sh.Unknown[d] < 0 || sh.Reminted[d] < 0 {
					add(CheckShard, sh.Account, "", "shard %s dimension %d: allocated %d != spent %d + unknown %d + reminted %d",
						sh.ID, d, sh.Allocated[d], sh.Spent[d], sh.Unknown[d], sh.Reminted[d])
				}
			}
		}
	}
	for i := range s.Accounts {
		a := &s.Accounts[i]
		for d := 0; d < a.Dims; d++ {
			if err := checkBalance(&a.Balances[d]); err != nil {
				add(CheckConservation, a.Key, "", "dimension %d: %v", d, err)
			}
		}
		t := get(a.Key)
		for d := 0; d < MaxDimensions; d++ {
			bal := &a.Balances[d]
			if bal.Reserved != t.held[d] {
				add(CheckReserved, a.Key, "", "dimension %d: reserved %d, holds %d", d, bal.Reserved, t.held[d])
			}
			if bal.Spent != t.spent[d] {
				add(CheckSpent, a.Key, "", "dimension %d: spent %d, settled actual usage %d", d, bal.Spent, t.spent[d])
			}
			if bal.OverdraftIssued < t.overdraft[d] {
				add(CheckDebt, a.Key, "", "dimension %d: overdraft issued %d < settled overdraft %d", d, bal.OverdraftIssued, t.overdraft[d])
			}
			if bal.RetiredForEmergency != t.shards[d] {
				add(CheckShard, a.Key, "", "dimension %d: retiredForEmergency %d, shards allocated %d", d, bal.RetiredForEmergency, t.shards[d])
			}
		}
	}

	if s.JournalComplete {
		replayed := map[AccountKey]*Balances{}
		refunds := map[string]int{}
		receipts := map[string]map[AccountKey]bool{}
		for i := range s.Journal {
			e := &s.Journal[i]
			if replayed[e.Account] == nil {
				replayed[e.Account] = &Balances{}
			}
			replayed[e.Account].Add(&e.Delta)
			if e.ReservationID != "" && e.To.Terminal() && e.From != e.To {
				refunds[e.ReservationID]++
			}
			if e.ReceiptID != "" {
				if receipts[e.ReceiptID] == nil {
					receipts[e.ReceiptID] = map[AccountKey]bool{}
				}
				receipts[e.ReceiptID][e.Account] = true
			}
		}
		for i := range s.Accounts {
			a := &s.Accounts[i]
			got := replayed[a.Key]
			if got == nil {
				got = &Balances{}
			}
			if *got != a.Balances {
				add(CheckJournal, a.Key, "", "journal replays to %+v, account holds %+v", got[:a.Dims], a.Balances[:a.Dims])
			}
		}
		for id, n := range refunds {
			if n > 1 {
				add(CheckRefundOnce, AccountKey{}, id, "ended %d times", n)
			}
		}
		for i := range s.Moves {
			m := &s.Moves[i]
			ends := receipts[m.ReceiptID]
			if m.Kind != MoveShardRemint && !ends[m.From] {
				add(CheckMove, m.From, "", "move %s not journaled at its source", m.ReceiptID)
			}
			if !ends[m.To] {
				add(CheckMove, m.To, "", "move %s not journaled at its destination", m.ReceiptID)
			}
		}
	}

	byAccount := map[AccountKey][]Statement{}
	for _, st := range s.Statements {
		byAccount[st.Account] = append(byAccount[st.Account], st)
	}
	accountByKey := map[AccountKey]*Account{}
	for i := range s.Accounts {
		accountByKey[s.Accounts[i].Key] = &s.Accounts[i]
	}
	for key, list := range byAccount {
		slices.SortFunc(list, func(a, b Statement) int { return a.EpochStart.Compare(b.EpochStart) })
		for i, st := range list {
			for d := 0; d < st.Dims; d++ {
				if err := checkBalance(&st.Closing[d]); err != nil {
					add(CheckStatement, key, "", "epoch %s closing: %v", st.EpochStart.Format("2006-01-02T15:04Z"), err)
				}
			}
			if i > 0 && (list[i-1].Closing != st.Opening || !list[i-1].EpochEnd.Equal(st.EpochStart)) {
				add(CheckStatement, key, "", "epoch %s does not open where %s closed", st.EpochStart, list[i-1].EpochStart)
			}
		}
		if a := accountByKey[key]; a != nil {
			last := list[len(list)-1]
			if last.Closing != a.EpochOpening || !last.EpochEnd.Equal(a.EpochStart) {
				add(CheckStatement, key, "", "current epoch %s does not open where %s closed", a.EpochStart, last.EpochStart)
			}
		}
	}
	return out
}
