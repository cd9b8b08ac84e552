package ledger

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Reserve is the sole admission point. It resolves the active policy for the
// command's subject, route and region, brings the account to now (epoch,
// refill), and moves the estimate from available to reserved in every
// dimension at once, or in none, writing the reservation receipt in the
// same step.
//
// Returns, in the order they are checked:
//   - ErrInvalidCommand for a missing id, negative units, a missing
//     subject, route or region, the AnySubject subject, or no unit above
//     0 (AmountShapeProblem, ReserveShapeProblem: the shape, whatever the
//     id names);
//   - success with Replayed and the stored receipt, whatever its state now,
//     when the id exists with the same digest (a retry never debits twice);
//   - ErrDigestMismatch (with the stored receipt) when the id exists with
//     another digest;
//   - ErrNoPolicy when nothing admits for the subject;
//   - ErrInvalidCommand when cmd.Generation is set and another generation
//     decides (Result.Generation names it), or for units in a dimension
//     the policy does not have;
//   - ErrReservationTooLarge for units above MaxUnits (no policy allows
//     them: burst is at most MaxUnits);
//   - ErrReservationTooLarge when a dimension exceeds its max reservation
//     (RetryAfter 0: no wait helps);
//   - ErrAdmissionFrozen while the account carries debt in any dimension;
//   - ErrInsufficientCapacity when a dimension lacks available capacity;
//   - ErrLifetimeExhausted (with Dimension) when settling the units and
//     every hold outstanding at their estimates would take the account's
//     lifetime spent above MaxLifetimeUnits; under a shadow policy it sets
//     Shadow like a capacity rejection;
//   - success with the new RESERVED receipt and Generation.
//
// Capacity rejections (TooLarge, Frozen, Insufficient) carry Generation,
// the limiting Dimension and RetryAfter (see admissible), and nothing about
// any other subject. Under a shadow policy they also set Shadow: nothing is
// reserved, the decision is journaled, and the caller proceeds under its
// old limiter. Even a rejected reserve keeps what bringing the account to
// now did (the generation switch, the refill, the epoch close).
func Reserve(b Book, cmd *Command, now time.Time) (res Result) {
	reserve(b, cmd, now, &res)
	return res
}

// reserve is Reserve answering into *res, which must be zero: Apply
// passes its own result, so the receipt is not copied once more on the way
// out.
func reserve(b Book, cmd *Command, now time.Time, res *Result) {
	if cmd.ReservationID == "" {
		*res = Result{Err: invalid("reservation id is empty")}
		return
	}
	// The units' shape before the id is looked up (docs/API.md, "Order of
	// checks"): a retry with negative units is ErrInvalidCommand, never a
	// replay, whichever way it reaches the ledger.
	if err := checkAmounts(nil, &cmd.Units, false); err != nil {
		*res = Result{Err: checkAmounts(namingPolicy(b, cmd), &cmd.Units, false)}
		return
	}
	// The rest of the shape too (the server calls the same rule): a
	// retry without a subject or without units is ErrInvalidCommand, not
	// its receipt or a digest mismatch.
	if problem := ReserveShapeProblem(cmd.Subject, cmd.Route, cmd.Region, cmd.Units[:]); problem != nil {
		*res = Result{Err: problem}
		return
	}
	if problem := ReserveDigestProblem(cmd.RequestDigest); problem != "" {
		*res = Result{Err: invalid("%s", problem)}
		return
	}
	if existing, ok := b.Reservation(cmd.ReservationID); ok {
		if existing.RequestDigest != cmd.RequestDigest {
			*res = Result{Err: ErrDigestMismatch, Reservation: *existing}
			return
		}
		*res = Result{Reservation: *existing, Replayed: true, Generation: existing.Account.Generation}
		return
	}
	if t, ok := tombstone(b, cmd.ReservationID); ok && !mutantOn("reserve_ignores_tombstone") {
		*res = fromTombstone(t, KindReserve, cmd.RequestDigest)
		return
	}
	if cmd.Rollout != "" && cmd.Rollout != RolloutEnforce && cmd.Rollout != RolloutShadow {
		*res = Result{Err: invalid("rollout mode %q is neither %q nor %q", cmd.Rollout, RolloutEnforce, RolloutShadow)}
		return
	}
	subject := PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
	p, ok := activePolicy(b, subject)
	if !ok {
		*res = Result{Err: fmt.Errorf("%w: %s", ErrNoPolicy, subject)}
		return
	}
	if cmd.Generation != 0 && cmd.Generation != p.Generation {
		*res = Result{Err: invalid("units are ordered for policy generation %d, but generation %d decides", cmd.Generation, p.Generation), Generation: p.Generation}
		return
	}
	if refused := checkUnitsToHold(p, &cmd.Units, "reservation"); refused.Err != nil {
		*res = refused
		return
	}
	a, ap, ok := currentAccount(b, subject, p, now)
	if !ok {
		*res = Result{Err: fmt.Errorf("%w: %s", ErrAccountNotFound, subject)}
		return
	}
	if ap != p {
		// The subject owes debt in a unit p does not limit, on the
		// account of the generation that issued it, which stays current
		// (currentAccount brought it to now): that debt freezes the
		// subject's admission as its own would.
		refuseOwing(b, cmd, a, ap, p, now, res)
		return
	}
	bringToNow(b, a, p, now, true)

	rej := admit(a, p, &cmd.Units, now)
	if rej.err == nil {
		// Admit only work whose settle at its estimate could be recorded,
		// so a full account refuses new work rather than its settles.
		if dim, err := lifetimeRoom(a, p, &cmd.Units, true); err != nil {
			rej = rejection{err: err, dimension: dim}
		}
	}
	if rej.err != nil {
		*res = rej.result(p)
		res.Generation = p.Generation
		for i := 0; i < a.Dims; i++ {
			res.Available[i] = a.Balances[i].Available
		}
		if cmp.Or(cmd.Rollout, p.Rollout) == RolloutShadow {
			res.Shadow = true
			before := a.Balances
			journal(b, a, &before, KindReserve, cmd.ReservationID, StateRequested, StateRequested, "shadow", now)
		}
		b.AccountPut(a) // a rejection still keeps the refill and epoch close above
		return
	}

	before := a.Balances
	for i := 0; i < a.Dims; i++ {
		a.Balances[i].Available -= cmd.Units[i]
		a.Balances[i].Reserved += cmd.Units[i]
	}
	// Field by field into the zeroed row: a composite literal would be
	// built on the stack and copied, with write barriers, into the row.
	r := newReservation(b)
	r.ID, r.RequestDigest, r.Account = cmd.ReservationID, cmd.RequestDigest, a.Key
	r.AccountingEpoch, r.Reserved, r.State = a.EpochStart, cmd.Units, StateReserved
	r.CreatedAt, r.ExpiresAt = now, deadline(now, p.HoldTTL)
	journal(b, a, &before, KindReserve, r.ID, StateRequested, StateReserved, "", now)
	b.AccountPut(a)
	b.ReservationPut(r)
	// Filling *res, rather than returning a literal, spares a
	// copy of the 500-byte Result on the hot path.
	res.Reservation, res.Generation = *r, p.Generation
	for i := 0; i < a.Dims; i++ {
		res.Available[i] = a.Balances[i].Available
	}
	return
}

