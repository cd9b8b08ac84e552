package ledger

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A subject's owing set: the generations of its accounts that owe debt
// its current account may not take, stored as Meta counters (the count
// under metaOwing, one generation under each metaOwingAt) so that no
// store needs a table of its own for what is, while it lasts, a handful
// of rows. An account joins when it owes debt the subject's current
// account cannot take: at a switch, the current account owing debt in a
// unit the deciding generation does not limit (switchTo); a late settle
// forwarding what it can and keeping the rest (forward); a record charged
// to the deciding generation's account while another account is current
// (Record); a shard's overuse charged to its own account (markOwing is
// the function a caller outside this file uses). It leaves once it owes
// nothing (unless it holds capacity in a unit p limits that has not
// moved yet, settleOwing; what it holds in a unit p does not limit is
// then left behind, leaveBehind), or when the subject switches to the
// deciding generation, which takes its remaining debt (releaseOwing).
// The deciding generation's account is a member while the subject is
// frozen under it (intoDeciding), so a generation deciding after it
// finds it as any other.
//
// One rule keeps the subject's capacity in one place: whenever the
// current pointer moves from one account to another (a switch, switchTo;
// an owing account made current, makeCurrent), the account it leaves
// moves its available capacity and debt to the new one, and every unit
// the new one's policy does not limit is marked left_behind, whatever the
// old account holds there, so a later generation limiting it again opens
// it at 0 (openAccount); and the new one counts, as held elsewhere, the
// holds the old one counted and the old one's own, less the new one's
// own (carryHeld), so the subject's holds under every generation stay
// within the current account's burst until they end (forward drops an
// ended one's). While the subject is frozen the deciding
// generation's account is open (settleOwing opens it), and every other
// member moves its debt and capacity in the units it limits there at once:
// its refill repays that debt during the freeze, and slowestOwing counts it;
// its debt in a unit the current account refills moves on to the current
// account, whose refill repays it first (intoDeciding).
//
// While any member owes debt in a unit the deciding generation does not
// limit, the subject is frozen: its current account is such a member,
// after every command (settleOwing makes one current when it is not), so
// the hot path, current = deciding and owing nothing, stays a read of the
// current pointer and nothing more even after a rollback; the members
// owing that unit repay it in turns, one at a time (repayTurns), and the
// retry-after is the slowest of the current one's and every other owing
// account's, each counted after the turns before it, the deciding
// generation's included, with the request's units where only that account
// refills them (slowestOwing). Only
// commands that read the subject's current pointer first read or write
// the set, so replicas serialise on the subject's rows.

// MetaOwingPrefix begins every owing-set name.
const MetaOwingPrefix = "owing/"

// metaOwing is the Meta name of the subject's owing-set size; each part
// is escaped (metaNamePart), so no subject's name is another's prefix.
func metaOwing(s PolicyKey) string { return MetaOwingPrefix + subjectNameParts(s) }

// subjectNameParts names the subject inside a Meta name: its three key
// parts escaped (metaNamePart), so no part holds a "/".
func subjectNameParts(s PolicyKey) string {
	return metaNamePart(s.Subject) + "/" + metaNamePart(s.Route) + "/" + metaNamePart(s.Region)
}

// metaOwingAt is the Meta name of the set's i-th generation.
func metaOwingAt(s PolicyKey, i int) string { return metaOwing(s) + "/" + strconv.Itoa(i) }

// hasOwing reports whether the subject's owing set is not empty: one row.
func hasOwing(b Book, s PolicyKey) bool { return b.Meta(metaOwing(s)) > 0 }

// owingOf returns the subject's owing set, in the order it was stored.
func owingOf(b Book, s PolicyKey) []uint64 {
	n := b.Meta(metaOwing(s))
	if n <= 0 {
		return nil
	}
	out := make([]uint64, 0, n)
	for i := range int(n) {
		out = append(out, uint64(b.Meta(metaOwingAt(s, i))))
	}
	return out
}

// owingPut stores gens as the subject's owing set, which was old: only
// the rows that change are written, and an emptied set leaves no rows
// (where the book can remove them, MetaRemover; else they read 0).
func owingPut(b Book, s PolicyKey, old, gens []uint64) {
	if slices.Equal(old, gens) {
		return
	}
	for i, g := range gens {
		if i >= len(old) || old[i] != g {
			b.MetaPut(metaOwingAt(s, i), int64(g))
		}
	}
	for i := len(gens); i < len(old); i++ {
		metaRemove(b, metaOwingAt(s, i))
	}
	switch {
	case len(gens) == 0:
		metaRemove(b, metaOwing(s))
	case len(gens) != len(old):
		b.MetaPut(metaOwing(s), int64(len(gens)))
	}
}

func metaRemove(b Book, name string) {
	if rm, ok := b.(MetaRemover); ok {
		rm.MetaRemove(name)
		return
	}
	b.MetaPut(name, 0)
}

