package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, for dbWatch
)

// Fault injection for the maintenance that deletes rows: a real `capledger
// serve` (the built binary) is killed with SIGKILL in the middle of a
// retention pass, a statement checkpoint cut, the journal deletion after
// it, the incremental vacuum and a full audit's copy, at several random
// points, and restarted on the same data directory; clients talk JSON to
// it over a socket, and the audits run as `capledger audit` processes.
// The kill points (counts reached, delays, the order of the modes) are
// drawn from a seed the test prints; CAPLEDGER_CRASH_SEED=<seed> draws
// them again (where the server then is still depends on timing).

const crashSeedEnv = "CAPLEDGER_CRASH_SEED"

// crashRand returns the test's seeded source, logging its seed.
func crashRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(crashSeedEnv); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s: %v", crashSeedEnv, err)
		}
	}
	t.Logf("seed %d (draw the same kill points with %s=%d)", seed, crashSeedEnv, seed)
	return rand.New(rand.NewPCG(seed, 0xdeadbeef))
}

// crashClient is a gateway's or an operator's JSON client.
var crashClient = &http.Client{Timeout: 30 * time.Second}

// mustPost sends one call and fails the test unless it answers 200.
func mustPost(t *testing.T, url, method, body string) map[string]any {
	t.Helper()
	out, ok := postOK(t, url, method, body)
	if !ok {
		t.FailNow()
	}
	return out
}

// postOK sends one call and marks the test failed unless it answers 200
// (for goroutines other than the test's).
func postOK(t *testing.T, url, method, body string) (map[string]any, bool) {
	t.Helper()
	status, out := post(crashClient, url, method, body)
	if status != 200 {
		t.Errorf("%s %.200s: %d %v", method, body, status, out)
		return out, false
	}
	return out, true
}

// parallel calls f for 0..n-1 on 8 goroutines.
func parallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// crashPolicy admits any subject on route chat, with no refill, so that
// balances move only when a reservation does.
const crashPolicy = `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s",
  "dimensions":[{"unit":"tokens","burst":"1000000000"},{"unit":"requests","burst":"100000000"}]}}`

// finished is a reservation the backlog finished, as the client knows it.
type finished struct {
	id, subject    string
	digest         string // the stored request digest
	tokens, actual int64
	state          string // RESERVATION_STATE_SETTLED or _RELEASED
}

func (f *finished) reserveBody(tokens int64) string {
	return fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":%d,"requests":1}}`, f.id, f.subject, tokens)
}