// refuseOwing answers a reserve under p while the subject's current
// account a (under its own policy ap) owes debt in a unit p does not
// limit: ErrAdmissionFrozen, decided by admit on a with the units p and ap
// both limit (so the limiting dimension and the retry-after are a's, as
// for an account frozen by its own debt), Generation p's. The available
// capacity reported is a's in the units both limit.
func refuseOwing(b Book, cmd *Command, a *Account, ap, p *Policy, now time.Time, res *Result) {
	if rej := admit(&Account{Dims: len(p.Dimensions)}, p, &cmd.Units, now); rej.err != nil && errors.Is(rej.err, ErrReservationTooLarge) {
		*res = rej.result(p) // no wait helps, whatever is owed
		res.Generation = p.Generation
		return
	}
	units := unitsAs(p, ap, &cmd.Units)
	beyond := beyondCurrentBurst(b, a, ap, p, &units)
	for j := range ap.Dimensions {
		units[j] = min(units[j], ap.Dimensions[j].MaxReservation)
	}
	capacity := subjectCapacity(b, a, ap, p)
	rej := admit(&capacity, ap, &units, now)
	if terms := decidingRefill(ap, p); terms != ap {
		// Reckoned on p's refill terms too (a switch during the wait
		// leaves the rest to p's account's refill): the later wait.
		if onP := admit(&capacity, terms, &units, now); slower(onP.retryAfter, rej.retryAfter) {
			rej.dimension, rej.retryAfter = onP.dimension, onP.retryAfter
		}
	}
	if rej.err == nil || !errors.Is(rej.err, ErrAdmissionFrozen) {
		rej.err = fmt.Errorf("%w (%s)", ErrAdmissionFrozen, ap.Dimensions[max(rej.dimension, 0)].Unit)
		rej.heldUp = false // admit's reason went with its error
	}
	*res = rej.result(ap)
	said := rej.heldUp // res.Err says why no Retry-After is given
	// Another of the subject's accounts may owe longer (or a, repaid,
	// stays current while another owes): the retry-after is the slowest
	// owing account's, so no earlier retry succeeds.
	if unit, wait, ok := slowestOwing(b, a, ap, p, &cmd.Units, now); ok && (!owesDropped(a, ap, p) || slower(wait, res.RetryAfter)) {
		res.Err = fmt.Errorf("%w (%s)", ErrAdmissionFrozen, unit)
		res.Dimension, res.RetryAfter = unit, wait
		said = false
	}
	if i := heldUpAtSwitch(b, a, ap, p, &cmd.Units); i >= 0 {
		unit := p.Dimensions[i].Unit
		res.Err = fmt.Errorf("%w: only outstanding holds ending can make room in %s (refill fills available only up to burst minus reserved), so no Retry-After is given", res.Err, unit)
		res.Dimension, res.RetryAfter = unit, 0
	} else if beyond >= 0 {
		unit := ap.Dimensions[beyond].Unit
		res.Err = fmt.Errorf("%w: the estimate of %s fits only the burst of generation %d, once the subject is no longer frozen, so no Retry-After is given", res.Err, unit, p.Generation)
		res.Dimension, res.RetryAfter = unit, 0
	} else if res.RetryAfter == 0 && !said {
		// The wait is never: the limiting unit's refill, reckoned on the
		// deciding generation's terms (decidingRefill) or the current
		// account's, mints nothing there.
		if g, ok := mintsNothing(ap, p, res.Dimension); ok {
			res.Err = fmt.Errorf("%w: generation %d refills no %s (refillUnits 0), so no Retry-After is given", res.Err, g, res.Dimension)
		}
	}
	res.Generation = p.Generation
	for i := range p.Dimensions {
		if j := ap.DimensionIndex(p.Dimensions[i].Unit); j >= 0 {
			res.Available[i] = a.Balances[j].Available
		}
	}
	if cmp.Or(cmd.Rollout, p.Rollout) == RolloutShadow {
		res.Shadow = true
		before := a.Balances
		journal(b, a, &before, KindReserve, cmd.ReservationID, StateRequested, StateRequested, "shadow", now)
		b.AccountPut(a)
	}
}

// mintsNothing returns the generation, p's first, then ap's, whose
// policy limits unit with refillUnits 0; ok is false when both refill it
// (or neither limits it). A frozen subject's wait in such a unit never
// ends through refill (refuseOwing).
func mintsNothing(ap, p *Policy, unit string) (generation uint64, ok bool) {
	for _, q := range []*Policy{p, ap} {
		if i := q.DimensionIndex(unit); i >= 0 && q.Dimensions[i].RefillUnits == 0 {
			return q.Generation, true
		}
	}
	return 0, false
}

// unitsAs maps units in the dimensions of policy from to the dimensions
// of policy to, by unit name; a unit to does not limit is left out.
func unitsAs(from, to *Policy, units *Amounts) Amounts {
	var out Amounts
	for i := range from.Dimensions {
		if j := to.DimensionIndex(from.Dimensions[i].Unit); j >= 0 {
			out[j] = units[i]
		}
	}
	return out
}

