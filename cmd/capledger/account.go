package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

func init() {
	register(&command{name: "account", summary: "show one subject's balances and debt, every generation", help: accountHelp, run: runAccount})
	register(&command{name: "audit", summary: "check conservation of the whole ledger (exit 6 on discrepancies)", help: auditHelp, run: runAudit})
}

const accountHelp = `Usage: capledger account --subject S --route R [--region REGION] [flags]

Account prints the balances of ONE subject on one route and region, for
every policy generation it has an account under: per unit the seed's
conservation terms (opening + minted + overdraftIssued = available +
reserved + spent + retiredForEmergency + retiredForMove + overdraftRepaid),
the debt, and whether admission is frozen by debt. On the current account
heldElsewhere is what the subject's other generations still hold reserved
in the unit (absent when nothing): refill stops at burst - reserved -
heldElsewhere. It never shows another subject's balances.

Flags:
  --subject S       concrete subject (required)
  --route R         route (required)
  --region REGION   region (default global)

Example:
  capledger account --subject tenant-7 --route chat.generate

` + clientFlagsHelp + "\n" + exitCodesHelp

const auditHelp = `Usage: capledger audit [flags]
       capledger audit --data-dir DIR|FILE [--since-checkpoint] [--progress]
       capledger audit --store postgres://... [--since-checkpoint] [--progress]

Audit asks the server to read the whole ledger in one consistent snapshot
and check it: conservation of every account in every dimension, reserved
equal to the holds of live reservations, spent and debt equal to settled
usage, journal replay from the last statement checkpoint, the checkpoint
chain, exactly-once refunds and moves. It prints the discrepancies (none
for a sound ledger) and exits 6 if there are any, so it can gate a
release or page an operator. Needs an admin token.

The audit streams (AuditService.StreamAudit): the server reads a page at
a time and sends its progress about every second (later beside heavy
traffic); --timeout is how long to wait for the next message, not for
the whole audit: keep it at 5s or more (the default 10s). The server ends
the audit, unavailable (exit 5), once its store has left one of the
audit's reads unanswered for its serve --store-timeout, whatever
--timeout. A server without the stream is asked with LedgerService.Audit
instead (full audit only).

Without a server (a backup before restoring it, a data directory whose
serve will not start, PostgreSQL with every replica down), --data-dir or
--store runs the same audit here on the store opened read-only: it
migrates nothing and writes nothing to the database, and refuses (exit 1) a store whose
schema is older or newer than this binary's, saying which, and a path
that does not exist or is not a SQLite database, naming it. It reads one
consistent snapshot: a serve running on the same store meanwhile is
fine (SQLite: the last commit before the audit's read began; PostgreSQL:
one REPEATABLE READ transaction), and the audit does not see what is
committed after it began. No token, --addr or --timeout: --addr beside
--data-dir or --store is a usage error.

Flags:
  --since-checkpoint  skip the checks that read every reservation
                      (reserved vs holds, spent vs settled, unrecorded
                      debt): check the accounts and the journal since the
                      last statement checkpoint only, which costs what
                      happened since, not the history
  --progress          draw a progress bar on stderr (default: when stderr
                      is a terminal)
  --data-dir DIR      audit the SQLite store in DIR (as serve --data-dir),
                      or DIR may be the database file itself: a backup
  --store SPEC        audit the store SPEC names, as serve --store:
                      postgres://..., sqlite:PATH, or sqlite (the
                      database in --data-dir, default ./capledger-data)

Example:
  capledger audit --token $ADMIN_TOKEN && echo sound
  capledger audit --since-checkpoint --progress
  capledger audit --data-dir /backups/capledger.db
  capledger audit --store postgres://capledger@db:5432/capledger

` + clientFlagsHelp + "\n" + exitCodesHelp

func runAccount(ctx context.Context, e *env, args []string) error {
	fs := newFlags("account")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *subject == "" || *route == "" {
		return usagef("--subject and --route are required")
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.GetAccount, &v1.GetAccountRequest{Subject: *subject, Route: *route, Region: *region})
	if err != nil {
		return err
	}
	return printJSONList(e.stdout, msg)
}

