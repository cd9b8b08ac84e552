package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// Gate is one release gate: a count of violations that must be 0.
type Gate uint8

const (
	// GateConservation: an account's conservation equation broke, or a
	// move minted at its destination other than what left its source.
	GateConservation Gate = iota
	// GateShardConservation: a shard's (central or gateway-local)
	// conservation broke.
	GateShardConservation
	// GateOverspend: a term went negative (available below zero is
	// overspending), or an account holds more than its generation's burst.
	GateOverspend
	// GateAdmissionWhileDebt: a reservation was admitted for a subject
	// while one of its accounts (of any generation) owed debt at that
	// moment.
	GateAdmissionWhileDebt
	// GateDuplicateRefund: a reservation's hold was given back twice, or a
	// replay refunded something.
	GateDuplicateRefund
	// GateDuplicateRecovery: a recovery of unused capacity (move, drain,
	// shard remint) was applied twice.
	GateDuplicateRecovery
	// GateUnknownAsUnconsumed: started or USAGE_UNKNOWN work's hold was
	// given back as unused, or its usage refused.
	GateUnknownAsUnconsumed
	// GateSecondReservation: one reservation id debited twice.
	GateSecondReservation
	// GateDuplicateShardConsumption: shard capacity spent twice (two
	// gateways, or an old process's shard after a restart).
	GateDuplicateShardConsumption
	// GateUnrecordedDebt: usage above the reservation not recorded in full
	// as spent and overdraft.
	GateUnrecordedDebt
	// GateIllegalTransition: a reservation changed state outside the
	// lifecycle (other than the cases above).
	GateIllegalTransition
	// GateJournal: rows disagree with their journal, a committed change was
	// lost, or ledger.Audit found another discrepancy.
	GateJournal
	// GateProtocol: an answer a correct ledger cannot give to the client
	// protocol.
	GateProtocol
	// GateLiveness: something did not converge after the faults healed.
	GateLiveness
	// GateFairness: a fairness window's RFE exceeded the scheduler's bound
	// (or the scheduler was not work-conserving).
	GateFairness
	// GateUnknownWithoutCause: a reservation became USAGE_UNKNOWN with no
	// request to mark it and before its execution limit passed.
	GateUnknownWithoutCause
	// GateDebtRepaidFirst: a refill made capacity available while the
	// account still owed debt its minted units could have repaid.
	GateDebtRepaidFirst
	// GateTenantFairness: a tenant's fairness error over an interleaving
	// exceeded its policy's fairness budget.
	GateTenantFairness
	// GateRetention: retention removed a reservation that was not finished
	// or left a tombstone that is not the reservation's, or a retried
	// reserve of a removed id debited again.
	GateRetention
	// GateCompaction: a checkpoint's closing vectors are not the balances
	// committed up to its cut, compaction deleted journal entries the
	// last checkpoint does not summarise, or the checkpoint chain does
	// not verify.
	GateCompaction

	numGates
)

var gateNames = [numGates]string{
	GateConservation:              "central_conservation",
	GateShardConservation:         "shard_conservation",
	GateOverspend:                 "overspend",
	GateAdmissionWhileDebt:        "admission_while_debt",
	GateDuplicateRefund:           "duplicate_refund",
	GateDuplicateRecovery:         "duplicate_recovery",
	GateUnknownAsUnconsumed:       "unknown_as_unconsumed",
	GateSecondReservation:         "second_reservation",
	GateDuplicateShardConsumption: "duplicate_shard_consumption",
	GateUnrecordedDebt:            "unrecorded_debt",
	GateIllegalTransition:         "illegal_transition",
	GateJournal:                   "journal_and_audit",
	GateProtocol:                  "protocol",
	GateLiveness:                  "liveness",
	GateFairness:                  "fairness",
	GateUnknownWithoutCause:       "unknown_without_cause",
	GateDebtRepaidFirst:           "debt_repaid_first",
	GateTenantFairness:            "tenant_fairness",
	GateRetention:                 "retention",
	GateCompaction:                "compaction",
}