// markOwing records that a, put already, owes debt the subject's current
// account may not take: a joins the subject's owing set, and when the
// deciding generation's account is current (the hot path, which reads no
// set), a becomes current instead (makeCurrent, which moves that account's
// capacity and debt to a), after that account is brought to now, so the
// next command of the subject looks at the set.
// It does nothing when a owes nothing. The next command (or the caller,
// through switchTo) decides whether the subject stays frozen.
func markOwing(b Book, a *Account, now time.Time) {
	if !owes(a) {
		return
	}
	subject := a.Key.SubjectKey()
	// The mutant tracks only the current account, as before the set
	// existed: debt left while another account is current is forgotten.
	if old := owingOf(b, subject); !slices.Contains(old, a.Key.Generation) && !mutantOn("dropped_debt_second_untracked") {
		owingPut(b, subject, old, append(slices.Clone(old), a.Key.Generation))
		if !isCurrent(b, a) {
			// Its refill repays from now: it did not refill while it
			// was not current, and debt made now is not repaid by the
			// time before.
			refillFromNow(a, now)
			b.AccountPut(a)
		}
	}
	p, ok := activePolicy(b, subject)
	if !ok || p.Generation == a.Key.Generation {
		return
	}
	if g, ok := b.AccountCurrent(subject); ok && g == p.Generation {
		key := a.Key
		key.Generation = g
		if current, found := b.Account(key); found {
			bringToNow(b, current, p, now, !p.RolledBack)
			b.AccountPut(current)
		}
		makeCurrent(b, a, now)
		// The subject is frozen under p now: p's account is a member,
		// as a freeze keeps it (intoDeciding), so debt it owes in a
		// unit a does not limit (the switch to p moved it there) is
		// tracked even if another generation decides before the
		// subject's next command, and it refills from now on what a
		// does not (settleOwing).
		if old := owingOf(b, subject); !slices.Contains(old, p.Generation) {
			owingPut(b, subject, old, append(slices.Clone(old), p.Generation))
		}
	}
}

// settleOwing brings the subject's owing accounts to now and decides
// whether the subject is frozen under p, the deciding generation's
// policy; current is the generation of the subject's current account.
// While the set is not empty the current account is always a member
// (unless it is p's), so it is brought to now as bringOwingToNow does
// and a repaid one mints nothing beyond its debt in a unit p drops; it
// joins the set for good only when it owes debt p does not limit. Each
// member refills: the current one as bringOwingToNow does (or as the
// deciding generation's account when it is p's, a rollback having made
// it decide again), p's account when not current only in a unit the
// current account does not refill, there fully (the current account
// refills the others, and its refill moves to p's account at the switch:
// both refilling would mint the subject's capacity twice), any other only
// to repay debt (it holds none of the subject's capacity) in a unit p
// does not limit, or in one p limits that neither the current account
// refills nor p's account, not yet opened, would take (refilledFully).
// Such a unit is repaid in turns (repayTurns): the current account first,
// then each owing member in the set's order from where the one before it
// was repaid, so two accounts never repay it for the same time. Members
// that owe nothing leave, except one holding available capacity in a
// unit p limits: releaseOwing moves it at the switch, or intoDeciding at
// once while the subject is frozen. One leaving marks the units p or the
// current account does not limit left behind (leaveBehind).
//
// When some member owes debt in a unit p does not limit, the subject is
// frozen: it returns the current account with its own policy, and
// frozen. The invariant is: while the subject is frozen, its current
// account owes debt p does not limit. So when the current account does
// not (it was repaid, or it is p's after a rollback), an owing member
// becomes current (makeCurrent): else a rollback could make the current
// account's generation decide again, and the hot path, which reads no
// set for an account that owes nothing, would admit. The account replaced
// no longer refills (the new current one refills for the time): what it
// holds moves to the new one (makeCurrent), so the subject's capacity is
// where its admission is decided; what the new one cannot take in a unit
// p limits moves on to p's account (intoDeciding), as any member's
// does. p's own account, replaced after a rollback, moves its capacity
// too: the switch back moves it home, and meanwhile p's account refills
// only the units the new current account does not refill. While frozen,
// the last step is intoDeciding: p's account is opened if it does not
// exist, and every other member's debt and capacity in units p limits
// moves there.
// Otherwise it returns the members left (owing debt p can take, or
// holding capacity, which releaseOwing moves once the subject switches),
// not frozen.
func settleOwing(b Book, subject PolicyKey, current uint64, p *Policy, now time.Time) (a *Account, ap *Policy, frozen bool, rest []uint64) {
	return settleOwingMoving(b, subject, current, p, now, true)
}