// makeBacklog finishes n reservations over subjects bk-0.. bk-(subjects-1):
// reserved in batches, then two in three started and settled (below and
// above the estimate), the rest released. Every call must be acknowledged.
func makeBacklog(t *testing.T, url string, n, subjects int) []*finished {
	t.Helper()
	out := make([]*finished, n)
	for i := range out {
		f := &finished{id: fmt.Sprintf("bk-%06d", i), subject: fmt.Sprintf("bk-%d", i%subjects), tokens: int64(100 + i%300)}
		switch i % 3 {
		case 0:
			f.state = "RESERVATION_STATE_RELEASED"
		case 1:
			f.state, f.actual = "RESERVATION_STATE_SETTLED", f.tokens/2
		case 2:
			f.state, f.actual = "RESERVATION_STATE_SETTLED", f.tokens+7
		}
		out[i] = f
	}
	const chunk = 500
	for from := 0; from < n; from += chunk {
		var items []string
		for _, f := range out[from:min(from+chunk, n)] {
			items = append(items, f.reserveBody(f.tokens))
		}
		body := mustPost(t, url, "ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`)
		checkOutcomes(t, body, "reserve")
		for i, o := range body["outcomes"].([]any) {
			res := o.(map[string]any)["ok"].(map[string]any)["reservation"].(map[string]any)
			out[from+i].digest = res["requestDigest"].(string)
		}
	}
	parallel(n, func(i int) {
		f := out[i]
		if f.state == "RESERVATION_STATE_RELEASED" {
			postOK(t, url, "Release", fmt.Sprintf(`{"reservationId":%q}`, f.id))
			return
		}
		postOK(t, url, "Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, f.id, f.id))
	})
	if t.Failed() {
		t.FailNow()
	}
	var settles []string
	for _, f := range out {
		if f.state == "RESERVATION_STATE_SETTLED" {
			settles = append(settles, fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d,"requests":1}}`, f.id, f.id, f.actual))
		}
	}
	for from := 0; from < len(settles); from += chunk {
		checkOutcomes(t, mustPost(t, url, "SettleBatch", `{"requests":[`+strings.Join(settles[from:min(from+chunk, len(settles))], ",")+`]}`), "settle")
	}
	return out
}

// checkOutcomes fails the test unless every outcome of a batch call is ok.
func checkOutcomes(t *testing.T, body map[string]any, what string) {
	t.Helper()
	for _, o := range body["outcomes"].([]any) {
		if o.(map[string]any)["ok"] == nil {
			t.Fatalf("batch %s: %v", what, o)
		}
	}
}

// terms is an account's conservation terms: unit -> term -> value.
type terms map[string]map[string]int64

// accountTerms reads subject's account on chat (one generation).
func accountTerms(t *testing.T, url, subject string) terms {
	t.Helper()
	return routeTerms(t, url, subject, "chat")
}

// routeTerms reads subject's account on route (one generation).
func routeTerms(t *testing.T, url, subject, route string) terms {
	t.Helper()
	generations := generationTerms(t, url, subject, route)
	if len(generations) != 1 {
		t.Fatalf("account %s/%s: %d generations, want 1: %v", subject, route, len(generations), generations)
	}
	for _, tm := range generations {
		return tm
	}
	return nil
}

// generationTerms reads subject's accounts on route, by policy generation.
func generationTerms(t *testing.T, url, subject, route string) map[string]terms {
	t.Helper()
	body := mustPost(t, url, "GetAccount", fmt.Sprintf(`{"subject":%q,"route":%q}`, subject, route))
	accounts, _ := body["accounts"].([]any)
	generations := map[string]terms{}
	for _, a := range accounts {
		account := a.(map[string]any)
		out := terms{}
		for _, b := range account["balances"].([]any) {
			bal := b.(map[string]any)
			m := map[string]int64{}
			for k, v := range bal {
				if k == "unit" {
					continue
				}
				n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
				if err != nil {
					t.Fatalf("account %s: %s = %v", subject, k, v)
				}
				m[k] = n
			}
			out[bal["unit"].(string)] = m
		}
		generations[fmt.Sprint(account["policyGeneration"])] = out
	}
	return generations
}

// checkConservation fails the test unless the seed's equation holds in
// every unit of tm.
func checkConservation(t *testing.T, subject string, tm terms) {
	t.Helper()
	for unit, m := range tm {
		in := m["opening"] + m["minted"] + m["overdraftIssued"]
		out := m["available"] + m["reserved"] + m["spent"] + m["retiredForEmergency"] + m["retiredForMove"] + m["overdraftRepaid"]
		if in != out || m["available"] < 0 {
			t.Errorf("%s %s: conservation broken: %v", subject, unit, m)
		}
	}
}

// holdings is what a debit or a refund moves: available and reserved per
// unit (an epoch close moves spent into the next opening, never these).
func holdings(tm terms) string {
	var b strings.Builder
	for _, unit := range []string{"tokens", "requests"} {
		fmt.Fprintf(&b, "%s available %d reserved %d; ", unit, tm[unit]["available"], tm[unit]["reserved"])
	}
	return b.String()
}

// auditProcess runs `capledger audit` (with args) against url and fails the
// test unless it exits 0 (no discrepancies).
func auditProcess(t *testing.T, bin, url string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"audit", "--addr", url, "--timeout", "60s"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("capledger audit %v: %v\n%s", args, err, out)
	}
}

// statusz reads the server's /statusz.
func statusz(t *testing.T, url string) map[string]any {
	t.Helper()
	resp, err := crashClient.Get(url + "/statusz")
	if err != nil {
		return nil // killed meanwhile
	}
	defer resp.Body.Close()
	var out map[string]any
	if json.NewDecoder(resp.Body).Decode(&out) != nil {
		return nil
	}
	return out
}

// counter is a number of /statusz's section (-1 when unreadable).
func counter(st map[string]any, section, name string) int64 {
	sec, _ := st[section].(map[string]any)
	v, ok := sec[name].(float64)
	if !ok {
		return -1
	}
	return int64(v)
}

// pollUntil polls cond every 500 µs until it holds or d passes, and
// reports whether it held.
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(500 * time.Microsecond)
	}
	return false
}

// kill9 kills p with SIGKILL and reaps it.
func kill9(t *testing.T, p *serverProcess) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
}

// openTempFiles lists the unlinked temporary files p holds open whose
// name contains prefix (the cut's stage, the audit's copy).
func openTempFiles(t *testing.T, p *serverProcess, prefix string) []string {
	dir := fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid)
	if _, err := os.Stat("/proc/self/fd"); err != nil {
		t.Skip("needs /proc to see the server's open files")
	}
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.Contains(target, prefix) {
			out = append(out, target)
		}
	}
	return out
}

// checkNoTempFiles fails the test if dir holds a cut stage or an audit
// copy (each is unlinked at once; a crash must leave none).
func checkNoTempFiles(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".capledger-") {
			t.Errorf("%s left behind in the data directory", e.Name())
		}
	}
}

// gatewayLoad is gateways reserving, starting and settling (one in four
// left held) on subjects of their own while maintenance runs, until the
// server stops answering; records says how far a client saw each
// acknowledged. It never publishes a policy (a new generation would move
// the backlog's accounts).
type gatewayLoad struct {
	mu      sync.Mutex
	records map[string]*record
	acks    atomic.Int64
	stopped chan struct{}
	wg      sync.WaitGroup
}

func startGatewayLoad(t *testing.T, url, prefix string, records map[string]*record) *gatewayLoad {
	g := &gatewayLoad{records: records, stopped: make(chan struct{})}
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 3 {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for k := 0; ; k++ {
				select {
				case <-g.stopped:
					return
				default:
				}
				r := &record{id: fmt.Sprintf("%s-w%d-%d", prefix, w, k), subject: fmt.Sprintf("ld-%d", w), reserved: int64(50 + k%100)}
				r.actual = r.reserved / 2
				g.mu.Lock()
				g.records[r.id] = r
				g.mu.Unlock()
				call := func(method, body string, s step) bool {
					status, out := post(client, url, method, body)
					if status != 200 {
						if status != 0 && status != http.StatusServiceUnavailable {
							t.Errorf("%s %s: %d %v", method, r.id, status, out)
						}
						return false
					}
					g.mu.Lock()
					r.acked = s
					g.mu.Unlock()
					g.acks.Add(1)
					return true
				}
				if !call("Reserve", fmt.Sprintf(`{"reservationId":%q,"subject":%q,"route":"chat","units":{"tokens":%d,"requests":1}}`,
					r.id, r.subject, r.reserved), stepReserved) {
					return
				}
				if k%4 == 3 {
					continue // left held
				}
				if !call("Start", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s"}`, r.id, r.id), stepStarted) {
					return
				}
				g.mu.Lock()
				r.settleSent = true
				g.mu.Unlock()
				if !call("Settle", fmt.Sprintf(`{"reservationId":%q,"operationId":"op-%s","actualUnits":{"tokens":%d,"requests":1}}`,
					r.id, r.id, r.actual), stepSettled) {
					return
				}
			}
		}()
	}
	// A test that fails before done stops the gateways too, before the
	// server (started earlier, so cleaned up later) is killed: a
	// gateway's t.Errorf after the test ended would panic.
	t.Cleanup(g.done)
	return g
}

