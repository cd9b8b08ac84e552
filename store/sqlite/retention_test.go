package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// The retention worker's queries read their indexes in the order they
// return: never a scan of the reservations table, never a sort.
func TestRetentionQueriesUseIndexes(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct{ name, query, index string }{
		{"finished reservations", finishedSQL, "reservations_finished"},
		{"tombstones due", tombstonesDueSQL, "tombstones_finished"},
	} {
		plan := queryPlan(t, s, tc.query, 1, 10)
		if !strings.Contains(plan, tc.index) || strings.Contains(plan, "TEMP B-TREE") {
			t.Errorf("%s: plan does not read %s in order:\n%s", tc.name, tc.index, plan)
		}
	}
}
