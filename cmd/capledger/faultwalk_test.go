package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Black-box fault injection for the seed's list where the other tests
// of this package left gaps (two gateways on one shard id, refunds whose
// answers a kill -9 lost, a release racing the expiry, debt and its
// Retry-After, a shard's remint across a generation switch, unknown work
// across a kill, kills mid shard retention and mid rollback drain): a
// real `capledger serve` on a data directory, clients speaking JSON over
// a socket, and `capledger audit` run on the data directory at the end.

// postWithHeader is post that also returns the answer's headers (nil
// when no answer arrived).
func postWithHeader(url, method, body string) (int, map[string]any, http.Header) {
	path := "/capledger.v1.LedgerService/" + method
	if strings.Contains(method, "/") {
		path = "/capledger.v1." + method
	}
	resp, err := crashClient.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil
	}
	var out map[string]any
	if json.Unmarshal(raw, &out) != nil {
		return 0, nil, nil
	}
	return resp.StatusCode, out, resp.Header
}

// reasonOf is an error answer's reason (details[0].debug.reason).
func reasonOf(out map[string]any) string {
	r, _ := field(out, "details", "0", "debug", "reason").(string)
	return r
}

// auditStoppedDataDir stops srv (SIGTERM, a clean exit) and runs
// `capledger audit --data-dir` on its data directory: it must exit 0
// with no discrepancy.
func auditStoppedDataDir(t *testing.T, bin, dir string, srv *serverProcess) {
	t.Helper()
	stopGracefully(t, srv)
	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("audit of the stopped data dir: %+v", r.Discrepancies)
	}
}

// TestTwoGatewaysOnOneShardIDAcrossAServeRestart: two gateways issue a
// shard under the same shard id at the same instant, for six ids: each
// id carves once (one gateway gets the shard, the other 409
// SHARD_ID_REUSED) and retiredForEmergency holds the six allocations
// once. The loser's reconciliation of the winner's shard is refused
// (SHARD_FOREIGN) and changes nothing. The winner's reconciliation is
// applied, its answer lost, and serve is killed (SIGKILL) at once; after
// the restart the retry is refused as already reconciled and the unused
// units were reminted once. After the restart an issuance replayed with
// the same fields answers the same shard (fence and token), carving
// nothing; the same id under the gateway's next boot epoch (a restarted
// gateway inheriting its predecessor's shard) or by the other gateway is
// refused. Conservation holds after every step, and the audit of the
// stopped data directory is clean.
func TestTwoGatewaysOnOneShardIDAcrossAServeRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"shard","holdTtl":"3600s","epochLength":"315360000s",
	  "emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"10000"}]}}`)
	const (
		subject = "tenant-shared"
		ids     = 6
		size    = 500
	)
	wantTerms := func(url string, want map[string]int64) {
		t.Helper()
		tm := routeTerms(t, url, subject, "shard")
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s: %s %d, want %d (%v)", subject, term, got, v, tm["tokens"])
			}
		}
	}
	issue := func(id, gateway string, boot int) string {
		return fmt.Sprintf(`{"shardId":%q,"subject":%q,"route":"shard","units":{"tokens":%d},"gatewayId":%q,"bootEpoch":"%d","ttl":"3600s"}`,
			id, subject, size, gateway, boot)
	}
	shardID := func(k int) string { return fmt.Sprintf("sh-%d", k) }

	winner := make([]string, ids)
	shards := make([]map[string]any, ids)
	for k := range ids {
		var wg sync.WaitGroup
		var mu sync.Mutex
		got := map[string]int{}
		for _, gw := range []string{"gw-a", "gw-b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, out := post(crashClient, srv.url, "ShardService/IssueShard", issue(shardID(k), gw, 1))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case status == 200 && out["replayed"] != true:
					winner[k], shards[k] = gw, asMap(out["shard"])
					got["issued"]++
				case status == 409 && reasonOf(out) == "SHARD_ID_REUSED":
					got["reused"]++
				default:
					t.Errorf("issue %s by %s: %d %v", shardID(k), gw, status, out)
				}
			}()
		}
		wg.Wait()
		if got["issued"] != 1 || got["reused"] != 1 {
			t.Fatalf("%s issued by two gateways at once: %v, want one issued and one SHARD_ID_REUSED", shardID(k), got)
		}
	}
	wantTerms(srv.url, map[string]int64{"available": 10000 - ids*size, "retiredForEmergency": ids * size, "minted": 0})

	other := func(gw string) string {
		if gw == "gw-a" {
			return "gw-b"
		}
		return "gw-a"
	}
	receipts := func(k int, gw string) string {
		return fmt.Sprintf(`{"shardId":%q,"gatewayId":%q,"receipts":[
		  {"reservationId":"used-%d","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":200},"actualUnits":{"tokens":120}}]}`,
			shardID(k), gw, k)
	}
	// The gateway that lost the race presents the winner's shard.
	for k := range ids {
		status, out := post(crashClient, srv.url, "ShardService/ReconcileShard", receipts(k, other(winner[k])))
		if status != 400 || reasonOf(out) != "SHARD_FOREIGN" {
			t.Errorf("%s reconciling %s's %s: %d %v, want SHARD_FOREIGN", other(winner[k]), winner[k], shardID(k), status, out)
		}
	}
	wantTerms(srv.url, map[string]int64{"available": 10000 - ids*size, "minted": 0})

	// The winner of sh-0 reconciles (120 used, 380 unused); the answer is
	// lost and serve is killed at once.
	lossy := newLossyLink(t, srv.url)
	lossy.lose("ShardService/ReconcileShard", receipts(0, winner[0]))
	kill9(t, srv)
	srv = startServer(t, bin, dir)
	status, out := post(crashClient, srv.url, "ShardService/ReconcileShard", receipts(0, winner[0]))
	if status != 400 || reasonOf(out) != "SHARD_ALREADY_RECONCILED" {
		t.Errorf("the reconciliation retried after the restart: %d %v, want SHARD_ALREADY_RECONCILED", status, out)
	}
	wantTerms(srv.url, map[string]int64{"available": 10000 - ids*size + 380, "minted": 380, "retiredForEmergency": ids * size})
	sh0 := asMap(mustPost(t, srv.url, "ShardService/GetShard", `{"shardId":"sh-0"}`)["shard"])
	for term, want := range map[string]string{"spentUnits": "120", "remintedUnits": "380"} {
		if got := fmt.Sprint(asMap(sh0[term])["tokens"]); got != want {
			t.Errorf("sh-0 %s %s, want %s: %v", term, got, want, sh0)
		}
	}

	// Issuances replayed after the restart.
	for k := 1; k < ids; k++ {
		out := mustPost(t, srv.url, "ShardService/IssueShard", issue(shardID(k), winner[k], 1))
		again := asMap(out["shard"])
		if out["replayed"] != true || fmt.Sprint(again["fence"]) != fmt.Sprint(shards[k]["fence"]) || fmt.Sprint(again["token"]) != fmt.Sprint(shards[k]["token"]) {
			t.Errorf("issue %s replayed by %s after the restart: %v, want a replay of the same shard %v", shardID(k), winner[k], out, shards[k])
		}
		for _, retry := range []struct {
			gw   string
			boot int
		}{{winner[k], 2}, {other(winner[k]), 1}} {
			status, out := post(crashClient, srv.url, "ShardService/IssueShard", issue(shardID(k), retry.gw, retry.boot))
			if status != 409 || reasonOf(out) != "SHARD_ID_REUSED" {
				t.Errorf("issue %s by %s boot epoch %d after the restart: %d %v, want SHARD_ID_REUSED", shardID(k), retry.gw, retry.boot, status, out)
			}
		}
	}
	wantTerms(srv.url, map[string]int64{"available": 10000 - ids*size + 380, "minted": 380, "retiredForEmergency": ids * size})
	auditStoppedDataDir(t, bin, dir, srv)
}

