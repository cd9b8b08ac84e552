package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// TestDemoClientsWaitOutRetryAfterOn503: while the ledger is down the
// gateway answers 503 with Retry-After; a demo client waits it out (as
// after a 429) instead of sending again at once, and counts the answer
// as failed.
func TestDemoClientsWaitOutRetryAfterOn503(t *testing.T) {
	var requests atomic.Int64
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"capacity ledger unavailable"}`, http.StatusServiceUnavailable)
	}))
	defer gateway.Close()
	tenant := &demoTenant{name: "acme", key: "key-acme", clients: 1, weight: "3"}
	wait := 300 * time.Millisecond
	start := time.Now()
	tenant.send(context.Background(), gateway.Client(), gateway.URL, start.Add(wait))
	// A lower bound only: the client sleeps until the demo's end (shorter
	// than the Retry-After) before it may send again.
	if elapsed := time.Since(start); elapsed < wait-10*time.Millisecond {
		t.Fatalf("send returned %v after a 503 with Retry-After: 1, before the demo's end %v", elapsed, wait)
	}
	if tenant.failed != 1 || requests.Load() != 1 {
		t.Fatalf("failed %d after %d requests, want 1 and 1", tenant.failed, requests.Load())
	}
}

// TestDemoReportShowsFailedRequests: answers other than 200 and 429 (a
// 503 while the ledger is down, a broken stream) are part of "what
// happened": the report has a column for them.
func TestDemoReportShowsFailedRequests(t *testing.T) {
	rep := &demoReport{duration: time.Second, tenants: []*demoTenant{
		{name: "acme", weight: "3", clients: 8, ok: 5, failed: 7},
	}}
	var out strings.Builder
	rep.print(&out, newFakeLLM(1, 0, 1), 0, 0)
	lines := strings.Split(out.String(), "\n")
	var header, row []string
	for i, line := range lines {
		if strings.Contains(line, "tenant") && i+1 < len(lines) {
			header, row = strings.Fields(line), strings.Fields(lines[i+1])
			break
		}
	}
	if len(header) < 6 || header[5] != "failed" || len(row) < 6 || row[5] != "7" {
		t.Fatalf("report has no failed column with 7:\n%s", out.String())
	}
}

// TestGatewayKeepsServingAfterAFailedDemoReport: "The gateway keeps
// serving after the demo" also when the report cannot be read (here the
// ledger refuses the audit, as one with a full disk or down does): the
// error is logged and the gateway still answers.
func TestGatewayKeepsServingAfterAFailedDemoReport(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, engine.Options{Logger: quiet})
	ledgerLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ledger := server.New(eng, server.Config{Logger: quiet}).Handler()
	refuseAudit := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "Audit") {
			http.Error(w, "audit refused by the test", http.StatusForbidden)
			return
		}
		ledger.ServeHTTP(w, r)
	})
	ledgerSrv := server.HTTPServer(refuseAudit, quiet)
	go ledgerSrv.Serve(ledgerLn)
	t.Cleanup(func() { ledgerSrv.Close(); eng.Close(); st.Close() })

	logs := &syncBuffer{}
	log.SetOutput(logs)
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	ops, _, err := openOperations(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "http://"+ledgerLn.Addr().String(), "", "127.0.0.1:0", 4, true, 100*time.Millisecond, ops, nil)
	}()
	// Wait for the demo to end (its failure is logged), or for run to
	// return (the failure this test is about).
	for !strings.Contains(logs.String(), "demo:") {
		select {
		case err := <-done:
			t.Fatalf("run returned after the demo: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	gatewayURL := regexp.MustCompile(`gateway on (http://[0-9.:]+)`).FindStringSubmatch(logs.String())
	if gatewayURL == nil {
		t.Fatalf("no gateway address logged:\n%s", logs.String())
	}
	resp, err := http.Get(gatewayURL[1] + "/healthz")
	if err != nil {
		t.Fatalf("gateway stopped serving after the failed demo: %v", err)
	}
	resp.Body.Close()
	if !strings.Contains(logs.String(), "audit") {
		t.Errorf("the demo's failure is not logged:\n%s", logs.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after Ctrl-C: %v", err)
	}
}

// syncBuffer is a bytes.Buffer the logger and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
