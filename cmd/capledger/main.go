// Command capledger is the one binary of the capacity ledger: it serves
// the ledger (serve), prepares its store (migrate), and talks to a running
// server for operators and scripts (policy, reserve, start, settle, release,
// mark-unknown, get, account, audit).
//
// Subcommands register themselves from their own files (see register), so
// adding one (bench.go, sim.go, shard.go) needs no change here.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capledger/capledger/internal/yamlfile"
)

// Exit codes, the same for every subcommand (documented in --help and the
// README).
const (
	exitOK            = 0   // success
	exitUsage         = 1   // bad flags or arguments, invalid request, refused credentials, a damaged store file
	exitRejected      = 2   // capacity rejection (HTTP 429 / RESOURCE_EXHAUSTED)
	exitNotFound      = 3   // no such reservation, policy or active policy
	exitConflict      = 4   // conflict or failed precondition (already settled, digest mismatch, ...)
	exitUnavailable   = 5   // server or store unavailable, or the server failed
	exitDiscrepancies = 6   // audit found discrepancies
	exitInterrupted   = 130 // interrupted (Ctrl-C or SIGTERM) before it finished: 128 + SIGINT, as shells report
)

const exitCodesHelp = `Exit codes:
  0  ok
  1  usage error (bad flags or arguments, invalid request, refused token;
     an --addr that is no URL, or where no capledger server answers: 404);
     also a damaged store (a SQLite file; PostgreSQL XX001/XX002),
     which no retry repairs
  2  rejected by capacity (HTTP 429 / RESOURCE_EXHAUSTED)
  3  not found (reservation, policy generation, or no active policy)
  4  conflict or failed precondition (already settled, released, expired,
     operation mismatch, reservation id reused for another request;
     rollback --wait not drained, or holding capacity no policy can take)
  5  server unavailable (cannot connect, store down, shutting down); serve
     and migrate: the store cannot be reached, or its data directory's
     disk is full (free space, then start again)
  6  audit found discrepancies
130  interrupted (Ctrl-C or SIGTERM) before it finished; serve stops with 0
`

// command is one subcommand.
type command struct {
	name    string
	summary string // one line for the command list
	// help is the full --help text: what it does, its flags, an example.
	help string
	// run executes the command; its error decides the exit code (see
	// exitCode). A command made of subcommands (policy, rollout, shard,
	// legacy) has subs instead.
	run runFunc
	// subs are the subcommands, in the order usage messages list them;
	// the word naming one is found by takeWord, as the command's own.
	subs []subcommand
}

// runFunc runs a (sub)command with the arguments after its words.
type runFunc func(ctx context.Context, e *env, args []string) error

// subcommand is one word of a command made of several ("policy get").
type subcommand struct {
	name string
	run  runFunc
}

var commands = map[string]*command{}

// register adds a subcommand; each subcommand's file calls it from init.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("capledger: subcommand registered twice: " + c.name)
	}
	commands[c.name] = c
}

// env is what a command reads and writes besides its arguments.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// certUnmet is the command's clientFlags.certUnmet: set once a server
	// asked for a client certificate the command had not got, or could
	// not give.
	certUnmet *atomic.Bool
}

// usageError is a mistake in how the command was called (exit 1).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// exitError carries an explicit exit code.
type exitError struct {
	code int
	err  error
}

