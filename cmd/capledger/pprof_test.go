package main

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

var profilesLine = regexp.MustCompile(`msg="serving profiles" addr=(\S+)`)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// --pprof-addr serves the runtime's profiles on a listener of its own;
// without it no profile is served, and the API's port never serves them.
func TestServePprofAddr(t *testing.T) {
	api, logs := serveInProcess(t, "--store", "memory", "--pprof-addr", "127.0.0.1:0")
	m := profilesLine.FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no profiles listener logged:\n%s", logs.String())
	}
	if code, body := httpGet(t, "http://"+m[1]+"/debug/pprof/heap?debug=1"); code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Fatalf("heap profile: %d %.200q", code, body)
	}
	if code, _ := httpGet(t, "http://"+api+"/debug/pprof/heap"); code == http.StatusOK {
		t.Fatalf("the API's port serves profiles")
	}

	_, logs = serveInProcess(t, "--store", "memory")
	if strings.Contains(logs.String(), "serving profiles") {
		t.Fatalf("profiles served without --pprof-addr:\n%s", logs.String())
	}
}

// Profiles take no token: --pprof-addr must be a loopback address.
func TestServePprofAddrLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:0", "nonsense"} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--store", "memory", "--data-dir", t.TempDir(), "--pprof-addr", addr)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "pprof-addr") {
			t.Fatalf("--pprof-addr %s: %q does not say what is wrong", addr, errOut)
		}
	}
}