func runAudit(ctx context.Context, e *env, args []string) error {
	fs := newFlags("audit")
	var cf clientFlags
	cf.register(fs, e)
	since := fs.Bool("since-checkpoint", false, "")
	progress := fs.Bool("progress", isTerminal(e.stderr), "")
	dataDir := fs.String("data-dir", "", "")
	storeSpec := fs.String("store", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *dataDir != "" || *storeSpec != "" {
		if flagGiven(fs, "addr") {
			return usagef("--addr asks a server; --data-dir and --store read the store without one: give one or the other")
		}
		dir := *dataDir
		if dir == "" {
			// --store as serve reads it: "sqlite" is the file in
			// serve's default data directory.
			dir = defaultDataDir
		}
		return auditStore(ctx, e, *storeSpec, dir, *since, *progress)
	}
	msg, err := streamAudit(ctx, &cf, *since, *progress, e.stderr)
	if connect.CodeOf(err) == connect.CodeUnimplemented && !*since {
		client, cerr := cf.client()
		if cerr != nil {
			return cerr
		}
		msg, err = unary(ctx, cf.timeout, client.Audit, &v1.AuditRequest{})
	} else if err != nil {
		err = describe(err)
	}
	if err != nil {
		return err
	}
	return printAuditReport(e.stdout, msg)
}

// printAuditReport prints an audit's answer and returns the exit 6 error
// when it found discrepancies.
func printAuditReport(w io.Writer, msg *v1.AuditResponse) error {
	if err := printJSONList(w, msg); err != nil {
		return err
	}
	if n := len(msg.GetDiscrepancies()); n > 0 {
		return exitError{code: exitDiscrepancies, err: errors.New(counted(n, "discrepancy", "discrepancies"))}
	}
	return nil
}

// streamAudit runs AuditService.StreamAudit and returns its result,
// drawing progress on bar when draw is set. timeout bounds the wait for
// each message.
func streamAudit(ctx context.Context, cf *clientFlags, since, draw bool, bar io.Writer) (*v1.AuditResponse, error) {
	base, options, err := cf.endpoint()
	if err != nil {
		return nil, err
	}
	hc, err := cf.httpClient()
	if err != nil {
		return nil, err
	}
	client := capledgerv1connect.NewAuditServiceClient(hc, base, options...)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errIdle := errors.New("idle")
	idle := time.AfterFunc(cf.timeout, func() { cancel(errIdle) })
	defer idle.Stop()
	// timedOut names --timeout when the wait for the next message ran
	// out (before the stream's first answer or between messages), as a
	// plain error so that describe does not put the bare "canceled"
	// back; an interrupt or any other error passes through.
	timedOut := func(err error) error {
		if errors.Is(context.Cause(ctx), errIdle) {
			return exitError{code: exitUnavailable, err: fmt.Errorf("no message from the audit for %s (--timeout): %v", cf.timeout, err)}
		}
		return err
	}
	stream, err := client.StreamAudit(ctx, connect.NewRequest(&v1.StreamAuditRequest{SinceCheckpoint: since}))
	if err != nil {
		return nil, timedOut(err)
	}
	defer stream.Close()
	drawn := false
	defer func() {
		if drawn {
			fmt.Fprintln(bar)
		}
	}()
	for stream.Receive() {
		idle.Reset(cf.timeout)
		switch ev := stream.Msg().Event.(type) {
		case *v1.AuditEvent_Progress:
			if draw {
				drawProgress(bar, ev.Progress.GetFraction(), ev.Progress.GetRows())
				drawn = true
			}
		case *v1.AuditEvent_Result:
			if drawn {
				drawProgress(bar, 1, -1)
			}
			return ev.Result, nil
		}
	}
	if err := stream.Err(); err != nil {
		return nil, timedOut(err)
	}
	return nil, errors.New("the audit stream ended without a result")
}

// drawProgress redraws the progress bar line: 40 cells, the percentage
// and the rows read (omitted when rows < 0).
func drawProgress(w io.Writer, fraction float64, rows int64) {
	const cells = 40
	fraction = min(max(fraction, 0), 1)
	full := int(fraction * cells)
	line := fmt.Sprintf("\raudit [%s%s] %3.0f%%", strings.Repeat("#", full), strings.Repeat("-", cells-full), fraction*100)
	if rows >= 0 {
		line += fmt.Sprintf("  %d rows", rows)
	}
	fmt.Fprint(w, line+"   ")
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
