package ledger

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Shard is emergencyShard.v1: capacity moved from an account's available
// into RetiredForEmergency while the ledger was healthy, handed to one
// gateway process (identity + boot epoch) to spend while it cannot reach the
// ledger. The gateway's local ledger (ShardLocal) keeps
// allocated = localAvailable + localReserved + localSpent + localRetired.
//
// The fields up to Signature are the signed document (see ShardCanonical);
// the rest is the central ledger's reconciliation record. Once Reconciled,
// Spent + Unknown + Reminted = Allocated in every dimension, and receipts
// that arrive later only move capacity out of Unknown.
type Shard struct {
	ID        string
	Account   AccountKey
	GatewayID string
	// BootEpoch identifies the gateway process; a restarted process has a
	// new one and cannot spend an older process's shard.
	BootEpoch uint64
	// Fence increases with every issuance to the gateway; a shard with an
	// older fence than the newest the gateway holds is dead.
	Fence     uint64
	Allocated Amounts
	IssuedAt  time.Time
	ExpiresAt time.Time
	KeyID     string
	Signature []byte

	// Reconciled is set once the gateway's terminal receipts were accepted.
	Reconciled bool
	// Spent is confirmed used capacity, Unknown is capacity whose usage is
	// still unknown (stays retired until a receipt resolves it), Reminted is
	// confirmed-unused capacity minted back into the active generation.
	Spent    Amounts
	Unknown  Amounts
	Reminted Amounts
}

// ShardArgs are the shard-specific arguments of KindShardIssue and
// KindShardReconcile. The subject, route, region, units and (optionally)
// generation of an issuance travel in the Command itself, as for Reserve.
type ShardArgs struct {
	// ShardID is chosen by the caller and is the idempotency key of
	// issuance; reconciliation names the shard it reports on.
	ShardID string
	// GatewayID is the gateway the shard is issued to, or (reconcile) the
	// gateway reporting: only the shard's own gateway may reconcile it.
	GatewayID string
	// BootEpoch is the gateway process's boot epoch (issue).
	BootEpoch uint64
	// TTL is how long the shard may be spent from its issuance (issue).
	TTL time.Duration
	// KeyID names the signing key and Sign signs with it (issue). Sign must
	// be deterministic (Ed25519 is): a batch that lost a race is applied
	// again and must produce the same row. The ledger holds no keys; the
	// engine or server that does hands these in.
	KeyID string
	Sign  func(canonical []byte) []byte
	// Receipts are the gateway's local receipts (reconcile).
	Receipts []ShardReceipt
	// Legacy carves a legacy limiter's budget (legacy.go): GatewayID must
	// be a LegacyGateway id, and the deciding policy's emergency mode is
	// not required. Without it a legacy gateway id is refused.
	Legacy bool
}

// ShardReceipt is one local reservation of a shard as its gateway reports
// it at reconciliation. States:
//   - SETTLED / SETTLED_WITH_DEBT: Actual was used (confirmed spent);
//   - RELEASED / EXPIRED: nothing was used;
//   - STARTED / USAGE_UNKNOWN: the usage is unknown, Reserved stays retired
//     until a later receipt for the same id resolves it.
//
// RESERVED is refused: the gateway releases unstarted holds before it
// reports (ShardLocal.Seal does).
type ShardReceipt struct {
	ReservationID string
	State         State
	Reserved      Amounts
	Actual        Amounts
}

// unknown reports whether the receipt leaves its usage unknown.
func (r *ShardReceipt) unknown() bool {
	return r.State == StateStarted || r.State == StateUsageUnknown
}

// Shard outcomes besides ErrShardNotFound, ErrShardAlreadyReconciled and
// ErrShardForeign (command.go) and the verification errors (shard_sign.go).
var (
	// ErrShardIDReused: issuance under a shard id that names a different
	// shard (another gateway, boot epoch, subject or allocation).
	ErrShardIDReused = errors.New("shard id reused for a different shard")
	// ErrShardReceiptContradicts: a later receipt says RELEASED or EXPIRED
	// for a reservation an earlier submission reported STARTED or
	// USAGE_UNKNOWN. Started work cannot be released: only a settled
	// receipt (with its actual usage) resolves unknown shard work.
	ErrShardReceiptContradicts = errors.New("shard receipt contradicts an earlier report")
)

// ShardReceiptStanding is where one receipt of a reconciled shard stands
// centrally (see ShardReceiptStandingOf).
type ShardReceiptStanding int

const (
	// ShardReceiptNotPending: no unknown usage is held for the id (it was
	// reported terminal in the first accepted submission, or never).
	ShardReceiptNotPending ShardReceiptStanding = iota
	// ShardReceiptPending: reported unknown, waiting for a settled receipt.
	ShardReceiptPending
	// ShardReceiptResolved: reported unknown, resolved by a later
	// submission.
	ShardReceiptResolved
)

func (s ShardReceiptStanding) String() string {
	switch s {
	case ShardReceiptPending:
		return "pending"
	case ShardReceiptResolved:
		return "resolved"
	}
	return "not pending"
}

// MetaShardReceipt is the Meta name whose value ShardReceiptStandingOf
// reads: a receipt's standing in its shard's reconciliation.
func MetaShardReceipt(shardID, receiptID string) string { return metaShardPending(shardID, receiptID) }

// ShardReceiptStandingOf returns the standing a MetaShardReceipt counter
// value records.
func ShardReceiptStandingOf(v int64) ShardReceiptStanding {
	switch v {
	case pendingUnknown:
		return ShardReceiptPending
	case pendingResolved:
		return ShardReceiptResolved
	}
	return ShardReceiptNotPending
}

