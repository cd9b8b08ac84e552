package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
)

// policyListCounting counts reads of every policy (PolicyList, and
// PolicyListAfter or an unfiltered PolicyPage from the start:
// fromStart), and the rows read as new (PolicyListAfter, and PolicyPage
// unfiltered: the cache's catch-up reads pages of it).
type policyListCounting struct {
	store.Store
	lists, newRows, afterReads, fromStart atomic.Int64
}

func (s *policyListCounting) PolicyListAfter(ctx context.Context, after uint64) ([]ledger.Policy, error) {
	newer, err := s.Store.PolicyListAfter(ctx, after)
	s.afterReads.Add(1)
	if after == 0 {
		s.fromStart.Add(1)
	}
	s.newRows.Add(int64(len(newer)))
	return newer, err
}

func (s *policyListCounting) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	page, err := s.Store.PolicyPage(ctx, f)
	if f == (store.PolicyFilter{After: f.After, Limit: f.Limit}) {
		s.afterReads.Add(1)
		if f.After == 0 {
			s.fromStart.Add(1)
		}
		s.newRows.Add(int64(len(page)))
	}
	return page, err
}

func (s *policyListCounting) PolicyList(ctx context.Context) ([]ledger.Policy, error) {
	s.lists.Add(1)
	return s.Store.PolicyList(ctx)
}

// policyCountingHarness is a harness whose engine's store counts its
// reads of every policy.
func policyCountingHarness(t *testing.T) (*harness, *policyListCounting) {
	var counting *policyListCounting
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		counting = &policyListCounting{Store: st}
		return counting
	}})
	return h, counting
}

// A platform with a policy per tenant publishes them one by one: each
// publish read every policy back (to answer from a reloaded cache), so
// publishing N policies read N^2 rows: 10,000 took minutes, at 3 a second
// by the end. Neither a publish, nor GetPolicy, nor GetAccount, nor a
// reserve for a subject without a policy (a miss, at most ten a second)
// reads every policy now; what another replica published is still seen
// on a miss, and what GetPolicy says is still fresh.
func TestPublishingAndMissesDoNotReadEveryPolicy(t *testing.T) {
	h, counting := policyCountingHarness(t)
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
	other := h.otherReplica()
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

	other := h.otherReplica()
	other.ok("RollbackPolicy", `{"generation":"2"}`, "")
	time.Sleep(150 * time.Millisecond) // past the miss reload interval
	if got := h.ok("Reserve", reserve, ""); field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("reserve of the unit the rollback brought back: %v", got)
	}
}

// policyHeadFailing fails PolicyHead, PolicyHeads and AccountsView (which
// reads heads) while fail is set.
type policyHeadFailing struct {
	store.Store
	fail atomic.Bool
}

func (s *policyHeadFailing) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	if s.fail.Load() {
		return ledger.PolicyHead{}, fmt.Errorf("%w: policy head: connection reset by peer", store.ErrUnavailable)
	}
	return s.Store.PolicyHead(ctx, key)
}

func (s *policyHeadFailing) AccountsView(ctx context.Context, subjects []ledger.PolicyKey) (store.AccountsView, error) {
	if s.fail.Load() {
		return store.AccountsView{}, fmt.Errorf("%w: accounts view: connection reset by peer", store.ErrUnavailable)
	}
	return s.Store.AccountsView(ctx, subjects)
}

func (s *policyHeadFailing) PolicyHeads(ctx context.Context, keys []ledger.PolicyKey) (map[ledger.PolicyKey]ledger.PolicyHead, error) {
	if s.fail.Load() {
		return nil, fmt.Errorf("%w: policy heads: connection reset by peer", store.ErrUnavailable)
	}
	return s.Store.PolicyHeads(ctx, keys)
}

