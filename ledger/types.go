// Package ledger is the pure capacity ledger: the domain types of the seed's
// schemas (admissionBudget.v1, limitReservation.v1, emergencyShard.v1), the
// commands that move capacity between the conservation terms, and the checks
// that prove nothing was created or lost.
//
// The package does no I/O, reads no clock, starts no goroutine and draws no
// random numbers: time, ids and digests arrive as arguments, and every row is
// read and written through a Book that the caller supplies (an in-memory one
// for tests and the simulator, a store transaction in the engine). The same
// code therefore runs in the simulator and in production.
package ledger

import (
	"cmp"
	"fmt"
	"math"
	"time"
)

// Units is an integer amount of capacity in one dimension (tokens, requests,
// ...). Accounting never uses floating point.
type Units = int64

// MaxUnits is the largest amount one policy term or one command may carry:
// 2^53, the largest integer every JSON client reads exactly. It keeps the
// cumulative int64 terms of an account thousands of maximal commands away
// from overflow; a larger amount is an invalid command, not a wrap-around.
const MaxUnits Units = 1 << 53

// MaxLifetimeUnits bounds the terms that grow with an account's use over
// its generation's life. A reserve (counting the holds outstanding), a
// settle and a shard issuance are refused with ErrLifetimeExhausted rather
// than take spent or retired for emergency above it, and a shard
// reconciliation rather than take its usage or the destination's retired
// for move above it. Overdraft issued by a settle is also spent, so it is
// bounded with it. The bound is 2^58, nine years of usage at a billion
// units a second; publishing a new generation gives the subject an account
// whose terms start again from its carried-over capacity.
//
// A settle or record is also refused rather than issue debt that would
// take the account's overdraft issued above the bound (debtRoom): that term
// counts the debt a generation switch moved in, so a subject that owes
// cannot carry its debt from generation to generation past the bound. A
// late settle on a superseded generation is likewise refused when the debt
// it forwards could take the subject's current account past it
// (forwardDebtRoom), and leaves its reservation STARTED.
//
// Not bounded yet: what drains move, and debt forwarded to an account
// other than the subject's current one (the deciding generation's, while
// the subject is frozen by debt in a unit that generation does not
// limit). Bounding those needs a design of its own.
const MaxLifetimeUnits Units = 1 << 58

