package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/opstatus"
)

// The console's browser tests: a real `capledger serve` on a real socket,
// real traffic through the JSON API (a 429, a debt, a USAGE_UNKNOWN, a
// shard), and headless Chromium loading every page of /ui. Each page's
// numbers are compared with what the API answers the same token, the
// browser's console must stay free of errors and exceptions, and a
// screenshot of every page is saved (CAPLEDGER_TEST_ARTIFACTS, or a
// directory under the system's temp dir; never in the tree).
//
// Without a Chromium binary the tests skip, unless CAPLEDGER_TEST_BROWSER=1
// (set by .ci/run) turns the skip into a failure.
//
// They run in parallel: each has its own in-process server (data dir,
// port), Chromium profile and screenshot directory, and most of their time
// is spent waiting on the browser and on epochs to end.

const (
	consoleAdminToken  = "console-admin-token-0001"
	consoleViewerToken = "console-viewer-token-0001"
	consoleScopedToken = "console-scoped-token-0001"
)

// chromiumPath returns the browser to drive, or skips (fails under
// CAPLEDGER_TEST_BROWSER=1) when there is none. A CAPLEDGER_CHROMIUM that
// names no binary fails: falling back to the system's Chromium would test
// another browser than the one asked for, silently.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if c := os.Getenv("CAPLEDGER_CHROMIUM"); c != "" {
		p, err := exec.LookPath(c)
		if err != nil {
			t.Fatalf("CAPLEDGER_CHROMIUM=%s: %v", c, err)
		}
		return p
	}
	for _, c := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	msg := "no Chromium binary (looked for chromium, chromium-browser, google-chrome, headless-shell; $CAPLEDGER_CHROMIUM names another): install it with `apt-get install chromium` to run the console's browser tests"
	if os.Getenv("CAPLEDGER_TEST_BROWSER") == "1" {
		t.Fatal(msg + " (CAPLEDGER_TEST_BROWSER=1 wants them run)")
	}
	t.Skip(msg)
	return ""
}

// artifactDir is where the screenshots go.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("CAPLEDGER_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "capledger-test-artifacts")
	}
	dir = filepath.Join(dir, "console", t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// apiCall posts req as Connect JSON to procedure ("Service/Method") with
// token (none when empty), decodes the answer into resp and returns the
// HTTP status.
func apiCall(t *testing.T, base, token, procedure string, req, resp proto.Message) int {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	hr, _ := http.NewRequest(http.MethodPost, base+"/capledger.v1."+procedure, bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	if token != "" {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	r, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s: %v", procedure, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	if r.StatusCode == http.StatusOK && resp != nil {
		if err := protojson.Unmarshal(raw, resp); err != nil {
			t.Fatalf("%s: %v: %s", procedure, err, raw)
		}
	}
	return r.StatusCode
}

// mustCall is apiCall wanting 200.
func mustCall(t *testing.T, base, token, procedure string, req, resp proto.Message) {
	t.Helper()
	if code := apiCall(t, base, token, procedure, req, resp); code != http.StatusOK {
		t.Fatalf("%s: HTTP %d", procedure, code)
	}
}

// consoleTraffic publishes four tenants' policies and makes the traffic
// the pages show: tenant-a owes debt, tenant-b got a 429 and has a
// USAGE_UNKNOWN reservation, tenant-c has an emergency shard, tenant-d has
// a rolled-back generation. Refill is
// hourly and epochs are long, so nothing changes by itself during the test.
func consoleTraffic(t *testing.T, base string) {
	t.Helper()
	publish := func(subject string, weight int64, emergency bool) uint64 {
		var resp v1.PublishPolicyResponse
		mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100, MaxOverdraft: 1000}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour), FairnessWeight: weight, EmergencyMode: emergency,
		}}, &resp)
		return resp.Policy.GetGeneration()
	}
	publish("tenant-a", 1, false)
	publish("tenant-b", 2, false)
	publish("tenant-c", 1, true)
	reserve := func(id, subject string, tokens int64) int {
		return apiCall(t, base, consoleAdminToken, "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: id, Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": tokens},
		}, &v1.ReserveResponse{})
	}
	start := func(id string) {
		mustCall(t, base, consoleAdminToken, "LedgerService/Start", &v1.StartRequest{ReservationId: id, OperationId: "op-" + id}, &v1.StartResponse{})
	}
	// tenant-a: 50 reserved, 200 used: 50 from the hold, 50 from available, 100 debt.
	if code := reserve("r-a1", "tenant-a", 50); code != http.StatusOK {
		t.Fatalf("reserve r-a1: HTTP %d", code)
	}
	start("r-a1")
	mustCall(t, base, consoleAdminToken, "LedgerService/Settle", &v1.SettleRequest{
		ReservationId: "r-a1", OperationId: "op-r-a1", ActualUnits: map[string]int64{"tokens": 200},
	}, &v1.SettleResponse{})
	// tenant-b: 80 held, then 50 does not fit (429), then 10 started and unknown.
	if code := reserve("r-b1", "tenant-b", 80); code != http.StatusOK {
		t.Fatalf("reserve r-b1: HTTP %d", code)
	}
	if code := reserve("r-b2", "tenant-b", 50); code != http.StatusTooManyRequests {
		t.Fatalf("reserve r-b2: HTTP %d, want 429", code)
	}
	if code := reserve("r-b3", "tenant-b", 10); code != http.StatusOK {
		t.Fatalf("reserve r-b3: HTTP %d", code)
	}
	start("r-b3")
	mustCall(t, base, consoleAdminToken, "LedgerService/MarkUsageUnknown", &v1.MarkUsageUnknownRequest{ReservationId: "r-b3"}, &v1.MarkUsageUnknownResponse{})
	// tenant-c: one reserve settled exactly, and a shard of 20.
	if code := reserve("r-c1", "tenant-c", 30); code != http.StatusOK {
		t.Fatalf("reserve r-c1: HTTP %d", code)
	}
	start("r-c1")
	mustCall(t, base, consoleAdminToken, "LedgerService/Settle", &v1.SettleRequest{
		ReservationId: "r-c1", OperationId: "op-r-c1", ActualUnits: map[string]int64{"tokens": 30},
	}, &v1.SettleResponse{})
	mustCall(t, base, consoleAdminToken, "ShardService/IssueShard", &v1.IssueShardRequest{
		ShardId: "shard-c1", Subject: "tenant-c", Route: "chat.generate", Units: map[string]int64{"tokens": 20},
		GatewayId: "gw-1", BootEpoch: 1, Ttl: durationpb.New(time.Hour),
	}, &v1.IssueShardResponse{})
	// tenant-d: a second generation, reserved under, then rolled back:
	// what is left on it drains to the first.
	publish("tenant-d", 1, false)
	if code := reserve("r-d1", "tenant-d", 10); code != http.StatusOK {
		t.Fatalf("reserve r-d1: HTTP %d", code)
	}
	second := publish("tenant-d", 3, false)
	if code := reserve("r-d2", "tenant-d", 5); code != http.StatusOK {
		t.Fatalf("reserve r-d2: HTTP %d", code)
	}
	mustCall(t, base, consoleAdminToken, "LedgerService/RollbackPolicy", &v1.RollbackPolicyRequest{Generation: second}, &v1.RollbackPolicyResponse{})
	// tenant-e: epochs of 2 s, a reserve in each of three: the second and
	// third close the epoch before, writing two statements.
	var pe v1.PublishPolicyResponse
	mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-e", Route: "chat.generate",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
		HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(2 * time.Second),
	}}, &pe)
	for i := range 3 {
		if i > 0 {
			time.Sleep(2100 * time.Millisecond)
		}
		if code := reserve(fmt.Sprintf("r-e%d", i+1), "tenant-e", 5); code != http.StatusOK {
			t.Fatalf("reserve r-e%d: HTTP %d", i+1, code)
		}
	}
	// A staged rollout on a route without traffic, at 25 %.
	mustCall(t, base, consoleAdminToken, "RolloutService/CreateRollout", &v1.CreateRolloutRequest{
		Name: "embed-rollout", HashBy: "route", Routes: []*v1.RolloutRoute{{Route: "embed.create"}, {Route: "embed.search"}},
	}, &v1.CreateRolloutResponse{})
	mustCall(t, base, consoleAdminToken, "RolloutService/SetRolloutShare", &v1.SetRolloutShareRequest{Name: "embed-rollout", Percent: 25}, &v1.SetRolloutShareResponse{})
	// And one that ended at 50 %: it enforces nothing.
	mustCall(t, base, consoleAdminToken, "RolloutService/CreateRollout", &v1.CreateRolloutRequest{
		Name: "rerank-rollout", HashBy: "route", Routes: []*v1.RolloutRoute{{Route: "rerank.query"}},
	}, &v1.CreateRolloutResponse{})
	mustCall(t, base, consoleAdminToken, "RolloutService/SetRolloutShare", &v1.SetRolloutShareRequest{Name: "rerank-rollout", Percent: 50}, &v1.SetRolloutShareResponse{})
	mustCall(t, base, consoleAdminToken, "RolloutService/EndRollout", &v1.EndRolloutRequest{Name: "rerank-rollout"}, &v1.EndRolloutResponse{})
	// An audit, so the overview has a last clean audit to show.
	var audit v1.AuditResponse
	mustCall(t, base, consoleAdminToken, "LedgerService/Audit", &v1.AuditRequest{}, &audit)
	if len(audit.Discrepancies) != 0 {
		t.Fatalf("audit: %v", audit.Discrepancies)
	}
}

// browser is one headless Chromium tab with its console collected.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string

	mu       sync.Mutex
	messages []chromedp.ConsoleMessage
	shots    string
}

// newBrowser starts headless Chromium with a fresh profile. Everything the
// tab does is bounded by one generous deadline (the machine may be loaded).
func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	return newBrowserWith(t, base)
}

// newBrowserWith is newBrowser with more options for Chromium (a window
// size, an environment), which take precedence.
func newBrowserWith(t *testing.T, base string, extra ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1000, 800),
	}
	opts = append(opts, extra...)
	deadline, cancelDeadline := context.WithTimeout(context.Background(), 5*time.Minute)
	alloc, cancelAlloc := chromedp.NewExecAllocator(deadline, opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	b := &browser{t: t, ctx: ctx, base: base, shots: artifactDir(t)}
	messages := chromedp.Console(ctx) // starts the browser
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.messages = append(b.messages, m)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
		cancelDeadline()
		<-done
		t.Logf("screenshots in %s", b.shots)
	})
	return b
}

func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// open shows page (a hash route such as "tenants") and waits until it has
// rendered an answer of the API; it fails when the page reported an error.
func (b *browser) open(page string) {
	b.t.Helper()
	b.unready()
	b.eval(fmt.Sprintf("location.hash = %q", "#"+page))
	b.waitRendered(page)
}

// unready clears the current page's rendered mark, so waitRendered waits
// for the next render (an action that re-renders follows).
func (b *browser) unready() {
	b.t.Helper()
	b.eval(`(() => { const m = document.getElementById("main"); if (m) m.removeAttribute("data-ready"); return ""; })()`)
}

// waitRendered waits until the page of route (a hash route) has rendered,
// and fails when it reported an error.
func (b *browser) waitRendered(route string) {
	b.t.Helper()
	sel := `main[data-route="` + route + `"][data-ready]`
	b.do(chromedp.WaitVisible(sel))
	if failed := b.eval(fmt.Sprintf(`(document.querySelector(%q) || {}).getAttribute?.("data-failed") || ""`, sel)); failed != "" {
		b.t.Fatalf("page %s failed (%s): %s", route, failed, b.eval(`document.getElementById("error").textContent`))
	}
}

// eval evaluates a JavaScript expression that yields a string.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	out, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return out
}

// text returns the text of the first element sel matches in the current
// page ("<missing>" when none does), read in one evaluation so a refresh
// of the page cannot interleave.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return b.eval(fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.textContent : "<missing>"; })()`, sel))
}