// done stops the gateways and waits for them.
func (g *gatewayLoad) done() {
	select {
	case <-g.stopped:
	default:
		close(g.stopped)
	}
	g.wg.Wait()
}

// verifyGateways checks on a restarted server that every step a gateway
// saw acknowledged is stored: the row at that state or beyond (a settle
// with the client's usage), or, once retention removed it, its tombstone
// of a settled reservation; forgetting, a reservation a settle was sent
// for may be gone altogether (its tombstone past the horizon).
func verifyGateways(t *testing.T, url string, records map[string]*record, forgetting bool) {
	t.Helper()
	progress := map[string]step{
		"RESERVATION_STATE_RESERVED": stepReserved, "RESERVATION_STATE_STARTED": stepStarted, "RESERVATION_STATE_SETTLED": stepSettled,
	}
	var list []*record
	for _, r := range records {
		list = append(list, r)
	}
	var acked atomic.Int64
	parallel(len(list), func(i int) {
		r := list[i]
		status, body := post(crashClient, url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, r.id))
		if status == 404 {
			if r.acked != stepNone && !(forgetting && r.settleSent) {
				t.Errorf("%s: acknowledged (step %d) but missing after the restart", r.id, r.acked)
			}
			return
		}
		if status != 200 {
			t.Errorf("get %s: %d %v", r.id, status, body)
			return
		}
		if r.acked != stepNone {
			acked.Add(1)
		}
		res := body["reservation"].(map[string]any)
		state, _ := res["state"].(string)
		if progress[state] < r.acked {
			t.Errorf("%s: acknowledged at step %d, stored as %s", r.id, r.acked, state)
		}
		if res["retired"] == true {
			if state != "RESERVATION_STATE_SETTLED" || res["subject"] != r.subject {
				t.Errorf("%s: tombstone %v of a reservation the client settled for %s", r.id, res, r.subject)
			}
			return
		}
		if fmt.Sprint(res["reservedUnits"].(map[string]any)["tokens"]) != fmt.Sprint(r.reserved) || res["subject"] != r.subject {
			t.Errorf("%s: stored %v, the client reserved %d tokens for %s", r.id, res, r.reserved, r.subject)
		}
		if state == "RESERVATION_STATE_SETTLED" && fmt.Sprint(res["actualUnits"].(map[string]any)["tokens"]) != fmt.Sprint(r.actual) {
			t.Errorf("%s: settled with %v, the client sent %d", r.id, res["actualUnits"], r.actual)
		}
	})
	t.Logf("gateways: %d of %d reservations acknowledged and found", acked.Load(), len(list))
}

