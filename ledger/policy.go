package ledger

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Policy defaults applied by WithDefaults (never silently by the commands).
const (
	DefaultRegion         = "global"
	DefaultHoldTTL        = 60 * time.Second
	DefaultEpochLength    = time.Hour
	DefaultFairnessWeight = 1
	DefaultFairnessBudget = 0.05
	// MinHoldTTL is the shortest hold TTL a policy may set: a hold that
	// runs out before a gateway can start its work is meaningless, and
	// expiry runs only every worker interval (250 ms by default) anyway.
	MinHoldTTL = 100 * time.Millisecond
	// MinEpochLength is the shortest accounting epoch a policy may set.
	// Every epoch in which an account changed closes with a statement,
	// kept forever as the billing record, and the epoch worker looks for
	// ended epochs once a second: a shorter epoch closed one on nearly
	// every command of a busy account, faster than the worker looks.
	MinEpochLength = time.Second
	// MaxEpochLength is the longest accounting epoch a policy may set, 50
	// years of 365.25 days. Epochs count from the zero time (year 1); one
	// longer than the years since 1970 whose length divides the time from
	// year 1 to 1970 (98 years does) would start exactly at the Unix epoch,
	// which the stores keep as no time at all. No epoch of at most 50 years
	// starts there from 2021 on.
	MaxEpochLength = maxEpochYears * 8766 * time.Hour
	// MinExecutionLimit is the shortest execution limit a policy may set
	// (0 is none). The limit is a hard stop on started work, marked
	// USAGE_UNKNOWN by a worker that runs every worker interval (250 ms
	// by default): a shorter limit would turn ordinary requests into
	// breaches, and could not be kept to within its own length anyway.
	MinExecutionLimit = time.Second
	// MinRefillInterval is the shortest refill interval a dimension may
	// set. Refill mints whole RefillUnits per interval; any rate is a
	// number of units per millisecond or more, and a nanosecond interval
	// asked for refill arithmetic at a resolution no clock gives.
	MinRefillInterval = time.Millisecond
)

// maxEpochYears is MaxEpochLength in years of 365.25 days, as refusals
// name it beside the seconds.
const maxEpochYears = 50

// DurationText writes d the way the API's JSON writes a Duration
// (docs/API.md, Durations): whole seconds with an "s" suffix, and a
// fraction of 3, 6 or 9 digits when d has one: "1577880000s", "0.100s",
// "-1.500s", "0.000000001s". Every refusal that names a duration or a
// duration limit writes it so, in the form a client sends it, rather than
// Go's (438300h0m0s, 100ms, 999µs).
func DurationText(d time.Duration) string {
	negative, abs := d < 0, uint64(d)
	if negative {
		abs = -abs // unsigned, so the most negative Duration negates too
	}
	return durationText(negative, abs/uint64(time.Second), abs%uint64(time.Second))
}

// SecondsText writes a duration given as a protobuf Duration's seconds
// and nanos (both of one sign), as DurationText does: a refusal of one too
// long for a time.Duration names it as the client sent it.
func SecondsText(seconds int64, nanos int32) string {
	negative := seconds < 0 || nanos < 0
	abs, absNanos := uint64(seconds), uint64(nanos)
	if negative {
		abs, absNanos = -abs, uint64(-int64(nanos))
	}
	return durationText(negative, abs, absNanos)
}

func durationText(negative bool, seconds, nanos uint64) string {
	sign := ""
	if negative {
		sign = "-"
	}
	switch {
	case nanos == 0:
		return fmt.Sprintf("%s%ds", sign, seconds)
	case nanos%1e6 == 0:
		return fmt.Sprintf("%s%d.%03ds", sign, seconds, nanos/1e6)
	case nanos%1e3 == 0:
		return fmt.Sprintf("%s%d.%06ds", sign, seconds, nanos/1e3)
	}
	return fmt.Sprintf("%s%d.%09ds", sign, seconds, nanos)
}

// MaxDurationSeconds is the longest duration a request may carry, in
// whole seconds: 9223372036s (about 292 years), the whole seconds a
// time.Duration holds, and the longest Retry-After the server computes.
// It is the one bound of every Duration of the API; a fraction beyond it
// ("9223372036.5s") is beyond it too, though a time.Duration would hold up
// to 0.854775807s more: a limit a client can state and check is worth
// more than the last fraction of 292 years.
const MaxDurationSeconds = int64(math.MaxInt64 / int64(time.Second))