// count returns how many elements sel matches.
func (b *browser) count(sel string) int {
	b.t.Helper()
	var n int
	fmt.Sscan(b.eval(fmt.Sprintf(`String(document.querySelectorAll(%q).length)`, sel)), &n)
	return n
}

// want checks that the element sel shows exactly want.
func (b *browser) want(sel, want string) {
	b.t.Helper()
	if got := b.text(sel); got != want {
		b.t.Errorf("%s shows %q, the API says %q", sel, got, want)
	}
}

// wantEventually is want for a figure a worker may change at any time: on
// a difference it waits for the page's next refresh (every 5 s) and
// compares with a fresh answer again, a few times.
func (b *browser) wantEventually(route, sel string, want func() string) {
	b.t.Helper()
	for try := 1; ; try++ {
		w := want()
		got := b.text(sel)
		if got == w {
			return
		}
		if try == 5 {
			b.t.Errorf("%s shows %q, the API says %q", sel, got, w)
			return
		}
		b.unready()
		b.waitRendered(route)
	}
}

// screenshot saves the page as a PNG.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	b.noSidewaysScroll(name)
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// noSidewaysScroll fails if the page is wider than the window: a wide
// table scrolls inside its own box, so the header, the cards and the
// notes stay in view in a 1000 px window.
func (b *browser) noSidewaysScroll(page string) {
	b.t.Helper()
	if w := b.eval(`document.documentElement.scrollWidth > window.innerWidth ? document.documentElement.scrollWidth + " px in a " + window.innerWidth + " px window" : ""`); w != "" {
		b.t.Errorf("page %s scrolls sideways: %s", page, w)
	}
}

// setToken types token into the page's token form.
func (b *browser) setToken(token string) {
	b.t.Helper()
	b.unready()
	b.do(chromedp.SendKeys("#token", token), chromedp.Click(`#token-form button[type="submit"]`))
}

