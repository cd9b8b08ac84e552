package main

import (
	"fmt"
	"sync"
	"testing"
)

// TestGenerationSwitchAcrossReplicas: a new policy generation published
// through one `capledger serve` replica of a PostgreSQL database while
// the other replica admits and holds work under the old one. The
// publish's answer is lost; the other replica's next reserve is decided
// by the new generation (not the one it last used), and the switch moves
// the old account's available capacity once; the publish's retry on the
// other replica creates no further generation; the late settle and release of
// old-generation work, their answers lost and retried on the other
// replica, forward their refunds to the new generation once. Each
// account's terms are exact after each step and the audit is clean. On
// SQLite every call goes to one process.
func TestGenerationSwitchAcrossReplicas(t *testing.T) {
	onTwoReplicasAndSQLite(t, testGenerationSwitch)
}

func testGenerationSwitch(t *testing.T, bin, firstURL, otherURL string) {
	lossy := newLossyLink(t, firstURL)
	const subject = "tenant-gen"
	policy := func(burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":"*","route":"gen","holdTtl":"3600s","epochLength":"315360000s",
		  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, burst)
	}
	g1 := fmt.Sprint(asMap(mustPost(t, firstURL, "PublishPolicy", policy(1000))["policy"])["generation"])
	reserve := func(id string, tokens int64) map[string]any {
		t.Helper()
		return mustPost(t, otherURL, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"gen","units":{"tokens":%d}}`, id, subject, tokens))
	}
	settle := func(id string, actual int64) string {
		return fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, id, id, actual)
	}
	replays := func(url, method, body string) {
		t.Helper()
		out := mustPost(t, url, method, body)
		if out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
			t.Errorf("%s retry on %s: %v; want a replay refunding nothing", method, url, out)
		}
	}
	wantTerms := func(want map[string]map[string]int64) {
		t.Helper()
		generations := generationTerms(t, otherURL, subject, "gen")
		if len(generations) != len(want) {
			t.Errorf("%s: accounts of generations %v, want %d", subject, generations, len(want))
		}
		for generation, tm := range generations {
			checkConservation(t, subject+" generation "+generation, tm)
			for term, v := range want[generation] {
				if got := tm["tokens"][term]; got != v {
					t.Errorf("%s generation %s: %s %d, want %d (%v)", subject, generation, term, got, v, tm["tokens"])
				}
			}
		}
	}

	// Work held and running under generation 1, on the other replica.
	reserve("old-settle", 400)
	mustPost(t, otherURL, "Start", `{"reservationId":"old-settle","operationId":"op-old-settle"}`)
	reserve("old-release", 200)
	wantTerms(map[string]map[string]int64{g1: {"available": 400, "reserved": 600}})

	// Generation 2, published through the first replica; the answer is
	// lost. The other replica last decided by generation 1; its next
	// reserve is decided by generation 2, which takes generation 1's 400
	// available.
	lossy.lose("PublishPolicy", policy(2000))
	out := reserve("new", 50)
	g2 := fmt.Sprint(out["policyGeneration"])
	if g2 == g1 || fmt.Sprint(asMap(out["reservation"])["policyGeneration"]) != g2 {
		t.Fatalf("reserve after the switch: %v, want it decided by the new generation", out)
	}
	// The operator publishes again, through the other replica: no further
	// generation.
	again := mustPost(t, otherURL, "PublishPolicy", policy(2000))
	if got := fmt.Sprint(asMap(again["policy"])["generation"]); again["replayed"] != true || got != g2 {
		t.Fatalf("publish retried on the other replica: %v, want a replay of generation %s", again, g2)
	}
	wantTerms(map[string]map[string]int64{
		g1: {"available": 0, "reserved": 600, "retiredForMove": 400},
		g2: {"available": 350, "reserved": 50, "minted": 400},
	})

	// Late refunds of generation 1 work, answers lost: each goes on to
	// generation 2 once.
	lossy.lose("Settle", settle("old-settle", 100))
	replays(otherURL, "Settle", settle("old-settle", 100))
	replays(lossy.url, "Settle", settle("old-settle", 100))
	lossy.lose("Release", `{"reservationId":"old-release"}`)
	replays(otherURL, "Release", `{"reservationId":"old-release"}`)
	replays(lossy.url, "Release", `{"reservationId":"old-release"}`)
	wantTerms(map[string]map[string]int64{
		g1: {"available": 0, "reserved": 0, "spent": 100, "retiredForMove": 900},
		g2: {"available": 850, "reserved": 50, "minted": 900},
	})
	auditProcess(t, bin, otherURL)
}

// TestRollbackAcrossReplicas: generation 2 is rolled back through one
// `capledger serve` replica of a PostgreSQL database while the other
// holds, runs and owes under it. The rollback's answer is lost; the
// other replica's next reserve is not decided by generation 2; the
// rollback's retry on the other replica replays it; the drains of generation 2
// are run on both replicas at once, four times each (each move made
// once); the running work settles and the hold is released, its answer
// lost and retried on the other replica, and generation 2 drains to
// zero. Every account conserves, spent over both generations is the
// settled usage, and the audit is clean. On SQLite every call goes to
// one process.
func TestRollbackAcrossReplicas(t *testing.T) { onTwoReplicasAndSQLite(t, testRollback) }

func testRollback(t *testing.T, bin, firstURL, otherURL string) {
	lossy := newLossyLink(t, firstURL)
	const subject = "tenant-rb"
	policy := func(burst int) string {
		return fmt.Sprintf(`{"policy":{"subject":"*","route":"rb","holdTtl":"3600s","epochLength":"315360000s",
		  "dimensions":[{"unit":"tokens","burst":"%d","maxOverdraft":"1000"}]}}`, burst)
	}
	g1 := fmt.Sprint(asMap(mustPost(t, firstURL, "PublishPolicy", policy(1000))["policy"])["generation"])
	g2 := fmt.Sprint(asMap(mustPost(t, firstURL, "PublishPolicy", policy(2000))["policy"])["generation"])
	reserve := func(id string, tokens int64) (int, map[string]any) {
		return post(crashClient, otherURL, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"rb","units":{"tokens":%d}}`, id, subject, tokens))
	}
	run := func(id string, tokens int64) {
		t.Helper()
		if status, out := reserve(id, tokens); status != 200 || fmt.Sprint(out["policyGeneration"]) != g2 {
			t.Fatalf("reserve %s: %d %v, want it admitted by generation %s", id, status, out, g2)
		}
		mustPost(t, otherURL, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id))
	}
	settle := func(id string, actual int64) string {
		return fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, id, id, actual)
	}
	// Under generation 2 (2000 available): a hold of 100, work of 200
	// running, work of 100 that used 2100: 100 of its hold, the 1600
	// available, 400 of debt.
	if status, out := reserve("rb-hold", 100); status != 200 {
		t.Fatalf("reserve rb-hold: %d %v", status, out)
	}
	run("rb-run", 200)
	run("rb-over", 100)
	if out := mustPost(t, otherURL, "Settle", settle("rb-over", 2100)); asMap(out["reservation"])["state"] != "RESERVATION_STATE_SETTLED_WITH_DEBT" {
		t.Fatalf("settle above everything available: %v", out)
	}

	// The rollback, through the first replica; its answer is lost.
	rollback := fmt.Sprintf(`{"generation":%q}`, g2)
	lossy.lose("RollbackPolicy", rollback)
	// Generation 2 admits nothing more, through either replica (the other
	// last decided by generation 2): generation 1 decides, and the debt
	// it took over freezes admission.
	for i, url := range []string{otherURL, lossy.url} {
		status, out := post(crashClient, url, "Reserve", fmt.Sprintf(`{"reservationId":"after-%d","subject":%q,"route":"rb","units":{"tokens":1}}`, i, subject))
		var debug map[string]any
		if details, _ := out["details"].([]any); len(details) == 1 {
			debug = asMap(asMap(details[0])["debug"])
		}
		if status != 429 || debug["reason"] != "ADMISSION_FROZEN" || fmt.Sprint(debug["policyGeneration"]) != g1 {
			t.Errorf("reserve after the rollback through %s: %d %v, want 429 ADMISSION_FROZEN by generation %s", url, status, out, g1)
		}
	}

	// The operator retries the rollback through the other replica.
	if out := mustPost(t, otherURL, "RollbackPolicy", rollback); out["replayed"] != true || fmt.Sprint(out["activeGeneration"]) != g1 {
		t.Fatalf("rollback retried on the other replica: %v, want a replay with generation %s active", out, g1)
	}

	// Drains of generation 2, four through each replica at once.
	drains := fmt.Sprintf(`{"generations":[%q],"runDrains":true}`, g2)
	var wg sync.WaitGroup
	for i := range 8 {
		url := firstURL
		if i%2 == 1 {
			url = otherURL
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			postOK(t, url, "RolloutService/DrainProgress", drains)
		}()
	}
	wg.Wait()

	// The running work settles; the hold's release loses its answer.
	mustPost(t, otherURL, "Settle", settle("rb-run", 150))
	lossy.lose("Release", `{"reservationId":"rb-hold"}`)
	if out := mustPost(t, otherURL, "Release", `{"reservationId":"rb-hold"}`); out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
		t.Errorf("release retried on the other replica: %v, want a replay refunding nothing", out)
	}
	progress := mustPost(t, otherURL, "RolloutService/DrainProgress", drains)
	if progress["drained"] != true {
		t.Fatalf("generation %s not drained once nothing is held on it: %v", g2, progress)
	}
	var spent, reserved int64
	for generation, tm := range generationTerms(t, otherURL, subject, "rb") {
		checkConservation(t, subject+" generation "+generation, tm)
		spent += tm["tokens"]["spent"]
		reserved += tm["tokens"]["reserved"]
		if generation == g2 && (tm["tokens"]["available"] != 0 || tm["tokens"]["reserved"] != 0 || tm["tokens"]["debt"] != 0) {
			t.Errorf("generation %s after the drain: %v, want nothing available, reserved or owed", g2, tm["tokens"])
		}
	}
	if spent != 2100+150 || reserved != 0 {
		t.Errorf("over both generations: spent %d, reserved %d; want %d and 0", spent, reserved, 2100+150)
	}
	auditProcess(t, bin, otherURL)
}
