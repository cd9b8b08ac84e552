package ledger_test

// Model-based test: random command sequences run against the ledger and
// against refModel, a small reference model of the seed's rules written
// independently of the ledger's code (plain per-subject balances, no
// journal, no conservation terms beyond available, reserved, spent and
// debt). After every command the answers, every balance and every
// reservation must agree, and the harness runs Audit and CheckStep.
//
// Sequences mix reserves (fresh ids, retries, reused ids with another
// digest), starts, settles under, at and over the estimate (debt, breaches,
// replays), records of usage nothing reserved (debt on an empty or frozen
// account, replays, conflicting retries), releases, expiry claims racing starts, unknown usage, time
// advances (refill, expiry, epoch ends), publishes (generation switches),
// rollbacks, refill and drain workers, on two tenants under policies of
// their own and a wildcard policy that decides for a tenant without one.
//
// The default run does modelDefaultChecks (1,000) sequences of 100 to 200
// commands each, about 5 s. CI runs the 10,000-sequence gate with
//
//	go test ./ledger/ -run TestModel -rapid.checks=10000
//
// (1.3 million commands, about 55 s of CPU; 3 min 17 s wall on a busy
// 2-core machine). A failure prints the shrunk command sequence and the
// seed; rerun it with -rapid.seed=<seed>.

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"pgregory.net/rapid"
)

// --- the reference model -------------------------------------------------

const modelDims = 2

var modelUnits = [modelDims]string{"tokens", "requests"}

type modelDim struct {
	burst, refill, maxReservation, maxOverdraft int64
	interval                                    time.Duration
}

type modelPolicy struct {
	generation     uint64
	subject        string
	dims           [modelDims]modelDim
	hold           time.Duration
	executionLimit time.Duration
	shadow         bool
	rolledBack     bool
}

func (p *modelPolicy) sameTerms(o *modelPolicy) bool {
	return p.subject == o.subject && p.dims == o.dims && p.hold == o.hold &&
		p.executionLimit == o.executionLimit && p.shadow == o.shadow
}

type modelAccount struct {
	subject    string
	generation uint64
	available  [modelDims]int64
	reserved   [modelDims]int64
	spent      [modelDims]int64
	debt       [modelDims]int64
	cursor     [modelDims]time.Time
}

type modelReservation struct {
	id, digest, subject string
	generation          uint64
	state               ledger.State
	reserved, actual    [modelDims]int64
	operation           string
	expiresAt           time.Time
	startedAt           time.Time
	breach              bool
}

type accountID struct {
	subject    string
	generation uint64
}

// modelAnswer is what the model expects a command to answer.
type modelAnswer struct {
	err        error
	replayed   bool
	refunded   [modelDims]int64
	generation uint64
	checkGen   bool
	dimension  string
	retryAfter time.Duration
	shadow     bool
}

type refModel struct {
	now          time.Time
	generations  uint64
	policies     map[uint64]*modelPolicy
	accounts     map[accountID]*modelAccount
	current      map[string]uint64 // subject -> generation whose account holds its capacity
	reservations map[string]*modelReservation
	// owing are, per subject, accounts a late settle left debt on while
	// nothing admitted for it: the next switch takes what they hold.
	owing map[string][]*modelAccount
}

func newRefModel(now time.Time) *refModel {
	return &refModel{now: now, policies: map[uint64]*modelPolicy{}, accounts: map[accountID]*modelAccount{},
		current: map[string]uint64{}, reservations: map[string]*modelReservation{}, owing: map[string][]*modelAccount{}}
}

// activeOf is the newest generation published under exactly this policy
// subject (a tenant or the wildcard) that was not rolled back.
func (m *refModel) activeOf(policySubject string) *modelPolicy {
	var best *modelPolicy
	for _, p := range m.policies {
		if p.subject == policySubject && !p.rolledBack && (best == nil || p.generation > best.generation) {
			best = p
		}
	}
	return best
}

// active is the generation that decides for a tenant: its own, else the
// wildcard's.
func (m *refModel) active(subject string) *modelPolicy {
	if p := m.activeOf(subject); p != nil {
		return p
	}
	return m.activeOf(ledger.AnySubject)
}

// heldElsewhere is what the subject's other accounts (other generations')
// hold reserved in each unit: the burst's room of the account holding the
// subject's capacity leaves it out, so the subject never holds more than
// one burst.
func (m *refModel) heldElsewhere(a *modelAccount) [modelDims]int64 {
	var held [modelDims]int64
	for id, o := range m.accounts {
		if id.subject == a.subject && id.generation != a.generation {
			for i := range modelDims {
				held[i] += o.reserved[i]
			}
		}
	}
	return held
}

// refill mints what the refill rule owes since the account's cursor: debt
// first, then available up to the burst (available + reserved + what the
// subject holds under its other generations).
func (m *refModel) refill(a *modelAccount, p *modelPolicy) { m.refillUpTo(a, p, false) }

