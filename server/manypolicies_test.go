package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// policyListCounting counts reads of every policy (PolicyList).
type policyListCounting struct {
	store.Store
	lists atomic.Int64
}

func (s *policyListCounting) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	s.lists.Add(1)
	return s.Store.PolicyList(ctx)
}

// A platform with a policy per tenant publishes them one by one: each
// publish read every policy back (to answer from a reloaded cache), so
// publishing N policies read N^2 rows: 10,000 took minutes, at 3 a second
// by the end. Neither a publish, nor GetPolicy, nor GetAccount, nor a
// reserve for a subject without a policy (a miss, at most ten a second)
// reads every policy now; what another replica published is still seen
// on a miss, and what GetPolicy says is still fresh.
func TestPublishingAndMissesDoNotReadEveryPolicy(t *testing.T) {
	var counting *policyListCounting
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		counting = &policyListCounting{Store: st}
		return counting
	}})
	policy := func(subject string) string {
		return fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, subject)
	}
	h.ok("PublishPolicy", policy("tenant-0"), "") // the first may load the cache
	before := counting.lists.Load()
	for i := 1; i <= 20; i++ {
		got := h.ok("PublishPolicy", policy(fmt.Sprintf("tenant-%d", i)), "")
		if field(got, "policy", "generation") != fmt.Sprint(i+1) || got["policy"].(map[string]any)["active"] != true {
			t.Fatalf("publish %d: %v", i, got)
		}
	}
	if again := h.ok("PublishPolicy", policy("tenant-3"), ""); again["replayed"] != true || again["policy"].(map[string]any)["active"] != true {
		t.Fatalf("the same terms again: %v, want the active generation replayed", again)
	}
	h.ok("Reserve", `{"reservationId":"r-1","subject":"tenant-7","route":"chat.generate","units":{"tokens":5}}`, "")
	if got := h.ok("GetAccount", `{"subject":"tenant-7","route":"chat.generate"}`, ""); fmt.Sprint(got) == "" {
		t.Fatal("no account")
	}
	if got := h.ok("GetPolicy", `{"generation":"8"}`, ""); field(got, "policy", "subject") != "tenant-7" || got["policy"].(map[string]any)["active"] != true {
		t.Fatalf("GetPolicy 8: %v", got)
	}
	for i := range 3 {
		if i > 0 {
			time.Sleep(150 * time.Millisecond) // past the miss reload interval
		}
		r := h.call("Reserve", fmt.Sprintf(`{"reservationId":"miss-%d","subject":"nobody","route":"chat.generate","units":{"tokens":1}}`, i), "")
		h.wantError(r, 404, "not_found", server.ReasonNoPolicy)
	}
	if n := counting.lists.Load() - before; n != 0 {
		t.Fatalf("20 publishes, a reserve, GetAccount, GetPolicy and 3 misses read every policy %d times, want 0", n)
	}

	// Another replica over the same store publishes for a subject this one
	// has never seen: the next miss here finds it.
	other := *h
	other.url = serve(t, server.New(h.engine, server.Config{Clock: h.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	other.ok("PublishPolicy", policy("late"), "")
	time.Sleep(150 * time.Millisecond)
	h.ok("Reserve", `{"reservationId":"r-late","subject":"late","route":"chat.generate","units":{"tokens":1}}`, "")
	if n := counting.lists.Load() - before; n != 0 {
		t.Fatalf("a miss for a policy published elsewhere read every policy %d times, want 0", n)
	}
	// ... and rolls tenant-7's generation back: GetPolicy here says so.
	other.ok("RollbackPolicy", `{"generation":"8"}`, "")
	if got := h.ok("GetPolicy", `{"generation":"8"}`, ""); got["policy"].(map[string]any)["active"] == true || got["policy"].(map[string]any)["rolledBack"] != true {
		t.Fatalf("GetPolicy after a rollback on another replica: %v, want inactive and rolled back", got)
	}
}

// A miss for a unit the cached deciding generation lacks, after another
// replica rolled that generation back to one that has the unit: the
// miss reads no new generation, but the key's head names another active
// generation, so the cache reloads and the reserve is admitted.
func TestAUnitARollbackElsewhereBroughtBackIsSeenOnAMiss(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-x","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-x","route":"chat.generate","dimensions":[{"unit":"requests","burst":"10","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	reserve := `{"reservationId":"r-tokens","subject":"tenant-x","route":"chat.generate","units":{"tokens":5}}`
	h.wantError(h.call("Reserve", reserve, ""), 400, "invalid_argument", server.ReasonUnknownUnit)

	other := *h
	other.url = serve(t, server.New(h.engine, server.Config{Clock: h.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	other.ok("RollbackPolicy", `{"generation":"2"}`, "")
	time.Sleep(150 * time.Millisecond) // past the miss reload interval
	if got := h.ok("Reserve", reserve, ""); field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("reserve of the unit the rollback brought back: %v", got)
	}
}

// A reserve the ledger refuses as mapped for a generation that no longer
// decides (another replica published or rolled back since), and a
// rollback here, bring the cache to what decides by reading what is new
// and the keys' heads: with a policy per tenant, every publish on one
// replica cost every other replica a read of every policy at its next
// reserve for that tenant, and every rollback one more.
func TestStaleRefusalsAndRollbacksDoNotReadEveryPolicy(t *testing.T) {
	var counting *policyListCounting
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		counting = &policyListCounting{Store: st}
		return counting
	}})
	policy := func(subject string, burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"1","refillInterval":"1s"}]}}`, subject, burst)
	}
	// reserve answers the generation that decided.
	reserve := func(id, subject string) any {
		t.Helper()
		return h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat.generate","units":{"tokens":1}}`, id, subject), "")["policyGeneration"]
	}
	h.ok("PublishPolicy", policy("*", 50), "")         // 1
	h.ok("PublishPolicy", policy("tenant-a", 100), "") // 2
	h.ok("PublishPolicy", policy("tenant-b", 100), "") // 3
	if g := reserve("a-1", "tenant-a"); g != "2" {
		t.Fatalf("tenant-a reserved under generation %v, want 2", g)
	}
	before := counting.lists.Load()

	// The other replica shares the engine and store: its publishes and
	// rollbacks read no policy list either.
	other := *h
	other.url = serve(t, server.New(h.engine, server.Config{Clock: h.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	// A publish elsewhere: here the cache still maps tenant-a to 2.
	other.ok("PublishPolicy", policy("tenant-a", 200), "") // 4
	if g := reserve("a-2", "tenant-a"); g != "4" {
		t.Fatalf("after a publish elsewhere tenant-a reserved under generation %v, want 4", g)
	}
	// A rollback elsewhere: 4 goes, 2 decides again.
	other.ok("RollbackPolicy", `{"generation":"4"}`, "")
	if g := reserve("a-3", "tenant-a"); g != "2" {
		t.Fatalf("after a rollback elsewhere tenant-a reserved under generation %v, want 2", g)
	}
	// tenant-b's only generation rolled back elsewhere: "*" decides.
	other.ok("RollbackPolicy", `{"generation":"3"}`, "")
	if g := reserve("b-1", "tenant-b"); g != "1" {
		t.Fatalf("with tenant-b's only generation rolled back elsewhere, reserved under generation %v, want 1 (\"*\")", g)
	}
	// "*" published again here, then rolled back elsewhere: a subject
	// without a policy of its own goes back to the older "*".
	h.ok("PublishPolicy", policy("*", 60), "") // 5
	if g := reserve("c-1", "tenant-c"); g != "5" {
		t.Fatalf("tenant-c reserved under generation %v, want 5", g)
	}
	other.ok("RollbackPolicy", `{"generation":"5"}`, "")
	if g := reserve("c-2", "tenant-c"); g != "1" {
		t.Fatalf("with the newer \"*\" rolled back elsewhere, tenant-c reserved under generation %v, want 1", g)
	}
	// A rollback here, then a reserve: mapped right the first time.
	h.ok("PublishPolicy", policy("tenant-a", 300), "") // 6
	h.ok("RollbackPolicy", `{"generation":"6"}`, "")
	commands := h.engine.Stats().Commands
	if g := reserve("a-4", "tenant-a"); g != "2" {
		t.Fatalf("after a rollback here tenant-a reserved under generation %v, want 2", g)
	}
	if n := h.engine.Stats().Commands - commands; n != 1 {
		t.Fatalf("the reserve after a rollback here ran %d commands, want 1 (none refused as stale)", n)
	}
	if n := counting.lists.Load() - before; n != 0 {
		t.Fatalf("publishes and rollbacks on two replicas and the stale reserves after them read every policy %d times, want 0", n)
	}
}
