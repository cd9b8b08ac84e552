package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An audit whose server sends nothing within --timeout says so, naming
// the flag, whether the wait ran out before the stream's first answer or
// between its messages; never a bare "context canceled".
func TestAuditTimeoutNamesTheFlag(t *testing.T) {
	srv := silentServer(t)
	for _, timeout := range []string{"200ms", "1ns"} {
		code, out, errOut := cli(t, srv.URL, "audit", "--timeout", timeout)
		wantExit(t, exitUnavailable, code, out, errOut)
		if !strings.Contains(errOut, "--timeout") {
			t.Fatalf("audit --timeout %s against a silent server says %q, want it to name --timeout", timeout, errOut)
		}
	}
}

// An audit interrupted (Ctrl-C: main's signal context ends) exits 130
// and says "interrupted", not 5 "server unavailable": the server was
// fine, the operator stopped the command.
func TestInterruptedAuditExits130(t *testing.T) {
	srv := silentServer(t) // a server still working on the audit
	var stdout, stderr strings.Builder
	e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string {
		if k == "CAPLEDGER_ADDR" {
			return srv.URL
		}
		return ""
	}}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel) // the Ctrl-C
	code := run(ctx, e, []string{"audit", "--timeout", "1m"})
	wantExit(t, exitInterrupted, code, stdout.String(), stderr.String())
	if !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("an interrupted audit says %q, want \"interrupted\"", stderr.String())
	}
}

// silentServer is an HTTP server that answers nothing until the client
// gives up or the test ends.
func silentServer(t *testing.T) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	return srv
}

// The built binary, not run(): SIGINT (Ctrl-C) and SIGTERM while a
// command waits for its server end it with exit 130 and "interrupted"
// (the exit codes of every command's --help), for the streamed audit
// and a unary call alike.
func TestSignalledCommandExits130(t *testing.T) {
	bin := buildBinary(t)
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select { // a server still working on the answer
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		for _, args := range [][]string{{"audit"}, {"get", "--id", "r-1"}} {
			cmd := exec.Command(bin, append(args, "--addr", srv.URL, "--timeout", "1m")...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-arrived:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				t.Fatalf("%v: no request arrived", args)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted || !strings.Contains(stderr.String(), "interrupted") {
				t.Errorf("%v after %s: %v, stderr %q; want exit %d and \"interrupted\"", args, sig, err, stderr.String(), exitInterrupted)
			}
		}
	}
}