// refillUpTo is refill; with repayOnly it mints only what repays debt.
func (m *refModel) refillUpTo(a *modelAccount, p *modelPolicy, repayOnly bool) {
	for i, d := range p.dims {
		if d.refill == 0 {
			continue
		}
		intervals := int64(m.now.Sub(a.cursor[i]) / d.interval)
		if intervals <= 0 {
			continue
		}
		a.cursor[i] = a.cursor[i].Add(time.Duration(intervals) * d.interval)
		room := max(d.burst-a.available[i]-a.reserved[i]-m.heldElsewhere(a)[i], 0)
		if repayOnly {
			room = 0
		}
		minted := min(intervals*d.refill, a.debt[i]+room)
		repaid := min(minted, a.debt[i])
		a.debt[i] -= repaid
		a.available[i] += minted - repaid
	}
}

// move carries from's debt (repaid from the destination's available as far
// as it goes), then its available capacity (which repays debt at the
// destination first, and fills available only up to the destination's
// burst; the rest stays behind), to to. It reports whether anything moved.
func (m *refModel) move(from, to *modelAccount) bool {
	moved := false
	burst := m.policies[to.generation].dims
	for i := range modelDims {
		if debt := from.debt[i]; debt > 0 {
			// Arriving debt is overuse: it takes available first.
			repaid := min(debt, to.available[i])
			to.available[i] -= repaid
			to.debt[i] += debt - repaid
			from.debt[i] = 0
			moved = true
		}
		room := max(burst[i].burst-to.available[i]-to.reserved[i]-m.heldElsewhere(to)[i], 0) + to.debt[i]
		if units := min(from.available[i], room); units > 0 {
			from.available[i] -= units
			repaid := min(units, to.debt[i])
			to.debt[i] -= repaid
			to.available[i] += units - repaid
			moved = true
		}
	}
	return moved
}

// switchTo makes p's account the subject's current one, creating it (a
// full burst for the subject's first account, nothing for later ones) and
// carrying the previous current account's capacity and debt over. It
// reports whether something moved out of the previous account.
func (m *refModel) switchTo(subject string, p *modelPolicy) (*modelAccount, *modelAccount, bool) {
	id := accountID{subject, p.generation}
	previous, hasPrevious := m.current[subject]
	if hasPrevious && previous == p.generation {
		return m.accounts[id], nil, false
	}
	a := m.accounts[id]
	existed := a != nil
	if a == nil {
		a = &modelAccount{subject: subject, generation: p.generation}
		if !hasPrevious {
			for i, d := range p.dims {
				a.available[i] = d.burst
			}
		}
		m.accounts[id] = a
	}
	for i := range modelDims {
		a.cursor[i] = m.now
	}
	m.current[subject] = p.generation
	if !hasPrevious {
		return a, nil, false
	}
	from := m.accounts[accountID{subject, previous}]
	owing := m.owing[subject]
	delete(m.owing, subject)
	if pp := m.policies[previous]; len(owing) > 0 {
		// The previous account was current while nothing admitted
		// (its generation rolled back): brought to now with the owing
		// accounts, it refills only to repay its debt.
		m.refillUpTo(from, pp, true)
	} else if !pp.rolledBack {
		m.refill(from, pp)
	}
	// An owing account other than the previous one repays its debt at
	// its own rate until the switch, unless p's account existed already
	// (it would refill that unit): then it waits for the switch.
	for _, o := range owing {
		if o != from && o != a && !existed {
			m.refillUpTo(o, m.policies[o.generation], true)
		}
	}
	moved := m.move(from, a)
	for _, o := range owing {
		if o != from && o != a {
			m.move(o, a)
		}
	}
	return a, from, moved
}

func (m *refModel) isCurrent(a *modelAccount) bool {
	g, found := m.current[a.subject]
	return found && g == a.generation
}

// forward carries what a late refund or debt left on a non-current account
// to the subject's current account under the active generation.
func (m *refModel) forward(a *modelAccount) {
	p := m.active(a.subject)
	if p == nil {
		// Debt left while nothing admits is the next switch's to take.
		if a.debt != ([modelDims]int64{}) && !slices.Contains(m.owing[a.subject], a) {
			m.owing[a.subject] = append(m.owing[a.subject], a)
			if !m.isCurrent(a) {
				// It repays from now on, at its own rate (below).
				for i := range modelDims {
					a.cursor[i] = m.now
				}
			}
		}
		return
	}
	target, _, _ := m.switchTo(a.subject, p)
	if target == a {
		return
	}
	m.refill(target, p)
	m.move(a, target)
}

// retryAfter is the conservative wait the model expects: per dimension,
// the time refill needs to mint the debt plus the shortfall, rounded up to
// whole intervals after the cursor and to whole seconds (at least one);
// the dimension refill covers last limits, one that never refills (or
// whose estimate is above burst minus the holds outstanding) limits most
// (and answers 0).
func (m *refModel) retryAfter(a *modelAccount, p *modelPolicy, units [modelDims]int64) (int, time.Duration) {
	limiting, wait, never := -1, time.Duration(0), false
	for i, d := range p.dims {
		shortfall := a.debt[i] + max(units[i]-a.available[i], 0)
		if shortfall <= 0 {
			continue
		}
		// Refill fills available only up to burst - reserved: an estimate
		// above that waits for holds to end, which no refill brings.
		heldUp := units[i] > a.available[i] && units[i] > d.burst-a.reserved[i]-m.heldElsewhere(a)[i]
		if d.refill == 0 || heldUp {
			if !never {
				limiting, wait, never = i, 0, true
			}
			continue
		}
		if never {
			continue
		}
		intervals := (shortfall + d.refill - 1) / d.refill
		w := a.cursor[i].Add(time.Duration(intervals) * d.interval).Sub(m.now)
		w = max(w, time.Second)
		w = (w + time.Second - 1).Truncate(time.Second)
		if limiting < 0 || w > wait {
			limiting, wait = i, w
		}
	}
	return limiting, wait
}

