package client

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capledger/capledger/internal/testport"
)

// A refusal before the handler that no retry can change (a configuration
// error of the gateway) answers 500 naming the ledger's reason, not 503
// "capacity ledger unavailable", which would send on-call after the
// ledger; NO_POLICY stays 403, and the handler never runs.
func TestMiddlewareNamesConfigurationRefusals(t *testing.T) {
	l := startLedger(t)
	l.publish(t, policySpec{subject: "tenant-7", route: "chat.generate", burst: 10_000})
	queue, err := l.direct.NewFairQueue(FairQueueConfig{Concurrency: 1, CostUnit: "tokens"})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ })
	estimating := func(units Units) Estimator {
		return NewEstimator("sha256:e57", func(*http.Request, []byte) (Units, error) { return units, nil })
	}
	cases := []struct {
		name    string
		cfg     MiddlewareConfig
		tenant  string
		status  int
		reason  string
		message string
	}{
		// The estimator names a unit the tenant's policy lacks.
		{"unknown unit", MiddlewareConfig{Estimator: estimating(Units{"gpu_seconds": 3})}, "tenant-7",
			http.StatusInternalServerError, "UNKNOWN_UNIT", "capledger refused: UNKNOWN_UNIT"},
		{"unknown unit, fair queue", MiddlewareConfig{Estimator: estimating(Units{"gpu_seconds": 3}), Queue: queue}, "tenant-7",
			http.StatusInternalServerError, "UNKNOWN_UNIT", "capledger refused: UNKNOWN_UNIT"},
		// The ledger refuses the command: a subject over 512 bytes.
		{"invalid command", MiddlewareConfig{}, strings.Repeat("t", 600),
			http.StatusInternalServerError, "INVALID_COMMAND", "capledger refused: INVALID_COMMAND"},
		// The SDK refuses it before sending: a negative estimate.
		{"invalid command, refused locally", MiddlewareConfig{Estimator: estimating(Units{"tokens": -1})}, "tenant-7",
			http.StatusInternalServerError, "INVALID_COMMAND", "capledger refused: INVALID_COMMAND"},
		{"no policy", MiddlewareConfig{}, "tenant-without-policy",
			http.StatusForbidden, "NO_POLICY", "no capacity policy covers this subject and route"},
		{"no policy, fair queue", MiddlewareConfig{Queue: queue}, "tenant-without-policy",
			http.StatusForbidden, "NO_POLICY", "no capacity policy covers this subject and route"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := gateway(t, l.direct, tc.cfg, backend)
			resp, body := send(t, gw.Client(), gw.URL, tc.tenant, "x")
			var got struct{ Error, Reason string }
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("%d %q: %v", resp.StatusCode, body, err)
			}
			if resp.StatusCode != tc.status || got.Reason != tc.reason || !strings.HasPrefix(got.Error, tc.message) {
				t.Fatalf("%d %s, want %d with reason %s and error %q", resp.StatusCode, body, tc.status, tc.reason, tc.message)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				t.Fatalf("Retry-After %q on a refusal no wait changes", ra)
			}
		})
	}
	if ran != 0 {
		t.Fatalf("the handler ran %d times", ran)
	}
}

// A ledger that cannot be reached still answers 503 with Retry-After: 1.
func TestMiddlewareAnswers503WhenTheLedgerIsUnreachable(t *testing.T) {
	addr := testport.Addr(t) // nothing listens: every connection is refused
	c, err := New(addr, WithBreaker(BreakerPolicy{FailureThreshold: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gw := gateway(t, c, MiddlewareConfig{}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("the handler ran")
	}))
	resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "x")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		!strings.Contains(body, "capacity ledger unavailable") {
		t.Fatalf("%d %s (Retry-After %q), want 503 capacity ledger unavailable with Retry-After: 1", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
}

// CLIENTS.md, section 8: a gateway whose token the ledger refuses (a
// `capledger serve --tokens` process) answers 500 naming the code,
// PERMISSION_DENIED for a token without the gateway role and
// UNAUTHENTICATED for one the tokens file lacks, with no Retry-After:
// no retry changes it, and a 503 would send on-call after the ledger.
func TestMiddlewareNamesTokenRefusals(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(
		"admin-token-0000000001 admin ops\n"+
			"viewer-token-000000001 viewer dash\n"+
			"gateway-token-00000001 gateway gw-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := newLedgerProcess(t, dir, "--tokens", tokens).addr
	admin, err := New(addr, noBreakerWatchdog, WithBearerToken("admin-token-0000000001"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	publishTenantPolicy(t, admin, false)

	ran := 0
	backend := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ })
	for _, tc := range []struct {
		name, token, status string
		want                int
	}{
		{"viewer token", "viewer-token-000000001", "PERMISSION_DENIED", http.StatusInternalServerError},
		{"unknown token", "no-such-token-00000001", "UNAUTHENTICATED", http.StatusInternalServerError},
		{"no token", "", "UNAUTHENTICATED", http.StatusInternalServerError},
		// The same gateway with its own token is admitted.
		{"gateway token", "gateway-token-00000001", "", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(addr, noBreakerWatchdog, WithBearerToken(tc.token))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tokens := NewEstimator("sha256:tokens-100", func(*http.Request, []byte) (Units, error) { return Units{"tokens": 100}, nil })
			gw := gateway(t, c, MiddlewareConfig{Estimator: tokens}, backend)
			resp, body := send(t, gw.Client(), gw.URL, "tenant-7", "x")
			if resp.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tc.want)
			}
			if tc.status == "" {
				return
			}
			var got struct{ Error, Reason string }
			if err := json.Unmarshal([]byte(body), &got); err != nil {
				t.Fatalf("%d %q: %v", resp.StatusCode, body, err)
			}
			if got.Reason != tc.status || got.Error != "capledger refused: "+tc.status {
				t.Fatalf("%d %s, want reason %s and error %q", resp.StatusCode, body, tc.status, "capledger refused: "+tc.status)
			}
			if ra := resp.Header.Get("Retry-After"); ra != "" {
				t.Fatalf("Retry-After %q on a refusal no wait changes", ra)
			}
		})
	}
	if ran != 1 {
		t.Fatalf("the handler ran %d times, want once (the gateway token's request)", ran)
	}
}
