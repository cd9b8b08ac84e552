package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/proto"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
)

func init() {
	register(&command{name: "reserve", summary: "reserve estimated capacity (prints the RESERVED receipt)", help: reserveHelp, run: runReserve})
	register(&command{name: "start", summary: "mark a reservation started, binding an operation id", help: startHelp, run: runStart})
	register(&command{name: "settle", summary: "settle actual usage; the unused rest is refunded once", help: settleHelp, run: runSettle})
	register(&command{name: "record", summary: "record usage nothing was reserved for (never refused for capacity: the rest is debt)", help: recordHelp, run: runRecord})
	register(&command{name: "release", summary: "give an unstarted reservation back in full", help: releaseHelp, run: runRelease})
	register(&command{name: "mark-unknown", summary: "record that started work's usage is unknown", help: markUnknownHelp, run: runMarkUnknown})
	register(&command{name: "get", summary: "read a reservation by id (recovery after a lost answer)", help: getHelp, run: runGet})
}

const reserveHelp = `Usage: capledger reserve --subject S --route R --units unit=n[,unit=n] [--id ID] [flags]

Reserve moves the estimated units from the subject's available capacity to
reserved, in every dimension at once or in none, and prints the RESERVED
receipt (limitReservation.v1). Run the request only after this succeeds,
then "capledger start" it and "capledger settle" the actual usage.

The reservation id is the idempotency key. Without --id a new ULID is
generated and printed; if the answer is lost, retry with the SAME id (or
"capledger get ID"): a retry returns the same receipt and never debits
twice. The same id with a different request is refused (exit 4).

Flags:
  --subject S       concrete subject, e.g. tenant-7 (required)
  --route R         route, e.g. chat.generate (required)
  --region REGION   region (default global)
  --units SPEC      estimate by unit name, e.g. tokens=600,requests=1 (required)
  --id ID           reservation id (default: a new ULID)
  --digest D        canonical request digest (default: derived by the server
                    from subject, route, region and units)
  --legacy allow|deny  the legacy limiter's decision for this request, for
                    the shadow comparison ("capledger rollout report")
`

const startHelp = `Usage: capledger start ID --operation OP [flags]   (or: --id ID)

Start moves a RESERVED reservation to STARTED and binds the operation id
(compare-and-set: expiry can no longer take it back). Call it right before
the work begins; settle must present the same operation id. Starting again
with the same operation id is a harmless replay; after expiry or release it
fails with exit 4.

Flags:
  --id ID           reservation id (required, here or as the argument)
  --operation OP    operation id of the execution (required)
`

const settleHelp = `Usage: capledger settle ID --operation OP --units unit=n[,unit=n] [flags]   (or: --id ID)

Settle records the actual usage of started work and refunds the unused
difference exactly once (printed as refundedUnits). Usage above the
reservation takes available capacity first; the rest becomes debt, the
reservation ends SETTLED_WITH_DEBT and the subject's route admits nothing
until refills repay it. Settling a USAGE_UNKNOWN reservation resolves it.
Retrying the same settle replays the receipt with nothing refunded twice;
once retention has removed the reservation (serve --retention, default
72h after it ended) a retry answers exit 4, RESERVATION_ALREADY_SETTLED,
and still refunds nothing.

Flags:
  --id ID           reservation id (required, here or as the argument)
  --operation OP    operation id given to start (required)
  --units SPEC      actual usage by unit name, e.g. tokens=200,requests=1:
                    every unit the reservation reserved, 0 where none was
                    used (a unit left out is refused, exit 1: an omitted
                    unit never reads as "used nothing"); a unit it did not
                    reserve may be named for overuse
`

const recordHelp = `Usage: capledger record --subject S --route R --units unit=n[,unit=n] [--id ID] [flags]

Record records usage learned only after the work ran, for which nothing
was reserved (RecordUsage, docs/API.md). It is never refused for lack of
capacity: the usage takes available capacity first, the rest becomes debt
(SETTLED_WITH_DEBT), and the subject's route admits nothing until refills
repay it. The receipt holds nothing and carries the usage.

The reservation id is the idempotency key. Without --id a new ULID is
generated and printed; if the answer is lost, retry with the SAME id and
usage: a retry replays and charges nothing twice. The same id with other
usage is refused (exit 4, RESERVATION_ALREADY_SETTLED); once retention has
removed the record (serve --retention, default 72h after it), its
tombstone keeps no usage, so any retry with the same subject, route and
region replays (exit 0, "retired": true) and still charges nothing.

Flags:
  --subject S       concrete subject, e.g. tenant-7 (required)
  --route R         route, e.g. chat.generate (required)
  --region REGION   region (default global)
  --units SPEC      usage by unit name, e.g. tokens=1800 (required)
  --id ID           reservation id (default: a new ULID)
  --operation OP    operation id (default: the reservation id)
`