func (m *refModel) publish(p modelPolicy) modelAnswer {
	if active := m.activeOf(p.subject); active != nil && active.sameTerms(&p) {
		return modelAnswer{replayed: true, generation: active.generation, checkGen: true}
	}
	m.generations++
	p.generation = m.generations
	m.policies[p.generation] = &p
	return modelAnswer{generation: p.generation, checkGen: true}
}

func (m *refModel) rollback(subject string, generation uint64) modelAnswer {
	p := m.policies[generation]
	if p == nil || p.subject != subject {
		return modelAnswer{err: ledger.ErrPolicyNotFound}
	}
	if p.rolledBack {
		return modelAnswer{replayed: true}
	}
	p.rolledBack = true
	var now uint64
	if a := m.activeOf(subject); a != nil {
		now = a.generation
	}
	return modelAnswer{generation: now, checkGen: true}
}

func (m *refModel) reserve(id, digest, subject string, units [modelDims]int64) modelAnswer {
	// No unit above 0 is the command's shape: refused before the id is
	// looked up or a policy read, so no generation decides it
	// (ledger.ReserveShapeProblem).
	if units == ([modelDims]int64{}) {
		return modelAnswer{err: ledger.ErrInvalidCommand, checkGen: true}
	}
	if r := m.reservations[id]; r != nil {
		if r.digest != digest {
			return modelAnswer{err: ledger.ErrDigestMismatch}
		}
		return modelAnswer{replayed: true, generation: r.generation, checkGen: true}
	}
	p := m.active(subject)
	if p == nil {
		return modelAnswer{err: ledger.ErrNoPolicy}
	}
	a, _, _ := m.switchTo(subject, p)
	m.refill(a, p)
	answer := modelAnswer{generation: p.generation, checkGen: true, shadow: p.shadow}
	for i, d := range p.dims {
		if units[i] > d.maxReservation {
			answer.err, answer.dimension = ledger.ErrReservationTooLarge, modelUnits[i]
			return answer
		}
	}
	frozen := a.debt != [modelDims]int64{}
	if limiting, wait := m.retryAfter(a, p, units); limiting >= 0 {
		answer.err, answer.dimension, answer.retryAfter = ledger.ErrInsufficientCapacity, modelUnits[limiting], wait
		if frozen {
			answer.err = ledger.ErrAdmissionFrozen
		}
		return answer
	}
	for i := range modelDims {
		a.available[i] -= units[i]
		a.reserved[i] += units[i]
	}
	m.reservations[id] = &modelReservation{id: id, digest: digest, subject: subject, generation: p.generation,
		state: ledger.StateReserved, reserved: units, expiresAt: m.now.Add(p.hold)}
	return modelAnswer{generation: p.generation, checkGen: true}
}

// finishedError is what a command that needs a live reservation answers
// for one in state s.
func finishedError(s ledger.State) error {
	switch s {
	case ledger.StateReleased:
		return ledger.ErrReservationReleased
	case ledger.StateExpiring, ledger.StateExpired:
		return ledger.ErrReservationExpired
	case ledger.StateSettled, ledger.StateSettledWithDebt:
		return ledger.ErrReservationAlreadySettled
	case ledger.StateStarted, ledger.StateUsageUnknown:
		return ledger.ErrReservationAlreadyStarted
	}
	return ledger.ErrReservationNotStarted
}

func (m *refModel) start(id, operation string) modelAnswer {
	r := m.reservations[id]
	switch {
	case r == nil:
		return modelAnswer{err: ledger.ErrReservationNotFound}
	case r.state == ledger.StateReserved:
		r.state, r.operation, r.startedAt = ledger.StateStarted, operation, m.now
		return modelAnswer{generation: r.generation, checkGen: true}
	case r.state == ledger.StateStarted || r.state == ledger.StateUsageUnknown ||
		r.state == ledger.StateSettled || r.state == ledger.StateSettledWithDebt:
		if r.operation != operation {
			return modelAnswer{err: ledger.ErrOperationMismatch}
		}
		return modelAnswer{replayed: true, generation: r.generation, checkGen: true}
	}
	return modelAnswer{err: finishedError(r.state)}
}