// refundCall is one gateway's refund: a Release of an unstarted hold or
// a Settle of started work, and what it refunds.
type refundCall struct {
	id, method, body string
	actual, refund   int64
	acked            bool // the first answer arrived (200)
}

// TestRefundsInFlightAtAKillAreMadeOnce: gateways release unstarted
// holds and settle started work (below, at and above nothing: each at
// most its estimate) while `capledger serve` is killed with SIGKILL. After
// the restart every release and settle is sent again with the same ids:
// one acknowledged before the kill replays, refunding nothing; one whose
// answer the kill lost replays or is applied now, never both; a third
// round replays everything. The refunds observed add up to the holds
// minus the usage, the account holds nothing reserved and available is
// the burst minus the usage (no refund twice, none lost), and the audit
// of the stopped data directory is clean.
func TestRefundsInFlightAtAKillAreMadeOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	const (
		subject = "tenant-refund"
		holds   = 300
		hold    = 100
	)
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":"refund","holdTtl":"3600s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, holds*hold))
	id := func(i int) string { return fmt.Sprintf("r-%03d", i) }
	var batch []string
	for i := range holds {
		batch = append(batch, fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"refund","units":{"tokens":%d}}`, id(i), subject, hold))
	}
	for _, o := range mustPost(t, srv.url, "ReserveBatch", `{"requests":[`+strings.Join(batch, ",")+`]}`)["outcomes"].([]any) {
		if asMap(o)["ok"] == nil {
			t.Fatalf("reserve: %v", o)
		}
	}
	calls := make([]*refundCall, holds)
	for i := range holds {
		c := &refundCall{id: id(i)}
		if i%3 == 0 {
			c.method, c.body, c.refund = "Release", fmt.Sprintf(`{"reservationId":%q}`, c.id), hold
		} else {
			c.actual = int64(i%3*30 + i%7) // 30..66 of 100
			c.method, c.refund = "Settle", hold-c.actual
			c.body = fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, c.id, c.id, c.actual)
		}
		calls[i] = c
	}
	parallel(holds, func(i int) {
		if calls[i].method == "Settle" {
			postOK(t, srv.url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, calls[i].id, calls[i].id))
		}
	})
	if t.Failed() {
		return
	}

	// The refunds go out from 8 gateways; serve is killed once a third
	// were acknowledged. A gateway whose call got no answer stops.
	var refunded, acks atomic.Int64
	var next atomic.Int64
	killed := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= holds {
					return
				}
				c := calls[i]
				status, out := post(crashClient, srv.url, c.method, c.body)
				if status == 0 {
					return
				}
				if status != 200 || out["replayed"] == true {
					t.Errorf("%s %s: %d %v, want its first answer", c.method, c.id, status, out)
					return
				}
				n, _ := strconv.ParseInt(fmt.Sprint(asMap(out["refundedUnits"])["tokens"]), 10, 64)
				if c.refund > 0 && n != c.refund {
					t.Errorf("%s %s: refunded %d, want %d", c.method, c.id, n, c.refund)
				}
				refunded.Add(n)
				c.acked = true
				if acks.Add(1) == holds/3 {
					close(killed)
				}
			}
		}()
	}
	select {
	case <-killed:
	case <-time.After(60 * time.Second):
		t.Fatal("a third of the refunds not acknowledged within a minute")
	}
	kill9(t, srv)
	wg.Wait()
	if t.Failed() {
		return
	}
	srv = startServer(t, bin, dir)

	var ackedBefore, appliedNow, lostButApplied int
	for round := 1; round <= 2; round++ {
		for _, c := range calls {
			out := mustPost(t, srv.url, c.method, c.body)
			n, _ := strconv.ParseInt(fmt.Sprint(asMap(out["refundedUnits"])["tokens"]), 10, 64)
			replayed := out["replayed"] == true
			switch {
			case replayed && len(asMap(out["refundedUnits"])) != 0:
				t.Errorf("round %d: %s %s replayed refunding %v", round, c.method, c.id, out["refundedUnits"])
			case !replayed && (round == 2 || c.acked):
				t.Errorf("round %d: %s %s (first answer acknowledged: %v) applied again: %v", round, c.method, c.id, c.acked, out)
			case !replayed:
				if c.refund > 0 && n != c.refund {
					t.Errorf("%s %s after the restart: refunded %d, want %d", c.method, c.id, n, c.refund)
				}
				refunded.Add(n)
				appliedNow++
			case round == 1 && c.acked:
				ackedBefore++
			case round == 1:
				lostButApplied++
			}
		}
	}
	t.Logf("%d refunds acknowledged before the kill, %d applied but unacknowledged, %d applied after the restart", ackedBefore, lostButApplied, appliedNow)

	var spent, wantRefund int64
	for _, c := range calls {
		spent += c.actual
		wantRefund += c.refund
	}
	// A refund applied before the kill whose answer was lost was never
	// observed: the account, not the answers, must show it.
	tm := routeTerms(t, srv.url, subject, "refund")
	checkConservation(t, subject, tm)
	if m := tm["tokens"]; m["available"] != holds*hold-spent || m["reserved"] != 0 || m["spent"] != spent {
		t.Errorf("%s: %v, want available %d, reserved 0, spent %d", subject, m, holds*hold-spent, spent)
	}
	if lostButApplied == 0 && refunded.Load() != wantRefund {
		t.Errorf("refunds observed %d, want %d", refunded.Load(), wantRefund)
	}
	if refunded.Load() > wantRefund {
		t.Errorf("refunds observed %d, more than the %d owed", refunded.Load(), wantRefund)
	}
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestReleaseRacesExpiryRefundsOnce: gateways release 1 s holds at
// instants spread around their expiry while the expiry worker claims the
// holds it finds due. Each hold ends one way only: an acknowledged
// release leaves it RELEASED (refunding the hold once; its retry replays,
// refunding nothing), a release refused as expired leaves it EXPIRED;
// the account ends with the whole burst available and nothing reserved
// (no hold refunded twice, by the release and the expiry), and the audit
// of the stopped data directory is clean.
func TestReleaseRacesExpiryRefundsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a server process")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	const (
		subject = "tenant-race"
		holds   = 30
		hold    = 100
		holdTTL = time.Second
	)
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":"race","holdTtl":"1s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, holds*hold))
	id := func(i int) string { return fmt.Sprintf("race-%02d", i) }
	state := func(id string) any {
		return asMap(mustPost(t, srv.url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))["reservation"])["state"]
	}
	reservedAt := make([]time.Time, holds)
	for i := range holds {
		mustPost(t, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"race","units":{"tokens":%d}}`, id(i), subject, hold))
		reservedAt[i] = time.Now()
	}
	released := make([]bool, holds)
	var wg sync.WaitGroup
	for i := range holds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// From 300 ms before the TTL to 300 ms after it.
			offset := holdTTL - 300*time.Millisecond + time.Duration(i)*600*time.Millisecond/holds
			time.Sleep(time.Until(reservedAt[i].Add(offset)))
			body := fmt.Sprintf(`{"reservationId":%q}`, id(i))
			status, out := post(crashClient, srv.url, "Release", body)
			switch {
			case status == 200 && asMap(out["reservation"])["state"] == "RESERVATION_STATE_RELEASED" && out["replayed"] != true:
				if got := fmt.Sprint(asMap(out["refundedUnits"])["tokens"]); got != fmt.Sprint(hold) {
					t.Errorf("release %s: refunded %s, want %d", id(i), got, hold)
				}
				released[i] = true
			case status == 400 && reasonOf(out) == "RESERVATION_EXPIRED":
			default:
				t.Errorf("release %s: %d %v, want RELEASED or refused as expired", id(i), status, out)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// A sentinel reserved after every release was answered expires after
	// all the others: once it is EXPIRED, the worker has had every hold
	// above past its TTL.
	mustPost(t, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":"sentinel","subject":%q,"route":"race","units":{"tokens":1}}`, subject))
	for deadline := time.Now().Add(60 * time.Second); state("sentinel") != "RESERVATION_STATE_EXPIRED"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sentinel hold is %v 60 s after its TTL of 1 s", state("sentinel"))
		}
	}
	count := 0
	for i := range holds {
		body := fmt.Sprintf(`{"reservationId":%q}`, id(i))
		got := state(id(i))
		switch {
		case released[i] && got != "RESERVATION_STATE_RELEASED":
			t.Errorf("%s: release acknowledged, then %v", id(i), got)
		case !released[i] && got != "RESERVATION_STATE_EXPIRED":
			t.Errorf("%s: release refused as expired, now %v", id(i), got)
		}
		status, out := post(crashClient, srv.url, "Release", body)
		if released[i] {
			count++
			if status != 200 || out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
				t.Errorf("release %s sent again: %d %v, want a replay refunding nothing", id(i), status, out)
			}
		} else if status != 400 || reasonOf(out) != "RESERVATION_EXPIRED" {
			t.Errorf("release %s of an expired hold sent again: %d %v, want RESERVATION_EXPIRED", id(i), status, out)
		}
	}
	t.Logf("%d of %d holds released, %d expired", count, holds, holds-count)
	tm := routeTerms(t, srv.url, subject, "race")
	checkConservation(t, subject, tm)
	if m := tm["tokens"]; m["available"] != holds*hold || m["reserved"] != 0 || m["spent"] != 0 {
		t.Errorf("%s: %v, want available %d, reserved 0, spent 0", subject, m, holds*hold)
	}
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestDebtFreezesEveryAdmissionAndRetryAfterKeepsItsPromise: usage above
// the reservation leaves debt. On a route without refill, with capacity
// available again beside the debt (a hold released), nothing is admitted
// while it is owed: a Reserve of 1, a ReserveBatch item and an emergency
// shard of 1 are refused ADMISSION_FROZEN, without a Retry-After (no
// refill repays it), and the settle retried replays without charging
// again. On a route with refill, the rejection's Retry-After is kept: the
// same Reserve sent after that many seconds is admitted, the debt repaid
// first. The audit of the stopped data directory is clean.
func TestDebtFreezesEveryAdmissionAndRetryAfterKeepsItsPromise(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a server process")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"frozen","holdTtl":"3600s","epochLength":"315360000s",
	  "emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"1000","maxOverdraft":"1000"},{"unit":"requests","burst":"100"}]}}`)
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"repay","holdTtl":"3600s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"300","refillInterval":"1s","maxOverdraft":"1000"}]}}`)
	const subject = "tenant-debt"
	wantTerms := func(route string, want map[string]int64) {
		t.Helper()
		tm := routeTerms(t, srv.url, subject, route)
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s %s: %s %d, want %d (%v)", subject, route, term, got, v, tm["tokens"])
			}
		}
	}
	reserve := func(route, id string, tokens int) string {
		return fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":%q,"units":{"tokens":%d}}`, id, subject, route, tokens)
	}

	// frozen: 600 held beside, 400 reserved and 700 used: 400 of its
	// hold, nothing available, 300 of debt. The beside hold's release
	// makes 600 available while the 300 are owed.
	mustPost(t, srv.url, "Reserve", reserve("frozen", "beside", 600))
	mustPost(t, srv.url, "Reserve", reserve("frozen", "over", 400))
	mustPost(t, srv.url, "Start", `{"reservationId":"over","operationId":"op-over"}`)
	settle := `{"reservationId":"over","operationId":"op-over","actualUnits":{"tokens":700}}`
	out := mustPost(t, srv.url, "Settle", settle)
	if r := asMap(out["reservation"]); r["state"] != "RESERVATION_STATE_SETTLED_WITH_DEBT" || fmt.Sprint(asMap(r["overdraftUnits"])["tokens"]) != "300" {
		t.Fatalf("settle of 700 on a 400 hold with nothing else available: %v, want SETTLED_WITH_DEBT with 300 of debt", out)
	}
	mustPost(t, srv.url, "Release", `{"reservationId":"beside"}`)
	if out := mustPost(t, srv.url, "Settle", settle); out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
		t.Errorf("the settle with debt sent again: %v, want a replay", out)
	}
	wantTerms("frozen", map[string]int64{"available": 600, "reserved": 0, "spent": 700, "overdraftIssued": 300, "overdraftRepaid": 0})
	status, out, header := postWithHeader(srv.url, "Reserve", reserve("frozen", "one", 1))
	if status != 429 || reasonOf(out) != "ADMISSION_FROZEN" || header.Get("Retry-After") != "" {
		t.Errorf("reserve of 1 token of 600 available while 300 are owed (no refill): %d %v Retry-After %q, want 429 ADMISSION_FROZEN without a Retry-After",
			status, out, header.Get("Retry-After"))
	}
	outcomes := mustPost(t, srv.url, "ReserveBatch", `{"requests":[`+reserve("frozen", "batch-1", 1)+`]}`)["outcomes"].([]any)
	if got := field(outcomes, "0", "error", "rejection", "reason"); got != "ADMISSION_FROZEN" {
		t.Errorf("a batch item of 1 token while 300 are owed: %v, want ADMISSION_FROZEN", outcomes)
	}
	status, out = post(crashClient, srv.url, "ShardService/IssueShard", fmt.Sprintf(
		`{"shardId":"frozen-shard","subject":%q,"route":"frozen","units":{"tokens":1},"gatewayId":"gw-a","bootEpoch":"1","ttl":"3600s"}`, subject))
	if status != 429 || reasonOf(out) != "ADMISSION_FROZEN" {
		t.Errorf("an emergency shard of 1 token while 300 are owed: %d %v, want 429 ADMISSION_FROZEN", status, out)
	}
	wantTerms("frozen", map[string]int64{"available": 600, "reserved": 0, "retiredForEmergency": 0, "overdraftIssued": 300})

	// repay: the whole burst reserved, 1400 used: 400 of debt. A reserve
	// of 250 needs the debt repaid and 250 minted beyond it: 650 at 300
	// a second, 3 intervals from the refill cursor.
	mustPost(t, srv.url, "Reserve", reserve("repay", "all", 1000))
	mustPost(t, srv.url, "Start", `{"reservationId":"all","operationId":"op-all"}`)
	mustPost(t, srv.url, "Settle", `{"reservationId":"all","operationId":"op-all","actualUnits":{"tokens":1400}}`)
	status, out, header = postWithHeader(srv.url, "Reserve", reserve("repay", "after-wait", 250))
	if status == 200 {
		// The machine stalled for the 3 s refill needs: nothing to wait for.
		t.Logf("reserve of 250 right after a debt of 400 at 300 a second admitted: a stalled machine; Retry-After not checked")
		auditStoppedDataDir(t, bin, dir, srv)
		return
	}
	if status != 429 || (reasonOf(out) != "ADMISSION_FROZEN" && reasonOf(out) != "INSUFFICIENT_CAPACITY") {
		t.Fatalf("reserve of 250 right after a debt of 400 at 300 a second: %d %v, want 429", status, out)
	}
	wait, err := strconv.Atoi(header.Get("Retry-After"))
	if err != nil || wait < 1 || wait > 3 {
		t.Fatalf("Retry-After %q for a debt of 400 and 250 more at 300 a second, want 1 to 3 seconds", header.Get("Retry-After"))
	}
	time.Sleep(time.Duration(wait) * time.Second)
	if status, out := post(crashClient, srv.url, "Reserve", reserve("repay", "after-wait", 250)); status != 200 {
		t.Errorf("the same reserve sent again after its Retry-After of %d s: %d %v, want it admitted", wait, status, out)
	}
	wantTerms("repay", map[string]int64{"overdraftIssued": 400, "overdraftRepaid": 400, "reserved": 250})
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestCrashMidShardRetention kills serve with SIGKILL, at seeded random
// points, while a retention pass removes reconciled emergency shards (a
// page per transaction) and then folds the fence rows of the gateways
// left without a live shard into the store's fence floor. After each
// restart every shard is there, reconciled, or gone (SHARD_NOT_FOUND,
// also for its resent reconciliation, which remints nothing), the
// account's terms are as before, and the audit of the stopped data
// directory is clean; at the end, once a pass folded the fence rows,
// every gateway's next shard (a restarted gateway's, under a new boot
// epoch) carries a fence above every fence it held.
func TestCrashMidShardRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs several server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	quiet := []string{"--retention", "0", "--compaction", "0"}
	srv := startServer(t, bin, dir, quiet...)
	const (
		subject  = "tenant-ret"
		gateways = 520
		perGW    = 2
	)
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"ret","holdTtl":"3600s","epochLength":"315360000s",
	  "emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"1000000"}]}}`)
	shardID := func(g, k int) string { return fmt.Sprintf("ret-%03d-%d", g, k) }
	gw := func(g int) string { return fmt.Sprintf("gw-%03d", g) }
	// Each gateway is issued two 1-token shards of 1 s (fences 1 and 2)
	// and reconciles each with no receipts (all of it reminted).
	maxFence := make([]int64, gateways)
	parallel(gateways, func(g int) {
		for k := range perGW {
			out, ok := postOK(t, srv.url, "ShardService/IssueShard", fmt.Sprintf(
				`{"shardId":%q,"subject":%q,"route":"ret","units":{"tokens":1},"gatewayId":%q,"bootEpoch":"1","ttl":"1s"}`, shardID(g, k), subject, gw(g)))
			if !ok {
				return
			}
			f, _ := strconv.ParseInt(fmt.Sprint(asMap(out["shard"])["fence"]), 10, 64)
			maxFence[g] = max(maxFence[g], f)
			postOK(t, srv.url, "ShardService/ReconcileShard", fmt.Sprintf(`{"shardId":%q,"gatewayId":%q,"receipts":[]}`, shardID(g, k), gw(g)))
		}
	})
	if t.Failed() {
		return
	}
	t.Logf("%d shards issued and reconciled", gateways*perGW)
	before := routeTerms(t, srv.url, subject, "ret")
	checkConservation(t, subject, before)
	stopGracefully(t, srv)
	time.Sleep(1100 * time.Millisecond) // every shard expired a retention window ago

	present := map[string]bool{}
	for g := range gateways {
		for k := range perGW {
			present[shardID(g, k)] = true
		}
	}
	retire := []string{"--retention", "1s", "--tombstone-retention", "1h", "--retention-interval", "50ms", "--compaction", "0", "--maintenance-share", "1"}
	// kill starts serve with retention, waits until the counter named
	// reaches target, kills it, restarts it without retention and checks.
	kill := func(round int, name string, target int64) {
		srv := startServer(t, bin, dir, retire...)
		var st map[string]any
		if !pollUntil(2*time.Minute, func() bool {
			st = statusz(t, srv.url)
			return counter(st, "retention", name) >= target
		}) {
			t.Fatalf("round %d: %s did not reach %d: %v", round, name, target, st)
		}
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		kill9(t, srv)
		srv = startServer(t, bin, dir, quiet...)
		removed := 0
		for g := range gateways {
			for k := range perGW {
				id := shardID(g, k)
				status, out := post(crashClient, srv.url, "ShardService/GetShard", fmt.Sprintf(`{"shardId":%q}`, id))
				switch {
				case status == 200 && present[id] && field(out, "shard", "reconciled") == true:
				case status == 404 && reasonOf(out) == "SHARD_NOT_FOUND":
					present[id] = false
					removed++
				default:
					t.Errorf("round %d: GetShard %s (present before: %v): %d %v", round, id, present[id], status, out)
				}
				if (g+k)%16 != 0 {
					continue
				}
				// A resent reconciliation: refused, or unknown once removed.
				status, out = post(crashClient, srv.url, "ShardService/ReconcileShard", fmt.Sprintf(`{"shardId":%q,"gatewayId":%q,"receipts":[]}`, id, gw(g)))
				if want := map[bool]string{true: "SHARD_ALREADY_RECONCILED", false: "SHARD_NOT_FOUND"}[present[id]]; reasonOf(out) != want {
					t.Errorf("round %d: reconciliation of %s resent: %d %v, want %s", round, id, status, out, want)
				}
			}
		}
		after := routeTerms(t, srv.url, subject, "ret")
		checkConservation(t, subject, after)
		if fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("round %d: terms %v, were %v before retention", round, after, before)
		}
		t.Logf("round %d: killed when %s reached %d: %d of %d shards removed, %v", round, name, target, removed, gateways*perGW, st["retention"])
		auditStoppedDataDir(t, bin, dir, srv)
		if t.Failed() {
			t.FailNow()
		}
	}
	remaining := func() int64 {
		n := int64(0)
		for _, p := range present {
			if p {
				n++
			}
		}
		return n
	}
	// Two kills at random points of the removal (the second among what
	// the first left), then one as the removal ends: in the last page,
	// or as the fences fold (the pass's next step, whose count shows only
	// once it ends).
	kill(0, "shardsRemoved", 1+rng.Int64N(remaining()/2))
	if n := remaining(); n > 0 {
		kill(1, "shardsRemoved", 1+rng.Int64N(n))
	}
	kill(2, "shardsRemoved", remaining())

	// One pass to its end folds whatever fence rows the kills left.
	srv = startServer(t, bin, dir, retire...)
	if !pollUntil(2*time.Minute, func() bool { return counter(statusz(t, srv.url), "retention", "passes") >= 1 }) {
		t.Fatal("no retention pass ended within 2 minutes")
	}
	stopGracefully(t, srv)
	// Every gateway restarts (boot epoch 2) and is issued a shard: its
	// fence is above the newest it held before its fence row was folded.
	srv = startServer(t, bin, dir, quiet...)
	parallel(gateways, func(g int) {
		out, ok := postOK(t, srv.url, "ShardService/IssueShard", fmt.Sprintf(
			`{"shardId":"next-%03d","subject":%q,"route":"ret","units":{"tokens":1},"gatewayId":%q,"bootEpoch":"2","ttl":"3600s"}`, g, subject, gw(g)))
		if !ok {
			return
		}
		if f, _ := strconv.ParseInt(fmt.Sprint(asMap(out["shard"])["fence"]), 10, 64); f <= maxFence[g] {
			t.Errorf("%s's shard after retention: fence %d, not above the %d it held", gw(g), f, maxFence[g])
		}
	})
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestShardRemintAfterAGenerationSwitchRepaysDebtOnce: a shard carved
// under generation 1; the policy is published again (generation 2),
// whose account takes generation 1's available capacity and then owes
// debt (usage above a reservation), so it admits nothing. The shard's
// reconciliation remints its confirmed unused units into generation 2,
// repaying the debt first; its answer is lost and serve killed with
// SIGKILL at once, and the retry after the restart is refused as already
// reconciled: the debt is repaid once, admission resumes, and the unknown
// work's units stay retired until its late receipt (its answer lost too)
// remints the rest once. Every generation's account conserves, the
// capacity in use across both adds up to the burst, and the audit of the
// stopped data directory is clean.
func TestShardRemintAfterAGenerationSwitchRepaysDebtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	const subject = "tenant-xgen"
	policy := `{"policy":{"subject":"*","route":"xgen","holdTtl":"3600s","epochLength":"315360000s",
	  "emergencyMode":true,"dimensions":[{"unit":"tokens","burst":"10000","maxOverdraft":"5000"}]}}`
	mustPost(t, srv.url, "PublishPolicy", policy)
	mustPost(t, srv.url, "ShardService/IssueShard", fmt.Sprintf(
		`{"shardId":"sh-x","subject":%q,"route":"xgen","units":{"tokens":4000},"gatewayId":"gw-a","bootEpoch":"1","ttl":"3600s"}`, subject))
	if gen := fmt.Sprint(mustPost(t, srv.url, "PublishPolicy", strings.Replace(policy, "3600s", "3601s", 1))["policy"].(map[string]any)["generation"]); gen != "2" {
		t.Fatalf("the second publish made generation %s, want 2", gen)
	}
	reserve := func(id string, tokens int) (int, map[string]any) {
		return post(crashClient, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"xgen","units":{"tokens":%d}}`, id, subject, tokens))
	}
	// Generation 2 holds what generation 1 had available: 6000.
	if status, out := reserve("big", 6000); status != 200 || fmt.Sprint(out["policyGeneration"]) != "2" {
		t.Fatalf("reserve of 6000 under generation 2: %d %v", status, out)
	}
	mustPost(t, srv.url, "Start", `{"reservationId":"big","operationId":"op-big"}`)
	mustPost(t, srv.url, "Settle", `{"reservationId":"big","operationId":"op-big","actualUnits":{"tokens":7000}}`)
	gen2 := func(want map[string]int64) {
		t.Helper()
		all := generationTerms(t, srv.url, subject, "xgen")
		for g, tm := range all {
			checkConservation(t, subject+"#"+g, tm)
		}
		for term, v := range want {
			if got := all["2"]["tokens"][term]; got != v {
				t.Errorf("%s generation 2: %s %d, want %d (%v)", subject, term, got, v, all)
			}
		}
	}
	gen2(map[string]int64{"available": 0, "spent": 7000, "overdraftIssued": 1000, "overdraftRepaid": 0})
	if status, out := reserve("while-owed", 1); status != 429 || reasonOf(out) != "ADMISSION_FROZEN" {
		t.Errorf("reserve of 1 while 1000 are owed: %d %v, want 429 ADMISSION_FROZEN", status, out)
	}

	// 500 of a 1000 hold used, 1000 started and unknown: 2500 unused,
	// reminted into generation 2: 1000 repay the debt, 1500 available.
	lossy := newLossyLink(t, srv.url)
	reconcile := `{"shardId":"sh-x","gatewayId":"gw-a","receipts":[
	  {"reservationId":"x-used","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1000},"actualUnits":{"tokens":500}},
	  {"reservationId":"x-unknown","state":"RESERVATION_STATE_STARTED","reservedUnits":{"tokens":1000}}]}`
	lossy.lose("ShardService/ReconcileShard", reconcile)
	kill9(t, srv)
	srv = startServer(t, bin, dir)
	if status, out := post(crashClient, srv.url, "ShardService/ReconcileShard", reconcile); status != 400 || reasonOf(out) != "SHARD_ALREADY_RECONCILED" {
		t.Errorf("the reconciliation retried after the restart: %d %v, want SHARD_ALREADY_RECONCILED", status, out)
	}
	gen2(map[string]int64{"available": 1500, "reserved": 0, "overdraftIssued": 1000, "overdraftRepaid": 1000})
	if status, out := reserve("after-repay", 1); status != 200 {
		t.Errorf("reserve of 1 once the remint repaid the debt: %d %v, want it admitted", status, out)
	}

	// The unknown work's receipt: 700 used, 300 come back, once.
	late := `{"shardId":"sh-x","gatewayId":"gw-a","receipts":[
	  {"reservationId":"x-unknown","state":"RESERVATION_STATE_SETTLED","reservedUnits":{"tokens":1000},"actualUnits":{"tokens":700}}]}`
	lossy = newLossyLink(t, srv.url)
	lossy.lose("ShardService/ReconcileShard", late)
	if status, out := post(crashClient, srv.url, "ShardService/ReconcileShard", late); status != 400 || reasonOf(out) != "SHARD_ALREADY_RECONCILED" {
		t.Errorf("the late receipt retried: %d %v, want SHARD_ALREADY_RECONCILED", status, out)
	}
	gen2(map[string]int64{"available": 1799, "reserved": 1, "overdraftRepaid": 1000})
	sh := asMap(mustPost(t, srv.url, "ShardService/GetShard", `{"shardId":"sh-x"}`)["shard"])
	for term, want := range map[string]string{"spentUnits": "1200", "remintedUnits": "2800", "unknownUnits": "0"} {
		if got := fmt.Sprint(asMap(sh[term])["tokens"]); got != want {
			t.Errorf("sh-x %s %s, want %s: %v", term, got, want, sh)
		}
	}
	// In use across both generations: 7000 settled, 1200 spent from the
	// shard, 1 held; the rest of the 10000 is available.
	var available int64
	for _, tm := range generationTerms(t, srv.url, subject, "xgen") {
		available += tm["tokens"]["available"]
	}
	if available != 10000-7000-1200-1 {
		t.Errorf("available across the generations %d, want %d", available, 10000-7000-1200-1)
	}
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestUnknownWorkKeepsItsHoldAcrossAKill: started work whose usage is
// unknown (marked by the gateway, its answer lost; marked by the
// execution-limit worker; or still STARTED long past its hold's TTL)
// keeps its units reserved across a SIGKILL of serve: after the restart
// none of it was expired or released, a Release of it is refused
// (RESERVATION_ALREADY_STARTED, refunding nothing), a reserve that needs
// its units is refused, and only each settle, sent twice, charges the
// usage and refunds the rest once. The audit of the stopped data
// directory is clean.
//
// The expiry worker lists started work only for its execution limit, so
// a hold started long past its TTL never meets the expiry rule: the rule
// is met by a mass expiry instead. 3,000 holds of 1 s run out at once and
// gateways start them all, from the other end, while the worker expires
// them (it claims the holds of a listing chunk by chunk, so a start lands
// between the listing of a hold and its claim), and serve is killed with
// SIGKILL among the refusals.
// After the restart every start acknowledged is still STARTED with its
// hold reserved (the claim that arrived after the start did nothing),
// every start refused as expired is EXPIRED, and the route holds exactly
// the started holds until they settle.
func TestUnknownWorkKeepsItsHoldAcrossAKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	const subject = "tenant-unknown"
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"unk","holdTtl":"1s","executionLimit":"2s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"1000"}]}}`)
	holds := map[string]int{"by-gateway": 200, "by-worker": 300, "still-started": 100}
	for id, tokens := range holds {
		mustPost(t, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"unk","units":{"tokens":%d}}`, id, subject, tokens))
		mustPost(t, srv.url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id))
	}
	state := func(id string) any {
		return asMap(mustPost(t, srv.url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))["reservation"])["state"]
	}
	lossy := newLossyLink(t, srv.url)
	lossy.lose("MarkUsageUnknown", `{"reservationId":"by-gateway"}`)
	// The worker marks work past its execution limit of 2 s; by then every
	// hold is past its TTL of 1 s.
	for deadline := time.Now().Add(60 * time.Second); state("by-worker") != "RESERVATION_STATE_USAGE_UNKNOWN"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("work past its execution limit of 2 s is %v after a minute", state("by-worker"))
		}
	}
	mustPost(t, srv.url, "Settle", `{"reservationId":"still-started","operationId":"op-still-started","actualUnits":{"tokens":100}}`)
	mustPost(t, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":"still-started-2","subject":%q,"route":"unk","units":{"tokens":100}}`, subject))
	mustPost(t, srv.url, "Start", `{"reservationId":"still-started-2","operationId":"op-still-started-2"}`)
	mass := startMassAtItsExpiry(t, srv)
	kill9(t, srv)
	mass.wait()
	srv = startServer(t, bin, dir)
	mass.check(t, srv.url)
	// Past its TTL, started: never expired; past its execution limit
	// the worker may have marked it unknown meanwhile.
	time.Sleep(1100 * time.Millisecond)

	for id, want := range map[string][]string{
		"by-gateway":      {"RESERVATION_STATE_USAGE_UNKNOWN"},
		"by-worker":       {"RESERVATION_STATE_USAGE_UNKNOWN"},
		"still-started-2": {"RESERVATION_STATE_STARTED", "RESERVATION_STATE_USAGE_UNKNOWN"},
	} {
		if got := fmt.Sprint(state(id)); got != want[0] && (len(want) == 1 || got != want[1]) {
			t.Errorf("%s after the restart: %s, want %v", id, got, want)
		}
		status, out := post(crashClient, srv.url, "Release", fmt.Sprintf(`{"reservationId":%q}`, id))
		if status != 400 || reasonOf(out) != "RESERVATION_ALREADY_STARTED" {
			t.Errorf("release of %s: %d %v, want RESERVATION_ALREADY_STARTED", id, status, out)
		}
	}
	terms := func(want map[string]int64) {
		t.Helper()
		tm := routeTerms(t, srv.url, subject, "unk")
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s: %s %d, want %d (%v)", subject, term, got, v, tm["tokens"])
			}
		}
	}
	// 600 held by unknown or started work, 100 spent: 300 available.
	terms(map[string]int64{"available": 300, "reserved": 600, "spent": 100})
	if status, out := post(crashClient, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":"beyond","subject":%q,"route":"unk","units":{"tokens":301}}`, subject)); status != 429 {
		t.Errorf("reserve of 301 beside 600 held by unknown work: %d %v, want 429", status, out)
	}
	for id, used := range map[string]int{"by-gateway": 150, "by-worker": 300, "still-started-2": 20} {
		body := fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, id, id, used)
		hold := holds[id]
		if id == "still-started-2" {
			hold = 100
		}
		if out := mustPost(t, srv.url, "Settle", body); fmt.Sprint(asMap(out["refundedUnits"])["tokens"]) != fmt.Sprint(hold-used) && hold != used {
			t.Errorf("settle of %s: %v, want %d refunded", id, out, hold-used)
		}
		if out := mustPost(t, srv.url, "Settle", body); out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
			t.Errorf("settle of %s sent again: %v, want a replay refunding nothing", id, out)
		}
	}
	terms(map[string]int64{"available": 1000 - 100 - 150 - 300 - 20, "reserved": 0, "spent": 100 + 150 + 300 + 20})
	auditStoppedDataDir(t, bin, dir, srv)
}

