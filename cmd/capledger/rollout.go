package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/api/capledger/v1/capledgerv1connect"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/server"
)

func init() {
	register(&command{name: "rollout", summary: "shadow-to-enforce rollouts: create, set, undo, end, list, get, report", help: rolloutHelp, subs: []subcommand{
		{"create", runRolloutCreate}, {"set", runRolloutSet}, {"undo", runRolloutUndo}, {"end", runRolloutEnd},
		{"list", runRolloutList}, {"get", runRolloutGet}, {"report", runRolloutReport}}})
	register(&command{name: "rollback", summary: "roll generations (or a rollout step) back and follow the drain to zero", help: rollbackHelp, run: runRollback})
}

const rolloutHelp = `Usage:
  capledger rollout create NAME --routes R[@REGION],... [--by route|subject]
  capledger rollout set [NAME] --percent N
  capledger rollout undo [NAME]
  capledger rollout end [NAME]
  capledger rollout list
  capledger rollout get NAME [--json]
  capledger rollout report [--route R] [--json]

A rollout moves a set of routes from shadow mode to enforcement in steps.
While a route belongs to a rollout, the rollout decides whether its
reserves are enforced or shadowed (the policy's own "rollout:" mode applies
to the other routes). The share is chosen by a stable hash, stated at
create (--by, route when left out) and never changed:
  --by route     a share of the routes: the routes ordered by the hash of
                 route and region, the first ceil(N% of them) enforced (at
                 least one above 0%); every request of an enforced route is
                 enforced, the other routes' requests are shadowed
  --by subject   a share of the subjects (tenants) on every route of the
                 rollout: a request is enforced when the hash of its route,
                 region and subject falls below N%
Growing N only adds routes (subjects); it never moves one back to shadow.

set takes a step (e.g. 1, 5, 25, 100; steps of 0.01 allowed, at most two
decimals: 0.005 or 1e-9 is refused, never rounded); setting the
share the rollout has records nothing. undo reverts the newest step that
stands. end ends the rollout: its routes go back to their policies' own
"rollout:" modes (on every replica within a second) and may join another
rollout; an ended rollout takes no more steps, and list and get still show
it with its history. Every step is recorded with the token's name and the
time (get shows the history). A new rollout's NAME is 1 to 128 ASCII
letters, digits, '.', '_' and '-' (create refuses "bad name!": exit 1,
reason INVALID_ROLLOUT); a rollout created under another name by an older
server is still named by it. NAME may be left out when there is one
rollout that has not ended. create, set, undo and end need an admin token;
list, get and report a viewer or admin token.

report shows, per route, generation and mode, how often the legacy
limiter's decision (the reserve's legacyDecision, "capledger reserve
--legacy allow|deny") agreed with capledger's, as counted by the replica
that answers since it started (sum capledger_shadow_decisions_total over
replicas in Prometheus for the fleet).

Example:
  capledger rollout create llm --routes chat.generate,embed.create --by route
  capledger rollout set --percent 1
  capledger rollout report
  capledger rollout undo

` + clientFlagsHelp + "\n" + exitCodesHelp

func runRolloutCreate(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollout create")
	var cf clientFlags
	cf.register(fs, e)
	routeSpec := fs.String("routes", "", "")
	by := fs.String("by", "route", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 1, "the rollout's name"); err != nil {
		return err
	}
	if *routeSpec == "" {
		return usagef("--routes is required (route[@region],...)")
	}
	if hash := ledger.RolloutHash(*by); hash != ledger.RolloutByRoute && hash != ledger.RolloutBySubject {
		return usagef("--by %q: want %s or %s", *by, ledger.RolloutByRoute, ledger.RolloutBySubject)
	}
	req := &v1.CreateRolloutRequest{Name: positional[0], HashBy: *by}
	for _, spec := range strings.Split(*routeSpec, ",") {
		route, region, _ := strings.Cut(strings.TrimSpace(spec), "@")
		req.Routes = append(req.Routes, &v1.RolloutRoute{Route: route, Region: region})
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.CreateRollout, req)
	if err != nil {
		return err
	}
	printRollout(e.stdout, msg.GetRollout(), false)
	return nil
}