func (x exitError) Error() string { return x.err.Error() }
func (x exitError) Unwrap() error { return x.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:])
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit code.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			if c, ok := commands[args[1]]; ok {
				fmt.Fprint(e.stdout, c.help)
				return exitOK
			}
		}
		printOverview(e.stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	name, rest, err := takeWord(args)
	_, known := commands[name]
	if flagName := unknownFlagBeforeWord(args); flagName != "" && !errors.Is(err, flag.ErrHelp) && name != "help" && !known {
		// "capledger --bogus x status": x may be --bogus's value; either
		// way the flag is what is wrong, as it is after a command word.
		fmt.Fprintf(e.stderr, "capledger: unknown flag %s\nRun `capledger --help` for usage.\n", flagName)
		return exitUsage
	}
	if err != nil || name == "help" {
		// No command among the flags ("capledger --addr X"), or the word
		// help after them: the overview, as for no arguments at all.
		printOverview(e.stdout)
		if errors.Is(err, flag.ErrHelp) || name == "help" {
			return exitOK
		}
		return exitUsage
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(e.stderr, "capledger: unknown command %q\n\n", name)
		printOverview(e.stderr)
		return exitUsage
	}
	// ran is the command as the user ran it, subcommand included ("policy
	// publish"), which every message below names.
	ran := c.name
	if c.subs != nil {
		ran, err = runSub(ctx, e, c, rest)
	} else {
		err = c.run(ctx, e, rest)
	}
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(e.stdout, c.help)
		return exitOK
	}
	if err == nil {
		return exitOK
	}
	if ctx.Err() != nil && c.name != "serve" {
		// Interrupted: whatever the cut-off call failed with (a canceled
		// stream reads as "unavailable"), the command did not finish
		// because it was told to stop. (serve's stop is its Ctrl-C.)
		fmt.Fprintf(e.stderr, "capledger %s: interrupted (%v)\n", ran, err)
		return exitInterrupted
	}
	err = certRefused(e, err)
	code := exitCode(err)
	fmt.Fprintf(e.stderr, "capledger %s: %v\n", ran, err)
	// Exit 1 points at --help, except when the command set the code itself
	// (exitError): a store refusing migrate or serve (a schema a newer
	// binary migrated, credentials), where the message says what to do
	// and the flags are not the problem.
	var explicit exitError
	if code == exitUsage && !errors.As(err, &explicit) {
		fmt.Fprintf(e.stderr, "Run `capledger %s --help` for usage.\n", ran)
	}
	return code
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, `capledger - one shared capacity ledger for concurrent requests.

Gateways reserve estimated capacity before running a request, mark it
started, then settle the actual usage (or release it) exactly once.

Usage: capledger <command> [flags] [args]

Commands:
`)
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-13s %s\n", name, commands[name].summary)
	}
	fmt.Fprint(w, `
Run "capledger <command> --help" for what a command does, its flags and an
example. Start here: capledger serve                 (then, in another shell)
                     capledger policy publish policy.yaml
("capledger policy --help" shows the policy file format.)

`+exitCodesHelp)
}

// newFlags returns a flag set whose errors are returned, not printed, so
// that run decides what to print and which exit code to use.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// runSub runs the subcommand of c that args name (their first positional
// word, wherever the flags are: "policy list --addr X", "policy --addr X
// list"). It returns the command as run ("policy list"; c's name alone
// when args name no subcommand of it) and the subcommand's error, or
// flag.ErrHelp for no word but -h/--help, or the word help, and a
// usageError for no word or an unknown one.
func runSub(ctx context.Context, e *env, c *command, args []string) (string, error) {
	names := make([]string, len(c.subs))
	for i, sub := range c.subs {
		names[i] = sub.name
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	if len(names) == 1 {
		want = names[0]
	}
	word, rest, err := takeWord(args)
	switch {
	case err != nil && errors.Is(err, flag.ErrHelp), word == "help":
		return c.name, flag.ErrHelp
	}
	if err == nil {
		for _, sub := range c.subs {
			if sub.name == word {
				return c.name + " " + sub.name, sub.run(ctx, e, rest)
			}
		}
	}
	if name := unknownFlagBeforeWord(args); name != "" {
		// "capledger policy --bogus x list": as in run.
		return c.name, usagef("unknown flag %s", name)
	}
	if err != nil {
		return c.name, usagef("want a subcommand: %s", want)
	}
	return c.name, usagef("unknown %s subcommand %q: want %s", c.name, word, want)
}

// unknownFlagBeforeWord returns the first flag of args before their first
// positional argument (the word takeWord finds, scanning as it does; all
// of args when there is none) that no (sub)command defines, as typed
// (typedFlag: "-x", "--bogus"), or "". Such a flag's value, if it takes one, is unknown: the word after it
// may be that value rather than a command, so when the word names no
// command, the unknown flag is the error to report.
func unknownFlagBeforeWord(args []string) string {
	value, boolean := knownFlags()
	for i, kind := range scanArgs(args, func(name string) bool { return value[name] }) {
		switch kind {
		case argPositional, argEndOfFlags:
			return ""
		case argFlag:
			name, _, _ := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
			if !value[name] && !boolean[name] && name != "h" && name != "help" {
				return typedFlag(args[i])
			}
		}
	}
	return ""
}

// argKind is what scanArgs makes of one argument.
type argKind uint8

const (
	argPositional argKind = iota
	argFlag               // -name, --name or --name=value
	argFlagValue          // the value after --name
	argEndOfFlags         // "--"
)

// scanArgs is the one rule of where flags go, for every command and
// subcommand: anywhere among the positional arguments and the command's
// words ("capledger --addr X policy get 7", "capledger policy get 7
// --addr X", "capledger settle ID --operation OP" and "capledger settle
// --operation OP ID" alike). It returns what each argument is. A flag is
// an argument that begins with "-" ("-" alone, standard input, is
// positional); written --name value it takes the next argument as its
// value, whatever that looks like (--id list, --timeout -1s, --id --),
// when takesValue(name); --name=value, a boolean flag and an unknown one
// take none. "--" ends the flags: every argument after it is positional
// (an id beginning with "-").
func scanArgs(args []string, takesValue func(name string) bool) []argKind {
	kinds := make([]argKind, len(args))
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch {
		case arg == "--":
			kinds[i] = argEndOfFlags
			return kinds // the rest: argPositional
		case len(arg) < 2 || arg[0] != '-':
			kinds[i] = argPositional
		default:
			kinds[i] = argFlag
			name := strings.TrimPrefix(arg[1:], "-")
			if !strings.Contains(name, "=") && takesValue(name) && i+1 < len(args) {
				i++
				kinds[i] = argFlagValue
			}
		}
	}
	return kinds
}

