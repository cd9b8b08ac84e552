package sim

import "math/rand/v2"

// Site is a named fault-injection site: a place in the simulation where a
// fault (or an adversarial schedule) may be injected. Each interleaving
// switches every site on with some probability and gives it a firing
// probability; when the simulation reaches an enabled site it fires with that
// probability, and the report counts how often each site fired.
type Site uint8

// The seed's fault list comes first; the infrastructure faults that the
// seed's list relies on (lost messages, crashes, failed commits) follow.
const (
	// SiteConcurrentReserve: two gateways reserve for the same tenant at the
	// same instant, so the requests land in one batch or back to back.
	SiteConcurrentReserve Site = iota
	// SiteStartVersusExpire: the executor's start is timed to reach the
	// ledger at the hold's expiry, together with an expiry worker run.
	SiteStartVersusExpire
	// SiteUsageOverEstimate: the operation uses more than it reserved.
	SiteUsageOverEstimate
	// SiteLostDebtRepaymentAck: the commit of a debt repayment (a refill or
	// a drain of an indebted account) is applied but its acknowledgement is
	// lost, and the worker repeats it.
	SiteLostDebtRepaymentAck
	// SiteLedgerPartition: some or all gateways and executors cannot reach
	// the central ledger for a while (both directions).
	SiteLedgerPartition
	// SiteShardReuse: a second gateway tries to spend a shard issued to
	// another gateway.
	SiteShardReuse
	// SiteShardReplayAfterRestart: a restarted gateway process replays the
	// shard its previous process held.
	SiteShardReplayAfterRestart
	// SiteDuplicateRecovery: a recovery of unused capacity (a drain of a
	// superseded generation, a release, a shard reconciliation) is
	// delivered twice.
	SiteDuplicateRecovery
	// SiteLostRefundAck: the answer of a refunding command (settle,
	// release) is lost, or its commit's acknowledgement is, and the caller
	// retries with the same ids.
	SiteLostRefundAck
	// SiteCrossGeneration: an operator publishes a new policy generation
	// mid-run, or rolls the newest one back.
	SiteCrossGeneration

	// SiteNetDrop: a message between an actor and the ledger is lost.
	SiteNetDrop
	// SiteNetDuplicate: a message is delivered twice.
	SiteNetDuplicate
	// SiteNetDelay: a message is delayed for seconds (reordering it behind
	// later ones and outliving the sender's timeout).
	SiteNetDelay
	// SiteLedgerCrash: the ledger process dies (before or after committing
	// the batch it was working on) and restarts later, keeping only what
	// was committed.
	SiteLedgerCrash
	// SiteCommitFail: the store fails a commit (nothing applied).
	SiteCommitFail
	// SiteCommitConflict: the store reports a conflict; the batch is run
	// again whole.
	SiteCommitConflict
	// SiteCommitAckLost: a commit is applied but the ledger hears it failed
	// and answers every caller of the batch "unavailable".
	SiteCommitAckLost
	// SiteExecutorCrash: an executor process dies and restarts; only its
	// durable job log and the backend's operation receipts survive.
	SiteExecutorCrash
	// SiteExecutionOverrun: an operation runs past the policy's execution
	// limit, so the ledger marks it USAGE_UNKNOWN before it settles.
	SiteExecutionOverrun
	// SiteDigestReuse: a gateway sends an existing reservation id with a
	// different request digest; the ledger must refuse it and debit nothing.
	SiteDigestReuse
	// SiteWorkerRereadRace: a start reaches the ledger a few milliseconds
	// before its hold expires, and the expiry worker (engine.Core.Due,
	// with a clock a little ahead of the batch's) lists the hold as due
	// while the start's batch is in flight; the batch commits between
	// Due's listing (the rows Due decides from) and the worker's batch.
	SiteWorkerRereadRace
	// SiteRetentionRetry: a gateway sends a finished request's reserve
	// again (same id and digest) after the retention worker may have
	// removed its reservation: the ledger must answer it from the row or
	// the tombstone as a replay and debit nothing.
	SiteRetentionRetry
	// SiteCrashMidCut: (compaction on) the ledger process dies in the
	// middle of a compaction cut: after its audit, before the checkpoint
	// is stored, or between two journal deletions.
	SiteCrashMidCut
	// SiteLostRecordAck: (records on) a record's answer is dropped, or its
	// batch's commit acknowledgement is lost, and the gateway records
	// again with the same id, operation id and usage.
	SiteLostRecordAck

	numSites
)

var siteNames = [numSites]string{
	SiteConcurrentReserve:       "concurrent_reserve",
	SiteStartVersusExpire:       "start_vs_expire",
	SiteUsageOverEstimate:       "usage_over_estimate",
	SiteLostDebtRepaymentAck:    "lost_debt_repayment_ack",
	SiteLedgerPartition:         "ledger_partition",
	SiteShardReuse:              "shard_reuse",
	SiteShardReplayAfterRestart: "shard_replay_after_restart",
	SiteDuplicateRecovery:       "duplicate_recovery",
	SiteLostRefundAck:           "lost_refund_ack",
	SiteCrossGeneration:         "cross_generation",
	SiteNetDrop:                 "net_drop",
	SiteNetDuplicate:            "net_duplicate",
	SiteNetDelay:                "net_delay",
	SiteLedgerCrash:             "ledger_crash",
	SiteCommitFail:              "commit_fail",
	SiteCommitConflict:          "commit_conflict",
	SiteCommitAckLost:           "commit_ack_lost",
	SiteExecutorCrash:           "executor_crash",
	SiteExecutionOverrun:        "execution_overrun",
	SiteDigestReuse:             "digest_reuse",
	SiteWorkerRereadRace:        "worker_reread_race",
	SiteRetentionRetry:          "retention_retry",
	SiteCrashMidCut:             "crash_mid_cut",
	SiteLostRecordAck:           "lost_record_ack",
}

