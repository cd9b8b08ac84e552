package main

import (
	"strings"
	"testing"
)

// Retention flags that would lose a retry's answer are refused before
// anything listens or opens.
func TestServeRefusesBadRetentionFlags(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--retention", "2h", "--tombstone-retention", "1h"},
		{"--retention", "-1s"},
		{"--retention-interval", "0s"},
	} {
		code, out, errOut := cli(t, "", append([]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", dir}, args...)...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "retention") {
			t.Fatalf("%v: %q does not say what is wrong", args, errOut)
		}
	}
}

// A maintenance share outside (0, 1] is refused before anything listens
// or opens.
func TestServeRefusesBadMaintenanceShare(t *testing.T) {
	dir := t.TempDir()
	for _, share := range []string{"0", "-0.5", "1.5", "NaN", "many"} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--data-dir", dir, "--maintenance-share", share)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "maintenance-share") {
			t.Fatalf("--maintenance-share %s: %q does not say what is wrong", share, errOut)
		}
	}
}

// --cache-rows is SQLite's row cache: given with a store that has none
// (PostgreSQL, memory) serve refuses it rather than take it for a memory
// setting, and says why.
func TestServeRefusesCacheRowsWithoutSQLite(t *testing.T) {
	for _, spec := range []string{"memory", "postgres://127.0.0.1:1/none"} {
		code, out, errOut := cli(t, "", "serve", "--addr", "127.0.0.1:0", "--store", spec, "--cache-rows", "1000")
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "row cache is for SQLite") {
			t.Fatalf("--store %s --cache-rows 1000: %q does not say what is wrong", spec, errOut)
		}
	}
	// Not given, its default is no refusal, and with SQLite it is taken.
	startInProcess(t, "--store", "memory")
	startInProcess(t, "--cache-rows", "1000")
}

// A flag value of the wrong form says what the flag wants: a duration
// without a unit (--retention 72, read by a new user as hours) must not
// answer only "parse error".
func TestFlagValueErrorsSayWhatTheFlagWants(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--data-dir", dir, "--retention", "72"}, `--retention "72": want a duration with a unit`},
		{[]string{"serve", "--data-dir", dir, "--tombstone-retention=30d"}, `--tombstone-retention "30d": want a duration with a unit`},
		// Too long for a Go duration: the flag package says "parse error"
		// as for a missing unit, and the answer said only "with a unit".
		{[]string{"serve", "--data-dir", dir, "--shard-max-ttl", "2562048h"}, `--shard-max-ttl "2562048h": want a duration with a unit, such as 500ms, 30s, 5m or 72h, of at most 2562047h47m16.854775807s`},
		{[]string{"serve", "--data-dir", dir, "--max-body", "1k"}, `--max-body "1k": want a whole number`},
		{[]string{"audit", "--progress=maybe"}, `--progress "maybe": want true or false`},
	} {
		code, out, errOut := cli(t, "", tc.args...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "parse error") {
			t.Fatalf("%v: %q, want %q", tc.args, errOut, tc.want)
		}
	}
}

// --statement-retention is refused before anything opens when it is
// shorter than a day, or given with --retention 0 (no retention pass to
// run it). The store named cannot be reached, so a serve that went on
// fails there instead, fast, with another message.
func TestServeRefusesBadStatementRetention(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--statement-retention", "48h", "--retention", "0"}, "needs the retention pass"},
		{[]string{"--statement-retention", "23h"}, "--statement-retention"},
	} {
		code, out, errOut := cli(t, "", append([]string{"serve", "--addr", "127.0.0.1:0", "--store", "postgres://127.0.0.1:1/none"}, c.args...)...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, c.want) {
			t.Fatalf("%v: %q does not say what is wrong (%q)", c.args, errOut, c.want)
		}
	}
}