// GetPolicy checks the token's scope on the generation before it reads
// the generation's head: another tenant's generation answers as one never
// published, also when the head read would fail (a 503 there told a
// scoped token the generation exists).
func TestGetPolicyOutOfScopeAnswersNotFoundBeforeReadingTheHead(t *testing.T) {
	var failing *policyHeadFailing
	h := newHarness(t, harnessOptions{auth: true, tokens: scopedTokens, wrapStore: func(st store.Store) store.Store {
		failing = &policyHeadFailing{Store: st}
		return failing
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-b/u1","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, adminToken)
	failing.fail.Store(true)
	foreign := h.call("GetPolicy", `{"generation":"1"}`, gwAToken)
	h.wantError(foreign, http.StatusNotFound, "not_found", server.ReasonPolicyNotFound)
	missing := h.call("GetPolicy", `{"generation":"2"}`, gwAToken)
	if strings.ReplaceAll(string(foreign.raw), `1"`, `2"`) != string(missing.raw) {
		t.Errorf("another tenant's generation answers\n  %s\nbut a missing one\n  %s", foreign.raw, missing.raw)
	}
	// The admin's read needs the head: unavailable, not not found.
	h.wantError(h.call("GetPolicy", `{"generation":"1"}`, adminToken), http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
}

// Misses of a subject a route's "*" policy decides (a unit it lacks) read
// only that policy's head, not every policy, and what a miss read as new
// is not read again by the next: a miss costs the generations published
// since the last one and a row.
func TestMissesUnderAWildcardPolicyReadItsHeadAndOnlyWhatIsNew(t *testing.T) {
	h, counting := policyCountingHarness(t)
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	other := h.otherReplica()
	for i := range 3 {
		other.ok("PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"elsewhere-%d","route":"embed","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, i), "")
	}
	time.Sleep(150 * time.Millisecond) // past the miss reload interval
	lists := counting.lists.Load()
	var rows int64
	for i := range 3 {
		if i > 0 {
			time.Sleep(150 * time.Millisecond)
			rows = counting.newRows.Load()
		}
		r := h.call("Reserve", fmt.Sprintf(`{"reservationId":"miss-%d","subject":"someone","route":"chat.generate","units":{"requests":1}}`, i), "")
		h.wantError(r, 400, "invalid_argument", server.ReasonUnknownUnit)
		if n := counting.newRows.Load() - rows; i > 0 && n != 0 {
			t.Errorf("miss %d read %d generations as new, want none (the first miss read them)", i, n)
		}
	}
	if n := counting.lists.Load() - lists; n != 0 {
		t.Errorf("3 misses under the route's \"*\" policy read every policy %d times, want 0", n)
	}
}

// GetAccount reads the heads that decide for the subject; when that read
// fails it answers 503, as when its policies could not be read, not the
// accounts refilled by a guess at the deciding generation.
func TestGetAccountWhoseHeadReadFailsIsUnavailable(t *testing.T) {
	var failing *policyHeadFailing
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		failing = &policyHeadFailing{Store: st}
		return failing
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-h","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"r-h","subject":"tenant-h","route":"chat.generate","units":{"tokens":5}}`, "")
	failing.fail.Store(true)
	h.wantError(h.call("GetAccount", `{"subject":"tenant-h","route":"chat.generate"}`, ""), http.StatusServiceUnavailable, "unavailable", server.ReasonStoreUnavailable)
	failing.fail.Store(false)
	if got := h.ok("GetAccount", `{"subject":"tenant-h","route":"chat.generate"}`, ""); len(got["accounts"].([]any)) != 1 {
		t.Fatalf("GetAccount once the store answers: %v", got)
	}
}

// A new generation of a key this replica knows, published on another
// replica with a unit the cached one lacks: the miss for that unit reads
// it as new, and the key's head then names it, so the reserve is admitted
// without a read of every policy.
func TestANewUnitPublishedElsewhereIsFoundWithoutReadingEveryPolicy(t *testing.T) {
	h, counting := policyCountingHarness(t)
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-u","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	h.ok("Reserve", `{"reservationId":"r-tokens","subject":"tenant-u","route":"chat.generate","units":{"tokens":5}}`, "")
	other := h.otherReplica()
	other.ok("PublishPolicy", `{"policy":{"subject":"tenant-u","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"},{"unit":"requests","burst":"10","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	time.Sleep(150 * time.Millisecond) // past the miss reload interval
	lists := counting.lists.Load()
	if got := h.ok("Reserve", `{"reservationId":"r-requests","subject":"tenant-u","route":"chat.generate","units":{"requests":1}}`, ""); field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("reserve of the unit published elsewhere: %v", got)
	}
	if n := counting.lists.Load() - lists; n != 0 {
		t.Errorf("the miss read every policy %d times, want 0", n)
	}
}

// GetPolicy reads one generation from the store: one past int64's range
// (which a store holds as a signed column) is not found, as any generation
// never published, not a store error or another generation.
func TestGetPolicyOfAGenerationPastInt64IsNotFound(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-g","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	for _, g := range []string{"9223372036854775808", "9223372036854775809", "18446744073709551615"} {
		h.wantError(h.call("GetPolicy", `{"generation":"`+g+`"}`, ""), http.StatusNotFound, "not_found", server.ReasonPolicyNotFound)
	}
}

// Misses within missReloadInterval (100 ms) of the last catch-up read
// nothing: a stream of reserves for subjects without a policy costs one
// read of what is new per interval, not one per request.
func TestMissesWithinTheIntervalReadNothing(t *testing.T) {
	h, counting := policyCountingHarness(t)
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-m","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100","refillUnits":"1","refillInterval":"1s"}]}}`, "")
	reads := counting.afterReads.Load()
	first := time.Now()
	for i := range 5 {
		r := h.call("Reserve", fmt.Sprintf(`{"reservationId":"miss-%d","subject":"nobody","route":"chat.generate","units":{"tokens":1}}`, i), "")
		h.wantError(r, 404, "not_found", server.ReasonNoPolicy)
	}
	if time.Since(first) >= 100*time.Millisecond {
		t.Skip("the misses took longer than the interval on this machine: nothing to check")
	}
	if n := counting.afterReads.Load() - reads; n != 1 {
		t.Errorf("5 misses within 100 ms read what is new %d times, want once", n)
	}
}

// A reserve the ledger refuses as mapped for a generation that no longer
// decides (another replica published or rolled back since), and a
// rollback here, bring the cache to what decides by reading what is new
// and the keys' heads: with a policy per tenant, every publish on one
// replica cost every other replica a read of every policy at its next
// reserve for that tenant, and every rollback one more.
func TestStaleRefusalsAndRollbacksDoNotReadEveryPolicy(t *testing.T) {
	h, counting := policyCountingHarness(t)
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
	other := h.otherReplica()
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

// policyHeadHolding holds a read of a head, once armed, after it read the
// row and before it returns it.
type policyHeadHolding struct {
	store.Store
	hold          atomic.Bool
	read, release chan struct{}
}

func (s *policyHeadHolding) PolicyHead(ctx context.Context, key ledger.PolicyKey) (ledger.PolicyHead, error) {
	h, err := s.Store.PolicyHead(ctx, key)
	if s.hold.CompareAndSwap(true, false) {
		s.read <- struct{}{}
		<-s.release
	}
	return h, err
}

// A rollback here takes its key's head; a publish of that key here
// answered after the head was read is newer than the head knew: the
// cache keeps it active and live (it was marked rolled back, and the next
// reserve mapped for the older generation was refused as stale).
func TestAPublishDuringARollbacksHeadReadStaysActive(t *testing.T) {
	var holding *policyHeadHolding
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		holding = &policyHeadHolding{Store: st, read: make(chan struct{}), release: make(chan struct{})}
		return holding
	}})
	policy := func(burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":"tenant-r","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d","refillUnits":"1","refillInterval":"1s"}]}}`, burst)
	}
	h.ok("PublishPolicy", policy(100), "") // 1
	h.ok("PublishPolicy", policy(200), "") // 2
	holding.hold.Store(true)
	rolledBack := make(chan error, 1)
	go func() {
		resp, err := http.Post(h.url+"/capledger.v1.LedgerService/RollbackPolicy", "application/json", strings.NewReader(`{"generation":"2"}`))
		if err == nil {
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("rollback: status %d", resp.StatusCode)
			}
			resp.Body.Close()
		}
		rolledBack <- err
	}()
	<-holding.read                         // the rollback read the head: 1 active, 2 the latest
	h.ok("PublishPolicy", policy(300), "") // 3
	close(holding.release)
	if err := <-rolledBack; err != nil {
		t.Fatal(err)
	}
	commands := h.engine.Stats().Commands
	got := h.ok("Reserve", `{"reservationId":"r-1","subject":"tenant-r","route":"chat.generate","units":{"tokens":1}}`, "")
	if g := got["policyGeneration"]; g != "3" {
		t.Fatalf("reserved under generation %v, want 3", g)
	}
	if n := h.engine.Stats().Commands - commands; n != 1 {
		t.Errorf("the reserve ran %d commands, want 1 (none refused as stale)", n)
	}
}