// Meta counter names of emergency shards. Every per-shard name is only
// read and written by commands that hold the shard's row, so replicas
// serialise on the row.
const (
	// MetaShardRefused counts refused reconciliation submissions (a second
	// submission, one from another gateway, a receipt resolved twice).
	MetaShardRefused = "shard_refused"
	// MetaShardRemints counts remint moves (one per accepted submission
	// that reminted or charged anything).
	MetaShardRemints = "shard_remints"
)

// MetaShardFence is the Meta name of the newest fence issued to a gateway.
func MetaShardFence(gatewayID string) string { return MetaShardFencePrefix + gatewayID }

// MetaShardFencePrefix begins every MetaShardFence name.
const MetaShardFencePrefix = "shard_fence/"

// MetaShardFenceFloor is the Meta name of the fence floor: at least every
// fence whose MetaShardFence row retention removed (FoldShardFences).
// A gateway without a row starts above it (nextShardFence), so a gateway
// whose row was removed and that comes back (a pod name reused, a process
// restarted after days) is never handed a fence it held before. It sorts
// after every MetaShardFence name ('_' > '/'), so a writer that reads a
// gateway's row and then the floor takes the rows in one order.
const MetaShardFenceFloor = "shard_fence_floor"

// nextShardFence returns the fence of a gateway's next shard: one above
// its row, which holds the newest fence it was issued; for a gateway
// without a row (never issued a shard, or its row folded), one above the
// fence floor. The floor is read only then: a row, once written, is
// above every fence its gateway held (it was written from the floor if
// it was folded before), so issuances to gateways that have one do not
// all read, and on PostgreSQL lock, the one floor row.
func nextShardFence(b Book, gatewayID string) uint64 {
	own := b.Meta(MetaShardFence(gatewayID))
	if own == 0 {
		own = b.Meta(MetaShardFenceFloor)
	}
	return uint64(own) + 1
}

// FoldShardFences removes the MetaShardFence rows of gateways and raises
// the fence floor to at least each removed fence, so that nextShardFence
// stays above every fence the gateways held. It is always safe for the
// fences' order (a gateway named here that was issued a shard meanwhile
// only sees its next fence come from the floor); retention names
// gateways whose shards all expired a window ago, so the rows removed
// are those of gateways gone quiet, and a store keeps one row per
// gateway active within the window instead of one per gateway ever seen.
// It returns how many rows it removed.
func FoldShardFences(b MetaRemover, gateways []string) int {
	floor := b.Meta(MetaShardFenceFloor)
	raised := floor
	removed := 0
	for _, g := range gateways {
		name := MetaShardFence(g)
		v := b.Meta(name)
		if v == 0 {
			continue
		}
		raised = max(raised, v)
		b.MetaRemove(name)
		removed++
	}
	if raised != floor {
		b.MetaPut(MetaShardFenceFloor, raised)
	}
	return removed
}

// MetaRemover is a Book's meta counters with removal: what FoldShardFences
// needs (its caller is retention, not a command of Apply).
type MetaRemover interface {
	Meta(name string) int64
	MetaPut(name string, value int64)
	// MetaRemove deletes the named counter; Meta then returns 0.
	MetaRemove(name string)
}

// MetaShardRefusedFor is the Meta name counting refused submissions for
// one shard.
func MetaShardRefusedFor(shardID string) string { return "shard_refused/" + shardID }

// metaShardMoves counts a shard's remint moves; it numbers their receipts.
func metaShardMoves(shardID string) string { return "shard_moves/" + shardID }

// metaShardPending is 1 while a receipt's usage is unknown, 2 once resolved
// (0: the receipt was never reported unknown). metaShardPendingUnits holds
// the units it left unknown in dimension d.
//
// Both ids are escaped (metaNamePart): ids may hold "/", and joined as they
// are, shard "a"'s receipt "b/c" and shard "a/b"'s receipt "c" (another
// gateway's, perhaps another tenant's) named one counter, so a submission
// for one shard resolved the other's unknown hold (reminting it into its
// own account), and a receipt "c/0" named receipt "c"'s units. Ids
// without "/" or "%" keep the names written before the escaping; a hold
// left pending under an id with either, before it, is no longer found: a
// later receipt cannot resolve it, and its capacity stays retired as
// unknown capacity does.
func metaShardPending(shardID, receiptID string) string {
	return "shard_unknown/" + metaNamePart(shardID) + "/" + metaNamePart(receiptID)
}