// noConsoleErrors fails for every exception, console.error / warning, and
// browser log error (a CSP violation, a failed script) the tab reported,
// except the 401s of calls made before a token was given when allow401.
func (b *browser) noConsoleErrors(allow401 bool) {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.messages {
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
			if allow401 && m.Source == "network" && strings.Contains(m.Text, "401") {
				continue
			}
			b.t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}

func fmtInt(v int64) string {
	s := fmt.Sprint(v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// fmtPct is the page's fmtPct: a percentage with one decimal, thousands
// separated.
func fmtPct(f float64) string {
	whole, frac, _ := strings.Cut(strconv.FormatFloat(100*f, 'f', 1, 64), ".")
	v, _ := strconv.ParseInt(whole, 10, 64)
	return fmtInt(v) + "." + frac + "%"
}

// plural is the page's plural with the default plural form.
func plural(n int, one string) string {
	if n == 1 {
		return one
	}
	return one + "s"
}

func writeConsoleTokens(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tokens")
	tokens := consoleAdminToken + " admin ops\n" +
		consoleViewerToken + " viewer oncall\n" +
		consoleScopedToken + " viewer tenant-a-team subjects=tenant-a\n"
	if err := os.WriteFile(path, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runningGateway serves the operation-status endpoint of docs/CLIENTS.md
// for the USAGE_UNKNOWN resolver, answering "running" for every operation,
// and returns a --resolver-config file pointing at it (a scan every 200ms).
func runningGateway(t *testing.T) string {
	t.Helper()
	return runningGatewayEvery(t, "200ms")
}

// runningGatewayEvery is runningGateway with the resolver's scan interval.
func runningGatewayEvery(t *testing.T, interval string) string {
	t.Helper()
	secret := []byte("console-test-secret-0123456789")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op := strings.TrimPrefix(r.URL.Path, "/operations/")
		rid := r.URL.Query().Get("reservationId")
		if err := opstatus.VerifyRequest(secret, r, rid, op, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		opstatus.WriteAnswer(w, r, secret, opstatus.Answer{OperationID: op, ReservationID: rid, Status: opstatus.StatusRunning})
	}))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "secret"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := `{"interval":"` + interval + `","routes":{"chat.generate":{"statusUrl":"` + srv.URL + `","secretFile":"secret"}}}`
	path := filepath.Join(dir, "resolver.json")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fmtTime is the page's fmtTime: UTC, to the second.
func fmtTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "—"
	}
	return ts.AsTime().UTC().Format("2006-01-02 15:04:05Z")
}

// TestConsoleBrowserPagesShowTheAPIsNumbers loads every page with a viewer token
// and compares what it shows with the API's answers.
func TestConsoleBrowserPagesShowTheAPIsNumbers(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t), "--resolver-config", runningGateway(t))
	consoleTraffic(t, base)
	// The resolver asks about r-b3 within a second of its marking.
	var answers v1.GetResolverAnswersResponse
	for deadline := time.Now().Add(30 * time.Second); len(answers.Answers) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the resolver recorded no answer about r-b3 in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
		mustCall(t, base, consoleViewerToken, "ConsoleService/GetResolverAnswers", &v1.GetResolverAnswersRequest{ReservationIds: []string{"r-b3"}}, &answers)
	}
	b := newBrowser(t, base)
	tok := consoleViewerToken

	// Without a token the page says what it needs, and throws nothing.
	b.do(chromedp.Navigate(base + "/ui"))
	b.do(chromedp.WaitVisible(`main[data-failed="unauthenticated"]`))
	if msg := b.text("#error"); !strings.Contains(msg, "bearer token") {
		t.Errorf("without a token the page says %q", msg)
	}
	b.setToken(tok)
	b.waitRendered("overview")
	if got := b.eval(`sessionStorage.getItem("capledger.token")`); got != tok {
		t.Errorf("sessionStorage holds %q", got)
	}

	// Overview.
	var ov v1.GetOverviewResponse
	mustCall(t, base, tok, "ConsoleService/GetOverview", &v1.GetOverviewRequest{}, &ov)
	b.want(`[data-value="ready"]`, "ready")
	b.want(`[data-value="backlog"]`, fmtInt(ov.UsageUnknownBacklog))
	if ov.UsageUnknownBacklog != 1 {
		t.Errorf("backlog %d, want 1", ov.UsageUnknownBacklog)
	}
	b.want(`[data-value="audit"]`, "clean")
	if ov.Audit.GetLastCleanAuditAt() == nil || !ov.Audit.GetPersisted() || ov.Audit.GetLastBy() != "ops" {
		t.Errorf("the overview's audit status %v, want a persisted clean audit by ops", ov.Audit)
	}
	b.want(`[data-value="audit-last"]`, fmtTime(ov.Audit.GetLastAuditAt()))
	b.want(`[data-value="audit-clean"]`, fmtTime(ov.Audit.GetLastCleanAuditAt()))
	b.want(`[data-value="audit-last-by"]`, " by "+ov.Audit.GetLastBy()+", "+strings.ReplaceAll(ov.Audit.GetLastMode(), "_", " "))
	b.want(`[data-value="audit-source"]`, "recorded in the store: the same on every replica")
	var rejected bool
	for _, d := range ov.Decisions {
		b.want(fmt.Sprintf(`tr[data-key="g%d/%s"] td[data-field="count"]`, d.PolicyGeneration, d.Outcome), fmtInt(d.Count))
		rejected = rejected || d.Outcome == "rejected"
	}
	for _, r := range ov.Rejections {
		b.want(fmt.Sprintf(`tr[data-key="%s/%s/%s"] td[data-field="count"]`, r.Dimension, r.Reason, r.Rollout), fmtInt(r.Count))
	}
	for _, c := range ov.Commands {
		b.want(fmt.Sprintf(`tr[data-key="%s/%s"] td[data-field="count"]`, c.Kind, c.Outcome), fmtInt(c.Count))
	}
	if !rejected || len(ov.Rejections) == 0 || len(ov.Commands) == 0 {
		t.Errorf("the overview misses the traffic: decisions %v, rejections %v", ov.Decisions, ov.Rejections)
	}

	// Tenants: the account in debt first, then the fullest.
	b.open("tenants")
	var st v1.ListAccountStandingsResponse
	mustCall(t, base, tok, "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{Limit: 20}, &st)
	b.want(`[data-value="matched"]`, fmtInt(st.Matched))
	// When its accounts were read: a time of this test, to the second.
	if at, err := time.Parse("2006-01-02 15:04:05Z", b.text(`[data-value="asOf"]`)); err != nil ||
		at.Before(st.AsOf.AsTime().Add(-time.Minute)) || at.After(time.Now()) {
		t.Errorf("tenants: accounts read at %q (%v), want a time near the API's asOf %v", b.text(`[data-value="asOf"]`), err, st.AsOf.AsTime())
	}
	if n := b.count(`main tbody tr`); n != len(st.Accounts) || n != 6 {
		t.Errorf("tenants shows %d rows, the API %d (want 6: tenant-d has two generations)", n, len(st.Accounts))
	}
	for i, s := range st.Accounts {
		a := s.Account
		row := fmt.Sprintf(`main tbody tr:nth-child(%d)`, i+1)
		b.want(row+` td[data-field="subject"]`, a.Subject)
		d := s.Dimensions[0]
		b.want(row+` td[data-field="available"]`, fmt.Sprintf("tokens %s/%s", fmtInt(d.Available), fmtInt(d.Burst)))
		wantDebt := "0"
		if d.Debt > 0 {
			wantDebt = "tokens " + fmtInt(d.Debt)
		}
		b.want(row+` td[data-field="debt"]`, wantDebt)
	}
	if st.Accounts[0].Account.Subject != "tenant-a" || st.Accounts[0].Dimensions[0].Debt != 100 {
		t.Errorf("first standing %v, want tenant-a owing 100", st.Accounts[0])
	}
	b.screenshot("tenants")

	// One tenant: every conservation term as GetAccount answers it.
	b.unready()
	b.do(chromedp.Click(`main tbody tr:nth-child(1) td[data-field="subject"] a`))
	b.waitRendered("tenants/tenant-a/chat.generate/global")
	var acc v1.GetAccountResponse
	mustCall(t, base, tok, "LedgerService/GetAccount", &v1.GetAccountRequest{Subject: "tenant-a", Route: "chat.generate"}, &acc)
	for _, a := range acc.Accounts {
		for _, bal := range a.Balances {
			row := fmt.Sprintf(`tr[data-key="g%d/%s"]`, a.PolicyGeneration, bal.Unit)
			for field, v := range map[string]int64{
				"opening": bal.Opening, "minted": bal.Minted, "overdraftIssued": bal.OverdraftIssued, "available": bal.Available,
				"reserved": bal.Reserved, "spent": bal.Spent, "retiredForEmergency": bal.RetiredForEmergency,
				"retiredForMove": bal.RetiredForMove, "overdraftRepaid": bal.OverdraftRepaid, "debt": bal.Debt,
				"heldElsewhere": bal.HeldElsewhere,
			} {
				b.want(row+` td[data-field="`+field+`"]`, fmtInt(v))
			}
			if got := b.text(row + ` td[data-field="conservation"]`); !strings.Contains(got, " = ") {
				t.Errorf("conservation cell %q", got)
			}
		}
	}
	// tenant-a's reservations by state, as ListSubjectReservations says.
	var res v1.ListSubjectReservationsResponse
	mustCall(t, base, tok, "ConsoleService/ListSubjectReservations", &v1.ListSubjectReservationsRequest{Subject: "tenant-a", PageSize: 20}, &res)
	checkSubjectReservations(t, b, &res)
	if len(res.Reservations) != 1 || res.Reservations[0].ReservationId != "r-a1" {
		t.Errorf("tenant-a's reservations %v, want r-a1", res.Reservations)
	}
	b.screenshot("tenant")

	// tenant-e: its balance history from the statements, its three
	// reservations, filtered by state.
	b.open("tenants/tenant-e/chat.generate/global")
	var accE v1.GetAccountResponse
	mustCall(t, base, tok, "LedgerService/GetAccount", &v1.GetAccountRequest{Subject: "tenant-e", Route: "chat.generate"}, &accE)
	gen := accE.Accounts[0].PolicyGeneration
	var sts v1.ListStatementsResponse
	listStatements := func() *v1.ListStatementsResponse {
		sts.Reset()
		mustCall(t, base, tok, "ConsoleService/ListStatements", &v1.ListStatementsRequest{Subject: "tenant-e", Route: "chat.generate", PolicyGeneration: gen, PageSize: 50}, &sts)
		return &sts
	}
	// The epoch worker may close another epoch meanwhile.
	b.wantEventually("tenants/tenant-e/chat.generate/global", fmt.Sprintf(`[data-value="statements-g%d"]`, gen), func() string {
		return fmtInt(int64(len(listStatements().Statements)))
	})
	if len(sts.Statements) < 2 {
		t.Errorf("tenant-e has %d statements, want at least 2", len(sts.Statements))
	}
	for _, st := range sts.Statements {
		for _, c := range st.Closing {
			start, _ := protojson.Marshal(st.EpochStart) // as the page has it: the API's JSON
			row := fmt.Sprintf(`tr[data-key="st/g%d/%s/%s"]`, gen, strings.Trim(string(start), `"`), c.Unit)
			if b.count(row) == 0 {
				continue // closed after the page's last refresh
			}
			b.want(row+` td[data-field="available"]`, fmtInt(c.Available))
			b.want(row+` td[data-field="reserved"]`, fmtInt(c.Reserved))
			b.want(row+` td[data-field="spent"]`, fmtInt(c.Spent))
			b.want(row+` td[data-field="epochEnd"]`, fmtTime(st.EpochEnd))
		}
	}
	b.do(chromedp.WaitVisible(`[data-chart^="tokens at each epoch close"] .uplot canvas`))
	mustCall(t, base, tok, "ConsoleService/ListSubjectReservations", &v1.ListSubjectReservationsRequest{Subject: "tenant-e", PageSize: 20}, &res)
	checkSubjectReservations(t, b, &res)
	if len(res.Reservations) != 3 || res.Reservations[0].ReservationId != "r-e3" {
		t.Errorf("tenant-e's reservations %v, want r-e3, r-e2, r-e1", res.Reservations)
	}
	b.screenshot("tenant-history")
	// Filter: only RELEASED (none) and back to RESERVED (all three).
	for _, filter := range []v1.ReservationState{v1.ReservationState_RESERVATION_STATE_RELEASED, v1.ReservationState_RESERVATION_STATE_RESERVED} {
		b.unready()
		b.eval(fmt.Sprintf(`(() => { const s = document.getElementById("state-filter"); s.value = %q; s.dispatchEvent(new Event("change")); return ""; })()`, filter.String()))
		b.waitRendered("tenants/tenant-e/chat.generate/global")
		mustCall(t, base, tok, "ConsoleService/ListSubjectReservations", &v1.ListSubjectReservationsRequest{Subject: "tenant-e", PageSize: 20, States: []v1.ReservationState{filter}}, &res)
		if n := b.count(`tr[data-key^="res/"]`); n != len(res.Reservations) {
			t.Errorf("filter %v: the page lists %d reservations, the API %d", filter, n, len(res.Reservations))
		}
		checkSubjectReservations(t, b, &res)
	}
	b.eval(`(() => { sessionStorage.removeItem("capledger.stateFilter"); return ""; })()`)

	// Backlog.
	b.open("backlog")
	var unknown v1.ListUsageUnknownResponse
	mustCall(t, base, tok, "LedgerService/ListUsageUnknown", &v1.ListUsageUnknownRequest{PageSize: 1000}, &unknown)
	b.want(`[data-value="listed"]`, fmtInt(int64(len(unknown.Reservations))))
	for _, r := range unknown.Reservations {
		b.want(`tr[data-key="`+r.ReservationId+`"] td[data-field="subject"]`, r.Subject)
		b.want(`tr[data-key="`+r.ReservationId+`"] td[data-field="held"]`, "tokens "+fmtInt(r.ReservedUnits["tokens"]))
		if age := b.text(`tr[data-key="` + r.ReservationId + `"] td[data-field="age"]`); !strings.HasSuffix(age, " s") && !strings.HasSuffix(age, " min") {
			t.Errorf("age %q", age)
		}
	}
	if len(unknown.Reservations) != 1 || unknown.Reservations[0].ReservationId != "r-b3" {
		t.Errorf("backlog %v, want r-b3", unknown.Reservations)
	}
	// The resolver's last answer: it asks again as its backoff passes, so
	// compare with a fresh answer after the page's next refresh if needed.
	answer := func() *v1.ResolverAnswer {
		var resp v1.GetResolverAnswersResponse
		mustCall(t, base, tok, "ConsoleService/GetResolverAnswers", &v1.GetResolverAnswersRequest{ReservationIds: []string{"r-b3"}}, &resp)
		if len(resp.Answers) != 1 {
			t.Fatalf("resolver answers %v", resp.Answers)
		}
		return resp.Answers[0]
	}
	b.want(`tr[data-key="r-b3"] td[data-field="answer"]`, "still running")
	b.want(`tr[data-key="r-b3"] td[data-answer="running"]`, "still running")
	// The overdue card shows the count of the resolver's last scan once
	// there was one (TestConsoleBrowserBacklogBeforeTheResolversFirstScan).
	b.wantEventually("backlog", `[data-value="overdue"]`, func() string {
		var resp v1.ListUsageUnknownResponse
		mustCall(t, base, tok, "LedgerService/ListUsageUnknown", &v1.ListUsageUnknownRequest{PageSize: 1}, &resp)
		if !resp.ResolverScanned {
			return "a scan" // never on the page: waits for the scan
		}
		return fmtInt(resp.Overdue)
	})
	b.wantEventually("backlog", `tr[data-key="r-b3"] td[data-field="attempts"]`, func() string { return fmtInt(answer().Attempts) })
	b.wantEventually("backlog", `tr[data-key="r-b3"] td[data-field="nextAt"]`, func() string { return fmtTime(answer().NextAttemptAt) })
	b.screenshot("backlog")

	// Debts.
	b.open("debts")
	var debts v1.ListDebtsResponse
	mustCall(t, base, tok, "LedgerService/ListDebts", &v1.ListDebtsRequest{PageSize: 1000}, &debts)
	b.want(`[data-value="frozen"]`, fmtInt(int64(len(debts.Accounts))))
	for _, a := range debts.Accounts {
		key := fmt.Sprintf("%s/%s@%s#%d/tokens", a.Subject, a.Route, a.Region, a.PolicyGeneration)
		b.want(`tr[data-key="`+key+`"] td[data-field="debt"]`, fmtInt(a.Balances[0].Debt))
		if at := b.text(`tr[data-key="` + key + `"] td[data-field="repaidAt"]`); !strings.HasSuffix(at, "Z") {
			t.Errorf("projected repayment %q", at)
		}
	}
	if len(debts.Accounts) != 1 {
		t.Errorf("%d debtors, want 1", len(debts.Accounts))
	}
	b.screenshot("debts")

	// Policies and generations.
	b.open("policies")
	var pols v1.ListPoliciesResponse
	mustCall(t, base, tok, "LedgerService/ListPolicies", &v1.ListPoliciesRequest{}, &pols)
	if n := b.count(`main tbody tr[data-key^="g"]`); n != len(pols.Policies) {
		t.Errorf("policies shows %d rows, the API %d", n, len(pols.Policies))
	}
	var rolledBack int
	for _, p := range pols.Policies {
		row := fmt.Sprintf(`tr[data-key="g%d"]`, p.Generation)
		b.want(row+` td[data-field="subject"]`, p.Subject)
		switch {
		case p.RolledBack:
			rolledBack++
			b.want(row+` td[data-field="state"]`, "rolled back")
			// What is left on the rolled-back generation's accounts: the
			// epoch worker may drain it meanwhile, so compare again after
			// the page's next refresh when they differ.
			b.wantEventually("policies", row+` td[data-field="drain"]`, func() string {
				var left v1.ListAccountStandingsResponse
				mustCall(t, base, tok, "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{PolicyGeneration: p.Generation, Limit: 1000}, &left)
				var sum int64
				for _, s := range left.Accounts {
					for _, bal := range s.Account.Balances {
						sum += bal.Available + bal.Reserved + bal.Debt
					}
				}
				return fmt.Sprintf("%s on %d %s", fmtInt(sum), len(left.Accounts), plural(len(left.Accounts), "account"))
			})
		case p.Active:
			b.want(row+` td[data-field="state"]`, "active")
		default:
			b.want(row+` td[data-field="state"]`, "superseded")
		}
	}
	if rolledBack != 1 {
		t.Errorf("%d rolled-back generations, want 1", rolledBack)
	}
	var ro v1.ListRolloutsResponse
	mustCall(t, base, tok, "RolloutService/ListRollouts", &v1.ListRolloutsRequest{}, &ro)
	if len(ro.Rollouts) != 2 {
		t.Fatalf("rollouts %v", ro.Rollouts)
	}
	for _, r := range ro.Rollouts {
		row := `tr[data-key="rollout/` + r.Name + `"]`
		last := r.Steps[len(r.Steps)-1]
		if r.Ended {
			b.want(row+` td[data-field="percent"]`, "ended")
			continue
		}
		b.want(row+` td[data-field="percent"]`, fmt.Sprintf("%.2f%%", r.Percent))
		b.want(row+` td[data-field="who"]`, last.Who)
		b.want(row+` td[data-field="at"]`, fmtTime(last.At))
		b.want(row+` td[data-field="version"]`, fmtInt(int64(r.Version)))
		b.want(row+` td[data-field="steps"]`, fmtInt(int64(len(r.Steps))))
		if r.Percent != 25 || last.Who != "ops" {
			t.Errorf("rollout %v, want 25%% set by ops", r)
		}
	}
	for _, p := range pols.Policies {
		if !p.RolledBack {
			continue
		}
		b.wantEventually("policies", fmt.Sprintf(`tr[data-key="drain/g%d"] td[data-field="drained"]`, p.Generation), func() string {
			var dp v1.DrainProgressResponse
			mustCall(t, base, tok, "RolloutService/DrainProgress", &v1.DrainProgressRequest{Generations: []uint64{p.Generation}}, &dp)
			if dp.Generations[0].Drained {
				return "yes"
			}
			return "no"
		})
	}
	// When the drain's accounts were read: a time of this test, to the
	// second, as the tenants page's.
	if rolledBack > 0 {
		var dp v1.DrainProgressResponse
		var gens []uint64
		for _, p := range pols.Policies {
			if p.RolledBack {
				gens = append(gens, p.Generation)
			}
		}
		mustCall(t, base, tok, "RolloutService/DrainProgress", &v1.DrainProgressRequest{Generations: gens}, &dp)
		if at, err := time.Parse("2006-01-02 15:04:05Z", b.text(`[data-value="drainAsOf"]`)); err != nil || dp.AsOf == nil ||
			at.Before(dp.AsOf.AsTime().Add(-time.Minute)) || at.After(time.Now()) {
			t.Errorf("policies: drain progress read at %q (%v), want a time near the API's asOf %v", b.text(`[data-value="drainAsOf"]`), err, dp.AsOf.AsTime())
		}
	}
	b.screenshot("policies")

	// Shards.
	b.open("shards")
	var sh v1.ListShardsResponse
	mustCall(t, base, tok, "ShardService/ListShards", &v1.ListShardsRequest{}, &sh)
	b.want(`[data-value="issued"]`, fmtInt(int64(len(sh.Shards))))
	b.want(`[data-value="live"]`, "1")
	b.want(`tr[data-key="shard-c1"] td[data-field="allocated"]`, "tokens 20")
	b.screenshot("shards")

	// Fairness.
	b.open("fairness")
	var fair v1.GetFairnessResponse
	mustCall(t, base, tok, "ConsoleService/GetFairness", &v1.GetFairnessRequest{}, &fair)
	if len(fair.Groups) != 1 || len(fair.Groups[0].Subjects) != 5 {
		t.Fatalf("fairness %v", fair.Groups)
	}
	for _, g := range fair.Groups {
		group := fmt.Sprintf(`[data-group="%s@%s/%s"]`, g.Route, g.Region, g.Unit)
		b.want(group+` [data-value="subjectCount"]`, fmtInt(g.SubjectCount))
		b.want(group+` [data-value="outsideBudget"]`, fmtInt(g.OutsideBudget))
		for _, s := range g.Subjects {
			row := fmt.Sprintf(`tr[data-key="%s@%s/%s/%s"]`, g.Route, g.Region, g.Unit, s.Subject)
			b.want(row+` td[data-field="spent"]`, fmtInt(s.Spent))
			b.want(row+` td[data-field="error"]`, fmt.Sprintf("%.3f", s.Error))
		}
	}
	if b.count(`[data-scoped="fairness"]`) != 0 {
		t.Errorf("the fairness page says a viewer's unscoped token sees shares among its tenants only")
	}
	b.screenshot("fairness")

	// The overview's rate charts (uPlot) draw from the page's own samples
	// (every 5 s): keep reserving 1 token for tenant-c (50 admitted, then
	// 429s) until the charts hold five samples.
	stop := make(chan struct{})
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			body := fmt.Sprintf(`{"reservationId":"r-c-load-%d","subject":"tenant-c","route":"chat.generate","units":{"tokens":1}}`, i)
			req, _ := http.NewRequest(http.MethodPost, base+"/capledger.v1.LedgerService/Reserve", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+consoleAdminToken)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()
	b.open("overview")
	b.do(chromedp.WaitVisible(`[data-chart="decisions/s by generation and outcome"] .uplot canvas`))
	_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`state.decisionRates.t.length >= 5`, chromedp.WithPollingTimeout(0)))
	close(stop)
	<-traffic
	if err != nil {
		t.Fatalf("waiting for the rate samples: %v", err)
	}
	b.do(chromedp.WaitVisible(`[data-chart="429/s by limiting dimension"] .uplot canvas`))
	b.screenshot("overview")
	b.noConsoleErrors(true)
}