// The console's reads and ListDebts show accounts with their policies:
// ListDebts, ListAccountStandings (in debt, every account, one subject,
// one subject key), GetFairness and DrainProgress read every policy per
// call, seconds at 100,000 of them. They read the generations and heads
// of the accounts they show now, and still say which generation decides.
func TestAccountReadsDoNotReadEveryPolicy(t *testing.T) {
	h, counting := policyCountingHarness(t)
	policy := func(subject string, burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":%q,"route":"chat.generate","dimensions":[{"unit":"tokens","burst":"%d"}]}}`, subject, burst)
	}
	h.ok("PublishPolicy", policy("*", 1000), "")           // generation 1
	h.ok("PublishPolicy", policy("tenant-a", 100), "")     // 2
	h.ok("PublishPolicy", policy("tenant-b", 100), "")     // 3
	h.ok("Reserve", reserveFor("r-c", "tenant-c", 10), "") // under "*" (1)
	h.ok("Reserve", reserveFor("r-a", "tenant-a", 10), "")
	h.ok("Start", `{"reservationId":"r-a","operationId":"op"}`, "")
	h.ok("Settle", `{"reservationId":"r-a","operationId":"op","actualUnits":{"tokens":150}}`, "") // 50 in debt
	h.ok("Reserve", reserveFor("r-b", "tenant-b", 10), "")
	h.ok("PublishPolicy", policy("tenant-b", 200), "") // 4 supersedes 3, whose account is left to drain
	before := counting.lists.Load() + counting.fromStart.Load()

	debts := h.ok("ListDebts", `{}`, "")
	if accounts := debts["accounts"].([]any); len(accounts) != 1 || accounts[0].(map[string]any)["subject"] != "tenant-a" {
		t.Errorf("ListDebts: %v, want tenant-a's account", debts)
	}
	decides := map[string]bool{} // subject/generation -> active, over every answer
	for _, body := range []string{`{"inDebt":true}`, `{}`, `{"subject":"tenant-b"}`, `{"subject":"tenant-c","route":"chat.generate","region":"global"}`} {
		got := h.consoleOK("ListAccountStandings", body, "")
		for _, a := range got["accounts"].([]any) {
			st := a.(map[string]any)
			a := st["account"].(map[string]any)
			decides[fmt.Sprint(a["subject"], "/", a["policyGeneration"])] = st["active"] == true
		}
	}
	for key, want := range map[string]bool{"tenant-a/2": true, "tenant-b/3": false, "tenant-c/1": true} {
		if got, ok := decides[key]; !ok || got != want {
			t.Errorf("standings of %s: active %v (shown %v), want %v; all: %v", key, got, ok, want, decides)
		}
	}
	fairness := h.consoleOK("GetFairness", `{}`, "")
	if groups := fairness["groups"].([]any); len(groups) != 1 || num(groups[0].(map[string]any)["subjectCount"]) != 2 {
		t.Errorf("GetFairness: %v, want one group of the 2 subjects whose account decides (tenant-b's generation 4 has none)", fairness)
	}
	drain := h.rolloutOK("DrainProgress", `{"generations":["3","4"]}`, "")
	gens := drain["generations"].([]any)
	if len(gens) != 2 || gens[0].(map[string]any)["active"] == true || num(gens[0].(map[string]any)["accounts"]) != 1 || gens[1].(map[string]any)["active"] != true {
		t.Errorf("DrainProgress of 3 and 4: %v, want 3 superseded with one account, 4 active", drain)
	}
	if n := counting.lists.Load() + counting.fromStart.Load() - before; n != 0 {
		t.Errorf("ListDebts, 4 ListAccountStandings, GetFairness and DrainProgress read every policy %d times, want 0", n)
	}
}