// metaNamePart escapes an id for a part of a Meta name joined by "/":
// "%" as "%25" and "/" as "%2F", so that the parts are read back one way.
func metaNamePart(id string) string {
	if !strings.ContainsAny(id, "%/") {
		return id
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(id)
}

func metaShardPendingUnits(shardID, receiptID string, d int) string {
	return metaShardPending(shardID, receiptID) + "/" + strconv.Itoa(d)
}

const (
	pendingUnknown  = 1
	pendingResolved = 2
)

// ShardRemintReceipt returns the move receipt id of shard s's n-th remint
// (n counts from 1: the first accepted submission):
// "shard-remint:<id>:<issued>.<n>", issued being s.IssuedAt in Unix
// nanoseconds. The issue time tells the shards under one id apart: once
// retention removed a settled shard its id is free again, while its
// remint moves stay (the audit checks them against the retained shard
// totals), so a receipt named by the id and n alone made the first remint
// of the id's next shard a duplicate move, refused on every retry.
func ShardRemintReceipt(s *Shard, n int64) string {
	return "shard-remint:" + s.ID + ":" + strconv.FormatInt(s.IssuedAt.UnixNano(), 10) + "." + strconv.FormatInt(n, 10)
}

// LegacyShardRemintReceipt is the receipt id of a shard's n-th remint
// made before receipts carried the issue time: "shard-remint:<id>:<n>".
func LegacyShardRemintReceipt(shardID string, n int64) string {
	return "shard-remint:" + shardID + ":" + strconv.FormatInt(n, 10)
}

// MaxBootEpoch is the largest boot epoch a shard may carry, 2^63-1: the
// stores keep it as a signed 64-bit integer.
const MaxBootEpoch = uint64(math.MaxInt64)

// ShardShapeProblem is the rest of an IssueShard's shape in docs/API.md's
// "Order of checks" step 2, beside each amount's (AmountShapeProblem): a
// concrete subject (not AnySubject), a route, a region, a boot epoch
// (gateway processes number their boots from 1; at most MaxBootEpoch), a TTL above 0 and at
// least one amount above 0. Decided from the command alone, before the
// shard id is looked up, so a malformed retry is refused whatever the id
// names. It returns nil for a well-formed issue, else the first refused
// field (ErrInvalidCommand). The ledger (IssueShard) and the server (on
// its request, the region defaulted) both call it, so they check the same
// rule in the same order.
func ShardShapeProblem(subject, route, region string, bootEpoch uint64, ttl time.Duration, units []Units) *FieldError {
	if problem := accountShapeProblem(subject, route, region, "issue a shard"); problem != nil {
		return problem
	}
	switch {
	case bootEpoch == 0:
		return NewFieldError(ErrInvalidCommand, "bootEpoch", "is required (a gateway process numbers its boots from 1)")
	case bootEpoch > MaxBootEpoch:
		// The stores keep it in a signed 64-bit column: refused here, it
		// is the caller's mistake; found by the store, it was a 503 that
		// told the caller to retry what can never be stored.
		return NewFieldError(ErrInvalidCommand, "bootEpoch", fmt.Sprintf("%d is above the largest boot epoch, %d", bootEpoch, MaxBootEpoch))
	case ttl <= 0:
		return NewFieldError(ErrInvalidCommand, "ttl", fmt.Sprintf("must be above 0 (%s)", DurationText(ttl)))
	case !anyAbove0(units):
		return NewFieldError(ErrInvalidCommand, "units", ": no units to carve (at least one amount above 0)")
	}
	return nil
}

// IssueShard carves emergency capacity for one gateway process out of the
// subject's current account: cmd.Units move from available to
// RetiredForEmergency and the signed shard is recorded, in one step.
// cmd.Subject, Route, Region, Units (and optionally Generation, as for
// Reserve) name the capacity; cmd.Shard carries the shard id, gateway,
// boot epoch, TTL and the signer.
//
// Returns:
//   - ErrInvalidCommand, before the id is looked up, for a missing shard
//     or gateway id, negative units, or a shape ShardShapeProblem refuses
//     (no subject, route, region, boot epoch, TTL or unit above 0);
//   - success with the new shard (fence one above the gateway's previous
//     fence, or above the fence floor when it has none: nextShardFence;
//     ExpiresAt = now + TTL or LatestTime when that is later, signed);
//   - success with Replayed and the stored shard when the id exists for the
//     same gateway, boot epoch, subject and allocation (nothing moves twice);
//   - ErrShardIDReused when the id names a different shard;
//   - ErrInvalidCommand for a missing signer, units the policy does not
//     have, or a Generation that does not decide;
//   - ErrNoPolicy when nothing admits for the subject;
//   - ErrEmergencyDisabled when the deciding policy's emergency mode is off;
//   - ErrReservationTooLarge for units above MaxUnits (no burst is above
//     it, so they never fit), as for a reservation;
//   - ErrAdmissionFrozen while the account carries debt, and
//     ErrInsufficientCapacity when the units do not fit in available (with
//     Dimension and RetryAfter, as for a reservation). The policy's maximum
//     single reservation does not bound a shard;
//   - ErrLifetimeExhausted when the units would take the account's
//     lifetime RetiredForEmergency above MaxLifetimeUnits.
func IssueShard(b Book, cmd *Command, now time.Time) Result {
	args := cmd.Shard
	if args == nil {
		return Result{Err: invalid("shard arguments are missing")}
	}
	if args.ShardID == "" || args.GatewayID == "" {
		return Result{Err: invalid("shard id and gateway id are required")}
	}
	if _, legacy := LegacyIdentity(args.GatewayID); legacy != args.Legacy {
		if legacy {
			return Result{Err: NewFieldError(ErrInvalidCommand, "gatewayId",
				fmt.Sprintf("%q names a legacy limiter: its budget is carved by the operator (CarveLegacyBudget), not issued as a shard", args.GatewayID))}
		}
		return Result{Err: invalid("a legacy budget's gateway id must start with %q, not %q", LegacyGatewayPrefix, args.GatewayID)}
	}
	// The units' shape before the id is looked up, as for Reserve.
	if err := checkAmounts(nil, &cmd.Units, false); err != nil {
		return Result{Err: checkAmounts(namingPolicy(b, cmd), &cmd.Units, false)}
	}
	// The rest of the shape too (the server calls the same rule): a retry
	// without a subject, a boot epoch or units is ErrInvalidCommand, not
	// ErrShardIDReused or a replay.
	if problem := ShardShapeProblem(cmd.Subject, cmd.Route, cmd.Region, args.BootEpoch, args.TTL, cmd.Units[:]); problem != nil {
		return Result{Err: problem}
	}
	if existing, ok := b.Shard(args.ShardID); ok {
		same := existing.GatewayID == args.GatewayID && existing.BootEpoch == args.BootEpoch &&
			existing.Account.Subject == cmd.Subject && existing.Account.Route == cmd.Route &&
			existing.Account.Region == cmd.Region && existing.Allocated == cmd.Units
		if !same {
			return Result{Err: fmt.Errorf("%w: %s", ErrShardIDReused, args.ShardID), Shard: cloneShard(existing)}
		}
		return Result{Shard: cloneShard(existing), Replayed: true, Generation: existing.Account.Generation}
	}
	if args.KeyID == "" || args.Sign == nil {
		return Result{Err: invalid("a signing key is required")}
	}
	subject := PolicyKey{Subject: cmd.Subject, Route: cmd.Route, Region: cmd.Region}
	p, ok := activePolicy(b, subject)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrNoPolicy, subject)}
	}
	if cmd.Generation != 0 && cmd.Generation != p.Generation {
		return Result{Err: invalid("units are ordered for policy generation %d, but generation %d decides", cmd.Generation, p.Generation), Generation: p.Generation}
	}
	if !p.EmergencyMode && !args.Legacy {
		return Result{Err: fmt.Errorf("%w: %s generation %d", ErrEmergencyDisabled, subject, p.Generation), Generation: p.Generation}
	}
	if refused := checkUnitsToHold(p, &cmd.Units, "shard"); refused.Err != nil {
		return refused
	}
	a, ap, ok := currentAccount(b, subject, p, now)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrAccountNotFound, subject)}
	}
	if ap != p {
		// Frozen by debt in a unit p does not limit (see Reserve).
		var res Result
		refuseOwing(b, &Command{Units: cmd.Units, Rollout: RolloutEnforce}, a, ap, p, now, &res)
		return res
	}
	tick(b, a, p, now)
	b.AccountPut(a)
	// A shard is bounded by available capacity and debt like a reservation,
	// but not by the maximum single reservation: it stands for many. The
	// burst bounds it instead: a shard above it never fits (refused as too
	// large, no wait helps, rather than as waiting for holds to end).
	unbounded := *p
	unbounded.Dimensions = slices.Clone(p.Dimensions)
	for i := range unbounded.Dimensions {
		unbounded.Dimensions[i].MaxReservation = unbounded.Dimensions[i].Burst
	}
	if rejected, res := admissible(a, &unbounded, &cmd.Units, now); rejected {
		res.Generation = p.Generation
		return res
	}

	for i := 0; i < a.Dims; i++ {
		if a.Balances[i].RetiredForEmergency > MaxLifetimeUnits-cmd.Units[i] {
			return Result{Err: fmt.Errorf("%w: %s has %d retired for emergency; %d more would pass %d (publish a new generation for a fresh account)",
				ErrLifetimeExhausted, dimensionName(p, i), a.Balances[i].RetiredForEmergency, cmd.Units[i], MaxLifetimeUnits), Generation: p.Generation}
		}
	}

	before := a.Balances
	for i := 0; i < a.Dims; i++ {
		a.Balances[i].Available -= cmd.Units[i]
		a.Balances[i].RetiredForEmergency += cmd.Units[i]
	}
	fence := nextShardFence(b, args.GatewayID)
	b.MetaPut(MetaShardFence(args.GatewayID), int64(fence))
	s := &Shard{
		ID:        args.ShardID,
		Account:   a.Key,
		GatewayID: args.GatewayID,
		BootEpoch: args.BootEpoch,
		Fence:     fence,
		Allocated: cmd.Units,
		IssuedAt:  now.UTC(),
		// Through deadline, as a hold's: serve --shard-max-ttl may allow
		// up to the longest Duration, and now + that can pass what the
		// stores and the signed token (int64 Unix ns) keep.
		ExpiresAt: deadline(now, args.TTL).UTC(),
		KeyID:     args.KeyID,
	}
	s.Signature = args.Sign(ShardCanonical(s))
	journal(b, a, &before, KindShardIssue, "", 0, 0, s.ID, now)
	b.AccountPut(a)
	b.ShardPut(s)
	return Result{Shard: cloneShard(s), Generation: p.Generation}
}