// backlogCheck is what checkBacklog found.
type backlogCheck struct{ rows, tombstones, gone int }

// checkBacklog checks the backlog on a (restarted) server: every
// reservation answers, from its row as the client finished it or from
// its tombstone (its state and request digest); ids in gone (answered
// 404 before: their tombstones were forgotten) stay unknown, and a new
// 404 is allowed only when forgetting. Then it retries every known id:
// with the same request, a replay that debits nothing; with another
// digest, refused. The backlog's accounts must hold exactly before
// (available, reserved) before and after the retries, with the seed's
// conservation, and `capledger audit`, full and since the checkpoint,
// must pass.
func checkBacklog(t *testing.T, bin, url string, backlog []*finished, before map[string]string, forgetting bool, gone map[string]bool) backlogCheck {
	t.Helper()
	checkHoldings := func(when string) {
		for subject, want := range before {
			tm := accountTerms(t, url, subject)
			checkConservation(t, subject, tm)
			if got := holdings(tm); got != want {
				t.Errorf("%s %s: %s, want %s", subject, when, got, want)
			}
		}
	}
	checkHoldings("after the restart")
	var mu sync.Mutex
	var c backlogCheck
	wasGone := make([]bool, len(backlog)) // gone is written below
	for i, f := range backlog {
		wasGone[i] = gone[f.id]
	}
	parallel(len(backlog), func(i int) {
		f := backlog[i]
		status, body := post(crashClient, url, "GetReservation", fmt.Sprintf(`{"reservationId":%q}`, f.id))
		if status == 404 {
			if !forgetting && !wasGone[i] {
				t.Errorf("%s: finished and acknowledged, but neither its row nor its tombstone is there", f.id)
			}
			mu.Lock()
			c.gone++
			gone[f.id] = true
			mu.Unlock()
			return
		}
		if status != 200 {
			t.Errorf("get %s: %d %v", f.id, status, body)
			return
		}
		res := body["reservation"].(map[string]any)
		if wasGone[i] {
			t.Errorf("%s: its tombstone was forgotten, but it answers again: %v", f.id, res)
		}
		if res["state"] != f.state || res["subject"] != f.subject || res["requestDigest"] != f.digest {
			t.Errorf("%s: stored %v, the client finished it as %s for %s (digest %s)", f.id, res, f.state, f.subject, f.digest)
		}
		retired := res["retired"] == true
		mu.Lock()
		if retired {
			c.tombstones++
		} else {
			c.rows++
			if fmt.Sprint(res["reservedUnits"].(map[string]any)["tokens"]) != fmt.Sprint(f.tokens) ||
				f.actual > 0 && fmt.Sprint(res["actualUnits"].(map[string]any)["tokens"]) != fmt.Sprint(f.actual) {
				t.Errorf("%s: stored %v, the client reserved %d and used %d", f.id, res, f.tokens, f.actual)
			}
		}
		mu.Unlock()
		if !retired && i%8 != 0 {
			return // the retries of live rows are another test's; a sample
		}
		// A gateway's retry of the same request replays and debits
		// nothing; the id reused for another request is refused.
		status, body = post(crashClient, url, "Reserve", f.reserveBody(f.tokens))
		if status != 200 || body["replayed"] != true {
			t.Errorf("retry of %s: %d %v, want a replay", f.id, status, body)
		}
		status, body = post(crashClient, url, "Reserve", f.reserveBody(f.tokens+1))
		if status != http.StatusConflict || !strings.Contains(fmt.Sprint(body["message"]), "different request digest") {
			t.Errorf("%s reused with another digest: %d %v, want refused", f.id, status, body)
		}
	})
	checkHoldings("after retrying every reservation")
	auditProcess(t, bin, url)
	auditProcess(t, bin, url, "--since-checkpoint")
	return c
}

