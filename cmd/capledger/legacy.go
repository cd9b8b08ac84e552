package main

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

func init() {
	register(&command{name: "legacy", summary: "carve the legacy rate limiter's budget out of the ledger", help: legacyHelp, subs: []subcommand{{"carve", runLegacyCarve}}})
}

const legacyHelp = `Usage:
  capledger legacy carve --identity NAME --subject S --route R --units SPEC --ttl DUR --id ID [--region REGION]

Carves the legacy rate limiter's budget: the units move from the subject's
available capacity to retiredForEmergency in one command, so the ledger
never admits them again, into a budget (an emergencyShard.v1 record) bound
to the legacy limiter's identity, NAME: the name of its token in the
tokens file. The deciding policy's emergency mode is not needed, and no
gateway can take the budget or a shard meanwhile. Needs an admin token.

The legacy limiter spends at most the budget's allocatedUnits until
expiresAt, then reports what it admitted with its own token (a gateway
token named NAME):
  capledger shard reconcile ID --gateway legacy:NAME --receipts FILE
The ledger remints only allocated - spent - unknown; a report with nothing
spent and nothing unknown is refused (exit 4, LEGACY_WHOLE_BLOCK): a
legacy budget never returns its whole block. "capledger shard list" shows
every budget (gateway legacy:NAME).

Flags:
  --identity NAME   the legacy limiter's token name (required)
  --subject S, --route R, --region REGION   the capacity (region default global)
  --units SPEC      e.g. tokens=200 (required)
  --ttl DUR         how long it may be spent, 1s to serve --shard-max-ttl (required)
  --id ID           the budget's id, its idempotency key (required)

Example:
  capledger legacy carve --identity legacy-limiter --subject tenant-7 --route chat.generate \
      --units tokens=200 --ttl 24h --id legacy-tenant-7-chat

` + clientFlagsHelp + "\n" + exitCodesHelp

func runLegacyCarve(ctx context.Context, e *env, args []string) error {
	fs := newFlags("legacy carve")
	var cf clientFlags
	cf.register(fs, e)
	identity := fs.String("identity", "", "")
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	unitSpec := fs.String("units", "", "")
	ttl := fs.Duration("ttl", 0, "")
	id := fs.String("id", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *ttl != 0 {
		if err := durationIn("ttl", *ttl, time.Second, maxAPIDuration); err != nil {
			return err
		}
	}
	if *identity == "" || *subject == "" || *route == "" || *unitSpec == "" || *ttl == 0 || *id == "" {
		return usagef("--identity, --subject, --route, --units, --ttl and --id are required")
	}
	units, err := parseUnits("units", *unitSpec)
	if err != nil {
		return err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.CarveLegacyBudget, &v1.CarveLegacyBudgetRequest{BudgetId: *id, Identity: *identity,
		Subject: *subject, Route: *route, Region: *region, Units: units, Ttl: durationpb.New(*ttl)})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}
