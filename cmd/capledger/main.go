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
	"syscall"
	"time"

	"github.com/capledger/capledger/internal/yamlfile"
)

// Exit codes, the same for every subcommand (documented in --help and the
// README).
const (
	exitOK            = 0   // success
	exitUsage         = 1   // bad flags or arguments, invalid request, refused credentials
	exitRejected      = 2   // capacity rejection (HTTP 429 / RESOURCE_EXHAUSTED)
	exitNotFound      = 3   // no such reservation, policy or active policy
	exitConflict      = 4   // conflict or failed precondition (already settled, digest mismatch, ...)
	exitUnavailable   = 5   // server or store unavailable, or the server failed
	exitDiscrepancies = 6   // audit found discrepancies
	exitInterrupted   = 130 // interrupted (Ctrl-C or SIGTERM) before it finished: 128 + SIGINT, as shells report
)

const exitCodesHelp = `Exit codes:
  0  ok
  1  usage error (bad flags or arguments, invalid request, refused token)
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
	// exitCode).
	run func(ctx context.Context, e *env, args []string) error
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
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "capledger: unknown command %q\n\n", args[0])
		printOverview(e.stderr)
		return exitUsage
	}
	err := c.run(ctx, e, args[1:])
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
		fmt.Fprintf(e.stderr, "capledger %s: interrupted (%v)\n", c.name, err)
		return exitInterrupted
	}
	code := exitCode(err)
	fmt.Fprintf(e.stderr, "capledger %s: %v\n", c.name, err)
	// Exit 1 points at --help, except when the command set the code itself
	// (exitError): a store refusing migrate or serve (a schema a newer
	// binary migrated, credentials), where the message says what to do
	// and the flags are not the problem.
	var explicit exitError
	if code == exitUsage && !errors.As(err, &explicit) {
		fmt.Fprintf(e.stderr, "Run `capledger %s --help` for usage.\n", c.name)
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

// parseFlags parses flags and positional arguments in any order
// ("policy get 7 --addr x" as well as "policy get --addr x 7") and returns
// the positional ones. It returns flag.ErrHelp for -h/--help and a
// usageError for anything malformed.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, flagValueError(fs, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// flagValueError turns the flag package's `invalid value "5" for flag
// -retention: parse error` into what the flag wants (`--retention "5":
// want a duration with a unit, such as 500ms, 30s, 5m or 72h, of at most
// 2562047h47m16.854775807s`); other
// errors pass through as usage errors.
func flagValueError(fs *flag.FlagSet, err error) error {
	const suffix = ": parse error"
	msg := err.Error()
	prefix, marker := "invalid value ", " for flag -"
	if strings.HasPrefix(msg, "invalid boolean value ") {
		prefix, marker = "invalid boolean value ", " for -"
	}
	i := strings.LastIndex(msg, marker)
	if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) || i < len(prefix) {
		return usageError{msg}
	}
	name, value := msg[i+len(marker):len(msg)-len(suffix)], msg[len(prefix):i]
	f := fs.Lookup(name)
	if f == nil {
		return usageError{msg}
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
