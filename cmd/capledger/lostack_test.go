package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capledger/capledger/internal/faultproxy"
)

// TestLostRefundAnswersRetriedOnTheOtherReplica: a gateway's settle,
// release or record of usage reaches a `capledger serve` replica, is
// applied, and its answer is lost on the way back (a TCP proxy forwards
// the request and swallows the answer); the gateway retries with the same
// ids on the other replica of the same PostgreSQL database, which had
// seen the reservation before the first replica changed it. Each refund
// is made exactly once (the retry answers replayed, refunding nothing),
// usage above the estimate (or recorded without a reservation) is
// recorded as debt once and admits nothing while it is owed, a reserve
// whose batch repays the debt and whose answer is lost debits once on its
// retry, and the audit is clean. On SQLite the retry goes to the same
// process, directly.
func TestLostRefundAnswersRetriedOnTheOtherReplica(t *testing.T) {
	onTwoReplicasAndSQLite(t, testLostRefundAnswers)
}

// onTwoReplicasAndSQLite runs body against two `capledger serve` replicas
// of one PostgreSQL schema (a call and its retry can go to different
// processes: firstURL and otherURL), then against one process on SQLite
// (both URLs the same).
func onTwoReplicasAndSQLite(t *testing.T, body func(t *testing.T, bin, firstURL, otherURL string)) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary and runs server processes")
	}
	bin := buildBinary(t)
	t.Run("postgres", func(t *testing.T) {
		dsn := postgresSchema(t)
		first := startServer(t, bin, t.TempDir(), "--store", dsn)
		other := startServer(t, bin, t.TempDir(), "--store", dsn)
		body(t, bin, first.url, other.url)
	})
	t.Run("sqlite", func(t *testing.T) {
		srv := startServer(t, bin, t.TempDir())
		body(t, bin, srv.url, srv.url)
	})
}

// lossyLink is a gateway's path to one replica through a proxy that can
// lose the next answer.
type lossyLink struct {
	t     *testing.T
	url   string
	proxy *faultproxy.Proxy
}

