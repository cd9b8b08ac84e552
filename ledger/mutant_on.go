//go:build capledger_mutants

package ledger

import (
	"os"
	"slices"
)

// mutantOn reports whether the named, deliberately broken variant of the
// ledger is switched on: CAPLEDGER_MUTANT names it. Only binaries built with
// the capledger_mutants tag read it; the variants are
//
//   - refund_twice: a release of an already released reservation gives its
//     hold back again instead of replaying;
//   - expire_started: an expiry claim takes a STARTED reservation whose
//     hold ran out;
//   - debt_admits: outstanding debt does not freeze admission;
//   - unknown_without_limit: the execution-limit worker's unknown-marking
//     takes STARTED work whose execution deadline is unset or not passed;
//   - retry_after_ignores_holds: a rejection promises a Retry-After from
//     refill even when only outstanding holds ending can make room.
//   - shard_unknown_reminted: a shard's first reconciliation counts the
//     holds of STARTED / USAGE_UNKNOWN receipts as unused and remints them;
//   - worker_marks_started_unknown: the expiry worker's claim of a hold
//     that ran out after its work started marks the work USAGE_UNKNOWN
//     (before any execution limit passed) instead of failing;
//   - refill_half_debt: a refill repays only half the debt its minted
//     units could repay, and makes the rest available;
//   - fairness_weight_ignored: the first policy published (generation 1)
//     is stored with fairness weight 1, whatever it asked for;
//   - reserve_ignores_tombstone: a reserve of an id retention removed does
//     not look at its tombstone and reserves (debits) it anew;
//   - record_charges_replay: a record retried with the same id, operation
//     id and usage charges the usage again instead of replaying;
//   - record_ignores_tombstone: a record of an id retention removed does
//     not look at its tombstone and charges the usage anew.
//   - shard_retained_drops_spent: shard retention folds a removed shard's
//     allocated and reminted units into the retained shard totals, not its
//     spent units;
//   - shard_removed_early: shard retention removes a settled shard without
//     waiting a window after it ended;
//   - dropped_debt_forgotten: debt in a unit the deciding generation does
//     not limit neither keeps its account current nor makes it current
//     again (a late settle's): the subject switches and admits while it is
//     owed, and nothing repays it.
//   - dropped_debt_second_untracked: an account that owes debt its
//     subject's current account may not take joins no owing set (only
//     the current account is tracked, as before the set existed): late
//     debt while another account owes, or a record's debt on the deciding
//     generation's account while frozen, stays where nothing repays it.
//   - shard_dropped_debt_skipped: a shard's usage beyond its allocation in
//     a unit the remint's destination does not limit is charged nowhere
//     (the behaviour before it was charged to the shard's own account).
//   - move_mints_one: a move (switch, forward, drain) mints one unit more
//     at its destination than left its source, where the destination's
//     burst has room for it (each account's own books still balance).
//
// The variable is read on every call so that a test can switch variants
// between runs in one process. A name not in mutantNames panics: the list
// MutantNames returns is the one a misspelt CAPLEDGER_MUTANT is refused
// with, so it must not miss a variant.
func mutantOn(name string) bool {
	if !slices.Contains(mutantNames, name) {
		panic("ledger: mutant " + name + " is not in mutantNames")
	}
	return os.Getenv("CAPLEDGER_MUTANT") == name
}

// mutantNames are the variants above.
var mutantNames = []string{
	"refund_twice", "expire_started", "debt_admits", "unknown_without_limit",
	"retry_after_ignores_holds", "shard_unknown_reminted", "worker_marks_started_unknown",
	"refill_half_debt", "fairness_weight_ignored", "reserve_ignores_tombstone",
	"record_charges_replay", "record_ignores_tombstone", "shard_retained_drops_spent",
	"shard_removed_early", "dropped_debt_forgotten", "dropped_debt_second_untracked",
	"shard_dropped_debt_skipped", "move_mints_one",
}

// MutantNames returns the names CAPLEDGER_MUTANT can select in the
// ledger (none without the capledger_mutants build tag).
func MutantNames() []string { return slices.Clone(mutantNames) }
