package ledger

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// currentAccount returns the account that holds the subject's capacity under
// policy p, and that account's own policy, creating p's account when p's
// generation has none yet. When the subject's capacity sits in another
// generation's account (a new generation was published, or the current one
// rolled back), that account is first brought to now under its own rule,
// then its available capacity and debt move over, exactly once, so a
// republished policy neither hands out a fresh burst nor forgets debt.
//
// The exception is debt p cannot take: while any account of the subject
// owes debt in a unit p does not limit (its owing set, settleOwing), the
// subject does not switch. Its current account stays current under its
// own policy (returned instead of p: ap != p means frozen): the owing
// accounts refill to repay (only to repay in such a unit, or when their
// generation was rolled back), their debt freezes the subject's admission
// whatever generation decides, and the subject switches on the first
// command after the last is repaid, taking what they still owe in units
// p limits (releaseOwing).
func currentAccount(b Book, subject PolicyKey, p *Policy, now time.Time) (*Account, *Policy, bool) {
	account, ap, _, ok := switchTo(b, subject, p, now)
	return account, ap, ok
}

// switchTo is currentAccount that also returns the generation switch's move
// receipt when it made one.
func switchTo(b Book, subject PolicyKey, p *Policy, now time.Time) (*Account, *Policy, *Move, bool) {
	currentGeneration, hasCurrent := b.AccountCurrent(subject)
	key := AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: p.Generation}
	if hasCurrent && currentGeneration == p.Generation {
		account, ok := b.Account(key)
		// The hot path. Only an account that owes looks at the owing
		// set: a rollback may have made it decide again while another
		// of the subject's accounts owes debt it does not limit.
		if !ok || !owes(account) || !hasOwing(b, subject) {
			return account, p, nil, ok
		}
	}
	var rest []uint64
	if hasCurrent {
		a, ap, frozen, left := settleOwing(b, subject, currentGeneration, p, now)
		if frozen {
			// An account of the subject owes debt p cannot take: the
			// subject stays on its current account, such an owing one,
			// until refill repays every such debt.
			return a, ap, nil, true
		}
		rest = left
		if currentGeneration == p.Generation {
			account, ok := b.Account(key)
			if ok {
				releaseOwing(b, subject, rest, account, 0, now)
			}
			return account, p, nil, ok
		}
	}
	var previous *Account
	var previousPolicy *Policy
	if hasCurrent {
		previousKey := key
		previousKey.Generation = currentGeneration
		if a, ok := b.Account(previousKey); ok {
			if pp, found := b.Policy(currentGeneration); found {
				previous, previousPolicy = a, pp
				// Bring it to now under its own rule while it still
				// holds the subject's capacity: it refills up to the
				// switch, the new account from the switch on.
				bringToNow(b, previous, previousPolicy, now, !previousPolicy.RolledBack)
				b.AccountPut(previous)
			}
		}
	}
	account, exists := b.Account(key)
	if exists {
		// Close the elapsed epoch of an account that becomes current
		// again before capacity moves in: what arrives now belongs to the
		// epoch of now.
		rollEpoch(b, account, p, now)
	} else {
		account = openAccount(b, key, p, previousPolicy, now)
	}
	// While another generation held the subject's capacity this account
	// minted nothing, and that other account refilled for the time.
	refillFromNow(account, now)
	if previous != nil {
		carryHeld(previous, previousPolicy, account, p)
		b.AccountPut(previous)
	}
	b.AccountPut(account)
	b.AccountCurrentPut(subject, p.Generation)
	var move *Move
	if previous != nil {
		receipt := "switch:" + previous.Key.String() + ">" + strconv.FormatUint(p.Generation, 10) +
			":" + strconv.FormatUint(previous.Version, 10)
		move = moveBetween(b, previous, account, MoveGenerationSwitch, receipt, now)
	}
	releaseOwing(b, subject, rest, account, currentGeneration, now)
	return account, p, move, true
}

// openAccount creates the subject's account of p's generation (key) and
// journals its opening; previousPolicy is the policy of the account that
// holds the subject's capacity now (nil when none does).
//
// A unit the previous account's policy does not limit opens with a full
// burst only if no other account of the subject may hold or owe it: one
// the subject's capacity left behind (left_behind, written by every move
// away from an account whose policy limits the unit, whatever it held
// there) or an owing member whose policy limits it. Else it opens at 0
// and its capacity and debt arrive by moves (the switch's, an owing
// member's, a drain's, a forwarded refund's, a shard's remint) and by this
// account's own refill: a full burst there would be minted beside the
// older account's holdings, and would repay its debt from nothing. The
// Book cannot list a subject's accounts, so the check is conservative: a
// unit once left behind opens at 0 for good, even after what was left
// there was reserved and settled away.
func openAccount(b Book, key AccountKey, p *Policy, previousPolicy *Policy, now time.Time) *Account {
	account := &Account{Key: key, Dims: len(p.Dimensions)}
	subject := key.SubjectKey()
	var owing []*Policy
	if previousPolicy != nil {
		for _, g := range owingOf(b, subject) {
			if op, ok := b.Policy(g); ok && g != key.Generation {
				owing = append(owing, op)
			}
		}
	}
	for i := range p.Dimensions {
		// A unit the previous account limited arrives with the move
		// below; a unit nobody limited yet opens with a full burst, as
		// the subject's first account does.
		unit := p.Dimensions[i].Unit
		if previousPolicy != nil && previousPolicy.DimensionIndex(unit) >= 0 {
			continue
		}
		if previousPolicy != nil && (b.Meta(metaLeftBehind(subject, unit)) != 0 || slices.ContainsFunc(owing, func(op *Policy) bool { return op.DimensionIndex(unit) >= 0 })) {
			continue
		}
		account.Balances[i].Opening = p.Dimensions[i].Burst
		account.Balances[i].Available = p.Dimensions[i].Burst
	}
	startEpoch(account, p, now)
	before := Balances{}
	journal(b, account, &before, KindReserve, "", StateRequested, StateRequested, "open", now)
	return account
}