// checkSubjectReservations compares the tenant page's reservations by
// state with the API's answer.
func checkSubjectReservations(t *testing.T, b *browser, res *v1.ListSubjectReservationsResponse) {
	t.Helper()
	var total int64
	for _, c := range res.Counts {
		total += c.Count
		state := strings.TrimPrefix(c.State.String(), "RESERVATION_STATE_")
		b.want(`tr[data-key="counts/`+c.Route+`/`+state+`"] td[data-field="count"]`, fmtInt(c.Count))
	}
	b.want(`[data-value="reservations-total"]`, fmtInt(total))
	b.want(`[data-value="retained"]`, fmtInt(res.Retained))
	for _, r := range res.Reservations {
		row := `tr[data-key="res/` + r.ReservationId + `"]`
		b.want(row+` td[data-field="state"]`, strings.TrimPrefix(r.State.String(), "RESERVATION_STATE_"))
		b.want(row+` td[data-field="created"]`, fmtTime(r.CreatedAt))
	}
}

// TestConsoleBrowserScopedTokenSeesOnlyItsTenant loads every page with a viewer
// token scoped to tenant-a: no other tenant's name or number appears.
func TestConsoleBrowserScopedTokenSeesOnlyItsTenant(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t), "--resolver-config", runningGateway(t))
	consoleTraffic(t, base)
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(consoleScopedToken)
	b.waitRendered("tenants")
	for _, page := range []string{"overview", "tenants", "tenants/tenant-a/chat.generate/global", "backlog", "debts", "policies", "shards", "fairness"} {
		b.open(page)
		body := b.eval(`document.body.innerText`)
		for _, other := range []string{"tenant-b", "tenant-c", "tenant-d", "tenant-e", "r-b3", "r-e1", "shard-c1", "embed-rollout", "rerank-rollout"} {
			if strings.Contains(body, other) {
				t.Errorf("page %s shows %q to a token scoped to tenant-a:\n%s", page, other, body)
			}
		}
		switch page {
		case "overview":
			if b.count(`[data-scoped]`) != 1 || b.count(`[data-value="backlog"]`) != 0 {
				t.Errorf("the overview shows process-wide figures to a scoped token:\n%s", body)
			}
		case "tenants":
			if n := b.count(`main tbody tr`); n != 1 || !strings.Contains(body, "tenant-a") {
				t.Errorf("tenants shows %d rows to the tenant-a token, want its one:\n%s", n, body)
			}
		case "backlog":
			if b.count(`[data-card="backlog"]`) != 0 || b.text(`[data-card="overdue"] .sub`) != "of those listed" {
				t.Errorf("the backlog page shows the store-wide figures to a scoped token:\n%s", body)
			}
		case "debts":
			b.want(`[data-value="frozen"]`, "1") // tenant-a's own debt
		case "tenants/tenant-a/chat.generate/global":
			b.want(`tr[data-key="res/r-a1"] td[data-field="state"]`, "SETTLED_WITH_DEBT")
		case "policies":
			if b.count(`[data-rollouts="scoped"]`) != 1 {
				t.Errorf("the policies page does not say why rollouts are not shown:\n%s", body)
			}
		case "fairness":
			// The shares are among tenant-a's accounts only (100 % of
			// what the group spent): the page says so.
			if b.count(`[data-scoped="fairness"]`) != 1 {
				t.Errorf("the fairness page does not say its shares are among the token's tenants only:\n%s", body)
			}
			b.want(`td[data-field="served"]`, "100.0%")
		}
		b.screenshot(strings.ReplaceAll(page, "/", "_"))
	}
	b.noConsoleErrors(true)
}

// TestConsoleBrowserWithoutAuth: zero-config serve has auth off, and the console
// works without a token.
func TestConsoleBrowserWithoutAuth(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/"))
	b.waitRendered("overview")
	b.want(`[data-value="ready"]`, "ready")
	b.want(`[data-value="backlog"]`, "0")
	b.open("tenants")
	b.want(`[data-value="matched"]`, "0")
	// An empty backlog is still the whole backlog's figures (zeros, which
	// the API leaves out). Without --resolver-config there are no
	// deadlines: the page says so instead of "0 past unknownDeadline".
	b.open("backlog")
	b.want(`[data-value="backlog"]`, "0")
	b.want(`[data-value="overdue"]`, "—")
	b.want(`[data-card="overdue"] .sub`, "this server runs no resolver (serve --resolver-config), so no deadline")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserKeepsTheQuery: a link to the bare /ui with a query
// string (and a page after #) opens the console with both, through the
// real redirect to /ui/ over a real socket: the query is not dropped.
func TestConsoleBrowserKeepsTheQuery(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui?x=1&who=tenant%207#tenants"))
	b.waitRendered("tenants")
	if got := b.eval(`location.pathname + location.search + location.hash`); got != "/ui/?x=1&who=tenant%207#tenants" {
		t.Errorf("/ui?x=1&who=tenant%%207#tenants opened %s, want /ui/?x=1&who=tenant%%207#tenants", got)
	}
	b.noConsoleErrors(false)
}

// TestConsoleBrowserBacklogBeforeTheResolversFirstScan: with
// --resolver-config the overdue count is known only after the resolver's
// first complete scan (the API's resolverScanned, the metric left out
// until then); before it the card says "not scanned yet", not 0. The
// resolver here scans every hour, so not during the test.
func TestConsoleBrowserBacklogBeforeTheResolversFirstScan(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t), "--resolver-config", runningGatewayEvery(t, "1h"))
	consoleTraffic(t, base)
	var unknown v1.ListUsageUnknownResponse
	mustCall(t, base, consoleViewerToken, "LedgerService/ListUsageUnknown", &v1.ListUsageUnknownRequest{PageSize: 1000}, &unknown)
	if !unknown.ResolverConfigured || unknown.ResolverScanned || len(unknown.Reservations) == 0 {
		t.Fatalf("ListUsageUnknown: configured %v, scanned %v, %d reservations: want a configured, unscanned resolver and a backlog",
			unknown.ResolverConfigured, unknown.ResolverScanned, len(unknown.Reservations))
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#backlog"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(consoleViewerToken)
	b.waitRendered("backlog")
	b.want(`[data-value="listed"]`, fmtInt(int64(len(unknown.Reservations))))
	b.want(`[data-value="overdue"]`, "not scanned yet")
	b.want(`[data-card="overdue"] .sub`, "this replica's resolver has no complete scan of the backlog since it took the worker lease (only the lease holder scans, every --resolver-config interval)")
	b.screenshot("backlog_unscanned")
	b.noConsoleErrors(true)
}

// TestConsoleBrowserServerUnreachable: the page reaches the server through a
// proxy the test stops and starts again on the same port. While the server
// is out of reach the page says so, keeps the last data it read (marked
// with when), and shows fresh data again on a refresh once it answers.
func TestConsoleBrowserServerUnreachable(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	target, err := url.Parse(startInProcess(t))
	if err != nil {
		t.Fatal(err)
	}
	base := target.String()
	mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-a", Route: "chat.generate",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
		HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
	}}, &v1.PublishPolicyResponse{})
	mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: "r-a1", Subject: "tenant-a", Route: "chat.generate", Units: map[string]int64{"tokens": 30}}, &v1.ReserveResponse{})
	proxy := httputil.NewSingleHostReverseProxy(target)
	// serveProxy serves the proxy on addr and returns the server and the
	// address it listens on.
	serveProxy := func(addr string) (*http.Server, string) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: proxy}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return srv, ln.Addr().String()
	}
	front, addr := serveProxy("127.0.0.1:0")
	b := newBrowser(t, "http://"+addr)
	b.do(chromedp.Navigate("http://" + addr + "/ui/#tenants"))
	b.waitRendered("tenants")
	row := `tr[data-key="tenant-a/chat.generate@global#1"] td[data-field="available"]`
	b.want(row, "tokens 70/100")

	// waitFor waits for sel for a few refreshes, not the tab's whole deadline.
	waitFor := func(sel string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.WaitVisible(sel)); err != nil {
			t.Fatalf("%s in 30 s: %v; the page shows:\n%s", sel, err, b.eval(`document.body.innerText`))
		}
	}
	front.Close() // closes the listener and every connection: the server is gone
	waitFor(`main[data-route="tenants"][data-failed="unreachable"]`)
	if msg := b.text("#error"); !strings.HasPrefix(msg, "Cannot reach the server") || !strings.Contains(msg, "What is shown was read at ") {
		t.Errorf("with the server gone the page says %q", msg)
	}
	b.want(row, "tokens 70/100") // the last data read, not a blank page
	// What a token read is not kept after "Forget", server or no server.
	b.unready()
	b.eval(`(() => { document.getElementById("token-forget").click(); return ""; })()`)
	waitFor(`main[data-route="tenants"][data-ready]`)
	if n := b.count(row); n != 0 {
		t.Errorf("after Forget the page still shows what the token read: %s", b.eval(`document.body.innerText`))
	}

	mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: "r-a2", Subject: "tenant-a", Route: "chat.generate", Units: map[string]int64{"tokens": 20}}, &v1.ReserveResponse{})
	serveProxy(addr)
	waitFor(`main[data-route="tenants"][data-ready]:not([data-failed])`)
	b.want(row, "tokens 50/100")
	if hidden := b.eval(`String(document.getElementById("error").hidden)`); hidden != "true" {
		t.Errorf("the server answers again, and the page still says %q", b.text("#error"))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.messages { // refused connections are logged; exceptions are bugs
		if m.Type == chromedp.ConsoleException {
			t.Errorf("browser console: %s", m)
		}
	}
}

