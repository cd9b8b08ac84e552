package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The tests of this file are docs/ENVOY.md's outside client: they run the
// real binary with `serve --envoy-config` and call ShouldRateLimit over a
// real socket with go-control-plane's generated grpc-go client, as Envoy's
// ratelimit filter does, checking what the page promises.

// contractEnvoyMapping is the page's llm domain: a check reserves the
// estimate under the request id, the call after the stream settles it.
const contractEnvoyMapping = `domains:
  - name: llm
    rules:
      - subject: {key: tenant}
        route: {value: chat}
        unit: tokens
        id_key: x-request-id
        phase_key: capledger-phase
        estimate: 500
`

// envoyCheck is one ShouldRateLimit call of the llm domain: a descriptor
// per tenant, each with the request id and descriptor hits 0 (the check),
// or, with settle, one descriptor of the call after the stream.
func envoyCheck(t *testing.T, c rlsv3.RateLimitServiceClient, id string, settle bool, hits uint64, tenants ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: "llm"}
	for _, tenant := range tenants {
		d := &rlcommon.RateLimitDescriptor{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: tenant}, {Key: "x-request-id", Value: id},
			},
			HitsAddend: wrapperspb.UInt64(hits),
		}
		if settle {
			d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "capledger-phase", Value: "settle"})
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s, id %s, settle %v, hits %d): %v", strings.Join(tenants, ","), id, settle, hits, err)
	}
	return resp
}

// TestContractEnvoyCheckOfAFinishedIDIsRefused: ENVOY.md promises that a
// check whose id's reservation is settled already (another request
// reusing the id) is OVER_LIMIT, charged nothing, with no Retry-After,
// that a refused request's released reservation is final, and that a
// reservation retention removed is found as its tombstone, in the state
// it ended in. A check of one descriptor (reserve and start in one call)
// answered FAILED_PRECONDITION instead ("start ...: reservation
// released", or "already settled (reservation removed by retention)"),
// an error of the whole call, which Envoy answers per failure_mode_deny:
// with the default (fail open) the reused id's request ran. A check of an
// id under which the call after the stream recorded the cost (the "none"
// row: the check never reached the ledger) answered ALREADY_EXISTS (the
// record's digest is not a reserve's), the same error of the call.
func TestContractEnvoyCheckOfAFinishedIDIsRefused(t *testing.T) {
	bin := buildBinary(t)
	// The ids are checked again while their rows are live (default
	// retention, 72h), then on a server whose retention removed them.
	for _, c := range []struct {
		name      string
		retention []string
	}{
		{"live", nil},
		{"removed", []string{"--retention", "1s", "--tombstone-retention", "1h", "--retention-interval", "100ms"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkFinishedIDsAreRefused(t, bin, c.retention)
		})
	}
}

func checkFinishedIDsAreRefused(t *testing.T, bin string, retention []string) {
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"), append([]string{
		"--envoy-config", writeFile(t, dir, "mapping.yaml", contractEnvoyMapping)}, retention...)...)
	client := &http.Client{Timeout: 10 * time.Second}
	for _, p := range []string{
		`{"policy":{"subject":"t1","route":"chat","holdTtl":"60s","dimensions":[{"unit":"tokens","burst":"10000"}]}}`,
		`{"policy":{"subject":"small","route":"chat","holdTtl":"60s","dimensions":[{"unit":"tokens","burst":"100"}]}}`,
	} {
		if status, body := post(client, srv.url, "PublishPolicy", p); status != 200 {
			t.Fatalf("publish: %d %v", status, body)
		}
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	// settled: checked, then settled by the call after the stream.
	envoyCheck(t, rls, "settled", false, 0, "t1")
	if resp := envoyCheck(t, rls, "settled", true, 10, "t1"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settle: %v", resp)
	}
	// released: t1's reservation fitted, small's estimate did not, so the
	// request was refused and t1's reservation released.
	if resp := envoyCheck(t, rls, "released", false, 0, "t1", "small"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("check on t1 and small: %v, want OVER_LIMIT", resp)
	}
	// recorded: the check never reached the ledger; the call after the
	// stream recorded the cost under the id.
	if resp := envoyCheck(t, rls, "recorded", true, 10, "t1"); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("call after the stream with nothing reserved: %v", resp)
	}
	ids := []string{"settled", "released", "recorded"}
	if retention != nil {
		// Wait until retention removed both (their tombstones answer).
		for _, id := range ids {
			deadline := time.Now().Add(30 * time.Second)
			for {
				status, body := post(client, srv.url, "GetReservation", `{"reservationId":"envoy:`+id+`/t1/chat/global"}`)
				r, _ := body["reservation"].(map[string]any)
				if status == 200 && r["retired"] == true {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("retention did not remove %s: %d %v\n%s", id, status, body, srv.logs.String())
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	account := func() string {
		status, body := post(client, srv.url, "GetAccount", `{"subject":"t1","route":"chat"}`)
		if status != 200 {
			t.Fatalf("GetAccount: %d %v", status, body)
		}
		raw, _ := json.Marshal(body["accounts"])
		return string(raw)
	}
	for _, id := range ids {
		before := account()
		req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: "t1"}, {Key: "x-request-id", Value: id},
			},
			HitsAddend: wrapperspb.UInt64(0),
		}}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rls.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Errorf("check of the %s id: %v; want OVER_LIMIT, charged nothing", id, err)
			continue
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("check of the %s id: %v; want OVER_LIMIT", id, resp.OverallCode)
		}
		for _, h := range resp.ResponseHeadersToAdd {
			if h.GetKey() == "Retry-After" {
				t.Errorf("check of the %s id: Retry-After %s; want none", id, h.GetValue())
			}
		}
		if after := account(); after != before {
			t.Errorf("check of the %s id charged t1:\nbefore %s\nafter  %s", id, before, after)
		}
	}
	// Another estimate (hits 7 against the mapping's 500) is another
	// request, ALREADY_EXISTS, whatever the reservation's state: the
	// estimate is compared first. A recorded id has no estimate to differ
	// from: OVER_LIMIT as above.
	for id, want := range map[string]codes.Code{"settled": codes.AlreadyExists, "released": codes.AlreadyExists, "recorded": codes.OK} {
		req := &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: "t1"}, {Key: "x-request-id", Value: id},
			},
			HitsAddend: wrapperspb.UInt64(7),
		}}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rls.ShouldRateLimit(ctx, req)
		cancel()
		if got := status.Code(err); got != want {
			t.Errorf("check of the %s id with another estimate: %v (%v), want %v", id, got, err, want)
			continue
		}
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("check of the %s id with another estimate: %v, want OVER_LIMIT", id, resp.OverallCode)
		}
	}
}