// decidingAccount returns the subject's account of p's generation while
// the subject's current account (under its policy current) owes debt p
// does not limit, opening it (without making it current) if it does not
// exist yet.
func decidingAccount(b Book, subject PolicyKey, p, current *Policy, now time.Time) *Account {
	key := AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: p.Generation}
	if a, ok := b.Account(key); ok {
		return a
	}
	a := openAccount(b, key, p, current, now)
	refillFromNow(a, now)
	b.AccountPut(a)
	return a
}

// owes reports whether a owes debt in any dimension.
func owes(a *Account) bool {
	_, debt := a.Debt()
	return debt > 0
}

// owesDropped reports whether a (under its policy ap) owes debt in a unit
// p does not limit: debt no move can take to p's account.
func owesDropped(a *Account, ap, p *Policy) bool {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if a.Balances[i].Debt() > 0 && p.DimensionIndex(ap.Dimensions[i].Unit) < 0 {
			return true
		}
	}
	return false
}

// bringOwingToNow brings the subject's current account a, which owes debt
// p, the deciding generation's policy, cannot take (owesDropped), to now
// under its own policy ap. A unit p does not limit refills only to repay
// debt: available capacity in it would stay behind at the switch, where
// nothing admits it. When ap was rolled back (a rolled-back generation
// mints no capacity) every unit refills only to repay debt, and a unit p
// limits not at all while p's account exists: p's account refills it
// then (settleOwing), and this debt moves there at the switch.
//
// The invariant: the subject's capacity in a unit p limits is refilled in
// one place, here, by the current account, and never beyond its burst
// counting what p's account (when it is not a) holds in that unit,
// available (decidingShare) and reserved (a counts it with every hold
// of the subject's other accounts, Account.HeldElsewhere). When a became
// current, p's account moved its available capacity to a (makeCurrent),
// but it keeps its reservations,
// what a's burst had no room for, and what other members move to it while
// the subject is frozen (settleOwing), and it does not refill such a unit
// (settleOwing), so a's refill room there is its burst less both
// accounts' holdings: else the subject, at burst on p's account, would
// mint on a what the switch cannot move into p's burst, and a rollback
// would admit it.
func bringOwingToNow(b Book, a *Account, ap, p *Policy, now time.Time) {
	rollEpoch(b, a, ap, now)
	var repayOnly uint8
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if ap.RolledBack || p.DimensionIndex(ap.Dimensions[i].Unit) < 0 {
			repayOnly |= 1 << i
		}
	}
	// A rolled-back current account does not refill a unit p limits
	// while p's account exists: p's account refills it fully then
	// (settleOwing: the current account refills only to repay), and the
	// debt here moves there at the switch, where its refill repays it.
	// Both refilling would repay this debt beside p's refill, minting
	// the subject's capacity twice for the same time.
	var skip uint8
	if ap.RolledBack && a.Key.Generation != p.Generation {
		key := a.Key
		key.Generation = p.Generation
		if _, ok := b.Account(key); ok {
			skip = limitedBy(a, ap, p)
		}
	}
	held := decidingShare(b, a, ap, p)
	if before, minted := refillUpTo(a, ap, now, repayOnly, skip, &held); minted {
		journal(b, a, &before, KindRefill, "", 0, 0, "", now)
	}
}

// decidingShare returns, per dimension of a (under its policy ap), what
// the account of p, the deciding generation, holds available in the same
// unit when a is not that account: the subject's capacity a must leave
// room for under its burst. It is the one rule for that room, whatever
// brings capacity into a while a is the owing current account: its refill
// (bringOwingToNow) and a shard's remint (remintTarget, remintShard).
// Debt p's account owes there gives a no room beyond its burst (the
// audit holds every account within its own burst, above_burst): while
// the subject is frozen that debt moves to a (intoDeciding), whose
// refill repays it first. What p's account holds reserved a
// counts already, as every hold of the subject's other accounts
// (Account.HeldElsewhere). Zero where p does not limit the unit or its
// account does not exist yet.
func decidingShare(b Book, a *Account, ap, p *Policy) Amounts {
	available, _ := decidingHolds(b, a, ap, p)
	return available
}

