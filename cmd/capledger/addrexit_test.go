package main

import (
	"strings"
	"testing"
)

// Every client command follows the documented exit codes for the address
// it is given: an address with no capledger server at it (a wrong path in
// front of a real server) is the bad --addr of exit 1 for status as for a
// call (which answered 404, unimplemented: 1, where status said 5), and
// so is a malformed one (status said 1, a call 5, as if the server were
// down); nothing listening is 5 for every one of them.
func TestCLIAddressExitCodesAgree(t *testing.T) {
	url := startInProcess(t)
	commands := [][]string{
		{"status"}, {"get", "r-1"}, {"policy", "get", "1"}, {"policy", "list"},
		{"backlog"}, {"debts"}, {"audit"}, {"rollout", "list"}, {"shard", "list"},
	}
	for _, c := range []struct {
		addr string
		want int
		says string
	}{
		{url + "/prefix", exitUsage, "/prefix/"},
		{"http://[::1", exitUsage, `--addr "http://[::1": want http://host:port`},
		{"http://127.0.0.1:port", exitUsage, "--addr"},
		{"http://", exitUsage, "--addr"},
		{url + "?x=1", exitUsage, "--addr"},
		{"http://127.0.0.1:1", exitUnavailable, "refused"},
	} {
		for _, args := range commands {
			code, out, errOut := cli(t, c.addr, args...)
			if code != c.want || !strings.Contains(errOut, c.says) {
				t.Errorf("capledger %s --addr %s: exit %d (want %d), stderr lacks %q:\n%s%s", strings.Join(args, " "), c.addr, code, c.want, c.says, out, errOut)
			}
		}
	}
	// reserve and record print a minted id to retry with only for a call
	// they send: a malformed --addr is refused before.
	for _, args := range [][]string{
		{"reserve", "--subject", "s", "--route", "r", "--units", "tokens=1"},
		{"record", "--subject", "s", "--route", "r", "--units", "tokens=1"},
	} {
		code, out, errOut := cli(t, "http://[::1", args...)
		if code != exitUsage || strings.Contains(errOut, "retry with --id") {
			t.Errorf("capledger %s --addr http://[::1: exit %d (want %d), or an id to retry a call never sent:\n%s%s", args[0], code, exitUsage, out, errOut)
		}
	}
}

// The flag package's own words about a flag spell it with one dash
// (`flag needs an argument: -route`); the help and every other message
// spell it --route. Messages about a flag spell it as the help does.
func TestCLIFlagMessagesSpellFlagsAsTheHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"reserve", "--subject", "s", "--route"}, "--route needs a value"},
		{[]string{"reserve", "-route"}, "--route needs a value"},
		{[]string{"policy", "get", "1", "--format"}, "--format needs a value"},
		{[]string{"backlog", "--limit", "99999999999999999999"}, `--limit "99999999999999999999": value out of range`},
	} {
		code, out, errOut := cli(t, "http://127.0.0.1:1", c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.says) || strings.Contains(errOut, " -"+strings.TrimLeft(strings.Fields(c.says)[0], "-")) {
			t.Errorf("capledger %s: exit %d (want %d), stderr lacks %q or spells the flag with one dash:\n%s%s", strings.Join(c.args, " "), code, exitUsage, c.says, out, errOut)
		}
	}
}