// ReconcileShard takes a gateway's receipts for one shard after it
// reconnected. The first accepted submission splits the allocation into
// Spent (settled usage), Unknown (the holds of work whose usage is
// unknown) and Reminted (the rest, confirmed unused), and mints Reminted
// into the subject's current account under the active generation through
// an exactly-once move (MoveShardRemint; the shard's own account keeps its
// RetiredForEmergency). The remint repays debt first, then fills
// available; what it would lift past the burst (the bucket was refilled
// around the shard while it was out) overflows like refill tokens and is
// retired at once in the destination's RetiredForMove, so the move still
// records exactly Reminted. Settled usage beyond what the shard could cover is
// charged to that account like an overdraft: it takes the account's
// available capacity first, and what is left is debt (issued and retired
// for the move), which freezes admission until refills repay it.
//
// After that, a submission may only carry receipts for ids the first one
// left unknown, each SETTLED or SETTLED_WITH_DEBT: each moves its units
// from Unknown to Spent and Reminted, once. Capacity never moves back into
// Unknown, and work reported started is never released.
//
// Returns:
//   - success with the shard after the submission and the remint Move
//     (nil when nothing was reminted or charged);
//   - ErrInvalidCommand, before the shard's existence or owner is
//     checked, for a receipt malformed on its own: an empty or repeated
//     id, an amount negative or above MaxUnits, a RESERVED receipt;
//   - ErrShardNotFound;
//   - ErrShardForeign when args.GatewayID is not the shard's gateway
//     (refused and counted);
//   - ErrShardAlreadyReconciled for a second full submission, one whose
//     receipts are all still unknown (a resend of the first), or a receipt
//     that is not pending unknown (refused and counted; Result.Shard is the
//     stored shard, so a caller whose first answer was lost can see it
//     took effect);
//   - ErrLifetimeExhausted (nothing changed: the submission may be sent
//     again, after a new generation gives the subject a fresh account) when
//     the receipts report more than MaxLifetimeUnits used in a dimension,
//     or the remint and the charge could take the destination's
//     RetiredForMove above it (see remintTarget);
//   - ErrShardReceiptContradicts when a later submission says RELEASED or
//     EXPIRED for a receipt the first one reported STARTED or
//     USAGE_UNKNOWN (refused and counted; nothing changed);
//   - ErrInvalidCommand for receipts that contradict the shard: holds of
//     unknown work larger than the allocation, a later submission mixing
//     terminal receipts with ones still unknown;
//   - ErrLegacyWholeBlock (nothing changed) for a legacy budget's
//     submission after which nothing would be spent or unknown: a first
//     one reporting no usage, or a later one settling the last unknown
//     work with none.
func ReconcileShard(b Book, args *ShardArgs, now time.Time) Result {
	if args == nil || args.ShardID == "" {
		return Result{Err: invalid("shard id is required")}
	}
	// The receipts' shape decides before the shard's existence or owner
	// (docs/API.md, "Order of checks"). The shard is read first only so
	// the message can name the unit: the amounts are in the shard
	// generation's dimension order (by index when it or its policy is
	// unknown).
	s, ok := b.Shard(args.ShardID)
	var unitsOf *Policy
	if ok {
		unitsOf, _ = b.Policy(s.Account.Generation)
	}
	if err := checkReceipts(args.Receipts, unitsOf); err != nil {
		if !ok {
			return Result{Err: err}
		}
		return Result{Err: err, Shard: cloneShard(s), Generation: s.Account.Generation}
	}
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s", ErrShardNotFound, args.ShardID)}
	}
	if args.GatewayID != s.GatewayID {
		refuseShard(b, s.ID)
		return Result{Err: fmt.Errorf("%w: shard %s is %s's, not %q's", ErrShardForeign, s.ID, s.GatewayID, args.GatewayID),
			Shard: cloneShard(s), Generation: s.Account.Generation}
	}

	// Everything is computed into locals first and written only once the
	// destination has room (see remintRoom): a refused submission leaves
	// the shard and its pending receipts as they were, to be sent again.
	var reminted, charged Amounts
	next := *s
	first := !s.Reconciled
	if first {
		var used, unknown Amounts
		for i := range args.Receipts {
			r := &args.Receipts[i]
			for d := range used {
				switch {
				case r.unknown() && mutantOn("shard_unknown_reminted"):
					// The mutant: unknown work counted as unused.
				case r.unknown():
					unknown[d] += r.Reserved[d]
				case r.State == StateSettled || r.State == StateSettledWithDebt:
					used[d] += r.Actual[d]
				}
				// Checked receipt by receipt, so that neither sum can
				// overflow int64 however many receipts arrive: each
				// amount is at most MaxUnits.
				if unknown[d] > s.Allocated[d] {
					return Result{Err: invalid("receipts hold at least %d units of unknown work in %s, more than the %d allocated",
						unknown[d], dimensionName(unitsOf, d), s.Allocated[d]), Shard: cloneShard(s)}
				}
				if used[d] > MaxLifetimeUnits {
					return Result{Err: fmt.Errorf("%w: receipts of shard %s report more than %d units used in %s",
						ErrLifetimeExhausted, s.ID, MaxLifetimeUnits, dimensionName(unitsOf, d)), Shard: cloneShard(s), Generation: s.Account.Generation}
				}
			}
		}
		for d := range used {
			next.Unknown[d] = unknown[d]
			next.Spent[d] = min(used[d], s.Allocated[d]-unknown[d])
			charged[d] = used[d] - next.Spent[d]
			next.Reminted[d] = s.Allocated[d] - next.Spent[d] - next.Unknown[d]
			reminted[d] = next.Reminted[d]
		}
		if legacyWholeBlock(s, next.Spent, next.Unknown) {
			return Result{Err: fmt.Errorf("%w: shard %s: the receipts report nothing spent and nothing unknown; report every request the legacy limiter admitted (its usage, or USAGE_UNKNOWN), or leave the budget unreconciled",
				ErrLegacyWholeBlock, s.ID), Shard: cloneShard(s), Generation: s.Account.Generation}
		}
		next.Reconciled = true
	} else {
		// Every receipt must resolve a pending unknown hold; one that does
		// not refuses the whole submission, so nothing is half-applied.
		if len(args.Receipts) == 0 {
			refuseShard(b, s.ID)
			return Result{Err: fmt.Errorf("%w: %s", ErrShardAlreadyReconciled, s.ID), Shard: cloneShard(s), Generation: s.Account.Generation}
		}
		holds := make([]Amounts, len(args.Receipts))
		for i := range args.Receipts {
			r := &args.Receipts[i]
			if b.Meta(metaShardPending(s.ID, r.ReservationID)) != pendingUnknown {
				refuseShard(b, s.ID)
				return Result{Err: fmt.Errorf("%w: shard %s was reconciled, and receipt %s is not one it left unknown (or it was resolved since)", ErrShardAlreadyReconciled, s.ID, r.ReservationID),
					Shard: cloneShard(s), Generation: s.Account.Generation}
			}
			for d := range holds[i] {
				holds[i][d] = b.Meta(metaShardPendingUnits(s.ID, r.ReservationID, d))
			}
		}
		stillUnknown := 0
		for i := range args.Receipts {
			if args.Receipts[i].unknown() {
				stillUnknown++
			}
		}
		if stillUnknown == len(args.Receipts) {
			// Nothing here resolves anything: this is the first submission
			// sent again after its answer was lost (or an early resend of
			// work still unknown). Answer as for any repeat, with the
			// stored shard, so the gateway sees its submission took effect.
			refuseShard(b, s.ID)
			return Result{Err: fmt.Errorf("%w: %s (receipts still unknown resolve nothing)", ErrShardAlreadyReconciled, s.ID),
				Shard: cloneShard(s), Generation: s.Account.Generation}
		}
		for i := range args.Receipts {
			if r := &args.Receipts[i]; r.unknown() {
				return Result{Err: invalid("receipt %s is still %s: only a terminal receipt resolves unknown usage", r.ReservationID, r.State),
					Shard: cloneShard(s), Generation: s.Account.Generation}
			}
		}
		// Every receipt here was reported STARTED or USAGE_UNKNOWN: the
		// work ran, so "nothing was used" contradicts that report, as
		// releasing started central work is refused. Only a settle
		// resolves it; the whole submission is refused and counted.
		for i := range args.Receipts {
			if r := &args.Receipts[i]; r.State != StateSettled && r.State != StateSettledWithDebt {
				refuseShard(b, s.ID)
				return Result{Err: fmt.Errorf("%w: shard %s: receipt %s says %s, but an earlier submission reported the work started with its usage unknown: only a SETTLED receipt with the actual usage resolves it",
					ErrShardReceiptContradicts, s.ID, r.ReservationID, r.State), Shard: cloneShard(s), Generation: s.Account.Generation}
			}
		}
		for i := range args.Receipts {
			r := &args.Receipts[i]
			for d := range holds[i] {
				hold, used := holds[i][d], r.Actual[d] // settled: checked above
				covered := min(used, hold)
				next.Unknown[d] -= hold
				next.Spent[d] += covered
				next.Reminted[d] += hold - covered
				reminted[d] += hold - covered
				charged[d] += used - covered
				// A receipt left unknown may hold nothing, so the
				// number of them does not bound the charge: check it
				// receipt by receipt (each adds at most MaxUnits).
				if charged[d] > MaxLifetimeUnits {
					return Result{Err: fmt.Errorf("%w: receipts of shard %s charge more than %d units of usage beyond their holds in %s",
						ErrLifetimeExhausted, s.ID, MaxLifetimeUnits, dimensionName(unitsOf, d)), Shard: cloneShard(s), Generation: s.Account.Generation}
				}
			}
		}
		// A legacy budget whose first report held only unknown work would
		// otherwise give its whole block back here, once settles with no
		// usage resolve the last of it: the same refusal as a first
		// report of nothing, and the units stay unknown (retired).
		if legacyWholeBlock(s, next.Spent, next.Unknown) {
			return Result{Err: fmt.Errorf("%w: shard %s: these receipts resolve the last unknown work with no usage, so nothing would stay spent or unknown; report the usage the legacy limiter's work had, or leave it unknown",
				ErrLegacyWholeBlock, s.ID), Shard: cloneShard(s), Generation: s.Account.Generation}
		}
	}
	dest, err := remintTarget(b, s, reminted, charged, now)
	if err != nil {
		return Result{Err: err, Shard: cloneShard(s), Generation: s.Account.Generation}
	}
	for i := range args.Receipts {
		r := &args.Receipts[i]
		switch {
		case !first:
			b.MetaPut(metaShardPending(s.ID, r.ReservationID), pendingResolved)
		case r.unknown():
			b.MetaPut(metaShardPending(s.ID, r.ReservationID), pendingUnknown)
			for d, u := range r.Reserved {
				if u != 0 {
					b.MetaPut(metaShardPendingUnits(s.ID, r.ReservationID, d), u)
				}
			}
		}
	}
	*s = next
	move := remintShard(b, s, dest, reminted, charged, now)
	b.ShardPut(s)
	return Result{Shard: cloneShard(s), Move: move, Generation: s.Account.Generation}
}