// decidingHolds returns, per dimension of a (under its policy ap), the
// available and reserved capacity the deciding generation's account (p's)
// holds in the same unit, when a is not that account; zero where p does
// not limit the unit or its account does not exist yet.
func decidingHolds(b Book, a *Account, ap, p *Policy) (available, reserved Amounts) {
	if a.Key.Generation == p.Generation {
		return available, reserved
	}
	key := a.Key
	key.Generation = p.Generation
	deciding, ok := b.Account(key)
	if !ok {
		return available, reserved
	}
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if j := p.DimensionIndex(ap.Dimensions[i].Unit); j >= 0 && j < deciding.Dims {
			available[i], reserved[i] = deciding.Balances[j].Available, deciding.Balances[j].Reserved
		}
	}
	return available, reserved
}

// makeCurrent makes a, which owes debt the subject's current account
// cannot take, the subject's current account again: it refills from now
// (until now another account refilled for the time), and the subject's
// admission stays frozen by its debt until refill repays it.
//
// The account it replaces (the subject's current one until now, brought
// to now by the caller) moves its available capacity and debt to a
// (moveBetween, receipt "owing:<account>:<version>"), as every change of
// the current pointer does (switchTo moves them too): the subject's
// capacity stays where its admission is decided and refilled, and no
// second account keeps it beside a. What a cannot take (a unit its
// policy does not limit, capacity beyond its burst) stays behind, and a
// unit left so is marked (left_behind), so a later generation limiting it
// again opens it at 0.
func makeCurrent(b Book, a *Account, now time.Time) {
	subject := a.Key.SubjectKey()
	refillFromNow(a, now)
	b.AccountPut(a)
	if g, ok := b.AccountCurrent(subject); ok && g != a.Key.Generation {
		key := a.Key
		key.Generation = g
		if r, found := b.Account(key); found {
			rp, ok1 := b.Policy(g)
			ap, ok2 := b.Policy(a.Key.Generation)
			if ok1 && ok2 {
				carryHeld(r, rp, a, ap)
				b.AccountPut(r)
				b.AccountPut(a)
			}
			owingMove(b, r, a, now)
		}
	}
	b.AccountCurrentPut(subject, a.Key.Generation)
}

// carryHeld is the one rule for the subject's holds on accounts that are
// not current (Account.HeldElsewhere), applied wherever the current
// pointer moves (switchTo, makeCurrent), before capacity moves: from (under
// its policy fp) is the account the pointer leaves, to (under tp) the one
// it moves to. In each unit to limits, to counts what from counted and
// from's own holds, less to's own holds (counted there while to was not
// current); from counts nothing any more. A unit from does not limit
// starts from to's own holds left out: holds in it that an account before
// from kept are not known (the unit was left behind, openAccount).
func carryHeld(from *Account, fp *Policy, to *Account, tp *Policy) {
	var held Amounts
	for j := 0; j < to.Dims && j < len(tp.Dimensions); j++ {
		if i := fp.DimensionIndex(tp.Dimensions[j].Unit); i >= 0 && i < from.Dims {
			held[j] = from.HeldElsewhere[i] + from.Balances[i].Reserved
		}
		held[j] = max(held[j]-to.Balances[j].Reserved, 0)
	}
	from.HeldElsewhere = Amounts{}
	to.HeldElsewhere = held
}

// Holding is one of a subject's accounts with its policy, as
// HeldElsewhereOf reads the subject's other accounts.
type Holding struct {
	Account *Account
	Policy  *Policy
}

// HeldElsewhereOf returns what cur, the subject's current account under
// its policy cp, counts as held elsewhere (Account.HeldElsewhere) while
// others, the subject's other accounts, hold what they hold: in each
// dimension of cp, the sum of what they hold reserved in its unit
// (Balance.Reserved, the holds of their reservations in a state that
// holds, State.Holds, as the audit's reserved_vs_holds checks),
// matched by unit name under each one's own policy. An entry of others
// with cur's key is not elsewhere and is skipped.
//
// It is the count carryHeld and dropHeld keep as holds begin and end, in
// every unit no generation in between left behind; in a unit left behind
// they count less (the holds from before the gap are not known at the
// switch that opens the unit again, openAccount), this more. A store
// migrating to a schema that counts holds elsewhere sets each current
// account's count with it, for the holds outstanding at the upgrade.
func HeldElsewhereOf(cur *Account, cp *Policy, others []Holding) Amounts {
	var held Amounts
	for _, o := range others {
		if o.Account == nil || o.Policy == nil || o.Account.Key == cur.Key {
			continue
		}
		for j := 0; j < cur.Dims && j < len(cp.Dimensions); j++ {
			if i := o.Policy.DimensionIndex(cp.Dimensions[j].Unit); i >= 0 && i < o.Account.Dims {
				held[j] += o.Account.Balances[i].Reserved
			}
		}
	}
	return held
}

// dropHeld lowers the count of holds elsewhere of cur, the subject's
// current account (under its policy cp), by ended, what a hold on the
// subject's account a (under ap, a itself not current when the hold
// ended) reserved: the hold ended, so it no longer takes room from the
// current account's burst. A count never goes below 0 (a unit left
// behind was not counted, carryHeld). It reports whether the count
// changed.
func dropHeld(cur *Account, cp *Policy, a *Account, ap *Policy, ended *Amounts) bool {
	changed := false
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if ended[i] == 0 {
			continue
		}
		if j := cp.DimensionIndex(ap.Dimensions[i].Unit); j >= 0 && j < cur.Dims && cur.HeldElsewhere[j] > 0 {
			cur.HeldElsewhere[j] = max(cur.HeldElsewhere[j]-ended[i], 0)
			changed = true
		}
	}
	return changed
}