// TestCrashMidRollbackDrain kills serve with SIGKILL while a drain pass
// moves a rolled-back generation's leftover capacity and debt, account by
// account, to the generation that decides again, at a seeded random
// point. Generation 2 of a route took generation 1's capacity on each
// subject's first reserve under it; some subjects then owe debt under
// it. After the restart the audit of the data directory is clean (every
// move recorded at both ends, once); drains run again and, once the last
// holds end, generation 2 drains to zero; on every subject the capacity
// held, spent and available across both generations, less the debt
// owed, is the burst it started with.
func TestCrashMidRollbackDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	const subjects = 400
	policy := `{"policy":{"subject":"*","route":"drain","holdTtl":"%s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"1000","maxOverdraft":"1000"}]}}`
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(policy, "3600s"))
	subject := func(i int) string { return fmt.Sprintf("dr-%03d", i) }
	reserveAll := func(prefix string, tokens int) {
		var batch []string
		for i := range subjects {
			batch = append(batch, fmt.Sprintf(`{"reservationId":"%s-%03d","subject":%q,"route":"drain","units":{"tokens":%d}}`, prefix, i, subject(i), tokens))
		}
		for _, o := range mustPost(t, srv.url, "ReserveBatch", `{"requests":[`+strings.Join(batch, ",")+`]}`)["outcomes"].([]any) {
			if asMap(o)["ok"] == nil {
				t.Fatalf("reserve %s: %v", prefix, o)
			}
		}
	}
	reserveAll("g1", 100)
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(policy, "3601s"))
	reserveAll("g2", 200) // generation 2 takes the 900 available
	// One subject in four uses 1000 of its 200: 700 available, 100 debt.
	parallel(subjects/4, func(k int) {
		id := fmt.Sprintf("g2-%03d", 4*k)
		if _, ok := postOK(t, srv.url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id)); ok {
			postOK(t, srv.url, "Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":1000}}`, id, id))
		}
	})
	if t.Failed() {
		return
	}
	mustPost(t, srv.url, "RollbackPolicy", `{"generation":"2"}`)
	// The drain pass runs inside this call; serve is killed meanwhile.
	done := make(chan struct{})
	go func() {
		defer close(done)
		post(crashClient, srv.url, "RolloutService/DrainProgress", `{"generations":["2"],"runDrains":true}`)
	}()
	// A pass over the 400 accounts took some 90 ms on a loaded 2-core
	// machine.
	delay := time.Duration(rng.IntN(100_000)) * time.Microsecond
	time.Sleep(delay)
	kill9(t, srv)
	<-done
	t.Logf("killed %s after the drain was asked for", delay)

	if r := auditBinary(t, bin, exitOK, "--data-dir", dir); len(r.Discrepancies) != 0 {
		t.Fatalf("audit of the data dir after the kill: %+v", r.Discrepancies)
	}
	srv = startServer(t, bin, dir)
	left := mustPost(t, srv.url, "RolloutService/DrainProgress", `{"generations":["2"]}`)
	t.Logf("after the restart generation 2 still holds available %v, debt %v",
		field(left, "generations", "0", "available", "tokens"), field(left, "generations", "0", "debt", "tokens"))
	// The holds end (generation 2's released, generation 1's too), and
	// the drains run again until generation 2 holds nothing.
	var ids []string
	for i := range subjects {
		ids = append(ids, fmt.Sprintf("g1-%03d", i))
		if i%4 != 0 {
			ids = append(ids, fmt.Sprintf("g2-%03d", i))
		}
	}
	parallel(len(ids), func(i int) { postOK(t, srv.url, "Release", fmt.Sprintf(`{"reservationId":%q}`, ids[i])) })
	if t.Failed() {
		return
	}
	var progress map[string]any
	if !pollUntil(time.Minute, func() bool {
		progress = mustPost(t, srv.url, "RolloutService/DrainProgress", `{"generations":["2"],"runDrains":true}`)
		return progress["drained"] == true
	}) {
		t.Fatalf("generation 2 not drained within a minute: %v", progress)
	}
	for i := range subjects {
		var total int64
		all := generationTerms(t, srv.url, subject(i), "drain")
		for g, tm := range all {
			checkConservation(t, subject(i)+"#"+g, tm)
			m := tm["tokens"]
			total += m["available"] + m["reserved"] + m["spent"] - (m["overdraftIssued"] - m["overdraftRepaid"])
		}
		if total != 1000 {
			t.Errorf("%s: available, held and spent less debt across the generations %d, want 1000: %v", subject(i), total, all)
		}
	}
	auditStoppedDataDir(t, bin, dir, srv)
}

// massStart is the mass of holds TestUnknownWorkKeepsItsHoldAcrossAKill
// starts at their expiry, and what each start was answered.
type massStart struct {
	ids     []string
	answer  []string // "started", "expired", or "" (no answer: the kill)
	running sync.WaitGroup
}

const (
	massRoute = "unk-mass"
	massHolds = 3000
	massHold  = 10
)

// startMassAtItsExpiry reserves massHolds holds of 1 s on massRoute in
// one go and, from shortly before they run out, starts them all from 8
// gateways, the last reserved first (a gateway whose call gets no answer
// stops); it returns once 200 starts were refused as expired (or all were
// answered), with the rest under way.
func startMassAtItsExpiry(t *testing.T, srv *serverProcess) *massStart {
	t.Helper()
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":%q,"holdTtl":"1s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"%d"}]}}`, massRoute, massHolds*massHold))
	m := &massStart{ids: make([]string, massHolds), answer: make([]string, massHolds)}
	for i := range massHolds {
		m.ids[i] = fmt.Sprintf("mass-%04d", i)
	}
	reservedAt := time.Now()
	reserveInBatches(t, srv.url, massHolds, func(i int) string {
		return fmt.Sprintf(`{"reservationId":%q,"subject":"tenant-unknown","route":%q,"units":{"tokens":%d}}`, m.ids[i], massRoute, massHold)
	})
	// The worker lists holds past their TTL in id order and claims them
	// chunk by chunk; the gateways start them from the other end, from
	// shortly before the TTL, and meet the worker among holds it listed
	// and has not claimed yet.
	time.Sleep(time.Until(reservedAt.Add(800 * time.Millisecond)))
	var next, answered, refused atomic.Int64
	var once sync.Once
	enough := make(chan struct{})
	for range 8 {
		m.running.Add(1)
		go func() {
			defer m.running.Done()
			for k := int(next.Add(1) - 1); k < massHolds; k = int(next.Add(1) - 1) {
				i := massHolds - 1 - k
				status, out := post(crashClient, srv.url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, m.ids[i], m.ids[i]))
				switch {
				case status == 0:
					return
				case status == 200 && asMap(out["reservation"])["state"] == "RESERVATION_STATE_STARTED":
					m.answer[i] = "started"
				case status == 400 && reasonOf(out) == "RESERVATION_EXPIRED":
					m.answer[i] = "expired"
				default:
					t.Errorf("start of %s around its TTL: %d %v, want STARTED or RESERVATION_EXPIRED", m.ids[i], status, out)
					return
				}
				if m.answer[i] == "expired" {
					refused.Add(1)
				}
				// Killed once the gateways are well past where they met
				// the worker (200 refusals), or when every start was
				// answered.
				if n := answered.Add(1); n == massHolds || refused.Load() == 200 {
					once.Do(func() { close(enough) })
				}
			}
		}()
	}
	select {
	case <-enough:
	case <-time.After(3 * time.Minute): // a guard against a hang, not a speed check
		t.Fatal("the starts not answered within 3 minutes")
	}
	return m
}