// settleOwingMoving is settleOwing; intoDeciding runs only when move is
// set (a view, BringToNowAsShown, leaves what it would move where it is).
func settleOwingMoving(b Book, subject PolicyKey, current uint64, p *Policy, now time.Time, move bool) (a *Account, ap *Policy, frozen bool, rest []uint64) {
	if mutantOn("dropped_debt_forgotten") {
		return nil, nil, false, nil
	}
	old := owingOf(b, subject)
	members := slices.Clone(old)
	key := AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: current}
	if current != p.Generation && !slices.Contains(members, current) {
		if len(members) > 0 {
			// Brought to now with the set, a repaid current account
			// mints nothing in a unit p drops, and one replaced below
			// moves its capacity as of now.
			members = append(members, current)
		} else if m, mp, err := accountFor(b, key); err == nil && owesDropped(m, mp, p) {
			members = append(members, current)
		}
	}
	if len(members) == 0 {
		return nil, nil, false, nil
	}
	currentPolicy, _ := b.Policy(current)
	pKey := key
	pKey.Generation = p.Generation
	_, pExists := b.Account(pKey)
	pJoins := false
	if pExists && current != p.Generation && !slices.Contains(members, p.Generation) {
		// p's account refills the units the current account does not
		// limit while the subject is frozen, also when it owes nothing:
		// it may hold less than its burst there (openAccount opens a
		// re-added unit at 0), and nobody else refills them. Out of
		// the set it was not frozen under p until now (a freeze keeps
		// it in, intoDeciding, markOwing): it refills from now, as an
		// account made current does, not for the time the subject's
		// capacity was refilled elsewhere.
		members = append(members, p.Generation)
		pJoins = true
	}
	// Each member refills in refill order (the current account first),
	// and a unit no account refills fully is repaid by one owing account
	// at a time (repayTurns), so its refill time is spent once.
	turns := repayTurns{}
	for _, g := range refillOrder(members, current) {
		key.Generation = g
		m, mp, err := accountFor(b, key)
		if err != nil {
			continue // a row the book could not read: the batch is discarded (Book)
		}
		switch {
		case g == p.Generation:
			if g == current {
				bringToNow(b, m, p, now, !p.RolledBack)
			} else {
				skip := uint8(0xff) // no current account's policy: refill nothing
				if currentPolicy != nil && refillsFor(currentPolicy) {
					skip = limitedBy(m, mp, currentPolicy)
				} else if currentPolicy != nil {
					skip = 0 // the current account refills only to repay
				}
				// A unit the current account does not refill is the
				// subject's capacity only here: it refills fully,
				// beside the subject's holds the switch will count
				// on it (heldAtSwitch).
				rollEpoch(b, m, p, now)
				if pJoins {
					refillFromNow(m, now)
				}
				held := heldAtSwitch(b, key, current, currentPolicy, m, p)
				// The current account refilled the skipped units up
				// to now (their cursors move to now): if a later
				// current one does not limit them, this account
				// repays them from now on.
				if before, minted := refillUpTo(m, p, now, 0, skip, &held); minted {
					journal(b, m, &before, KindRefill, "", 0, 0, "", now)
				}
			}
		case g == current:
			// First in refill order: where it owes in a unit nobody
			// refills fully, its refill starts at its own cursor.
			queued := turns.queue(m, mp, currentPolicy, p, pExists)
			bringOwingToNow(b, m, mp, p, now)
			turns.took(m, mp, &queued, now)
		default:
			// A unit p limits is skipped only when the current account
			// refills it (its refill moves to p's account at the
			// switch) or p's account exists (the switch moves the debt
			// there, where its available repays it first): refilledFully.
			// Else nobody would repay it while frozen, and the switch
			// would move it to an account opened empty and freeze
			// again. (While the subject is frozen p's account exists
			// from the first command on, below, and the member's debt
			// there moves to it.) Any other unit it repays in its turn,
			// after the accounts before it in refill order (repayTurns).
			queued := turns.queue(m, mp, currentPolicy, p, pExists)
			repayOnly(b, m, mp, now, queued.skip)
			turns.took(m, mp, &queued, now)
		}
		b.AccountPut(m)
	}
	var owing []uint64 // members that owe debt p does not limit
	for _, g := range members {
		key.Generation = g
		m, mp, err := accountFor(b, key)
		if err != nil {
			continue // as above
		}
		if _, debt := m.Debt(); debt == 0 {
			if g != current && g != p.Generation {
				if holdsFor(m, mp, p) {
					rest = append(rest, g)
				} else {
					// It leaves the set, and with it whatever it
					// holds in a unit p does not limit, as a move
					// to p's account would leave it (moveBetween),
					// and in a unit the current account does not
					// limit: the switch to p opens such a unit
					// (openAccount), and a full burst there would
					// be minted beside what this account opened
					// (and may have spent) while it was a member.
					leaveBehind(b, m, mp, p)
					if currentPolicy != nil {
						leaveBehind(b, m, mp, currentPolicy)
					}
				}
			}
			continue
		}
		rest = append(rest, g)
		if g != p.Generation && owesDropped(m, mp, p) {
			owing = append(owing, g)
		}
	}
	if len(owing) > 0 && !slices.Contains(owing, current) {
		// Keep the invariant: an owing member becomes current.
		key.Generation = owing[0]
		if m, ok := b.Account(key); ok {
			// What the replaced account holds moves to the new current
			// one (makeCurrent), which refills it from now on and whose
			// admission decides; what it holds in a unit p limits and
			// the new one does not then moves to p's account, as every
			// other member's does (above), and what does not fit there
			// stays, with the replaced account in the set.
			makeCurrent(b, m, now)
			replaced := key
			replaced.Generation = current
			if r, rp, err := accountFor(b, replaced); err == nil && current != p.Generation && (holdsFor(r, rp, p) || owes(r)) && !slices.Contains(rest, current) {
				rest = append(rest, current)
			}
		}
	}
	if len(owing) == 0 {
		owingPut(b, subject, old, rest)
		return nil, nil, false, rest
	}
	if move {
		rest = intoDeciding(b, subject, p, rest, now)
	}
	owingPut(b, subject, old, rest)
	key.Generation, _ = b.AccountCurrent(subject)
	a, ap, err := accountFor(b, key)
	if err != nil {
		return nil, nil, false, nil
	}
	return a, ap, true, nil
}