// moveBetween moves from's debt and available capacity to to: the debt is
// assumed by to (issued and retired at to, minted and repaid at from) and
// repaid from to's available as far as it goes, then the capacity is
// retired at from and minted at to, where it repays debt first like any
// mint, up to the destination's burst. Units are matched by dimension
// unit; a unit the destination's policy no longer limits, and capacity
// beyond the destination's burst, stay behind. It does nothing and
// returns nil when there is nothing to move or the receipt was already
// applied.
func moveBetween(b Book, from, to *Account, kind MoveKind, receiptID string, now time.Time) *Move {
	return moveOf(b, from, to, kind, receiptID, false, now)
}

// moveDebt is moveBetween for from's debt alone, in the units to limits:
// from keeps its available capacity, and nothing is left behind (from
// keeps what to does not limit, and stays where it was in its subject).
// intoDeciding moves the deciding account's debt to a frozen subject's
// current account with it.
func moveDebt(b Book, from, to *Account, receiptID string, now time.Time) *Move {
	return moveOf(b, from, to, MoveForward, receiptID, true, now)
}

// moveOf is moveBetween, or moveDebt when debtOnly is set.
func moveOf(b Book, from, to *Account, kind MoveKind, receiptID string, debtOnly bool, now time.Time) *Move {
	if _, done := b.Move(receiptID); done {
		return nil
	}
	fromPolicy, ok1 := b.Policy(from.Key.Generation)
	toPolicy, ok2 := b.Policy(to.Key.Generation)
	if !ok1 || !ok2 {
		return nil
	}
	move := Move{ReceiptID: receiptID, Kind: kind, From: from.Key, To: to.Key, At: now}
	fromBefore, toBefore := from.Balances, to.Balances
	moved := false
	if !debtOnly {
		leaveBehind(b, from, fromPolicy, toPolicy)
	}
	for i := 0; i < from.Dims; i++ {
		j := toPolicy.DimensionIndex(fromPolicy.Dimensions[i].Unit)
		if j < 0 {
			continue // left behind
		}
		src, dst := &from.Balances[i], &to.Balances[j]
		if debt := src.Debt(); debt > 0 {
			dst.OverdraftIssued += debt
			dst.RetiredForMove += debt
			src.Minted += debt
			src.OverdraftRepaid += debt
			move.Debt[i] = debt
			moved = true
			// Overuse takes available capacity first: the debt arriving
			// here (a late overuse on a superseded generation) is repaid
			// from this account's available before anything freezes.
			if repay := min(debt, dst.Available); repay > 0 {
				dst.Available -= repay
				dst.OverdraftRepaid += repay
			}
		}
		// Capacity moves only as far as the destination's burst has room
		// (after repaying its debt), as a refill would: Burst caps
		// available + reserved, so a forwarded refund must not lift the
		// subject above it. What does not fit stays on the superseded
		// account, where nothing is admitted.
		if debtOnly {
			continue
		}
		room := moveRoom(toPolicy.Dimensions[j].Burst, dst, to.HeldElsewhere[j])
		if units := min(src.Available, room); units > 0 {
			src.Available -= units
			src.RetiredForMove += units
			mint(dst, units)
			if units < room && mutantOn("move_mints_one") {
				mint(dst, 1)
			}
			move.Units[i] = units
			moved = true
		}
	}
	if !moved {
		return nil
	}
	journal(b, from, &fromBefore, KindDrain, "", 0, 0, receiptID, now)
	journal(b, to, &toBefore, KindDrain, "", 0, 0, receiptID, now)
	b.AccountPut(from)
	b.AccountPut(to)
	b.MovePut(&move)
	return &move
}

// metaLeftBehind is the Meta name marking that the subject's capacity in
// unit was left behind on an account (moveBetween to an account whose
// policy does not limit it, whatever the account held there: available,
// reserved, a shard's allocation, debt, or a burst just spent): 1 once it
// was, never removed. openAccount
// reads it only when it opens an account, at a switch.
func metaLeftBehind(s PolicyKey, unit string) string {
	return LeftBehindNamesOf(s) + metaNamePart(unit)
}

// MetaLeftBehindPrefix begins every left_behind name (metaLeftBehind).
const MetaLeftBehindPrefix = "left_behind/"

// noteLeftBehind marks the subject's unit as left behind (metaLeftBehind),
// writing the row only the first time.
func noteLeftBehind(b Book, s PolicyKey, unit string) {
	if name := metaLeftBehind(s, unit); b.Meta(name) == 0 {
		b.MetaPut(name, 1)
	}
}

// moveRoom is how much available capacity a move may bring to dst, a
// dimension whose policy bursts to burst: the burst's room above available
// and reserved and what the subject's other accounts hold there (held,
// Account.HeldElsewhere), plus dst's debt, which the units repay first.
func moveRoom(burst Units, dst *Balance, held Units) Units {
	return max(burst-dst.Available-dst.Reserved-held, 0) + dst.Debt()
}