// rolloutName returns the positional name, or the name of the only
// rollout that has not ended.
func rolloutName(ctx context.Context, cf *clientFlags, client capledgerv1connect.RolloutServiceClient, positional []string) (string, error) {
	switch len(positional) {
	case 1:
		return positional[0], nil
	case 0:
	default:
		return "", usagef("want at most one rollout name, got %d arguments", len(positional))
	}
	list, err := unary(ctx, cf.timeout, client.ListRollouts, &v1.ListRolloutsRequest{})
	if err != nil {
		return "", err
	}
	var open []string
	for _, r := range list.GetRollouts() {
		if !r.GetEnded() {
			open = append(open, r.GetName())
		}
	}
	switch n := len(open); n {
	case 1:
	case 0:
		if len(list.GetRollouts()) > 0 {
			return "", usagef("every rollout has ended: create one first (capledger rollout create NAME --routes R,...)")
		}
		return "", usagef("no rollout exists: create one first (capledger rollout create NAME --routes R,...)")
	default:
		return "", usagef("there are %d open rollouts: name the one you mean", n)
	}
	return open[0], nil
}

func runRolloutSet(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollout set")
	var cf clientFlags
	cf.register(fs, e)
	percentFlag := fs.String("percent", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *percentFlag == "" {
		return usagef("--percent is required (0 to 100)")
	}
	percent, err := strconv.ParseFloat(strings.TrimSuffix(*percentFlag, "%"), 64)
	if err != nil || math.IsNaN(percent) {
		return usagef("--percent %q is not a number", *percentFlag)
	}
	if percent < 0 || percent > 100 {
		return usagef("--percent %s: want 0 to 100", *percentFlag)
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	name, err := rolloutName(ctx, &cf, client, positional)
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.SetRolloutShare, &v1.SetRolloutShareRequest{Name: name, Percent: percent})
	if err != nil {
		return err
	}
	if !msg.GetChanged() {
		fmt.Fprintf(e.stderr, "rollout %s is at %s already: nothing recorded\n", name, percentText(percent))
	}
	printRollout(e.stdout, msg.GetRollout(), false)
	return nil
}

// namedRolloutCommand parses the arguments of a rollout command that
// takes only the client flags and an optional rollout name (undo, end),
// and returns the client and the rollout meant (rolloutName).
func namedRolloutCommand(ctx context.Context, e *env, command string, args []string) (*clientFlags, capledgerv1connect.RolloutServiceClient, string, error) {
	fs := newFlags(command)
	cf := &clientFlags{}
	cf.register(fs, e)
	positional, err := parseFlags(fs, args)
	if err != nil {
		return nil, nil, "", err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return nil, nil, "", err
	}
	name, err := rolloutName(ctx, cf, client, positional)
	if err != nil {
		return nil, nil, "", err
	}
	return cf, client, name, nil
}

func runRolloutUndo(ctx context.Context, e *env, args []string) error {
	cf, client, name, err := namedRolloutCommand(ctx, e, "rollout undo", args)
	if err != nil {
		return err
	}
	return undoStep(ctx, e, cf, client, name)
}

func runRolloutEnd(ctx context.Context, e *env, args []string) error {
	cf, client, name, err := namedRolloutCommand(ctx, e, "rollout end", args)
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.EndRollout, &v1.EndRolloutRequest{Name: name})
	if err != nil {
		return err
	}
	if !msg.GetChanged() {
		fmt.Fprintf(e.stderr, "rollout %s had ended already: nothing recorded\n", name)
	}
	printRollout(e.stdout, msg.GetRollout(), false)
	return nil
}

func undoStep(ctx context.Context, e *env, cf *clientFlags, client capledgerv1connect.RolloutServiceClient, name string) error {
	msg, err := unary(ctx, cf.timeout, client.UndoRolloutStep, &v1.UndoRolloutStepRequest{Name: name})
	if err != nil {
		return err
	}
	u := msg.GetUndone()
	fmt.Fprintf(e.stdout, "undid step %d (%s -> %s, by %s at %s)\n", u.GetSeq(), percentText(u.GetPriorPercent()), percentText(u.GetPercent()),
		whoText(u.GetWho()), u.GetAt().AsTime().Format(time.RFC3339))
	printRollout(e.stdout, msg.GetRollout(), false)
	return nil
}

