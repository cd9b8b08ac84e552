package ledger

import (
	"errors"
	"time"
)

// Kind names a command.
type Kind uint8

const (
	KindPublishPolicy Kind = iota + 1
	KindRollbackPolicy
	KindReserve
	KindStart
	KindSettle
	KindRelease
	KindExpireClaim
	KindExpire
	KindMarkUsageUnknown
	KindRefill
	KindCloseEpoch
	KindDrain
	KindShardIssue
	KindShardReconcile
	KindRetire
	KindForget
	// KindRecord is appended last: kinds are stored by number.
	KindRecord
)

var kindNames = [...]string{
	KindPublishPolicy:    "publish_policy",
	KindRollbackPolicy:   "rollback_policy",
	KindReserve:          "reserve",
	KindStart:            "start",
	KindSettle:           "settle",
	KindRelease:          "release",
	KindExpireClaim:      "expire_claim",
	KindExpire:           "expire",
	KindMarkUsageUnknown: "mark_usage_unknown",
	KindRefill:           "refill",
	KindCloseEpoch:       "close_epoch",
	KindDrain:            "drain",
	KindShardIssue:       "shard_issue",
	KindShardReconcile:   "shard_reconcile",
	KindRetire:           "retire",
	KindForget:           "forget",
	KindRecord:           "record",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// ParseKind returns the kind named name.
func ParseKind(name string) (Kind, bool) {
	for i, n := range kindNames {
		if n != "" && n == name {
			return Kind(i), true
		}
	}
	return 0, false
}

// Command is one request to the ledger. Which fields matter depends on Kind;
// see the function of each kind (Reserve, Start, ...).
type Command struct {
	Kind Kind
	// ReservationID is chosen by the caller and is the idempotency key of
	// reserve, start, settle, record, release, expiry and unknown marking.
	ReservationID string
	// RequestDigest is the caller's canonical request digest (reserve,
	// record).
	RequestDigest string
	// Subject, Route, Region name the capacity (reserve, record).
	Subject, Route, Region string
	// Units are the estimate (reserve) or the actual usage (settle,
	// record), in the order of the policy's dimensions.
	Units Amounts
	// OperationID binds the execution (start) and proves it (settle,
	// record).
	OperationID string
	// Policy is the policy to publish.
	Policy *Policy
	// PolicyKey and Generation name the generation to roll back. On
	// reserve and record, a non-zero Generation is the generation whose
	// dimension order Units were put in (a caller mapping unit names to
	// positions): if another generation decides, the command is refused
	// rather than charging amounts to the wrong dimensions. On publish, a
	// non-zero Generation is the generation Policy was edited from: unless
	// it is still the active one of the policy's key (or the terms replay),
	// the publish is refused with ErrPolicyGenerationChanged.
	PolicyKey  PolicyKey
	Generation uint64
	// Account names the account of refill, close-epoch and drain.
	Account AccountKey
	// CheckedAccount, when set on a command naming a reservation by id
	// alone (start, settle, release, expiry, unknown marking), is the
	// account the caller found that reservation in when it checked that
	// it may act on it (a scoped token's check; the reservation whose
	// generation mapped a settle's units). A reservation or tombstone of
	// another account under the id took it after that check (retention
	// forgot the checked one, and the id was reused): the command answers
	// exactly as for an unknown id (ErrReservationNotFound), so it never
	// acts on it nor says anything about it. Zero: no check.
	CheckedAccount AccountKey
	// Shard carries the arguments of shard issuance and reconciliation.
	Shard *ShardArgs
	// Cause is why an expiry or unknown-marking command may act. The zero
	// value, CauseRequest, is an explicit request (a gateway's or an
	// operator's MarkUsageUnknown); the expiry worker sends
	// CauseHoldExpired and the execution-limit worker CauseExecutionLimit,
	// and the ledger refuses the command when its cause does not hold at
	// the moment it is applied (see MarkUsageUnknownFor).
	Cause Cause
	// Rollout, when set on a reserve, is the mode RolloutModeFor decided
	// for the request (its route belongs to a rollout): it replaces the
	// deciding policy's own mode. Empty: the policy's mode decides.
	Rollout RolloutMode
	// Before is the cutoff of retire and forget: only a reservation that
	// finished at or before it is removed (retire), only a tombstone of
	// one is dropped (forget).
	Before time.Time
	// ForgetBefore, when set on a retire, is the tombstone horizon's
	// cutoff: a reservation that finished at or before it is removed
	// without a tombstone (Retire).
	ForgetBefore time.Time
}

// Cause is the reason a maintenance command acts on a reservation.
type Cause uint8

const (
	// CauseRequest: somebody asked (MarkUsageUnknown over the API).
	CauseRequest Cause = iota
	// CauseHoldExpired: a RESERVED hold ran past its ExpiresAt.
	CauseHoldExpired
	// CauseExecutionLimit: STARTED work ran past its ExecutionDeadline.
	CauseExecutionLimit
)

func (c Cause) String() string {
	switch c {
	case CauseRequest:
		return "request"
	case CauseHoldExpired:
		return "hold_expired"
	case CauseExecutionLimit:
		return "execution_limit"
	}
	return "unknown"
}

// Result is a command's outcome. Err is nil on success, or one of the
// sentence-named errors below (possibly wrapped with detail); those are
// expected outcomes, not failures of the ledger.
type Result struct {
	Err error
	// Reservation is the receipt after the command (reservation commands).
	Reservation Reservation
	// Replayed is true when the command had already been applied and this
	// answer repeats its receipt without changing anything.
	Replayed bool
	// Refunded is what this command returned to available (settle,
	// release, expire). A replay reports zero: nothing was refunded twice.
	Refunded Amounts
	// Generation is the policy generation that decided (reserve, record,
	// rejection) or was published / rolled back.
	Generation uint64
	// Dimension is the limiting dimension's unit on a capacity rejection.
	Dimension string
	// RetryAfter is a conservative wait before the rejected reserve could
	// succeed, from the refill rule and the debt; 0 when no refill can help.
	RetryAfter time.Duration
	// Shadow is set when a shadow-mode policy would have rejected: Err says
	// why, but the caller is not to be stopped.
	Shadow bool
	// Shard is the issued or reconciled shard.
	Shard *Shard
	// Available is the account's available units per dimension right after
	// a reserve decided (admitted or not; refill applied) or a record
	// charged, for adapters
	// that report what is left (Envoy's limit_remaining) without reading
	// the account again. Zero for other commands.
	Available Amounts
	// Move is the receipt of a drain or remint.
	Move *Move
}

// OK reports whether the command succeeded (possibly as a replay).
func (r *Result) OK() bool { return r.Err == nil }

// Rejected reports whether the error is a capacity rejection (429).
func (r *Result) Rejected() bool {
	return errors.Is(r.Err, ErrInsufficientCapacity) || errors.Is(r.Err, ErrAdmissionFrozen) ||
		errors.Is(r.Err, ErrReservationTooLarge)
}

// Expected outcomes. Each is a distinct, documented answer of the API.
var (
	// ErrInsufficientCapacity: the reservation does not fit in available.
	ErrInsufficientCapacity = errors.New("insufficient capacity")
	// ErrAdmissionFrozen: the account carries debt; nothing is admitted until
	// refills have repaid it.
	ErrAdmissionFrozen = errors.New("admission frozen until debt is repaid")
	// ErrReservationTooLarge: the estimate exceeds the policy's maximum single
	// reservation (or the burst), so it can never fit.
	ErrReservationTooLarge = errors.New("reservation larger than the policy allows")
	// ErrNoPolicy: no policy generation admits for the subject, route and
	// region.
	ErrNoPolicy = errors.New("no active policy")
	// ErrDigestMismatch: the reservation id exists with another request
	// digest; the same id may not name two requests.
	ErrDigestMismatch = errors.New("reservation id reused with a different request digest")
	// ErrReservationNotFound: no reservation has this id.
	ErrReservationNotFound = errors.New("reservation not found")
	// ErrReservationNotStarted: settle or unknown-marking of a reservation
	// that was never started.
	ErrReservationNotStarted = errors.New("reservation not started")
	// ErrReservationAlreadyStarted: release or expiry of started work, which
	// may still be using its capacity.
	ErrReservationAlreadyStarted = errors.New("reservation already started")
	// ErrOperationMismatch: the operation id differs from the one bound at
	// start.
	ErrOperationMismatch = errors.New("operation id does not match the started operation")
	// ErrReservationAlreadySettled: a settle that differs from the recorded
	// one, or another transition after settlement.
	ErrReservationAlreadySettled = errors.New("reservation already settled")
	// ErrReservationReleased: the reservation was released.
	ErrReservationReleased = errors.New("reservation released")
	// ErrReservationExpired: the reservation is expiring or expired.
	ErrReservationExpired = errors.New("reservation expired")
	// ErrReservationNotDue: expiry asked before the hold ran out, or the
	// execution-limit worker's unknown-marking of work that has no
	// execution deadline or whose deadline has not passed.
	ErrReservationNotDue = errors.New("reservation is not due")
	// ErrInvalidCommand: malformed arguments (missing id, negative units...).
	ErrInvalidCommand = errors.New("invalid command")
	// ErrInvalidPolicy: the policy fails validation.
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrPolicyNotFound: rollback of a generation that does not exist.
	ErrPolicyNotFound = errors.New("policy generation not found")
	// ErrPolicyGenerationChanged: a publish edited from a generation that
	// is no longer the active one of its key (see Command.Generation).
	ErrPolicyGenerationChanged = errors.New("policy generation changed")
	// ErrAccountNotFound: refill, close-epoch or drain of an unknown account.
	ErrAccountNotFound = errors.New("account not found")
	// ErrNothingToDrain: drain of an account that is current or empty.
	ErrNothingToDrain = errors.New("nothing to drain")
	// ErrEmergencyDisabled: shard issuance under a policy whose emergency
	// mode is off.
	ErrEmergencyDisabled = errors.New("emergency mode disabled by policy")
	// ErrShardNotFound, ErrShardAlreadyReconciled, ErrShardForeign: shard
	// reconciliation outcomes.
	ErrShardNotFound          = errors.New("shard not found")
	ErrShardAlreadyReconciled = errors.New("shard already reconciled")
	ErrShardForeign           = errors.New("shard belongs to another gateway")
	// ErrLifetimeExhausted: the command would take one of the account's
	// lifetime terms above MaxLifetimeUnits (see there). Nothing changed;
	// a new generation of the policy gives the subject a fresh account.
	ErrLifetimeExhausted = errors.New("account lifetime counters exhausted")
	// ErrReservationNotFinished: retire of a reservation that is not
	// terminal (RESERVED, STARTED, EXPIRING, USAGE_UNKNOWN), which
	// retention never removes.
	ErrReservationNotFinished = errors.New("reservation not finished")
)

// Apply runs one command against the book at time now and returns its
// outcome. It is the single entry point the engine, the simulator and the
// tests use.
func Apply(b Book, cmd *Command, now time.Time) (res Result) {
	switch cmd.Kind {
	case KindPublishPolicy:
		return publishPolicy(b, cmd.Policy, cmd.Generation, now)
	case KindRollbackPolicy:
		return RollbackPolicy(b, cmd.PolicyKey, cmd.Generation, now)
	case KindReserve:
		reserve(b, cmd, now, &res)
		return res
	case KindStart:
		start(b, cmd.ReservationID, cmd.OperationID, cmd.CheckedAccount, now, &res)
		return res
	case KindSettle:
		settle(b, cmd.ReservationID, cmd.OperationID, cmd.Units, cmd.CheckedAccount, now, &res)
		return res
	case KindRelease:
		return release(b, cmd.ReservationID, cmd.CheckedAccount, now)
	case KindExpireClaim, KindExpire:
		if cmd.Cause != CauseRequest && cmd.Cause != CauseHoldExpired {
			return Result{Err: invalid("%s with cause %s: expiry acts only on a hold that ran out", cmd.Kind, cmd.Cause)}
		}
		if cmd.Kind == KindExpireClaim {
			return expireClaim(b, cmd.ReservationID, cmd.CheckedAccount, now)
		}
		return expire(b, cmd.ReservationID, cmd.CheckedAccount, now)
	case KindMarkUsageUnknown:
		return markUsageUnknown(b, cmd.ReservationID, cmd.Cause, cmd.CheckedAccount, now)
	case KindRefill:
		return Refill(b, cmd.Account, now)
	case KindCloseEpoch:
		return CloseEpoch(b, cmd.Account, now)
	case KindDrain:
		return Drain(b, cmd.Account, now)
	case KindShardIssue:
		return IssueShard(b, cmd, now)
	case KindShardReconcile:
		return ReconcileShard(b, cmd.Shard, now)
	case KindRetire:
		return Retire(b, cmd.ReservationID, cmd.Before, cmd.ForgetBefore, now)
	case KindForget:
		return Forget(b, cmd.ReservationID, cmd.Before, now)
	case KindRecord:
		return Record(b, cmd, now)
	}
	return Result{Err: invalid("unknown command kind %d", cmd.Kind)}
}
