package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/capledger/capledger/client"
)

// demoTenant is one tenant's traffic and what came of it.
type demoTenant struct {
	name    string
	key     string
	clients int
	weight  string

	mu            sync.Mutex
	ok, rejected  int
	failed        int
	sent          int
	retryAfterSum time.Duration
	tokensUsed    int64 // as the backend reported them in the answers
	spentBefore   int64
	spentAfter    int64
	reservedAfter int64
}

type demoReport struct {
	tenants     []*demoTenant
	duration    time.Duration
	discrepancy int
	pending     int
}

// runDemo drives the gateway with three tenants for d: acme and globex
// with 8 concurrent clients each (more than the backend's slots, so the
// fair queue decides who goes next), initech with 2 clients on the small
// "*" budget (so it meets 429s). Clients honour Retry-After, also on a
// 503 (the ledger unreachable).
func runDemo(ctx context.Context, gatewayURL string, c *client.Client, d time.Duration) (*demoReport, error) {
	tenants := []*demoTenant{
		{name: "acme", key: "key-acme", clients: 8, weight: "3"},
		{name: "globex", key: "key-globex", clients: 8, weight: "1"},
		{name: "initech", key: "key-initech", clients: 2, weight: "1 (*)"},
	}
	for _, t := range tenants {
		spent, _, err := tokensSpent(ctx, c, t.name)
		if err != nil {
			return nil, err
		}
		t.spentBefore = spent
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, t := range tenants {
		for i := 0; i < t.clients; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) && ctx.Err() == nil {
					t.send(ctx, hc, gatewayURL, deadline)
				}
			}()
		}
	}
	wg.Wait()
	rep := &demoReport{tenants: tenants, duration: d}
	for _, t := range tenants {
		spent, reserved, err := tokensSpent(ctx, c, t.name)
		if err != nil {
			return nil, err
		}
		t.spentAfter, t.reservedAfter = spent, reserved
	}
	discrepancies, err := c.Audit(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	rep.discrepancy = len(discrepancies)
	rep.pending = len(c.PendingUnknown())
	return rep, nil
}

// send makes one chat request and records its outcome; after a 429, or
// a 503 while the ledger is unreachable, it waits out the Retry-After
// (bounded by the demo's end), so clients do not spin on a down ledger.
func (t *demoTenant) send(ctx context.Context, hc *http.Client, gatewayURL string, deadline time.Time) {
	t.mu.Lock()
	t.sent++
	stream := t.sent%2 == 0 // every other request streams
	t.mu.Unlock()
	body, _ := json.Marshal(ChatRequest{
		Model:     "fake-1",
		Messages:  []Message{{Role: "user", Content: strings.Repeat("please summarise the quarterly capacity report ", 5)}},
		MaxTokens: 200,
		Stream:    stream,
	})
	req, _ := http.NewRequestWithContext(ctx, "POST", gatewayURL+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+t.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.mu.Lock()
		t.failed++
		t.mu.Unlock()
		return
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && stream:
		usage := client.NewSSEUsageScanner()
		_, err := io.Copy(usage, resp.Body)
		used, ok := usage.Usage()
		t.mu.Lock()
		defer t.mu.Unlock()
		if err != nil || !ok || !usage.Done() {
			t.failed++
			return
		}
		t.ok++
		t.tokensUsed += used.TotalTokens
	case resp.StatusCode == http.StatusOK:
		var answer ChatResponse
		if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
			t.mu.Lock()
			t.failed++
			t.mu.Unlock()
			return
		}
		t.mu.Lock()
		t.ok++
		t.tokensUsed += answer.Usage.TotalTokens
		t.mu.Unlock()
	case resp.StatusCode == http.StatusTooManyRequests:
		io.Copy(io.Discard, resp.Body)
		wait := time.Second
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			wait = time.Duration(secs) * time.Second
		}
		t.mu.Lock()
		t.rejected++
		t.retryAfterSum += wait
		t.mu.Unlock()
		sleep(ctx, min(wait, time.Until(deadline)))
	default:
		io.Copy(io.Discard, resp.Body)
		t.mu.Lock()
		t.failed++
		t.mu.Unlock()
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			sleep(ctx, min(time.Duration(secs)*time.Second, time.Until(deadline)))
		}
	}
}

// tokensSpent returns the tokens spent and reserved over every generation
// of the tenant's accounts.
func tokensSpent(ctx context.Context, c *client.Client, tenant string) (spent, reserved int64, err error) {
	accounts, err := c.GetAccount(ctx, tenant, Route, "")
	if err != nil {
		return 0, 0, fmt.Errorf("account of %s: %w", tenant, err)
	}
	for _, a := range accounts {
		for _, b := range a.GetBalances() {
			if b.GetUnit() == "tokens" {
				spent += b.GetSpent()
				reserved += b.GetReserved()
			}
		}
	}
	return spent, reserved, nil
}

func (r *demoReport) print(w io.Writer, llm *fakeLLM, queued, running int) {
	fmt.Fprintf(w, "\ndemo: %s of traffic through the gateway\n\n", r.duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\tweight\tclients\t200\t429\tfailed\tavg Retry-After\ttokens used (backend)\ttokens spent (ledger)\treserved now\t")
	var acme, globex int64
	for _, t := range r.tenants {
		avg := "-"
		if t.rejected > 0 {
			avg = (t.retryAfterSum / time.Duration(t.rejected)).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t\n", t.name, t.weight, t.clients, t.ok, t.rejected, t.failed, avg,
			t.tokensUsed, t.spentAfter-t.spentBefore, t.reservedAfter)
		switch t.name {
		case "acme":
			acme = t.tokensUsed
		case "globex":
			globex = t.tokensUsed
		}
	}
	tw.Flush()
	if acme+globex > 0 {
		fmt.Fprintf(w, "\nbackend share while both were queued: acme %.0f%%, globex %.0f%% (weights 3:1 -> 75%%:25%%)\n",
			100*float64(acme)/float64(acme+globex), 100*float64(globex)/float64(acme+globex))
	}
	llm.mu.Lock()
	maxInFlight := llm.maxInFlight
	llm.mu.Unlock()
	fmt.Fprintf(w, "backend ran at most %d generations at once; fair queue now: %d queued, %d running\n", maxInFlight, queued, running)
	fmt.Fprintf(w, "ledger audit: %d discrepancies; receipts with unknown usage: %d\n", r.discrepancy, r.pending)
	fmt.Fprintf(w, "\nThe gateway keeps serving; Ctrl-C stops it.\n")
}