// end returns a reservation's hold to its account: usage is spent, the
// rest refunded; overuse takes available first, then becomes debt.
func (m *refModel) end(r *modelReservation, to ledger.State, actual [modelDims]int64) [modelDims]int64 {
	a := m.accounts[accountID{r.subject, r.generation}]
	p := m.policies[r.generation]
	current := m.isCurrent(a)
	if current && !p.rolledBack {
		m.refill(a, p)
	}
	var refunded [modelDims]int64
	r.state = to
	for i := range modelDims {
		a.reserved[i] -= r.reserved[i]
		if actual[i] <= r.reserved[i] {
			a.spent[i] += actual[i]
			a.available[i] += r.reserved[i] - actual[i]
			refunded[i] = r.reserved[i] - actual[i]
			continue
		}
		a.spent[i] += actual[i]
		extra := actual[i] - r.reserved[i]
		fromAvailable := min(extra, a.available[i])
		a.available[i] -= fromAvailable
		if debt := extra - fromAvailable; debt > 0 {
			a.debt[i] += debt
			r.state = ledger.StateSettledWithDebt
			if debt > p.dims[i].maxOverdraft {
				r.breach = true
			}
		}
	}
	if to == ledger.StateSettled {
		r.actual = actual
		if p.executionLimit > 0 && m.now.Sub(r.startedAt) > p.executionLimit {
			r.breach = true
		}
	}
	if !current {
		m.forward(a)
	}
	return refunded
}

func (m *refModel) settle(id, operation string, actual [modelDims]int64) modelAnswer {
	r := m.reservations[id]
	if r == nil {
		return modelAnswer{err: ledger.ErrReservationNotFound}
	}
	switch r.state {
	case ledger.StateStarted, ledger.StateUsageUnknown:
		if r.operation != operation {
			return modelAnswer{err: ledger.ErrOperationMismatch}
		}
		refunded := m.end(r, ledger.StateSettled, actual)
		return modelAnswer{refunded: refunded, generation: r.generation, checkGen: true}
	case ledger.StateSettled, ledger.StateSettledWithDebt:
		if r.operation == operation && r.actual == actual {
			return modelAnswer{replayed: true, generation: r.generation, checkGen: true}
		}
		return modelAnswer{err: ledger.ErrReservationAlreadySettled}
	}
	return modelAnswer{err: finishedError(r.state)}
}

// record is usage learned after the work ran: a reservation that holds
// nothing, settled at once with the usage (available first, the rest
// debt), never refused for capacity or debt.
func (m *refModel) record(id, digest, subject, operation string, actual [modelDims]int64) modelAnswer {
	if actual == ([modelDims]int64{}) {
		return modelAnswer{err: ledger.ErrInvalidCommand, checkGen: true}
	}
	if r := m.reservations[id]; r != nil {
		switch {
		case r.digest != digest || r.reserved != [modelDims]int64{}:
			return modelAnswer{err: ledger.ErrDigestMismatch}
		case r.operation == operation && r.actual == actual:
			return modelAnswer{replayed: true, generation: r.generation, checkGen: true}
		}
		return modelAnswer{err: ledger.ErrReservationAlreadySettled}
	}
	p := m.active(subject)
	if p == nil {
		return modelAnswer{err: ledger.ErrNoPolicy}
	}
	a, _, _ := m.switchTo(subject, p)
	m.refill(a, p)
	r := &modelReservation{id: id, digest: digest, subject: subject, generation: p.generation,
		state: ledger.StateStarted, operation: operation, expiresAt: m.now, startedAt: m.now}
	m.reservations[id] = r
	m.end(r, ledger.StateSettled, actual)
	return modelAnswer{generation: p.generation, checkGen: true}
}

func (m *refModel) release(id string) modelAnswer {
	r := m.reservations[id]
	switch {
	case r == nil:
		return modelAnswer{err: ledger.ErrReservationNotFound}
	case r.state == ledger.StateReserved:
		return modelAnswer{refunded: m.end(r, ledger.StateReleased, [modelDims]int64{}), generation: r.generation, checkGen: true}
	case r.state == ledger.StateReleased:
		return modelAnswer{replayed: true}
	}
	return modelAnswer{err: finishedError(r.state)}
}

func (m *refModel) expireClaim(id string) modelAnswer {
	r := m.reservations[id]
	switch {
	case r == nil:
		return modelAnswer{err: ledger.ErrReservationNotFound}
	case r.state == ledger.StateReserved && m.now.Before(r.expiresAt):
		return modelAnswer{err: ledger.ErrReservationNotDue}
	case r.state == ledger.StateReserved:
		r.state = ledger.StateExpiring
		return modelAnswer{generation: r.generation, checkGen: true}
	case r.state == ledger.StateExpiring:
		return modelAnswer{replayed: true}
	}
	return modelAnswer{err: finishedError(r.state)}
}

func (m *refModel) expire(id string) modelAnswer {
	r := m.reservations[id]
	switch {
	case r == nil:
		return modelAnswer{err: ledger.ErrReservationNotFound}
	case r.state == ledger.StateExpiring:
		return modelAnswer{refunded: m.end(r, ledger.StateExpired, [modelDims]int64{}), generation: r.generation, checkGen: true}
	case r.state == ledger.StateExpired:
		return modelAnswer{replayed: true}
	case r.state == ledger.StateReserved:
		return modelAnswer{err: ledger.ErrReservationNotDue}
	}
	return modelAnswer{err: finishedError(r.state)}
}