// leaveBehind marks every unit of a (under its policy ap) that p does
// not limit as left behind (metaLeftBehind), whatever a holds there
// (available, reserved, a shard's allocation in retiredForEmergency,
// debt, or nothing left of a burst just spent): the subject's capacity in
// the unit was last counted on a, and a later generation limiting the
// unit again opens it at 0 (openAccount). A move to an account of p
// (moveBetween) and a member leaving the subject's owing set without a
// move (settleOwingMoving) both leave a so.
func leaveBehind(b Book, a *Account, ap, p *Policy) {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if p.DimensionIndex(ap.Dimensions[i].Unit) < 0 {
			noteLeftBehind(b, a.Key.SubjectKey(), ap.Dimensions[i].Unit)
		}
	}
}

// heldAtSwitch returns, per dimension of pa (p's account, not current),
// the subject's holds a switch from its current account (generation
// current, under cp; key names the subject) to pa would count on pa
// (carryHeld, run on copies): the current account's own holds and those
// it counts elsewhere, less pa's own. While the subject is frozen pa
// refills beside them, so that what it holds available fits the burst
// once the switch counts them. Zero when the current account or its
// policy cannot be read.
func heldAtSwitch(b Book, key AccountKey, current uint64, cp *Policy, pa *Account, p *Policy) Amounts {
	key.Generation = current
	cur, ok := b.Account(key)
	if !ok || cp == nil {
		return Amounts{}
	}
	from, to := *cur, *pa
	carryHeld(&from, cp, &to, p)
	return to.HeldElsewhere
}

// intoDeciding is settleOwing's last step while the subject is frozen
// under p: p's account is opened if it does not exist yet
// (decidingAccount: a re-added unit opens at 0), so that it refills the
// units the current account does not refill during the freeze (and its
// cursor starts now), and every member of rest other than the current
// account and p's moves its debt and available capacity in units p
// limits there (moveBetween, receipt "owing:<account>:<version>"), as the
// switch would: p's account is where the subject's capacity in them is
// decided and refilled, it repays that debt from its available first and
// then by its refill while the subject is frozen (slowestOwing counts
// it), and no member keeps the subject's capacity beside it. It returns
// rest without the members left owing and holding nothing p limits, with
// p's account (it stays in the set while the subject is frozen under p).
// A rolled-back current account moves its debt and capacity in units p
// limits there too (it refills none of them). Any other current account
// takes pa's debt in the units it limits (moveDebt, receipt
// "owing-debt:<pa>:<version>"): it refills them, and pa does not.
func intoDeciding(b Book, subject PolicyKey, p *Policy, rest []uint64, now time.Time) []uint64 {
	current, ok := b.AccountCurrent(subject)
	if !ok || current == p.Generation {
		return rest
	}
	cp, ok := b.Policy(current)
	if !ok {
		return rest
	}
	pa := decidingAccount(b, subject, p, cp, now)
	key := pa.Key
	if !refillsFor(cp) {
		// A rolled-back current account refills nothing pa limits
		// (bringOwingToNow), and pa refills those units fully
		// (settleOwing): its debt and capacity there move to pa now,
		// as the switch would move them, so pa's refill repays that
		// debt during the freeze instead of stopping at the burst.
		key.Generation = current
		if cur, ok := b.Account(key); ok {
			owingMove(b, cur, pa, now)
		}
	}
	kept := rest[:0:0]
	for _, g := range rest {
		if g == current || g == p.Generation {
			kept = append(kept, g)
			continue
		}
		key.Generation = g
		m, mp, err := accountFor(b, key)
		if err != nil {
			kept = append(kept, g)
			continue
		}
		owingMove(b, m, pa, now)
		if owes(m) || holdsFor(m, mp, p) {
			kept = append(kept, g)
		}
	}
	if refillsFor(cp) {
		// Debt pa owes in a unit the current account refills moves to
		// the current account: pa does not refill such a unit while the
		// subject is frozen (settleOwing), and the current account's
		// refill repays that debt first, then fills its burst less the
		// holds (bringOwingToNow), so the subject's capacity there, net
		// of the debt, is refilled in one place within one burst, and
		// the refusal's Retry-After, admit's on the current account,
		// counts the debt. Left on pa, the current account's refill
		// would stop at its burst and the switch would repay the debt
		// from what it moves: a retry after that Retry-After would be
		// refused again.
		key.Generation = current
		if cur, ok := b.Account(key); ok {
			if fresh, ok := b.Account(pa.Key); ok {
				pa = fresh
			}
			moveDebt(b, pa, cur, "owing-debt:"+pa.Key.String()+":"+strconv.FormatUint(pa.Version, 10), now)
		}
	}
	// pa stays in the set while the subject is frozen under p: it
	// refills there (settleOwing), and should another generation decide
	// before the subject switches to p (a publish, a rollback of p), pa
	// is a member like any other, so the new deciding account opens the
	// units pa holds at 0 (openAccount) and the switch moves pa's
	// capacity there (releaseOwing), not a second burst beside it.
	if !slices.Contains(kept, p.Generation) {
		kept = append(kept, p.Generation)
	}
	return kept
}