// rejection is admission's verdict: a zero err admits; otherwise err,
// the limiting dimension's index and a conservative retry-after. It is
// small, so the admitting path copies no Result.
type rejection struct {
	err        error
	dimension  int
	retryAfter time.Duration
	// heldUp: err says why no Retry-After is given (only holds ending
	// can make room in the limiting dimension).
	heldUp bool
}

// result is the rejection as a command's answer under policy p.
func (r rejection) result(p *Policy) Result {
	return Result{Err: r.err, Dimension: p.Dimensions[r.dimension].Unit, RetryAfter: r.retryAfter}
}

// admissible decides whether units fit in account a now. On rejection it
// returns the error, the limiting dimension and a conservative retry-after
// (see admit).
func admissible(a *Account, p *Policy, units *Amounts, now time.Time) (bool, Result) {
	rej := admit(a, p, units, now)
	if rej.err == nil {
		return false, Result{}
	}
	return true, rej.result(p)
}

// admit decides whether units fit in account a now.
//
// A reservation larger than the policy allows is rejected first: no wait
// helps it (retry-after 0). Otherwise every dimension's shortfall is its
// debt plus what the estimate lacks in available (refill repays debt
// before it fills available), and the limiting dimension is the one refill
// covers last, so no earlier retry can succeed through refill alone. Debt
// in any dimension makes the rejection ErrAdmissionFrozen.
//
// Refill fills available only up to burst - reserved: while the holds
// outstanding now stay, an estimate above that never fits however long
// refill runs. Such a dimension has retry-after 0 too (no Retry-After:
// only holds ending can make room, and when they end is the gateways'
// doing), and the error says so. The retry-after given is therefore a
// promise: if nothing else happens on the account, the same request
// retried after it fits.
//
// The error names the limiting dimension only: never a balance, a debt or
// any other figure of the account (CLIENTS.md; the owed amount is for
// GetAccount).
func admit(a *Account, p *Policy, units *Amounts, now time.Time) rejection {
	for i := 0; i < a.Dims; i++ {
		d := &p.Dimensions[i]
		if units[i] > d.MaxReservation {
			return rejection{
				err:       fmt.Errorf("%w: %d %s requested, at most %d", ErrReservationTooLarge, units[i], d.Unit, d.MaxReservation),
				dimension: i,
			}
		}
	}
	frozen, limiting := -1, -1
	heldUp := false // the limiting dimension waits for holds, not refill
	var wait time.Duration
	for i := 0; i < a.Dims; i++ {
		bal := &a.Balances[i]
		debt := bal.Debt()
		if mutantOn("debt_admits") {
			debt = 0
		}
		if debt > 0 && frozen < 0 {
			frozen = i
		}
		shortfall := debt + max(units[i]-bal.Available, 0)
		if shortfall <= 0 {
			continue
		}
		var w time.Duration
		holds := units[i] > bal.Available && units[i] > p.Dimensions[i].Burst-bal.Reserved-a.HeldElsewhere[i]
		if !holds || mutantOn("retry_after_ignores_holds") {
			w = refillWait(a, &p.Dimensions[i], i, shortfall, now)
		}
		if limiting < 0 || slower(w, wait) {
			limiting, wait, heldUp = i, w, holds
		}
	}
	unit := ""
	if limiting >= 0 {
		unit = p.Dimensions[limiting].Unit
	}
	why := ""
	if heldUp && wait == 0 {
		why = ": only outstanding holds ending can make room in " + unit + " (refill fills available only up to burst minus reserved), so no Retry-After is given"
	}
	switch {
	case frozen >= 0:
		return rejection{
			err:        fmt.Errorf("%w (%s)%s", ErrAdmissionFrozen, p.Dimensions[frozen].Unit, why),
			dimension:  limiting,
			retryAfter: wait,
			heldUp:     why != "",
		}
	case limiting >= 0:
		err := ErrInsufficientCapacity
		if why != "" {
			err = fmt.Errorf("%w%s", ErrInsufficientCapacity, why)
		}
		return rejection{err: err, dimension: limiting, retryAfter: wait, heldUp: why != ""}
	}
	return rejection{}
}

// slower reports whether retry-after x is later than y; 0 (refill never
// covers it) is the latest of all.
func slower(x, y time.Duration) bool {
	switch {
	case y == 0:
		return false
	case x == 0:
		return true
	}
	return x > y
}

// MaxRetryAfter is the retry-after of a shortfall so large that the wait
// does not fit in a Duration: the longest whole-second Duration (about 292
// years). Whatever derives a wait from refills (a Retry-After, a reset)
// caps it here rather than overflow.
const MaxRetryAfter = time.Duration(math.MaxInt64) / time.Second * time.Second

// WholeSeconds rounds a wait up to whole seconds (HTTP Retry-After has
// second resolution, and rounding down would invite a retry that must
// fail), MaxRetryAfter at most: rounding a wait in the last second below
// it, or beyond it, would overflow into a negative wait.
func WholeSeconds(d time.Duration) time.Duration {
	if d > MaxRetryAfter-time.Second {
		return MaxRetryAfter
	}
	return (d + time.Second - 1).Truncate(time.Second)
}

// refillWait is how long refill needs to mint shortfall units in dimension
// i, counted from the refill cursor, rounded up to whole intervals and to at
// least one second (HTTP Retry-After has second resolution). It is
// conservative in that no earlier retry can succeed through refill alone;
// 0 means refill can never cover it (the policy mints nothing).
func refillWait(a *Account, d *Dimension, i int, shortfall Units, now time.Time) time.Duration {
	if !d.Refills() || shortfall <= 0 {
		return 0
	}
	intervals := (shortfall + d.RefillUnits - 1) / d.RefillUnits
	interval := int64(d.RefillInterval)
	nowNanos := now.UnixNano()
	// due - now = cursor - now + intervals*interval, computed without
	// overflowing int64.
	lag := a.RefilledTo[i] - nowNanos
	if intervals > (math.MaxInt64-max(lag, 0))/interval {
		return MaxRetryAfter
	}
	wait := time.Duration(lag + intervals*interval)
	if wait < time.Second {
		wait = time.Second
	}
	return WholeSeconds(wait)
}