func runRolloutList(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollout list")
	var cf clientFlags
	cf.register(fs, e)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.ListRollouts, &v1.ListRolloutsRequest{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLLOUT\tBY\tSHARE\tENFORCED\tSHADOW")
	for _, r := range msg.GetRollouts() {
		enforced, shadow := routesByMode(r)
		share := percentText(r.GetPercent())
		if r.GetEnded() {
			share, enforced, shadow = "ended", nil, nil
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", cell(r.GetName()), r.GetHashBy(), share, orDash(enforced), orDash(shadow))
	}
	return tw.Flush()
}

func runRolloutGet(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollout get")
	var cf clientFlags
	cf.register(fs, e)
	asJSON := fs.Bool("json", false, "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(positional, 1, "the rollout's name"); err != nil {
		return err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.GetRollout, &v1.GetRolloutRequest{Name: positional[0]})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e.stdout, msg)
	}
	printRollout(e.stdout, msg.GetRollout(), true)
	return nil
}

func runRolloutReport(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollout report")
	var cf clientFlags
	cf.register(fs, e)
	route := fs.String("route", "", "")
	asJSON := fs.Bool("json", false, "")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	msg, err := unary(ctx, cf.timeout, client.ShadowReport, &v1.ShadowReportRequest{Route: *route})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSONList(e.stdout, msg)
	}
	fmt.Fprintf(e.stdout, "legacy decisions compared since %s (this replica)\n", msg.GetSince().AsTime().Format(time.RFC3339))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tGEN\tMODE\tBOTH ALLOW\tBOTH DENY\tLEGACY ALLOW, CAPLEDGER DENY\tLEGACY DENY, CAPLEDGER ALLOW\tDISAGREE")
	for _, c := range msg.GetComparisons() {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%.1f%%\n", routeCell(c.GetRoute(), c.GetRegion()), c.GetGeneration(), c.GetMode(),
			c.GetBothAllowed(), c.GetBothDenied(), c.GetLegacyAllowedCapledgerDenied(), c.GetLegacyDeniedCapledgerAllowed(), 100*c.GetDisagreementRate())
	}
	return tw.Flush()
}

func routesByMode(r *v1.Rollout) (enforced, shadow []string) {
	for _, rt := range r.GetRoutes() {
		name := routeCell(rt.GetRoute(), rt.GetRegion())
		if rt.GetMode() == "enforce" {
			enforced = append(enforced, name)
		} else {
			shadow = append(shadow, name)
		}
	}
	return enforced, shadow
}

func orDash(list []string) string {
	if len(list) == 0 {
		return "-"
	}
	return strings.Join(list, ",")
}

func percentText(p float64) string { return strconv.FormatFloat(p, 'f', -1, 64) + "%" }

func whoText(who string) string {
	if who == "" {
		return "(no auth)"
	}
	return who
}