// CheckShardReceipts validates a submission's shape as ReconcileShard
// does (checkReceipts): ids present and not repeated, amounts in [0,
// MaxUnits], states a gateway may report (not RESERVED). It returns nil
// for a well-formed submission, else ErrInvalidCommand naming the
// receipt; p (nil: unknown) names the amounts' dimensions. The server
// calls it before reading the shard.
func CheckShardReceipts(receipts []ShardReceipt, p *Policy) error { return checkReceipts(receipts, p) }

// checkReceipts validates a submission's shape; p (nil: unknown) names
// the amounts' dimensions in its errors.
func checkReceipts(receipts []ShardReceipt, p *Policy) error {
	seen := make(map[string]int, len(receipts))
	for i := range receipts {
		r := &receipts[i]
		at := func(field string) string { return FieldPath(ItemPath("receipts", i), field) }
		bad := func(path, format string, args ...any) error {
			return NewFieldError(ErrInvalidCommand, path, fmt.Sprintf(format, args...))
		}
		if r.ReservationID == "" {
			return bad(at("reservationId"), "is required")
		}
		if first, twice := seen[r.ReservationID]; twice {
			return NewFieldError(ErrInvalidCommand, at("reservationId"), fmt.Sprintf("%q appears twice", r.ReservationID)).Twice(ItemPath("receipts", first))
		}
		seen[r.ReservationID] = i
		for d := range r.Reserved {
			if problem := AmountShapeProblem(r.Reserved[d], true); problem != "" {
				return bad(at("reservedUnits"), ": %s: amount %s", dimensionName(p, d), problem)
			}
			if problem := AmountShapeProblem(r.Actual[d], true); problem != "" {
				return bad(at("actualUnits"), ": %s: amount %s", dimensionName(p, d), problem)
			}
		}
		switch r.State {
		case StateSettled, StateSettledWithDebt, StateReleased, StateExpired, StateStarted, StateUsageUnknown:
		case StateReserved:
			return bad(at("state"), "is RESERVED (receipt %s): release unstarted holds before reconciling", r.ReservationID)
		default:
			return bad(at("state"), "%s is not a state a gateway reports (receipt %s)", r.State, r.ReservationID)
		}
	}
	return nil
}