func (g Gate) String() string {
	if g < numGates {
		return gateNames[g]
	}
	return "gate?"
}

// Gates returns every gate in report order.
func Gates() []Gate {
	out := make([]Gate, numGates)
	for i := range out {
		out[i] = Gate(i)
	}
	return out
}

// checker follows every durable change of the ledger, in commit order, and
// checks each transition as it happens: it replays the journal into its own
// balances, tracks each reservation's state and each account's holds, and
// compares the rows the engine wrote with that replay.
type checker struct {
	w        *world
	accounts map[ledger.AccountKey]*acctState
	order    []ledger.AccountKey // accounts in creation order (map order is random)
	resv     map[string]*resvState
	receipts map[string][]ledger.AccountKey
	// retired counts the reservations retention removed.
	retired int
	// entries counts the durable journal entries.
	entries int64
}

type acctState struct {
	dims  int
	bal   ledger.Balances
	holds ledger.Amounts
	// refilledTo is the refill cursor of the account's last row.
	refilledTo [ledger.MaxDimensions]int64
	// heldElsewhere is what the account's last row counts as held by the
	// subject's other accounts (ledger.Account.HeldElsewhere).
	heldElsewhere ledger.Amounts
}

type resvState struct {
	state     ledger.State
	account   ledger.AccountKey
	reserved  ledger.Amounts
	unknownAt int64
	// actual is the usage its settle recorded; retired is set once
	// retention removed the row (its tombstone answers for it).
	actual    ledger.Amounts
	retired   bool
	forgotten bool // its tombstone is gone too (past the horizon)
	digest    string
}

func newChecker(w *world) checker {
	return checker{
		w:        w,
		accounts: map[ledger.AccountKey]*acctState{},
		resv:     map[string]*resvState{},
		receipts: map[string][]ledger.AccountKey{},
	}
}

func (c *checker) accountsInOrder() []ledger.AccountKey { return c.order }

// afterCommit checks every change set that became durable since the last
// call (normally the one batch just committed).
func (c *checker) afterCommit(cmds []ledger.Command) {
	st := c.w.ledger.st
	for _, ch := range st.committed {
		c.changes(ch)
		if c.w.fail != nil {
			break
		}
	}
	st.committed = st.committed[:0]
}

func (c *checker) violate(g Gate, format string, args ...any) {
	c.w.violate(g, fmt.Sprintf(format, args...))
}

func (c *checker) account(key ledger.AccountKey, ch *store.Changes) *acctState {
	if a := c.accounts[key]; a != nil {
		return a
	}
	a := &acctState{}
	for i := range ch.Accounts {
		if ch.Accounts[i].Key == key {
			a.dims = ch.Accounts[i].Dims
		}
	}
	c.accounts[key] = a
	c.order = append(c.order, key)
	return a
}

func findReservation(ch *store.Changes, id string) *ledger.Reservation {
	for i := range ch.Reservations {
		if ch.Reservations[i].ID == id {
			return &ch.Reservations[i]
		}
	}
	return nil
}

// legal is the reservation lifecycle of the seed, independent of the
// ledger's own code: which command may move a reservation from one state
// to another.
func legal(kind ledger.Kind, from, to ledger.State) bool {
	switch kind {
	case ledger.KindReserve:
		return from == ledger.StateRequested && to == ledger.StateReserved
	case ledger.KindStart:
		return from == ledger.StateReserved && to == ledger.StateStarted
	case ledger.KindRelease:
		return from == ledger.StateReserved && to == ledger.StateReleased
	case ledger.KindExpireClaim:
		return from == ledger.StateReserved && to == ledger.StateExpiring
	case ledger.KindExpire:
		return from == ledger.StateExpiring && to == ledger.StateExpired
	case ledger.KindMarkUsageUnknown:
		return from == ledger.StateStarted && to == ledger.StateUsageUnknown
	case ledger.KindSettle:
		return (from == ledger.StateStarted || from == ledger.StateUsageUnknown) &&
			(to == ledger.StateSettled || to == ledger.StateSettledWithDebt)
	case ledger.KindRecord:
		// Usage recorded after the fact: born settled, holding nothing.
		return from == ledger.StateRequested && (to == ledger.StateSettled || to == ledger.StateSettledWithDebt)
	}
	return false
}

