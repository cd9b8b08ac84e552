package main

import (
	"context"
	"fmt"
	"net/http"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/faultproxy"
)

// TestServeAnswersWithinStoreTimeoutWhileItsStoreHangs: docs/API.md
// (Errors, unavailable) and docs/OPERATIONS.md (On call) promise that a
// call without a deadline of its own ends within serve --store-timeout
// (twice it for a write whose commit had begun) with 503 unavailable /
// STORE_UNAVAILABLE while its PostgreSQL hangs, saying "not applied" or
// "outcome unknown" for a write and "nothing was changed" for a read;
// and that once the store answers again the same replica serves and a
// write retried with its ids is applied exactly once. The on-call walk
// of 7 Dec found every read (GetAccount, GetReservation, the console's),
// and a Settle (its read of the reservation), waiting forever against a
// hung PostgreSQL, a ListShards a minute, and a Reserve queued behind a
// stuck batch twice the batch timeout, answered 504 deadline_exceeded
// though its caller set no deadline.
func TestServeAnswersWithinStoreTimeoutWhileItsStoreHangs(t *testing.T) {
	dsn, proxy := postgresBehindProxy(t)
	const storeTimeout = 2 * time.Second
	dir := t.TempDir()
	srv := startServer(t, buildBinary(t), dir, "--store", dsn, "--store-timeout", storeTimeout.String(),
		"--envoy-config", writeFile(t, dir, "mapping.yaml", contractEnvoyMapping))
	mustPost(t, srv.url, "PublishPolicy", `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s","dimensions":[{"unit":"tokens","burst":"100000"}]}}`)
	mustPost(t, srv.url, "Reserve", `{"reservationId":"hang-pre","subject":"t","route":"chat","units":{"tokens":10}}`)
	mustPost(t, srv.url, "Start", `{"reservationId":"hang-pre","operationId":"op-pre"}`)
	conn, err := grpc.NewClient(strings.TrimPrefix(srv.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// The writes, each retried with the same ids once the store is back.
	writes := map[string][2]string{
		"Reserve":      {"Reserve", `{"reservationId":"hang-r","subject":"t","route":"chat","units":{"tokens":1}}`},
		"Settle":       {"Settle", `{"reservationId":"hang-pre","operationId":"op-pre","actualUnits":{"tokens":4}}`},
		"ReserveBatch": {"ReserveBatch", `{"requests":[{"reservationId":"hang-b","subject":"t","route":"chat","units":{"tokens":2}}]}`},
	}
	reads := map[string][2]string{
		"GetAccount":              {"GetAccount", `{"subject":"t","route":"chat"}`},
		"GetReservation":          {"GetReservation", `{"reservationId":"hang-pre"}`},
		"ListPolicies":            {"ListPolicies", `{}`},
		"ListUsageUnknown":        {"ListUsageUnknown", `{}`},
		"ListSubjectReservations": {"ConsoleService/ListSubjectReservations", `{"subject":"t"}`},
		"ListAccountStandings":    {"ConsoleService/ListAccountStandings", `{}`},
		"GetFairness":             {"ConsoleService/GetFairness", `{}`},
		"GetOverview":             {"ConsoleService/GetOverview", `{}`},
		"DrainProgress":           {"RolloutService/DrainProgress", `{"generations":["1"]}`},
	}
	grpcReserve := func() error {
		var out v1.ReserveResponse
		return conn.Invoke(context.Background(), "/capledger.v1.LedgerService/Reserve",
			&v1.ReserveRequest{ReservationId: "hang-g", Subject: "t", Route: "chat", Units: map[string]int64{"tokens": 3}}, &out)
	}
	envoyCheck := func() error {
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: "envoy"}, {Key: "x-request-id", Value: "hang-e"}}, HitsAddend: wrapperspb.UInt64(0)}}})
		return err
	}

	proxy.SetFaults(faultproxy.Faults{Partition: true})
	hung := time.Now()
	// No client timeout: the calls end when the server answers. The guard
	// turns a call that never ends into a failure: twice the store
	// timeout (a write whose commit began just before its cap) and slack
	// for a loaded machine.
	guard := 2*storeTimeout + 20*time.Second
	var mu sync.Mutex
	pending := map[string]bool{}
	answers := map[string]string{}
	var wg sync.WaitGroup
	call := func(name string, f func() string) {
		pending[name] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			answer := f()
			mu.Lock()
			defer mu.Unlock()
			delete(pending, name)
			answers[name] = answer
		}()
	}
	// httpCall answers "STATUS CODE REASON | MESSAGE".
	httpCall := func(c [2]string) func() string {
		return func() string {
			code, out := post(&http.Client{}, srv.url, c[0], c[1])
			reason := ""
			if details, _ := out["details"].([]any); len(details) > 0 {
				detail, _ := details[0].(map[string]any)
				debug, _ := detail["debug"].(map[string]any)
				reason, _ = debug["reason"].(string)
			}
			return fmt.Sprintf("%d %v %s | %v", code, out["code"], reason, out["message"])
		}
	}
	mu.Lock()
	for name, c := range writes {
		call(name, httpCall(c))
	}
	for name, c := range reads {
		call(name, httpCall(c))
	}
	grpcAnswer := func(f func() error) func() string {
		return func() string {
			st, _ := status.FromError(f())
			return fmt.Sprintf("%s | %s", st.Code(), st.Message())
		}
	}
	call("gRPC Reserve", grpcAnswer(grpcReserve))
	call("Envoy ShouldRateLimit", grpcAnswer(envoyCheck))
	mu.Unlock()
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(guard):
		mu.Lock()
		t.Fatalf("calls still waiting %v after the store hung (--store-timeout %v): %v\nanswered: %v\n%s", guard, storeTimeout, pending, answers, srv.logs.String())
	}
	t.Logf("every call answered %v after the store hung (--store-timeout %v)", time.Since(hung).Round(time.Millisecond), storeTimeout)
	for name, answer := range answers {
		_, isWrite := writes[name]
		isWrite = isWrite || strings.HasPrefix(name, "gRPC") || strings.HasPrefix(name, "Envoy")
		switch {
		case strings.HasPrefix(name, "gRPC") || strings.HasPrefix(name, "Envoy"):
			if !strings.HasPrefix(answer, codes.Unavailable.String()+" |") {
				t.Errorf("%s while the store hangs: %s, want %s", name, answer, codes.Unavailable)
			}
		case !strings.HasPrefix(answer, "503 unavailable STORE_UNAVAILABLE |"):
			t.Errorf("%s while the store hangs: %s, want 503 unavailable STORE_UNAVAILABLE", name, answer)
		}
		if !strings.Contains(answer, "--store-timeout") && !strings.Contains(answer, "not applied") {
			t.Errorf("%s while the store hangs: %s, want it to say the store did not answer within --store-timeout", name, answer)
		}
		if isWrite && !strings.Contains(answer, "not applied") && !strings.Contains(answer, "outcome unknown") {
			t.Errorf("%s while the store hangs: %s, want \"not applied\" or \"outcome unknown\"", name, answer)
		}
		if !isWrite && !strings.Contains(answer, "nothing was changed") {
			t.Errorf("%s while the store hangs: %s, want \"nothing was changed\"", name, answer)
		}
	}

	// The store answers again: the same replica serves, and each write
	// retried with its ids is applied once.
	proxy.SetFaults(faultproxy.Faults{})
	back := time.Now()
	awaitStoreBack(t, srv, "hang-pre")
	t.Logf("serving again %v after the store came back", time.Since(back).Round(time.Millisecond))
	for range 2 { // the retry, and a retry of the retry (a replay)
		for _, c := range writes {
			mustPost(t, srv.url, c[0], c[1])
		}
		if err := grpcReserve(); err != nil {
			t.Fatalf("gRPC Reserve retried: %v", err)
		}
		if err := envoyCheck(); err != nil {
			t.Fatalf("Envoy check retried: %v", err)
		}
	}
	for id, want := range map[string]string{"hang-r": "RESERVED", "hang-b": "RESERVED", "hang-g": "RESERVED", "hang-pre": "SETTLED", "envoy:hang-e/envoy/chat/global": "STARTED"} {
		r := mustPost(t, srv.url, "GetReservation", `{"reservationId":"`+id+`"}`)["reservation"].(map[string]any)
		if r["state"] != "RESERVATION_STATE_"+want && r["state"] != want {
			t.Errorf("reservation %s after the retries: %v, want %s", id, r["state"], want)
		}
	}
	// t's tokens: reserved 1 + 2 + 3 by the retried reserves, once each;
	// spent 4 by the settle, the rest of its 10 refunded once.
	accounts := mustPost(t, srv.url, "GetAccount", `{"subject":"t","route":"chat"}`)["accounts"].([]any)
	if len(accounts) != 1 {
		t.Fatalf("accounts of t: %v", accounts)
	}
	balances, _ := accounts[0].(map[string]any)["balances"].([]any)
	if len(balances) != 1 {
		t.Fatalf("account of t: %v", accounts[0])
	}
	tokens := balances[0].(map[string]any)
	for field, want := range map[string]string{"reserved": "6", "spent": "4", "available": "99990"} {
		if got := fmt.Sprint(tokens[field]); got != want {
			t.Errorf("account of t after the retries: %s %s, want %s (%v)", field, got, want, tokens)
		}
	}
}

