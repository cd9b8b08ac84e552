package main

import (
	"context"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "debts", summary: "list the accounts frozen by debt (admin, viewer)", help: debtsHelp, run: runDebts})
}

const debtsHelp = `Usage: capledger debts [--limit N | --all] [flags]

Debts lists the accounts that owe debt now: a settle reported more usage
than was reserved, available capacity could not cover the rest, and the
subject's route admits nothing (429 ADMISSION_FROZEN) until refill repays
it. Balances are shown as "capledger account" shows them, with the refill
due up to now, in key order (subject, route, region, generation). It ends
by itself; do not roll back or republish to unfreeze a tenant.

Needs an admin or viewer token (a gateway token is refused: the list
spans tenants); a viewer scoped to some tenants (subjects=, routes=)
lists only theirs. A page may hold fewer than --limit accounts, or none,
and still have a nextPageToken: the server stops after reading a bounded
number of rows; keep paging (--all does).

Flags:
` + pageFlagsHelp + `
Example:
  capledger debts --all

` + clientFlagsHelp + "\n" + exitCodesHelp

func runDebts(ctx context.Context, e *env, args []string) error {
	fs := newFlags("debts")
	var cf clientFlags
	cf.register(fs, e)
	var pf pageFlags
	pf.register(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := pf.check(); err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := listPages(ctx, &pf, func(ctx context.Context, token string) (*v1.ListDebtsResponse, error) {
		return unary(ctx, cf.timeout, client.ListDebts, &v1.ListDebtsRequest{PageSize: int32(pf.limit), PageToken: token})
	}, func(sofar, next *v1.ListDebtsResponse) *v1.ListDebtsResponse {
		next.Accounts = append(sofar.Accounts, next.Accounts...)
		return next
	})
	if err != nil {
		return err
	}
	return printJSONList(e.stdout, msg)
}