// TestConsoleBrowserRoutesScopedSubjectPages: a viewer token limited to
// route chat.generate (routes=) on a subject whose embed.batch route holds
// 1,400 reservations between its two chat.generate ones. The server reads
// a bounded number of rows per call, so the first page follows the tokens
// for 8 calls and still ends short, with a token: it shows the newest
// chat.generate reservation, "older" reads on to the other, and "newer"
// comes back.
func TestConsoleBrowserRoutesScopedSubjectPages(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	const routesToken = "console-routes-token-0001"
	path := filepath.Join(t.TempDir(), "tokens")
	file := consoleAdminToken + " admin ops\n" + routesToken + " viewer chat-team subjects=tenant-f routes=chat.generate\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startInProcess(t, "--tokens", path)
	for _, route := range []string{"chat.generate", "embed.batch"} {
		mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: "tenant-f", Route: route,
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100000}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &v1.PublishPolicyResponse{})
	}
	reserve := func(id string) {
		mustCall(t, base, consoleAdminToken, "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: id, Subject: "tenant-f", Route: "chat.generate", Units: map[string]int64{"tokens": 1},
		}, &v1.ReserveResponse{})
	}
	reserve("chat-0")
	for first := 0; first < 1400; first += 700 {
		var batch v1.ReserveBatchRequest
		for i := first; i < first+700; i++ {
			batch.Requests = append(batch.Requests, &v1.ReserveRequest{
				ReservationId: fmt.Sprintf("e-%04d", i), Subject: "tenant-f", Route: "embed.batch", Units: map[string]int64{"tokens": 1},
			})
		}
		var out v1.ReserveBatchResponse
		mustCall(t, base, consoleAdminToken, "LedgerService/ReserveBatch", &batch, &out)
		for i, o := range out.Outcomes {
			if o.GetError() != nil {
				t.Fatalf("reserve e-%04d: %v", first+i, o.GetError())
			}
		}
	}
	reserve("chat-1")
	// The API's first page for this token is short and has a token.
	var res v1.ListSubjectReservationsResponse
	mustCall(t, base, routesToken, "ConsoleService/ListSubjectReservations", &v1.ListSubjectReservationsRequest{Subject: "tenant-f", PageSize: 20}, &res)
	if len(res.Reservations) != 1 || res.NextPageToken == "" {
		t.Fatalf("the first call shows %d reservations, token %q: want chat-1 and a token", len(res.Reservations), res.NextPageToken)
	}

	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(routesToken)
	b.waitRendered("tenants")
	const page = "tenants/tenant-f/chat.generate/global"
	b.open(page)
	shows := func(want string, older bool, pageNo string) {
		t.Helper()
		if n := b.count(`tr[data-key^="res/"]`); n != 1 || b.count(`tr[data-key="res/`+want+`"]`) != 1 {
			t.Errorf("page %s lists %d reservations, want %s: %s", pageNo, n, want, b.eval(`document.body.innerText`))
		}
		if disabled := b.eval(`String(document.getElementById("res-older").disabled)`); disabled != fmt.Sprint(!older) {
			t.Errorf("page %s: older disabled %s, want %v", pageNo, disabled, !older)
		}
		b.want(`[data-value="res-page"]`, pageNo)
	}
	shows("chat-1", true, "1")
	b.screenshot("routes-scoped-subject")
	click := func(id string) {
		t.Helper()
		b.unready()
		b.eval(`(() => { document.getElementById("` + id + `").click(); return ""; })()`)
		b.waitRendered(page)
	}
	click("res-older")
	shows("chat-0", false, "2")
	if body := b.eval(`document.body.innerText`); regexp.MustCompile(`\be-[0-9]{4}\b`).MatchString(body) || strings.Contains(body, "embed.batch") {
		t.Errorf("the page shows an embed.batch reservation to a routes=chat.generate token:\n%s", body)
	}
	click("res-newer")
	shows("chat-1", true, "1")
	b.noConsoleErrors(true)
}

// TestConsoleBrowserDebtRepaidBeyondRefillHorizon: a debt refill repays only
// after more than ~292 years has no repaidAt in the API (the server's
// longest wait), like a debt without a refill rule. The Debts and Tenants
// pages tell the two apart from the refill rule instead of claiming there
// is none.
func TestConsoleBrowserDebtRepaidBeyondRefillHorizon(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	publish := func(subject string, refill int64) uint64 {
		dim := &v1.Dimension{Unit: "tokens", Burst: 100, MaxOverdraft: 1 << 40}
		if refill > 0 {
			dim.RefillUnits, dim.RefillInterval = refill, durationpb.New(time.Hour)
		}
		var resp v1.PublishPolicyResponse
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate", Dimensions: []*v1.Dimension{dim},
			HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &resp)
		return resp.Policy.GetGeneration()
	}
	owe := func(subject string, actual int64) {
		id := "r-" + subject
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: id, Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": 10}}, &v1.ReserveResponse{})
		mustCall(t, base, "", "LedgerService/Start", &v1.StartRequest{ReservationId: id, OperationId: "op-" + id}, &v1.StartResponse{})
		mustCall(t, base, "", "LedgerService/Settle", &v1.SettleRequest{ReservationId: id, OperationId: "op-" + id, ActualUnits: map[string]int64{"tokens": actual}}, &v1.SettleResponse{})
	}
	// 1 token an hour repays 10^9 in about 114,000 years.
	hugeGen := publish("tenant-huge", 1)
	owe("tenant-huge", 1_000_000_000)
	bareGen := publish("tenant-norefill", 0)
	owe("tenant-norefill", 150)
	var st v1.ListAccountStandingsResponse
	mustCall(t, base, "", "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{InDebt: true}, &st)
	if len(st.Accounts) != 2 {
		t.Fatalf("standings in debt: %v, want tenant-huge and tenant-norefill", st.Accounts)
	}
	for _, s := range st.Accounts {
		if d := s.Dimensions[0]; d.Debt == 0 || d.RepaidAt != nil {
			t.Fatalf("%s: debt %d repaidAt %v, want a debt without repaidAt", s.Account.Subject, d.Debt, d.RepaidAt)
		}
	}

	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#debts"))
	b.waitRendered("debts")
	b.want(fmt.Sprintf(`tr[data-key="tenant-huge/chat.generate@global#%d/tokens"] td[data-field="repaidAt"]`, hugeGen), "more than 292 years off")
	b.want(fmt.Sprintf(`tr[data-key="tenant-norefill/chat.generate@global#%d/tokens"] td[data-field="repaidAt"]`, bareGen), "no refill rule")
	b.open("tenants")
	b.want(fmt.Sprintf(`tr[data-key="tenant-huge/chat.generate@global#%d"] td[data-field="repaid"]`, hugeGen), "tokens more than 292 years off")
	b.want(fmt.Sprintf(`tr[data-key="tenant-norefill/chat.generate@global#%d"] td[data-field="repaid"]`, bareGen), "tokens no refill rule")
	// A used fraction of ten million (debt of 10^5 bursts) is thousands
	// separated, as every other number on the page.
	for _, s := range st.Accounts {
		if s.Account.Subject == "tenant-huge" {
			b.want(fmt.Sprintf(`tr[data-key="tenant-huge/chat.generate@global#%d"] td[data-field="used"]`, hugeGen), fmtPct(s.UsedFraction))
			if got := fmtPct(s.UsedFraction); got != "1,000,000,000.0%" {
				t.Errorf("tenant-huge's used fraction %v formats as %q, want 1,000,000,000.0%%", s.UsedFraction, got)
			}
		}
	}
	b.noConsoleErrors(false)
}

// TestConsoleBrowserUnusualNames: subjects are any UTF-8 text a client
// sends. One full of HTML is shown as text, never parsed, and a 400-byte
// one wraps in its cells and headings instead of widening the page.
func TestConsoleBrowserUnusualNames(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	const markup = `<img src=x onerror="window.injected=1">&amp;"'</td>`
	long := strings.Repeat("L", 400) + "-tenant"
	for _, subject := range []string{markup, long, "tenant-a"} {
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &v1.PublishPolicyResponse{})
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: "r-" + fmt.Sprint(len(subject)), Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": 10},
		}, &v1.ReserveResponse{})
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.waitRendered("tenants")
	injected := func(page string) {
		t.Helper()
		if n := b.count(`main img`); n != 0 || b.eval(`String(window.injected)`) != "undefined" {
			t.Errorf("page %s: the subject's markup was parsed (%d img elements, window.injected %s)", page, n, b.eval(`String(window.injected)`))
		}
	}
	// fits: no heading is wider than its box, the long subject's cell is
	// narrower than the window, and a short subject's cell stays one line.
	fits := func(page string) {
		t.Helper()
		if over := b.eval(`[...document.querySelectorAll("main h1, main h2, main h3")].filter((h) => h.scrollWidth > h.clientWidth).map((h) => h.textContent.slice(0, 40)).join(" | ")`); over != "" {
			t.Errorf("page %s: headings wider than the page: %s", page, over)
		}
		if w := b.eval(`String(Math.max(0, ...[...document.querySelectorAll('td[data-field="subject"]')].filter((c) => c.textContent.startsWith("LLLL")).map((c) => c.offsetWidth)))`); w == "0" || len(w) > 3 {
			t.Errorf("page %s: the long subject's cell is %s px wide in a 1000 px window", page, w)
		}
	}
	injected("tenants")
	fits("tenants")
	key := fmt.Sprintf(`tr[data-key=%q]`, markup+"/chat.generate@global#1")
	b.want(key+` td[data-field="subject"]`, markup)
	if h := b.eval(`(() => { const c = document.querySelector('tr[data-key="tenant-a/chat.generate@global#3"] td'); return String(c.offsetHeight <= 2 * parseFloat(getComputedStyle(c).lineHeight)); })()`); h != "true" {
		t.Errorf("tenant-a's subject cell wraps: %s", b.eval(`document.querySelector('tr[data-key="tenant-a/chat.generate@global#3"] td').offsetHeight + ""`))
	}
	b.open("tenants/" + url.PathEscape(markup) + "/chat.generate/global")
	injected("markup tenant")
	b.want(`[data-value="subject"]`, markup)
	b.open("tenants/" + long + "/chat.generate/global")
	fits("long tenant")
	b.screenshot("long-tenant")
	for _, page := range []string{"policies", "fairness"} {
		b.open(page)
		injected(page)
		if !strings.Contains(b.eval(`document.querySelector("main").textContent`), markup) {
			t.Errorf("page %s does not show the subject %q as text", page, markup)
		}
	}
	b.noConsoleErrors(false)
}

// TestConsoleBrowserRateChartsCoverAtMost15Minutes: the overview's rate
// charts keep the samples of the last 15 minutes, however seldom the page
// sampled (a background tab's timers fire far less often than every 5 s).
// The test shifts the serverTime of the page's GetOverview answers, the
// clock its samples are taken by, 20 minutes ahead between two refreshes.
func TestConsoleBrowserRateChartsCoverAtMost15Minutes(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/"))
	b.waitRendered("overview")
	b.eval(`(() => {
		window.serverTimeShift = 0;
		const fetchOrig = window.fetch;
		window.fetch = async (url, init) => {
			const resp = await fetchOrig(url, init);
			if (!String(url).endsWith("/GetOverview") || !window.serverTimeShift) return resp;
			const body = await resp.json();
			body.serverTime = new Date(new Date(body.serverTime).getTime() + window.serverTimeShift).toISOString();
			return new Response(JSON.stringify(body), { status: resp.status, headers: resp.headers });
		};
		return "";
	})()`)
	samples := func() string { return b.eval(`state.decisionRates.t.join(",")`) }
	b.unready()
	b.waitRendered("overview") // the first refresh takes the first sample
	if n := strings.Count(samples(), ",") + 1; samples() == "" || n != 1 {
		t.Fatalf("after one refresh the chart has samples %q, want one", samples())
	}
	b.eval(`window.serverTimeShift = 20 * 60 * 1000, ""`)
	b.unready()
	b.waitRendered("overview")
	var first, last float64
	got := samples()
	fmt.Sscanf(got[:strings.IndexByte(got+",", ',')], "%g", &first)
	fmt.Sscanf(got[strings.LastIndexByte(got, ',')+1:], "%g", &last)
	if last-first > 15*60 {
		t.Errorf("the rate chart's samples %q span %.0f s, more than 15 minutes", got, last-first)
	}
	b.noConsoleErrors(false)
}