func (m *refModel) markUnknown(id string) modelAnswer {
	r := m.reservations[id]
	switch {
	case r == nil:
		return modelAnswer{err: ledger.ErrReservationNotFound}
	case r.state == ledger.StateStarted:
		r.state = ledger.StateUsageUnknown
		return modelAnswer{generation: r.generation, checkGen: true}
	case r.state == ledger.StateUsageUnknown:
		return modelAnswer{replayed: true}
	case r.state == ledger.StateReserved:
		return modelAnswer{err: ledger.ErrReservationNotStarted}
	}
	return modelAnswer{err: finishedError(r.state)}
}

func (m *refModel) refillCommand(id accountID) modelAnswer {
	a := m.accounts[id]
	if a == nil {
		return modelAnswer{err: ledger.ErrAccountNotFound}
	}
	if p := m.policies[id.generation]; m.isCurrent(a) && !p.rolledBack {
		m.refill(a, p)
	}
	return modelAnswer{}
}

func (m *refModel) drain(id accountID) modelAnswer {
	a := m.accounts[id]
	if a == nil {
		return modelAnswer{err: ledger.ErrAccountNotFound}
	}
	p := m.active(id.subject)
	if p == nil || p.generation == id.generation {
		return modelAnswer{err: ledger.ErrNothingToDrain}
	}
	target, from, moved := m.switchTo(id.subject, p)
	if !moved {
		// Nothing can move into the target refilled to now: the drain
		// writes nothing, the target is not refilled.
		dryFrom, dryTo := *a, *target
		m.refill(&dryTo, p)
		if !m.move(&dryFrom, &dryTo) {
			return modelAnswer{err: ledger.ErrNothingToDrain}
		}
	}
	m.refill(target, p)
	if from == a && moved {
		return modelAnswer{generation: p.generation, checkGen: true}
	}
	if !m.move(a, target) {
		return modelAnswer{err: ledger.ErrNothingToDrain}
	}
	return modelAnswer{generation: p.generation, checkGen: true}
}

// --- driving both ----------------------------------------------------------

var modelSubjects = []string{"t1", "t2"}

func ledgerPolicy(p *modelPolicy) *ledger.Policy {
	lp := ledger.Policy{Key: ledger.PolicyKey{Subject: p.subject, Route: "chat", Region: "eu"},
		HoldTTL: p.hold, ExecutionLimit: p.executionLimit}
	if p.shadow {
		lp.Rollout = ledger.RolloutShadow
	}
	for i, d := range p.dims {
		lp.Dimensions = append(lp.Dimensions, ledger.Dimension{Unit: modelUnits[i], Burst: d.burst,
			RefillUnits: d.refill, RefillInterval: d.interval, MaxReservation: d.maxReservation, MaxOverdraft: d.maxOverdraft})
	}
	lp = lp.WithDefaults()
	return &lp
}

func drawPolicy(t *rapid.T, subject string) modelPolicy {
	p := modelPolicy{subject: subject,
		hold:           time.Duration(rapid.IntRange(1, 20).Draw(t, "hold")) * time.Second,
		executionLimit: time.Duration(rapid.SampledFrom([]int{0, 5, 30}).Draw(t, "executionLimit")) * time.Second,
		shadow:         rapid.IntRange(0, 9).Draw(t, "shadow") == 0,
	}
	for i := range p.dims {
		burst := int64(rapid.IntRange(5, 60).Draw(t, "burst"))
		p.dims[i] = modelDim{
			burst:          burst,
			refill:         int64(rapid.IntRange(0, 12).Draw(t, "refill")),
			interval:       time.Duration(rapid.SampledFrom([]int{1, 3, 7}).Draw(t, "interval")) * time.Second,
			maxReservation: burst - int64(rapid.IntRange(0, int(burst)-1).Draw(t, "maxReservationBelowBurst")),
			maxOverdraft:   int64(rapid.IntRange(0, 20).Draw(t, "maxOverdraft")),
		}
	}
	return p
}

func drawAmounts(t *rapid.T, label string, limit int) [modelDims]int64 {
	var out [modelDims]int64
	for i := range out {
		out[i] = int64(rapid.IntRange(0, limit).Draw(t, label))
	}
	return out
}

func toAmounts(u [modelDims]int64) ledger.Amounts {
	var out ledger.Amounts
	copy(out[:], u[:])
	return out
}

// modelRun is one sequence: the ledger under the harness and the model.
type modelRun struct {
	t   *rapid.T
	c   *checked
	m   *refModel
	ids int // reservation ids handed out: r0 .. r<ids-1>
}

func (r *modelRun) subject() string {
	return rapid.SampledFrom(modelSubjects).Draw(r.t, "subject")
}

// policySubject draws whom a publish or rollback names: a tenant, or every
// tenant without a policy of its own.
func (r *modelRun) policySubject() string {
	return rapid.SampledFrom(modelPolicySubjects).Draw(r.t, "policySubject")
}

var modelPolicySubjects = []string{"t1", "t2", ledger.AnySubject}

