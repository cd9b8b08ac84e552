package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

// `capledger policy list` against `serve` over a real socket follows the
// API's pages: it prints every generation the filters select once, oldest
// first, exactly as it printed the unpaged answer ({"policies": [...]},
// printJSONList), whatever --page-size.
func TestCLIPolicyListFollowsThePages(t *testing.T) {
	url := startInProcess(t)
	api := capledgerv1connect.NewLedgerServiceClient(http.DefaultClient, url)
	ctx := context.Background()
	const n = 230
	var all, tenant3 []*v1.Policy
	for i := range n {
		subject := fmt.Sprintf("tenant-%d", i%40)
		resp, err := api.PublishPolicy(ctx, connect.NewRequest(&v1.PublishPolicyRequest{Policy: &v1.Policy{
			Subject: subject, Route: "chat.generate",
			Dimensions: []*v1.Dimension{{Unit: "tokens", Burst: int64(100 + i)}},
		}}))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, resp.Msg.GetPolicy())
		if subject == "tenant-3" {
			tenant3 = append(tenant3, resp.Msg.GetPolicy())
		}
	}
	// What each policy lists as now (active: the newest of its key).
	var listed []*v1.Policy
	for token := ""; ; {
		resp, err := api.ListPolicies(ctx, connect.NewRequest(&v1.ListPoliciesRequest{PageSize: 1000, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, resp.Msg.GetPolicies()...)
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(listed) != n {
		t.Fatalf("the API listed %d policies, want %d", len(listed), n)
	}
	var want, want3 bytes.Buffer
	if err := printJSONList(&want, &v1.ListPoliciesResponse{Policies: listed}); err != nil {
		t.Fatal(err)
	}
	var listed3 []*v1.Policy
	for _, p := range listed {
		if p.GetSubject() == "tenant-3" {
			listed3 = append(listed3, p)
		}
	}
	if len(listed3) != len(tenant3) {
		t.Fatalf("tenant-3: %d listed, %d published", len(listed3), len(tenant3))
	}
	if err := printJSONList(&want3, &v1.ListPoliciesResponse{Policies: listed3}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"policy", "list"}, want.String()},
		{[]string{"policy", "list", "--page-size", "7"}, want.String()},
		{[]string{"policy", "list", "--page-size", "1"}, want.String()},
		{[]string{"policy", "list", "--page-size", "229"}, want.String()},
		{[]string{"policy", "list", "--subject", "tenant-3", "--page-size", "2"}, want3.String()},
		{[]string{"policy", "list", "--subject", "tenant-99", "--page-size", "2"}, "{\n  \"policies\": []\n}\n"},
	} {
		code, out, errOut := cli(t, url, c.args...)
		wantExit(t, exitOK, code, out, errOut)
		if out != c.want {
			t.Fatalf("%s printed\n%.2000s\nwant\n%.2000s", strings.Join(c.args, " "), out, c.want)
		}
		var parsed struct{ Policies []json.RawMessage }
		if err := json.Unmarshal([]byte(out), &parsed); err != nil {
			t.Fatalf("%s: %v", strings.Join(c.args, " "), err)
		}
	}
	for _, size := range []string{"0", "1001", "-3"} {
		code, out, errOut := cli(t, url, "policy", "list", "--page-size", size)
		wantExit(t, exitUsage, code, out, errOut)
	}
}

// pagedPolicies is a stand-in LedgerService whose ListPolicies answers
// pages of one policy, each after delay, and fails the page failAt (from
// 1; 0: none) as UNAVAILABLE.
type pagedPolicies struct {
	capledgerv1connect.UnimplementedLedgerServiceHandler
	pages, failAt int
	delay         time.Duration
	calls         atomic.Int64
}

func (p *pagedPolicies) ListPolicies(ctx context.Context, req *connect.Request[v1.ListPoliciesRequest]) (*connect.Response[v1.ListPoliciesResponse], error) {
	page := int(p.calls.Add(1))
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if page == p.failAt {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("store unavailable"))
	}
	if want := fmt.Sprint(page - 1); page > 1 && req.Msg.GetPageToken() != want {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("page token %q, want %q", req.Msg.GetPageToken(), want))
	}
	resp := &v1.ListPoliciesResponse{Policies: []*v1.Policy{{Subject: fmt.Sprintf("tenant-%d", page), Route: "chat", Generation: uint64(page)}}}
	if page < p.pages {
		resp.NextPageToken = fmt.Sprint(page)
	}
	return connect.NewResponse(resp), nil
}

func servePagedPolicies(t *testing.T, p *pagedPolicies) string {
	t.Helper()
	path, handler := capledgerv1connect.NewLedgerServiceHandler(p)
	mux := http.NewServeMux()
	mux.Handle(path, handler)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// --timeout bounds each page, not the listing: four pages of 400 ms list
// within a --timeout of 1s. A page that fails ends the output after the
// pages printed before it, with the failure's exit code.
func TestCLIPolicyListTimeoutIsPerPageAndAFailedPageStops(t *testing.T) {
	slow := &pagedPolicies{pages: 4, delay: 400 * time.Millisecond}
	code, out, errOut := cli(t, servePagedPolicies(t, slow), "policy", "list", "--timeout", "1s")
	wantExit(t, exitOK, code, out, errOut)
	var parsed struct{ Policies []struct{ Subject string } }
	if err := json.Unmarshal([]byte(out), &parsed); err != nil || len(parsed.Policies) != 4 || parsed.Policies[3].Subject != "tenant-4" {
		t.Fatalf("four slow pages: %v %+v\n%s", err, parsed, out)
	}

	failing := &pagedPolicies{pages: 4, failAt: 3}
	code, out, errOut = cli(t, servePagedPolicies(t, failing), "policy", "list")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.HasPrefix(out, "{\n  \"policies\": [\n    {") || !strings.Contains(out, `"tenant-2"`) || strings.Contains(out, `"tenant-3"`) ||
		json.Valid([]byte(out)) {
		t.Fatalf("a listing whose third page failed printed\n%s", out)
	}
	if !strings.Contains(errOut, "store unavailable") {
		t.Fatalf("stderr: %s", errOut)
	}
}
