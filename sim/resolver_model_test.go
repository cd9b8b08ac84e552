package sim

import (
	"reflect"
	"testing"
	"time"
)

// TestResolverModel runs the engine's resolver against the simulated
// endpoint: executors that come back after up to 3 minutes or never, and
// answers that fail, time out, lie without authentication, or come late.
// Every operation whose executor came back resolves to its true usage,
// the rest stay held, and the UNKNOWN age p99 is within the 10-minute
// gate; a seed replays the same run.
func TestResolverModel(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if raceEnabled {
		seeds = seeds[:1]
	}
	for _, seed := range seeds {
		cfg := ResolverModelConfig{Seed: seed}
		report, err := RunResolverModel(cfg)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for _, p := range report.Problems {
			t.Errorf("seed %d: %s", seed, p)
		}
		if report.LiesRefused == 0 || report.NeverReturned == 0 {
			t.Errorf("seed %d: the run exercised no lies (%d) or no lost executors (%d)", seed, report.LiesRefused, report.NeverReturned)
		}
		if report.P99 > 10*time.Minute {
			t.Errorf("seed %d: UNKNOWN age p99 %v, past the 10-minute gate", seed, report.P99)
		}
		t.Logf("seed %d: %d unknown, %d resolved, %d held (executor never back), %d lies refused; age p50 %v p99 %v max %v",
			seed, report.Unknown, report.Resolved, report.Unresolved, report.LiesRefused, report.P50, report.P99, report.Max)
		again, err := RunResolverModel(cfg)
		if err != nil || !reflect.DeepEqual(again, report) {
			t.Errorf("seed %d does not replay: %+v vs %+v", seed, again, report)
		}
	}
}