// WithDefaults returns p with empty optional fields filled in: region,
// rollout mode, hold TTL, epoch length, fairness weight and budget,
// max reservation (the burst).
func (p Policy) WithDefaults() Policy {
	if p.Key.Region == "" {
		p.Key.Region = DefaultRegion
	}
	if p.Rollout == "" {
		p.Rollout = RolloutEnforce
	}
	if p.HoldTTL == 0 {
		p.HoldTTL = DefaultHoldTTL
	}
	if p.EpochLength == 0 {
		p.EpochLength = DefaultEpochLength
	}
	if p.FairnessWeight == 0 {
		p.FairnessWeight = DefaultFairnessWeight
	}
	if p.FairnessBudget == 0 {
		p.FairnessBudget = DefaultFairnessBudget
	}
	p.Dimensions = slices.Clone(p.Dimensions)
	for i := range p.Dimensions {
		d := &p.Dimensions[i]
		if d.MaxReservation == 0 {
			d.MaxReservation = d.Burst
		}
	}
	return p
}

// MaxUnitBytes bounds a policy dimension's unit name: it is a label
// value of capledger_rejections_total{dimension}, a column of the
// console's tables and a key of every units map, and "input_tokens" is 12
// bytes. Policies stored before the bound hold what they were published
// with and still load: only publishing is checked.
const MaxUnitBytes = 128