// pick draws the id of a reservation the model holds in one of states
// (listing a state twice makes it likelier), and sometimes any id at all
// (an unknown one, or one in another state), so wrong-state commands occur
// too.
func (r *modelRun) pick(states ...ledger.State) string {
	t := r.t
	if rapid.IntRange(0, 9).Draw(t, "anyID") > 0 {
		state := rapid.SampledFrom(states).Draw(t, "state")
		var ids []string
		for id, res := range r.m.reservations {
			if res.state == state {
				ids = append(ids, id)
			}
		}
		if len(ids) > 0 {
			slices.Sort(ids)
			return rapid.SampledFrom(ids).Draw(t, "id")
		}
	}
	return fmt.Sprintf("r%d", rapid.IntRange(0, r.ids+1).Draw(t, "id"))
}

// freshID is mostly a new reservation id, sometimes a used one (a retry
// after a lost answer, or a reuse with another digest).
func (r *modelRun) freshID() string {
	if r.ids > 0 && rapid.IntRange(0, 3).Draw(r.t, "reuseID") == 0 {
		return fmt.Sprintf("r%d", rapid.IntRange(0, r.ids-1).Draw(r.t, "id"))
	}
	r.ids++
	return fmt.Sprintf("r%d", r.ids-1)
}

// estimate draws reserve units: mostly within the active policy's maximum
// reservation, sometimes anything (too large, or nothing at all).
func (r *modelRun) estimate(subject string) [modelDims]int64 {
	t := r.t
	p := r.m.active(subject)
	if p == nil || rapid.IntRange(0, 9).Draw(t, "wildUnits") == 0 {
		return drawAmounts(t, "units", 25)
	}
	var out [modelDims]int64
	for i := range out {
		out[i] = int64(rapid.IntRange(0, int(p.dims[i].maxReservation)).Draw(t, "units"))
	}
	return out
}

func (r *modelRun) accountID() accountID {
	subject := r.subject()
	generation := uint64(rapid.IntRange(1, max(int(r.m.generations), 1)).Draw(r.t, "generation"))
	return accountID{subject, generation}
}

func (r *modelRun) operation(id string) string {
	if rapid.IntRange(0, 9).Draw(r.t, "forgedOperation") == 0 {
		return "op-forged"
	}
	return "op-" + id
}

