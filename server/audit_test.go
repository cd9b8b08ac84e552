package server_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store"
	"github.com/capledger/capledger/store/memstore"
)

// streamAudit runs StreamAudit over the harness's real HTTP server with
// token and returns the events received and the stream's error.
func (h *harness) streamAudit(token string, since bool) ([]*v1.AuditEvent, error) {
	h.t.Helper()
	client := capledgerv1connect.NewAuditServiceClient(http.DefaultClient, h.url)
	req := connect.NewRequest(&v1.StreamAuditRequest{SinceCheckpoint: since})
	if token != "" {
		req.Header().Set("Authorization", "Bearer "+token)
	}
	stream, err := client.StreamAudit(context.Background(), req)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var events []*v1.AuditEvent
	for stream.Receive() {
		events = append(events, stream.Msg())
	}
	return events, stream.Err()
}

// StreamAudit is admin-only like Audit (the auth interceptor checks
// streaming handlers too), and ends with the audit's result: none for a
// sound ledger, in both modes.
func TestStreamAuditRolesAndResult(t *testing.T) {
	h := newHarness(t, harnessOptions{auth: true})
	h.ok("PublishPolicy", tokensPolicy, adminToken)
	h.ok("Reserve", reserveBody("r", 10), gatewayToken)
	h.ok("Release", `{"reservationId":"r"}`, gatewayToken)
	for token, code := range map[string]connect.Code{"": connect.CodeUnauthenticated, "wrong-token-0123456789": connect.CodeUnauthenticated,
		gatewayToken: connect.CodePermissionDenied} {
		if events, err := h.streamAudit(token, false); connect.CodeOf(err) != code || len(events) > 0 {
			t.Errorf("token %q: %d events, %v; want %s", token, len(events), err, code)
		}
	}
	for _, since := range []bool{false, true} {
		events, err := h.streamAudit(adminToken, since)
		if err != nil || len(events) == 0 {
			t.Fatalf("admin (since checkpoint %v): %d events, %v", since, len(events), err)
		}
		last := events[len(events)-1].GetResult()
		if last == nil || len(last.GetDiscrepancies()) > 0 || last.GetCheckedAt() == nil {
			t.Fatalf("admin (since checkpoint %v): last event %v", since, events[len(events)-1])
		}
	}
}

// stallingAuditor is a real engine whose audit reports progress once and
// then goes quiet until released: a long phase (reading a million
// accounts, checking statements) that reports nothing.
type stallingAuditor struct {
	*engine.Engine
	release chan struct{}
	// releaseGates holds the read of the accounts in debt that the
	// result's gauges make after the audit (seconds on a million
	// accounts).
	releaseGates chan struct{}
}

func (s stallingAuditor) AccountsInDebt(ctx context.Context, f store.DebtFilter, keep func(ledger.AccountKey) bool) ([]ledger.Account, engine.ShownWith, ledger.AccountKey, bool, error) {
	select {
	case <-s.releaseGates:
	case <-ctx.Done():
		return nil, engine.ShownWith{}, ledger.AccountKey{}, false, ctx.Err()
	}
	return s.Engine.AccountsInDebt(ctx, f, keep)
}