// TestCrashMidRetention kills serve with SIGKILL while a retention pass
// removes a backlog of finished reservations (and while it gives the
// space back), then while a pass forgets their tombstones, at seeded
// random points, with gateways admitting meanwhile. After each restart
// every acknowledged reservation is there or answered from its
// tombstone, a retry replays without debiting, another digest is
// refused, the accounts hold what they held, and the audit passes.
func TestCrashMidRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a dozen server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	quiet := []string{"--retention", "0", "--compaction", "0"}
	srv := startServer(t, bin, dir, quiet...)
	mustPost(t, srv.url, "PublishPolicy", crashPolicy)
	const subjects = 8
	backlog := makeBacklog(t, srv.url, 2000, subjects)
	before := map[string]string{}
	for s := range subjects {
		subject := fmt.Sprintf("bk-%d", s)
		before[subject] = holdings(accountTerms(t, srv.url, subject))
	}
	stopGracefully(t, srv)
	watch := watchDB(t, dir)
	time.Sleep(time.Second) // every reservation finished a retention window ago

	records := map[string]*record{}
	gone := map[string]bool{}
	// kill starts serve with flags (and, with load, gateways), waits
	// until the retention counter named reaches target, lets delay pass,
	// kills it, and restarts it without retention to check.
	kill := func(round int, flags []string, name string, target int64, delay time.Duration, load, forgetting bool) backlogCheck {
		began := time.Now()
		srv := startServer(t, bin, dir, flags...)
		var g *gatewayLoad
		if load {
			g = startGatewayLoad(t, srv.url, fmt.Sprintf("ret%d", round), records)
		}
		var st map[string]any
		// Generous: on a loaded machine a backlog pass beside the
		// gateways pauses for many times a slow page's time; quiet, the
		// target comes in seconds.
		if !pollUntil(3*time.Minute, func() bool {
			st = statusz(t, srv.url)
			return counter(st, "retention", name) >= target
		}) {
			t.Fatalf("round %d: %s did not reach %d: %v", round, name, target, st)
		}
		time.Sleep(delay)
		st = statusz(t, srv.url)
		kill9(t, srv)
		if g != nil {
			g.done()
		}
		watch.checkIntegrity(t)
		t.Logf("round %d: killed serve %s when %s had reached %d, %s later: %v", round, flags, name, target, delay, st["retention"])
		srv = startServer(t, bin, dir, quiet...)
		c := checkBacklog(t, bin, srv.url, backlog, before, forgetting, gone)
		verifyGateways(t, srv.url, records, forgetting)
		stopGracefully(t, srv)
		t.Logf("round %d: %d rows, %d tombstones, %d forgotten (round took %s)", round, c.rows, c.tombstones, c.gone, time.Since(began).Round(time.Millisecond))
		if t.Failed() {
			t.FailNow()
		}
		return c
	}
	randomDelay := func() time.Duration { return time.Duration(rng.IntN(3000)) * time.Microsecond }

	// The whole maintenance share: beside the gateways a backlog pass
	// takes an eighth of it, and at the default one slow page on a
	// loaded machine paused the pass 45 s.
	retire := []string{"--retention", "1s", "--tombstone-retention", "1h", "--retention-interval", "50ms", "--compaction", "0", "--maintenance-share", "1"}
	c := backlogCheck{rows: len(backlog)}
	for round := 0; round < 3 && c.rows > 0; round++ {
		c = kill(round, retire, "retired", 1+rng.Int64N(int64(c.rows)), randomDelay(), true, false)
	}
	// At the end of the removal: the last pages, then the pass giving
	// their space back (TestCrashMidReclaim kills that for sure). No
	// gateways: their reservations would keep the pass going.
	if c.rows > 0 {
		c = kill(3, retire, "retired", int64(c.rows), time.Duration(rng.IntN(40_000))*time.Microsecond, false, false)
	}
	if c.rows != 0 || c.tombstones != len(backlog) {
		t.Fatalf("after the passes: %d rows, %d tombstones, want every reservation a tombstone", c.rows, c.tombstones)
	}

	forget := []string{"--retention", "1s", "--tombstone-retention", "2s", "--retention-interval", "50ms", "--compaction", "0", "--maintenance-share", "1"}
	time.Sleep(2 * time.Second) // every tombstone is past the horizon
	for round := 4; round < 6 && c.tombstones > 0; round++ {
		c = kill(round, forget, "tombstonesForgotten", 1+rng.Int64N(int64(c.tombstones)), randomDelay(), true, true)
	}
}

