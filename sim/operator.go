package sim

import (
	"fmt"
	"strconv"
	"time"

	"github.com/capledger/capledger/ledger"
)

// operator publishes policy generations and rolls them back, as an
// operator of the ledger would mid-run. It keeps a cache of the published
// generations (read back from the store whenever something may have
// changed), which the drain worker also uses to tell superseded accounts.
type operator struct {
	base          map[ledger.PolicyKey]*ledger.Policy
	keys          []ledger.PolicyKey
	policies      []ledger.Policy
	policiesStale bool
	published     int
	// stepping is a key whose generations step down a unit at a time:
	// the first chaos tick at or after stepAt publishes its next step
	// (nextPolicy), without a firing of cross_generation.
	stepping *ledger.PolicyKey
	stepAt   int64
}

// fairnessBudgets are the fairness budgets the simulated policies draw (0
// leaves the default, ledger.DefaultFairnessBudget): each tenant is judged
// against its own policy's.
var fairnessBudgets = []float64{0, 0.1, 0.2}

// initialPolicy draws the first generation of a policy key.
func (w *world) initialPolicy(key ledger.PolicyKey) *ledger.Policy {
	burstLo := int64(600)
	if w.backlogOn {
		burstLo = 1500 // room for most of a tenant's backlog burst at once
	}
	dims := []ledger.Dimension{{
		Unit:           "tokens",
		Burst:          w.between(burstLo, 3000),
		RefillUnits:    w.between(10, 80),
		RefillInterval: time.Second,
		MaxOverdraft:   w.between(0, 1500),
	}}
	if w.shape.dims > 1 {
		dims = append(dims, ledger.Dimension{Unit: "requests", Burst: w.between(3, 12), RefillUnits: 1,
			RefillInterval: 2 * time.Second})
	}
	if w.shape.dims > 2 {
		dims = append(dims, ledger.Dimension{Unit: "images", Burst: w.between(1, 3), RefillUnits: 1,
			RefillInterval: 3 * time.Second})
	}
	p := ledger.Policy{
		Key:             key,
		Dimensions:      dims,
		EstimatorDigest: "estimator-v1",
		HoldTTL:         w.holdTTL(),
		ExecutionLimit:  time.Duration(w.between(int64(10*time.Second), int64(30*time.Second))),
		FairnessWeight:  w.between(1, 4),
		FairnessBudget:  fairnessBudgets[w.rng.IntN(len(fairnessBudgets))],
		EpochLength:     time.Minute,
		EmergencyMode:   w.shards.on,
	}.WithDefaults()
	return &p
}

// nextPolicy derives a new generation from the key's first one: other
// burst, refill, overdraft and hold TTL, the same limits, and the same
// units or the first ones of them: the first k when k > 0, else drawn.
func (w *world) nextPolicy(key ledger.PolicyKey, k int) *ledger.Policy {
	base := w.op.base[key]
	p := *base
	p.Dimensions = append([]ledger.Dimension(nil), base.Dimensions...)
	p.Dimensions[0].Burst = base.Dimensions[0].Burst * w.between(3, 6) / 4
	p.Dimensions[0].MaxReservation = p.Dimensions[0].Burst
	p.Dimensions[0].RefillUnits = w.between(10, 80)
	p.Dimensions[0].MaxOverdraft = w.between(0, 1500)
	if n := len(p.Dimensions); n > 1 {
		// Keep the first k units, k drawn from 1..n: a generation drops
		// the units after them (the next generation that keeps one adds
		// it back), and debt the subject owes in a dropped unit must keep
		// freezing its admission until it is repaid (cross-generation
		// behaviour). With three units, generations limiting (tokens,
		// requests, images), (tokens, requests) and (tokens) let two
		// accounts of a subject owe in different dropped units at once:
		// images on one, requests on another, under a generation that
		// limits neither.
		switch {
		case k > 0:
		case n == 2:
			k = 2
			if w.chance(0.5) {
				k = 1
			}
		case w.chance(0.5):
			// One unit fewer than the generation deciding now, and the
			// next step 8-20 s later (act), so that generations
			// step down (tokens, requests, images), (tokens, requests),
			// (tokens) while work reserved under each runs.
			k = max(1, w.deciding(key)-1)
			if k > 1 {
				w.op.stepping, w.op.stepAt = &key, w.now+w.between(int64(8*time.Second), int64(20*time.Second))
			}
		default:
			k = 1 + w.rng.IntN(n)
		}
		k = min(k, n)
		p.Dimensions = p.Dimensions[:k]
		// The units kept get a burst as small as 1: overuse then owes in
		// them often, so a later generation may drop a unit with debt.
		for d := 1; d < k; d++ {
			p.Dimensions[d].Burst = w.between(1, 12)
			if n > 2 {
				p.Dimensions[d].Burst = w.between(1, 3)
				p.Dimensions[d].RefillInterval = time.Duration(w.between(2, 15)) * time.Second
			}
			p.Dimensions[d].MaxReservation = p.Dimensions[d].Burst
		}
	}
	w.op.published++
	p.EstimatorDigest = "estimator-v" + strconv.Itoa(1+w.op.published)
	p.HoldTTL = w.holdTTL()
	return &p
}

