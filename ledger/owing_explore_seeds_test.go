package ledger_test

import "testing"

// TestOwingExploreSeeds replays the histories of TestOwingExplore that
// broke one bucket's bound (EXPLORE_SEEDS=16000) before two fixes: two
// owing accounts refilled one unit for the same time while the subject
// was frozen (4152, 7401, 10163: each repaid its own debt there, or one
// repaid an interval the current account had refilled already; they now
// repay in turns, repayTurns), and a full burst opened again at a switch
// in a unit that an owing member opened and spent, after it left the
// owing set with the unit unmarked (7515, 10262, 10266, 10267, 10283; a
// leaving member now marks the units the current account does not limit
// too). TestOwingTurns* hold the cut-down cases. 17515 and 21011 put the
// frozen current account above its burst (the audit's above_burst) when
// its refill made room for the deciding account's debt; that change was
// reverted. 2675 and 2688 took a remint's available negative when one
// burst room rule (burstRoom) was first applied to it as units less room:
// the remint repaid the account's debt first (a record beside a full
// hold, then a legacy budget reconciled unused), so it added less to
// available than it minted.
func TestOwingExploreSeeds(t *testing.T) {
	for _, seed := range []int{2675, 2688, 4152, 7401, 7515, 10163, 10262, 10266, 10267, 10283, 17515, 21011} {
		if msg, _ := exploreSeed(seed, retryOff); msg != "" {
			t.Errorf("seed %d: %s", seed, msg)
		}
	}
}

// TestOwingExploreRetrySeeds replays, with the retry of each refusal
// after its Retry-After (EXPLORE_RETRY=1), the histories of
// TestOwingExplore (EXPLORE_SEEDS=3000) whose retry was refused again on
// a frozen subject: the request needed the debt the deciding generation's
// account owed in a unit the owing current account refills, and was
// itself beyond that account's burst less holds less the debt. The
// current account's refill stopped at its burst and the switch repaid
// the debt from what it moved. The debt now moves to the current account
// while the subject is frozen (intoDeciding), whose refill repays it first.
func TestOwingExploreRetrySeeds(t *testing.T) {
	for _, seed := range []int{767, 805, 816, 883, 890, 894, 899, 900, 919, 2685, 2689} {
		if msg, _ := exploreSeed(seed, retryAlone); msg != "" {
			t.Errorf("seed %d: %s", seed, msg)
		}
	}
}
