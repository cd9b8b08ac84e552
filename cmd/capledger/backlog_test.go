package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// publishTestPolicy publishes policyYAML (tenant-7 on chat.generate)
// through the CLI.
func publishTestPolicy(t *testing.T, url string) {
	t.Helper()
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", policyPath)
	wantExit(t, exitOK, code, out, errOut)
}

func TestCLIBacklog(t *testing.T) {
	url := startInProcess(t)
	publishTestPolicy(t, url)
	var code int
	var out, errOut string
	for _, id := range []string{"u-1", "u-2", "u-3", "running"} {
		code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10,requests=1", "--id", id)
		wantExit(t, exitOK, code, out, errOut)
		code, out, errOut = cli(t, url, "start", "--id", id, "--operation", "op-"+id)
		wantExit(t, exitOK, code, out, errOut)
		if id != "running" {
			code, out, errOut = cli(t, url, "mark-unknown", "--id", id)
			wantExit(t, exitOK, code, out, errOut)
		}
	}

	type listing struct {
		Reservations []struct {
			ReservationID  string `json:"reservationId"`
			OperationID    string `json:"operationId"`
			UsageUnknownAt string `json:"usageUnknownAt"`
		} `json:"reservations"`
		NextPageToken        string `json:"nextPageToken"`
		Backlog              string `json:"backlog"`
		OldestUsageUnknownAt string `json:"oldestUsageUnknownAt"`
	}
	list := func(args ...string) listing {
		t.Helper()
		code, out, errOut := cli(t, url, append([]string{"backlog"}, args...)...)
		wantExit(t, exitOK, code, out, errOut)
		var l listing
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("backlog printed %s: %v", out, err)
		}
		return l
	}
	first := list("--limit", "2")
	if len(first.Reservations) != 2 || first.NextPageToken == "" || first.Backlog != "3" {
		t.Fatalf("first page of 2: %+v", first)
	}
	// The backlog ages from u-1's marking, which the listing shows.
	if first.Reservations[0].UsageUnknownAt == "" || first.OldestUsageUnknownAt != first.Reservations[0].UsageUnknownAt {
		t.Fatalf("first page: u-1 marked at %q, backlog's oldest %q", first.Reservations[0].UsageUnknownAt, first.OldestUsageUnknownAt)
	}
	rest := list("--limit", "2", "--page-token", first.NextPageToken)
	if len(rest.Reservations) != 1 || rest.NextPageToken != "" || rest.Reservations[0].ReservationID != "u-3" {
		t.Fatalf("second page: %+v", rest)
	}
	all := list("--limit", "1", "--all", "--route", "chat.generate")
	if len(all.Reservations) != 3 || all.NextPageToken != "" || all.Reservations[2].OperationID != "op-u-3" {
		t.Fatalf("--all with pages of 1: %+v", all)
	}
	if none := list("--subject", "tenant-8"); len(none.Reservations) != 0 || none.Backlog != "3" {
		t.Fatalf("another subject: %+v", none)
	}

	code, out, errOut = cli(t, url, "backlog", "--limit", "0")
	wantExit(t, exitUsage, code, out, errOut)
	code, out, errOut = cli(t, url, "backlog", "--all", "--page-token", first.NextPageToken)
	wantExit(t, exitUsage, code, out, errOut)
	code, out, errOut = cli(t, url, "backlog", "--page-token", "forged")
	wantExit(t, exitUsage, code, out, errOut)
}

func TestCLIDebts(t *testing.T) {
	url := startInProcess(t)
	publishTestPolicy(t, url)
	var code int
	var out, errOut string
	code, out, errOut = cli(t, url, "debts")
	wantExit(t, exitOK, code, out, errOut)
	if out != "{}\n" {
		t.Fatalf("no debt yet, printed %q", out)
	}
	// The whole burst reserved, then a settle far above the reservation:
	// the debt takes refill (100 tokens/s) many minutes to repay.
	for id, tokens := range map[string]string{"big": "600", "rest": "400"} {
		code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens="+tokens+",requests=1", "--id", id)
		wantExit(t, exitOK, code, out, errOut)
	}
	code, out, errOut = cli(t, url, "start", "--id", "big", "--operation", "op-big")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "settle", "--id", "big", "--operation", "op-big", "--units", "tokens=100600,requests=1")
	wantExit(t, exitOK, code, out, errOut)

	var listing struct {
		Accounts []struct {
			Subject  string `json:"subject"`
			Frozen   bool   `json:"frozen"`
			Balances []struct {
				Unit string `json:"unit"`
				Debt string `json:"debt"`
			} `json:"balances"`
		} `json:"accounts"`
	}
	code, out, errOut = cli(t, url, "debts", "--all", "--limit", "1")
	wantExit(t, exitOK, code, out, errOut)
	if err := json.Unmarshal([]byte(out), &listing); err != nil {
		t.Fatalf("debts printed %s: %v", out, err)
	}
	if len(listing.Accounts) != 1 || listing.Accounts[0].Subject != "tenant-7" || !listing.Accounts[0].Frozen ||
		listing.Accounts[0].Balances[0].Unit != "tokens" || listing.Accounts[0].Balances[0].Debt == "" {
		t.Fatalf("debts: %s", out)
	}
	code, out, errOut = cli(t, url, "debts", "--limit", "1001")
	wantExit(t, exitUsage, code, out, errOut)
}