func (c *checker) changes(ch *store.Changes) {
	c.entries += int64(len(ch.Journal))
	for i := range ch.Journal {
		c.entry(&ch.Journal[i], ch)
		if c.w.fail != nil {
			return
		}
	}
	for i := range ch.Accounts {
		row := &ch.Accounts[i]
		a := c.account(row.Key, ch)
		if row.Balances != a.bal {
			c.violate(GateJournal, "account %s row %+v differs from the replay of its journal %+v", row.Key, row.Balances[:row.Dims], a.bal[:row.Dims])
			return
		}
		a.refilledTo, a.heldElsewhere = row.RefilledTo, row.HeldElsewhere
		p := c.w.op.policy(row.Key.Generation)
		if p == nil {
			c.w.op.policiesStale = true
			c.w.op.refresh(c.w)
			p = c.w.op.policy(row.Key.Generation)
		}
		for d := 0; d < row.Dims; d++ {
			if row.Balances[d].Reserved != a.holds[d] {
				c.violate(GateJournal, "account %s dimension %d: reserved %d, but its holding reservations hold %d", row.Key, d, row.Balances[d].Reserved, a.holds[d])
				return
			}
			if p != nil && d < len(p.Dimensions) && row.Balances[d].Available+row.Balances[d].Reserved > p.Dimensions[d].Burst {
				c.violate(GateOverspend, "account %s dimension %d: available %d + reserved %d above the burst %d of generation %d",
					row.Key, d, row.Balances[d].Available, row.Balances[d].Reserved, p.Dimensions[d].Burst, p.Generation)
				return
			}
		}
	}
	for i := range ch.Reservations {
		r := &ch.Reservations[i]
		rs := c.resv[r.ID]
		if rs == nil || rs.state != r.State || rs.reserved != r.Reserved || rs.account != r.Account {
			c.violate(GateJournal, "reservation %s row (%s, %v) differs from its journal (%+v)", r.ID, r.State, r.Reserved, rs)
			return
		}
	}
	c.retention(&ch.Retention)
	if c.w.fail != nil {
		return
	}
	c.w.shardChanges(ch)
}

// retention follows what retire and forget commands removed: only a
// finished reservation goes, its tombstone is its own (id, digest,
// account, terminal state), and it goes once.
func (c *checker) retention(ch *store.RetentionChanges) {
	for _, id := range ch.RemovedReservations {
		rs := c.resv[id]
		if rs == nil || rs.retired || !rs.state.Terminal() {
			c.violate(GateRetention, "retention removed reservation %s, which was not a finished live one (%+v)", id, rs)
			return
		}
		rs.retired = true
		c.retired++
	}
	for _, id := range ch.RemovedTombstones {
		rs := c.resv[id]
		if rs == nil || !rs.retired || rs.forgotten {
			c.violate(GateRetention, "retention forgot tombstone %s, which it had not left (%+v)", id, rs)
			return
		}
		rs.forgotten = true
	}
	for i := range ch.Tombstones {
		t := &ch.Tombstones[i]
		rs := c.resv[t.ID]
		if rs == nil || !rs.retired || t.State != rs.state || t.Account != rs.account || t.RequestDigest != rs.digest {
			c.violate(GateRetention, "tombstone %+v is not that of the reservation retention removed (%+v)", *t, rs)
			return
		}
	}
}