// printRollout shows a rollout: its share, the mode of each route and,
// with history, every step.
func printRollout(w io.Writer, r *v1.Rollout, history bool) {
	state := ""
	if r.GetEnded() {
		state = ", ended: its routes follow their policies"
	}
	fmt.Fprintf(w, "rollout %s: %s by %s, version %d%s\n", cell(r.GetName()), percentText(r.GetPercent()), r.GetHashBy(), r.GetVersion(), state)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ROUTE\tMODE")
	for _, rt := range r.GetRoutes() {
		mode := rt.GetMode()
		if r.GetHashBy() == "subject" && mode == "enforce" {
			mode = "enforce for " + percentText(r.GetPercent()) + " of subjects"
		}
		fmt.Fprintf(tw, "%s\t%s\n", routeCell(rt.GetRoute(), rt.GetRegion()), mode)
	}
	tw.Flush()
	if !history {
		return
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// A step without a note ends with its time, the last cell of its
	// line, which tabwriter leaves out of the AT column: so the header
	// pads AT itself to the times' one width (RFC 3339 in UTC, as below)
	// plus the column gap, putting NOTE over the notes.
	fmt.Fprintf(tw, "STEP\tACTION\tSHARE\tWHO\t%-*sNOTE\n", len("2006-01-02T15:04:05Z")+2, "AT")
	for _, s := range r.GetSteps() {
		note := ""
		switch {
		case s.GetUndoes() != 0:
			note = fmt.Sprintf("undoes step %d", s.GetUndoes())
		case s.GetUndoneBy() != 0:
			note = fmt.Sprintf("undone by step %d", s.GetUndoneBy())
		}
		share := percentText(s.GetPriorPercent()) + " -> " + percentText(s.GetPercent())
		if s.GetAction() == "create" {
			share = "0%"
		}
		// A step without a note ends with its time (RFC 3339, one width
		// for every step, so the NOTE column stays aligned), not with the
		// padding a tab after it would add.
		if note != "" {
			note = "\t" + note
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s%s\n", s.GetSeq(), s.GetAction(), share, cell(whoText(s.GetWho())), s.GetAt().AsTime().Format(time.RFC3339), note)
	}
	tw.Flush()
}

const rollbackHelp = `Usage:
  capledger rollback GEN [GEN...] [--wait] [--max-wait DUR] [--interval DUR]
  capledger rollback --status GEN [GEN...] [--wait]
  capledger rollback --rollout NAME

Rollback of generations stops admission under each at once (one call for
all of them; rolling back one rolled back already is harmless), then shows
what they still hold: reserved units (holds that will settle, be released
or expire), debt, available capacity the drain has not moved to the
generation that decides, and emergency shards not reconciled. Settlement,
expiry, debt repayment and shard reconciliation go on as usual. Each poll
runs the drain pass on demand (what the epoch worker does once a minute).
Available capacity that cannot move because the deciding account is at its
burst is counted as "blocked by burst", never hidden.

  --wait          poll until everything is zero, with a progress bar on
                  stderr; exit 0 when drained, 4 after --max-wait, or 4 at
                  once when a generation holds capacity or debt that
                  nothing can take (no policy decides for its subject:
                  BLOCKED says "no policy"; publish one, then run --status
                  GEN --wait) or is its key's active one (it never drains);
                  a server unavailable after the first answer is polled
                  again until --max-wait, and so, from the first poll on,
                  is a generation whose key was published to or rolled
                  back during each of the server's passes (503
                  POLICY_CHANGING), after the server's Retry-After
                  (cut to what is left of --max-wait)
  --max-wait DUR  give up waiting after this long (default 1h; 0 polls once)
  --interval DUR  pause between polls (default 2s; 1ms to 1h); after a
                  poll that took longer, a pause as long as it took (at a
                  million accounts a poll's passes take tens of seconds)
  --status        do not roll back: only show (and drain) what the
                  generations hold
  --no-drain      do not run the drain pass (read only: a viewer token may
                  then follow the progress)

--rollout NAME undoes the newest step of that rollout (as "capledger rollout
undo NAME"): the routes (subjects) that step enforced go back to shadow
mode at once; a step that enforced nothing new changes no route. A rollout step
publishes no generation, so there is nothing to drain: holds admitted while
the step stood settle or expire on the same accounts.

Rollback, --status and the drain pass need an admin token; --status
--no-drain only reads (a viewer token may follow).

Example:
  capledger rollback 7 8 --wait

` + clientFlagsHelp + "\n" + exitCodesHelp

func runRollback(ctx context.Context, e *env, args []string) error {
	fs := newFlags("rollback")
	var cf clientFlags
	cf.register(fs, e)
	wait := fs.Bool("wait", false, "")
	maxWait := fs.Duration("max-wait", time.Hour, "")
	interval := fs.Duration("interval", 2*time.Second, "")
	status := fs.Bool("status", false, "")
	noDrain := fs.Bool("no-drain", false, "")
	rollout := fs.String("rollout", "", "")
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	client, err := cf.rolloutClient()
	if err != nil {
		return err
	}
	if *rollout != "" {
		if len(positional) > 0 {
			return usagef("--rollout takes no generations")
		}
		return undoStep(ctx, e, &cf, client, *rollout)
	}
	if len(positional) == 0 {
		return usagef("want the generations to roll back (or --rollout NAME)")
	}
	// A generation named twice (e.g. pasted twice) is rolled back and
	// shown once: the server would answer its second mention as "was
	// rolled back already", as if someone else had done it.
	var gens []uint64
	for _, p := range positional {
		g, err := strconv.ParseUint(p, 10, 64)
		if err != nil || g == 0 {
			return usagef("generation %q is not a positive integer", p)
		}
		if !slices.Contains(gens, g) {
			gens = append(gens, g)
		}
	}
	// --interval: polls not in a loop, at least hourly; --max-wait 0
	// polls once.
	if err := firstError(
		durationIn("interval", *interval, time.Millisecond, time.Hour),
		durationIn("max-wait", *maxWait, 0, time.Duration(math.MaxInt64)),
	); err != nil {
		return err
	}
	if !*status {
		msg, err := unary(ctx, cf.timeout, client.RollbackGenerations, &v1.RollbackGenerationsRequest{Generations: gens})
		if err != nil {
			return err
		}
		for _, r := range msg.GetRollbacks() {
			note := ""
			if r.GetReplayed() {
				note = " (was rolled back already)"
			}
			fmt.Fprintf(e.stdout, "rolled back generation %d of %s%s; active now: %s\n", r.GetGeneration(),
				keyCell(r.GetSubject(), r.GetRoute(), r.GetRegion()), note, generationText(r.GetActiveGeneration()))
		}
	}
	deadline := time.Now().Add(*maxWait)
	var bar drainBar
	// The first poll's drain pass moves capacity before it answers, so a
	// bar measured from that answer never counts what it moved: with
	// --wait the bar starts from a read-only poll taken first (shown
	// nowhere; if it fails, the bar starts from the first answer).
	// An answered poll is followed by a pause of --interval, or of as long
	// as the poll took when that was longer (pollPause): at a million
	// accounts a poll's passes take tens of seconds, and polling again
	// at once would keep a core busy for the whole follow.
	if *wait && !*noDrain {
		began := time.Now()
		if msg, err := unary(ctx, cf.timeout, client.DrainProgress, &v1.DrainProgressRequest{Generations: gens}); err == nil {
			bar.start(msg)
			if err := sleepCtx(ctx, pollPause(0, time.Since(began))); err != nil {
				return err
			}
		}
	}
	for {
		began := time.Now()
		msg, err := unary(ctx, cf.timeout, client.DrainProgress, &v1.DrainProgressRequest{Generations: gens, RunDrains: !*noDrain})
		pause := pollPause(*interval, time.Since(began))
		if err != nil {
			// A generation whose key is published to during each of the
			// server's passes (POLICY_CHANGING) is no failure: the follow
			// goes on, after the server's Retry-After, until --max-wait:
			// a Retry-After beyond it (passes of minutes) is cut to
			// --max-wait's end, when a last poll answers.
			if changing, after := policyChanging(err); changing && *wait && !time.Now().After(deadline) {
				after = min(max(*interval, after), max(time.Until(deadline), 0).Round(time.Millisecond))
				fmt.Fprintf(e.stderr, "its key is being published to or rolled back, polling again in %s: %v\n", after, err)
				if err := sleepCtx(ctx, after); err != nil {
					return err
				}
				continue
			}
			// A replica restarting or failing over mid-drain does not end
			// the follow: once a poll has answered, an unavailable server
			// is polled again until --max-wait, the error shown each time.
			var failed exitError
			if !*wait || !bar.polled || !errors.As(err, &failed) || failed.code != exitUnavailable || time.Now().After(deadline) {
				return err
			}
			fmt.Fprintf(e.stderr, "poll failed, polling again in %s: %v\n", *interval, err)
			if err := sleepCtx(ctx, *interval); err != nil {
				return err
			}
			continue
		}
		if !*wait {
			printDrain(e.stdout, msg)
			return nil
		}
		fmt.Fprintln(e.stderr, bar.line(msg))
		if msg.GetDrained() {
			printDrain(e.stdout, msg)
			return nil
		}
		// An active generation decides admission, so it never drains:
		// waiting for it would only run out --max-wait.
		if live := activeGenerations(msg); live != "" {
			printDrain(e.stdout, msg)
			return exitError{code: exitConflict, err: fmt.Errorf("cannot drain: %s; "+
				"an active generation decides admission and never drains: roll it back first (`capledger rollback GEN`)", live)}
		}
		// Capacity or debt that no generation can take stays where it is
		// until someone publishes a policy: waiting for it would only run
		// out --max-wait while the table shows it blocked.
		if stuck := blockedGenerations(msg, (*v1.GenerationDrain).GetBlockedNoPolicy, "blocked with no policy"); stuck != "" {
			printDrain(e.stdout, msg)
			return exitError{code: exitConflict, err: fmt.Errorf("cannot drain: %s; "+
				"no policy decides for the subject, so nothing can take that capacity. Publish one for the key (or a \"*\" one for the route), "+
				"then follow the drain with `capledger rollback --status %s --wait`", stuck, strings.Join(positional, " "))}
		}
		// Available capacity in a unit the deciding generation does not
		// limit never moves (the drain moves only units both limit): the
		// same wait to --max-wait, with BLOCKED showing "unit dropped".
		// (Debt in such a unit is repaid by its own account's refill.)
		if stuck := blockedGenerations(msg, (*v1.GenerationDrain).GetBlockedDroppedUnit,
			"holding capacity in a unit the deciding generation does not limit"); stuck != "" {
			printDrain(e.stdout, msg)
			return exitError{code: exitConflict, err: fmt.Errorf("cannot drain: %s; "+
				"the drain moves only units both generations limit, so what is held in that unit stays. "+
				"Publish a generation for the key that limits the unit again and keep it until the capacity has moved, "+
				"then follow the drain with `capledger rollback --status %s --wait`; or accept it: the generation then never reports drained", stuck, strings.Join(positional, " "))}
		}
		if time.Now().After(deadline) {
			printDrain(e.stdout, msg)
			return exitError{code: exitConflict, err: fmt.Errorf("not drained after %s", *maxWait)}
		}
		if err := sleepCtx(ctx, pause); err != nil {
			return err
		}
	}
}

// policyChanging reports whether err is DrainProgress's POLICY_CHANGING
// answer (a generation's key published to or rolled back during each of
// the server's passes), and the wait its Retry-After asks for (0 when
// none).
func policyChanging(err error) (bool, time.Duration) {
	if errorDetailReason(err) != server.ReasonPolicyChanging {
		return false, 0
	}
	var cerr *connect.Error
	if errors.As(err, &cerr) {
		if s, convErr := strconv.Atoi(cerr.Meta().Get("Retry-After")); convErr == nil && s > 0 {
			return true, time.Duration(s) * time.Second
		}
	}
	return true, 0
}

// pollPause is how long `rollback --wait` waits after an answered poll
// that took took: interval, or took when longer. A poll costs the server
// a drain pass and a progress pass over the generation's accounts, so
// the next one never starts before the last ended plus as long again:
// following a drain keeps the server's passes to at most half the time.
func pollPause(interval, took time.Duration) time.Duration {
	return max(interval, took)
}

// sleepCtx waits d, or returns ctx's error when it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func generationText(g uint64) string {
	if g == 0 {
		return "none (the route's \"*\" policy, if any, decides)"
	}
	return "generation " + strconv.FormatUint(g, 10)
}

// blockedGenerations names the generations with accounts that cannot
// drain, as count counts them and what describes them ("blocked with no
// policy"), with what those generations hold; or is empty.
func blockedGenerations(msg *v1.DrainProgressResponse, count func(*v1.GenerationDrain) int64, what string) string {
	var parts []string
	for _, g := range msg.GetGenerations() {
		if n := count(g); n > 0 {
			parts = append(parts, fmt.Sprintf("generation %d (%s/%s@%s) has %d account(s) %s (available %s, debt %s)",
				g.GetGeneration(), g.GetSubject(), g.GetRoute(), g.GetRegion(), n, what, unitsText(g.GetAvailable()), unitsText(g.GetDebt())))
		}
	}
	return strings.Join(parts, ", ")
}

// activeGenerations names the generations that are their key's active one
// (and so never drain), or is empty.
func activeGenerations(msg *v1.DrainProgressResponse) string {
	var parts []string
	for _, g := range msg.GetGenerations() {
		if g.GetActive() {
			parts = append(parts, fmt.Sprintf("generation %d (%s) is active", g.GetGeneration(), keyCell(g.GetSubject(), g.GetRoute(), g.GetRegion())))
		}
	}
	return strings.Join(parts, ", ")
}

// drainLeft is every unit the generations still hold, for the progress
// bar.
func drainLeft(msg *v1.DrainProgressResponse) int64 {
	var n int64
	for _, g := range msg.GetGenerations() {
		for _, m := range []map[string]int64{g.GetReserved(), g.GetDebt(), g.GetAvailable(), g.GetUnreconciledShardUnits()} {
			for _, v := range m {
				n = ledger.SumUnits(n, v) // the server's sums are capped, not wrapped: so is this one
			}
		}
	}
	return n
}

// drainBar draws `rollback --wait`'s progress line, one per poll. Units
// left can grow while it follows (settlement goes on: a settle above its
// hold on a rolled-back generation adds debt), and a bar measured against
// any fixed total then runs backwards. So the bar is the share drained of
// all the generations held while followed (the units left fell by
// drained over the polls so far; drained / (drained + left)), it never
// moves back (after a rise it holds until the drain passes it again), and
// it is full only once DrainProgress says drained. The line says by how
// much the units left rose since the last poll, so a larger figure there
// reads as new units, not as the drain undone. A start (a read before the
// first drain pass) counts what that pass moves as drained.
type drainBar struct {
	polled  bool  // a poll has answered (a start is no poll)
	started bool  // start noted the units left before the first poll
	left    int64 // units left at the last poll (or the start)
	drained int64 // the falls of units left between polls, summed
	done    int   // cells of the bar filled on the last line
}

const drainBarWidth = 30

// start notes msg, a read-only answer taken before the first poll, as
// where the bar begins. It draws nothing, and a rise after it is not
// noted (no line was shown for it).
func (b *drainBar) start(msg *v1.DrainProgressResponse) {
	b.started, b.left = true, drainLeft(msg)
}

// line notes msg, a poll's answer, and returns its progress line.
func (b *drainBar) line(msg *v1.DrainProgressResponse) string {
	left := drainLeft(msg)
	var rose int64
	if b.polled || b.started {
		if left < b.left {
			b.drained = ledger.SumUnits(b.drained, b.left-left)
		} else if b.polled {
			rose = left - b.left
		}
	}
	b.polled, b.left = true, left
	switch {
	case msg.GetDrained():
		b.done = drainBarWidth
	case b.drained > 0:
		b.done = max(b.done, min(drainBarWidth-1, int(drainBarWidth*b.drained/(b.drained+left))))
	}
	var shards, byBurst int64
	for _, g := range msg.GetGenerations() {
		shards += g.GetUnreconciledShards()
		byBurst += g.GetBlockedByBurst()
	}
	grew := ""
	if rose > 0 {
		grew = fmt.Sprintf(" (up %d since the last poll)", rose)
	}
	// Capacity blocked by burst moves only once its subject uses some
	// under the deciding generation: an idle tenant's never does. The
	// line says so, or a follower watches the same figure until
	// --max-wait with no reason given.
	blocked := ""
	if byBurst > 0 {
		blocked = fmt.Sprintf(", %s blocked by burst (moves once the deciding account has room)", counted(byBurst, "account", "accounts"))
	}
	return fmt.Sprintf("[%s%s] %3d%%  %d units left%s, %s open, %s%s",
		strings.Repeat("#", b.done), strings.Repeat(".", drainBarWidth-b.done), 100*b.done/drainBarWidth, left, grew,
		counted(shards, "shard", "shards"), counted(msg.GetDrainCommands(), "drain command", "drain commands"), blocked)
}

// counted writes n and the noun that agrees with it: "1 shard", "2 shards".
func counted[N int | int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func unitsText(m map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", cell(k), m[k]))
		}
	}
	if len(parts) == 0 {
		return "0"
	}
	return strings.Join(parts, ",")
}

