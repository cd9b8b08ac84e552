package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ledgerv1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/client"
	"github.com/capledger/capledger/engine"
	"github.com/capledger/capledger/server"
	"github.com/capledger/capledger/store/sqlite"
)

// TestDemoThroughARealLedger runs the example end to end: a real ledger
// (server + engine + SQLite, as `capledger serve` runs them) on a real
// socket, the fake LLM, the gateway, and the demo traffic.
func TestDemoThroughARealLedger(t *testing.T) {
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
	ledgerSrv := server.HTTPServer(server.New(eng, server.Config{Logger: quiet}).Handler(), quiet)
	go ledgerSrv.Serve(ledgerLn)
	t.Cleanup(func() { ledgerSrv.Close(); eng.Close(); st.Close() })

	c, err := client.New(ledgerLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, p := range demoPolicies() {
		if _, _, err := c.PublishPolicy(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	backendLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Slow generations (about 60ms) keep the fair queue backlogged.
	llm := newFakeLLM(4, 400*time.Microsecond, 1)
	backendSrv := &http.Server{Handler: llm}
	go backendSrv.Serve(backendLn)
	t.Cleanup(func() { backendSrv.Close() })
	handler, queue, err := newGateway(c, &url.URL{Scheme: "http", Host: backendLn.Addr().String()}, 4)
	if err != nil {
		t.Fatal(err)
	}
	gwLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := &http.Server{Handler: handler}
	go gwSrv.Serve(gwLn)
	t.Cleanup(func() { gwSrv.Close() })
	gatewayURL := "http://" + gwLn.Addr().String()

	// A request without a known API key is refused before the ledger.
	resp, err := http.Post(gatewayURL+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no api key: %d", resp.StatusCode)
	}

	// A streamed answer is settled from its final usage event.
	req, _ := http.NewRequest("POST", gatewayURL+"/v1/chat/completions",
		strings.NewReader(`{"messages":[{"role":"user","content":"stream it"}],"max_tokens":40,"stream":true}`))
	req.Header.Set("Authorization", "Bearer key-acme")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	scanner := client.NewSSEUsageScanner()
	io.Copy(scanner, resp.Body)
	resp.Body.Close()
	used, ok := scanner.Usage()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || !ok || !scanner.Done() {
		t.Fatalf("streamed answer: %d %s, usage %v, done %v", resp.StatusCode, resp.Header.Get("Content-Type"), ok, scanner.Done())
	}
	streamed, err := c.GetReservation(ctx, resp.Header.Get(client.ReservationHeader))
	if err != nil {
		t.Fatal(err)
	}
	if streamed.GetState() != ledgerv1.ReservationState_RESERVATION_STATE_SETTLED || streamed.GetActualUnits()["tokens"] != used.TotalTokens {
		t.Fatalf("streamed request %s settled %v, the stream reported %d tokens", streamed.GetState(), streamed.GetActualUnits(), used.TotalTokens)
	}

	rep, err := runDemo(ctx, gatewayURL, c, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	queued, running := queue.Stats()
	rep.print(&out, llm, queued, running)
	t.Log(out.String())
	byName := map[string]*demoTenant{}
	for _, tn := range rep.tenants {
		byName[tn.name] = tn
		// Every token the backend reported was settled, nothing more,
		// nothing left reserved.
		if tn.spentAfter-tn.spentBefore != tn.tokensUsed || tn.reservedAfter != 0 || tn.failed != 0 {
			t.Errorf("%s: backend used %d, ledger spent %d, reserved %d, failed %d", tn.name, tn.tokensUsed, tn.spentAfter-tn.spentBefore, tn.reservedAfter, tn.failed)
		}
	}
	if byName["acme"].ok == 0 || byName["globex"].ok == 0 {
		t.Fatalf("acme %d, globex %d answered", byName["acme"].ok, byName["globex"].ok)
	}
	// initech's "*" budget (1200 tokens, 300/s) runs out after a handful
	// of 241-token requests, whatever the speed of this machine.
	rejected := false
	for i := 0; i < 40 && !rejected; i++ {
		req, _ := http.NewRequest("POST", gatewayURL+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"`+strings.Repeat("word ", 30)+`"}],"max_tokens":200}`))
		req.Header.Set("Authorization", "Bearer key-initech")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			rejected = true
			if resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"limiting_dimension":"tokens"`) {
				t.Fatalf("429 without Retry-After or dimension: %v %s", resp.Header, body)
			}
		}
	}
	if !rejected {
		t.Fatal("initech never met its budget")
	}
	if byName["acme"].tokensUsed <= byName["globex"].tokensUsed {
		t.Fatalf("acme (weight 3) got %d tokens of backend, globex (weight 1) %d", byName["acme"].tokensUsed, byName["globex"].tokensUsed)
	}
	if rep.discrepancy != 0 || rep.pending != 0 {
		t.Fatalf("%d audit discrepancies, %d unknown receipts", rep.discrepancy, rep.pending)
	}
	if llm.maxInFlight > 4 {
		t.Fatalf("backend ran %d at once behind a queue of 4", llm.maxInFlight)
	}
}