// Validate returns nil, or the first problem as a *FieldError of
// ErrInvalidPolicy naming the refused field by its path within the policy
// as JSON spells it ("holdTtl", "dimensions[1].burst").
func (p *Policy) Validate() error {
	bad := func(path, format string, args ...any) error {
		return NewFieldError(ErrInvalidPolicy, path, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Key.Subject == "":
		return bad("subject", "is empty (use %q for every subject)", AnySubject)
	case p.Key.Route == "":
		return bad("route", "is empty")
	case p.Key.Region == "":
		return bad("region", "is empty")
	}
	if field, problem := KeyFieldProblem(p.Key.Subject, p.Key.Route, p.Key.Region); problem != "" {
		return bad(field, "%s", problem)
	}
	if field, problem := RouteKeyProblem(p.Key.Route, p.Key.Region); problem != "" {
		return bad(field, "%s", problem)
	}
	switch {
	case len(p.Dimensions) == 0:
		return bad("dimensions", ": none given (a policy limits at least one unit)")
	case len(p.Dimensions) > MaxDimensions:
		return bad("dimensions", ": %d given; at most %d", len(p.Dimensions), MaxDimensions)
	case p.Rollout != RolloutEnforce && p.Rollout != RolloutShadow:
		return bad("rollout", "%q is neither %q nor %q", p.Rollout, RolloutEnforce, RolloutShadow)
	case p.HoldTTL < MinHoldTTL:
		return bad("holdTtl", "%s is shorter than the minimum %s", DurationText(p.HoldTTL), DurationText(MinHoldTTL))
	case p.ExecutionLimit < 0:
		return bad("executionLimit", "%s is negative", DurationText(p.ExecutionLimit))
	case p.ExecutionLimit > 0 && p.ExecutionLimit < MinExecutionLimit:
		return bad("executionLimit", "%s is shorter than the minimum %s (leave it out for no limit)", DurationText(p.ExecutionLimit), DurationText(MinExecutionLimit))
	case p.EpochLength < MinEpochLength:
		return bad("epochLength", "%s is shorter than the minimum %s", DurationText(p.EpochLength), DurationText(MinEpochLength))
	case p.EpochLength > MaxEpochLength:
		return bad("epochLength", "%s is longer than the maximum %s (%d years)", DurationText(p.EpochLength), DurationText(MaxEpochLength), maxEpochYears)
	case p.FairnessWeight <= 0 || p.FairnessWeight > MaxFairnessWeight:
		return bad("fairnessWeight", "%d is outside [1, %d]", p.FairnessWeight, MaxFairnessWeight)
	case !(p.FairnessBudget >= 0 && p.FairnessBudget <= 1):
		// Written so that NaN, for which every comparison is false, is
		// refused too: a store cannot keep it (SQLite reads it as NULL)
		// or compare it (a republished NaN would never replay).
		return bad("fairnessBudget", "%v is outside [0, 1]", p.FairnessBudget)
	}
	if problem := TextProblem(p.EstimatorDigest, MaxDigestBytes); problem != "" {
		return bad("estimatorDigest", "%s", problem)
	}
	for i := range p.Dimensions {
		d := &p.Dimensions[i]
		at := func(field string) string { return FieldPath(ItemPath("dimensions", i), field) }
		switch {
		case d.Unit == "":
			return bad(at("unit"), "is empty")
		case TextProblem(d.Unit, MaxUnitBytes) != "":
			return bad(at("unit"), "%s", TextProblem(d.Unit, MaxUnitBytes))
		case p.DimensionIndex(d.Unit) != i:
			// Also a path of the policy, rooted with the first one's.
			return NewFieldError(ErrInvalidPolicy, at("unit"), fmt.Sprintf("%q appears twice", d.Unit)).Twice(ItemPath("dimensions", p.DimensionIndex(d.Unit)))
		case d.Burst <= 0 || d.Burst > MaxUnits:
			return bad(at("burst"), "%d is outside (0, %d] (unit %q)", d.Burst, MaxUnits, d.Unit)
		case d.RefillUnits < 0 || d.RefillUnits > MaxUnits:
			return bad(at("refillUnits"), "%d is outside [0, %d] (unit %q)", d.RefillUnits, MaxUnits, d.Unit)
		case d.RefillUnits > 0 && d.RefillInterval <= 0:
			return bad(at("refillInterval"), "%s must be above 0 to mint refillUnits (unit %q)", DurationText(d.RefillInterval), d.Unit)
		case d.RefillInterval != 0 && d.RefillInterval < MinRefillInterval:
			return bad(at("refillInterval"), "%s is shorter than the minimum %s (unit %q)", DurationText(d.RefillInterval), DurationText(MinRefillInterval), d.Unit)
		case d.MaxReservation <= 0 || d.MaxReservation > d.Burst:
			return bad(at("maxReservation"), "%d is outside (0, burst %d] (unit %q)", d.MaxReservation, d.Burst, d.Unit)
		case d.MaxOverdraft < 0 || d.MaxOverdraft > MaxUnits:
			return bad(at("maxOverdraft"), "%d is outside [0, %d] (unit %q)", d.MaxOverdraft, MaxUnits, d.Unit)
		}
	}
	return nil
}

// sameTerms reports whether two policies say the same thing, generation,
// publication time and rollback aside.
func sameTerms(a, b *Policy) bool {
	return a.Key == b.Key && slices.Equal(a.Dimensions, b.Dimensions) &&
		a.EstimatorDigest == b.EstimatorDigest && a.HoldTTL == b.HoldTTL &&
		a.ExecutionLimit == b.ExecutionLimit && a.Priority == b.Priority &&
		a.FairnessWeight == b.FairnessWeight && a.FairnessBudget == b.FairnessBudget &&
		a.EmergencyMode == b.EmergencyMode && a.Rollout == b.Rollout && a.EpochLength == b.EpochLength
}

// PublishPolicy publishes p as a new immutable generation and makes it the
// active one for its key.
//
// Returns: Generation set on success; Replayed when p says exactly what the
// active generation of its key says (a retried publish creates no second
// generation); ErrInvalidPolicy when p is nil or fails Validate (call
// WithDefaults first to fill optional fields).
func PublishPolicy(b Book, p *Policy, now time.Time) Result {
	return publishPolicy(b, p, 0, now)
}

// publishPolicy is PublishPolicy of a policy edited from generation
// replaces (0: from nothing in particular). A non-zero replaces must still
// be the active generation of p's key, else the publish is refused with
// ErrPolicyGenerationChanged: an edit of a stale copy would otherwise undo
// what was published since. The replay check comes first, so a retry of
// a publish that succeeded (its answer lost) still replays.
func publishPolicy(b Book, p *Policy, replaces uint64, now time.Time) Result {
	if p == nil {
		return Result{Err: NewFieldError(ErrInvalidPolicy, "", "is required")}
	}
	if err := p.Validate(); err != nil {
		return Result{Err: err}
	}
	head, ok := b.PolicyHead(p.Key)
	if ok && head.Active != 0 {
		if active, found := b.Policy(head.Active); found && sameTerms(active, p) {
			return Result{Generation: active.Generation, Replayed: true}
		}
	}
	if replaces != 0 {
		if err := stillActive(b, p.Key, head, ok, replaces); err != nil {
			return Result{Err: err}
		}
	}
	if !ok {
		head = &PolicyHead{Key: p.Key}
	}
	generation := uint64(b.Meta(MetaGeneration)) + 1
	b.MetaPut(MetaGeneration, int64(generation))
	b.MetaPut(MetaPolicyChanges, b.Meta(MetaPolicyChanges)+1)
	published := *p
	published.Dimensions = slices.Clone(p.Dimensions)
	published.Generation = generation
	published.PublishedAt = now
	published.RolledBack = false
	if mutantOn("fairness_weight_ignored") && generation == 1 {
		// The mutant: the first policy's fairness weight is dropped.
		published.FairnessWeight = DefaultFairnessWeight
	}
	b.PolicyPut(&published)
	head.Active = generation
	head.Latest = generation
	b.PolicyHeadPut(head)
	return Result{Generation: generation}
}

// stillActive returns nil when replaces is the active generation of key
// (head, found, is its head), else ErrPolicyGenerationChanged saying what
// is active instead.
func stillActive(b Book, key PolicyKey, head *PolicyHead, found bool, replaces uint64) error {
	if found && head.Active == replaces {
		return nil
	}
	active := "it has no active generation"
	if found && head.Active != 0 {
		active = fmt.Sprintf("generation %d is active", head.Active)
	}
	if p, ok := b.Policy(replaces); !ok || p.Key != key {
		return fmt.Errorf("%w: generation %d is no generation of %s (%s)", ErrPolicyGenerationChanged, replaces, key, active)
	}
	if !found || head.Active == 0 {
		return fmt.Errorf("%w: edited from generation %d of %s, which has no active generation now (rolled back)", ErrPolicyGenerationChanged, replaces, key)
	}
	return fmt.Errorf("%w: edited from generation %d of %s, but generation %d is active now", ErrPolicyGenerationChanged, replaces, key, head.Active)
}

// RollbackPolicy stops admission under generation of key. Settlement, debt
// and shard reconciliation of its accounts go on; if it was the active
// generation, the newest earlier generation of the key that was not rolled
// back becomes active again (or none: the key then admits nothing, and a
// subject falls back to an AnySubject policy if there is one).
//
// Returns: Generation = the generation now active (0 for none); Replayed if
// it was already rolled back; ErrPolicyNotFound if key has no such
// generation.
func RollbackPolicy(b Book, key PolicyKey, generation uint64, now time.Time) Result {
	p, ok := b.Policy(generation)
	if !ok || p.Key != key {
		return Result{Err: fmt.Errorf("%w: %s generation %d", ErrPolicyNotFound, key, generation)}
	}
	head, ok := b.PolicyHead(key)
	if !ok {
		return Result{Err: fmt.Errorf("%w: %s has no head", ErrPolicyNotFound, key)}
	}
	if p.RolledBack {
		return Result{Generation: head.Active, Replayed: true}
	}
	p.RolledBack = true
	b.PolicyPut(p)
	b.MetaPut(MetaPolicyChanges, b.Meta(MetaPolicyChanges)+1)
	if head.Active == generation {
		head.Active = 0
		for g := generation - 1; g > 0; g-- {
			older, found := b.Policy(g)
			if found && older.Key == key && !older.RolledBack {
				head.Active = g
				break
			}
		}
		b.PolicyHeadPut(head)
	}
	return Result{Generation: head.Active}
}

// activePolicy returns the policy that admits for a concrete subject key
// (DecidingGeneration over the policy heads, whose Active is the newest
// generation of their key not rolled back).
func activePolicy(b Book, key PolicyKey) (*Policy, bool) {
	generation, ok := DecidingGeneration(key, func(k PolicyKey) (uint64, bool) {
		head, found := b.PolicyHead(k)
		if !found || head.Active == 0 {
			return 0, false
		}
		_, found = b.Policy(head.Active)
		return head.Active, found
	})
	if !ok {
		return nil, false
	}
	return b.Policy(generation)
}

// ActivePolicy returns the policy that decides for a concrete subject key
// (its own active generation, else the route's AnySubject one).
func ActivePolicy(b Book, key PolicyKey) (*Policy, bool) { return activePolicy(b, key) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidCommand, fmt.Sprintf(format, args...))
}