// step draws one command, applies it to both, and compares.
func (r *modelRun) step() {
	t := r.t
	var cmd ledger.Command
	var want modelAnswer
	// Low kinds are the reservation lifecycle (rapid draws small numbers
	// more often, and shrinks towards them); the rarer, larger steps
	// (time, publish, rollback, workers) come last.
	const (
		reserved, started, unknown  = ledger.StateReserved, ledger.StateStarted, ledger.StateUsageUnknown
		settled, withDebt, expiring = ledger.StateSettled, ledger.StateSettledWithDebt, ledger.StateExpiring
	)
	switch kind := rapid.IntRange(0, 104).Draw(t, "kind"); {
	case kind >= 100:
		// A record: usage learned after the fact, under a fresh id or
		// a used one (a retry, with its usage or other usage, or an id
		// a reserve made).
		id, subject := r.freshID(), r.subject()
		digest := "rec-" + id
		switch rapid.IntRange(0, 9).Draw(t, "recordDigest") {
		case 0:
			digest = "d-" + id // a reserve's digest
		case 1:
			digest = "rec-other"
		}
		op := r.operation(id)
		actual := drawAmounts(t, "recorded", 40)
		if res := r.m.reservations[id]; res != nil && rapid.Bool().Draw(t, "replayRecord") {
			actual = res.actual
		}
		cmd = ledger.Command{Kind: ledger.KindRecord, ReservationID: id, RequestDigest: digest, OperationID: op,
			Subject: subject, Route: "chat", Region: "eu", Units: toAmounts(actual)}
		want = r.m.record(id, digest, subject, op, actual)
	case kind < 22:
		id, subject := r.freshID(), r.subject()
		digest := "d-" + id
		if rapid.IntRange(0, 19).Draw(t, "otherDigest") == 0 {
			digest = "d-other"
		}
		units := r.estimate(subject)
		cmd = ledger.Command{Kind: ledger.KindReserve, ReservationID: id, RequestDigest: digest,
			Subject: subject, Route: "chat", Region: "eu", Units: toAmounts(units)}
		want = r.m.reserve(id, digest, subject, units)
	case kind < 38:
		id := r.pick(reserved, reserved, started)
		op := r.operation(id)
		cmd = ledger.Command{Kind: ledger.KindStart, ReservationID: id, OperationID: op}
		want = r.m.start(id, op)
	case kind < 56:
		id := r.pick(started, unknown, started, settled, withDebt)
		op := r.operation(id)
		var actual [modelDims]int64
		res := r.m.reservations[id]
		switch {
		case res != nil && (res.state == settled || res.state == withDebt) && rapid.Bool().Draw(t, "replaySettle"):
			actual = res.actual
		case res != nil:
			for i := range actual {
				actual[i] = int64(rapid.IntRange(0, int(2*res.reserved[i])+5).Draw(t, "actual"))
			}
		default:
			actual = drawAmounts(t, "actual", 40)
		}
		cmd = ledger.Command{Kind: ledger.KindSettle, ReservationID: id, OperationID: op, Units: toAmounts(actual)}
		want = r.m.settle(id, op, actual)
	case kind < 62:
		id := r.pick(reserved, reserved, started)
		cmd = ledger.Command{Kind: ledger.KindRelease, ReservationID: id}
		want = r.m.release(id)
	case kind < 68:
		id := r.pick(reserved, reserved, started)
		cmd = ledger.Command{Kind: ledger.KindExpireClaim, ReservationID: id}
		want = r.m.expireClaim(id)
	case kind < 73:
		id := r.pick(expiring, expiring, reserved)
		cmd = ledger.Command{Kind: ledger.KindExpire, ReservationID: id}
		want = r.m.expire(id)
	case kind < 77:
		id := r.pick(started, started, unknown)
		cmd = ledger.Command{Kind: ledger.KindMarkUsageUnknown, ReservationID: id}
		want = r.m.markUnknown(id)
	case kind < 85:
		d := time.Duration(rapid.SampledFrom([]int{1, 2, 5, 13, 40, 3600}).Draw(t, "advance")) * time.Second
		r.c.advance(d)
		r.m.now = r.m.now.Add(d)
		t.Logf("advance %v", d)
		return
	case kind < 89:
		p := drawPolicy(t, r.policySubject())
		cmd = ledger.Command{Kind: ledger.KindPublishPolicy, Policy: ledgerPolicy(&p)}
		want = r.m.publish(p)
	case kind < 91:
		subject := r.policySubject()
		generation := uint64(rapid.IntRange(1, int(r.m.generations)+1).Draw(t, "generation"))
		cmd = ledger.Command{Kind: ledger.KindRollbackPolicy, PolicyKey: ledger.PolicyKey{Subject: subject, Route: "chat", Region: "eu"}, Generation: generation}
		want = r.m.rollback(subject, generation)
	case kind < 94:
		id := r.accountID()
		cmd = ledger.Command{Kind: ledger.KindRefill, Account: ledger.AccountKey{Subject: id.subject, Route: "chat", Region: "eu", Generation: id.generation}}
		want = r.m.refillCommand(id)
	case kind < 97:
		id := r.accountID()
		cmd = ledger.Command{Kind: ledger.KindDrain, Account: ledger.AccountKey{Subject: id.subject, Route: "chat", Region: "eu", Generation: id.generation}}
		want = r.m.drain(id)
	default:
		id := r.accountID()
		cmd = ledger.Command{Kind: ledger.KindCloseEpoch, Account: ledger.AccountKey{Subject: id.subject, Route: "chat", Region: "eu", Generation: id.generation}}
		got := r.c.apply(cmd)
		if (r.m.accounts[id] == nil) != errors.Is(got.Err, ledger.ErrAccountNotFound) {
			t.Fatalf("close epoch of %v: %v", id, got.Err)
		}
		t.Logf("close_epoch %v: %v", id, got.Err)
		r.compare()
		return
	}
	got := r.c.apply(cmd)
	t.Logf("%s %s %s units=%v op=%s gen=%d: err=%v replayed=%v refunded=%v", cmd.Kind, cmd.ReservationID,
		cmd.Subject, cmd.Units[:modelDims], cmd.OperationID, cmd.Generation, got.Err, got.Replayed, got.Refunded[:modelDims])
	r.compareAnswer(&cmd, &got, &want)
	r.compare()
	outcome := "ok"
	switch {
	case got.Err != nil:
		outcome = errorClass(got.Err)
	case got.Replayed:
		outcome = "replayed"
	case got.Reservation.State == ledger.StateSettledWithDebt:
		outcome = "with_debt"
	}
	modelOutcomes.Lock()
	modelOutcomes.m[cmd.Kind.String()+" "+outcome]++
	modelOutcomes.Unlock()
}

// modelOutcomes counts what the sequences did, so a run shows (with -v)
// that every outcome is reached, not only the easy ones.
var modelOutcomes = struct {
	sync.Mutex
	m map[string]int
}{m: map[string]int{}}

func errorClass(err error) string {
	for _, e := range []error{ledger.ErrInsufficientCapacity, ledger.ErrAdmissionFrozen, ledger.ErrReservationTooLarge,
		ledger.ErrNoPolicy, ledger.ErrDigestMismatch, ledger.ErrReservationNotFound, ledger.ErrReservationNotStarted,
		ledger.ErrReservationAlreadyStarted, ledger.ErrOperationMismatch, ledger.ErrReservationAlreadySettled,
		ledger.ErrReservationReleased, ledger.ErrReservationExpired, ledger.ErrReservationNotDue,
		ledger.ErrInvalidCommand, ledger.ErrPolicyNotFound, ledger.ErrAccountNotFound, ledger.ErrNothingToDrain} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}

