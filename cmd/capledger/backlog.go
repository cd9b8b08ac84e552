package main

import (
	"context"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "backlog", summary: "list the USAGE_UNKNOWN backlog, longest-waiting first (admin, viewer)", help: backlogHelp, run: runBacklog})
}

const backlogHelp = `Usage: capledger backlog [--subject S] [--route R] [--limit N | --all] [flags]

Backlog lists reservations in USAGE_UNKNOWN: started work whose usage
nobody reported (a gateway called MarkUsageUnknown, or the work passed its
policy's execution limit). Their capacity stays reserved until a settle
with the operation receipt resolves them. The longest-waiting (earliest
"usageUnknownAt", when each was marked) come first; "backlog" and
"oldestUsageUnknownAt" count the whole backlog, whatever the filters.
With serve --resolver-config, reservations past their route's
unknownDeadline come first in each page and are listed in
"overdueReservationIds" ("overdue" counts them store-wide).

Needs an admin or viewer token (a gateway token is refused: the list
spans tenants). A viewer scoped to some tenants (subjects=, routes=)
lists only their reservations and gets none of the store-wide figures
("backlog", "oldestUsageUnknownAt", "overdue"); its page may hold fewer
than --limit reservations, or none, and still have a nextPageToken: the
server reads a bounded number of rows per call; keep paging (--all does).

To resolve one: find the real usage of its operationId (the executor's or
backend's record, the gateway's receipt log), then
  capledger settle --id ID --operation OP --units tokens=N,requests=M
(naming every unit it reserved, as in reservedUnits; 0 where none was used).
Do not settle 0 unless you know the work never ran.

Flags:
  --subject S        only this subject
  --route R          only this route
` + pageFlagsHelp + `
Example:
  capledger backlog --route chat.generate --all

` + clientFlagsHelp + "\n" + exitCodesHelp

func runBacklog(ctx context.Context, e *env, args []string) error {
	fs := newFlags("backlog")
	var cf clientFlags
	cf.register(fs, e)
	var pf pageFlags
	pf.register(fs)
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
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
	msg, err := listPages(ctx, &pf, func(ctx context.Context, token string) (*v1.ListUsageUnknownResponse, error) {
		return unary(ctx, cf.timeout, client.ListUsageUnknown, &v1.ListUsageUnknownRequest{
			Subject: *subject, Route: *route, PageSize: int32(pf.limit), PageToken: token,
		})
	}, func(sofar, next *v1.ListUsageUnknownResponse) *v1.ListUsageUnknownResponse {
		next.Reservations = append(sofar.Reservations, next.Reservations...)
		next.OverdueReservationIds = append(sofar.OverdueReservationIds, next.OverdueReservationIds...)
		return next
	})
	if err != nil {
		return err
	}
	if msg.GetResolverConfigured() {
		// With deadlines, none overdue is an empty list, not no list.
		return printJSONList(e.stdout, msg, "overdue_reservation_ids")
	}
	return printJSONList(e.stdout, msg)
}
