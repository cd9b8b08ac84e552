package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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