func (r *modelRun) compareAnswer(cmd *ledger.Command, got *ledger.Result, want *modelAnswer) {
	t := r.t
	t.Helper()
	switch {
	case want.err == nil && got.Err != nil:
		t.Fatalf("%s: ledger says %v, model says success", cmd.Kind, got.Err)
	case want.err != nil && !errors.Is(got.Err, want.err):
		t.Fatalf("%s: ledger says %v, model says %v", cmd.Kind, got.Err, want.err)
	}
	if got.Replayed != want.replayed {
		t.Fatalf("%s: replayed %v, model %v", cmd.Kind, got.Replayed, want.replayed)
	}
	if got.Refunded != toAmounts(want.refunded) {
		t.Fatalf("%s: refunded %v, model %v", cmd.Kind, got.Refunded, want.refunded)
	}
	if want.checkGen && got.Generation != want.generation {
		t.Fatalf("%s: generation %d, model %d", cmd.Kind, got.Generation, want.generation)
	}
	if got.Rejected() {
		if got.Dimension != want.dimension || got.RetryAfter != want.retryAfter || got.Shadow != want.shadow {
			t.Fatalf("%s rejection: dimension %q retry-after %v shadow %v; model %q %v %v", cmd.Kind,
				got.Dimension, got.RetryAfter, got.Shadow, want.dimension, want.retryAfter, want.shadow)
		}
	}
}

// compare checks every balance and every reservation of the model against
// the ledger.
func (r *modelRun) compare() {
	t := r.t
	t.Helper()
	for id, ma := range r.m.accounts {
		a, found := r.c.m.Account(ledger.AccountKey{Subject: id.subject, Route: "chat", Region: "eu", Generation: id.generation})
		if !found {
			t.Fatalf("account %v missing in the ledger", id)
		}
		var held [modelDims]int64
		if r.m.isCurrent(ma) {
			held = r.m.heldElsewhere(ma)
		}
		for i := range modelDims {
			if a.HeldElsewhere[i] != held[i] {
				t.Fatalf("account %v %s: ledger counts %d held elsewhere; model %d", id, modelUnits[i], a.HeldElsewhere[i], held[i])
			}
			bal := &a.Balances[i]
			if bal.Available != ma.available[i] || bal.Reserved != ma.reserved[i] || bal.Spent != ma.spent[i] || bal.Debt() != ma.debt[i] {
				t.Fatalf("account %v %s: ledger available %d reserved %d spent %d debt %d; model %d %d %d %d",
					id, modelUnits[i], bal.Available, bal.Reserved, bal.Spent, bal.Debt(),
					ma.available[i], ma.reserved[i], ma.spent[i], ma.debt[i])
			}
		}
	}
	if got, want := len(r.c.m.Accounts()), len(r.m.accounts); got != want {
		t.Fatalf("ledger has %d accounts, model %d", got, want)
	}
	for id, mr := range r.m.reservations {
		lr, found := r.c.m.Reservation(id)
		if !found {
			t.Fatalf("reservation %s missing in the ledger", id)
		}
		if lr.State != mr.state || lr.Reserved != toAmounts(mr.reserved) || lr.Account.Generation != mr.generation ||
			lr.Breach != mr.breach || (mr.state == ledger.StateSettled || mr.state == ledger.StateSettledWithDebt) && lr.Actual != toAmounts(mr.actual) {
			t.Fatalf("reservation %s: ledger %+v; model %+v", id, *lr, *mr)
		}
	}
	if got, want := len(r.c.m.Reservations()), len(r.m.reservations); got != want {
		t.Fatalf("ledger has %d reservations, model %d", got, want)
	}
}

// modelDefaultChecks is the default run's number of sequences; CI runs
// 10,000 with -rapid.checks=10000 (see the top of this file).
const modelDefaultChecks = 1000

func runModel(t *rapid.T) {
	r := &modelRun{t: t, c: newChecked(t), m: newRefModel(t0)}
	// Start with a policy for the first subject, so most sequences admit.
	p := drawPolicy(t, modelSubjects[0])
	r.compareAnswer(&ledger.Command{Kind: ledger.KindPublishPolicy},
		ptr(r.c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: ledgerPolicy(&p)})), ptr(r.m.publish(p)))
	if rapid.Bool().Draw(t, "secondSubjectPolicy") {
		p := drawPolicy(t, modelSubjects[1])
		r.compareAnswer(&ledger.Command{Kind: ledger.KindPublishPolicy},
			ptr(r.c.apply(ledger.Command{Kind: ledger.KindPublishPolicy, Policy: ledgerPolicy(&p)})), ptr(r.m.publish(p)))
	}
	steps := rapid.IntRange(100, 200).Draw(t, "steps")
	for range steps {
		r.step()
	}
	modelSteps.Add(int64(steps))
}

func ptr[T any](v T) *T { return &v }

func TestModel(t *testing.T) {
	// rapid reads its number of checks from its -rapid.checks flag; unless
	// the command line set it, run modelDefaultChecks.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "rapid.checks" })
	if !explicit {
		previous := flag.Lookup("rapid.checks").Value.String()
		if err := flag.Set("rapid.checks", strconv.Itoa(modelDefaultChecks)); err != nil {
			t.Fatal(err)
		}
		defer flag.Set("rapid.checks", previous)
	}
	modelSteps.Store(0)
	rapid.Check(t, runModel)
	t.Logf("%d commands", modelSteps.Load())
	modelOutcomes.Lock()
	defer modelOutcomes.Unlock()
	names := slices.Sorted(maps.Keys(modelOutcomes.m))
	for _, name := range names {
		t.Logf("%8d %s", modelOutcomes.m[name], name)
	}
}

var modelSteps atomic.Int64