func (s Site) String() string {
	if s < numSites {
		return siteNames[s]
	}
	return "site?"
}

// Sites returns every site, in report order.
func Sites() []Site {
	out := make([]Site, numSites)
	for i := range out {
		out[i] = Site(i)
	}
	return out
}

// SeedSite reports whether the site is one of the seed's fault list (the
// others are the infrastructure faults those rely on).
func (s Site) SeedSite() bool { return s <= SiteCrossGeneration }

// siteProfile is how a site is switched on: enable is the probability that
// an interleaving enables it; rates are the firing probabilities one is
// drawn from.
type siteProfile struct {
	enable float64
	rates  [3]float64
}

// profiles are tuned so that, with the default sizes, every site fires
// well over 1,000 times in 10,000 interleavings while most interleavings
// still run several faults at once.
var profiles = [numSites]siteProfile{
	SiteConcurrentReserve:       {0.6, [3]float64{0.2, 0.4, 0.8}},
	SiteStartVersusExpire:       {0.5, [3]float64{0.1, 0.25, 0.5}},
	SiteUsageOverEstimate:       {0.7, [3]float64{0.1, 0.3, 0.6}},
	SiteLostDebtRepaymentAck:    {0.6, [3]float64{0.3, 0.6, 0.9}},
	SiteLedgerPartition:         {0.5, [3]float64{0.1, 0.2, 0.35}},
	SiteShardReuse:              {0.5, [3]float64{0.05, 0.1, 0.2}},
	SiteShardReplayAfterRestart: {0.5, [3]float64{0.05, 0.1, 0.2}},
	SiteDuplicateRecovery:       {0.6, [3]float64{0.2, 0.5, 0.9}},
	SiteLostRefundAck:           {0.6, [3]float64{0.1, 0.25, 0.5}},
	SiteCrossGeneration:         {0.6, [3]float64{0.1, 0.2, 0.3}},
	SiteNetDrop:                 {0.5, [3]float64{0.01, 0.03, 0.08}},
	SiteNetDuplicate:            {0.5, [3]float64{0.01, 0.03, 0.08}},
	SiteNetDelay:                {0.5, [3]float64{0.01, 0.03, 0.08}},
	SiteLedgerCrash:             {0.4, [3]float64{0.05, 0.1, 0.2}},
	SiteCommitFail:              {0.4, [3]float64{0.01, 0.03, 0.06}},
	SiteCommitConflict:          {0.4, [3]float64{0.01, 0.03, 0.06}},
	SiteCommitAckLost:           {0.4, [3]float64{0.01, 0.03, 0.06}},
	SiteExecutorCrash:           {0.4, [3]float64{0.1, 0.2, 0.4}},
	SiteExecutionOverrun:        {0.5, [3]float64{0.05, 0.15, 0.3}},
	SiteDigestReuse:             {0.4, [3]float64{0.05, 0.1, 0.2}},
	SiteWorkerRereadRace:        {0.6, [3]float64{0.5, 0.8, 1}},
	SiteRetentionRetry:          {0.6, [3]float64{0.1, 0.2, 0.4}},
	SiteCrashMidCut:             {0.6, [3]float64{0.1, 0.2, 0.4}},
	SiteLostRecordAck:           {0.6, [3]float64{0.15, 0.3, 0.5}},
}

// faults is one interleaving's fault plan and counters.
type faults struct {
	rng     *rand.Rand
	rate    [numSites]float64 // 0 when disabled
	fired   [numSites]int64
	healed  bool // after the fault phase nothing fires
	enabled [numSites]bool
}

// newFaults draws the interleaving's fault plan: which sites are on, at
// which rate. With records off (Config.RecordShare 0) lost_record_ack is neither drawn
// nor enabled, so that the random stream, and every interleaving, is the
// one of before records existed.
func newFaults(rng *rand.Rand, only []Site, records bool) faults {
	f := faults{rng: rng}
	for s := Site(0); s < numSites; s++ {
		if s == SiteLostRecordAck && !records {
			continue
		}
		p := profiles[s]
		on := rng.Float64() < p.enable
		rate := p.rates[rng.IntN(len(p.rates))]
		if only != nil {
			on = false
			for _, o := range only {
				on = on || o == s
			}
		}
		if on {
			f.enabled[s] = true
			f.rate[s] = rate
		}
	}
	return f
}

// fire reports whether site s fires now, and counts it if so. It draws one
// random number whether the site is enabled or not, so that the fault plan
// alone does not shift the random stream of the decisions that follow.
func (f *faults) fire(s Site) bool {
	x := f.rng.Float64()
	if f.healed || x >= f.rate[s] {
		return false
	}
	f.fired[s]++
	return true
}