// TestConsoleBrowserTenantAmongSimilarSubjects: the tenant page of t1
// shows t1's standing although 1110 other subjects contain "t1" (t10 ..
// t1999) and all stand nearer their limit, so a search by subjectContains
// with the largest limit (1000) leaves t1 out. The page asks for the
// subject exactly.
func TestConsoleBrowserTenantAmongSimilarSubjects(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	var pub v1.PublishPolicyResponse
	mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "*", Route: "chat.generate", HoldTtl: durationpb.New(time.Hour),
		Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: 100, RefillUnits: 10, RefillInterval: durationpb.New(time.Hour)}},
	}}, &pub)
	gen := pub.Policy.GetGeneration()
	reserve := func(subject string, tokens int64) *v1.ReserveRequest {
		return &v1.ReserveRequest{ReservationId: "r-" + subject, Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": tokens}}
	}
	mustCall(t, base, "", "LedgerService/Reserve", reserve("t1", 1), &v1.ReserveResponse{})
	// t10 .. t19, t100 .. t199, t1000 .. t1999: 1110 subjects containing
	// "t1", each nearer its limit than t1.
	var similar []string
	for i := 10; i < 2000; i++ {
		if subject := fmt.Sprintf("t%d", i); strings.HasPrefix(subject, "t1") {
			similar = append(similar, subject)
		}
	}
	for from := 0; from < len(similar); from += 500 {
		batch := &v1.ReserveBatchRequest{}
		for _, subject := range similar[from:min(from+500, len(similar))] {
			batch.Requests = append(batch.Requests, reserve(subject, 2))
		}
		var resp v1.ReserveBatchResponse
		mustCall(t, base, "", "LedgerService/ReserveBatch", batch, &resp)
		for i, out := range resp.Outcomes {
			if out.GetOk() == nil {
				t.Fatalf("batch item %d: %v", i, out)
			}
		}
	}
	var contains v1.ListAccountStandingsResponse
	mustCall(t, base, "", "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{SubjectContains: "t1", Route: "chat.generate", Region: "global", Limit: 1000}, &contains)
	for _, s := range contains.Accounts {
		if s.Account.Subject == "t1" {
			t.Fatalf("subjectContains t1 lists t1 among its first 1000 of %d: the case this test is for is gone", contains.Matched)
		}
	}
	var exact v1.ListAccountStandingsResponse
	mustCall(t, base, "", "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{Subject: "t1", Route: "chat.generate", Region: "global"}, &exact)
	if len(exact.Accounts) != 1 {
		t.Fatalf("the exact standing of t1: %v", exact.Accounts)
	}
	want := exact.Accounts[0]

	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants/t1/chat.generate/global"))
	b.waitRendered("tenants/t1/chat.generate/global")
	row := fmt.Sprintf(`tr[data-key="t1/chat.generate@global#%d"]`, gen)
	b.want(row+` td[data-field="subject"]`, "t1")
	b.want(row+` td[data-field="used"]`, fmtPct(want.UsedFraction))
	d := want.Dimensions[0]
	b.want(row+` td[data-field="available"]`, fmt.Sprintf("tokens %s/%s", fmtInt(d.Available), fmtInt(d.Burst)))
	if n := b.count(`tr[data-key^="t1"]`); n != 1 {
		t.Errorf("the tenant page of t1 shows %d standing rows, want t1's one", n)
	}
	b.screenshot("tenant-among-similar")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserKeyboardAndToken: an operator on the keyboard. Enter in
// the tenant search shows its result at once (not when the box loses
// focus); the focus stays on the control it was on (the state filter, a
// tenant's link) across the 5 s refresh; a tenant whose subject holds
// "/", "#", "%" and spaces is reached by its link, back / forward and a
// reload keep the page; and a token the server does not know is called
// refused, not missing.
func TestConsoleBrowserKeyboardAndToken(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t))
	const odd = "org/42 team#1 100%"
	for i, subject := range []string{"tenant-a", "tenant-b", odd} {
		mustCall(t, base, consoleAdminToken, "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100, MaxOverdraft: 1000}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &v1.PublishPolicyResponse{})
		mustCall(t, base, consoleAdminToken, "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: fmt.Sprintf("r-%d", i), Subject: subject, Route: "chat.generate", Units: map[string]int64{"tokens": 10},
		}, &v1.ReserveResponse{})
	}
	// tenant-a's reservation is USAGE_UNKNOWN, the odd subject owes debt.
	for _, id := range []string{"r-0", "r-2"} {
		mustCall(t, base, consoleAdminToken, "LedgerService/Start", &v1.StartRequest{ReservationId: id, OperationId: "op-" + id}, &v1.StartResponse{})
	}
	mustCall(t, base, consoleAdminToken, "LedgerService/MarkUsageUnknown", &v1.MarkUsageUnknownRequest{ReservationId: "r-0"}, &v1.MarkUsageUnknownResponse{})
	mustCall(t, base, consoleAdminToken, "LedgerService/Settle", &v1.SettleRequest{
		ReservationId: "r-2", OperationId: "op-r-2", ActualUnits: map[string]int64{"tokens": 150},
	}, &v1.SettleResponse{})
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.want("#error", "This server wants a bearer token (missing bearer token: send `Authorization: Bearer <token>`): type one above.")
	b.setToken("not-a-token-of-this-server")
	b.do(chromedp.WaitVisible(`main[data-failed][data-ready]`))
	if got := b.text("#error"); !strings.HasPrefix(got, "The server refused this tab's token (") {
		t.Errorf("with an unknown token the page says %q, want that the server refused the token", got)
	}
	b.screenshot("unknown-token")
	b.unready()
	b.do(chromedp.Click("#token-forget"), chromedp.WaitVisible(`main[data-failed][data-ready]`))
	// The token, typed and sent with Enter.
	b.unready()
	b.do(chromedp.SendKeys("#token", consoleViewerToken+"\r"))
	b.waitRendered("tenants")
	if got := b.eval(`sessionStorage.getItem("capledger.token") + " " + document.getElementById("token").value`); got != consoleViewerToken+" " {
		t.Errorf("after Enter in the token box: sessionStorage and the box hold %q, want the token and an empty box", got)
	}
	if n := b.count(`main tbody tr`); n != 3 {
		t.Fatalf("tenants shows %d rows, want 3", n)
	}

	// Enter in the search box: the result shows at once, the focus and
	// the typed text stay in the box.
	b.do(chromedp.SendKeys("#search-subject", "tenant-b\r"))
	// Two refreshes' time: the page used to keep the old result for as
	// long as the box had the focus.
	for deadline := time.Now().Add(12 * time.Second); b.count(`main tbody tr`) != 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("12 s after Enter in the search box the page shows %d rows, want tenant-b's 1", b.count(`main tbody tr`))
		}
	}
	b.want(`[data-value="matched"]`, "1")
	if got := b.eval(`document.activeElement.id + "=" + document.activeElement.value`); got != "search-subject=tenant-b" {
		t.Errorf("after Enter the focus is on %q, want the search box with tenant-b", got)
	}
	// focusAfterRefresh focuses sel, waits for the page's next refresh and
	// returns what has the focus then.
	focusAfterRefresh := func(route, sel string) string {
		t.Helper()
		b.eval(fmt.Sprintf(`(document.querySelector(%q).focus(), "")`, sel))
		b.unready()
		b.waitRendered(route)
		return b.eval(`(() => { const a = document.activeElement; return a.tagName + "#" + a.id + (a.getAttribute("href") || ""); })()`)
	}
	b.unready()
	b.eval(`(document.getElementById("search-subject").value = "", document.getElementById("search").requestSubmit(), "")`)
	b.waitRendered("tenants")
	if got := focusAfterRefresh("tenants", `a.subject[href*="org"]`); !strings.HasPrefix(got, "A#") || !strings.Contains(got, "org") {
		t.Errorf("after a refresh the focus is on %q, want the link of %q it was on", got, odd)
	}

	// The odd subject's link, Enter on it, its page; back, forward, reload.
	b.unready()
	b.do(chromedp.KeyEvent("\r"))
	route := b.eval(`location.hash.slice(1)`)
	b.waitRendered(route)
	b.want(`[data-value="subject"]`, odd)
	if got := focusAfterRefresh(route, "#state-filter"); got != "SELECT#state-filter" {
		t.Errorf("after a refresh the focus is on %q, want the state filter it was on", got)
	}
	b.unready()
	b.do(chromedp.NavigateBack())
	b.waitRendered("tenants")
	b.unready()
	b.do(chromedp.NavigateForward())
	b.waitRendered(route)
	b.want(`[data-value="subject"]`, odd)
	b.unready()
	b.do(chromedp.Reload())
	b.waitRendered(route)
	b.want(`[data-value="subject"]`, odd)
	b.want("#token-state", "token set (this tab)")
	b.screenshot("odd-tenant")

	// The Debts and Backlog pages link each subject to its tenant page.
	for _, c := range []struct{ page, subject string }{{"debts", odd}, {"backlog", "tenant-a"}} {
		b.open(c.page)
		if n := b.count(`td[data-field="subject"] a`); n != 1 {
			t.Errorf("the %s page links %d subjects to their tenant page, want %q's", c.page, n, c.subject)
			continue
		}
		b.unready()
		b.do(chromedp.Click(`td[data-field="subject"] a`))
		want := "tenants/" + strings.ReplaceAll(url.PathEscape(c.subject), "/", "%2F") + "/chat.generate/global"
		b.waitRendered(want)
		b.want(`[data-value="subject"]`, c.subject)
	}
	b.noConsoleErrors(true)
}

// TestConsoleBrowserRunAudit: the overview's "Run audit (admin)" button.
// With a viewer token the refusal says an admin token is needed and stays
// in the audit card across refreshes (the page's error box was cleared by
// the next refresh, within 5 s); with an admin token the audit runs, the
// card shows it as the last audit by that token, and its discrepancies
// (none) show on the overview and the shards page.
func TestConsoleBrowserRunAudit(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t, "--tokens", writeConsoleTokens(t))
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/"))
	b.do(chromedp.WaitVisible(`main[data-failed]`))
	b.setToken(consoleViewerToken)
	b.waitRendered("overview")
	b.want(`[data-value="audit"]`, "not run")
	b.unready()
	b.do(chromedp.Click("#run-audit"))
	b.waitRendered("overview")
	const refused = "Not run: running the audit needs an admin token (/capledger.v1.LedgerService/Audit is not open to the viewer role (token \"oncall\"))."
	b.want(`[data-value="audit-error"]`, refused)
	b.unready()
	b.waitRendered("overview") // the next refresh
	b.want(`[data-value="audit-error"]`, refused)
	b.want(`[data-value="audit"]`, "not run")
	b.screenshot("audit-refused")

	b.unready()
	b.do(chromedp.Click("#token-forget"), chromedp.WaitVisible(`main[data-failed][data-ready]`))
	b.setToken(consoleAdminToken)
	b.waitRendered("overview")
	if n := b.count(`[data-value="audit-error"]`); n != 0 {
		t.Errorf("a new token still shows the refusal of the old one's audit")
	}
	b.unready()
	b.do(chromedp.Click("#run-audit"))
	b.waitRendered("overview")
	var ov v1.GetOverviewResponse
	mustCall(t, base, consoleAdminToken, "ConsoleService/GetOverview", &v1.GetOverviewRequest{}, &ov)
	b.want(`[data-value="audit"]`, "clean")
	b.want(`[data-value="audit-last"]`, fmtTime(ov.Audit.GetLastAuditAt()))
	b.want(`[data-value="audit-last-by"]`, " by ops, full")
	b.want(`[data-audit] [data-empty]`, "None: the ledger is sound.")
	if n := b.count(`[data-value="audit-error"]`); n != 0 {
		t.Errorf("the audit ran and the card still shows a refusal")
	}
	b.screenshot("audit-run")
	b.open("shards")
	b.want(`[data-audit] [data-empty]`, "None: the ledger is sound.")
	// The 401 before the token and the viewer's 403 are the browser's
	// network log; anything else is an error of the page.
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range b.messages {
		switch m.Type {
		case chromedp.ConsoleError, chromedp.ConsoleWarning, chromedp.ConsoleException:
			if m.Source == "network" && (strings.Contains(m.Text, "401") || strings.Contains(m.Text, "403") && strings.HasSuffix(m.URL, ".LedgerService/Audit")) {
				continue
			}
			t.Errorf("browser console: %s (%s:%d)", m, m.URL, m.Line)
		}
	}
}

