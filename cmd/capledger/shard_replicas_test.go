package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestShardRecoveryAcrossReplicas: an emergency shard's issuance and
// reconciliations through two `capledger serve` replicas of one
// PostgreSQL database (sharing one shard keys file), with the faults of
// the seed's list that reach the ledger: the issuance's answer is lost
// and retried on the other replica (carved once); the same receipts are
// submitted eight times at once, four through each replica (recovered
// once: one accepted, seven refused as already reconciled); another
// gateway presents the shard (refused as foreign); the late receipt of
// work that was UNKNOWN is submitted, its answer lost, and retried on the
// other replica (reminted once). The UNKNOWN work's units stay retired
// until its receipt arrives, the account's terms are exact after each
// step, and the audit is clean. On SQLite every call goes to one process.
func TestShardRecoveryAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	t.Run("postgres", func(t *testing.T) {
		dsn := postgresSchema(t)
		dir := t.TempDir()
		first := startServer(t, bin, dir, "--store", dsn)
		other := startServer(t, bin, t.TempDir(), "--store", dsn, "--shard-keys", filepath.Join(dir, "shard-keys"))
		testShardRecovery(t, bin, first.url, other.url)
	})
	t.Run("sqlite", func(t *testing.T) {
		srv := startServer(t, bin, t.TempDir())
		testShardRecovery(t, bin, srv.url, srv.url)
	})
}

func testShardRecovery(t *testing.T, bin, firstURL, otherURL string) {
	lossy := newLossyLink(t, firstURL)
	mustPost(t, firstURL, "PublishPolicy", `{"policy":{"subject":"*","route":"shard","holdTtl":"3600s","epochLength":"315360000s",
	  "emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"10000"}]}}`)
	const subject = "tenant-shard"
	wantTerms := func(want map[string]int64) {
		t.Helper()
		tm := routeTerms(t, otherURL, subject, "shard")
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s: %s %d, want %d (%v)", subject, term, got, v, tm["tokens"])
			}
		}
	}
	refusedAs := func(status int, out map[string]any, reason string) bool {
		return status == 400 && strings.Contains(fmt.Sprint(out), reason)
	}

	// The issuance's answer is lost; the retry on the other replica
	// repeats the shard, carving nothing more.
	issue := fmt.Sprintf(`{"shardId":"sh-lost","subject":%q,"route":"shard","units":{"tokens":4000},"gatewayId":"gw-a","bootEpoch":"1","ttl":"3600s"}`, subject)
	lossy.lose("ShardService/IssueShard", issue)
	if out := mustPost(t, otherURL, "ShardService/IssueShard", issue); out["replayed"] != true {
		t.Errorf("issue retry on the other replica: %v, want a replay", out)
	}
	wantTerms(map[string]int64{"available": 6000, "retiredForEmergency": 4000, "minted": 0})

	// The gateway's receipts: 600 of a 1000 hold used, a 500 hold
	// released unstarted, a 1000 hold started with its usage unknown.
	// Unused: 4000 - 600 - 1000 = 2400; the unknown 1000 stays retired.
	receipts := func(gateway, unknownWork string) string {
		return fmt.Sprintf(`{"shardId":"sh-lost","gatewayId":%q,"receipts":[
		  {"reservationId":"used","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1000},"actualUnits":{"tokens":600}},
		  {"reservationId":"unused","state":"RESERVATION_STATE_RELEASED","reservedUnits":{"tokens":500}},
		  %s]}`, gateway, unknownWork)
	}
	first := receipts("gw-a", `{"reservationId":"unknown","state":"RESERVATION_STATE_STARTED","reservedUnits":{"tokens":1000}}`)
	var (
		mu       sync.Mutex
		accepted int
	)
	var wg sync.WaitGroup
	for i := range 8 {
		url := firstURL
		if i%2 == 1 {
			url = otherURL
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, out := post(crashClient, url, "ShardService/ReconcileShard", first)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case status == 200:
				accepted++
				if got := asMap(out["remintedUnits"])["tokens"]; fmt.Sprint(got) != "2400" {
					t.Errorf("the accepted submission reminted %v, want 2400: %v", got, out)
				}
			case refusedAs(status, out, "SHARD_ALREADY_RECONCILED"):
			default:
				t.Errorf("reconcile through %s: %d %v", url, status, out)
			}
		}()
	}
	wg.Wait()
	if accepted != 1 {
		t.Fatalf("%d of 8 identical submissions accepted, want 1", accepted)
	}
	wantTerms(map[string]int64{"available": 8400, "retiredForEmergency": 4000, "minted": 2400})

	// Another gateway presents the shard, through the other replica.
	if status, out := post(crashClient, otherURL, "ShardService/ReconcileShard", receipts("gw-b", `{"reservationId":"unknown","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1000},"actualUnits":{"tokens":0}}`)); !refusedAs(status, out, "SHARD_FOREIGN") {
		t.Errorf("gw-b reconciling gw-a's shard: %d %v, want SHARD_FOREIGN", status, out)
	}
	wantTerms(map[string]int64{"available": 8400, "minted": 2400})

	// The unknown work's receipt arrives (700 used): 300 come back. The
	// answer is lost; the retry on the other replica is refused, the
	// receipt having been resolved, and nothing is reminted twice.
	late := `{"shardId":"sh-lost","gatewayId":"gw-a","receipts":[
	  {"reservationId":"unknown","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1000},"actualUnits":{"tokens":700}}]}`
	lossy.lose("ShardService/ReconcileShard", late)
	if status, out := post(crashClient, otherURL, "ShardService/ReconcileShard", late); !refusedAs(status, out, "SHARD_ALREADY_RECONCILED") {
		t.Errorf("the late receipt's retry on the other replica: %d %v, want SHARD_ALREADY_RECONCILED", status, out)
	}
	wantTerms(map[string]int64{"available": 8700, "retiredForEmergency": 4000, "minted": 2700})
	shard := asMap(mustPost(t, otherURL, "ShardService/GetShard", `{"shardId":"sh-lost"}`)["shard"])
	for term, want := range map[string]string{"spentUnits": "1300", "remintedUnits": "2700", "unknownUnits": "0"} {
		if got := fmt.Sprint(asMap(shard[term])["tokens"]); got != want {
			t.Errorf("shard %s %s, want %s: %v", term, got, want, shard)
		}
	}
	// Seven duplicates, the foreign gateway, the late receipt's retry.
	if got := fmt.Sprint(shard["refusedSubmissions"]); got != "9" {
		t.Errorf("shard refusedSubmissions %s, want 9", got)
	}
	auditProcess(t, bin, otherURL)
}