func (s stallingAuditor) AuditWith(ctx context.Context, o engine.AuditOptions) ([]ledger.Discrepancy, error) {
	o.Progress(engine.AuditProgress{Rows: 7, Estimate: 100, Fraction: 0.07})
	select {
	case <-s.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Engine.AuditWith(ctx, engine.AuditOptions{SinceCheckpoint: o.SinceCheckpoint})
}

// While the audit reports nothing, StreamAudit still sends progress about
// every second (the latest figures again), so a client that waits a
// bounded time for the next message (capledger audit --timeout, 10 s by
// default) does not give up on a long audit.
func TestStreamAuditSendsProgressWhileTheAuditIsQuiet(t *testing.T) {
	eng := engine.New(memstore.New(), engine.Options{DisableWorkers: true})
	t.Cleanup(func() { eng.Close() })
	quiet := stallingAuditor{Engine: eng, release: make(chan struct{}), releaseGates: make(chan struct{})}
	url, _ := serveFront(t, server.New(quiet, server.Config{Metrics: server.NewMetrics(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := capledgerv1connect.NewAuditServiceClient(http.DefaultClient, url)
	stream, err := client.StreamAudit(ctx, connect.NewRequest(&v1.StreamAuditRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	progress := 0
	for stream.Receive() {
		if p := stream.Msg().GetProgress(); p != nil {
			if p.GetRows() != 7 || p.GetEstimate() != 100 {
				t.Fatalf("progress %v, want the last figures reported (7 of 100)", p)
			}
			switch progress++; progress {
			case 3: // the audit proper ends; its result's gauges stall
				close(quiet.release)
			case 5:
				close(quiet.releaseGates)
			}
			continue
		}
		if progress < 5 || stream.Msg().GetResult() == nil {
			t.Fatalf("after %d progress events: %v", progress, stream.Msg())
		}
		return
	}
	t.Fatalf("the stream ended after %d progress events without a result: %v (before the fix the server sent one, then nothing until the audit ended)", progress, stream.Err())
}

// After a clean audit /metrics has capledger_audit_discrepancies at 0 for
// every check docs/API.md's Audit table names (API.md, Metrics: "every
// check at 0 after a clean audit"), so an alert on any of them has a
// series before it first fires.
func TestCleanAuditShowsEveryDocumentedCheckAtZero(t *testing.T) {
	raw, err := os.ReadFile("../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "| `check` | finds |")
	if start < 0 {
		t.Fatal("API.md has no Audit check table")
	}
	_, table, _ := strings.Cut(doc[start:], "\n") // the rows after the header
	table, _, _ = strings.Cut(table, "\n\n")
	var checks []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(table, -1) {
		checks = append(checks, m[1])
	}
	if len(checks) < 10 {
		t.Fatalf("read %d checks from API.md's Audit table: %v", len(checks), checks)
	}
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("r-1", 100), "")
	if res := h.ok("Audit", `{}`, ""); res["discrepancies"] != nil {
		t.Fatalf("audit: %v", res)
	}
	metrics := h.get("/metrics")
	for _, check := range checks {
		if line := `capledger_audit_discrepancies{check="` + check + `"} 0`; !strings.Contains(metrics, line+"\n") {
			t.Errorf("after a clean audit /metrics lacks %q", line)
		}
	}
}

// A since-checkpoint audit does not run reserved_vs_holds, spent_vs_settled
// or unrecorded_debt (they read every reservation). It set their gauges to
// 0 all the same, so a cheap audit (a cron's `capledger audit
// --since-checkpoint`) cleared what the last full audit found, and an alert
// on them (ROLLOUT.md's gates) went quiet with the ledger still wrong. The
// gauges of the checks it skips keep the last full audit's figures.
func TestSinceCheckpointAuditKeepsTheGaugesOfTheChecksItSkips(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	h.ok("PublishPolicy", tokensPolicy, "")
	h.ok("Reserve", reserveBody("kept", 100), "")
	h.ok("Reserve", reserveBody("lost", 50), "")
	// The account still holds lost's 50, but no reservation does.
	db, err := sql.Open("sqlite", h.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`DELETE FROM reservations WHERE id = 'lost'`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if res := h.ok("Audit", `{}`, ""); !strings.Contains(fmt.Sprint(res["discrepancies"]), "reserved_vs_holds") {
		t.Fatalf("full audit: %v, want reserved_vs_holds", res)
	}
	holdsGauge := regexp.MustCompile(`(?m)^capledger_audit_discrepancies\{check="reserved_vs_holds"\} .*$`)
	found := holdsGauge.FindString(h.get("/metrics"))
	if found == "" || strings.HasSuffix(found, " 0") {
		t.Fatalf("after the full audit /metrics shows %q, want reserved_vs_holds above 0", found)
	}
	events, err := h.streamAudit("", true)
	if err != nil {
		t.Fatal(err)
	}
	if result := events[len(events)-1].GetResult(); result == nil || len(result.GetDiscrepancies()) != 0 {
		t.Fatalf("since-checkpoint audit: %v, want a result without discrepancies", events)
	}
	metrics := h.get("/metrics")
	if got := holdsGauge.FindString(metrics); got != found {
		t.Errorf("a since-checkpoint audit, which does not check holds, changed the full audit's finding: /metrics shows %q, want %q", got, found)
	}
	if line := `capledger_audit_discrepancies{check="conservation"} 0`; !strings.Contains(metrics, line+"\n") {
		t.Errorf("/metrics lacks %q", line)
	}
}