const releaseHelp = `Usage: capledger release ID [flags]   (or: capledger release --id ID [flags])

Release gives an unstarted (RESERVED) reservation back in full, e.g. when
the request was cancelled before it ran. Started work cannot be released
(exit 4): it may be using its capacity, so settle it instead.

Flags:
  --id ID           reservation id (required, here or as the argument)
`

const markUnknownHelp = `Usage: capledger mark-unknown ID [flags]   (or: capledger mark-unknown --id ID [flags])

Mark-unknown records that the outcome of STARTED work is unknown (the
executor crashed, its answer was lost). The capacity stays reserved and is
never treated as unused; only a settle with the operation id resolves it.

Flags:
  --id ID           reservation id (required, here or as the argument)
`

const getHelp = `Usage: capledger get ID [flags]   (or: capledger get --id ID [flags])

Get prints a reservation (limitReservation.v1) by id: its state, reserved,
actual and overdraft units, operation id and times. It is the recovery
path when a reserve answer was lost (RESERVATION_UNKNOWN): exit 3 means
the id was never admitted, anything else is its receipt. Never reserve
again under a new id for the same request. A reservation retention
removed prints its tombstone ("retired": true, its terminal state, no
units) until the tombstone horizon (serve --tombstone-retention, default
30 days after it ended); after that its id is unknown (exit 3) like one
never used.

It prints the reservation itself: {"reservationId": ..., "state": ...},
read with jq .state. Reserve, start, settle, release and mark-unknown
print their answer, the reservation under "reservation": jq
'.reservation.state'.
`

func examples(lines ...string) string {
	out := "\nExample:\n"
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out + "\n" + clientFlagsHelp + "\n" + exitCodesHelp
}

func init() {
	for name, ex := range map[string]string{
		"reserve":      examples("capledger reserve --subject tenant-7 --route chat.generate --units tokens=600,requests=1 --id req-42"),
		"start":        examples("capledger start req-42 --operation exec-42"),
		"settle":       examples("capledger settle req-42 --operation exec-42 --units tokens=200,requests=1"),
		"record":       examples("capledger record --subject tenant-7 --route chat.generate --units tokens=1800 --id resp-42"),
		"release":      examples("capledger release req-42"),
		"mark-unknown": examples("capledger mark-unknown req-42"),
		"get":          examples("capledger get req-42"),
	} {
		commands[name].help += ex
	}
}

func runReserve(ctx context.Context, e *env, args []string) error {
	fs := newFlags("reserve")
	var cf clientFlags
	cf.register(fs, e)
	id := fs.String("id", "", "")
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	unitSpec := fs.String("units", "", "")
	digest := fs.String("digest", "", "")
	legacy := fs.String("legacy", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *legacy != "" && *legacy != "allow" && *legacy != "deny" {
		return usagef("--legacy %q: want allow or deny (the legacy limiter's decision, for the shadow comparison)", *legacy)
	}
	if *subject == "" || *route == "" || *unitSpec == "" {
		return usagef("--subject, --route and --units are required")
	}
	units, err := parseUnits("units", *unitSpec)
	if err != nil {
		return err
	}
	client, err := cf.client() // a bad --addr first: no id to retry with is printed for a call never sent
	if err != nil {
		return err
	}
	if *id == "" {
		*id = ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
		fmt.Fprintf(e.stderr, "reservation id %s (retry with --id %s if the answer is lost)\n", *id, *id)
	}
	msg, err := unary(ctx, cf.timeout, client.Reserve, &v1.ReserveRequest{
		ReservationId: *id, RequestDigest: *digest, Subject: *subject, Route: *route, Region: *region, Units: units,
		LegacyDecision: *legacy,
	})
	if err != nil {
		return err
	}
	if msg.GetShadowRejected() {
		r := msg.GetShadowRejection()
		fmt.Fprintf(e.stderr, "shadow mode: enforcement would have rejected this (%s on %q); nothing was reserved\n",
			r.GetReason(), r.GetLimitingDimension())
	}
	return printJSON(e.stdout, msg)
}

func runStart(ctx context.Context, e *env, args []string) error {
	fs := newFlags("start")
	var cf clientFlags
	cf.register(fs, e)
	id := fs.String("id", "", "")
	operation := fs.String("operation", "", "")
	if err := parseWithID(fs, id, args); err != nil {
		return err
	}
	if *operation == "" {
		return usagef("--operation is required")
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.Start, &v1.StartRequest{ReservationId: *id, OperationId: *operation})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}

func runSettle(ctx context.Context, e *env, args []string) error {
	fs := newFlags("settle")
	var cf clientFlags
	cf.register(fs, e)
	id := fs.String("id", "", "")
	operation := fs.String("operation", "", "")
	unitSpec := fs.String("units", "", "")
	if err := parseWithID(fs, id, args); err != nil {
		return err
	}
	if *operation == "" {
		return usagef("--operation is required")
	}
	units, err := parseUnits("units", *unitSpec)
	if err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.Settle, &v1.SettleRequest{ReservationId: *id, OperationId: *operation, ActualUnits: units})
	if err != nil {
		return err
	}
	return printJSON(e.stdout, msg)
}