// takeWord returns the first positional argument of args (scanArgs, with
// the flags of every subcommand: valueFlags), the word naming a command or
// a subcommand, and args without it, the flags and "--" in place for the
// command to parse. It returns flag.ErrHelp when there is no word but a
// -h/--help, and errNoWord when there is none at all.
func takeWord(args []string) (word string, rest []string, err error) {
	takes := valueFlags()
	kinds := scanArgs(args, func(name string) bool { return takes[name] })
	for i, kind := range kinds {
		if kind == argPositional {
			return args[i], append(slices.Clone(args[:i]), args[i+1:]...), nil
		}
	}
	for i, kind := range kinds {
		if name := strings.TrimLeft(args[i], "-"); kind == argFlag && (name == "h" || name == "help") {
			return "", nil, flag.ErrHelp
		}
	}
	return "", nil, errNoWord
}

var errNoWord = errors.New("no command word")

// flagProbeArg is the argument list's one argument no one types: parseFlags
// answers it with a flagProbe carrying the flag set, before the command
// does anything, so valueFlags learns every command's flags from the
// commands themselves.
const flagProbeArg = "\x00capledger-flag-probe"

// flagProbe is parseFlags' answer to flagProbeArg.
type flagProbe struct{ fs *flag.FlagSet }

func (flagProbe) Error() string { return "flag probe" }

// knownFlags returns flagKinds, probed once.
var knownFlags = sync.OnceValues(flagKinds)

// valueFlags returns the names of the flags that take a value in any
// (sub)command. Before a command's words are found its flags are not
// known; a name is a value flag everywhere or nowhere
// (TestCLIFlagNamesMeanOneKindEverywhere), so this decides as the
// command's own flag set would.
func valueFlags() map[string]bool {
	value, _ := knownFlags()
	return value
}

// flagKinds probes every (sub)command (flagProbeArg) and returns the
// names of the flags that take a value in some, and those that are
// boolean in some.
func flagKinds() (value, boolean map[string]bool) {
	value, boolean = map[string]bool{}, map[string]bool{}
	probe := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	for _, c := range commands {
		runs := []runFunc{c.run}
		if c.subs != nil {
			runs = runs[:0]
			for _, sub := range c.subs {
				runs = append(runs, sub.run)
			}
		}
		for _, run := range runs {
			var p flagProbe
			if !errors.As(run(context.Background(), probe, []string{flagProbeArg}), &p) {
				continue
			}
			p.fs.VisitAll(func(f *flag.Flag) {
				if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
					boolean[f.Name] = true
				} else {
					value[f.Name] = true
				}
			})
		}
	}
	return value, boolean
}

// parseFlags parses flags and positional arguments in any order (scanArgs)
// and returns the positional ones. It returns flag.ErrHelp for -h/--help
// and a usageError for anything malformed: an unknown flag, named as
// typed ("unknown flag --bogus", "unknown flag -x"), a value the flag
// cannot take, a flag without its value.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	if len(args) == 1 && args[0] == flagProbeArg {
		return nil, flagProbe{fs}
	}
	var flags, positional []string
	kinds := scanArgs(args, func(name string) bool {
		f := fs.Lookup(name)
		if f == nil {
			return false
		}
		b, ok := f.Value.(interface{ IsBoolFlag() bool })
		return !ok || !b.IsBoolFlag()
	})
	for i, kind := range kinds {
		switch kind {
		case argPositional:
			positional = append(positional, args[i])
		case argFlag, argFlagValue:
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			return nil, usagef("unknown flag %s", unknownFlagTyped(args, kinds, name))
		}
		return nil, flagValueError(fs, err)
	}
	return positional, nil
}