// TestContractEnvoyStreamDoneFindsAHold: ENVOY.md's rows "held, not
// started" and "expired" of "What the call after the stream finds",
// from outside. A hold under the request's id that never started (left
// by a check of several descriptors whose second transaction failed, or
// taken through the LedgerService, as here) is started and settled with
// the hits the call reports; one whose hold TTL passed first has the
// hits recorded under usage:<id>/...; a retry of either charges nothing
// more.
func TestContractEnvoyStreamDoneFindsAHold(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, buildBinary(t), filepath.Join(dir, "data"),
		"--envoy-config", writeFile(t, dir, "mapping.yaml", contractEnvoyMapping))
	client := &http.Client{Timeout: 10 * time.Second}
	mustPost := func(method, body string) map[string]any {
		t.Helper()
		status, answer := post(client, srv.url, method, body)
		if status != 200 {
			t.Fatalf("%s %s: %d %v", method, body, status, answer)
		}
		return answer
	}
	mustPost("PublishPolicy", `{"policy":{"subject":"held","route":"chat","holdTtl":"600s","dimensions":[{"unit":"tokens","burst":"1000"}]}}`)
	mustPost("PublishPolicy", `{"policy":{"subject":"expired","route":"chat","holdTtl":"1s","dimensions":[{"unit":"tokens","burst":"1000"}]}}`)
	reservation := func(id string) map[string]any {
		t.Helper()
		r, _ := mustPost("GetReservation", `{"reservationId":"`+id+`"}`)["reservation"].(map[string]any)
		return r
	}
	spent := func(tenant string) string {
		t.Helper()
		raw, _ := json.Marshal(mustPost("GetAccount", `{"subject":"`+tenant+`","route":"chat"}`)["accounts"])
		return string(raw)
	}
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)

	mustPost("Reserve", `{"reservationId":"envoy:h-1/held/chat/global","subject":"held","route":"chat","units":{"tokens":"400"}}`)
	mustPost("Reserve", `{"reservationId":"envoy:e-1/expired/chat/global","subject":"expired","route":"chat","units":{"tokens":"400"}}`)
	for deadline := time.Now().Add(30 * time.Second); reservation("envoy:e-1/expired/chat/global")["state"] != "RESERVATION_STATE_EXPIRED"; {
		if time.Now().After(deadline) {
			t.Fatalf("the 1s hold did not expire: %v\n%s", reservation("envoy:e-1/expired/chat/global"), srv.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range []struct{ tenant, id, receipt string }{
		{"held", "h-1", "envoy:h-1/held/chat/global"},
		{"expired", "e-1", "usage:e-1/expired/chat/global"},
	} {
		var charged string
		for attempt := range 2 {
			if resp := envoyCheck(t, rls, c.id, true, 250, c.tenant); resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s: call after the stream (attempt %d): %v, want OK", c.tenant, attempt+1, resp)
			}
			if attempt == 1 && spent(c.tenant) != charged {
				t.Fatalf("%s: the retry charged again:\nbefore %s\nafter  %s", c.tenant, charged, spent(c.tenant))
			}
			charged = spent(c.tenant)
		}
		r := reservation(c.receipt)
		if units, _ := r["actualUnits"].(map[string]any); r["state"] != "RESERVATION_STATE_SETTLED" || units["tokens"] != "250" {
			t.Errorf("%s: %s is %v, want SETTLED with 250 tokens", c.tenant, c.receipt, r)
		}
		if !strings.Contains(charged, `"spent":"250"`) || strings.Contains(charged, `"reserved"`) {
			t.Errorf("%s: account %s, want 250 spent and nothing reserved", c.tenant, charged)
		}
	}
}