func runRecord(ctx context.Context, e *env, args []string) error {
	fs := newFlags("record")
	var cf clientFlags
	cf.register(fs, e)
	id := fs.String("id", "", "")
	operation := fs.String("operation", "", "")
	subject := fs.String("subject", "", "")
	route := fs.String("route", "", "")
	region := fs.String("region", "", "")
	unitSpec := fs.String("units", "", "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *subject == "" || *route == "" || *unitSpec == "" {
		return usagef("--subject, --route and --units are required")
	}
	units, err := parseUnits("units", *unitSpec)
	if err != nil {
		return err
	}
	client, err := cf.client() // as reserve's
	if err != nil {
		return err
	}
	if *id == "" {
		*id = ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
		fmt.Fprintf(e.stderr, "reservation id %s (retry with --id %s if the answer is lost)\n", *id, *id)
	}
	if *operation == "" {
		*operation = *id
	}
	msg, err := unary(ctx, cf.timeout, client.RecordUsage, &v1.RecordUsageRequest{
		ReservationId: *id, OperationId: *operation, Subject: *subject, Route: *route, Region: *region, ActualUnits: units,
	})
	if err != nil {
		return err
	}
	if msg.GetReservation().GetState() == v1.ReservationState_RESERVATION_STATE_SETTLED_WITH_DEBT && !msg.GetReplayed() {
		fmt.Fprintf(e.stderr, "recorded beyond the free capacity: the rest is debt, and the route admits nothing until refills repay it\n")
	}
	return printJSON(e.stdout, msg)
}

func runRelease(ctx context.Context, e *env, args []string) error {
	return runByID(ctx, e, args, "release", capledgerv1connect.LedgerServiceClient.Release,
		func(id string) *v1.ReleaseRequest { return &v1.ReleaseRequest{ReservationId: id} },
		func(m *v1.ReleaseResponse) proto.Message { return m })
}

func runMarkUnknown(ctx context.Context, e *env, args []string) error {
	return runByID(ctx, e, args, "mark-unknown", capledgerv1connect.LedgerServiceClient.MarkUsageUnknown,
		func(id string) *v1.MarkUsageUnknownRequest { return &v1.MarkUsageUnknownRequest{ReservationId: id} },
		func(m *v1.MarkUsageUnknownResponse) proto.Message { return m })
}

func runGet(ctx context.Context, e *env, args []string) error {
	return runByID(ctx, e, args, "get", capledgerv1connect.LedgerServiceClient.GetReservation,
		func(id string) *v1.GetReservationRequest { return &v1.GetReservationRequest{ReservationId: id} },
		func(m *v1.GetReservationResponse) proto.Message { return m.GetReservation() })
}

// runByID runs a command that names one reservation and has no other
// flags of its own (release, mark-unknown, get): one call of the
// LedgerService with the request made of the id, printing what show picks
// of the answer.
func runByID[Req, Res any](ctx context.Context, e *env, args []string, name string,
	call func(capledgerv1connect.LedgerServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
	request func(id string) *Req, show func(*Res) proto.Message) error {
	cf, id, err := parseIDFlags(name, e, args)
	if err != nil {
		return err
	}
	client, err := cf.client()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Res], error) {
		return call(client, ctx, req)
	}, request(id))
	if err != nil {
		return err
	}
	return printJSON(e.stdout, show(msg))
}

// parseIDFlags parses the flags of a command run by runByID.
func parseIDFlags(name string, e *env, args []string) (*clientFlags, string, error) {
	fs := newFlags(name)
	cf := &clientFlags{}
	cf.register(fs, e)
	id := fs.String("id", "", "")
	if err := parseWithID(fs, id, args); err != nil {
		return nil, "", err
	}
	return cf, *id, nil
}

// parseWithID parses fs, whose --id flag is id, for a command that names
// one reservation by --id or as its only argument (every command that
// acts on one reservation: start, settle, release, mark-unknown, get). It
// sets *id and returns a usage error for more than one argument, two
// different ids, or none.
func parseWithID(fs *flag.FlagSet, id *string, args []string) error {
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(positional) > 1:
		return usagef("want one reservation id, got %d arguments", len(positional))
	case len(positional) == 1 && *id != "" && positional[0] != *id:
		return usagef("reservation id given twice (%q and --id %q)", positional[0], *id)
	case len(positional) == 1:
		*id = positional[0]
	}
	if *id == "" {
		return usagef("a reservation id is required (--id ID or as the argument)")
	}
	return nil
}