// TestConsoleBrowserChartsInUTC: in a browser whose zone is Asia/Kolkata
// (UTC+05:30) the charts' time axes are labelled in UTC, as every other
// time on the page: the tenant's balance history and the overview's rate
// charts.
func TestConsoleBrowserChartsInUTC(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	var pe v1.PublishPolicyResponse
	mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-e", Route: "chat.generate",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
		HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(2 * time.Second),
	}}, &pe)
	reserve := func(id string) {
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: id, Subject: "tenant-e", Route: "chat.generate", Units: map[string]int64{"tokens": 1},
		}, &v1.ReserveResponse{})
	}
	reserve("r-e1")
	time.Sleep(2100 * time.Millisecond)
	reserve("r-e2") // closes the first epoch: a statement, two points on the chart
	b := newBrowserWith(t, base, chromedp.Env("TZ=Asia/Kolkata"))
	b.do(chromedp.Navigate(base + "/ui/#tenants/tenant-e/chat.generate/global"))
	b.waitRendered("tenants/tenant-e/chat.generate/global")
	if off := b.eval(`String(new Date(0).getTimezoneOffset())`); off != "-330" {
		t.Fatalf("the browser's zone is %s minutes off UTC, want -330 (Asia/Kolkata)", off)
	}
	// labels returns the time axis's tick positions (s) and labels as
	// drawn by the chart whose title starts with prefix.
	labels := func(prefix string) (splits []float64, values []string) {
		t.Helper()
		sel := fmt.Sprintf(`[data-chart^=%q]`, prefix)
		b.do(chromedp.WaitVisible(sel + ` .uplot canvas`))
		raw := b.eval(fmt.Sprintf(`(() => {
			const u = document.querySelector(%q).uplot, ax = u.axes[0];
			return JSON.stringify([ax._splits, ax._values, ax.label, u.series[0].value(u, ax._splits[0])]);
		})()`, sel))
		var got []json.RawMessage
		var label, legend string
		if err := json.Unmarshal([]byte(raw), &got); err != nil || len(got) != 4 {
			t.Fatalf("chart %s axis %s: %v", prefix, raw, err)
		}
		if json.Unmarshal(got[0], &splits) != nil || json.Unmarshal(got[1], &values) != nil || json.Unmarshal(got[2], &label) != nil ||
			json.Unmarshal(got[3], &legend) != nil || len(splits) == 0 || len(splits) != len(values) {
			t.Fatalf("chart %s axis %s", prefix, raw)
		}
		if label != "time (UTC)" {
			t.Errorf("chart %s: time axis labelled %q, want time (UTC)", prefix, label)
		}
		// The legend under the cursor writes the time as fmtTime does.
		if want := time.Unix(0, int64(splits[0]*1e9)).UTC().Format("2006-01-02 15:04:05Z"); legend != want {
			t.Errorf("chart %s: the legend's time of the first tick is %q, want %q", prefix, legend, want)
		}
		return splits, values
	}
	check := func(prefix string) {
		t.Helper()
		splits, values := labels(prefix)
		for i, split := range splits {
			at := time.Unix(0, int64(split*1e9)).UTC()
			if v := values[i]; v != at.Format("15:04:05") && v != at.Format("15:04") && v != at.Format("2006-01-02") {
				t.Errorf("chart %s: the tick at %s is labelled %q, not in UTC", prefix, at.Format(time.RFC3339), v)
			}
		}
	}
	check("tokens at each epoch close")
	b.screenshot("tenant")
	// The overview's rates: a sample per refresh (5 s), two make a line.
	b.open("overview")
	for i := range 3 {
		reserve(fmt.Sprintf("r-load-%d", i))
		b.unready()
		b.waitRendered("overview")
	}
	check("decisions/s by generation and outcome")
	b.screenshot("overview")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserRolloutModeAgrees: a generation on a route that a
// staged rollout holds shows the same mode on the Policies and the Tenants
// pages: the one its reserves get now, with its own beside it where they
// differ; a "*" generation whose route a rollout hashes by subject shows
// that each subject has its own, and its rollout's routes are enforced
// for the rollout's share of subjects, not for every request.
func TestConsoleBrowserRolloutModeAgrees(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	publish := func(subject, route string, mode v1.RolloutMode) uint64 {
		var resp v1.PublishPolicyResponse
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: route, Rollout: mode,
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
			HoldTtl:    durationpb.New(time.Hour),
		}}, &resp)
		return resp.Policy.GetGeneration()
	}
	reserve := func(id, subject, route string) {
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{
			ReservationId: id, Subject: subject, Route: route, Units: map[string]int64{"tokens": 1},
		}, &v1.ReserveResponse{})
	}
	held := publish("tenant-r", "embed.create", v1.RolloutMode_ROLLOUT_MODE_ENFORCE)
	free := publish("tenant-s", "chat.generate", v1.RolloutMode_ROLLOUT_MODE_SHADOW)
	wild := publish("*", "embed.search", v1.RolloutMode_ROLLOUT_MODE_ENFORCE)
	reserve("r-r1", "tenant-r", "embed.create")
	reserve("r-s1", "tenant-s", "chat.generate")
	reserve("r-t1", "tenant-t", "embed.search")
	mustCall(t, base, "", "RolloutService/CreateRollout", &v1.CreateRolloutRequest{
		Name: "embed-create", HashBy: "route", Routes: []*v1.RolloutRoute{{Route: "embed.create"}},
	}, &v1.CreateRolloutResponse{})
	mustCall(t, base, "", "RolloutService/CreateRollout", &v1.CreateRolloutRequest{
		Name: "embed-search", HashBy: "subject", Routes: []*v1.RolloutRoute{{Route: "embed.search"}},
	}, &v1.CreateRolloutResponse{})
	mustCall(t, base, "", "RolloutService/SetRolloutShare", &v1.SetRolloutShareRequest{Name: "embed-search", Percent: 25}, &v1.SetRolloutShareResponse{})
	// tenant-t's own mode under embed-search at 25 %, as the reserve path
	// decides it.
	var st v1.ListAccountStandingsResponse
	mustCall(t, base, "", "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{Subject: "tenant-t", Limit: 10}, &st)
	if len(st.Accounts) != 1 {
		t.Fatalf("tenant-t's standings %v", st.Accounts)
	}
	tenantT := "shadow (rollout; own enforce)"
	if st.Accounts[0].Rollout == v1.RolloutMode_ROLLOUT_MODE_ENFORCE {
		tenantT = "enforce"
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#policies"))
	b.waitRendered("policies")
	// both checks the mode the Policies page shows for generation gen and
	// the one the Tenants page shows for subject's account of it.
	both := func(gen uint64, subject, route, policies, tenants string) {
		t.Helper()
		b.open("policies")
		b.want(fmt.Sprintf(`tr[data-key="g%d"] td[data-field="mode"]`, gen), policies)
		b.open("tenants/" + subject + "/" + route + "/global")
		b.want(fmt.Sprintf(`[data-mode="g%d"]`, gen), tenants)
	}
	both(held, "tenant-r", "embed.create", "shadow (rollout; own enforce)", "shadow (rollout; own enforce)")
	both(free, "tenant-s", "chat.generate", "shadow", "shadow")
	both(wild, "tenant-t", "embed.search", "per subject (a rollout hashes them), own enforce", tenantT)
	b.open("policies")
	// The rollouts' routes with their mode now: a route hashed by subject
	// is enforced for the rollout's share of subjects only (the API's
	// "enforce" is that share's mode), not for every request.
	b.want(`tr[data-key="rollout/embed-search"] td[data-field="routes"]`, "embed.search@global enforce for 25.00% of subjects")
	b.want(`tr[data-key="rollout/embed-create"] td[data-field="routes"]`, "embed.create@global shadow")
	b.screenshot("policies")
	mustCall(t, base, "", "RolloutService/SetRolloutShare", &v1.SetRolloutShareRequest{Name: "embed-create", Percent: 100}, &v1.SetRolloutShareResponse{})
	both(held, "tenant-r", "embed.create", "enforce", "enforce")
	mustCall(t, base, "", "RolloutService/EndRollout", &v1.EndRolloutRequest{Name: "embed-search"}, &v1.EndRolloutResponse{})
	both(wild, "tenant-t", "embed.search", "enforce", "enforce")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserTableScrollHint: in an 800 px window a table wider
// than the page fades at the edge beyond which more columns lie (right
// first, left once scrolled to the end), and a table that fits does not;
// a refresh keeps a table scrolled sideways where it was; widened to
// 2400 px, the wide table fits and its hint goes. Counts agree with their
// nouns ("1 account matches").
func TestConsoleBrowserTableScrollHint(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-a", Route: "chat.generate",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 10, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
		HoldTtl:    durationpb.New(time.Hour),
	}}, &v1.PublishPolicyResponse{})
	mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{
		ReservationId: "r-a1", Subject: "tenant-a", Route: "chat.generate", Units: map[string]int64{"tokens": 1},
	}, &v1.ReserveResponse{})
	b := newBrowserWith(t, base, chromedp.WindowSize(800, 800))
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.waitRendered("tenants")
	// The note goes on with when the ranking's accounts were read
	// (TestConsoleBrowserPagesShowTheAPIsNumbers checks that time).
	if got, want := b.text(`main p.note`), "Nearest their limit first (accounts in debt before all others; generations that no longer decide after the active ones): 1 account matches, showing 1; accounts read at "; !strings.HasPrefix(got, want) {
		t.Errorf("main p.note shows %q, want it to begin %q", got, want)
	}
	for v, want := range map[string]string{"0": "accounts", "1": "account", "2": "accounts", "1000": "accounts"} {
		if got := b.eval(`plural(` + v + `, "account")`); got != want {
			t.Errorf("plural(%s, account) = %q, want %q", v, got, want)
		}
	}
	if got := b.eval(`plural("1", "batch", "batches") + " " + plural(3, "batch", "batches")`); got != "batch batches" {
		t.Errorf("plural of batch: %q", got)
	}
	// hint returns the table box's data-more and whether its right and
	// left edges are faded (the pseudo-elements' opacity), read at once.
	hint := func(sel string) string {
		t.Helper()
		return b.eval(fmt.Sprintf(`(() => {
			const box = document.querySelector(%q).closest(".table-box");
			const shown = (pseudo) => getComputedStyle(box, pseudo).opacity === "1" ? "faded" : "clear";
			return (box.getAttribute("data-more") || "none") + " / right " + shown("::after") + " / left " + shown("::before");
		})()`, sel))
	}
	wide := `tr[data-key="g1/tokens"]` // the account's conservation terms: 12 columns
	b.open("tenants/tenant-a/chat.generate/global")
	if got := hint(wide); got != "right / right faded / left clear" {
		t.Errorf("the conservation table in 800 px: %s, want a fade on the right", got)
	}
	narrow := `tr[data-key^="counts/"]` // reservations by state: 3 columns
	if got := hint(narrow); got != "none / right clear / left clear" {
		t.Errorf("the reservation counts in 800 px: %s, want no fade", got)
	}
	b.screenshot("tenant-800px")
	scrolled := b.eval(fmt.Sprintf(`(() => {
		const wrap = document.querySelector(%q).closest(".table-wrap");
		wrap.scrollLeft = wrap.scrollWidth;
		wrap.dispatchEvent(new Event("scroll"));
		const box = wrap.parentElement;
		return (box.getAttribute("data-more") || "none") + " / right " + getComputedStyle(box, "::after").opacity + " / left " + getComputedStyle(box, "::before").opacity;
	})()`, wide))
	if scrolled != "left / right 0 / left 1" {
		t.Errorf("the conservation table scrolled to its end: %s, want a fade on the left only", scrolled)
	}
	// The page's next refresh (every 5 s) redraws the table: it stays
	// scrolled where the operator left it.
	b.unready()
	b.waitRendered("tenants/tenant-a/chat.generate/global")
	if got := b.eval(fmt.Sprintf(`(() => { const wrap = document.querySelector(%q).closest(".table-wrap");
		return wrap.scrollLeft > 0 && wrap.scrollLeft + wrap.clientWidth >= wrap.scrollWidth - 1 ? "at the end" : "at " + wrap.scrollLeft + " of " + wrap.scrollWidth; })()`, wide)); got != "at the end" {
		t.Errorf("after a refresh the conservation table is scrolled %s, want at the end where it was", got)
	}
	if got := hint(wide); got != "left / right clear / left faded" {
		t.Errorf("after a refresh the conservation table's hint: %s, want a fade on the left only", got)
	}
	b.do(chromedp.EmulateViewport(2400, 800))
	b.unready()
	b.waitRendered("tenants/tenant-a/chat.generate/global")
	if got := hint(wide); got != "none / right clear / left clear" {
		t.Errorf("the conservation table in 2400 px: %s, want no fade", got)
	}
	b.noConsoleErrors(false)
}

