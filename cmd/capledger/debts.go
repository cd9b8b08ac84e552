package main

import (
	"context"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "debts", summary: "list the accounts frozen by debt (admin)", help: debtsHelp, run: runDebts})
}

const debtsHelp = `Usage: capledger debts [--limit N | --all] [flags]

Debts lists the accounts that owe debt now: a settle reported more usage
than was reserved, available capacity could not cover the rest, and the
subject's route admits nothing (429 ADMISSION_FROZEN) until refill repays
it. Balances are shown as "capledger account" shows them, with the refill
due up to now, in key order (subject, route, region, generation). It ends
by itself; do not roll back or republish to unfreeze a tenant. Needs an
admin token.

A page may hold fewer than --limit accounts and still have a
nextPageToken: the server stops after reading a bounded number of rows.

Flags:
  --limit N          accounts per page (default 100, at most 1000)
  --page-token T     the nextPageToken of the previous page
  --all              follow every page and print them as one list

Example:
  capledger debts --all

` + clientFlagsHelp + "\n" + exitCodesHelp

func runDebts(ctx context.Context, e *env, args []string) error {
	fs := newFlags("debts")
	var cf clientFlags
	cf.register(fs, e)
	limit := fs.Int("limit", 100, "")
	token := fs.String("page-token", "", "")
	all := fs.Bool("all", false, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *limit < 1 || *limit > 1000 {
		return usagef("--limit must be in [1, 1000]")
	}
	if *all && *token != "" {
		return usagef("--all starts at the first page; leave out --page-token")
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	req := &v1.ListDebtsRequest{PageSize: int32(*limit), PageToken: *token}
	msg, err := unary(ctx, cf.timeout, client.ListDebts, req)
	if err != nil {
		return err
	}
	for *all && msg.GetNextPageToken() != "" {
		req.PageToken = msg.GetNextPageToken()
		next, err := unary(ctx, cf.timeout, client.ListDebts, req)
		if err != nil {
			return err
		}
		next.Accounts = append(msg.Accounts, next.Accounts...)
		msg = next
	}
	return printJSON(e.stdout, msg)
}
