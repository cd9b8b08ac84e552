package main

import (
	"fmt"
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
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	t.Run("postgres", func(t *testing.T) {
		dsn := postgresSchema(t)
		first := startServer(t, bin, t.TempDir(), "--store", dsn)
		other := startServer(t, bin, t.TempDir(), "--store", dsn)
		testGenerationSwitch(t, bin, first.url, other.url)
	})
	t.Run("sqlite", func(t *testing.T) {
		srv := startServer(t, bin, t.TempDir())
		testGenerationSwitch(t, bin, srv.url, srv.url)
	})
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