// TestCrashMidCompaction kills serve with SIGKILL, at seeded random
// points, while it cuts a statement checkpoint (its accounts staged and
// written a page per transaction, the header last), while it deletes the
// journal the checkpoint summarises, and while it gives the space back,
// with gateways admitting meanwhile. After each restart no acknowledged
// step is lost, the next checkpoint is cut past the last one, and the
// audit, full and since the checkpoint (which verifies the chain), passes.
func TestCrashMidCompaction(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs several server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	// Retention runs too (removing the gateways' settled reservations),
	// as it does beside compaction in production.
	flags := []string{"--retention", "2s", "--tombstone-retention", "1h", "--retention-interval", "100ms",
		"--compaction", "1s", "--compaction-interval", "50ms"}
	srv := startServer(t, bin, dir, flags...)
	mustPost(t, srv.url, "PublishPolicy", crashPolicy)
	// Many accounts, so that a cut (a pass over every account, its pages
	// written a transaction each) takes a while.
	reserveInBatches(t, srv.url, 6000, func(i int) string {
		return fmt.Sprintf(`{"reservationId":"hold-%d","subject":"ac-%d","route":"chat","units":{"tokens":1,"requests":1}}`, i, i)
	})
	watch := watchDB(t, dir)
	records := map[string]*record{}
	// Every kill point at least once, in a seeded order.
	modes := rng.Perm(4)
	// compaction reads a compaction counter of st, failing the test
	// once a cut was refused (its audit found discrepancies).
	compaction := func(st map[string]any, name string) int64 {
		if n := counter(st, "compaction", "refused"); n > 0 {
			t.Fatalf("the compaction's audit refused %d cuts: %v", n, st["compaction"])
		}
		return counter(st, "compaction", name)
	}
	for round, mode := range modes {
		g := startGatewayLoad(t, srv.url, fmt.Sprintf("cmp%d", round), records)
		st := statusz(t, srv.url)
		cuts, deleted := compaction(st, "checkpoints"), compaction(st, "journalRowsDeleted")
		var what string
		var ok bool
		switch mode {
		case 0:
			what = "mid-cut (its stage file open)"
			ok = pollUntil(30*time.Second, func() bool { return len(openTempFiles(t, srv, ".capledger-cut-")) > 0 })
			time.Sleep(time.Duration(rng.IntN(20_000)) * time.Microsecond)
		case 3:
			what = "mid-cut, writing the checkpoint's accounts"
			ok = pollUntil(30*time.Second, func() bool { return watch.staged() > 0 })
			time.Sleep(time.Duration(rng.IntN(5_000)) * time.Microsecond)
		case 1:
			what = "after a checkpoint's header, deleting the journal"
			ok = pollUntil(30*time.Second, func() bool { return compaction(statusz(t, srv.url), "checkpoints") > cuts })
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		case 2:
			what = "deleting the journal or giving the space back"
			ok = pollUntil(30*time.Second, func() bool { return compaction(statusz(t, srv.url), "journalRowsDeleted") > deleted })
			time.Sleep(time.Duration(rng.IntN(30_000)) * time.Microsecond)
		}
		if !ok {
			t.Fatalf("round %d: never %s: %v", round, what, statusz(t, srv.url))
		}
		st = statusz(t, srv.url)
		kill9(t, srv)
		g.done()
		watch.checkIntegrity(t)
		lastSeq := compaction(st, "lastCheckpoint")
		t.Logf("round %d: killed %s (%d accounts of the next checkpoint staged, %d free pages): %v", round, what, watch.staged(), watch.freePages(), st["compaction"])
		checkNoTempFiles(t, dir)

		srv = startServer(t, bin, dir, flags...)
		verifyGateways(t, srv.url, records, false)
		auditProcess(t, bin, srv.url)
		auditProcess(t, bin, srv.url, "--since-checkpoint")
		// The next cut succeeds: past the last checkpoint seen, once
		// something new is journaled.
		mustPost(t, srv.url, "Reserve", fmt.Sprintf(`{"reservationId":"probe-%d","subject":"probe","route":"chat","units":{"tokens":1,"requests":1}}`, round))
		if !pollUntil(30*time.Second, func() bool {
			st = statusz(t, srv.url)
			return compaction(st, "checkpoints") >= 1 && compaction(st, "lastCheckpoint") > lastSeq
		}) {
			t.Fatalf("round %d: no checkpoint cut after the restart (the last one seen before the kill: %d): %v", round, lastSeq, st["compaction"])
		}
		auditProcess(t, bin, srv.url, "--since-checkpoint")
		if t.Failed() {
			t.FailNow()
		}
	}
	stopGracefully(t, srv)
	watch.checkIntegrity(t)
}

