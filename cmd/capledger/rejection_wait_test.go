package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// A capacity rejection names its wait once: the RejectionDetail's
// retryAfter and the Retry-After header carry the same seconds, and the
// message once read "retry after 200s; Retry-After: 200s".
func TestCLIRejectionNamesItsWaitOnce(t *testing.T) {
	url := startInProcess(t)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(policy, []byte(`subject: tenant-7
route: chat.generate
dimensions:
  - unit: tokens
    burst: 1000
    refillUnits: 1
    refillInterval: 1s
`), 0o600)
	code, out, errOut := cli(t, url, "policy", "publish", policy)
	wantExit(t, exitOK, code, out, errOut)
	// 500 spent leaves 500 available: 700 fits after about 200 s of
	// refill, so the rejection carries a Retry-After.
	code, out, errOut = cli(t, url, "record", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=500", "--id", "rec-1")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=700", "--id", "req-1")
	wantExit(t, exitRejected, code, out, errOut)
	if n := strings.Count(strings.ToLower(errOut), "retry after") + strings.Count(strings.ToLower(errOut), "retry-after"); n != 1 {
		t.Fatalf("the wait is named %d times, want once: %s", n, errOut)
	}
	if !strings.Contains(errOut, "INSUFFICIENT_CAPACITY") || !strings.Contains(errOut, "retry after ") {
		t.Fatalf("rejection message: %s", errOut)
	}
}

// A 429 without a RejectionDetail (a proxy's) still shows its header.
func TestDescribeShowsABareRetryAfter(t *testing.T) {
	cerr := connect.NewError(connect.CodeResourceExhausted, errors.New("too many requests"))
	cerr.Meta().Set("Retry-After", "7")
	if got := describe(cerr).Error(); !strings.Contains(got, "Retry-After: 7s") {
		t.Fatalf("describe: %s", got)
	}
}