func (c *checker) entry(e *ledger.JournalEntry, ch *store.Changes) {
	a := c.account(e.Account, ch)
	before := a.bal
	if e.Forgets() {
		// Retention forgot the id's tombstone (or retired it past the
		// horizon, leaving none): no transition, nothing moves.
		if e.Delta != (ledger.Balances{}) {
			c.violate(GateJournal, "forget of %s moved %s", e.ReservationID, fmtDelta(&e.Delta, max(a.dims, 1)))
		}
		return
	}
	if e.ReservationID != "" && !(e.From == ledger.StateRequested && e.To == ledger.StateRequested) {
		c.transition(e, a, &before, ch)
		if c.w.fail != nil {
			return
		}
	}
	switch e.Kind {
	case ledger.KindDrain, ledger.KindShardIssue, ledger.KindShardReconcile:
		ends := c.receipts[e.ReceiptID]
		if e.Kind == ledger.KindShardIssue && c.w.shards.removed[c.w.shards.key(e.ReceiptID)] {
			// A new shard under the id of one retention removed: its
			// issuance and reconciliation are the new shard's own.
			ends = nil
		}
		if slices.Contains(ends, e.Account) {
			if e.Kind == ledger.KindShardIssue {
				c.violate(GateDuplicateShardConsumption, "shard %s issued twice from %s", e.ReceiptID, e.Account)
			} else {
				c.violate(GateDuplicateRecovery, "%s %s applied twice at %s", e.Kind, e.ReceiptID, e.Account)
			}
			return
		}
		c.receipts[e.ReceiptID] = append(ends, e.Account)
		if e.Kind == ledger.KindShardIssue {
			c.w.shards.shardIssued(e)
		}
	}
	if e.Kind == ledger.KindRefill {
		// The seed: minted capacity repays debt first, then fills
		// available.
		for d := 0; d < max(a.dims, 1); d++ {
			minted, repaid := e.Delta[d].Minted, e.Delta[d].OverdraftRepaid
			if want := min(minted, before[d].Debt()); repaid != want || e.Delta[d].Available != minted-repaid {
				c.violate(GateDebtRepaidFirst, "refill of %s dimension %d minted %d with %d owed: repaid %d and made %+d available, want repaid %d",
					e.Account, d, minted, before[d].Debt(), repaid, e.Delta[d].Available, want)
				return
			}
		}
	}
	a.bal.Add(&e.Delta)
	for d := 0; d < max(a.dims, 1); d++ {
		b := &a.bal[d]
		if b.Available < 0 || b.Reserved < 0 || b.Spent < 0 || b.Opening < 0 || b.Minted < 0 ||
			b.OverdraftIssued < 0 || b.OverdraftRepaid < 0 || b.RetiredForEmergency < 0 || b.RetiredForMove < 0 {
			c.violate(GateOverspend, "account %s dimension %d has a negative term after %s %s: %+v", e.Account, d, e.Kind, e.ReservationID, *b)
			return
		}
		if b.Sources() != b.Uses() {
			c.violate(GateConservation, "account %s dimension %d after %s %s: opening+minted+overdraftIssued = %d, available+reserved+spent+retired+overdraftRepaid = %d (%+v)",
				e.Account, d, e.Kind, e.ReservationID, b.Sources(), b.Uses(), *b)
			return
		}
		if b.OverdraftRepaid > b.OverdraftIssued {
			c.violate(GateConservation, "account %s dimension %d repaid %d, more than the %d debt issued", e.Account, d, b.OverdraftRepaid, b.OverdraftIssued)
			return
		}
	}
}

