package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

func init() {
	register(&command{name: "status", summary: "show a replica's readiness and whether it runs the workers", help: statusHelp, run: runStatus})
}

const statusHelp = `Usage: capledger status [flags]

Status prints the server's GET /statusz as JSON: whether it is ready,
whether it holds the worker lease (workers.leader: it runs expiry,
epoch close and drains; with several replicas on one PostgreSQL exactly
one does, and another takes over within the lease TTL and one renewal
period after it dies), who holds the lease (workers.holder), its fence
(grows by one with every change of leader), whether each maintenance
worker is failing (workers.health.NAME.failing and failingSince: a
failure it logged has no recovery line yet; only on the lease holder),
and the engine's counters.
Optional blocks: compaction and retention (unless serve --compaction 0
or --retention 0; only the lease holder runs them, so on another replica
their counters are what it counted since it started, 0 if it never led),
subjectIndex (SQLite: the console's subject index catching up). Ask each
replica for its own view. It exits 5 when the server is not ready or
cannot be reached, 1 when what answers at --addr is no capledger server
(404 or 405: a wrong path or port) or refuses the credentials (401 or
403: a proxy in front of it; /statusz itself needs no token).

Example:
  capledger status --addr http://10.0.0.7:7070

` + clientFlagsHelp + "\n" + exitCodesHelp

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlags("status")
	var cf clientFlags
	cf.register(fs, e)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	base, _, err := cf.endpoint()
	if err != nil {
		return err
	}
	hc, err := cf.httpClient()
	if err != nil {
		return usagef("%v", err)
	}
	ctx, cancel := cf.context(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/statusz", nil)
	if err != nil {
		return usagef("--addr: %v", err)
	}
	if cf.token != "" {
		req.Header.Set("Authorization", "Bearer "+cf.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if hint := certificateHint(err); hint != "" {
			err = fmt.Errorf("%w; %s", err, hint)
		}
		if clientCertificateRefused(err) {
			return exitError{code: exitUsage, err: err}
		}
		return exitError{code: exitUnavailable, err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return exitError{code: exitUnavailable, err: fmt.Errorf("reading the answer of %s: %w", req.URL, err)}
	}
	if resp.StatusCode != http.StatusOK {
		// What answered is not a capledger server at that address (a
		// wrong path or port, another service): exit 1, the bad --addr,
		// as a call of every other command to it (404, unimplemented);
		// no retry finds a server there. A refusal of credentials by
		// something in front of it is 1 as well; a gateway's 502, 503 or
		// 504, or a server's failure, is the unavailable server of 5.
		code := exitUnavailable
		switch resp.StatusCode {
		case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnauthorized, http.StatusForbidden:
			code = exitUsage
		}
		return exitError{code: code, err: fmt.Errorf("GET %s answered %s (is --addr a capledger server's address?)", req.URL, resp.Status)}
	}
	var st struct {
		Ready bool `json:"ready"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return exitError{code: exitUnavailable, err: fmt.Errorf("not a status answer: %w", err)}
	}
	if _, err := e.stdout.Write(body); err != nil {
		return err
	}
	if !st.Ready {
		return exitError{code: exitUnavailable, err: errors.New("the server is not ready")}
	}
	return nil
}