// TestCrashMidAuditCopy kills serve with SIGKILL while a full audit
// (`capledger audit`) copies the database into its file or reads that
// copy, at seeded random points, with gateways admitting meanwhile: the
// copy leaves no file behind, nothing acknowledged is lost, and the next
// audits pass.
func TestCrashMidAuditCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs several server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	flags := []string{"--retention", "0", "--compaction", "0"}
	srv := startServer(t, bin, dir, flags...)
	mustPost(t, srv.url, "PublishPolicy", crashPolicy)
	// Reservations for the copy.
	reserveInBatches(t, srv.url, 30_000, func(i int) string {
		return fmt.Sprintf(`{"reservationId":"held-%d","subject":"sp-%d","route":"chat","units":{"tokens":1,"requests":1}}`, i, i%100)
	})
	watch := watchDB(t, dir)
	records := map[string]*record{}
	for round := range 3 {
		g := startGatewayLoad(t, srv.url, fmt.Sprintf("sp%d", round), records)
		audit := exec.Command(bin, "audit", "--addr", srv.url, "--timeout", "60s")
		var auditOut strings.Builder
		audit.Stdout, audit.Stderr = &auditOut, &auditOut
		if err := audit.Start(); err != nil {
			t.Fatal(err)
		}
		opened := time.Now()
		if !pollUntil(30*time.Second, func() bool { return len(openTempFiles(t, srv, ".capledger-audit-")) > 0 }) {
			t.Fatalf("round %d: the audit opened no copy", round)
		}
		time.Sleep(time.Duration(rng.IntN(1_500_000)) * time.Microsecond)
		copying := len(openTempFiles(t, srv, ".capledger-audit-")) > 0
		kill9(t, srv)
		g.done()
		err := audit.Wait()
		watch.checkIntegrity(t)
		t.Logf("round %d: killed %s after the copy opened (still open: %v); the audit: %v", round, time.Since(opened), copying, err)
		checkNoTempFiles(t, dir)

		srv = startServer(t, bin, dir, flags...)
		verifyGateways(t, srv.url, records, false)
		auditProcess(t, bin, srv.url)
		auditProcess(t, bin, srv.url, "--since-checkpoint")
		if t.Failed() {
			t.FailNow()
		}
	}
	stopGracefully(t, srv)
	watch.checkIntegrity(t)
}

// dbWatch reads the server's database from the test process (another
// reader, as SQLite's WAL mode allows) to see what a maintenance step
// has written so far: the kill points the server's counters cannot name.
type dbWatch struct{ db *sql.DB }

func watchDB(t *testing.T, dir string) *dbWatch {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "capledger.db")+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	// No connection is kept between queries: a restarted server opens
	// its files as it would with no other process on them.
	db.SetMaxIdleConns(0)
	t.Cleanup(func() { db.Close() })
	return &dbWatch{db: db}
}

// count runs a query of one integer (-1 on an error).
func (w *dbWatch) count(q string) int64 {
	var n int64
	if err := w.db.QueryRow(q).Scan(&n); err != nil {
		return -1
	}
	return n
}

// staged is how many accounts of a checkpoint not yet stored (its
// header not written) are in checkpoint_accounts: a cut writing its
// pages.
func (w *dbWatch) staged() int64 {
	return w.count("SELECT count(*) FROM checkpoint_accounts WHERE seq > (SELECT coalesce(max(seq), 0) FROM checkpoints)")
}

// freePages is the database's free pages (PRAGMA freelist_count), which
// an incremental vacuum step lowers.
func (w *dbWatch) freePages() int64 { return w.count("PRAGMA freelist_count") }

