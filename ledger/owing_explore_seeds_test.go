package ledger_test

import "testing"

// TestOwingExploreSeeds replays the histories of TestOwingExplore that
// broke one bucket's bound on main (EXPLORE_SEEDS=16000). Two causes:
// two owing accounts refilling one unit for the same time while the
// subject is frozen (4152, 7401, 10163: each repays its own debt there,
// or one repays an interval the current account refilled already), and
// a full burst opened again at a switch in a unit that an owing member
// opened and spent, after it left the owing set unmarked (7515, 10262,
// 10266, 10267, 10283).
func TestOwingExploreSeeds(t *testing.T) {
	t.Skip("known failures, diagnosed and not yet fixed: two owing accounts refill one unit for the same time; a member leaving the owing set leaves a unit it opened unmarked (openAccount opens a second burst)")
	for _, seed := range []int{4152, 7401, 7515, 10163, 10262, 10266, 10267, 10283} {
		if msg, _ := exploreSeed(seed, false); msg != "" {
			t.Errorf("seed %d: %s", seed, msg)
		}
	}
}