// subjectCapacity returns a copy of a, the subject's current account
// under its policy ap, whose available capacity in each unit p limits
// counts what p's account (when it is not a) holds available there too:
// while another account is current, p's account may hold capacity in
// such a unit (what a member moved there, what a's burst had no room for)
// and a refills only into the room it leaves (bringOwingToNow), so the
// subject's capacity is both, and a refusal asks admission of the sum.
func subjectCapacity(b Book, a *Account, ap, p *Policy) Account {
	capacity := *a
	available, _ := decidingHolds(b, a, ap, p)
	for i := 0; i < a.Dims; i++ {
		capacity.Balances[i].Available += available[i]
	}
	return capacity
}

// holdsFor reports whether a (under its policy ap) holds available
// capacity in a unit p limits: capacity the switch to p must move.
func holdsFor(a *Account, ap, p *Policy) bool {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if a.Balances[i].Available > 0 && p.DimensionIndex(ap.Dimensions[i].Unit) >= 0 {
			return true
		}
	}
	return false
}

// repayOnly brings a, an owing account that does not hold its subject's
// capacity, to now under its own policy ap: its epoch closes, and each
// dimension not in skip refills only to repay debt (the current account
// refills the subject's capacity); a dimension in skip does not refill
// (its cursor moves to now, refillUpTo).
func repayOnly(b Book, a *Account, ap *Policy, now time.Time, skip uint8) {
	rollEpoch(b, a, ap, now)
	if before, minted := refillUpTo(a, ap, now, 0xff, skip, nil); minted {
		journal(b, a, &before, KindRefill, "", 0, 0, "", now)
	}
}

// limitedBy returns the dimensions of a (under its policy ap) whose unit
// p limits: debt there moves to p's account when the subject switches to
// it, so an owing account that is not current does not refill them.
func limitedBy(a *Account, ap, p *Policy) uint8 {
	var limited uint8
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if p.DimensionIndex(ap.Dimensions[i].Unit) >= 0 {
			limited |= 1 << i
		}
	}
	return limited
}

// releaseOwing moves what the members of the subject's owing set (rest,
// as settleOwing left it) still owe to to, the deciding generation's
// account the subject just switched to (or was current on already), and
// empties the set. The member from (the account the switch moved from)
// and to itself are skipped: the switch moved the one, the other keeps
// its own debt. Each move's receipt is "owing:<account>:<version>".
func releaseOwing(b Book, subject PolicyKey, rest []uint64, to *Account, from uint64, now time.Time) {
	if len(rest) == 0 {
		return
	}
	key := to.Key
	for _, g := range rest {
		if g == to.Key.Generation || g == from {
			continue
		}
		key.Generation = g
		if m, ok := b.Account(key); ok {
			owingMove(b, m, to, now)
		}
	}
	owingPut(b, subject, rest, nil)
}

// slowestOwing returns the unit and the retry-after of the slowest debt
// among the subject's owing accounts other than current (the subject's
// current account, under its policy cp, whose refusal admit decides):
// debt in a unit no account refills fully (refilledFully), which each
// account's refill repays in its turn, after the current account's and
// those before it in the set (repayTurns, as settleOwing refills), and the debt of p's own account, which the subject
// switches to once the others are repaid (p limits all of it), with the
// request's units (units, in p's dimensions): a retry after the wait
// returned is admitted as far as debt goes. Other members owe nothing
// in a unit p limits: settleOwing moved that debt to p's account. While
// frozen, p's account
// refills only what the current account does not (settleOwing), fully
// (its debt, then the units, less its available: the wait), so its
// debt in a unit the current account refills waits on the current
// account's refill, which the switch moves to p's account, for that debt,
// the current account's own debt there and the units, less what is
// available there now; in another unit, on p's account's own refill, and
// there the request's units wait on it even when it owes nothing (p's
// account is the subject's only capacity in that unit: a re-added unit
// opens at 0). 0 (never) is the slowest. ok is false when no other
// account owes or makes the request wait.
func slowestOwing(b Book, current *Account, cp, p *Policy, units *Amounts, now time.Time) (unit string, wait time.Duration, ok bool) {
	key := current.Key
	consider := func(u string, w time.Duration) {
		if !ok || slower(w, wait) {
			unit, wait, ok = u, w, true
		}
	}
	pKey := key
	pKey.Generation = p.Generation
	_, pExists := b.Account(pKey)
	gens := owingOf(b, current.Key.SubjectKey())
	if current.Key.Generation != p.Generation && !slices.Contains(gens, p.Generation) {
		// p's account owes outside the set when the switch to it moved
		// the debt there before an owing account became current.
		gens = append(gens, p.Generation)
	}
	// The current account takes the first turn in a unit repaid in
	// turns (refillOrder), the others theirs in the set's order: each is
	// repaid after the ones before it (repayTurns), not beside them.
	turns := repayTurns{}
	for i := 0; i < current.Dims && i < len(cp.Dimensions); i++ {
		if debt := current.Balances[i].Debt(); debt > 0 && !refilledFully(cp.Dimensions[i].Unit, cp, p, pExists) {
			turns.after(current, &cp.Dimensions[i], i, debt)
		}
	}
	for _, g := range gens {
		if g == current.Key.Generation {
			continue
		}
		key.Generation = g
		m, mp, err := accountFor(b, key)
		if err != nil {
			continue // p's account may not exist yet
		}
		for i := 0; i < m.Dims && i < len(mp.Dimensions); i++ {
			debt := m.Balances[i].Debt()
			d := &mp.Dimensions[i]
			if debt <= 0 && (g != p.Generation || units[i] == 0 || (cp.DimensionIndex(d.Unit) >= 0 && refillsFor(cp))) {
				// Nothing owed here; and in a unit the current account
				// refills, the request's units wait on it (admit on
				// subjectCapacity, refuseOwing). In another unit p's
				// account is the subject's only capacity (a re-added
				// unit opens at 0): the request waits on its refill.
				continue
			}
			if g != p.Generation {
				// The member repays it in its turn unless an account
				// refills the unit fully (settleOwing).
				if !refilledFully(d.Unit, cp, p, pExists) {
					consider(d.Unit, waitUntil(turns.after(m, d, i, debt), now))
				}
				continue
			}
			if j := cp.DimensionIndex(d.Unit); j >= 0 && refillsFor(cp) {
				cur := &current.Balances[j]
				if shortfall := debt + units[i] + cur.Debt() - cur.Available; shortfall > 0 {
					consider(d.Unit, laterWait(refillWait(current, &cp.Dimensions[j], j, shortfall, now),
						refillWait(current, &decidingRefill(cp, p).Dimensions[j], j, shortfall, now)))
				}
				continue
			}
			// p's account refills it fully (settleOwing): the debt,
			// then the request, less what is available there now. A
			// request that does not fit beside the holds there however
			// long it refills gets no Retry-After, as admit answers
			// it: only holds ending make room, and a retry after the
			// freeze would be refused. (Holds the switch would count
			// there are the current account's, in a unit it limits,
			// where admit on it refuses so already, refuseOwing.)
			if units[i] > d.Burst-m.Balances[i].Reserved {
				consider(d.Unit, 0)
				continue
			}
			if shortfall := debt + units[i] - m.Balances[i].Available; shortfall > 0 {
				consider(d.Unit, refillWait(m, d, i, shortfall, now))
			}
		}
	}
	return unit, wait, ok
}