// serve warms the policy cache (server.Config.WarmPolicies): /readyz
// answers 503 until every policy is read into it once, then ready; a
// reserve after that is answered from the cache, without a read of every
// policy (the first one after a start read them all, while reserves of
// other keys not cached waited).
func TestWarmPoliciesBeforeReady(t *testing.T) {
	h, counting := policyCountingHarness(t)
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-a","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100"}]}}`, "")
	h.ok("PublishPolicy", `{"policy":{"subject":"*","route":"embed","dimensions":[{"unit":"tokens","burst":"100"}]}}`, "")

	srv := server.New(h.engine, server.Config{Clock: h.clock.Now, WarmPolicies: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	started := *h
	started.url = serve(t, srv)
	if got := started.get("/readyz"); !strings.HasPrefix(got, "not ready: loading the policy cache") {
		t.Fatalf("/readyz before the load: %q, want not ready: loading the policy cache", got)
	}
	reads := counting.lists.Load() + counting.fromStart.Load()
	if err := srv.WarmPolicies(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := counting.lists.Load() + counting.fromStart.Load() - reads; n != 1 {
		t.Errorf("the load read every policy %d times, want once", n)
	}
	if got := started.get("/readyz"); got != "ready\n" {
		t.Fatalf("/readyz after the load: %q, want ready", got)
	}
	reads = counting.lists.Load() + counting.fromStart.Load()
	started.ok("Reserve", reserveFor("r-a", "tenant-a", 1), "")
	started.ok("Reserve", `{"reservationId":"r-e","subject":"tenant-e","route":"embed","units":{"tokens":1}}`, "")
	if n := counting.lists.Load() + counting.fromStart.Load() - reads; n != 0 {
		t.Errorf("reserves after the load read every policy %d times, want 0", n)
	}
	// A server not asked to warm is ready at once (tests, embedders).
	if got := h.get("/readyz"); got != "ready\n" {
		t.Errorf("/readyz without WarmPolicies: %q", got)
	}
}

// failingFirstLoads fails its first fails reads of every policy from the
// start (PolicyPage after 0, the cache's first page).
type failingFirstLoads struct {
	store.Store
	fails atomic.Int64
}

func (s *failingFirstLoads) PolicyPage(ctx context.Context, f store.PolicyFilter) ([]store.ListedPolicy, error) {
	if f.After == 0 && s.fails.Add(-1) >= 0 {
		return nil, fmt.Errorf("policies after 0: %w", store.ErrUnavailable)
	}
	return s.Store.PolicyPage(ctx, f)
}

// A load that fails is retried; meanwhile /readyz names its error.
func TestWarmPoliciesRetriesAFailedLoad(t *testing.T) {
	failing := &failingFirstLoads{}
	h := newHarness(t, harnessOptions{wrapStore: func(st store.Store) store.Store {
		failing.Store = st
		return failing
	}})
	h.ok("PublishPolicy", `{"policy":{"subject":"tenant-a","route":"chat.generate","dimensions":[{"unit":"tokens","burst":"100"}]}}`, "")
	failing.fails.Store(1)
	srv := server.New(h.engine, server.Config{Clock: h.clock.Now, WarmPolicies: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	started := *h
	started.url = serve(t, srv)
	warmed := make(chan error, 1)
	go func() { warmed <- srv.WarmPolicies(context.Background()) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := started.get("/readyz")
		if strings.Contains(got, "retrying every 1s after: list policies: policies after 0: store unavailable") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz while the load fails: %q, want its error", got)
		}
	}
	if err := <-warmed; err != nil {
		t.Fatal(err)
	}
	if got := started.get("/readyz"); got != "ready\n" {
		t.Fatalf("/readyz after the retried load: %q, want ready", got)
	}
	started.ok("Reserve", reserveFor("r-a", "tenant-a", 1), "")
}

// A reserve right after the warm load of a start, for a key published
// meanwhile through another replica (here: the engine, past this
// server's cache), catches up at once and is admitted, as the first miss
// after a start was before the warm load: the warm load does not count
// as a miss's reload, which would answer "no policy" for
// missReloadInterval (replicas started, then a publish on one and
// reserves on the other, failed so).
func TestAMissRightAfterTheWarmLoadCatchesUp(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	if err := h.srv.WarmPolicies(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := ledger.Policy{Key: ledger.PolicyKey{Subject: ledger.AnySubject, Route: "chat.generate", Region: "global"},
		Dimensions: []ledger.Dimension{{Unit: "tokens", Burst: 100}}}.WithDefaults()
	if res, err := h.engine.Do(context.Background(), ledger.Command{Kind: ledger.KindPublishPolicy, Policy: &p}); err != nil || res.Err != nil {
		t.Fatalf("publish past the server: %v %v", err, res.Err)
	}
	got := h.ok("Reserve", `{"reservationId":"r-w","subject":"tenant-w","route":"chat.generate","units":{"tokens":5}}`, "")
	if field(got, "reservation", "state") != "RESERVATION_STATE_RESERVED" {
		t.Fatalf("reserve right after the warm load: %v", got)
	}
}