// TestConsoleBrowserDrainedGenerationNotShownFull: a superseded generation
// emptied by a republish (its capacity moved to the new generation) is
// shown "drained" on the Tenants page, after the active accounts, not as
// a full tenant at 100.0% used; its used fraction stays in the tooltip.
func TestConsoleBrowserDrainedGenerationNotShownFull(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	publish := func(subject string, burst int64) uint64 {
		var resp v1.PublishPolicyResponse
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 1, RefillInterval: durationpb.New(time.Hour), Burst: burst}},
			HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &resp)
		return resp.Policy.Generation
	}
	reserve := func(id, subject string, tokens int64) {
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: id, Subject: subject, Route: "chat.generate",
			Units: map[string]int64{"tokens": tokens}}, &v1.ReserveResponse{})
	}
	old := publish("tenant-x", 100)
	publish("tenant-y", 100)
	reserve("y1", "tenant-y", 50)
	reserve("x1", "tenant-x", 10)
	mustCall(t, base, "", "LedgerService/Release", &v1.ReleaseRequest{ReservationId: "x1"}, &v1.ReleaseResponse{})
	publish("tenant-x", 200)
	reserve("x2", "tenant-x", 10) // the new generation's account takes the old one's 100
	var st v1.ListAccountStandingsResponse
	mustCall(t, base, "", "ConsoleService/ListAccountStandings", &v1.ListAccountStandingsRequest{Limit: 20}, &st)
	if n := len(st.Accounts); n != 3 || st.Accounts[2].Account.PolicyGeneration != old || st.Accounts[2].UsedFraction != 1 {
		t.Fatalf("standings %v, want tenant-x's emptied generation %d last with used 1", st.Accounts, old)
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#tenants"))
	b.waitRendered("tenants")
	row := fmt.Sprintf(`tr[data-key="tenant-x/chat.generate@global#%d"]`, old)
	b.want(`main tbody tr:nth-child(3) td[data-field="subject"]`, "tenant-x")
	b.want(row+` td[data-field="used"]`, "drained")
	b.want(row+` td[data-field="state"]`, "superseded, drained, enforce")
	if got := b.eval(fmt.Sprintf(`document.querySelector(%q).title`, row+` td[data-field="used"] span`)); got != "100.0% used; its generation admits nothing" {
		t.Errorf("the drained generation's used tooltip is %s", got)
	}
	if n := b.count(`main tbody td[data-field="used"] .bar`); n != 2 {
		t.Errorf("%d used bars, want 2 (the active accounts only)", n)
	}
	b.screenshot("tenants_drained")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserBacklogAnswersInWords: the resolver's answer about a
// reservation on a route without an operation-status endpoint is shown
// in words on the Backlog page, its code (no_endpoint) in the tooltip.
func TestConsoleBrowserBacklogAnswersInWords(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	// The resolver knows chat.generate's endpoint only.
	base := startInProcess(t, "--resolver-config", runningGateway(t))
	mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
		Subject: "tenant-z", Route: "batch.embed",
		Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 1, RefillInterval: durationpb.New(time.Hour), Burst: 100}},
		HoldTtl:    durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
	}}, &v1.PublishPolicyResponse{})
	mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: "r-z1", Subject: "tenant-z", Route: "batch.embed",
		Units: map[string]int64{"tokens": 10}}, &v1.ReserveResponse{})
	mustCall(t, base, "", "LedgerService/Start", &v1.StartRequest{ReservationId: "r-z1", OperationId: "op-z1"}, &v1.StartResponse{})
	mustCall(t, base, "", "LedgerService/MarkUsageUnknown", &v1.MarkUsageUnknownRequest{ReservationId: "r-z1"}, &v1.MarkUsageUnknownResponse{})
	var answers v1.GetResolverAnswersResponse
	for deadline := time.Now().Add(30 * time.Second); len(answers.Answers) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the resolver recorded no answer about r-z1 in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
		mustCall(t, base, "", "ConsoleService/GetResolverAnswers", &v1.GetResolverAnswersRequest{ReservationIds: []string{"r-z1"}}, &answers)
	}
	if a := answers.Answers[0]; a.Answer != "no_endpoint" {
		t.Fatalf("the resolver's answer %v, want no_endpoint", a)
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#backlog"))
	b.waitRendered("backlog")
	cell := `tr[data-key="r-z1"] td[data-field="answer"]`
	b.want(cell, "no operation-status endpoint configured for the route")
	if got := b.eval(fmt.Sprintf(`document.querySelector(%q).title`, cell)); got != "resolver answer: no_endpoint" {
		t.Errorf("the answer's tooltip is %s, want the code", got)
	}
	if strings.Contains(b.text("main"), "no_endpoint") {
		t.Errorf("the backlog page shows the raw code no_endpoint: %q", b.text("main"))
	}
	b.screenshot("backlog_no_endpoint")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserRejectionReasonsInWords: the Overview's rejections
// table names the three 429 reasons in words, each code in its cell's
// tooltip, and shows no raw code.
func TestConsoleBrowserRejectionReasonsInWords(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	for _, subject := range []string{"tenant-full", "tenant-large", "tenant-debt"} {
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", RefillUnits: 1, RefillInterval: durationpb.New(time.Hour), Burst: 100,
				MaxReservation: 60, MaxOverdraft: 1000}},
			HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &v1.PublishPolicyResponse{})
	}
	reserve := func(id, subject string, tokens int64, want int) {
		t.Helper()
		if code := apiCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: id, Subject: subject, Route: "chat.generate",
			Units: map[string]int64{"tokens": tokens}}, &v1.ReserveResponse{}); code != want {
			t.Fatalf("reserve %s: HTTP %d, want %d", id, code, want)
		}
	}
	reserve("f1", "tenant-full", 60, http.StatusOK)
	reserve("f2", "tenant-full", 50, http.StatusTooManyRequests)  // INSUFFICIENT_CAPACITY
	reserve("l1", "tenant-large", 61, http.StatusTooManyRequests) // RESERVATION_TOO_LARGE
	reserve("d1", "tenant-debt", 10, http.StatusOK)
	mustCall(t, base, "", "LedgerService/Start", &v1.StartRequest{ReservationId: "d1", OperationId: "op-d1"}, &v1.StartResponse{})
	mustCall(t, base, "", "LedgerService/Settle", &v1.SettleRequest{ReservationId: "d1", OperationId: "op-d1",
		ActualUnits: map[string]int64{"tokens": 300}}, &v1.SettleResponse{})
	reserve("d2", "tenant-debt", 1, http.StatusTooManyRequests) // ADMISSION_FROZEN

	var ov v1.GetOverviewResponse
	mustCall(t, base, "", "ConsoleService/GetOverview", &v1.GetOverviewRequest{}, &ov)
	words := map[string]string{
		"INSUFFICIENT_CAPACITY": "not enough capacity",
		"ADMISSION_FROZEN":      "frozen by debt",
		"RESERVATION_TOO_LARGE": "estimate too large to ever fit",
	}
	seen := map[string]bool{}
	for _, r := range ov.Rejections {
		seen[r.Reason] = true
	}
	if len(seen) != len(words) {
		t.Fatalf("the overview's rejections %v, want one of each of %v", ov.Rejections, words)
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#overview"))
	b.waitRendered("overview")
	for _, r := range ov.Rejections {
		cell := fmt.Sprintf(`tr[data-key="%s/%s/%s"] td[data-field="reason"]`, r.Dimension, r.Reason, r.Rollout)
		b.want(cell, words[r.Reason])
		if got := b.eval(fmt.Sprintf(`document.querySelector(%q).title`, cell)); got != "reason: "+r.Reason {
			t.Errorf("the tooltip of %s's reason is %s, want the code", r.Reason, got)
		}
	}
	main := b.text("main")
	for code := range words {
		if strings.Contains(main, code) {
			t.Errorf("the overview shows the raw code %s: %q", code, main)
		}
	}
	b.screenshot("overview_rejection_reasons")
	b.noConsoleErrors(false)
}

// TestConsoleBrowserDrainShowsADroppedUnit: a rolled-back generation whose
// successor dropped one of its units keeps that unit's capacity, which no
// drain moves; the Policies page's drain panel says so in its blocked
// cell, as DrainProgress's blockedDroppedUnit counts it, instead of "—".
func TestConsoleBrowserDrainShowsADroppedUnit(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	base := startInProcess(t)
	publish := func(units ...string) uint64 {
		var dims []*v1.Dimension
		for _, u := range units {
			dims = append(dims, &v1.Dimension{Unit: u, RefillUnits: 1, RefillInterval: durationpb.New(time.Hour), Burst: 100})
		}
		var resp v1.PublishPolicyResponse
		mustCall(t, base, "", "LedgerService/PublishPolicy", &v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: "tenant-x", Route: "chat.generate", Dimensions: dims,
			HoldTtl: durationpb.New(time.Hour), EpochLength: durationpb.New(8760 * time.Hour),
		}}, &resp)
		return resp.Policy.Generation
	}
	reserve := func(id string, units map[string]int64) {
		mustCall(t, base, "", "LedgerService/Reserve", &v1.ReserveRequest{ReservationId: id, Subject: "tenant-x", Route: "chat.generate",
			Units: units}, &v1.ReserveResponse{})
		mustCall(t, base, "", "LedgerService/Release", &v1.ReleaseRequest{ReservationId: id}, &v1.ReleaseResponse{})
	}
	old := publish("tokens", "requests")
	reserve("x1", map[string]int64{"tokens": 10, "requests": 1})
	publish("tokens")
	reserve("x2", map[string]int64{"tokens": 10}) // switches tenant-x to the generation without requests
	mustCall(t, base, "", "RolloutService/RollbackGenerations", &v1.RollbackGenerationsRequest{Generations: []uint64{old}}, &v1.RollbackGenerationsResponse{})
	var dp v1.DrainProgressResponse
	mustCall(t, base, "", "RolloutService/DrainProgress", &v1.DrainProgressRequest{Generations: []uint64{old}, RunDrains: true}, &dp)
	if g := dp.Generations[0]; g.BlockedDroppedUnit != 1 || g.Available["requests"] != 100 {
		t.Fatalf("drain progress %v, want 100 requests held by 1 account blocked by the dropped unit", g)
	}
	b := newBrowser(t, base)
	b.do(chromedp.Navigate(base + "/ui/#policies"))
	b.waitRendered("policies")
	b.want(fmt.Sprintf(`tr[data-key="drain/g%d"] td[data-field="blocked"]`, old), "0 at burst, 0 without a policy, 1 in a dropped unit")
	b.noConsoleErrors(false)
}