// remintDest is where a shard's remint goes: the account to and its
// policy, and the policy the shard was issued under (whose dimensions the
// amounts are in). from is the shard's own account when the charge has
// debt in a unit toPolicy does not limit (nil otherwise): that debt is
// charged there (see remintTarget).
type remintDest struct {
	to                   *Account
	toPolicy, fromPolicy *Policy
	from                 *Account
	// held is, per dimension of to, the subject's capacity the deciding
	// generation's account holds in the unit when to is another account
	// (a frozen subject's owing current one), what it holds available
	// (not its debt): the remint leaves room for it under the burst as
	// to's refill does (decidingShare), beside to's holds elsewhere.
	held Amounts
}

// remintTarget returns the account a remint of units (and a charge of
// debt) goes to: the subject's current account under the active
// generation, brought to now; when nothing admits for the subject (every
// generation rolled back), the account that holds the subject's capacity
// now, its elapsed epoch closed, from where a drain forwards it later. It
// returns nil when there is nothing to remint or charge.
//
// The charge is debt that is not spent at the destination (it was used
// under the shard), issued and retired for the move there, and the remint
// may retire what it lifts past the burst: so that the destination's
// RetiredForMove, and with it its OverdraftIssued and Minted, stay far from
// overflow, a remint that could take RetiredForMove above MaxLifetimeUnits
// is refused with ErrLifetimeExhausted (a new generation gives the
// subject a fresh account to remint into).
//
// Debt in a unit the destination's policy does not limit (the deciding
// generation dropped it) cannot be charged there: it is charged to the
// shard's own account, whose generation limits the unit, its elapsed epoch
// closed first (remintShard says what happens to it then).
//
// It returns ErrAccountNotFound or ErrPolicyNotFound only when the book
// could not read a row that was written with the shard: a store read error,
// after which the book's owner discards the whole batch (see Book).
func remintTarget(b Book, s *Shard, units, debt Amounts, now time.Time) (*remintDest, error) {
	if units == (Amounts{}) && debt == (Amounts{}) {
		return nil, nil
	}
	subject := s.Account.SubjectKey()
	var to *Account
	var toPolicy *Policy
	var held Amounts
	if p, ok := activePolicy(b, subject); ok {
		if a, ap, ok := currentAccount(b, subject, p, now); ok {
			// ap is not p while the subject owes debt p does not limit:
			// the current account, which owes it, takes the remint,
			// leaving room for what p's account holds.
			tick(b, a, ap, now)
			b.AccountPut(a) // a refusal below keeps the refill, as a rejected reserve does
			to, toPolicy, held = a, ap, decidingShare(b, a, ap, p)
		}
	}
	if to == nil {
		key := s.Account
		if g, ok := b.AccountCurrent(subject); ok {
			key.Generation = g
		}
		a, p, err := accountFor(b, key)
		if err != nil {
			return nil, fmt.Errorf("remint shard %s: %w", s.ID, err)
		}
		// Close its elapsed epoch first, as every command does (no
		// refill: nothing admits for the subject): the epoch worker
		// left it idle and does not read that epoch again, so a remint
		// into it would stay unclosed.
		rollEpoch(b, a, p, now)
		b.AccountPut(a)
		to, toPolicy = a, p
	}
	fromPolicy, ok := b.Policy(s.Account.Generation)
	if !ok {
		return nil, fmt.Errorf("remint shard %s: %w: generation %d", s.ID, ErrPolicyNotFound, s.Account.Generation)
	}
	dest := &remintDest{to: to, toPolicy: toPolicy, fromPolicy: fromPolicy, held: held}
	for i := 0; i < len(fromPolicy.Dimensions); i++ {
		j := toPolicy.DimensionIndex(fromPolicy.Dimensions[i].Unit)
		if j < 0 {
			if debt[i] == 0 || mutantOn("shard_dropped_debt_skipped") {
				continue
			}
			// to is not the shard's account: an account limits every
			// unit of its own generation.
			if dest.from == nil {
				a, ok := b.Account(s.Account)
				if !ok {
					return nil, fmt.Errorf("remint shard %s: %w: %s", s.ID, ErrAccountNotFound, s.Account)
				}
				rollEpoch(b, a, fromPolicy, now)
				b.AccountPut(a)
				dest.from = a
			}
			if retired := dest.from.Balances[i].RetiredForMove; retired > MaxLifetimeUnits-debt[i] {
				return nil, fmt.Errorf("%w: %s %s has %d retired for moves; a charge of %d could pass %d",
					ErrLifetimeExhausted, dest.from.Key, dimensionName(fromPolicy, i), retired, debt[i], MaxLifetimeUnits)
			}
			continue
		}
		// debt and units are at most MaxLifetimeUnits and MaxUnits here.
		if retired := to.Balances[j].RetiredForMove; retired > MaxLifetimeUnits-debt[i]-units[i] {
			return nil, fmt.Errorf("%w: %s %s has %d retired for moves; a remint of %d and a charge of %d could pass %d (publish a new generation for a fresh account)",
				ErrLifetimeExhausted, to.Key, dimensionName(toPolicy, j), retired, units[i], debt[i], MaxLifetimeUnits)
		}
	}
	return dest, nil
}

