package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
	if out != "{\n  \"accounts\": []\n}\n" {
		t.Fatalf("no debt yet, printed %q; want an empty list of accounts", out)
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

// backlog and debts say which tokens the server lets list (--help), and
// the server does: an admin and a viewer list every tenant's rows, a
// viewer scoped to some tenants only theirs (and no store-wide counts),
// a gateway token is refused (exit 1, permission denied). Their help said
// "Needs an admin token" before.
func TestCLIBacklogAndDebtsTokens(t *testing.T) {
	const admin, viewer, scoped, gateway = "cli-admin-token-0001", "cli-viewer-token-0001", "cli-scoped-token-0001", "cli-gateway-token-0001"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(admin+" admin ops\n"+viewer+" viewer oncall\n"+
		scoped+" viewer team-8 subjects=tenant-8\n"+gateway+" gateway gw-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--tokens", tokens)
	policyPath := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", "--token", admin, policyPath)
	wantExit(t, exitOK, code, out, errOut)
	for _, step := range [][]string{
		{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10,requests=1", "--id", "u-1"},
		{"start", "--id", "u-1", "--operation", "op-u-1"},
		{"mark-unknown", "--id", "u-1"},
		{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600,requests=1", "--id", "big"},
		{"start", "--id", "big", "--operation", "op-big"},
		{"settle", "--id", "big", "--operation", "op-big", "--units", "tokens=100600,requests=1"},
	} {
		code, out, errOut = cli(t, url, append(step, "--token", gateway)...)
		wantExit(t, exitOK, code, out, errOut)
	}

	for _, c := range []struct {
		command, rows, help string
	}{
		{"backlog", "reservations", "Needs an admin or viewer token"},
		{"debts", "accounts", "Needs an admin or viewer token"},
	} {
		code, out, errOut = cli(t, url, c.command, "--help")
		if !strings.Contains(out+errOut, c.help) || strings.Contains(out+errOut, "Needs an admin token") {
			t.Errorf("%s --help does not say %q:\n%s%s", c.command, c.help, out, errOut)
		}
		for _, tc := range []struct {
			token string
			exit  int
			rows  int
		}{{admin, exitOK, 1}, {viewer, exitOK, 1}, {scoped, exitOK, 0}, {gateway, exitUsage, 0}} {
			code, out, errOut = cli(t, url, c.command, "--all", "--token", tc.token)
			wantExit(t, tc.exit, code, out, errOut)
			if tc.exit != exitOK {
				if !strings.Contains(errOut, "permission") {
					t.Errorf("%s with a gateway token says %q", c.command, errOut)
				}
				continue
			}
			var page map[string]any
			if err := json.Unmarshal([]byte(out), &page); err != nil {
				t.Fatalf("%s printed %s: %v", c.command, out, err)
			}
			if rows, _ := page[c.rows].([]any); len(rows) != tc.rows {
				t.Errorf("%s with %s listed %d %s, want %d", c.command, tc.token, len(rows), c.rows, tc.rows)
			}
			if _, counted := page["backlog"]; c.command == "backlog" && counted != (tc.token != scoped) {
				t.Errorf("backlog with %s: store-wide count shown %v: %s", tc.token, counted, out)
			}
		}
	}
}