// heldUpAtSwitch returns the first of p's dimensions in which units (in
// p's dimensions) do not fit p's burst beside the holds the switch from
// the subject's current account (under cp) to p's account will count
// there: p's account's own and those heldAtSwitch carries over; -1 when
// they fit everywhere, or p's account does not exist or is current. The
// subject refuses such a request after the switch however long it waits
// (admit: only holds ending make room), though the current account's
// burst may have room for it (a larger burst than p's), so a frozen
// subject's refusal gives no Retry-After for it (refuseOwing).
func heldUpAtSwitch(b Book, current *Account, cp, p *Policy, units *Amounts) int {
	if current.Key.Generation == p.Generation {
		return -1
	}
	key := current.Key
	key.Generation = p.Generation
	pa, ok := b.Account(key)
	if !ok {
		return -1
	}
	held := heldAtSwitch(b, key, current.Key.Generation, cp, pa, p)
	for i := 0; i < pa.Dims && i < len(p.Dimensions); i++ {
		if units[i] > 0 && units[i] > p.Dimensions[i].Burst-pa.Balances[i].Reserved-held[i] {
			return i
		}
	}
	return -1
}

// beyondCurrentBurst returns the first of ap's dimensions in which units
// (in ap's dimensions, not cut to its maxReservation) do not fit a, a
// frozen subject's current account under ap, once its refill has filled
// its burst beside its holds and those it counts elsewhere, with what the
// deciding generation's account (p's) holds available there beside it
// (subjectCapacity): the most refill brings the subject before the
// switch to p; -1 when they fit everywhere, or a refills nothing (ap
// rolled back: p's account refills instead, and slowestOwing reckons its
// burst). Such a request may fit p's larger burst only after the switch,
// and p's account then refills at its own rate from the switch on, so a
// Retry-After reckoned on a's refill would come too early (refuseOwing
// gives none).
func beyondCurrentBurst(b Book, a *Account, ap, p *Policy, units *Amounts) int {
	if !refillsFor(ap) {
		return -1
	}
	deciding := decidingShare(b, a, ap, p)
	for j := 0; j < a.Dims && j < len(ap.Dimensions); j++ {
		room := max(ap.Dimensions[j].Burst-a.Balances[j].Reserved-a.HeldElsewhere[j], 0)
		if units[j] > 0 && units[j] > room+deciding[j] {
			return j
		}
	}
	return -1
}

// decidingRefill returns cp, or a copy of it whose dimensions take p's
// refill terms (units and interval) in each unit p limits too on other
// terms. A frozen subject's wait in such a unit is reckoned on its current
// account under cp (refuseOwing), but a command during the wait may
// switch the subject to p (its debt repaid: a worker's drain or refill, a
// second gateway's early retry), whose account then refills the rest on
// p's terms: the wait is the longer of the two reckonings (laterWait), so
// the Retry-After holds either way (but for the interval a handover
// loses, ROLLOUT.md Limitations). Equal terms leave cp as it is.
func decidingRefill(cp, p *Policy) *Policy {
	out := cp
	for j := range cp.Dimensions {
		i := p.DimensionIndex(cp.Dimensions[j].Unit)
		if i < 0 || p.Dimensions[i].RefillUnits == cp.Dimensions[j].RefillUnits && p.Dimensions[i].RefillInterval == cp.Dimensions[j].RefillInterval {
			continue
		}
		if out == cp {
			c := *cp
			c.Dimensions = slices.Clone(cp.Dimensions)
			out = &c
		}
		out.Dimensions[j].RefillUnits = p.Dimensions[i].RefillUnits
		out.Dimensions[j].RefillInterval = p.Dimensions[i].RefillInterval
	}
	return out
}

