package main

import (
	"context"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "backlog", summary: "list the USAGE_UNKNOWN backlog, longest-waiting first (admin)", help: backlogHelp, run: runBacklog})
}

const backlogHelp = `Usage: capledger backlog [--subject S] [--route R] [--limit N | --all] [flags]

Backlog lists reservations in USAGE_UNKNOWN: started work whose usage
nobody reported (a gateway called MarkUsageUnknown, or the work passed its
policy's execution limit). Their capacity stays reserved until a settle
with the operation receipt resolves them. The longest-waiting come first;
"backlog" and "oldestStartedAt" count the whole backlog, whatever the
filters. Needs an admin token.

To resolve one: find the real usage of its operationId (the executor's or
backend's record, the gateway's receipt log), then
  capledger settle --id ID --operation OP --units tokens=N
Do not settle 0 unless you know the work never ran.

Flags:
  --subject S        only this subject
  --route R          only this route
  --limit N          reservations per page (default 100, at most 1000)
  --page-token T     the nextPageToken of the previous page
  --all              follow every page and print them as one list

Example:
  capledger backlog --route chat.generate --all

` + clientFlagsHelp + "\n" + exitCodesHelp

func runBacklog(ctx context.Context, e *env, args []string) error {
	fs := newFlags("backlog")
	var cf clientFlags
	cf.register(fs, e)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
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
	req := &v1.ListUsageUnknownRequest{Subject: *subject, Route: *route, PageSize: int32(*limit), PageToken: *token}
	msg, err := unary(ctx, cf.timeout, client.ListUsageUnknown, req)
	if err != nil {
		return err
	}
	for *all && msg.GetNextPageToken() != "" {
		req.PageToken = msg.GetNextPageToken()
		next, err := unary(ctx, cf.timeout, client.ListUsageUnknown, req)
		if err != nil {
			return err
		}
		// The backlog figures of the last page are the most recent.
		next.Reservations = append(msg.Reservations, next.Reservations...)
		msg = next
	}
	return printJSON(e.stdout, msg)
}