// transition checks one reservation state change against the lifecycle
// and its capacity effect against the seed's rules.
func (c *checker) transition(e *ledger.JournalEntry, a *acctState, before *ledger.Balances, ch *store.Changes) {
	id := e.ReservationID
	rs := c.resv[id]
	from := ledger.StateRequested
	if rs != nil {
		from = rs.state
	}
	moved := e.Delta != ledger.Balances{}
	switch {
	case e.Kind == ledger.KindReserve && rs != nil && rs.retired:
		c.violate(GateRetention, "reservation %s debited again (%s -> %s) after retention removed it (%s): a retry must replay from its tombstone", id, e.From, e.To, rs.state)
		return
	case e.Kind == ledger.KindReserve && rs != nil:
		c.violate(GateSecondReservation, "reservation %s debited again (%s -> %s) while %s", id, e.From, e.To, rs.state)
		return
	case e.Kind == ledger.KindRecord && rs != nil && rs.retired:
		c.violate(GateRetention, "record %s charged again (%s) after retention removed it (%s): a retry must answer from its tombstone, charging nothing", id, fmtDelta(&e.Delta, max(a.dims, 1)), rs.state)
		return
	case e.Kind == ledger.KindRecord && rs != nil:
		c.violate(GateSecondReservation, "record %s charged again (%s) while %s: a retry must replay, charging nothing", id, fmtDelta(&e.Delta, max(a.dims, 1)), rs.state)
		return
	case rs != nil && rs.state.Terminal():
		if moved {
			c.violate(GateDuplicateRefund, "terminal reservation %s (%s) ended again by %s, moving %s", id, rs.state, e.Kind, fmtDelta(&e.Delta, max(a.dims, 1)))
		} else {
			c.violate(GateIllegalTransition, "terminal reservation %s changed %s -> %s by %s", id, rs.state, e.To, e.Kind)
		}
		return
	case e.From != from:
		c.violate(GateJournal, "journal moves %s from %s, but it was %s", id, e.From, from)
		return
	case !legal(e.Kind, from, e.To):
		if (from == ledger.StateStarted || from == ledger.StateUsageUnknown) &&
			(e.To == ledger.StateExpiring || e.To == ledger.StateExpired || e.To == ledger.StateReleased) {
			c.violate(GateUnknownAsUnconsumed, "%s took %s reservation %s to %s: its capacity may be in use", e.Kind, from, id, e.To)
		} else {
			c.violate(GateIllegalTransition, "%s moved %s from %s to %s", e.Kind, id, from, e.To)
		}
		return
	}
	row := findReservation(ch, id)
	if row == nil {
		c.violate(GateJournal, "journal moves %s to %s but no reservation row was written", id, e.To)
		return
	}
	dims := max(a.dims, 1)
	switch e.Kind {
	case ledger.KindReserve:
		if d := debtDim(before, dims); d >= 0 {
			c.violate(GateAdmissionWhileDebt, "reservation %s admitted on %s while dimension %d owed %d", id, e.Account, d, before[d].Debt())
			return
		}
		// Per subject, across generations: debt on another generation's
		// account (in a unit the deciding generation does not limit, which
		// no switch carries over) freezes the subject too.
		subject := e.Account.SubjectKey()
		for key, other := range c.accounts {
			if key != e.Account && key.SubjectKey() == subject {
				if d := debtDim(&other.bal, max(other.dims, 1)); d >= 0 {
					c.violate(GateAdmissionWhileDebt, "reservation %s admitted on %s while %s dimension %d owed %d", id, e.Account, key, d, other.bal[d].Debt())
					return
				}
			}
		}
		for d := 0; d < dims; d++ {
			if e.Delta[d].Reserved != row.Reserved[d] || e.Delta[d].Available != -row.Reserved[d] {
				c.violate(GateJournal, "reserve %s of %v moved reserved %+d, available %+d", id, row.Reserved, e.Delta[d].Reserved, e.Delta[d].Available)
				return
			}
		}
		rs = &resvState{account: e.Account, reserved: row.Reserved, unknownAt: -1, digest: row.RequestDigest}
		c.resv[id] = rs
		for d := range a.holds {
			a.holds[d] += row.Reserved[d]
		}
	case ledger.KindRecord:
		// Nothing held: the usage moves into spent, available pays what
		// it has, and exactly the rest is debt.
		withDebt := false
		for d := 0; d < dims; d++ {
			used := row.Actual[d]
			wantDebt := max(0, used-before[d].Available)
			switch {
			case row.Reserved[d] != 0 || e.Delta[d].Reserved != 0:
				c.violate(GateJournal, "record %s holds %d (reserved %+d): a record holds nothing", id, row.Reserved[d], e.Delta[d].Reserved)
				return
			case e.Delta[d].Spent != used:
				c.violate(GateUnrecordedDebt, "record %s using %d moved spent %+d", id, used, e.Delta[d].Spent)
				return
			case e.Delta[d].OverdraftIssued != wantDebt || e.Delta[d].Available != -(used-wantDebt):
				c.violate(GateUnrecordedDebt, "record %s using %d with %d available issued overdraft %d and moved available %+d, want %d and %+d",
					id, used, before[d].Available, e.Delta[d].OverdraftIssued, e.Delta[d].Available, wantDebt, -(used - wantDebt))
				return
			}
			withDebt = withDebt || wantDebt > 0
		}
		if withDebt != (e.To == ledger.StateSettledWithDebt) {
			c.violate(GateUnrecordedDebt, "record %s ended %s, but its debt is %v", id, e.To, withDebt)
			return
		}
		rs = &resvState{account: e.Account, unknownAt: -1, digest: row.RequestDigest, actual: row.Actual}
		c.resv[id] = rs
		c.w.recordStats.Records++
		if withDebt {
			c.w.recordStats.WithDebt++
		}
	case ledger.KindExpireClaim:
		if e.At.Before(row.ExpiresAt) {
			c.violate(GateIllegalTransition, "expiry claimed %s at %s, before its hold ran out at %s", id, e.At.Format("15:04:05.000"), row.ExpiresAt.Format("15:04:05.000"))
			return
		}
	case ledger.KindRelease, ledger.KindExpire:
		for d := 0; d < dims; d++ {
			if e.Delta[d].Reserved != -rs.reserved[d] || e.Delta[d].Available != rs.reserved[d] {
				c.violate(GateDuplicateRefund, "%s of %s holding %v moved reserved %+d, available %+d", e.Kind, id, rs.reserved, e.Delta[d].Reserved, e.Delta[d].Available)
				return
			}
		}
	case ledger.KindSettle:
		for d := 0; d < dims; d++ {
			held, used := rs.reserved[d], row.Actual[d]
			wantDebt := max(0, used-held-before[d].Available)
			switch {
			case e.Delta[d].Reserved != -held:
				c.violate(GateDuplicateRefund, "settle of %s holding %d moved reserved %+d", id, held, e.Delta[d].Reserved)
				return
			case e.Delta[d].Spent != used:
				c.violate(GateUnrecordedDebt, "settle of %s using %d moved spent %+d", id, used, e.Delta[d].Spent)
				return
			case e.Delta[d].OverdraftIssued != wantDebt:
				c.violate(GateUnrecordedDebt, "settle of %s using %d of %d held with %d available issued overdraft %d, want %d",
					id, used, held, before[d].Available, e.Delta[d].OverdraftIssued, wantDebt)
				return
			}
		}
		rs.actual = row.Actual
		if rs.state == ledger.StateUsageUnknown && rs.unknownAt >= 0 {
			c.w.usageUnknown = append(c.w.usageUnknown, c.w.now-rs.unknownAt)
		}
	case ledger.KindMarkUsageUnknown:
		// API.md: STARTED -> USAGE_UNKNOWN only on a request
		// (MarkUsageUnknown, which no simulated actor sends) or by the
		// worker once the execution limit passed.
		if row.ExecutionDeadline.IsZero() || e.At.Before(row.ExecutionDeadline) {
			deadline := "no execution limit"
			if !row.ExecutionDeadline.IsZero() {
				deadline = "its execution deadline " + row.ExecutionDeadline.Format("15:04:05.000")
			}
			c.violate(GateUnknownWithoutCause, "%s marked USAGE_UNKNOWN at %s (started %s), with no request and before %s",
				id, e.At.Format("15:04:05.000"), row.StartedAt.Format("15:04:05.000"), deadline)
			return
		}
		rs.unknownAt = c.w.now
	}
	if e.To.Terminal() {
		for d := range a.holds {
			a.holds[d] -= rs.reserved[d]
		}
	}
	rs.state = e.To
}