func newLossyLink(t *testing.T, target string) *lossyLink {
	t.Helper()
	proxy, err := faultproxy.Start(strings.TrimPrefix(target, "http://"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return &lossyLink{t: t, url: "http://" + proxy.Addr(), proxy: proxy}
}

// lose sends one call whose answer the proxy swallows after the server
// produced it, and fails the test unless the answer was indeed lost.
func (l *lossyLink) lose(method, body string) {
	l.t.Helper()
	dropped := l.proxy.Stats().DroppedResponses
	l.proxy.DropNextResponses(1)
	status, out := post(&http.Client{Timeout: 30 * time.Second}, l.url, method, body)
	if status != 0 {
		l.t.Fatalf("%s %s: answered %d %v, want the answer lost", method, body, status, out)
	}
	if got := l.proxy.Stats().DroppedResponses; got != dropped+1 {
		l.t.Fatalf("%s: the proxy dropped %d answers, want 1 (the request never reached the server?)", method, got-dropped)
	}
}

// lostRefundPolicy: no refill on refund (so balances move only when a
// reservation does), a refill on repay that repays a debt of 300 and
// leaves 200 within one 3 s interval. Epochs far longer than the test, so
// no epoch close moves spent into an opening mid-test.
const lostRefundPolicy = `{"policy":{"subject":"*","route":%q,"holdTtl":"3600s","epochLength":"315360000s",
  "dimensions":[{"unit":"tokens","burst":"1000"%s,"maxOverdraft":"1000"}]}}`

func testLostRefundAnswers(t *testing.T, bin, lossyURL, otherURL string) {
	lossy := newLossyLink(t, lossyURL)
	mustPost(t, lossyURL, "PublishPolicy", fmt.Sprintf(lostRefundPolicy, "refund", ""))
	mustPost(t, lossyURL, "PublishPolicy", fmt.Sprintf(lostRefundPolicy, "repay", `,"refillUnits":"500","refillInterval":"3s"`))

	const subject = "tenant-lost"
	reserve := func(url, route, id string, tokens int64) map[string]any {
		t.Helper()
		return mustPost(t, url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":%q,"units":{"tokens":%d}}`, id, subject, route, tokens))
	}
	start := func(url, id string) {
		t.Helper()
		mustPost(t, url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id))
	}
	settleBody := func(id string, actual int64) string {
		return fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d}}`, id, id, actual)
	}
	// retried sends the retry of a call whose first answer was lost and
	// checks that it replays the stored outcome in state, refunding nothing.
	retried := func(url, method, body, state string) {
		t.Helper()
		out := mustPost(t, url, method, body)
		if out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
			t.Errorf("%s retry on %s: replayed %v, refunded %v; want a replay refunding nothing", method, url, out["replayed"], out["refundedUnits"])
		}
		if got := asMap(out["reservation"])["state"]; got != state {
			t.Errorf("%s retry on %s: state %v, want %s", method, url, got, state)
		}
	}
	wantTerms := func(route string, want map[string]int64) terms {
		t.Helper()
		tm := routeTerms(t, otherURL, subject, route)
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s %s: %s %d, want %d (%v)", subject, route, term, got, v, tm["tokens"])
			}
		}
		return tm
	}

	// A settle below the estimate refunds 400; its answer is lost.
	reserve(otherURL, "refund", "lost-settle", 600)
	start(otherURL, "lost-settle")
	lossy.lose("Settle", settleBody("lost-settle", 200))
	retried(otherURL, "Settle", settleBody("lost-settle", 200), "RESERVATION_STATE_SETTLED")
	retried(lossy.url, "Settle", settleBody("lost-settle", 200), "RESERVATION_STATE_SETTLED") // the lossy path healed
	wantTerms("refund", map[string]int64{"available": 800, "reserved": 0, "spent": 200})

	// A release refunds its whole hold; its answer is lost.
	reserve(otherURL, "refund", "lost-release", 300)
	release := `{"reservationId":"lost-release"}`
	lossy.lose("Release", release)
	retried(otherURL, "Release", release, "RESERVATION_STATE_RELEASED")
	retried(lossy.url, "Release", release, "RESERVATION_STATE_RELEASED")
	wantTerms("refund", map[string]int64{"available": 800, "reserved": 0, "spent": 200})

	// Usage above the estimate, beside a hold of 200: 100 of its own
	// hold, 500 of available, 300 of debt; the answer is lost.
	reserve(otherURL, "refund", "beside-debt", 200)
	reserve(otherURL, "refund", "lost-debt", 100)
	start(otherURL, "lost-debt")
	lossy.lose("Settle", settleBody("lost-debt", 900))
	retried(otherURL, "Settle", settleBody("lost-debt", 900), "RESERVATION_STATE_SETTLED_WITH_DEBT")
	retried(lossy.url, "Settle", settleBody("lost-debt", 900), "RESERVATION_STATE_SETTLED_WITH_DEBT")
	wantTerms("refund", map[string]int64{"available": 0, "reserved": 200, "spent": 1100, "overdraftIssued": 300, "overdraftRepaid": 0})
	// The hold beside it is released while the debt is owed, its answer
	// lost: 200 come back to available once, and admission stays 0 on
	// both replicas all the same.
	release = `{"reservationId":"beside-debt"}`
	lossy.lose("Release", release)
	retried(otherURL, "Release", release, "RESERVATION_STATE_RELEASED")
	wantTerms("refund", map[string]int64{"available": 200, "reserved": 0, "spent": 1100, "overdraftIssued": 300, "overdraftRepaid": 0})
	for i, url := range []string{otherURL, lossy.url} {
		id := fmt.Sprintf("in-debt-%d", i)
		if status, out := post(crashClient, url, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"refund","units":{"tokens":1}}`, id, subject)); status != http.StatusTooManyRequests {
			t.Errorf("reserve of 1 token of 200 available while 300 are owed, through %s: %d %v, want 429", url, status, out)
		}
	}

	// Usage recorded after the fact (nothing reserved for it), 1200 on an
	// account of 1000: 200 of debt. The answer is lost; the retries on
	// the other replica and on the healed path charge nothing again.
	record := `{"reservationId":"lost-record","operationId":"op-lost-record","subject":"tenant-record","route":"refund","actualUnits":{"tokens":1200}}`
	lossy.lose("RecordUsage", record)
	for _, url := range []string{otherURL, lossy.url} {
		out := mustPost(t, url, "RecordUsage", record)
		if out["replayed"] != true || asMap(out["reservation"])["state"] != "RESERVATION_STATE_SETTLED_WITH_DEBT" {
			t.Errorf("record retry on %s: %v, want a replay of SETTLED_WITH_DEBT", url, out)
		}
	}
	recorded := routeTerms(t, otherURL, "tenant-record", "refund")
	checkConservation(t, "tenant-record", recorded)
	if m := recorded["tokens"]; m["spent"] != 1200 || m["overdraftIssued"] != 200 || m["available"] != 0 {
		t.Errorf("tenant-record: %v, want 1200 spent once, 200 of debt, nothing available", m)
	}

	// Debt on repay: the whole burst reserved, 300 used beyond it.
	reserve(otherURL, "repay", "repay-hold", 1000)
	start(otherURL, "repay-hold")
	settled := mustPost(t, otherURL, "Settle", settleBody("repay-hold", 1300))
	if got := asMap(settled["reservation"])["state"]; got != "RESERVATION_STATE_SETTLED_WITH_DEBT" {
		t.Fatalf("settle 1300 of a 1000 hold with nothing available: %v", settled)
	}
	before := wantTerms("repay", map[string]int64{"overdraftIssued": 300, "available": 0})
	if before["tokens"]["overdraftRepaid"] == 300 {
		t.Fatalf("the debt was repaid before the test lost the repayment's answer (a slow machine): %v", before["tokens"])
	}
	// The first reserve after a refill interval mints 500: 300 repay the
	// debt, 200 fill available, and 100 of them are reserved. Its answer
	// is lost; the retry on the other replica repeats the receipt.
	time.Sleep(3100 * time.Millisecond)
	repaying := fmt.Sprintf(`{"reservationId":"repaying","subject":%q,"route":"repay","units":{"tokens":100}}`, subject)
	lossy.lose("Reserve", repaying)
	out := mustPost(t, otherURL, "Reserve", repaying)
	if out["replayed"] != true {
		t.Errorf("reserve retry on the other replica: %v, want a replay", out)
	}
	mustPost(t, lossy.url, "Reserve", repaying)
	wantTerms("repay", map[string]int64{"overdraftIssued": 300, "overdraftRepaid": 300, "reserved": 100, "debt": 0})
	auditProcess(t, bin, otherURL)
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// TestLostStartAnswerOutlivesItsHold: an executor's start reaches one
// replica and is applied; its answer is lost, and by the time the
// executor retries on the other replica the hold's TTL has passed and the
// expiry worker (on whichever replica leads) has expired an unstarted
// hold beside it. The started work is not expired: the retry replays
// STARTED, the settle charges its usage and refunds the rest once, and
// the audit is clean. On SQLite the retry goes to the same process.
func TestLostStartAnswerOutlivesItsHold(t *testing.T) { onTwoReplicasAndSQLite(t, testLostStartAnswer) }