// checkUnitsToHold is checkUnits for units a command takes out of
// available (a Reserve's estimate, a shard's allocation; what names it in
// the message): an amount above MaxUnits is ErrReservationTooLarge, with
// its dimension, because no policy's burst is above MaxUnits, so it can
// never fit (docs/API.md, "Limits"); it is no malformed command. The zero
// Result when the units are fine.
func checkUnitsToHold(p *Policy, units *Amounts, what string) Result {
	err := checkUnits(p, units, true)
	if err == nil {
		return Result{}
	}
	if dim := aboveMaxUnits(p, units); dim >= 0 {
		return Result{Err: fmt.Errorf("%w: %d %s requested; no %s may exceed %d units per dimension",
			ErrReservationTooLarge, units[dim], p.Dimensions[dim].Unit, what, MaxUnits),
			Generation: p.Generation, Dimension: p.Dimensions[dim].Unit}
	}
	return Result{Err: err, Generation: p.Generation}
}

// aboveMaxUnits returns the first dimension of p whose amount is above
// MaxUnits while none is negative or outside p's dimensions, or -1.
func aboveMaxUnits(p *Policy, units *Amounts) int {
	dim := -1
	for i, u := range units {
		if u < 0 || (u > 0 && i >= len(p.Dimensions)) {
			return -1
		}
		if u > MaxUnits && dim < 0 {
			dim = i
		}
	}
	return dim
}

// dimensionName names dimension i for an error: by its unit, which is
// what the caller wrote (units are a map of names in the API), and its
// index; by the index alone when p is nil or lacks the dimension.
func dimensionName(p *Policy, i int) string {
	if p != nil && i < len(p.Dimensions) {
		return fmt.Sprintf("%q (dimension %d)", p.Dimensions[i].Unit, i)
	}
	return fmt.Sprintf("dimension %d", i)
}

// AmountShapeProblem is the shape rule for one amount of a command, the
// part of docs/API.md's "Order of checks" step 2 an amount takes part in:
// decided from the command alone, before any policy, reservation or shard
// is read, so a malformed amount gets the same answer whatever the id
// names (or whether it exists). It returns "" for a well-formed amount,
// else what is wrong, phrased to follow the amount's name: "is negative
// (-3)", or, when capped (a Settle's usage, a shard receipt's amounts),
// "exceeds 9007199254740992 (...)". A Reserve's or shard issue's amount
// above MaxUnits is not a shape error: it is ErrReservationTooLarge, which
// needs the policy. The ledger and the server (on its units maps) both
// call it, so they cannot disagree on the rule.
func AmountShapeProblem(u Units, capped bool) string {
	switch {
	case u < 0:
		return fmt.Sprintf("is negative (%d)", u)
	case capped && u > MaxUnits:
		return fmt.Sprintf("exceeds %d (%d)", MaxUnits, u)
	}
	return ""
}

// RecordDigestPrefix starts the request digest of every record (Record;
// the server's RecordDigest) and no Reserve's (ReserveDigestProblem), so
// that an id a Reserve made is another request to a record and the other
// way round, also once retention left only the digest in a tombstone.
const RecordDigestPrefix = "record:"

// MaxDigestBytes bounds a Reserve's request digest. The canonical one
// (docs/CLIENTS.md) is 71 bytes; the bound leaves room for other hashes
// and prefixes while keeping a caller from storing a megabyte with every
// reservation (and its tombstone) and in every answer that shows it.
const MaxDigestBytes = 512

// ReserveDigestProblem returns "" for a digest a Reserve may carry, else
// what is wrong: one starting with RecordDigestPrefix, which would let a
// retired reservation pass for a record, or one longer than
// MaxDigestBytes. The ledger (Reserve, before the
// id is looked up) and the server (on the caller's request_digest) both
// call it.
func ReserveDigestProblem(digest string) string {
	switch {
	case strings.HasPrefix(digest, RecordDigestPrefix):
		return fmt.Sprintf("request digest starts with %q, which only a RecordUsage's digest does", RecordDigestPrefix)
	case len(digest) > MaxDigestBytes:
		return fmt.Sprintf("request digest is %d bytes long; at most %d", len(digest), MaxDigestBytes)
	}
	return ""
}

// ReserveShapeProblem is the rest of a Reserve's shape in docs/API.md's
// "Order of checks" step 2, beside each amount's (AmountShapeProblem): a
// concrete subject (not AnySubject), a route, a region (each at most
// MaxKeyBytes), and at least one amount above 0. Decided from the command
// alone, before the reservation id is looked up, so a malformed retry is
// refused whatever the id names (a live reservation, a tombstone). It
// returns nil for a well-formed Reserve, else the first refused field
// (ErrInvalidCommand, its path the request's field: "subject", "units").
// The ledger (Reserve) and the server (on its request, the region
// defaulted) both call it, so they check the same rule in the same order.
func ReserveShapeProblem(subject, route, region string, units []Units) *FieldError {
	if problem := accountShapeProblem(subject, route, region, "reserve"); problem != nil {
		return problem
	}
	if !anyAbove0(units) {
		return NewFieldError(ErrInvalidCommand, "units", ": no units to reserve (at least one amount above 0)")
	}
	return nil
}

// accountShapeProblem is what a command that takes capacity from an
// account (what verb says it does) needs of its key: a concrete subject
// (not AnySubject), a route and a region, each at most MaxKeyBytes; nil
// when it has them, else the first field refused, one field per refusal
// ("subject is required" before "route is required").
func accountShapeProblem(subject, route, region, verb string) *FieldError {
	switch {
	case subject == AnySubject:
		return NewFieldError(ErrInvalidCommand, "subject", fmt.Sprintf("%q names every subject; %s for a concrete one", AnySubject, verb))
	case subject == "":
		return NewFieldError(ErrInvalidCommand, "subject", "is required")
	case route == "":
		return NewFieldError(ErrInvalidCommand, "route", "is required")
	case region == "":
		return NewFieldError(ErrInvalidCommand, "region", "is required")
	}
	if field, problem := KeyFieldProblem(subject, route, region); problem != "" {
		return NewFieldError(ErrInvalidCommand, field, problem)
	}
	return nil
}

// anyAbove0 reports whether at least one of units is above 0.
func anyAbove0(units []Units) bool {
	return slices.ContainsFunc(units, func(u Units) bool { return u > 0 })
}