// inDebt reports whether the account owes debt in some dimension.
func (c *checker) inDebt(key ledger.AccountKey) bool {
	a := c.accounts[key]
	return a != nil && debtDim(&a.bal, max(a.dims, 1)) >= 0
}

// commandOnDebt reports whether a gateway's or executor's command runs on
// an indebted account, so that the refill it runs first repays debt: a
// reserve or record on the subject's current account, a settle on its
// reservation's.
func (c *checker) commandOnDebt(cmd *ledger.Command) bool {
	switch cmd.Kind {
	case ledger.KindReserve, ledger.KindRecord:
		subject := ledger.PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
		active := c.w.op.activeGeneration(subject)
		return active != 0 && c.inDebt(ledger.AccountKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region, Generation: active})
	case ledger.KindSettle:
		rs := c.resv[cmd.ReservationID]
		return rs != nil && c.inDebt(rs.account)
	}
	return false
}

func debtDim(b *ledger.Balances, dims int) int {
	for d := 0; d < dims; d++ {
		if b[d].Debt() > 0 {
			return d
		}
	}
	return -1
}

// settledDown reports whether the ledger holds nothing, owes nothing and
// keeps no capacity on a superseded generation's account that the active
// generation's account has room for.
func (c *checker) settledDown() bool {
	c.w.op.refresh(c.w)
	for _, key := range c.order {
		a := c.accounts[key]
		active := c.w.op.activeGeneration(key.SubjectKey())
		for d := 0; d < max(a.dims, 1); d++ {
			if a.holds[d] != 0 || a.bal[d].Reserved != 0 || a.bal[d].Debt() != 0 {
				return false
			}
			if key.Generation != active && a.bal[d].Available != 0 && c.roomAt(key.SubjectKey(), active, c.unitOf(key.Generation, d)) {
				return false
			}
		}
	}
	return true
}