// TestCrashMidReclaim kills serve with SIGKILL while it gives freed
// space back to the filesystem (incremental vacuum steps after a
// retention pass removed most of the file), at seeded random points:
// the file passes SQLite's integrity check, the audit passes, and the
// next pass reclaims again. (No gateways: their writes would take the
// freed pages before the vacuum could give them back.)
func TestCrashMidReclaim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs several server processes")
	}
	bin := buildBinary(t)
	rng := crashRand(t)
	dir := t.TempDir()
	// The tombstone horizon as short as the window: what retention
	// removes leaves no tombstone, so most of the file comes free.
	flags := []string{"--retention", "1s", "--tombstone-retention", "1s", "--retention-interval", "50ms", "--compaction", "0"}
	srv := startServer(t, bin, dir, flags...)
	mustPost(t, srv.url, "PublishPolicy", crashPolicy)
	// Holds that expire within a second, on a route of their own.
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"brief","holdTtl":"1s",
	  "dimensions":[{"unit":"tokens","burst":"1000000000"}]}}`)
	watch := watchDB(t, dir)
	for round := range 3 {
		reserveInBatches(t, srv.url, 10_000, func(i int) string {
			return fmt.Sprintf(`{"reservationId":"brief-%d-%d","subject":"br-%d","route":"brief","units":{"tokens":1}}`, round, i, i%50)
		})
		// The holds expire over a few seconds, and after each retention
		// pass that removed some the vacuum gives their pages back: the
		// file shrinks a step at a time. Kill after a random number of
		// steps, a random moment after the last.
		// A later round's holds partly fit in pages an earlier one freed,
		// so fewer may come free than steps would take (and the store
		// keeps a reserve of free pages): once the file has shrunk and
		// then not for 2 s, 40 retention intervals, the vacuum is done,
		// and the kill lands after it. The wait is long because 10,000
		// holds expire and are removed through the one committer: at a
		// load of 28 on 2 cores round 1 once took over 45 s to shrink at all.
		steps := 1 + rng.IntN(4)
		last, seen, shrunkAt := watch.pages(), 0, time.Time{}
		if !pollUntil(3*time.Minute, func() bool {
			if n := watch.pages(); n > 0 && n < last {
				seen++
				last, shrunkAt = n, time.Now()
			} else if n > last {
				last = n
			}
			return seen >= steps || seen > 0 && time.Since(shrunkAt) > 2*time.Second
		}) {
			t.Fatalf("round %d: the file did not shrink %d times (%d pages)", round, steps, last)
		}
		time.Sleep(time.Duration(rng.IntN(5_000)) * time.Microsecond)
		kill9(t, srv)
		watch.checkIntegrity(t)
		t.Logf("round %d: killed after the file shrank %d times (of %d drawn), to %d pages; %d pages, %d free now", round, seen, steps, last, watch.pages(), watch.freePages())

		srv = startServer(t, bin, dir, flags...)
		auditProcess(t, bin, srv.url)
		auditProcess(t, bin, srv.url, "--since-checkpoint")
		if t.Failed() {
			t.FailNow()
		}
	}
	stopGracefully(t, srv)
	watch.checkIntegrity(t)
}

// pages is the database's size in pages (PRAGMA page_count), which an
// incremental vacuum step lowers.
func (w *dbWatch) pages() int64 { return w.count("PRAGMA page_count") }

// checkIntegrity fails the test unless SQLite's integrity check of the
// database, read as the kill left it (the WAL included), passes.
func (w *dbWatch) checkIntegrity(t *testing.T) {
	t.Helper()
	var verdict string
	if err := w.db.QueryRow("PRAGMA integrity_check").Scan(&verdict); err != nil || verdict != "ok" {
		t.Fatalf("integrity check after the kill: %q %v", verdict, err)
	}
}

// reserveInBatches admits n reservations, item(i) the JSON of the i-th,
// in ReserveBatches of 1,000, and fails the test unless every one was
// admitted.
func reserveInBatches(t *testing.T, url string, n int, item func(i int) string) {
	t.Helper()
	for from := 0; from < n; from += 1000 {
		var items []string
		for i := from; i < min(from+1000, n); i++ {
			items = append(items, item(i))
		}
		checkOutcomes(t, mustPost(t, url, "ReserveBatch", `{"requests":[`+strings.Join(items, ",")+`]}`), "reserve")
	}
}
