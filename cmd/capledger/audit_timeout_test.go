package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An audit whose server sends nothing within --timeout says so, naming
// the flag, whether the wait ran out before the stream's first answer or
// between its messages; never a bare "context canceled".
func TestAuditTimeoutNamesTheFlag(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // a server that never answers the audit
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	for _, timeout := range []string{"200ms", "1ns"} {
		code, out, errOut := cli(t, srv.URL, "audit", "--timeout", timeout)
		wantExit(t, exitUnavailable, code, out, errOut)
		if !strings.Contains(errOut, "--timeout") {
			t.Fatalf("audit --timeout %s against a silent server says %q, want it to name --timeout", timeout, errOut)
		}
	}
}