// namingPolicy returns the policy whose dimension order cmd.Units are in,
// only to name a unit in an error: cmd.Generation's, else the one that
// decides for cmd's subject; nil when neither is known (units are then
// named by index).
func namingPolicy(b Book, cmd *Command) *Policy {
	if cmd.Generation != 0 {
		if p, ok := b.Policy(cmd.Generation); ok {
			return p
		}
	}
	p, _ := activePolicy(b, PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region})
	return p
}

// checkAmounts applies AmountShapeProblem to every dimension of units (p,
// when not nil, only names the unit).
func checkAmounts(p *Policy, units *Amounts, capped bool) error {
	for i, u := range units {
		if problem := AmountShapeProblem(u, capped); problem != "" {
			return invalid("units in %s: amount %s", dimensionName(p, i), problem)
		}
	}
	return nil
}

// checkUnits validates amounts against a policy: no negative amounts, none
// above MaxUnits, none in dimensions the policy lacks, and (when positive
// is set) at least one positive amount. The commands have checked the
// shape (checkAmounts) before reading any row; it is checked again here
// so the function stands on its own.
func checkUnits(p *Policy, units *Amounts, positive bool) error {
	any := false
	for i, u := range units {
		if problem := AmountShapeProblem(u, false); problem != "" {
			return invalid("units in %s: amount %s", dimensionName(p, i), problem)
		}
		if u > MaxUnits {
			return invalid("units in %s exceed %d (%d)", dimensionName(p, i), MaxUnits, u)
		}
		if u > 0 && i >= len(p.Dimensions) {
			return invalid("units in dimension %d, which policy generation %d does not have", i, p.Generation)
		}
		any = any || u > 0
	}
	if positive && !any {
		return invalid("no units to reserve")
	}
	return nil
}

// Start binds an operation id to a RESERVED reservation and moves it to
// STARTED (compare-and-set: expiry can no longer take it).
//
// Returns: success with the STARTED receipt (ExecutionDeadline set when
// the policy has an execution limit); Replayed when it is already STARTED,
// USAGE_UNKNOWN or settled with the same operation id; ErrInvalidCommand
// without an id or operation id; ErrReservationNotFound;
// ErrOperationMismatch when it was started with another operation id;
// ErrReservationReleased; ErrReservationExpired when expiry claimed it
// first (EXPIRING or EXPIRED).
func Start(b Book, id, operationID string, now time.Time) (res Result) {
	start(b, id, operationID, AccountKey{}, now, &res)
	return res
}

// start is Start answering into *res, which must be zero: Apply
// passes its own result, so the receipt is not copied once more on the way
// out. checked is the command's CheckedAccount (lookup).
func start(b Book, id, operationID string, checked AccountKey, now time.Time, res *Result) {
	// The command's shape before the reservation: a malformed start is
	// ErrInvalidCommand whatever the id names (or whether it exists).
	if operationID == "" && id != "" {
		*res = Result{Err: invalid("operation id is empty")}
		return
	}
	r, err := lookup(b, id, checked)
	if err != nil {
		*res = missing(err, KindStart)
		return
	}
	switch r.State {
	case StateReserved:
		r.State = StateStarted
		r.OperationID = operationID
		r.StartedAt = now
		if p, ok := b.Policy(r.Account.Generation); ok && p.ExecutionLimit > 0 {
			r.ExecutionDeadline = deadline(now, p.ExecutionLimit)
		}
		transition(b, r, StateReserved, KindStart, now)
		res.Reservation, res.Generation = *r, r.Account.Generation
		return
	case StateStarted, StateUsageUnknown, StateSettled, StateSettledWithDebt:
		if r.OperationID != operationID {
			*res = Result{Err: ErrOperationMismatch, Reservation: *r}
			return
		}
		*res = Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
		return
	}
	*res = Result{Err: stateError(r.State), Reservation: *r}
	return
}

// Settle records the actual usage of started work (STARTED or
// USAGE_UNKNOWN, the operation id being the operation receipt) and returns
// the unused difference to available exactly once. Usage above the
// reservation takes available first; the remainder is recorded as
// overdraftIssued and spent, the reservation ends SETTLED_WITH_DEBT and the
// account admits nothing until refills repay the debt. Usage beyond the max
// overdraft, or a settle after the execution limit, is still recorded in
// full and counted as a breach.
//
// On a superseded generation's account the refund (or the new debt) is
// forwarded to the subject's current account, once, under the receipt
// "settle:<id>".
//
// Returns: success with the SETTLED or SETTLED_WITH_DEBT receipt and
// Refunded (reserved minus actual, floored at zero per dimension);
// Replayed (Refunded zero) when already settled with the same operation id
// and actual units; ErrReservationAlreadySettled when settled differently;
// ErrReservationNotStarted for a RESERVED one; ErrOperationMismatch;
// ErrReservationReleased; ErrReservationExpired; ErrReservationNotFound;
// ErrInvalidCommand for a missing id or operation id, negative units,
// units above MaxUnits or in a dimension the policy does not have;
// ErrLifetimeExhausted (nothing changed, the reservation still started)
// when the usage would take the account's lifetime spent above
// MaxLifetimeUnits; ErrAccountNotFound / ErrPolicyNotFound only when the
// book lost the reservation's account or policy.
func Settle(b Book, id, operationID string, actual Amounts, now time.Time) (res Result) {
	settle(b, id, operationID, actual, AccountKey{}, now, &res)
	return res
}