// deciding returns how many units the generation deciding for key (the
// newest live one published) limits: the first generation's when none is.
func (w *world) deciding(key ledger.PolicyKey) int {
	w.op.refresh(w)
	if g, ok := ledger.NewActiveGenerations(w.op.policies).Active(key); ok {
		if p := w.op.policy(g); p != nil {
			return len(p.Dimensions)
		}
	}
	return len(w.op.base[key].Dimensions)
}

// holdTTL draws a policy's hold TTL: 4-30 s, or 90-150 s in an
// interleaving with a backlog burst, which queues up to a minute of work at
// executor 0 (a hold that ran out in the queue would end its request
// unstarted, and the burst would measure nothing).
func (w *world) holdTTL() time.Duration {
	if w.backlogOn {
		return time.Duration(w.between(int64(90*time.Second), int64(150*time.Second)))
	}
	return time.Duration(w.between(int64(4*time.Second), int64(30*time.Second)))
}

// refresh re-reads the published generations when they may have changed.
func (o *operator) refresh(w *world) {
	if !o.policiesStale {
		return
	}
	list, err := w.ledgerStore.PolicyList(w.ctx)
	if err != nil {
		w.violate(GateJournal, fmt.Sprintf("policy list: %v", err))
		return
	}
	o.policies = list
	o.policiesStale = false
}

// activeGeneration returns the generation that admits for a concrete
// subject key: the newest generation of its own key not rolled back, else
// the route's AnySubject one; 0 when none. (Publishing makes the new
// generation active and a rollback falls back to the newest earlier one
// not rolled back, so the newest live generation is the active one.)
func (o *operator) activeGeneration(subject ledger.PolicyKey) uint64 {
	g, _ := ledger.NewActiveGenerations(o.policies).Deciding(subject)
	return g
}

// activeDims is how many dimensions the generation deciding for tenant
// has, as the operator's cache knows it: a gateway shapes a request's
// units by it when it first sends it (a generation dropping a unit
// refuses units in it as an invalid command).
func (w *world) activeDims(tenant int) int {
	w.op.refresh(w)
	t := &w.tenants[tenant]
	if p := w.op.policy(w.op.activeGeneration(ledger.PolicyKey{Subject: t.subject, Route: route, Region: region})); p != nil {
		return len(p.Dimensions)
	}
	return len(w.op.base[t.key].Dimensions)
}

// dropsUnitsOf reports whether generation gen (as an answer names it) is
// published and does not limit a unit units holds some of (it limits the
// first units of the key's first generation only).
func (w *world) dropsUnitsOf(gen uint64, units *ledger.Amounts) bool {
	if gen == 0 {
		return false
	}
	w.op.refresh(w)
	p := w.op.policy(gen)
	if p == nil {
		return false
	}
	for d := len(p.Dimensions); d < len(units); d++ {
		if units[d] != 0 {
			return true
		}
	}
	return false
}

// shapeUnits zeroes the units of r in the dimensions the deciding
// generation does not have and redraws its digest; only before its first
// send (a reserve that may have landed keeps its units and digest).
func (w *world) shapeUnits(r *request) {
	dims := w.activeDims(r.tenant)
	changed := false
	for d := dims; d < len(r.units); d++ {
		if r.units[d] != 0 {
			r.units[d], changed = 0, true
		}
	}
	if changed && !r.record {
		r.digest = digestOf(r)
	}
}

// policy returns the cached generation gen, or nil.
func (o *operator) policy(gen uint64) *ledger.Policy {
	for i := range o.policies {
		if o.policies[i].Generation == gen {
			return &o.policies[i]
		}
	}
	return nil
}

func (o *operator) liveCount(key ledger.PolicyKey) int {
	n := 0
	for i := range o.policies {
		if o.policies[i].Key == key && !o.policies[i].RolledBack {
			n++
		}
	}
	return n
}