// SumUnits is a + b, or the nearest int64 bound (math.MaxInt64 or
// math.MinInt64) when the sum would pass it. Totals over many accounts
// (DrainProgress's, GetFairness's, the debt metric's) use it: each term of
// an account is bounded, but a thousand accounts of 2^53 available (or 32
// owing 2^58) sum past int64, and a wrapped total reads as a negative
// balance; a capped one reads as "at least this much".
func SumUnits(a, b Units) Units {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// LatestTime is the latest deadline the ledger gives: the last instant of
// int64 Unix nanoseconds (2262-04-11T23:47:16.854775807Z), the range every
// store keeps times in. A policy may hold a hold TTL or an execution limit,
// and serve --shard-max-ttl may allow a shard TTL, up to the longest
// Duration (about 292 years), so now plus one can fall past it; such a
// deadline (a reservation's ExpiresAt and ExecutionDeadline, a shard's
// ExpiresAt) is LatestTime, as unreachable as the sum and storable.
var LatestTime = time.Unix(0, math.MaxInt64).UTC()

// deadline is now + d, or LatestTime when that is later.
func deadline(now time.Time, d time.Duration) time.Time {
	if t := now.Add(d); t.Before(LatestTime) {
		return t
	}
	return LatestTime
}

// MaxKeyBytes bounds each of an account key's subject, route and region:
// the PostgreSQL store keys accounts, policy heads, statements and
// checkpoints by the three together, and a btree index row is at most
// 2,704 bytes, so a longer key failed the whole batch's transaction as
// unavailable (which a client retries, and which failed the other commands
// of its batch with it) instead of being refused as invalid.
const MaxKeyBytes = 512

// KeyProblem says what is wrong with a subject, route and region (each
// by TextProblem with at most MaxKeyBytes), as "subject is 513 bytes
// long; at most 512"; "" when nothing is: the rule every command's shape
// checks and the server applies to every read that names an account.
func KeyProblem(subject, route, region string) string {
	if field, problem := KeyFieldProblem(subject, route, region); problem != "" {
		return field + " " + problem
	}
	return ""
}

// KeyFieldProblem is KeyProblem as the refused field's name ("subject",
// "route", "region") and what is wrong with it ("is 513 bytes long; at
// most 512"), for a caller that names the field by its own path; "", ""
// when nothing is.
func KeyFieldProblem(subject, route, region string) (field, problem string) {
	for _, f := range []struct{ name, value string }{{"subject", subject}, {"route", route}, {"region", region}} {
		if problem := TextProblem(f.value, MaxKeyBytes); problem != "" {
			return f.name, problem
		}
	}
	return "", ""
}

// RouteKeyProblem says why a policy or a rollout cannot name this route
// and region: the field ("route", "region") and what is wrong with it;
// "", "" when it can. "*" widens only subjects (AnySubject): a route or
// region "*" would be kept as a literal name that no gateway sends, so an
// operator who meant "every route" would publish a policy that governs
// nothing, and every reserve on the real routes would still find no
// policy.
func RouteKeyProblem(route, region string) (field, problem string) {
	switch AnySubject {
	case route:
		return "route", fmt.Sprintf("%q is not a wildcard (only a subject can be): publish one policy per route", AnySubject)
	case region:
		return "region", fmt.Sprintf("%q is not a wildcard (only a subject can be): publish one policy per region", AnySubject)
	}
	return "", ""
}

// KeyPartProblem says what is wrong with one of an account key's
// subject, route or region as a client names it (TextProblem with at
// most MaxKeyBytes), as a phrase that follows the field's name; "" for a
// good one. Empty passes: whether the field is required is the caller's
// rule.
func KeyPartProblem(value string) string { return TextProblem(value, MaxKeyBytes) }

// MaxFairnessWeight is the largest fairness weight a policy may give: the
// largest the gateway's fair scheduler takes (sched.MaxWeight), so that no
// published weight is clamped there.
const MaxFairnessWeight = 1 << 20

// MaxDimensions is how many capacity dimensions one policy may limit at once
// (for example input tokens, output tokens, requests, cost). Amounts are fixed
// arrays of this size so that a command allocates nothing for them.
const MaxDimensions = 4

// Amounts holds one amount per dimension, in the order of the policy's
// Dimensions; entries past the policy's dimension count are zero.
type Amounts [MaxDimensions]Units

// Schema names of the seed's documents.
const (
	SchemaPolicy      = "admissionBudget.v1"
	SchemaReservation = "limitReservation.v1"
	SchemaShard       = "emergencyShard.v1"
)

// AnySubject is the subject key of a policy that applies to every subject on
// its route and region that has no policy of its own.
const AnySubject = "*"

// RolloutMode says whether a policy's decisions are enforced.
type RolloutMode string

const (
	// RolloutEnforce admits and rejects for real.
	RolloutEnforce RolloutMode = "enforce"
	// RolloutShadow reserves what fits, and answers a capacity rejection as
	// admitted-in-shadow: the decision is recorded, the caller is not stopped.
	RolloutShadow RolloutMode = "shadow"
)

// PolicyKey names what a policy limits. Subject may be AnySubject.
type PolicyKey struct {
	Subject string
	Route   string
	Region  string
}

func (k PolicyKey) String() string { return k.Subject + "/" + k.Route + "@" + k.Region }

// Compare orders policy keys by subject, route, then region (-1, 0 or +1).
func (k PolicyKey) Compare(o PolicyKey) int {
	return cmp.Or(cmp.Compare(k.Subject, o.Subject), cmp.Compare(k.Route, o.Route), cmp.Compare(k.Region, o.Region))
}

// Dimension is one limited quantity of a policy: a token bucket with a
// reservation cap and an overdraft allowance.
type Dimension struct {
	// Unit names the capacity unit ("tokens", "requests").
	Unit string
	// RefillUnits are minted every RefillInterval (RFC 2697's committed rate,
	// as integers).
	RefillUnits    Units
	RefillInterval time.Duration
	// Burst caps available + reserved: refill never mints beyond it, so a
	// refund can never lift capacity above it either.
	Burst Units
	// MaxReservation is the largest single reservation (0: Burst).
	MaxReservation Units
	// MaxOverdraft is the debt one settle may create without a breach
	// (overuse that available covers is no debt). More debt is still
	// recorded in full (a breach), never dropped.
	MaxOverdraft Units
}

// Refills reports whether the dimension mints capacity over time: whole
// RefillUnits per whole RefillInterval, so it needs both above zero. For a
// validated policy this is RefillUnits > 0 alone (Validate refuses
// refillUnits with an interval of 0 or less, and an interval with no units
// mints nothing); the interval is checked too so that a caller holding an
// unvalidated or zero Dimension (a console row, a hand-built policy) never
// divides by a zero interval or counts a negative one. Every decision
// "does this dimension refill" asks here.
func (d Dimension) Refills() bool { return d.RefillUnits > 0 && d.RefillInterval > 0 }

// Policy is admissionBudget.v1: one immutable generation of the limits for a
// subject (or every subject) on a route in a region.
type Policy struct {
	Key             PolicyKey
	Generation      uint64
	Dimensions      []Dimension
	EstimatorDigest string
	// HoldTTL is how long a reservation may stay RESERVED before expiry may
	// take it back.
	HoldTTL time.Duration
	// ExecutionLimit is the hard limit on STARTED work: past it the engine
	// marks the reservation USAGE_UNKNOWN, and a settle arriving later is
	// recorded in full and counted as a breach.
	ExecutionLimit time.Duration
	Priority       int
	FairnessWeight int64
	// FairnessBudget is the tolerated relative fairness error (sched);
	// a ratio, not accounting, hence a float.
	FairnessBudget float64
	EmergencyMode  bool
	Rollout        RolloutMode
	// EpochLength is the accounting epoch (book period) of the policy's
	// accounts.
	EpochLength time.Duration
	PublishedAt time.Time
	// RolledBack is set by a rollback: the generation admits nothing more,
	// while settlement, debt and shard reconciliation go on.
	RolledBack bool
}

// DimensionIndex returns the index of the named unit, or -1.
func (p *Policy) DimensionIndex(unit string) int {
	for i := range p.Dimensions {
		if p.Dimensions[i].Unit == unit {
			return i
		}
	}
	return -1
}

// PolicyHead is the per-key pointer to the generation that admits now.
// Active is 0 when no generation of the key admits (all rolled back).
type PolicyHead struct {
	Key    PolicyKey
	Active uint64
	Latest uint64
}

// AccountKey names one account: a concrete subject on a route and region
// under one policy generation.
type AccountKey struct {
	Subject    string
	Route      string
	Region     string
	Generation uint64
}

func (k AccountKey) String() string {
	return fmt.Sprintf("%s/%s@%s#%d", k.Subject, k.Route, k.Region, k.Generation)
}

// SubjectKey returns the key without the generation.
func (k AccountKey) SubjectKey() PolicyKey {
	return PolicyKey{Subject: k.Subject, Route: k.Route, Region: k.Region}
}

// Compare orders account keys by subject, route, region, then generation
// (-1, 0 or +1): locks over several accounts are taken in this order, and
// the stores list accounts in it.
func (k AccountKey) Compare(o AccountKey) int {
	return cmp.Or(k.SubjectKey().Compare(o.SubjectKey()), cmp.Compare(k.Generation, o.Generation))
}

// Balance holds the seed's conservation terms for one dimension:
//
//	Opening + Minted + OverdraftIssued =
//	    Available + Reserved + Spent + RetiredForEmergency + RetiredForMove + OverdraftRepaid
//
// The seed's retired term is split in two named sub-terms: capacity carved
// out into emergency shards, and capacity moved to another account (a
// generation switch or a forward of a late refund). All terms are cumulative
// over the account's life and never negative.
type Balance struct {
	Opening             Units
	Minted              Units
	OverdraftIssued     Units
	Available           Units
	Reserved            Units
	Spent               Units
	RetiredForEmergency Units
	RetiredForMove      Units
	OverdraftRepaid     Units
}

// Debt is overdraftIssued - overdraftRepaid.
func (b *Balance) Debt() Units { return b.OverdraftIssued - b.OverdraftRepaid }

// Sources is the left side of the conservation equation.
func (b *Balance) Sources() Units { return b.Opening + b.Minted + b.OverdraftIssued }

// Uses is the right side of the conservation equation.
func (b *Balance) Uses() Units {
	return b.Available + b.Reserved + b.Spent + b.RetiredForEmergency + b.RetiredForMove + b.OverdraftRepaid
}

func (b *Balance) add(d *Balance) {
	b.Opening += d.Opening
	b.Minted += d.Minted
	b.OverdraftIssued += d.OverdraftIssued
	b.Available += d.Available
	b.Reserved += d.Reserved
	b.Spent += d.Spent
	b.RetiredForEmergency += d.RetiredForEmergency
	b.RetiredForMove += d.RetiredForMove
	b.OverdraftRepaid += d.OverdraftRepaid
}

// Balances is one Balance per dimension.
type Balances [MaxDimensions]Balance

// Add adds d term by term.
func (b *Balances) Add(d *Balances) {
	for i := range b {
		b[i].add(&d[i])
	}
}

// Account is one (subject, route, region, generation) book. The lock key of
// the seed, (subject, route, accountingEpoch, policyGeneration), is this row:
// the epoch is a field of it, so every command on the account in any epoch
// takes the same lock.
type Account struct {
	// The fields every command reads come first and the epoch's opening
	// vector, read only when an epoch closes, last: a command on an
	// account that is not in the cache then misses on fewer cache lines.
	Key AccountKey
	// Dims is the number of dimensions in use (the policy's).
	Dims int
	// EpochStart is the current accounting epoch; EpochOpening is the term
	// vector at its start, which the epoch's statement reports as opening.
	EpochStart time.Time
	// RefilledTo is the lazy refill cursor per dimension, in Unix
	// nanoseconds: the time up to which minting was done.
	RefilledTo [MaxDimensions]int64
	// Version increases with every change; stores may use it.
	Version uint64
	// Breaches counts settles whose overuse exceeded the policy's max
	// overdraft or came after its execution limit.
	Breaches int64
	Balances Balances
	// HeldElsewhere is, per dimension, what the subject's other accounts
	// (other generations') hold reserved in the same unit while this one
	// is current: its refill, and what a move or a remint brings in, stay
	// under the burst less its own holds and these (carryHeld). It is a
	// counter, not a balance term: it is 0 on an account that is not
	// current, moves to the new current account whenever the current
	// pointer moves, and drops when such a hold ends (forward). Audit
	// does not check it: a Snapshot holds no current pointer, and in a
	// unit left behind the count is below the holds (carryHeld).
	HeldElsewhere Amounts
	EpochOpening  Balances
}

// Debt reports whether any dimension carries debt; an account with debt
// admits nothing.
func (a *Account) Debt() (dim int, debt Units) {
	for i := 0; i < a.Dims; i++ {
		if d := a.Balances[i].Debt(); d > 0 {
			return i, d
		}
	}
	return -1, 0
}

// State is a reservation's lifecycle state (limitReservation.v1).
type State uint8

const (
	StateRequested State = iota
	StateReserved
	StateStarted
	StateSettled
	StateSettledWithDebt
	StateReleased
	StateExpiring
	StateExpired
	StateUsageUnknown
	// StateReservationUnknown is a caller-side state: the reserve answer was
	// lost. The ledger never stores it; the caller resolves it by reading the
	// original reservation id.
	StateReservationUnknown
)

var stateNames = [...]string{
	StateRequested:          "REQUESTED",
	StateReserved:           "RESERVED",
	StateStarted:            "STARTED",
	StateSettled:            "SETTLED",
	StateSettledWithDebt:    "SETTLED_WITH_DEBT",
	StateReleased:           "RELEASED",
	StateExpiring:           "EXPIRING",
	StateExpired:            "EXPIRED",
	StateUsageUnknown:       "USAGE_UNKNOWN",
	StateReservationUnknown: "RESERVATION_UNKNOWN",
}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// ParseState returns the state named name (as String prints it).
func ParseState(name string) (State, bool) {
	for i, n := range stateNames {
		if n == name {
			return State(i), true
		}
	}
	return 0, false
}

// Holds reports whether a reservation in this state still holds capacity in
// the account's Reserved term. USAGE_UNKNOWN holds: unknown usage is never
// treated as unconsumed.
func (s State) Holds() bool {
	return s == StateReserved || s == StateStarted || s == StateExpiring || s == StateUsageUnknown
}

// Stored reports whether a reservation row can be in this state:
// REQUESTED exists only inside a reserve command (a rejected reserve
// stores no row) and RESERVATION_UNKNOWN only at the caller.
func (s State) Stored() bool {
	return s >= StateReserved && s <= StateUsageUnknown
}

// StoredStates are the states a reservation row can be in, in order.
var StoredStates = []State{StateReserved, StateStarted, StateSettled, StateSettledWithDebt,
	StateReleased, StateExpiring, StateExpired, StateUsageUnknown}

// Terminal reports whether no further transition is possible.
func (s State) Terminal() bool {
	return s == StateSettled || s == StateSettledWithDebt || s == StateReleased || s == StateExpired
}

// Reservation is limitReservation.v1.
type Reservation struct {
	ID            string
	RequestDigest string
	Account       AccountKey
	// AccountingEpoch is the epoch the reservation was admitted in.
	AccountingEpoch time.Time
	Reserved        Amounts
	Actual          Amounts
	// Overdraft is the part of Actual recorded as debt at settlement.
	Overdraft   Amounts
	OperationID string
	State       State
	CreatedAt   time.Time
	ExpiresAt   time.Time
	StartedAt   time.Time
	// ExecutionDeadline is StartedAt plus the policy's execution limit
	// (zero without a limit): past it, the engine marks STARTED work
	// USAGE_UNKNOWN.
	ExecutionDeadline time.Time
	// UnknownAt is when the reservation was marked USAGE_UNKNOWN (zero if
	// it never was). It stays after a later settle, like StartedAt, and
	// is what the USAGE_UNKNOWN backlog orders and ages by: work that ran
	// long before its gateway gave up has waited for a receipt only since
	// then.
	UnknownAt  time.Time
	FinishedAt time.Time
	// Breach is set when the settle exceeded the max overdraft or the
	// execution limit.
	Breach bool
	// Retired is never stored: it is set only on a receipt answered from
	// a Tombstone, after retention removed the reservation's row. Such a
	// receipt carries only what the tombstone keeps (ID, RequestDigest,
	// Account, State, FinishedAt); its amounts are zero.
	Retired bool
}

// Refund returns what settlement (or release, or expiry) gave back to
// available: reserved minus actual, floored at zero per dimension.
func (r *Reservation) Refund() Amounts {
	var out Amounts
	if r.State == StateReleased || r.State == StateExpired {
		return r.Reserved
	}
	if r.State != StateSettled && r.State != StateSettledWithDebt {
		return out
	}
	for i := range out {
		if d := r.Reserved[i] - r.Actual[i]; d > 0 {
			out[i] = d
		}
	}
	return out
}

// Move is the receipt of an exactly-once move of capacity between two
// accounts: retired at From, minted at To. Units is what left From's
// available; Debt is overdraft assumed by To on From's behalf (To issues it
// and retires it, From mints it and repays its debt).
type Move struct {
	ReceiptID string
	Kind      MoveKind
	From      AccountKey
	To        AccountKey
	Units     Amounts
	Debt      Amounts
	At        time.Time
}

// MoveKind says why capacity moved.
type MoveKind uint8

const (
	// MoveGenerationSwitch carries an account's available capacity and debt
	// to the account of the generation that became active.
	MoveGenerationSwitch MoveKind = iota + 1
	// MoveForward carries a late refund or late debt from a superseded
	// generation to the active one.
	MoveForward
	// MoveShardRemint mints confirmed-unused emergency shard capacity into
	// the active generation.
	MoveShardRemint
)

func (k MoveKind) String() string {
	switch k {
	case MoveGenerationSwitch:
		return "generation_switch"
	case MoveForward:
		return "forward"
	case MoveShardRemint:
		return "shard_remint"
	}
	return fmt.Sprintf("MoveKind(%d)", k)
}

// Statement closes one accounting epoch of an account. Opening is the term
// vector at the epoch's start, Closing at its end; the next statement's
// Opening equals this Closing.
type Statement struct {
	Account    AccountKey
	EpochStart time.Time
	EpochEnd   time.Time
	Dims       int
	Opening    Balances
	Closing    Balances
}

// JournalEntry records one command's effect on one account: the term
// deltas, and the reservation transition if any. Replaying every entry of an
// account over a zero Balances must give the account's Balances.
type JournalEntry struct {
	At            time.Time
	Kind          Kind
	Account       AccountKey
	ReservationID string
	From, To      State
	// ReceiptID names the move or shard the entry belongs to.
	ReceiptID string
	Delta     Balances
}

// Begins reports whether e admits its reservation: a reserve or record,
// from REQUESTED, the first entry of a life of the id. An id lives more
// than once when a client reuses it after retention removed it and its
// tombstone horizon passed (API.md, "Retention: removed reservations").
func (e *JournalEntry) Begins() bool {
	return e.ReservationID != "" && e.From == StateRequested && e.To != StateRequested
}

// Forgets reports whether e is the end of a tombstone (KindForget):
// after it, the id may be admitted again as a new life.
func (e *JournalEntry) Forgets() bool {
	return e.ReservationID != "" && e.Kind == KindForget
}

// Ends reports whether e ends its reservation: the move into a terminal
// state, which settles or refunds it and must happen once per life (a
// record both begins and ends one).
func (e *JournalEntry) Ends() bool {
	return e.ReservationID != "" && e.To.Terminal() && e.From != e.To
}