func testLostStartAnswer(t *testing.T, bin, lossyURL, otherURL string) {
	lossy := newLossyLink(t, lossyURL)
	const subject = "tenant-exp"
	state := func(id string) any {
		return asMap(mustPost(t, otherURL, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))["reservation"])["state"]
	}
	// The start must land within the hold's TTL of 1 s. A machine that
	// stalls longer between the reserve and the start lets the expiry come
	// first (the ledger then refuses the start, rightly), and the rest
	// would test nothing: then the whole set-up again, on a route of its
	// own, a few times at most.
	var route, runs, idle, start string
	for attempt := 1; ; attempt++ {
		route, runs, idle = fmt.Sprintf("exp-%d", attempt), fmt.Sprintf("runs-%d", attempt), fmt.Sprintf("idle-%d", attempt)
		mustPost(t, lossyURL, "PublishPolicy", fmt.Sprintf(`{"policy":{"subject":"*","route":%q,"holdTtl":"1s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"1000"}]}}`, route))
		for id, tokens := range map[string]int{runs: 300, idle: 200} {
			mustPost(t, otherURL, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":%q,"units":{"tokens":%d}}`, id, subject, route, tokens))
		}
		start = fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, runs, runs)
		lossy.lose("Start", start)
		got := state(runs)
		if got == "RESERVATION_STATE_STARTED" {
			break
		}
		if attempt == 3 {
			t.Fatalf("the start whose answer was lost left %s %v, in 3 attempts: it never landed within the hold's TTL", runs, got)
		}
		t.Logf("attempt %d: the start landed after the hold's TTL (%s is %v): again", attempt, runs, got)
	}
	for deadline := time.Now().Add(30 * time.Second); state(idle) != "RESERVATION_STATE_EXPIRED"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the unstarted hold is %v 30 s after its TTL of 1 s", state(idle))
		}
	}
	out := mustPost(t, otherURL, "Start", start)
	if out["replayed"] != true || asMap(out["reservation"])["state"] != "RESERVATION_STATE_STARTED" {
		t.Fatalf("start retried after the hold's TTL: %v, want a replay of STARTED", out)
	}
	settled := mustPost(t, lossy.url, "Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":100}}`, runs, runs))
	if got := fmt.Sprint(asMap(settled["refundedUnits"])["tokens"]); got != "200" {
		t.Errorf("settle of 100 of 300: refunded %s, want 200: %v", got, settled)
	}
	tm := routeTerms(t, otherURL, subject, route)
	checkConservation(t, subject, tm)
	if m := tm["tokens"]; m["available"] != 900 || m["reserved"] != 0 || m["spent"] != 100 {
		t.Errorf("%s: %v, want available 900, reserved 0, spent 100", subject, m)
	}
	auditProcess(t, bin, otherURL)
}

// TestUnknownUsageStaysHeldAcrossReplicas: work whose usage is unknown
// keeps its hold until a settle names the usage, on two replicas of one
// PostgreSQL database: one piece of work is marked USAGE_UNKNOWN by a
// gateway (its answer lost, the retry on the other replica replays it),
// another by the execution-limit worker of whichever replica leads. While
// both are unknown their units stay reserved and admit nothing else; their
// settles (one with its answer lost and retried on the other replica)
// charge the usage and refund the rest once, and the audit is clean. On
// SQLite every call goes to one process.
func TestUnknownUsageStaysHeldAcrossReplicas(t *testing.T) {
	onTwoReplicasAndSQLite(t, testUnknownUsageHeld)
}

func testUnknownUsageHeld(t *testing.T, bin, lossyURL, otherURL string) {
	lossy := newLossyLink(t, lossyURL)
	mustPost(t, lossyURL, "PublishPolicy", `{"policy":{"subject":"*","route":"unk","holdTtl":"3600s","executionLimit":"1s","epochLength":"315360000s",
	  "dimensions":[{"unit":"tokens","burst":"1000","maxOverdraft":"1000"}]}}`)
	const subject = "tenant-unk"
	for id, tokens := range map[string]int{"by-gateway": 200, "by-worker": 300} {
		mustPost(t, otherURL, "Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"unk","units":{"tokens":%d}}`, id, subject, tokens))
		mustPost(t, otherURL, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, id, id))
	}
	mark := `{"reservationId":"by-gateway"}`
	lossy.lose("MarkUsageUnknown", mark)
	if out := mustPost(t, otherURL, "MarkUsageUnknown", mark); out["replayed"] != true || asMap(out["reservation"])["state"] != "RESERVATION_STATE_USAGE_UNKNOWN" {
		t.Fatalf("mark retried on the other replica: %v, want a replay of USAGE_UNKNOWN", out)
	}
	state := func(id string) any {
		return asMap(mustPost(t, otherURL, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, id))["reservation"])["state"]
	}
	for deadline := time.Now().Add(30 * time.Second); state("by-worker") != "RESERVATION_STATE_USAGE_UNKNOWN"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("work past its execution limit of 1 s is %v after 30 s", state("by-worker"))
		}
	}
	terms := func(want map[string]int64) {
		t.Helper()
		tm := routeTerms(t, otherURL, subject, "unk")
		checkConservation(t, subject, tm)
		for term, v := range want {
			if got := tm["tokens"][term]; got != v {
				t.Errorf("%s: %s %d, want %d (%v)", subject, term, got, v, tm["tokens"])
			}
		}
	}
	// Unknown is not unconsumed: the 500 stay reserved, and 501 do not fit.
	terms(map[string]int64{"available": 500, "reserved": 500, "spent": 0})
	for i, url := range []string{otherURL, lossy.url} {
		if status, out := post(crashClient, url, "Reserve", fmt.Sprintf(`{"reservationId":"beyond-%d","subject":%q,"route":"unk","units":{"tokens":501}}`, i, subject)); status != 429 {
			t.Errorf("reserve of 501 beside 500 held by unknown work, through %s: %d %v, want 429", url, status, out)
		}
	}
	// The receipts arrive: 100 of 300 used (its settle's answer lost),
	// 250 of 200 (50 from available).
	settle := `{"reservationId":"by-worker","operationId":"op-by-worker","actualUnits":{"tokens":100}}`
	lossy.lose("Settle", settle)
	if out := mustPost(t, otherURL, "Settle", settle); out["replayed"] != true || len(asMap(out["refundedUnits"])) != 0 {
		t.Errorf("settle retried on the other replica: %v, want a replay refunding nothing", out)
	}
	mustPost(t, otherURL, "Settle", `{"reservationId":"by-gateway","operationId":"op-by-gateway","actualUnits":{"tokens":250}}`)
	terms(map[string]int64{"available": 650, "reserved": 0, "spent": 350, "overdraftIssued": 0})
	auditProcess(t, bin, otherURL)
}