// remintShard mints confirmed-unused shard capacity into dest (see
// remintTarget) and charges usage the shard could not cover there as
// debt, exactly once under a fresh receipt.
//
// In a unit the destination does not limit, confirmed-unused capacity
// stays retired at the source (nothing could admit it), and the debt is
// charged to the shard's own account (dest.from), repaid from its
// available there first: the move records it (Debt, in the shard
// generation's dimensions, as every amount of the move) and is journaled
// at that account too. When debt is left owing, that account joins its
// subject's owing accounts (markOwing, as forward does for late debt in a
// dropped unit), so the subject's admission is frozen until its refill
// repays the debt (repay only in every unit when its generation was
// rolled back), then it switches back.
func remintShard(b Book, s *Shard, dest *remintDest, units, debt Amounts, now time.Time) *Move {
	if dest == nil {
		return nil
	}
	to, toPolicy, fromPolicy, from := dest.to, dest.toPolicy, dest.fromPolicy, dest.from
	n := b.Meta(metaShardMoves(s.ID)) + 1
	b.MetaPut(metaShardMoves(s.ID), n)
	b.MetaPut(MetaShardRemints, b.Meta(MetaShardRemints)+1)
	move := Move{ReceiptID: ShardRemintReceipt(s, n), Kind: MoveShardRemint, From: s.Account, To: to.Key, At: now}
	before := to.Balances
	var fromBefore Balances
	if from != nil {
		fromBefore = from.Balances
	}
	for i := 0; i < len(fromPolicy.Dimensions); i++ {
		j := toPolicy.DimensionIndex(fromPolicy.Dimensions[i].Unit)
		if j < 0 {
			// The destination does not limit this unit: there is nothing
			// to mint it into, so it stays retired at the source, and its
			// debt is the shard's own account's.
			if from != nil && debt[i] > 0 {
				chargeDebt(&from.Balances[i], debt[i])
				move.Debt[i] = debt[i]
			}
			continue
		}
		dst := &to.Balances[j]
		// Debt first, so that the shard's own unused capacity repays it.
		// Overuse takes available capacity first, as in a settle: what the
		// destination has available repays the debt before anything
		// freezes.
		if debt[i] > 0 {
			chargeDebt(dst, debt[i])
			move.Debt[i] = debt[i]
		}
		if units[i] > 0 {
			room := burstRoom(&toPolicy.Dimensions[j], dst, to.HeldElsewhere[j], dest.held[j])
			availableBefore := dst.Available
			mint(dst, units[i]) // repays dst's debt first
			move.Units[i] = units[i]
			// The bucket was refilled around the shard while it was out:
			// what the remint lifts past the burst (counting the
			// deciding account's available when dst is another's:
			// decidingShare) overflows,
			// as refill tokens do, and is retired at once (recorded, not
			// dropped). Capacity that was there before the remint is
			// not touched.
			if over := dst.Available - availableBefore - room; over > 0 {
				dst.Available -= over
				dst.RetiredForMove += over
			}
		}
	}
	journal(b, to, &before, KindShardReconcile, "", 0, 0, move.ReceiptID, now)
	b.AccountPut(to)
	if from != nil && from.Balances != fromBefore {
		journal(b, from, &fromBefore, KindShardReconcile, "", 0, 0, move.ReceiptID, now)
		b.AccountPut(from)
		markOwing(b, from, now)
	}
	b.MovePut(&move)
	return &move
}

// chargeDebt charges debt used beyond a shard to a balance: issued and
// retired for the move (it was not spent here), then repaid from the
// balance's available as far as that goes, as overuse in a settle takes
// available capacity first, before anything freezes.
func chargeDebt(bal *Balance, debt Units) {
	bal.OverdraftIssued += debt
	bal.RetiredForMove += debt
	if repay := min(debt, bal.Available); repay > 0 {
		bal.Available -= repay
		bal.OverdraftRepaid += repay
	}
}

// refuseShard counts a refused reconciliation submission, in total and
// for the shard.
func refuseShard(b Book, shardID string) {
	b.MetaPut(MetaShardRefused, b.Meta(MetaShardRefused)+1)
	b.MetaPut(MetaShardRefusedFor(shardID), b.Meta(MetaShardRefusedFor(shardID))+1)
}

// cloneShard returns a copy of s that shares no memory with it.
func cloneShard(s *Shard) *Shard {
	c := *s
	c.Signature = slices.Clone(s.Signature)
	return &c
}
