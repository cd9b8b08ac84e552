package ledger

import (
	"fmt"
	"time"
)

// Record records usage that was learned only after the work ran and for
// which nothing was reserved: a gateway that knows the cost only from the
// response (Envoy Gateway's and Envoy AI Gateway's response-time cost, a
// check that failed open). It never refuses for lack of capacity: in one
// step it writes a reservation that holds nothing, started and settled
// with the usage, which takes available first and records what
// available lacks as debt (chargeBeyond, the rule of a settle above its
// reservation): SETTLED, or SETTLED_WITH_DEBT with the account frozen
// until refills repay the debt. Usage beyond the max overdraft is still
// recorded in full and counted as a breach. The receipt's id is
// cmd.ReservationID, its operation cmd.OperationID; the reservation
// holds 0 in every dimension, which is what tells a record from a
// reservation made by Reserve.
//
// Returns, in the order they are checked:
//   - ErrInvalidCommand for a missing id or operation id, a negative
//     amount or one above MaxUnits, a missing subject, route or region,
//     the AnySubject subject, or no amount above 0 (the shape, whatever
//     the id names);
//   - for an id that exists: ErrDigestMismatch (with the stored receipt)
//     when it names another request (another digest, or a reservation
//     made by Reserve); success with Replayed and the stored receipt when
//     it was recorded with the same operation id and usage (by unit name
//     when cmd.Generation orders units otherwise: sameUsage), so a retry
//     never charges twice; ErrReservationAlreadySettled when recorded with
//     other usage or another operation id (the first record stands); a
//     removed one answers from its tombstone (fromTombstone): success
//     with Replayed and the tombstone's receipt (Retired set, no usage)
//     for the same digest, whatever the usage and operation id, since the
//     tombstone keeps neither; ErrDigestMismatch (also matching
//     ErrReservationRetired) for another;
//   - ErrNoPolicy when nothing admits for the subject (nothing decides
//     whose capacity the usage is);
//   - ErrInvalidCommand when cmd.Generation is set and another generation
//     decides (Result.Generation names it), or for usage in a dimension
//     the policy does not have;
//   - ErrLifetimeExhausted (with Dimension) when the usage would take the
//     account's lifetime spent above MaxLifetimeUnits;
//   - success with the SETTLED or SETTLED_WITH_DEBT receipt, Generation
//     and Available (the account's available units after it).
//
// Neither debt nor an empty account nor the max reservation refuses a
// record: the work already ran, and refusing would lose its usage.
func Record(b Book, cmd *Command, now time.Time) Result {
	if cmd.ReservationID == "" {
		return Result{Err: invalid("reservation id is empty")}
	}
	if cmd.OperationID == "" {
		return Result{Err: invalid("operation id is empty: usage is recorded under its operation receipt")}
	}
	if err := checkAmounts(nil, &cmd.Units, true); err != nil {
		return Result{Err: checkAmounts(namingPolicy(b, cmd), &cmd.Units, true)}
	}
	if problem := RecordShapeProblem(cmd.Subject, cmd.Route, cmd.Region, cmd.Units[:]); problem != nil {
		return Result{Err: problem}
	}
	if r, ok := b.Reservation(cmd.ReservationID); ok && !(mutantOn("record_charges_replay") && r.OperationID == cmd.OperationID && sameUsage(b, r, cmd)) {
		switch {
		case r.RequestDigest != cmd.RequestDigest || r.Reserved != (Amounts{}):
			return Result{Err: ErrDigestMismatch, Reservation: *r}
		case r.State != StateSettled && r.State != StateSettledWithDebt:
			return Result{Err: stateError(r.State), Reservation: *r} // not reached: a record is born settled
		case r.OperationID == cmd.OperationID && sameUsage(b, r, cmd):
			return Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
		}
		return Result{Err: ErrReservationAlreadySettled, Reservation: *r}
	}
	if t, ok := tombstone(b, cmd.ReservationID); ok && !mutantOn("record_ignores_tombstone") {
		return fromTombstone(t, KindRecord, cmd.RequestDigest)
	}
	subject := PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
	p, ok := activePolicy(b, subject)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrNoPolicy, subject)}
	}
	if cmd.Generation != 0 && cmd.Generation != p.Generation {
		return Result{Err: invalid("units are ordered for policy generation %d, but generation %d decides", cmd.Generation, p.Generation), Generation: p.Generation}
	}
	if err := checkUnits(p, &cmd.Units, true); err != nil {
		return Result{Err: err, Generation: p.Generation}
	}
	a, ap, ok := currentAccount(b, subject, p, now)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrAccountNotFound, subject)}
	}
	refill, cp := true, p // cp: the policy of the account charged
	if ap != p {
		// The current account owes debt p does not limit (currentAccount
		// brought it to now, refilling it as owing: no refill here).
		refill = false
		if sameUnitsAt(p, ap, &cmd.Units) && refillsFor(ap) {
			// It holds the subject's capacity in every unit used: the
			// usage is charged to it, from its available first, as it
			// would be after the switch, and no debt is left on an
			// account that is not current (a rollback of p would strand
			// it).
			cp = ap
		} else {
			// Usage in a unit the owing account does not limit (or in
			// another order), or any usage when its generation was
			// rolled back (its capacity in every unit p limits moved
			// to p's account, intoDeciding: charged to it, the usage
			// would be debt beside that capacity): charged to p's
			// account, which the subject switches to once that debt
			// is repaid; until then it is not current, and debt the
			// usage leaves there puts it in the subject's owing set
			// (below), so a rollback of p does not leave it where
			// nothing repays it.
			a = decidingAccount(b, subject, p, ap, now)
		}
	}
	bringToNow(b, a, cp, now, refill)
	if dim, err := lifetimeRoom(a, cp, &cmd.Units, false); err != nil {
		b.AccountPut(a) // as a rejected reserve, it keeps the refill and epoch close above
		return Result{Err: err, Generation: p.Generation, Dimension: cp.Dimensions[dim].Unit}
	}
	if dim, err := debtRoom(a, cp, &cmd.Units); err != nil {
		b.AccountPut(a)
		return Result{Err: err, Generation: p.Generation, Dimension: cp.Dimensions[dim].Unit}
	}

	before := a.Balances
	r := newReservation(b)
	r.ID, r.RequestDigest, r.Account = cmd.ReservationID, cmd.RequestDigest, a.Key
	r.AccountingEpoch, r.OperationID, r.State = a.EpochStart, cmd.OperationID, StateSettled
	r.CreatedAt, r.ExpiresAt, r.StartedAt, r.FinishedAt = now, now, now, now
	for i := 0; i < a.Dims; i++ {
		chargeBeyond(&a.Balances[i], r, i, cmd.Units[i], &cp.Dimensions[i])
	}
	if r.Breach {
		a.Breaches++
	}
	r.Actual = cmd.Units
	journal(b, a, &before, KindRecord, r.ID, StateRequested, r.State, "", now)
	b.AccountPut(a)
	b.ReservationPut(r)
	if ap != p && cp == p {
		markOwing(b, a, now)
	}
	res := Result{Reservation: *r, Generation: p.Generation}
	for i := 0; i < a.Dims; i++ {
		res.Available[i] = a.Balances[i].Available
	}
	return res
}