// DrainRoom is the room a drain has for available capacity in dimension j
// of to, the deciding account under its policy p: to refilled to now when
// refills is set (the ledger's Drain refills the subject's current account
// under a generation not rolled back, on a copy, before it decides), then
// moveRoom, the burst's room above available, reserved and the holds
// elsewhere (Account.HeldElsewhere) plus to's debt.
// A drain moves min(available, DrainRoom) of a dimension. It reads to and
// writes nothing. A caller that holds to as stored (the engine's
// DrainProgress) gets the ledger's answer without the ledger's Book.
func DrainRoom(p *Policy, to *Account, j int, refills bool, now time.Time) Units {
	refilled := *to
	if refills {
		refillDue(&refilled, p, now)
	}
	return moveRoom(p.Dimensions[j].Burst, &refilled.Balances[j], refilled.HeldElsewhere[j])
}

// drainable reports whether moveBetween would move anything from from to
// to, the subject's current account, after to's refill due at now (when
// refills is set): debt, or available capacity to's burst has room for
// (DrainRoom).
func drainable(b Book, from, to *Account, refills bool, now time.Time) bool {
	fromPolicy, ok1 := b.Policy(from.Key.Generation)
	toPolicy, ok2 := b.Policy(to.Key.Generation)
	if !ok1 || !ok2 {
		return false
	}
	for i := 0; i < from.Dims; i++ {
		j := toPolicy.DimensionIndex(fromPolicy.Dimensions[i].Unit)
		if j < 0 {
			continue
		}
		src := &from.Balances[i]
		if src.Debt() > 0 {
			return true
		}
		if src.Available > 0 && DrainRoom(toPolicy, to, j, refills, now) > 0 {
			return true
		}
	}
	return false
}

// isCurrent reports whether a holds its subject's capacity: it is the
// account new reservations go to, and the only one that refills.
func isCurrent(b Book, a *Account) bool {
	generation, ok := b.AccountCurrent(a.Key.SubjectKey())
	return ok && generation == a.Key.Generation
}

// forward moves what a late refund or late debt left on an account that no
// longer holds its subject's capacity to the subject's current account
// (switching the subject to the active generation first if needed). The
// receipt is "<kind>:<reservation id>": one reservation ends once, so it
// forwards once. The caller has put account already. Debt the current
// account does not limit stays on account, which joins the subject's
// owing set (markOwing): while it owes debt in a unit the deciding
// generation does not limit the subject is frozen and its refill repays
// that debt at its own rate; debt the deciding generation limits moves
// to its account when the subject switches to it.
//
// ended is what the hold that ended on account (under its policy ap)
// reserved: the subject's current account counted it as held elsewhere
// (Account.HeldElsewhere), and no longer does (dropHeld).
func forward(b Book, account *Account, ap *Policy, ended *Amounts, kind Kind, reservationID string, now time.Time) {
	subject := account.Key.SubjectKey()
	// The current account no longer counts the hold, before anything
	// moves the current pointer (carryHeld) or capacity (moveRoom).
	if g, found := b.AccountCurrent(subject); found && g != account.Key.Generation {
		key := account.Key
		key.Generation = g
		if cur, cp, err := accountFor(b, key); err == nil && dropHeld(cur, cp, account, ap, ended) {
			b.AccountPut(cur)
		}
	}
	p, ok := activePolicy(b, subject)
	if !ok {
		// Nothing admits for the subject: the capacity stays where it
		// is. Debt left here joins the owing set all the same, so the
		// next generation's switch takes it (releaseOwing) or, in a
		// unit that generation does not limit, is frozen by it: else
		// that switch, from another account, would never see it.
		if owes(account) && !mutantOn("dropped_debt_forgotten") {
			markOwing(b, account, now)
		}
		return
	}
	target, tp, ok := currentAccount(b, subject, p, now)
	if !ok || target.Key == account.Key {
		return
	}
	// The switch, or a frozen subject's owing set (intoDeciding), may
	// have moved what account held: read it again, or the move below
	// would move it a second time from the copy.
	if fresh, found := b.Account(account.Key); found {
		account = fresh
	}
	if tp == p {
		bringToNow(b, target, p, now, !p.RolledBack)
		b.AccountPut(target)
	}
	moveBetween(b, account, target, MoveForward, kind.String()+":"+reservationID, now)
	if mutantOn("dropped_debt_forgotten") {
		return
	}
	a, ok := b.Account(account.Key)
	if !ok {
		return
	}
	if owes(a) {
		markOwing(b, a, now)
	} else if tp == p {
		return
	}
	// A refund forwarded to an owing current account may repay its
	// debt, and debt left here may freeze the subject: decide now
	// (settleOwing), so an account repaid switches at once and one that
	// owes is brought to now from here on.
	switchTo(b, subject, p, now)
}

// mint adds units to a balance: debt is repaid first, the rest becomes
// available.
func mint(bal *Balance, units Units) {
	bal.Minted += units
	repay := min(units, bal.Debt())
	if repay > 0 {
		bal.OverdraftRepaid += repay
	}
	bal.Available += units - repay
}

