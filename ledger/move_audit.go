package ledger

import (
	"fmt"
	"slices"
)

// CheckMoveAmounts names the audit check that what a move's journal
// entries retired at its source equals what they minted at its
// destination, in each unit, and that both equal the move's receipt
// (moveConservation).
const CheckMoveAmounts = "move_conservation"

// moveEnds are, for each stored move's receipt, what its journal entries
// since the last checkpoint moved at each end, for the audit's checks that
// a move is journaled once at both ends and that the ends agree. Only the
// receipts of the snapshot's moves are kept: other entries name a receipt
// too (every account's opening names "open", a shard issue its shard), and
// keeping those cost about 110 bytes per account opened since the last
// checkpoint, its subject included, for the whole audit
// (docs/PERFORMANCE.md, a million tenants). A receipt holds a moveSeen
// (pointer-free, 400 bytes) only once its entries are in the journal.
type moveEnds struct {
	ends map[string]moveRef // receipt id -> its move, and what its entries moved
}

// moveRef is a receipt's move and, once an entry names it, what its
// entries moved.
type moveRef struct {
	move *Move
	seen *moveSeen
}

// moveSeen is what the journal entries naming one move's receipt moved:
// how many there are at its source, at its destination and at any other
// account, and the sums of their deltas at each end, per dimension of
// that end's own policy.
type moveSeen struct {
	from, to, other int32
	src, dst        [MaxDimensions]moveTerms
}

// moveTerms are the terms of a delta a move's check reads; other sums
// the size of every term a move never changes (opening, reserved, spent,
// retired for emergency), which must stay 0.
type moveTerms struct {
	minted, issued, available, retired, repaid, other Units
}

func (t *moveTerms) add(b *Balance) {
	t.minted += b.Minted
	t.issued += b.OverdraftIssued
	t.available += b.Available
	t.retired += b.RetiredForMove
	t.repaid += b.OverdraftRepaid
	t.other += abs(b.Opening) + abs(b.Reserved) + abs(b.Spent) + abs(b.RetiredForEmergency)
}

func abs(u Units) Units {
	if u < 0 {
		return -u
	}
	return u
}

func (t *moveTerms) String() string {
	return fmt.Sprintf("minted %d, overdraftIssued %d, available %+d, retiredForMove %d, overdraftRepaid %d, other terms %d",
		t.minted, t.issued, t.available, t.retired, t.repaid, t.other)
}

func newMoveEnds(moves []Move) moveEnds {
	m := moveEnds{ends: make(map[string]moveRef, len(moves))}
	for i := range moves {
		m.ends[moves[i].ReceiptID] = moveRef{move: &moves[i]}
	}
	return m
}

// note adds e to the move e's receipt names, if it names one: at its
// destination, its source, or elsewhere. A remint whose source is its
// destination (the shard's own generation takes it) is journaled once,
// as its destination.
func (m moveEnds) note(e *JournalEntry) {
	if e.ReceiptID == "" {
		return
	}
	ref, isMove := m.ends[e.ReceiptID]
	if !isMove {
		return
	}
	if ref.seen == nil {
		ref.seen = &moveSeen{}
		m.ends[e.ReceiptID] = ref
	}
	seen := ref.seen
	var terms *[MaxDimensions]moveTerms
	switch e.Account {
	case ref.move.To:
		seen.to++
		terms = &seen.dst
	case ref.move.From:
		seen.from++
		terms = &seen.src
	default:
		seen.other++
		return
	}
	for d := range terms {
		terms[d].add(&e.Delta[d])
	}
}

// seen returns what the journal since the last checkpoint holds of the
// move with receipt id, nil when it holds none of it.
func (m moveEnds) seen(id string) *moveSeen { return m.ends[id].seen }

// held counts the receipts whose entries are held (tests).
func (m moveEnds) held() int {
	n := 0
	for _, ref := range m.ends {
		if ref.seen != nil {
			n++
		}
	}
	return n
}

// auditMoveAmounts runs moveConservation over every move of s whose
// entries the journal since the last checkpoint holds (receipts), reading
// the policies of a page of them at a time (auditPolicyPage), as the
// burst checks do. policies are s's when s has no PoliciesOf. It returns
// the discrepancies and the error of a policy read.
func (s *Snapshot) auditMoveAmounts(receipts moveEnds, policies map[uint64]*Policy) ([]Discrepancy, error) {
	var out []Discrepancy
	page := make([]*Move, 0, min(len(s.Moves), auditPolicyPage))
	check := func() error {
		defer func() { page = page[:0] }()
		found := policies
		if s.PoliciesOf != nil {
			generations := make([]uint64, 0, 2*len(page))
			for _, m := range page {
				generations = append(generations, m.From.Generation, m.To.Generation)
			}
			slices.Sort(generations)
			read, err := s.PoliciesOf(slices.Compact(generations))
			if err != nil {
				return err
			}
			found = make(map[uint64]*Policy, len(read))
			for g := range read {
				p := read[g]
				found[g] = &p
			}
		}
		for _, m := range page {
			fp, tp := found[m.From.Generation], found[m.To.Generation]
			if fp == nil || tp == nil {
				continue // no policy to match units by (the burst checks skip such accounts too)
			}
			out = moveConservation(out, m, receipts.seen(m.ReceiptID), fp, tp)
		}
		return nil
	}
	for i := range s.Moves {
		if receipts.seen(s.Moves[i].ReceiptID) == nil {
			continue // summarised by the last checkpoint, or reported by move_both_ends
		}
		if page = append(page, &s.Moves[i]); len(page) == auditPolicyPage {
			if err := check(); err != nil {
				return out, err
			}
		}
	}
	if len(page) > 0 {
		if err := check(); err != nil {
			return out, err
		}
	}
	return out, nil
}