// roomAt reports whether the subject's account under generation gen can
// take more capacity of unit: available + reserved below the generation's
// burst in that unit's dimension, less what the account counts as held by
// the subject's other accounts, once the refill due by now is minted (or
// no account yet). Capacity moves only into its own unit's dimension, and
// a drain that can move nothing writes nothing, not even the refill: room
// that refill fills, or room in another dimension, is no reason to wait.
func (c *checker) roomAt(subject ledger.PolicyKey, gen uint64, unit string) bool {
	key := ledger.AccountKey{Subject: subject.Subject, Route: subject.Route, Region: subject.Region, Generation: gen}
	a := c.accounts[key]
	if a == nil {
		return true
	}
	p := c.w.op.policy(gen)
	if p == nil {
		return false
	}
	d := p.DimensionIndex(unit)
	if d < 0 || d >= a.dims {
		return false
	}
	bal, dim := a.bal[d], p.Dimensions[d]
	room := max(dim.Burst-bal.Available-bal.Reserved-a.heldElsewhere[d], 0)
	if dim.RefillUnits > 0 && dim.RefillInterval > 0 && !p.RolledBack {
		if intervals := (c.w.time().UnixNano() - a.refilledTo[d]) / int64(dim.RefillInterval); intervals > 0 {
			limit := bal.Debt() + room
			due := limit
			if intervals < (limit+dim.RefillUnits-1)/dim.RefillUnits {
				due = intervals * dim.RefillUnits
			}
			room -= max(due-bal.Debt(), 0)
		}
	}
	return room > 0
}

// unitOf names dimension d of generation gen ("" when unknown).
func (c *checker) unitOf(gen uint64, d int) string {
	if p := c.w.op.policy(gen); p != nil && d < len(p.Dimensions) {
		return p.Dimensions[d].Unit
	}
	return ""
}

