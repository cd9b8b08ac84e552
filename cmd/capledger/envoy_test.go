package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestServeEnvoyConfig: serve --envoy-config mounts ShouldRateLimit on the
// serve port, and bench --mode envoy (go-control-plane's grpc-go client)
// drives it: every call is admitted, and the ledger shows the checks as
// spent, one per op.
func TestServeEnvoyConfig(t *testing.T) {
	mapping := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(mapping, []byte(`
domains:
  - name: bench
    rules:
      - subject: {key: tenant}
        route: {value: bench.reserve}
        unit: tokens
`), 0o600); err != nil {
		t.Fatal(err)
	}
	url := startInProcess(t, "--envoy-config", mapping)
	code, out, errOut := cli(t, url, "bench", "--mode", "envoy", "--concurrency", "2", "--duration", "300ms", "--warmup", "0s", "--progress=false")
	if code != exitOK {
		t.Fatalf("bench --mode envoy: exit %d\n%s%s", code, out, errOut)
	}
	field := func(name string) int {
		m := regexp.MustCompile(`(?m)^` + name + `\s+(\d+)$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s in:\n%s", name, out)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	// The table names the client the calls went through: go-control-plane's
	// grpc-go client, whatever --protocol says (it applies to the SDK modes).
	if !regexp.MustCompile(`(?m)^protocol\s+grpc-go$`).MatchString(out) {
		t.Errorf("bench --mode envoy does not say it called over grpc-go:\n%s", out)
	}
	ops := field("ops")
	if ops == 0 || field("errors") != 0 || field("rejected") != 0 {
		t.Fatalf("bench --mode envoy:\n%s", out)
	}
	// Every counted op is a check admitted and spent; a call of each of
	// the 2 callers may finish just before the measurement starts, and one
	// may be cut off at its end, uncounted but spent.
	code, out, errOut = cli(t, url, "account", "--subject", "bench-0", "--route", "bench.reserve")
	if code != exitOK {
		t.Fatalf("account: exit %d\n%s%s", code, out, errOut)
	}
	m := regexp.MustCompile(`"spent":\s*"?(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no spent in:\n%s", out)
	}
	if spent, _ := strconv.Atoi(m[1]); spent < ops || spent > ops+4 {
		t.Fatalf("spent %d after %d admitted checks (at most 4 uncounted)", spent, ops)
	}
}

func TestServeEnvoyConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domains: [{name: a, rules: [{subject: {key: t}}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A misspelt key deep in a long file: the refusal says where it is.
	misspelt := filepath.Join(dir, "misspelt.yaml")
	if err := os.WriteFile(misspelt, []byte(`domains:
  - name: api
    rules:
      - subject: {key: tenant}
        unit: requests
      - subject: {key: user}
        unit: requests
  - name: llm
    rules:
      - subject: {key: tenant}
        unit: tokens
        id_key: x-request-id
      - subject: {key: tenant}
        route: {kye: model}
        unit: tokens
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// An estimate only an id reserves, and no id_key: every check of 0
	// hits (Envoy AI Gateway's request-time check) would be a probe.
	estimateNoID := filepath.Join(dir, "estimate.yaml")
	if err := os.WriteFile(estimateNoID, []byte("domains: [{name: llm, rules: [{subject: {key: tenant}, unit: tokens, estimate: 500}]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, says := range map[string]string{
		filepath.Join(dir, "missing.yaml"): "no such file",
		bad:                                "unit is required",
		estimateNoID:                       `domain "llm" rules[0]: estimate needs id_key`,
		misspelt:                           "envoy config " + misspelt + `: line 14: domains[1].rules[1].route: field "kye": no such field; the fields here: key, value`,
	} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--envoy-config", file)
		if code != exitUsage || !strings.Contains(out+errOut, says) {
			t.Errorf("serve --envoy-config %s: exit %d, want %d saying %q:\n%s%s", file, code, exitUsage, says, out, errOut)
		}
	}
}