// moveConservation appends to out what is wrong with the amounts of move
// m, whose source's generation has policy fp and destination's tp, given
// what its journal entries moved (seen): what left the source must equal
// the receipt and what arrived at the destination, in each unit. Units are
// matched by name: the receipt's Units and Debt, and the source's entry,
// are in fp's dimensions (i), the destination's entry in tp's (j, the
// index of i's unit in tp, -1 when tp does not limit it). With U =
// m.Units[i] and D = m.Debt[i], the deltas each side's entry writes are
// (moveBetween, remintShard, chargeDebt, mint):
//
// A generation switch or a forward (drains, forwarded refunds and debt, an
// owing account's move): the debt is assumed by the destination (issued
// and retired there, minted and repaid at the source), then capacity is
// retired at the source and minted at the destination, where minted units
// and available repay debt first:
//
//	source i:      minted D, overdraftRepaid D, retiredForMove U, available -U
//	destination j: minted U, overdraftIssued D, retiredForMove D,
//	               available + overdraftRepaid = U (as the repayments split it)
//
// so capacity: source retiredForMove = U = destination minted; debt:
// source minted = source overdraftRepaid = D = destination overdraftIssued
// = destination retiredForMove. With j = -1, U = D = 0 (the unit stays
// behind) and the source's entry moves nothing there.
//
// A shard remint: the source is the shard (its confirmed-unused capacity,
// checked against the shard by shard_remint_once), whose usage beyond its
// allocation is charged as debt; the remint retires at once what it lifts
// past the destination's burst (over, 0 <= over <= U):
//
//	destination j: minted U, overdraftIssued D, retiredForMove D + over,
//	               available + overdraftRepaid = U - over
//	source i, j = -1 (an entry at the shard's own account): U = 0,
//	               overdraftIssued D, retiredForMove D, available +
//	               overdraftRepaid = 0 (debt repaid from its available)
//
// Every other term of both entries (opening, reserved, spent, retired for
// emergency) is 0, and so is every term of a destination dimension no
// source unit maps to. An entry naming the receipt at any third account
// is reported too.
func moveConservation(out []Discrepancy, m *Move, seen *moveSeen, fp, tp *Policy) []Discrepancy {
	add := func(at AccountKey, format string, args ...any) {
		acc := ""
		if at != (AccountKey{}) {
			acc = at.String()
		}
		out = append(out, Discrepancy{Check: CheckMoveAmounts, Account: acc,
			Detail: fmt.Sprintf("move %s (%s): ", m.ReceiptID, m.Kind) + fmt.Sprintf(format, args...)})
	}
	if seen.other > 0 {
		add(AccountKey{}, "%d entries name it at accounts that are neither its source nor its destination", seen.other)
	}
	remint := m.Kind == MoveShardRemint
	srcJournaled := seen.from > 0
	dstJournaled := seen.to > 0
	var mapped [MaxDimensions]bool
	for i := 0; i < MaxDimensions; i++ {
		u, d := m.Units[i], m.Debt[i]
		j := -1
		if i < len(fp.Dimensions) {
			j = tp.DimensionIndex(fp.Dimensions[i].Unit)
		}
		if j >= MaxDimensions {
			j = -1
		}
		name := dimensionName(fp, i)
		src := &seen.src[i]
		if j < 0 {
			// Nothing arrives in a unit the destination does not limit:
			// no capacity leaves for it, and debt is the shard's own
			// account's (a remint) or stays behind.
			if u != 0 || (!remint && d != 0) {
				add(m.To, "%s: the receipt moves %d units and %d debt to a destination that does not limit the unit", name, u, d)
			}
			switch {
			case remint && d != 0 && !srcJournaled:
				add(m.From, "%s: debt %d charged to the shard's own account, which has no entry", name, d)
			case remint && srcJournaled && (src.issued != d || src.retired != d || src.available+src.repaid != 0 || src.minted != 0 || src.other != 0):
				add(m.From, "%s: the source's entry has %s; debt %d charged there wants overdraftIssued %d, retiredForMove %d, available + overdraftRepaid 0, nothing else",
					name, src, d, d, d)
			case !remint && srcJournaled && *src != (moveTerms{}):
				add(m.From, "%s: the source's entry has %s in a unit that stays behind", name, src)
			}
			continue
		}
		mapped[j] = true
		if srcJournaled {
			bad := *src != (moveTerms{})
			if !remint {
				bad = src.retired != u || src.available != -u || src.minted != d || src.repaid != d || src.issued != 0 || src.other != 0
			}
			if bad {
				add(m.From, "%s: left the source: %s; the receipt moves %d units and %d debt", name, src, u, d)
			}
		}
		if !dstJournaled {
			continue
		}
		dst := &seen.dst[j]
		over := Units(0)
		if remint {
			over = dst.retired - d
		}
		if dst.minted != u || dst.issued != d || over < 0 || over > u || dst.retired != d+over ||
			dst.available+dst.repaid != u-over || dst.other != 0 {
			add(m.To, "%s: arrived at the destination %s: %s; the receipt moves %d units and %d debt", name, dimensionName(tp, j), dst, u, d)
		}
	}
	if dstJournaled {
		for j := range seen.dst {
			if !mapped[j] && seen.dst[j] != (moveTerms{}) {
				add(m.To, "%s: arrived at the destination: %s in a unit the source does not hold", dimensionName(tp, j), &seen.dst[j])
			}
		}
	}
	return out
}
