package ledger

import (
	"fmt"
	"strconv"
	"time"
)

// currentAccount returns the account that holds the subject's capacity under
// policy p, creating it when p's generation has none yet. When the subject's
// capacity sits in another generation's account (a new generation was
// published, or the current one rolled back), that account's available
// capacity and debt move over first, exactly once, so a republished policy
// neither hands out a fresh burst nor forgets debt.
func currentAccount(b Book, subject PolicyKey, p *Policy, now time.Time) (*Account, bool) {
	currentGeneration, hasCurrent := b.AccountCurrent(subject)
	key := AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: p.Generation}
	if hasCurrent && currentGeneration == p.Generation {
		return b.Account(key)
	}
	account, exists := b.Account(key)
	if !exists {
		account = &Account{Key: key, Dims: len(p.Dimensions)}
		if !hasCurrent {
			// The subject's first account opens with a full burst.
			for i := range p.Dimensions {
				account.Balances[i].Opening = p.Dimensions[i].Burst
				account.Balances[i].Available = p.Dimensions[i].Burst
			}
		}
		startEpoch(account, p, now)
		for i := range p.Dimensions {
			account.RefilledTo[i] = now.UnixNano()
		}
		before := Balances{}
		journal(b, account, &before, KindReserve, "", StateRequested, StateRequested, "open", now)
		b.AccountPut(account)
	}
	b.AccountCurrentPut(subject, p.Generation)
	if hasCurrent {
		previousKey := key
		previousKey.Generation = currentGeneration
		if previous, ok := b.Account(previousKey); ok {
			receipt := "switch:" + previousKey.String() + ">" + strconv.FormatUint(p.Generation, 10) +
				":" + strconv.FormatUint(previous.Version, 10)
			moveBetween(b, previous, account, MoveGenerationSwitch, receipt, now)
		}
	}
	return account, true
}

// moveBetween moves from's available capacity to to (retired at from,
// minted at to) and has to assume from's debt (issued and retired at to,
// minted and repaid at from). Units are matched by dimension unit; a unit
// the destination's policy no longer limits stays behind. It does nothing
// when there is nothing to move or the receipt was already applied.
func moveBetween(b Book, from, to *Account, kind MoveKind, receiptID string, now time.Time) *Move {
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
	for i := 0; i < from.Dims; i++ {
		j := toPolicy.DimensionIndex(fromPolicy.Dimensions[i].Unit)
		if j < 0 {
			continue
		}
		src, dst := &from.Balances[i], &to.Balances[j]
		if units := src.Available; units > 0 {
			src.Available -= units
			src.RetiredForMove += units
			mint(dst, units)
			move.Units[i] = units
			moved = true
		}
		if debt := src.Debt(); debt > 0 {
			dst.OverdraftIssued += debt
			dst.RetiredForMove += debt
			src.Minted += debt
			src.OverdraftRepaid += debt
			move.Debt[i] = debt
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

// forwardIfSuperseded moves what a late refund or late debt left on an
// account of a superseded generation to the subject's current account.
func forwardIfSuperseded(b Book, account *Account, receiptID string, now time.Time) {
	subject := account.Key.SubjectKey()
	current, ok := b.AccountCurrent(subject)
	if !ok || current == account.Key.Generation {
		return
	}
	p, ok := activePolicy(b, subject)
	if !ok {
		return // nothing admits for the subject: the capacity stays where it is
	}
	target, ok := currentAccount(b, subject, p, now)
	if !ok || target.Key == account.Key {
		return
	}
	tick(b, target, p, now)
	moveBetween(b, account, target, MoveForward, receiptID, now)
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

// tick brings an account to now: closes elapsed accounting epochs, then
// mints the refill due since the cursor if p is the account's own active
// generation. Superseded or rolled-back generations never refill.
func tick(b Book, a *Account, p *Policy, now time.Time) {
	rollEpoch(b, a, p, now)
	if p.Generation != a.Key.Generation || p.RolledBack {
		return
	}
	// Only the account that holds the subject's capacity refills: a
	// superseded generation minting too would hand out capacity twice once
	// its balance is forwarded.
	if current, ok := b.AccountCurrent(a.Key.SubjectKey()); !ok || current != a.Key.Generation {
		return
	}
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		d := &p.Dimensions[i]
		if d.RefillUnits <= 0 {
			continue
		}
		interval := int64(d.RefillInterval)
		elapsed := now.UnixNano() - a.RefilledTo[i]
		if elapsed < interval {
			continue
		}
		intervals := elapsed / interval
		a.RefilledTo[i] += intervals * interval
		bal := &a.Balances[i]
		room := d.Burst - bal.Available - bal.Reserved
		if room < 0 {
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
			before := a.Balances
			mint(bal, due)
			journal(b, a, &before, KindRefill, "", 0, 0, "", now)
		}
	}
}

func startEpoch(a *Account, p *Policy, now time.Time) {
	a.EpochStart = now.Truncate(p.EpochLength).UTC()
	a.EpochOpening = a.Balances
}

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
	next := now.Truncate(p.EpochLength).UTC()
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
	entry := JournalEntry{At: now, Kind: kind, Account: a.Key, ReservationID: reservationID, From: from, To: to, ReceiptID: receipt}
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
// epochs). Commands refill lazily; this exists for workers and tools.
//
// Returns: ErrAccountNotFound; otherwise success, with the account's epoch
// and refill cursor brought to now.
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
// Returns: ErrAccountNotFound; otherwise success (Replayed when the epoch
// was still open and nothing was written).
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
// Returns: Move on success; ErrAccountNotFound; ErrNothingToDrain when the
// account is the current one, is empty, or nothing admits for the subject.
func Drain(b Book, key AccountKey, now time.Time) Result {
	a, p, err := accountFor(b, key)
	if err != nil {
		return Result{Err: err}
	}
	rollEpoch(b, a, p, now)
	subject := key.SubjectKey()
	active, ok := activePolicy(b, subject)
	if !ok {
		return Result{Err: fmt.Errorf("%w: no active policy for %s", ErrNothingToDrain, subject)}
	}
	if active.Generation == key.Generation {
		return Result{Err: fmt.Errorf("%w: %s is current", ErrNothingToDrain, key)}
	}
	target, _ := currentAccount(b, subject, active, now)
	tick(b, target, active, now)
	if target.Key == a.Key {
		return Result{Err: fmt.Errorf("%w: %s is current", ErrNothingToDrain, key)}
	}
	receipt := "drain:" + key.String() + ":" + strconv.FormatUint(a.Version, 10)
	move := moveBetween(b, a, target, MoveForward, receipt, now)
	b.AccountPut(target)
	if move == nil {
		return Result{Err: fmt.Errorf("%w: %s holds no available capacity or debt", ErrNothingToDrain, key)}
	}
	return Result{Generation: active.Generation, Move: move}
}