// tick brings an account to now under its own policy p: closes elapsed
// accounting epochs, and refills when the account is its subject's
// current account and p was not rolled back (see bringToNow). An account
// that owes, when its generation no longer decides or its subject has an
// owing set, is brought to now with the subject's owing accounts
// (switchTo, settleOwing), which switches the subject once they are
// repaid. Only an account that owes is looked at that way: the hot path
// of a subject that owes nothing reads no policy and no set more.
func tick(b Book, a *Account, p *Policy, now time.Time) {
	current := p.Generation == a.Key.Generation && isCurrent(b, a)
	if owes(a) && !mutantOn("dropped_debt_forgotten") {
		subject := a.Key.SubjectKey()
		if active, ok := activePolicy(b, subject); ok && (current && active.Generation != p.Generation && owesDropped(a, p, active) || hasOwing(b, subject)) {
			switchIfRepaid(b, a, p, active, now)
			return
		}
	}
	bringToNow(b, a, p, now, current && !p.RolledBack)
}

// bringHolderToNow brings a (under its own policy p), the account whose
// hold a settle or a release ends, to now, and reports whether it is its
// subject's current account then. The current account is brought as tick
// does: one that owes, while its subject has owing accounts, with them
// (settleOwing takes its refill in turns with theirs; refilled alone under
// its own rule it would refill a unit they repay, for time they repay it
// again, and mint beyond debt where its deciding generation does not
// limit), which may switch the subject (a is read again, and no longer
// current). Another account only closes its elapsed epochs.
func bringHolderToNow(b Book, a *Account, p *Policy, now time.Time) bool {
	if !isCurrent(b, a) {
		bringToNow(b, a, p, now, false)
		return false
	}
	tick(b, a, p, now)
	return isCurrent(b, a)
}

// switchIfRepaid brings the subject's owing accounts to now under p, the
// deciding generation's policy, and switches the subject to p once none
// owes debt p does not limit (switchTo): left current, a repaid account
// would refill as an ordinary current account and mint available
// capacity in a unit p drops, which stays behind at the switch. a (under
// its own policy ap) is put first and reloaded after (the switch may move
// its capacity); its epoch is closed when the switch did not touch it.
func switchIfRepaid(b Book, a *Account, ap, p *Policy, now time.Time) {
	b.AccountPut(a)
	switchTo(b, a.Key.SubjectKey(), p, now)
	if fresh, ok := b.Account(a.Key); ok && fresh != a {
		*a = *fresh
	}
	rollEpoch(b, a, ap, now)
}

// bringToNow closes the account's elapsed accounting epochs, then, when
// refill is set, mints the refill due since the cursor under p, the
// account's own policy. Callers set refill only for the subject's current
// account under a generation that was not rolled back: an account that no
// longer holds the subject's capacity must not mint for time its successor
// refills too (a superseded generation refilling on a late settle, then
// forwarding its available, would mint the same period twice). Hot paths
// that know the answer call this instead of tick, which looks it up.
func bringToNow(b Book, a *Account, p *Policy, now time.Time, refill bool) {
	rollEpoch(b, a, p, now)
	if !refill {
		return
	}
	if before, minted := refillDue(a, p, now); minted {
		// One journal entry for the whole refill, every dimension's mint.
		journal(b, a, &before, KindRefill, "", 0, 0, "", now)
	}
}

// refillFromNow makes a refill from now on in every dimension: the one
// rule for an account that starts or restarts refilling (opened, made
// current by a switch or by makeCurrent, joining a frozen subject's owing
// set, or opened to decide while the subject is frozen). Until now it
// held none of the subject's capacity, or another account refilled that
// capacity for the time (or nothing did: a rolled-back generation mints
// none), so minting for the time before would mint the subject's
// capacity twice. See startRefillAt for a cursor already past now.
func refillFromNow(a *Account, now time.Time) {
	nowNanos := now.UnixNano()
	for i := 0; i < a.Dims; i++ {
		startRefillAt(a, i, nowNanos)
	}
}

// startRefillAt moves a's refill cursor in dimension i to nowNanos, never
// back: a cursor past now means the clock stepped back after this account
// refilled up to it, and the time up to the cursor was minted already
// (refillUpTo mints nothing until the clock passes it again), so setting
// it back to now would mint the same seconds twice.
func startRefillAt(a *Account, i int, nowNanos int64) {
	a.RefilledTo[i] = max(a.RefilledTo[i], nowNanos)
}

// refillDue mints into a's balances the refill due since its cursors
// under p and moves the cursors, writing nothing to the book; it returns
// the balances before and whether anything was minted.
func refillDue(a *Account, p *Policy, now time.Time) (before Balances, minted bool) {
	return refillUpTo(a, p, now, 0, 0, nil)
}

// burstRoom is the one rule for how much available capacity may come
// into bal (under d) by refill or by a shard's remint, so both keep the
// subject within one bucket alike: d's burst less what bal holds
// (available and reserved), what the subject's other accounts hold
// reserved (heldElsewhere, Account.HeldElsewhere) and share, the deciding
// account's share when bal is an owing current account's (decidingShare:
// what that account holds available, never its debt; 0 otherwise).
// Never negative.
func burstRoom(d *Dimension, bal *Balance, heldElsewhere, share Units) Units {
	return max(d.Burst-bal.Available-bal.Reserved-heldElsewhere-share, 0)
}

