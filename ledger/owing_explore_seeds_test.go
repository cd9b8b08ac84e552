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
		if msg, _ := exploreSeed(seed, false); msg != "" {
			t.Errorf("seed %d: %s", seed, msg)
		}
	}
}