// wait waits until every gateway stopped.
func (m *massStart) wait() { m.running.Wait() }

// check checks the mass after the restart: a start acknowledged left its
// hold STARTED (a release refused, the hold reserved); one refused as
// expired left it EXPIRED; one unanswered either, once the worker ended
// what was left. The route holds the started holds and nothing else, and
// each settles once.
func (m *massStart) check(t *testing.T, url string) {
	t.Helper()
	state := func(id string) string {
		return fmt.Sprint(asMap(mustPost(t, url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))["reservation"])["state"])
	}
	got := make([]string, massHolds)
	if !pollUntil(time.Minute, func() bool {
		for i, id := range m.ids {
			if got[i] = state(id); got[i] == "RESERVATION_STATE_RESERVED" || got[i] == "RESERVATION_STATE_EXPIRING" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("holds past their TTL still not expired a minute after the restart: %v", got)
	}
	var started, expired, unanswered int
	var startedIDs []string
	for i, id := range m.ids {
		switch {
		case m.answer[i] == "started" && got[i] != "RESERVATION_STATE_STARTED":
			t.Errorf("%s: start acknowledged (around its TTL), then %s after the restart, want STARTED (expiry never takes started work)", id, got[i])
		case m.answer[i] == "expired" && got[i] != "RESERVATION_STATE_EXPIRED":
			t.Errorf("%s: start refused as expired, then %s after the restart", id, got[i])
		case got[i] != "RESERVATION_STATE_STARTED" && got[i] != "RESERVATION_STATE_EXPIRED":
			t.Errorf("%s (start unanswered): %s after the restart, want STARTED or EXPIRED", id, got[i])
		}
		switch m.answer[i] {
		case "started":
			started++
		case "expired":
			expired++
		default:
			unanswered++
		}
		if got[i] == "RESERVATION_STATE_STARTED" {
			startedIDs = append(startedIDs, id)
		}
	}
	t.Logf("mass of %d holds started at their expiry: %d starts acknowledged, %d refused as expired, %d unanswered at the kill; %d STARTED after the restart",
		massHolds, started, expired, unanswered, len(startedIDs))
	if t.Failed() {
		return
	}
	terms := func(reserved, spent int64) {
		t.Helper()
		tm := routeTerms(t, url, "tenant-unknown", massRoute)
		checkConservation(t, "tenant-unknown", tm)
		if m := tm["tokens"]; m["reserved"] != reserved || m["spent"] != spent || m["available"] != massHolds*massHold-reserved-spent {
			t.Errorf("%s: %v, want reserved %d, spent %d, the rest available", massRoute, m, reserved, spent)
		}
	}
	terms(int64(len(startedIDs))*massHold, 0)
	parallel(len(startedIDs), func(i int) {
		id := startedIDs[i]
		if status, out := post(crashClient, url, "Release", fmt.Sprintf(`{"reservationId":%q}`, id)); status != 400 || reasonOf(out) != "RESERVATION_ALREADY_STARTED" {
			t.Errorf("release of started %s: %d %v, want RESERVATION_ALREADY_STARTED", id, status, out)
		}
		out, ok := postOK(t, url, "Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":4}}`, id, id))
		if ok && fmt.Sprint(asMap(out["refundedUnits"])["tokens"]) != "6" {
			t.Errorf("settle of %s: %v, want 6 refunded", id, out)
		}
	})
	terms(0, int64(len(startedIDs))*4)
}
