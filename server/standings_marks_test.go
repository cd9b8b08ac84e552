package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store"
)

// slowPages makes each read of a page of accounts take at least pause,
// so that a shared ranking's scan takes that long and is reused for
// about nine times as long after it.
type slowPages struct {
	store.Store
	pause time.Duration
}

func (s *slowPages) AccountsPage(ctx context.Context, f store.AccountFilter) ([]ledger.Account, error) {
	time.Sleep(s.pause)
	return s.Store.AccountsPage(ctx, f)
}

// The ranking of every account (ListAccountStandings, shared between
// callers and reused for up to nine times its scan) shows each standing's
// active and rolled-back marks as they are after a rollback or a publish
// committed through this server (RollbackPolicy, PublishPolicy,
// RollbackGenerations), even while the ranking read before it
// would still be reused: a console polled right after `rollback` or
// `policy publish` shows the new marks.
func TestConsoleStandingsShowMarksOfARollbackOrPublishAtOnce(t *testing.T) {
	h, publish, reserve := slowTenantX(t)
	type marks struct{ active, rolledBack bool }
	// standings returns each generation's marks in the ranking of every
	// account.
	standings := func() map[string]marks {
		t.Helper()
		got := map[string]marks{}
		for _, a := range h.consoleOK("ListAccountStandings", `{}`, consoleViewer)["accounts"].([]any) {
			st := a.(map[string]any)
			got[fmt.Sprint(field(st, "account", "policyGeneration"))] = marks{active: st["active"] == true, rolledBack: st["rolledBack"] == true}
		}
		return got
	}
	want := func(when string, got, want map[string]marks) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: marks by generation %v, want %v", when, got, want)
		}
	}
	publish(100) // generation 1
	reserve("x1")
	publish(200) // generation 2
	reserve("x2")
	want("before", standings(), map[string]marks{"1": {}, "2": {active: true}})

	h.ok("RollbackPolicy", `{"generation":"2"}`, adminToken) // generation 1 decides again
	want("after rolling generation 2 back", standings(), map[string]marks{"1": {active: true}, "2": {rolledBack: true}})

	publish(300) // generation 3: generation 1 no longer decides
	want("after publishing generation 3", standings(), map[string]marks{"1": {}, "2": {rolledBack: true}})

	// `capledger rollback` rolls back through the RolloutService.
	h.rolloutOK("RollbackGenerations", `{"generations":["3"]}`, adminToken) // generation 1 decides again
	want("after RollbackGenerations of generation 3", standings(), map[string]marks{"1": {active: true}, "2": {rolledBack: true}})
}

// GetFairness (shared between callers and reused for up to nine times its
// computation, like the ranking) counts each subject's account of the
// generation that decides after a rollback or a publish committed through
// this server, even while the answer computed before it would still be
// reused: the Fairness page polled right after `rollback` or `policy
// publish` shows the generation that decides now.
func TestConsoleFairnessCountsTheDecidingGenerationOfARollbackOrPublishAtOnce(t *testing.T) {
	h, publish, reserve := slowTenantX(t)
	// counted returns the generations of tenant-x's accounts GetFairness
	// counts.
	counted := func() []string {
		t.Helper()
		var got []string
		for _, g := range h.consoleOK("GetFairness", `{}`, consoleViewer)["groups"].([]any) {
			for _, s := range g.(map[string]any)["subjects"].([]any) {
				got = append(got, fmt.Sprint(s.(map[string]any)["policyGeneration"]))
			}
		}
		return got
	}
	want := func(when string, got []string, want string) {
		t.Helper()
		if fmt.Sprint(got) != "["+want+"]" {
			t.Fatalf("%s: generations counted %v, want [%s]", when, got, want)
		}
	}
	publish(100) // generation 1
	reserve("x1")
	publish(200) // generation 2
	reserve("x2")
	want("before", counted(), "2")

	h.ok("RollbackPolicy", `{"generation":"2"}`, adminToken) // generation 1 decides again
	want("after rolling generation 2 back", counted(), "1")

	publish(300) // generation 3
	reserve("x3")
	want("after publishing generation 3", counted(), "3")

	// `capledger rollback` rolls back through the RolloutService.
	h.rolloutOK("RollbackGenerations", `{"generations":["3"]}`, adminToken) // generation 1 decides again
	want("after RollbackGenerations of generation 3", counted(), "1")
}

// slowTenantX starts a server whose account pages each take 500 ms (so a
// shared answer read before a commit would still be reused after it) and
// returns it with a publish of tenant-x's policy at a burst (each a new
// generation) and a reserve of 10 tokens under it.
func slowTenantX(t *testing.T) (h *harness, publish func(burst int), reserve func(id string)) {
	h = newHarness(t, harnessOptions{auth: true, tokens: consoleTokens, wrapStore: func(st store.Store) store.Store {
		return &slowPages{Store: st, pause: 500 * time.Millisecond}
	}})
	publish = func(burst int) {
		h.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"tenant-x","route":"chat.generate",
		  "dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"1","refillInterval":"3600s"}],"holdTtl":"3600s"}}`, burst), adminToken)
	}
	reserve = func(id string) {
		h.ok("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-x","route":"chat.generate","units":{"tokens":10}}`, id), gatewayToken)
	}
	return h, publish, reserve
}