// act publishes a new generation of a random key or rolls the newest one
// back (keeping at least one live generation, so every tenant can still
// be admitted and drained into).
func (o *operator) act(w *world) {
	o.refresh(w)
	if o.stepping != nil && w.now >= o.stepAt {
		// The next step down of a key's units (nextPolicy).
		key := *o.stepping
		o.stepping = nil
		if k := w.deciding(key) - 1; k >= 1 {
			o.publish(w, w.nextPolicy(key, k))
		}
		return
	}
	key := o.keys[w.rng.IntN(len(o.keys))]
	if o.liveCount(key) >= 2 && w.chance(0.4) {
		g, _ := ledger.NewActiveGenerations(o.policies).Active(key)
		w.log(recRollback, ledgerNodeID, ledger.KindRollbackPolicy, key.String(), int64(g), "")
		w.ledger.internal = append(w.ledger.internal, internalCmd{cmd: ledger.Command{Kind: ledger.KindRollbackPolicy,
			PolicyKey: key, Generation: g}, from: fromOperator})
		w.scheduleBatch()
	} else {
		o.publish(w, w.nextPolicy(key, 0))
	}
}

// publish sends the publication of p.
func (o *operator) publish(w *world, p *ledger.Policy) {
	w.log(recPublish, ledgerNodeID, ledger.KindPublishPolicy, p.Key.String(), p.Dimensions[0].Burst, p.EstimatorDigest)
	w.ledger.internal = append(w.ledger.internal, internalCmd{cmd: ledger.Command{Kind: ledger.KindPublishPolicy, Policy: p},
		from: fromOperator})
	w.scheduleBatch()
}

func (o *operator) answered(w *world, ic *internalCmd, res *ledger.Result) {
	o.policiesStale = true
	if res.Err != nil {
		w.violate(GateProtocol, fmt.Sprintf("%s answered %v", ic.cmd.Kind, res.Err))
		return
	}
	w.log(recAnswer, ledgerNodeID, ic.cmd.Kind, "", int64(res.Generation), "")
}

func (o *operator) failed(w *world, ic *internalCmd) {
	// The admin call may or may not have been applied (a lost
	// acknowledgement); the cache is re-read either way.
	o.policiesStale = true
}

// chaosTick rolls the fault sites that strike at a moment rather than at a
// message: partitions, crashes, generation changes, shard misuse.
func (w *world) chaosTick() {
	if w.now+chaosEvery < int64(w.cfg.HealAt) {
		w.after(chaosEvery, evChaos, 0, 0, 0)
	}
	if w.f.fire(SiteLedgerPartition) {
		w.partition()
	}
	if w.ledger.up && w.ledger.dying == crashNone && w.f.fire(SiteLedgerCrash) {
		w.ledger.dying = 1 + w.rng.IntN(3)
		w.scheduleBatch()
	}
	if w.f.fire(SiteExecutorCrash) {
		w.crashExecutor(w.rng.IntN(w.shape.executors))
	}
	if w.ledger.up && w.op.stepping != nil && w.now >= w.op.stepAt {
		w.op.act(w) // the next step down, not a new firing of the site
	} else if w.ledger.up && w.f.fire(SiteCrossGeneration) {
		w.op.act(w)
	}
	w.shardChaos()
}

// partition cuts actors off the ledger: all of them (the central ledger is
// partitioned away) or a random subset, for a while, ending at the latest
// when faults heal.
func (w *world) partition() {
	actors := w.shape.gateways + w.shape.executors
	all := w.chance(0.5)
	first, last := int32(1), int32(actors)
	if !all {
		first = int32(1 + w.rng.IntN(actors))
		last = first + int32(w.rng.IntN(actors-int(first)+1))
	}
	for n := first; n <= last; n++ {
		w.cut[n] = true
	}
	end := min(w.now+w.between(partitionMin, partitionMax), int64(w.cfg.HealAt))
	w.log(recPartition, ledgerNodeID, 0, "", end-w.now, fmt.Sprintf("nodes %d..%d cut", first, last))
	w.schedule(event{at: end, kind: evPartitionEnd, a: first, b: last})
}

func (w *world) partitionEnd(first, last int32) {
	for n := first; n <= last; n++ {
		w.cut[n] = false
	}
	w.log(recPartition, ledgerNodeID, 0, "", 0, fmt.Sprintf("nodes %d..%d healed", first, last))
}