// typedFlag returns a flag argument as the user typed it, without a
// value written after "=": "-x" for -x, "--bogus" for --bogus=1, so that
// an error names the flag as it stands on the command line.
func typedFlag(arg string) string {
	typed, _, _ := strings.Cut(arg, "=")
	return typed
}

// unknownFlagTyped returns the first flag argument of args (kinds from
// scanArgs) named name, as typed (typedFlag); the flag package, which
// reported name as not defined, stops at the first such argument. It
// returns "--"+name if none matches, which the flag package, given only
// args' flags, does not report.
func unknownFlagTyped(args []string, kinds []argKind, name string) string {
	for i, kind := range kinds {
		if kind != argFlag {
			continue
		}
		typed := typedFlag(args[i])
		if strings.TrimPrefix(typed[1:], "-") == name {
			return typed
		}
	}
	return "--" + name
}

// flagValueError turns the flag package's `invalid value "5" for flag
// -retention: parse error` into what the flag wants (`--retention "5":
// want a duration with a unit, such as 500ms, 30s, 5m or 72h, of at most
// 2562047h47m16.854775807s`), and its other words about a flag into the
// help's spelling of it, two dashes: `flag needs an argument: -route`
// becomes `--route needs a value`, a value its flag refused for a reason
// of its own `--name "value": reason`. Anything else passes through as a
// usage error.
func flagValueError(fs *flag.FlagSet, err error) error {
	const suffix = ": parse error"
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return usagef("--%s needs a value", name)
	}
	prefix, marker := "invalid value ", " for flag -"
	if strings.HasPrefix(msg, "invalid boolean value ") {
		prefix, marker = "invalid boolean value ", " for -"
	}
	if !strings.HasPrefix(msg, prefix) {
		return usageError{msg}
	}
	// The flag's name ends at the first ": " after the marker: a name
	// holds no colon, the value before it may.
	i := strings.LastIndex(msg, marker)
	if i < len(prefix) {
		return usageError{msg}
	}
	name, reason, _ := strings.Cut(msg[i+len(marker):], ": ")
	value := msg[len(prefix):i]
	f := fs.Lookup(name)
	if f == nil {
		return usageError{msg}
	}
	if reason != suffix[2:] {
		return usagef("--%s %s: %s", name, value, reason)
	}
	want := ""
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case time.Duration:
			// The flag package says "parse error" for a duration too long
			// for time.Duration as for one without a unit: name both.
			want = "a duration with a unit, such as 500ms, 30s, 5m or 72h, of at most " + time.Duration(math.MaxInt64).String()
		case int, int64, uint, uint64:
			want = "a whole number"
		case float64:
			want = "a number"
		case bool:
			want = "true or false"
		}
	}
	if want == "" {
		return usageError{msg}
	}
	return usagef("--%s %s: want %s", name, value, want)
}

// parseNoArgs parses the flags of a command that takes no positional
// arguments. It returns flag.ErrHelp for -h/--help and a usageError for
// malformed flags or any positional argument.
func parseNoArgs(fs *flag.FlagSet, args []string) error {
	positional, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	return wantArgs(positional, 0, "")
}

// readInput returns the contents of the file at path, or of standard input
// for "-", and the read error otherwise.
func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

// decodeStrictJSON decodes raw, a JSON file an operator wrote, into v
// as strictly as every file the CLI reads (yamlfile.UnmarshalStrictJSON):
// a JSON syntax error (a trailing comma, a comment) names its line and
// column; a field v does not have (a misspelt field must not read as
// zero), a field spelt in another case and a key given twice name their
// line and path; anything after the first JSON value but white space (two
// files concatenated: the second would be dropped without a word) is
// refused.
func decodeStrictJSON(raw []byte, v any) error {
	return yamlfile.UnmarshalStrictJSON(raw, v)
}

// wantArgs checks the number of positional arguments.
func wantArgs(positional []string, n int, what string) error {
	if len(positional) != n {
		if n == 0 {
			return usagef("unexpected argument %q", strings.Join(positional, " "))
		}
		return usagef("want %s, got %d argument(s)", what, len(positional))
	}
	return nil
}