// laterWait is the later of two retry-afters (0, never, is the latest).
func laterWait(x, y time.Duration) time.Duration {
	if slower(x, y) {
		return x
	}
	return y
}

// refillsFor reports whether an owing current account under cp refills
// units its deciding generation limits (bringOwingToNow): not when cp was
// rolled back (it then refills only to repay).
func refillsFor(cp *Policy) bool { return !cp.RolledBack }

// owingMove moves from's debt and available capacity to to (moveBetween)
// as a change of the account holding a frozen subject's capacity does:
// receipt "owing:<from>:<from's version>", unique since the version only
// grows.
func owingMove(b Book, from, to *Account, now time.Time) {
	moveBetween(b, from, to, MoveForward, "owing:"+from.Key.String()+":"+strconv.FormatUint(from.Version, 10), now)
}

// OwingMetaName is the Meta name of the subject's owing-set size; each
// member's row is named by it, "/" and the member's index. A reader
// outside a command (a view, BringToNowAsShown) reads the row of that
// name and the rows named under it: no other subject's row is either.
func OwingMetaName(subject PolicyKey) string { return metaOwing(subject) }

// OwingSetOf returns the name of the owing set (OwingMetaName of some
// subject) that the Meta row name is or is a member row of; ok is false
// when name is no owing-set row. Each part of a set's name is escaped (no
// "/" inside), so the set's name is the first four parts.
func OwingSetOf(name string) (set string, ok bool) {
	if !strings.HasPrefix(name, MetaOwingPrefix) {
		return "", false
	}
	parts := strings.SplitN(name, "/", 5)
	if len(parts) < 4 {
		return "", false
	}
	return strings.Join(parts[:4], "/"), true
}

// LeftBehindNamesOf returns what the name of every left_behind row of the
// subject (metaLeftBehind) begins with; the unit's part follows. No other
// subject's row name begins with it.
func LeftBehindNamesOf(subject PolicyKey) string {
	return MetaLeftBehindPrefix + subjectNameParts(subject) + "/"
}

// OwingSetOfLeftBehind returns the owing set (OwingMetaName) of the
// subject whose left_behind row name is; ok is false when name is no
// left_behind row.
func OwingSetOfLeftBehind(name string) (set string, ok bool) {
	rest, ok := strings.CutPrefix(name, MetaLeftBehindPrefix)
	if !ok {
		return "", false
	}
	parts := strings.SplitN(rest, "/", 4) // subject, route, region, unit
	if len(parts) != 4 {
		return "", false
	}
	return MetaOwingPrefix + strings.Join(parts[:3], "/"), true
}

// BringToNowAsShown brings the subject's accounts in b, a scratch book
// holding them (keys, all of the subject's generations), their
// generations' policies, the policy p deciding for the subject (nil when
// none does), its current pointer and its owing-set rows as stored, to
// now as the subject's next command finds them, without switching the
// subject to p: the owing accounts as settleOwing brings them (the
// current one repaying only in units p does not limit, the others only
// to repay, an owing one made current where the invariant asks it), the
// current account refilled under its own rule when the subject is not
// frozen, and every other account's elapsed epochs closed. What a switch
// would then move (switchTo, releaseOwing), or a frozen subject's next
// command would move to the deciding generation's account (intoDeciding),
// is left where it is. Only b
// is written; a view runs it on a copy of what it read.
func BringToNowAsShown(b Book, subject PolicyKey, keys []AccountKey, p *Policy, now time.Time) {
	current, hasCurrent := b.AccountCurrent(subject)
	frozen := false
	if hasCurrent && p != nil {
		_, _, frozen, _ = settleOwingMoving(b, subject, current, p, now, false)
		current, hasCurrent = b.AccountCurrent(subject)
	}
	for _, key := range keys {
		a, ap, err := accountFor(b, key)
		if err != nil {
			continue
		}
		isCur := hasCurrent && key.Generation == current
		if isCur && frozen {
			continue // settleOwing brought it to now
		}
		bringToNow(b, a, ap, now, isCur && !ap.RolledBack)
		b.AccountPut(a)
	}
}

// refilledFully reports whether some account of a subject frozen under p
// refills unit fully (cp is the current account's policy, nil when it
// cannot be read; pExists whether p's account exists): p's account, in a
// unit p limits, once it exists (a rolled-back current account refills
// none of them then, bringOwingToNow), or else the current account, in a
// unit both p and cp limit, when cp was not rolled back. No other account
// refills such a unit: debt there moves to p's account (intoDeciding, the
// switch), whose available repays it first. Any other unit is repaid in
// turns (repayTurns).
func refilledFully(unit string, cp, p *Policy, pExists bool) bool {
	if p.DimensionIndex(unit) < 0 {
		return false
	}
	return pExists || cp != nil && refillsFor(cp) && cp.DimensionIndex(unit) >= 0
}