// RecordShapeProblem is a Record's shape beside each amount's
// (AmountShapeProblem, capped): a concrete subject (not AnySubject), a
// route, a region, and at least one amount above 0 (no usage is nothing
// to record). Decided from the command alone, before the id is looked
// up. It returns nil for a well-formed Record, else the first refused
// field (ErrInvalidCommand); the ledger and the server both call it.
func RecordShapeProblem(subject, route, region string, units []Units) *FieldError {
	if problem := accountShapeProblem(subject, route, region, "record usage"); problem != nil {
		return problem
	}
	if !anyAbove0(units) {
		return NewFieldError(ErrInvalidCommand, "actualUnits", ": no usage to record (at least one amount above 0)")
	}
	return nil
}

// sameUsage reports whether cmd's usage is what r recorded. cmd.Units are
// in the order of cmd.Generation's dimensions (the generation deciding
// when the retry was mapped), r.Actual in r's generation's: when a
// republished policy ordered its units otherwise, they are compared by
// unit name, so a retry across the republish still replays.
func sameUsage(b Book, r *Reservation, cmd *Command) bool {
	if cmd.Generation == 0 || cmd.Generation == r.Account.Generation {
		return r.Actual == cmd.Units
	}
	from, ok1 := b.Policy(cmd.Generation)
	to, ok2 := b.Policy(r.Account.Generation)
	if !ok1 || !ok2 {
		return r.Actual == cmd.Units
	}
	var usage Amounts
	for i, u := range cmd.Units {
		if u == 0 {
			continue
		}
		if i >= len(from.Dimensions) {
			return false
		}
		j := to.DimensionIndex(from.Dimensions[i].Unit)
		if j < 0 {
			return false
		}
		usage[j] = u
	}
	return usage == r.Actual
}

// sameUnitsAt reports whether every unit usage names (in p's order) is
// ap's unit at the same index, so usage is charged to an account of ap
// without reordering (a record's Actual stays the command's usage).
func sameUnitsAt(p, ap *Policy, usage *Amounts) bool {
	for i, u := range usage {
		if u == 0 {
			continue
		}
		if i >= len(p.Dimensions) || i >= len(ap.Dimensions) || ap.Dimensions[i].Unit != p.Dimensions[i].Unit {
			return false
		}
	}
	return true
}
