package main

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/server"
)

// policyChangingGate is a reverse proxy in front of a server that answers
// the first changing DrainProgress calls as the server answers one whose
// generation's key was published to during each of its passes (503
// POLICY_CHANGING with a Retry-After of 1 s), then lets them through.
type policyChangingGate struct {
	changing int64
	polls    atomic.Int64
	url      string
	// retryAfter is the answers' Retry-After ("1" unless set before the
	// first call).
	retryAfter string
}

func newPolicyChangingGate(t *testing.T, target string, changing int64) *policyChangingGate {
	g := &policyChangingGate{changing: changing, retryAfter: "1"}
	errs := connect.NewErrorWriter()
	g.url = proxyDrainPolls(t, target, func(w http.ResponseWriter, r *http.Request, proxy http.Handler) {
		if g.polls.Add(1) <= g.changing {
			cerr := connect.NewError(connect.CodeUnavailable,
				errors.New("drain progress of generation 2: its key's active generation changed during each of 4 passes; ask again"))
			if detail, err := connect.NewErrorDetail(&v1.ErrorDetail{Reason: server.ReasonPolicyChanging}); err == nil {
				cerr.AddDetail(detail)
			}
			cerr.Meta().Set("Retry-After", g.retryAfter)
			_ = errs.Write(w, r, cerr)
			return
		}
		proxy.ServeHTTP(w, r)
	})
	return g
}

// `rollback GEN --wait` whose drain polls are answered POLICY_CHANGING
// (the generation's key published to during each of the server's
// passes), from the very first on, keeps following: it polls again after
// the server's Retry-After (1 s, longer than --interval), saying why, and
// ends drained (exit 0) once a poll answers. With --max-wait 0 (one poll)
// the answer is the command's: exit 5.
func TestRollbackWaitKeepsWaitingWhileItsKeyChanges(t *testing.T) {
	srv := startInProcess(t)
	publishTwoGenerations(t, srv)

	gate := newPolicyChangingGate(t, srv, 3) // the bar's start and the first two polls
	code, out, errOut := cliWithin(t, 60*time.Second, gate.url, "rollback", "2", "--wait", "--interval", "50ms", "--max-wait", "50s", "--timeout", "5s")
	wantExit(t, exitOK, code, out, errOut)
	if n := strings.Count(errOut, "its key is being published to or rolled back, polling again in 1s"); n != 2 || gate.polls.Load() != 4 ||
		!strings.Contains(errOut, "POLICY_CHANGING") {
		t.Fatalf("%d polls, %d shown as changing; want 4 and 2\nstdout: %s\nstderr: %s", gate.polls.Load(), n, out, errOut)
	}

	once := newPolicyChangingGate(t, srv, 1)
	code, out, errOut = cliWithin(t, 60*time.Second, once.url, "rollback", "--status", "2", "--max-wait", "0", "--timeout", "5s")
	wantExit(t, exitUnavailable, code, out, errOut)
	if !strings.Contains(errOut, "POLICY_CHANGING") {
		t.Fatalf("without --wait: stderr %s; want the reason shown", errOut)
	}
}

// A Retry-After longer than what is left of --max-wait (a server whose
// passes take minutes, a short --max-wait) does not stretch the follow
// past --max-wait: `rollback --wait` polls again when --max-wait is up,
// saying so, and a poll then still POLICY_CHANGING ends it, exit 5.
func TestRollbackWaitOnPolicyChangingEndsAtMaxWait(t *testing.T) {
	srv := startInProcess(t)
	publishTwoGenerations(t, srv)

	gate := newPolicyChangingGate(t, srv, 1<<30) // changing throughout
	gate.retryAfter = "3600"
	code, out, errOut := cliWithin(t, 60*time.Second, gate.url, "rollback", "2", "--wait", "--interval", "50ms", "--max-wait", "2s", "--timeout", "5s")
	wantExit(t, exitUnavailable, code, out, errOut)
	waits := regexp.MustCompile(`polling again in (\S+):`).FindAllStringSubmatch(errOut, -1)
	if len(waits) == 0 || !strings.Contains(errOut, "POLICY_CHANGING") {
		t.Fatalf("no wait shown for POLICY_CHANGING\nstderr: %s", errOut)
	}
	for _, w := range waits {
		if d, err := time.ParseDuration(w[1]); err != nil || d > 2*time.Second {
			t.Fatalf("polling again in %s with --max-wait 2s; want at most what is left of --max-wait\nstderr: %s", w[1], errOut)
		}
	}
}
