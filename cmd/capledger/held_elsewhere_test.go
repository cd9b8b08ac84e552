package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capledger account prints heldElsewhere on the current generation's
// account (its help: what the subject's other generations still hold
// reserved in the unit): 600 tokens held under generation 1, generation
// 2 published and switched to; once that hold is released it is gone.
func TestCLIAccountShowsHeldElsewhere(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	for i, ttl := range []string{"30s", "40s"} {
		path := filepath.Join(dir, "policy.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(policyYAML, "holdTtl: 30s", "holdTtl: "+ttl, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := cli(t, url, "policy", "publish", path)
		wantExit(t, exitOK, code, out, errOut)
		id := []string{"old", "new"}[i]
		units := []string{"tokens=600", "tokens=100"}[i]
		code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", units, "--id", id)
		wantExit(t, exitOK, code, out, errOut)
	}
	// heldElsewhere of tokens on each generation's account, "" when absent.
	held := func() []any {
		t.Helper()
		code, out, errOut := cli(t, url, "account", "--subject", "tenant-7", "--route", "chat.generate")
		wantExit(t, exitOK, code, out, errOut)
		var got struct {
			Accounts []struct {
				Balances []map[string]any `json:"balances"`
			} `json:"accounts"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || len(got.Accounts) != 2 {
			t.Fatalf("account printed %s (%v)", out, err)
		}
		var each []any
		for _, a := range got.Accounts {
			each = append(each, a.Balances[0]["heldElsewhere"])
		}
		return each
	}
	if got := held(); got[0] != nil || got[1] != "600" {
		t.Fatalf("tokens held elsewhere per generation %v, want none on 1 and 600 on 2", got)
	}
	code, out, errOut := cli(t, url, "release", "old")
	wantExit(t, exitOK, code, out, errOut)
	if got := held(); got[0] != nil || got[1] != nil {
		t.Fatalf("tokens held elsewhere per generation after the release %v, want none", got)
	}
}