// refillOrder returns members with current first: the order in which a
// frozen subject's accounts refill (settleOwing) and take their turns in a
// unit repaid in turns (repayTurns, slowestOwing).
func refillOrder(members []uint64, current uint64) []uint64 {
	i := slices.Index(members, current)
	if i <= 0 {
		return members
	}
	order := make([]uint64, 0, len(members))
	order = append(order, current)
	order = append(order, members[:i]...)
	return append(order, members[i+1:]...)
}

// repayTurns is the one rule for a unit that no account of a frozen
// subject refills fully (refilledFully): its owing accounts repay their
// debt there one at a time, in refill order (refillOrder), each from where
// the one before it was repaid, so the unit's refill time is spent once
// however many accounts owe there (two repaying at once would mint the
// subject's capacity twice for the same time). settleOwing takes the
// turns as the accounts refill; slowestOwing walks the same turns to tell
// when each account is repaid. Keyed by unit, read by key only.
type repayTurns map[string]repayTurn

// repayTurn is where a unit's next owing account starts repaying: next,
// the time the account before it is repaid (0: no account before it owed
// there; repaidNever: it is never repaid); waiting, that time is after
// now (the next accounts do not refill yet).
type repayTurn struct {
	next    int64
	waiting bool
}

// repaidNever is the time an account that never refills is repaid at.
const repaidNever = int64(math.MaxInt64)

// queuedRefill is an account's place in its units' turns for one refill:
// skip, the dimensions it does not refill (another account refills them
// fully, or one before it still owes there: their cursors move to now,
// refillUpTo); turn, the dimensions repaid in turns, each starting at
// from with debt owed.
type queuedRefill struct {
	skip, turn uint8
	from       [MaxDimensions]int64
	debt       Amounts
}

// queue places a (under its policy ap), about to refill while the subject
// is frozen under p, in its units' turns, and moves its cursor in a unit
// repaid in turns to where the account before it was repaid (never back).
func (t repayTurns) queue(a *Account, ap, cp, p *Policy, pExists bool) queuedRefill {
	var q queuedRefill
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		unit := ap.Dimensions[i].Unit
		if refilledFully(unit, cp, p, pExists) {
			q.skip |= 1 << i
			continue
		}
		turn := t[unit]
		if turn.waiting {
			q.skip |= 1 << i
			continue
		}
		if turn.next == repaidNever {
			// Never reached: it does not refill, as after a waiting one.
			q.skip |= 1 << i
			continue
		}
		a.RefilledTo[i] = max(a.RefilledTo[i], turn.next)
		q.turn |= 1 << i
		q.from[i], q.debt[i] = a.RefilledTo[i], a.Balances[i].Debt()
	}
	return q
}

// took ends a's turn in each unit q queued it for where it owed: the
// next account starts where a is repaid, and waits when that is after now.
func (t repayTurns) took(a *Account, ap *Policy, q *queuedRefill, now time.Time) {
	for i := 0; i < a.Dims && i < len(ap.Dimensions); i++ {
		if q.turn&(1<<i) == 0 || q.debt[i] <= 0 {
			continue
		}
		repaid := repaidAt(&ap.Dimensions[i], q.from[i], q.debt[i])
		t[ap.Dimensions[i].Unit] = repayTurn{next: repaid, waiting: repaid > now.UnixNano()}
	}
}

// after returns when a (dimension i, under d), owing debt there, is
// repaid if it takes its turn in the unit after the accounts walked
// before it, and records it as the unit's next turn: a walk of the turns
// ahead (slowestOwing), where every account before it is repaid in time.
func (t repayTurns) after(a *Account, d *Dimension, i int, debt Units) int64 {
	from := max(a.RefilledTo[i], t[d.Unit].next)
	repaid := repaidAt(d, from, debt)
	if from == repaidNever {
		repaid = repaidNever
	}
	t[d.Unit] = repayTurn{next: repaid}
	return repaid
}

// repaidAt returns when refill under d, counted from the cursor from,
// has minted debt: from plus the whole intervals it takes (refillUpTo
// mints by whole intervals); repaidNever when d does not refill, and
// repaidNever-1 when the time is beyond int64.
func repaidAt(d *Dimension, from int64, debt Units) int64 {
	if !d.Refills() {
		return repaidNever
	}
	intervals := (debt + d.RefillUnits - 1) / d.RefillUnits
	interval := int64(d.RefillInterval)
	if from >= repaidNever-1 || intervals > (repaidNever-1-max(from, 0))/interval {
		return repaidNever - 1
	}
	return from + intervals*interval
}

// waitUntil is the retry-after of a debt repaid at repaid (repaidAt):
// 0 (never) when it is never repaid, else until then in whole seconds,
// one second at least, as refillWait.
func waitUntil(repaid int64, now time.Time) time.Duration {
	switch {
	case repaid == repaidNever:
		return 0
	case repaid == repaidNever-1 || now.UnixNano() < 0 && repaid > math.MaxInt64+now.UnixNano():
		return MaxRetryAfter
	}
	wait := time.Duration(repaid - now.UnixNano())
	if wait < time.Second {
		wait = time.Second
	}
	return WholeSeconds(wait)
}