// postgresBehindProxy returns the DSN of this test's PostgreSQL schema
// reached through a faultproxy (closed when the test ends), whose
// Partition fault swallows every byte and leaves every connection open,
// as a PostgreSQL whose packets are dropped or that was SIGSTOPped.
func postgresBehindProxy(t *testing.T) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := neturl.Parse(postgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(u.Host, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	return u.String(), proxy
}

// TestAuditAndDrainsAnswerWithinStoreTimeoutWhileTheStoreHangs:
// docs/API.md (Errors) and docs/OPERATIONS.md (A hung PostgreSQL)
// promise that an audit, unary (Audit) or streamed (`capledger audit`,
// StreamAudit), and a DrainProgress that runs drain passes (runDrains),
// take as long as their work needs while the store answers, but end with
// 503 unavailable / STORE_UNAVAILABLE once their PostgreSQL has not
// answered one read for serve --store-timeout (a slow store that answers
// each read in time does not end them): the audit saying nothing
// was changed, the drains how many moves were applied and that the rest
// was not; and that they succeed once the store answers again. They
// waited for the caller's deadline, and `capledger audit` (a stream
// whose heartbeats keep its --timeout from running out) forever.
func TestAuditAndDrainsAnswerWithinStoreTimeoutWhileTheStoreHangs(t *testing.T) {
	dsn, proxy := postgresBehindProxy(t)
	const storeTimeout = 2 * time.Second
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir(), "--store", dsn, "--store-timeout", storeTimeout.String())
	policy := `{"policy":{"subject":"*","route":"chat","holdTtl":"3600s","dimensions":[{"unit":"tokens","burst":"%d"}]}}`
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(policy, 1000))
	mustPost(t, srv.url, "Reserve", `{"reservationId":"audit-pre","subject":"t","route":"chat","units":{"tokens":10}}`)
	// A second generation: the first one's account has capacity to drain.
	mustPost(t, srv.url, "PublishPolicy", fmt.Sprintf(policy, 2000))

	httpAnswer := func(method, body string) string {
		code, out := post(&http.Client{}, srv.url, method, body)
		reason := ""
		if details, _ := out["details"].([]any); len(details) > 0 {
			detail, _ := details[0].(map[string]any)
			debug, _ := detail["debug"].(map[string]any)
			reason, _ = debug["reason"].(string)
		}
		return fmt.Sprintf("%d %v %s | %v", code, out["code"], reason, out["message"])
	}
	// cliAudit runs `capledger audit` with a --timeout longer than the
	// test (its heartbeats would keep a shorter one from running out)
	// and returns its exit code and what it printed.
	cliAudit := func() (int, string) {
		out, code := runBinary(t, bin, "audit", "--addr", srv.url, "--timeout", "10m")
		return code, out
	}

	// A slow store that answers every read: each chunk either way
	// delayed an eighth of the store timeout, so each read waits well
	// under it while the audit's dozen or more reads take longer than it.
	// The audits are capped per read, not as a whole: they succeed.
	proxy.SetFaults(faultproxy.Faults{Delay: storeTimeout / 8})
	for name, run := range map[string]func() (int, string){
		"Audit": func() (int, string) {
			code, out := post(&http.Client{}, srv.url, "Audit", `{}`)
			return code, fmt.Sprint(out)
		},
		"capledger audit": cliAudit,
	} {
		began := time.Now()
		code, out := run()
		took := time.Since(began)
		if (name == "Audit" && code != http.StatusOK) || (name != "Audit" && code != 0) {
			t.Errorf("%s on a slow store that answers each read: %d %s, want it to succeed (took %v; --store-timeout %v)", name, code, out, took, storeTimeout)
		} else if took <= storeTimeout {
			t.Errorf("%s on a slow store took %v, not longer than --store-timeout %v: the delays no longer make this check prove anything", name, took, storeTimeout)
		}
		t.Logf("%s on a slow store: %v (--store-timeout %v)", name, took.Round(time.Millisecond), storeTimeout)
	}

	proxy.SetFaults(faultproxy.Faults{Partition: true})
	hung := time.Now()
	var mu sync.Mutex
	var audit, drains, streamed string
	var streamedExit int
	pending := map[string]bool{"Audit": true, "DrainProgress runDrains": true, "capledger audit": true}
	var wg sync.WaitGroup
	call := func(name string, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
			mu.Lock()
			defer mu.Unlock()
			delete(pending, name)
		}()
	}
	call("Audit", func() { audit = httpAnswer("Audit", `{}`) })
	call("DrainProgress runDrains", func() {
		drains = httpAnswer("RolloutService/DrainProgress", `{"generations":["1"],"runDrains":true}`)
	})
	call("capledger audit", func() { streamedExit, streamed = cliAudit() })
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	// No client deadline: the calls end when the server answers. The
	// guard (five times the store timeout and slack for a loaded
	// machine) turns one that never ends into a failure.
	guard := 5*storeTimeout + 20*time.Second
	select {
	case <-ended:
	case <-time.After(guard):
		mu.Lock()
		t.Fatalf("%v still waiting %v after the store hung (--store-timeout %v)\n%s", pending, guard, storeTimeout, srv.logs.String())
	}
	t.Logf("audit, streamed audit and drains answered %v after the store hung (--store-timeout %v)", time.Since(hung).Round(time.Millisecond), storeTimeout)
	t.Logf("Audit: %s\nDrainProgress runDrains: %s\ncapledger audit: exit %d, %s", audit, drains, streamedExit, streamed)
	for name, answer := range map[string]string{"Audit": audit, "DrainProgress runDrains": drains} {
		if !strings.HasPrefix(answer, "503 unavailable STORE_UNAVAILABLE |") || !strings.Contains(answer, "--store-timeout") {
			t.Errorf("%s while the store hangs: %s, want 503 unavailable STORE_UNAVAILABLE naming --store-timeout", name, answer)
		}
	}
	if !strings.Contains(audit, "nothing was changed") {
		t.Errorf("Audit while the store hangs: %s, want \"nothing was changed\"", audit)
	}
	if !strings.Contains(drains, "0 drain moves applied") || !strings.Contains(drains, "not applied") {
		t.Errorf("DrainProgress runDrains while the store hangs: %s, want \"0 drain moves applied\" and \"not applied\"", drains)
	}
	if streamedExit != exitUnavailable || !strings.Contains(streamed, "unavailable") || !strings.Contains(streamed, "STORE_UNAVAILABLE") ||
		!strings.Contains(streamed, "--store-timeout") || !strings.Contains(streamed, "nothing was changed") {
		t.Errorf("capledger audit while the store hangs: exit %d, %s; want exit %d, unavailable STORE_UNAVAILABLE naming --store-timeout and \"nothing was changed\"",
			streamedExit, streamed, exitUnavailable)
	}

	// The store answers again: the same calls succeed.
	proxy.SetFaults(faultproxy.Faults{})
	awaitStoreBack(t, srv, "audit-pre")
	if found := mustPost(t, srv.url, "Audit", `{}`)["discrepancies"]; found != nil {
		t.Errorf("Audit after the store came back: discrepancies %v", found)
	}
	if code, out := cliAudit(); code != 0 {
		t.Errorf("capledger audit after the store came back: exit %d, %s", code, out)
	}
	drained := mustPost(t, srv.url, "RolloutService/DrainProgress", `{"generations":["1"],"runDrains":true}`)
	t.Logf("DrainProgress runDrains after the store came back: %v", drained)
}

// awaitStoreBack polls GetReservation of reservationID, a reservation
// made before the store hung, until the server answers it again (a
// minute at most): the store is back for this replica.
func awaitStoreBack(t *testing.T, srv *serverProcess, reservationID string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _ := post(&http.Client{Timeout: 10 * time.Second}, srv.url, "GetReservation", `{"reservationId":"`+reservationID+`"}`)
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GetReservation still %d a minute after the store came back:\n%s", code, srv.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
