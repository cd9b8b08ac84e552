package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/codec"
)

// A file of schema version 19 migrates to 20 with policies_key holding
// every policy: PolicyPage of a subject, paged one at a time, lists that
// subject's policies (of every route and region, or of the route asked)
// oldest first, each once, through the index.
func TestPoliciesKeyOfAnEarlierSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v19.db")
	db := dbAtSchema(t, path, 19)
	routes := []string{"chat", "embed"}
	for g := 1; g <= 60; g++ {
		// Six tenants, two routes, generations interleaved.
		p := ledger.Policy{Key: ledger.PolicyKey{Subject: fmt.Sprintf("tenant-%d", g%6), Route: routes[g%4/2], Region: "eu"},
			Generation: uint64(g), Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: int64(g), RefillUnits: 1, RefillInterval: time.Second}},
			Rollout: ledger.RolloutEnforce, FairnessWeight: 1, PublishedAt: time.Unix(0, int64(g))}
		var conv codec.Conv
		if _, err := db.Exec(insertSQL("policies", policyCols), policyArgs(&p, &conv)...); err != nil {
			t.Fatal(err)
		}
	}
	s := openUpgraded(t, db, path)
	checkIndexMigrated(t, s, "policies_key")
	if plan := queryPlan(t, s, policyPageOfSubjectSQL, 0, "tenant-1", "", "", 1); !strings.Contains(plan, "USING INDEX policies_key") {
		t.Errorf("a subject's page after the migration:\n%s", plan)
	}
	for _, f := range []store.PolicyFilter{{Subject: "tenant-1"}, {Subject: "tenant-4", Route: "embed"}, {Subject: "tenant-4", Route: "chat", Region: "eu"}} {
		var want []uint64
		for g := 1; g <= 60; g++ {
			if fmt.Sprintf("tenant-%d", g%6) == f.Subject && (f.Route == "" || routes[g%4/2] == f.Route) {
				want = append(want, uint64(g))
			}
		}
		var got []uint64
		for f.Limit = 1; ; {
			page, err := s.PolicyPage(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page[0].Policy.Generation)
			f.After = page[0].Policy.Generation
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || len(want) == 0 {
			t.Errorf("%s/%s/%s page by page: %v, want %v", f.Subject, f.Route, f.Region, got, want)
		}
	}
}