// settle is Settle answering into *res, which must be zero: Apply
// passes its own result, so the receipt is not copied once more on the way
// out. checked is the command's CheckedAccount (lookup).
func settle(b Book, id, operationID string, actual Amounts, checked AccountKey, now time.Time, res *Result) {
	// The command's shape decides before the reservation's state: a
	// malformed settle (no operation id, a negative amount or one above
	// MaxUnits) is ErrInvalidCommand whatever the id names, even an
	// unknown, removed or finished one. The reservation is read first
	// only so the message can name the unit.
	r, err := lookup(b, id, checked)
	if id != "" {
		var p *Policy
		if err == nil {
			p, _ = b.Policy(r.Account.Generation)
		}
		if operationID == "" {
			*res = Result{Err: invalid("operation id is empty: only an operation receipt settles")}
			return
		}
		if err := checkAmounts(p, &actual, true); err != nil {
			*res = Result{Err: err}
			return
		}
	}
	if err != nil {
		*res = missing(err, KindSettle)
		return
	}
	switch r.State {
	case StateStarted, StateUsageUnknown:
	case StateSettled, StateSettledWithDebt:
		if r.OperationID == operationID && r.Actual == actual {
			*res = Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
			return
		}
		*res = Result{Err: ErrReservationAlreadySettled, Reservation: *r}
		return
	case StateReserved:
		*res = Result{Err: ErrReservationNotStarted, Reservation: *r}
		return
	default:
		*res = Result{Err: stateError(r.State), Reservation: *r}
		return
	}
	if r.OperationID != operationID {
		*res = Result{Err: ErrOperationMismatch, Reservation: *r}
		return
	}
	a, p, err := accountFor(b, r.Account)
	if err != nil {
		*res = Result{Err: err, Reservation: *r}
		return
	}
	if err := checkUnits(p, &actual, false); err != nil {
		*res = Result{Err: err, Reservation: *r}
		return
	}
	if _, err := lifetimeRoom(a, p, &actual, false); err != nil {
		*res = Result{Err: err, Reservation: *r}
		return
	}
	var beyond Amounts
	for i := 0; i < a.Dims; i++ {
		beyond[i] = max(actual[i]-r.Reserved[i], 0)
	}
	if _, err := debtRoom(a, p, &beyond); err != nil {
		*res = Result{Err: err, Reservation: *r}
		return
	}
	if err := forwardDebtRoom(b, a, p, &beyond); err != nil {
		*res = Result{Err: err, Reservation: *r}
		return
	}
	current := bringHolderToNow(b, a, p, now)

	before := a.Balances
	var refunded Amounts
	from := r.State
	r.State = StateSettled
	for i := 0; i < a.Dims; i++ {
		bal := &a.Balances[i]
		reserved, used := r.Reserved[i], actual[i]
		bal.Reserved -= reserved
		if used <= reserved {
			bal.Spent += used
			bal.Available += reserved - used
			refunded[i] = reserved - used
			continue
		}
		bal.Spent += reserved
		chargeBeyond(bal, r, i, used-reserved, &p.Dimensions[i])
	}
	if p.ExecutionLimit > 0 && now.Sub(r.StartedAt) > p.ExecutionLimit {
		r.Breach = true
	}
	if r.Breach {
		a.Breaches++
	}
	r.Actual = actual
	r.FinishedAt = now
	journal(b, a, &before, KindSettle, r.ID, from, r.State, "", now)
	b.AccountPut(a)
	b.ReservationPut(r)
	if !current {
		forward(b, a, p, &r.Reserved, KindSettle, r.ID, now)
	}
	res.Reservation, res.Refunded, res.Generation = *r, refunded, r.Account.Generation
	return
}

// chargeBeyond spends extra units of dimension i that r did not hold:
// from available first, and what available lacks as debt (overdraftIssued
// and spent at once, so conservation holds), which makes r
// SETTLED_WITH_DEBT, freezes the account's admission until refills repay
// it, and is a breach beyond d's max overdraft. It is the one rule for
// usage above a hold: a settle's excess over its reservation and a
// record's whole usage (Record), which held nothing.
func chargeBeyond(bal *Balance, r *Reservation, i int, extra Units, d *Dimension) {
	fromAvailable := min(extra, bal.Available)
	bal.Available -= fromAvailable
	bal.Spent += fromAvailable
	if debt := extra - fromAvailable; debt > 0 {
		bal.OverdraftIssued += debt
		bal.Spent += debt
		r.Overdraft[i] = debt
		r.State = StateSettledWithDebt
		if debt > d.MaxOverdraft {
			r.Breach = true
		}
	}
}

// Release gives an unstarted reservation's capacity back in full.
//
// Returns: success with the RELEASED receipt and Refunded (the whole
// hold); Replayed (Refunded zero) when already released;
// ErrReservationAlreadyStarted for started or unknown work, which may be
// using its capacity; ErrReservationAlreadySettled for settled work (as a
// retired one answers from its tombstone); ErrReservationExpired
// (EXPIRING or EXPIRED);
// ErrReservationNotFound; ErrInvalidCommand for a missing id. A release on
// a superseded generation forwards like a settle.
func Release(b Book, id string, now time.Time) Result {
	return release(b, id, AccountKey{}, now)
}