// refillUpTo is refillDue, except that in a dimension whose bit is set in
// repayOnly it mints only what repays debt, never available capacity,
// and a dimension whose bit is set in skip does not refill: its cursor
// moves to now (another account refilled the subject's capacity there
// for the time, so this one owes nothing for it later). The burst's room
// leaves out the account's holds elsewhere (Account.HeldElsewhere) and
// held, when not nil: capacity another account holds available for the
// subject in each dimension.
func refillUpTo(a *Account, p *Policy, now time.Time, repayOnly, skip uint8, held *Amounts) (before Balances, minted bool) {
	nowNanos := now.UnixNano()
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		d := &p.Dimensions[i]
		if skip&(1<<i) != 0 {
			startRefillAt(a, i, nowNanos)
			continue
		}
		if !d.Refills() {
			continue
		}
		interval := int64(d.RefillInterval)
		elapsed := nowNanos - a.RefilledTo[i]
		if elapsed < interval {
			continue
		}
		intervals := elapsed / interval
		a.RefilledTo[i] += intervals * interval
		bal := &a.Balances[i]
		var share Units
		if held != nil {
			share = held[i]
		}
		room := burstRoom(d, bal, a.HeldElsewhere[i], share)
		if repayOnly&(1<<i) != 0 {
			room = 0
		}
		limit := bal.Debt() + room
		due := limit
		if intervals < (limit+d.RefillUnits-1)/d.RefillUnits {
			due = intervals * d.RefillUnits
		}
		if due > limit {
			due = limit
		}
		if due > 0 {
			if !minted {
				before, minted = a.Balances, true
			}
			if mutantOn("refill_half_debt") {
				// The mutant: the refill repays half the debt it could.
				bal.Minted += due
				repay := min(due, bal.Debt()) / 2
				bal.OverdraftRepaid += repay
				bal.Available += due - repay
			} else {
				mint(bal, due)
			}
		}
	}
	return before, minted
}

// EpochStartOf is the start of the accounting epoch of the given length
// that holds t: the latest whole multiple of length counted from
// 0001-01-01T00:00:00Z (time.Time's zero, a Monday) at or before t, in
// UTC whatever t's location. So a 1-hour epoch starts on the hour, a
// 1-day one at 00:00 UTC and a 7-day one on a Monday at 00:00 UTC
// (docs/API.md, PublishPolicy); a 30-day one keeps no calendar month. The ledger
// opens epochs by it and the engine's epoch worker watches their ends by it.
func EpochStartOf(t time.Time, length time.Duration) time.Time {
	return t.Truncate(length).UTC()
}

func startEpoch(a *Account, p *Policy, now time.Time) {
	a.EpochStart = EpochStartOf(now, p.EpochLength)
	a.EpochOpening = a.Balances
}

// EpochIdle reports whether nothing changed the account's balances since
// its accounting epoch opened. The epoch worker leaves such an account
// alone when its epoch ends: every command brings the account to now first
// (bringToNow), which closes the elapsed epochs in one statement that spans
// them and opens and closes on the same vector. So the statement chain
// stays unbroken, every epoch in which something changed still gets its
// own statement, and an idle account costs no write per epoch.
func (a *Account) EpochIdle() bool { return a.Balances == a.EpochOpening }

// rollEpoch closes the account's epoch if now is past it: a statement with
// the epoch's opening and closing term vectors, and the next epoch opens
// with this closing. Empty epochs in between are covered by the one
// statement (its EpochEnd is the new epoch's start).
func rollEpoch(b Book, a *Account, p *Policy, now time.Time) {
	if a.EpochStart.IsZero() {
		startEpoch(a, p, now)
		return
	}
	if now.Before(a.EpochStart.Add(p.EpochLength)) {
		return
	}
	next := EpochStartOf(now, p.EpochLength)
	b.StatementPut(Statement{
		Account: a.Key, EpochStart: a.EpochStart, EpochEnd: next, Dims: a.Dims,
		Opening: a.EpochOpening, Closing: a.Balances,
	})
	a.EpochStart = next
	a.EpochOpening = a.Balances
	a.Version++
}

// journal appends the entry for one change of account a (its balances
// before the change are in before) and bumps the account's version.
func journal(b Book, a *Account, before *Balances, kind Kind, reservationID string, from, to State, receipt string, now time.Time) {
	// Field by field: a composite literal is built in a temporary and
	// copied, 416 bytes more per command.
	var entry JournalEntry
	entry.At, entry.Kind, entry.Account = now, kind, a.Key
	entry.ReservationID, entry.From, entry.To, entry.ReceiptID = reservationID, from, to, receipt
	for i := 0; i < a.Dims; i++ {
		x, y, d := &before[i], &a.Balances[i], &entry.Delta[i]
		d.Opening = y.Opening - x.Opening
		d.Minted = y.Minted - x.Minted
		d.OverdraftIssued = y.OverdraftIssued - x.OverdraftIssued
		d.Available = y.Available - x.Available
		d.Reserved = y.Reserved - x.Reserved
		d.Spent = y.Spent - x.Spent
		d.RetiredForEmergency = y.RetiredForEmergency - x.RetiredForEmergency
		d.RetiredForMove = y.RetiredForMove - x.RetiredForMove
		d.OverdraftRepaid = y.OverdraftRepaid - x.OverdraftRepaid
	}
	a.Version++
	b.JournalAppend(entry)
}