func printDrain(w io.Writer, msg *v1.DrainProgressResponse) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GEN\tKEY\tSTATE\tACCOUNTS\tRESERVED\tDEBT\tAVAILABLE\tBLOCKED\tSHARDS OPEN\tDRAINED")
	for _, g := range msg.GetGenerations() {
		state := "live"
		switch {
		case g.GetActive():
			state = "active"
		case g.GetRolledBack():
			state = "rolled back"
		}
		blocked := "-"
		if n := g.GetBlockedByBurst() + g.GetBlockedNoPolicy() + g.GetBlockedDroppedUnit(); n > 0 {
			blocked = fmt.Sprintf("%d by burst, %d no policy", g.GetBlockedByBurst(), g.GetBlockedNoPolicy())
		}
		// Said only when there are some, so the column reads as it did
		// for a generation that drops no unit.
		if n := g.GetBlockedDroppedUnit(); n > 0 {
			blocked += fmt.Sprintf(", %d unit dropped", n)
		}
		shards := strconv.FormatInt(g.GetUnreconciledShards(), 10)
		if g.GetUnreconciledShards() > 0 {
			shards += " (" + unitsText(g.GetUnreconciledShardUnits()) + ")"
		}
		if n := g.GetUnreconciledLegacyBudgets(); n > 0 {
			shards += fmt.Sprintf(", %d legacy (%s)", n, unitsText(g.GetUnreconciledLegacyUnits()))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%v\n", g.GetGeneration(), keyCell(g.GetSubject(), g.GetRoute(), g.GetRegion()), state,
			g.GetAccounts(), unitsText(g.GetReserved()), unitsText(g.GetDebt()), unitsText(g.GetAvailable()), blocked, shards, g.GetDrained())
	}
	tw.Flush()
}
