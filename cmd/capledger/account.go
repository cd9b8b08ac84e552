package main

import (
	"context"
	"fmt"

	v1 "github.com/capledger/capledger/api/capledger/v1"
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
the debt, and whether admission is frozen by debt. It never shows another
subject's balances.

Flags:
  --subject S       concrete subject (required)
  --route R         route (required)
  --region REGION   region (default global)

Example:
  capledger account --subject tenant-7 --route chat.generate

` + clientFlagsHelp + "\n" + exitCodesHelp

const auditHelp = `Usage: capledger audit [flags]

Audit asks the server to read the whole ledger in one consistent snapshot
and check it: conservation of every account in every dimension, reserved
equal to the holds of live reservations, spent and debt equal to settled
usage, journal replay, exactly-once refunds and moves. It prints the
discrepancies (none for a sound ledger) and exits 6 if there are any, so it
can gate a release or page an operator. Needs an admin token.

Example:
  capledger audit --token $ADMIN_TOKEN && echo sound

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
	return printJSON(e.stdout, msg)
}

func runAudit(ctx context.Context, e *env, args []string) error {
	fs := newFlags("audit")
	var cf clientFlags
	cf.register(fs, e)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.Audit, &v1.AuditRequest{})
	if err != nil {
		return err
	}
	if err := printJSON(e.stdout, msg); err != nil {
		return err
	}
	if n := len(msg.GetDiscrepancies()); n > 0 {
		return exitError{code: exitDiscrepancies, err: fmt.Errorf("%d discrepancies", n)}
	}
	return nil
}