// accountFor loads an account and its own policy generation.
func accountFor(b Book, key AccountKey) (*Account, *Policy, error) {
	a, ok := b.Account(key)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrAccountNotFound, key)
	}
	p, ok := b.Policy(key.Generation)
	if !ok {
		return nil, nil, fmt.Errorf("%w: generation %d of %s", ErrPolicyNotFound, key.Generation, key)
	}
	return a, p, nil
}

// Refill mints the refill due on an account up to now (and closes elapsed
// epochs). Commands refill lazily; this exists for workers and tools. Only
// the subject's current account refills, and only while its generation is
// not rolled back; for any other account Refill just closes epochs.
//
// Returns: ErrAccountNotFound (or ErrPolicyNotFound when the account's
// generation is missing); otherwise success, with the account's epoch and
// refill cursor brought to now.
func Refill(b Book, key AccountKey, now time.Time) Result {
	a, p, err := accountFor(b, key)
	if err != nil {
		return Result{Err: err}
	}
	tick(b, a, p, now)
	b.AccountPut(a)
	return Result{Generation: key.Generation}
}

// CloseEpoch closes the account's accounting epoch if now is past it,
// writing its statement. It does not refill.
//
// Returns: ErrAccountNotFound (or ErrPolicyNotFound when the account's
// generation is missing); otherwise success with Generation, Replayed when
// the epoch was still open and nothing was written.
func CloseEpoch(b Book, key AccountKey, now time.Time) Result {
	a, p, err := accountFor(b, key)
	if err != nil {
		return Result{Err: err}
	}
	start := a.EpochStart
	rollEpoch(b, a, p, now)
	if a.EpochStart.Equal(start) {
		return Result{Generation: key.Generation, Replayed: true}
	}
	b.AccountPut(a)
	return Result{Generation: key.Generation}
}

// Drain moves what remains on an account of a superseded generation
// (available capacity, debt) to the subject's current account. Workers
// call it after a generation switch or a rollback.
//
// Returns: Move on success (the generation switch's receipt when the
// account still held the subject's capacity and the switch moved it);
// ErrAccountNotFound (or ErrPolicyNotFound); ErrNothingToDrain when the
// account belongs to the active generation, is empty, or nothing admits for
// the subject.
func Drain(b Book, key AccountKey, now time.Time) Result {
	if _, _, err := accountFor(b, key); err != nil {
		return Result{Err: err}
	}
	subject := key.SubjectKey()
	active, ok := activePolicy(b, subject)
	if !ok {
		return Result{Err: fmt.Errorf("%w: no active policy for %s", ErrNothingToDrain, subject)}
	}
	if active.Generation == key.Generation {
		return Result{Err: fmt.Errorf("%w: %s is current", ErrNothingToDrain, key)}
	}
	target, tp, switched, _ := switchTo(b, subject, active, now)
	if target != nil && target.Key == key {
		// It owes debt the active generation does not limit, so it
		// stays current and refills until that debt is repaid.
		return Result{Err: fmt.Errorf("%w: %s owes debt in a unit generation %d does not limit: it stays current until refill repays it", ErrNothingToDrain, key, active.Generation)}
	}
	// The current account refills in the drain unless it is an owing one
	// (switchTo refilled it already) or its generation was rolled back.
	refills := tp == active && !active.RolledBack
	if switched == nil {
		// Nothing can move (no debt, and the current account's burst,
		// refilled to now, has no room for the capacity waiting here):
		// write nothing. The drain worker tries such an account every
		// pass; closing its epoch each time wrote a statement per epoch
		// of balances that never changed. The refill is tried on a copy
		// (DrainRoom).
		a, _, err := accountFor(b, key)
		if err != nil {
			return Result{Err: err}
		}
		if target == nil {
			return Result{Err: fmt.Errorf("%w: no current account for %s", ErrNothingToDrain, subject)}
		}
		if !drainable(b, a, target, refills, now) {
			return Result{Err: fmt.Errorf("%w: %s holds no available capacity or debt %s can take", ErrNothingToDrain, key, target.Key)}
		}
	}
	bringToNow(b, target, tp, now, refills)
	b.AccountPut(target)
	if switched != nil && switched.From == key {
		return Result{Generation: active.Generation, Move: switched}
	}
	// Read the drained account only now: the switch above may have moved
	// its capacity already, and a store hands out copies.
	a, p, err := accountFor(b, key)
	if err != nil {
		return Result{Err: err}
	}
	rollEpoch(b, a, p, now)
	b.AccountPut(a)
	receipt := "drain:" + key.String() + ":" + strconv.FormatUint(a.Version, 10)
	move := moveBetween(b, a, target, MoveForward, receipt, now)
	if move == nil {
		return Result{Err: fmt.Errorf("%w: %s holds no available capacity or debt", ErrNothingToDrain, key)}
	}
	return Result{Generation: active.Generation, Move: move}
}