// openSummary describes what has not converged, for a liveness report.
func (c *checker) openSummary() string {
	var parts []string
	for _, key := range c.order {
		a := c.accounts[key]
		for d := 0; d < max(a.dims, 1); d++ {
			b := &a.bal[d]
			if b.Reserved != 0 || b.Debt() != 0 {
				parts = append(parts, fmt.Sprintf("%s[%d] reserved=%d debt=%d available=%d", key, d, b.Reserved, b.Debt(), b.Available))
			}
		}
	}
	var held []string
	for _, id := range sortedKeys(c.resv) {
		if rs := c.resv[id]; rs.state.Holds() {
			held = append(held, id+"="+rs.state.String())
			if len(held) == 8 {
				break
			}
		}
	}
	return "accounts: [" + strings.Join(parts, "; ") + "] holding: [" + strings.Join(held, ", ") + "]"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// fullAudit reads the whole store and runs ledger.Audit over it, and checks
// durability: every account the checker saw committed is in the store with
// exactly the balances its journal replays to, every reservation in the
// state its journal left it.
func (c *checker) fullAudit(why string) {
	w := c.w
	snap, err := w.ledgerStore.Snapshot(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("%s: snapshot: %v", why, err))
		return
	}
	c.auditSnapshot(snap, why)
}

// auditSnapshot is fullAudit of a snapshot already read.
func (c *checker) auditSnapshot(snap *ledger.Snapshot, why string) {
	w := c.w
	for _, d := range ledger.Audit(snap) {
		w.violate(auditGate(d), fmt.Sprintf("%s: ledger.Audit: %s", why, d))
		return
	}
	seen := 0
	for i := range snap.Accounts {
		row := &snap.Accounts[i]
		a := c.accounts[row.Key]
		if a == nil || a.bal != row.Balances {
			w.violate(GateJournal, fmt.Sprintf("%s: store account %s differs from everything committed", why, row.Key))
			return
		}
		seen++
	}
	if seen != len(c.accounts) {
		w.violate(GateJournal, fmt.Sprintf("%s: the store has %d accounts, %d were committed", why, seen, len(c.accounts)))
		return
	}
	for i := range snap.Reservations {
		r := &snap.Reservations[i]
		if rs := c.resv[r.ID]; rs == nil || rs.state != r.State {
			w.violate(GateJournal, fmt.Sprintf("%s: store reservation %s (%s) differs from everything committed", why, r.ID, r.State))
			return
		}
	}
	if len(snap.Reservations) != len(c.resv)-c.retired {
		w.violate(GateJournal, fmt.Sprintf("%s: the store has %d reservations, %d were committed and %d removed by retention", why, len(snap.Reservations), len(c.resv), c.retired))
		return
	}
	w.shardAudit(snap, why)
}

func auditGate(d ledger.Discrepancy) Gate {
	switch d.Check {
	case ledger.CheckConservation, ledger.CheckMoveAmounts:
		return GateConservation
	case ledger.CheckNegative, ledger.CheckBurst:
		return GateOverspend
	case ledger.CheckSpent, ledger.CheckDebt:
		return GateUnrecordedDebt
	case ledger.CheckRefundOnce:
		return GateDuplicateRefund
	case ledger.CheckMove:
		return GateDuplicateRecovery
	case ledger.CheckShard:
		return GateShardConservation
	case ledger.CheckCheckpoint:
		return GateCompaction
	}
	return GateJournal
}

// fmtDelta formats the non-zero terms of a journal delta, per dimension.
func fmtDelta(d *ledger.Balances, dims int) string {
	var parts []string
	for i := 0; i < dims; i++ {
		b := &d[i]
		terms := []struct {
			name string
			v    int64
		}{{"opening", b.Opening}, {"minted", b.Minted}, {"overdraftIssued", b.OverdraftIssued}, {"available", b.Available},
			{"reserved", b.Reserved}, {"spent", b.Spent}, {"retiredForEmergency", b.RetiredForEmergency},
			{"retiredForMove", b.RetiredForMove}, {"overdraftRepaid", b.OverdraftRepaid}}
		var nz []string
		for _, t := range terms {
			if t.v != 0 {
				nz = append(nz, fmt.Sprintf("%s%+d", t.name, t.v))
			}
		}
		parts = append(parts, fmt.Sprintf("[%d] %s", i, strings.Join(nz, " ")))
	}
	return strings.Join(parts, "; ")
}
