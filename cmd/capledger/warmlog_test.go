package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// OPERATIONS.md, "/readyz answers 503": serve logs when the policy
// cache's load after a start begins and when it ends, with the policies
// read and the time taken, so the log says why a replica just started
// answers 503 (or not at all for up to 2 s).
func TestServeLogsThePolicyCacheLoad(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, dir)
	for _, subject := range []string{"tenant-1", "tenant-2", "tenant-3"} {
		policy := filepath.Join(t.TempDir(), "policy.yaml")
		os.WriteFile(policy, []byte("subject: "+subject+"\nroute: chat\nholdTTL: 1h\ndimensions:\n  - unit: tokens\n    burst: 6000\n"), 0o600)
		code, out, errOut := cli(t, srv.url, "policy", "publish", policy)
		wantExit(t, exitOK, code, out, errOut)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	srv.cmd.Wait()

	again := startServer(t, bin, dir)
	logs := again.logs.String()
	begins := strings.Index(logs, `msg="loading the policy cache (every policy, once after a start)"`)
	ends := regexp.MustCompile(`msg="policy cache loaded" policies=3 took=\S+`).FindStringIndex(logs)
	if begins < 0 || ends == nil || ends[0] < begins {
		t.Fatalf("serve's log does not say the load began, then that it read 3 policies and how long it took:\n%s", logs)
	}
}