// release is Release checked against the command's CheckedAccount
// (lookup).
func release(b Book, id string, checked AccountKey, now time.Time) Result {
	r, err := lookup(b, id, checked)
	if err != nil {
		return missing(err, KindRelease)
	}
	switch r.State {
	case StateReserved:
		return refundHold(b, r, StateReleased, KindRelease, now)
	case StateReleased:
		if mutantOn("refund_twice") {
			return refundHold(b, r, StateReleased, KindRelease, now)
		}
		return Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
	case StateStarted, StateUsageUnknown:
		return Result{Err: ErrReservationAlreadyStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// ExpireClaim is the first step of expiry: a RESERVED reservation whose hold
// ran out moves to EXPIRING. From here a start fails, and Expire finishes the
// job.
//
// Returns: success with the EXPIRING receipt; Replayed when already
// EXPIRING; ErrReservationNotDue before ExpiresAt;
// ErrReservationAlreadyStarted for STARTED or USAGE_UNKNOWN work (expiry
// never takes it); ErrReservationReleased / ErrReservationExpired (EXPIRED)
// / ErrReservationAlreadySettled for finished ones; ErrReservationNotFound;
// ErrInvalidCommand for a missing id.
func ExpireClaim(b Book, id string, now time.Time) Result {
	return expireClaim(b, id, AccountKey{}, now)
}

// expireClaim is ExpireClaim checked against the command's
// CheckedAccount (lookup).
func expireClaim(b Book, id string, checked AccountKey, now time.Time) Result {
	r, err := lookup(b, id, checked)
	if err != nil {
		return missing(err, KindExpireClaim)
	}
	switch r.State {
	case StateReserved:
		if now.Before(r.ExpiresAt) {
			return Result{Err: ErrReservationNotDue, Reservation: *r}
		}
		r.State = StateExpiring
		transition(b, r, StateReserved, KindExpireClaim, now)
		return Result{Reservation: *r, Generation: r.Account.Generation}
	case StateExpiring:
		return Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
	case StateStarted, StateUsageUnknown:
		if mutantOn("expire_started") && r.State == StateStarted && !now.Before(r.ExpiresAt) {
			r.State = StateExpiring
			transition(b, r, StateStarted, KindExpireClaim, now)
			return Result{Reservation: *r, Generation: r.Account.Generation}
		}
		if mutantOn("worker_marks_started_unknown") && r.State == StateStarted && !now.Before(r.ExpiresAt) {
			r.State, r.UnknownAt = StateUsageUnknown, now
			transition(b, r, StateStarted, KindMarkUsageUnknown, now)
			return Result{Reservation: *r, Generation: r.Account.Generation}
		}
		return Result{Err: ErrReservationAlreadyStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// Expire finishes expiry: EXPIRING -> EXPIRED, the hold returned to
// available once.
//
// Returns: success with the EXPIRED receipt and Refunded (the whole hold);
// Replayed (Refunded zero) when already EXPIRED;
// ErrReservationAlreadyStarted for STARTED or USAGE_UNKNOWN work; for a
// RESERVED one, ErrReservationNotDue (claim it first with ExpireClaim);
// ErrReservationReleased / ErrReservationAlreadySettled;
// ErrReservationNotFound; ErrInvalidCommand for a missing id. An expiry on
// a superseded generation forwards like a settle.
func Expire(b Book, id string, now time.Time) Result {
	return expire(b, id, AccountKey{}, now)
}

// expire is Expire checked against the command's CheckedAccount
// (lookup).
func expire(b Book, id string, checked AccountKey, now time.Time) Result {
	r, err := lookup(b, id, checked)
	if err != nil {
		return missing(err, KindExpire)
	}
	switch r.State {
	case StateExpiring:
		return refundHold(b, r, StateExpired, KindExpire, now)
	case StateExpired:
		return Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
	case StateReserved:
		return Result{Err: fmt.Errorf("%w: claim it first", ErrReservationNotDue), Reservation: *r}
	case StateStarted, StateUsageUnknown:
		return Result{Err: ErrReservationAlreadyStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// MarkUsageUnknown records that the outcome of started work is unknown (a
// lost settle answer, a crash, a timeout past the execution limit). Its
// capacity stays reserved, never treated as unconsumed, until a settle with
// the operation receipt resolves it. UnknownAt records now, so the backlog
// ages from the marking, not from the start.
//
// Returns: success with the USAGE_UNKNOWN receipt; Replayed when already
// USAGE_UNKNOWN; ErrReservationNotStarted for a RESERVED one;
// ErrReservationAlreadySettled / ErrReservationReleased /
// ErrReservationExpired (EXPIRING or EXPIRED); ErrReservationNotFound;
// ErrInvalidCommand for a missing id.
func MarkUsageUnknown(b Book, id string, now time.Time) Result {
	return MarkUsageUnknownFor(b, id, CauseRequest, now)
}

// MarkUsageUnknownFor is MarkUsageUnknown for a given cause. CauseRequest
// (an explicit request) marks any STARTED work. CauseExecutionLimit (the
// worker) marks only STARTED work whose ExecutionDeadline is set and has
// passed at now, and answers ErrReservationNotDue otherwise: the worker
// read the row before it ran, and a Start that landed in between (or a
// policy without an execution limit) must never make started work unknown.
// CauseHoldExpired is ErrInvalidCommand: an expired hold never started.
func MarkUsageUnknownFor(b Book, id string, cause Cause, now time.Time) Result {
	return markUsageUnknown(b, id, cause, AccountKey{}, now)
}

// markUsageUnknown is MarkUsageUnknownFor checked against the command's
// CheckedAccount (lookup).
func markUsageUnknown(b Book, id string, cause Cause, checked AccountKey, now time.Time) Result {
	r, err := lookup(b, id, checked)
	if err != nil {
		return missing(err, KindMarkUsageUnknown)
	}
	switch cause {
	case CauseRequest, CauseExecutionLimit:
	default:
		return Result{Err: invalid("mark usage unknown with cause %s", cause), Reservation: *r}
	}
	switch r.State {
	case StateStarted:
		if cause == CauseExecutionLimit && !mutantOn("unknown_without_limit") {
			if r.ExecutionDeadline.IsZero() {
				return Result{Err: fmt.Errorf("%w: started work without an execution limit", ErrReservationNotDue), Reservation: *r}
			}
			if now.Before(r.ExecutionDeadline) {
				return Result{Err: fmt.Errorf("%w: execution deadline %s has not passed", ErrReservationNotDue, r.ExecutionDeadline.Format(time.RFC3339Nano)), Reservation: *r}
			}
		}
		r.State, r.UnknownAt = StateUsageUnknown, now
		transition(b, r, StateStarted, KindMarkUsageUnknown, now)
		return Result{Reservation: *r, Generation: r.Account.Generation}
	case StateUsageUnknown:
		return Result{Reservation: *r, Replayed: true, Generation: r.Account.Generation}
	case StateReserved:
		return Result{Err: ErrReservationNotStarted, Reservation: *r}
	}
	return Result{Err: stateError(r.State), Reservation: *r}
}

// refundHold ends a held, unstarted reservation (release, expiry) and gives
// its whole hold back to available.
func refundHold(b Book, r *Reservation, to State, kind Kind, now time.Time) Result {
	a, p, err := accountFor(b, r.Account)
	if err != nil {
		return Result{Err: err, Reservation: *r}
	}
	current := bringHolderToNow(b, a, p, now)
	before := a.Balances
	for i := 0; i < a.Dims; i++ {
		a.Balances[i].Reserved -= r.Reserved[i]
		a.Balances[i].Available += r.Reserved[i]
	}
	from := r.State
	r.State = to
	r.FinishedAt = now
	journal(b, a, &before, kind, r.ID, from, to, "", now)
	b.AccountPut(a)
	b.ReservationPut(r)
	if !current {
		forward(b, a, p, &r.Reserved, kind, r.ID, now)
	}
	return Result{Reservation: *r, Refunded: r.Reserved, Generation: r.Account.Generation}
}

// transition records a state change that moves no capacity.
func transition(b Book, r *Reservation, from State, kind Kind, now time.Time) {
	var entry JournalEntry // field by field, as in journal
	entry.At, entry.Kind, entry.Account = now, kind, r.Account
	entry.ReservationID, entry.From, entry.To = r.ID, from, r.State
	b.JournalAppend(entry)
	b.ReservationPut(r)
}

// lookup returns the reservation named id, or ErrInvalidCommand for an
// empty id, or ErrReservationNotFound. (An error rather than a Result: the
// found path copies no 500-byte Result.)
//
// checked is the command's CheckedAccount: when set, a reservation or
// tombstone of another account is not the one the caller checked, and
// is answered exactly as an id nobody used (same error, same words), so
// the command neither acts on it nor reveals it. This is the one place
// that rule lives.
func lookup(b Book, id string, checked AccountKey) (*Reservation, error) {
	if id == "" {
		return nil, invalid("reservation id is empty")
	}
	r, ok := b.Reservation(id)
	if ok && !checkedElsewhere(r.Account, checked) {
		return r, nil
	}
	if !ok {
		if t, ok := tombstone(b, id); ok && !checkedElsewhere(t.Account, checked) {
			return nil, retiredError{t}
		}
	}
	return nil, fmt.Errorf("%w: %s", ErrReservationNotFound, id)
}

// checkedElsewhere reports whether a reservation of account is outside
// the account a command was checked against (checked; zero checks
// nothing).
func checkedElsewhere(account, checked AccountKey) bool {
	return checked != (AccountKey{}) && account != checked
}

// stateError names why a reservation in state s cannot take the command.
func stateError(s State) error {
	switch s {
	case StateReleased:
		return ErrReservationReleased
	case StateExpiring, StateExpired:
		return ErrReservationExpired
	case StateSettled, StateSettledWithDebt:
		return ErrReservationAlreadySettled
	case StateStarted, StateUsageUnknown:
		return ErrReservationAlreadyStarted
	case StateReserved:
		return ErrReservationNotStarted
	}
	return fmt.Errorf("%w: reservation in state %s", ErrInvalidCommand, s)
}

// debtRoom refuses usage beyond a hold (beyond, per dimension of account
// a's policy p) whose debt could take a's OverdraftIssued above
// MaxLifetimeUnits. Debt is what available does not cover, so at most
// beyond less available now (refill only adds to available). Spent bounds
// the debt a settle issues on its own account, but debt that generation
// switches move into an account counts in its OverdraftIssued too: without
// this bound a subject frozen by debt that records usage under each newly
// published generation carried the sum of every generation's debt along,
// and after about 32 generations of 2^58 the int64 term wrapped negative.
// With it, an account's OverdraftIssued stays at most MaxLifetimeUnits
// from its own usage, and so does the debt it can move on.
func debtRoom(a *Account, p *Policy, beyond *Amounts) (dim int, err error) {
	for i := 0; i < a.Dims; i++ {
		debt := max(beyond[i]-max(a.Balances[i].Available, 0), 0)
		if issued := a.Balances[i].OverdraftIssued; debt > 0 && issued > MaxLifetimeUnits-debt {
			return i, fmt.Errorf("%w: %s has issued %d of debt over the account's life (debt moved in from other generations included); up to %d more would pass %d",
				ErrLifetimeExhausted, dimensionName(p, i), issued, debt, MaxLifetimeUnits)
		}
	}
	return -1, nil
}

// forwardDebtRoom is debtRoom for the account a settle on a superseded
// generation's account a forwards its debt to (forward): the subject's
// current account, whose OverdraftIssued counts every forward it
// received. Each old account stays within its own bound, but work started
// under many generations and settled late added their debts up there, and
// about a thousand settles of MaxUnits wrapped it. The debt forwarded in a
// unit is at most beyond in it; units are matched by name, as forward
// moves them. It returns nil when a is current or the subject has no
// other current account.
func forwardDebtRoom(b Book, a *Account, p *Policy, beyond *Amounts) error {
	g, found := b.AccountCurrent(a.Key.SubjectKey())
	if !found || g == a.Key.Generation {
		return nil
	}
	key := a.Key
	key.Generation = g
	cur, cp, err := accountFor(b, key)
	if err != nil {
		return nil
	}
	for i := 0; i < a.Dims && i < len(p.Dimensions); i++ {
		j := cp.DimensionIndex(p.Dimensions[i].Unit)
		if beyond[i] <= 0 || j < 0 || j >= cur.Dims {
			continue
		}
		if issued := cur.Balances[j].OverdraftIssued; issued > MaxLifetimeUnits-beyond[i] {
			return fmt.Errorf("%w: the current account (generation %d) has issued %d of debt in %s over its life, forwards from other generations included; this settle could forward up to %d more, past %d",
				ErrLifetimeExhausted, g, issued, dimensionName(cp, j), beyond[i], MaxLifetimeUnits)
		}
	}
	return nil
}

// lifetimeRoom refuses usage that would take account a's spent (in the
// dimensions of its policy p, which name them in the error) above
// MaxLifetimeUnits. A settle spends all of its actual usage. A reserve
// (held true) is checked as if every hold outstanding, its own included,
// settled at its estimate, so a full account refuses new work rather than
// the settles of work it admitted. (Debt issued by a settle is also spent.
// Debt a shard charges is bounded in remintTarget; debt that moves between
// generations is not bounded yet, see MaxLifetimeUnits.)
func lifetimeRoom(a *Account, p *Policy, usage *Amounts, held bool) (dim int, err error) {
	for i := 0; i < a.Dims; i++ {
		spent := a.Balances[i].Spent
		if held {
			spent += a.Balances[i].Reserved // both at most 2^58: no overflow
		}
		if spent > MaxLifetimeUnits-usage[i] {
			return i, fmt.Errorf("%w: %s has spent %d over the account's life (counting holds: %v); %d more would pass %d (publish a new generation for a fresh account)",
				ErrLifetimeExhausted, dimensionName(p, i), spent, held, usage[i], MaxLifetimeUnits)
		}
	}
	return -1, nil
}
