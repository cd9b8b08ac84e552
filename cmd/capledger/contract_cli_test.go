package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The tests of this file are the operator's side of the documentation's
// outside check: they run the real binary as README.md's command table,
// docs/OPERATIONS.md and docs/ROLLOUT.md tell an on-call engineer to, and
// check the exit codes and messages those pages promise.

// TestContractCLIFileOfTheWrongShapeIsAUsageError: a file the CLI reads
// (a policy file, JSON or YAML; `shard reconcile --receipts`; `serve
// --resolver-config`) whose document is not the shape it wants (a list
// or a number for a policy's mapping, a mapping for the receipts' list)
// is "bad input" with "a clear error" (exit 1, README's exit codes),
// never a crash: before, the strict key check indexed the path of a
// field that the document itself has none of, and the binary panicked
// with exit 2, the code of a capacity rejection.
func TestContractCLIFileOfTheWrongShapeIsAUsageError(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// Nothing must be sent: the address answers nothing, so a command
	// that went on to call it would exit 5, not 1.
	noServer := "http://127.0.0.1:1"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a JSON policy file holding a list", []string{"policy", "publish", "--addr", noServer,
			write("list.json", `[{"subject":"t","route":"r","dimensions":[{"unit":"tokens","burst":5}]}]`)},
			"the file holds a list; want a mapping (key: value)"},
		{"a YAML policy file holding a list", []string{"policy", "publish", "--addr", noServer,
			write("list.yaml", "- subject: t\n- route: r\n")},
			"the file holds a list; want a mapping (key: value)"},
		{"a JSON policy file holding a number", []string{"policy", "publish", "--addr", noServer,
			write("n.json", "42\n")},
			"the file holds 42; want a mapping (key: value)"},
		{"receipts holding a mapping", []string{"shard", "reconcile", "s-1", "--gateway", "gw-1", "--addr", noServer,
			"--receipts", write("receipts.json", `{"reservation_id":"x","state":"RELEASED","reserved_units":{"tokens":1}}`)},
			"the file holds a mapping; want a list"},
		{"an Envoy mapping file holding a list", []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
			"--envoy-config", write("envoy.yaml", "- domain: d\n")},
			"the file holds a list; want a mapping (key: value)"},
		{"a resolver config holding a list", []string{"serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"),
			"--resolver-config", write("resolver.json", `[{"routes":{}}]`)},
			"the file holds a list; want a mapping (key: value)"},
	} {
		out, code := runBinary(t, bin, c.args...)
		if code != exitUsage || strings.Contains(out, "panic") || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d, output:\n%s\nwant exit 1 and a message holding %q", c.name, code, out, c.want)
		}
	}
}

// TestContractOperationsFlagRangeExample runs the refusal OPERATIONS.md's
// "Flag ranges" quotes (`capledger serve: --FLAG VALUE: want ...`)
// literally and compares the message word for word: the page's example
// once named a value (2562048h0m0s) no duration flag can even hold, so no
// operator could ever see it.
func TestContractOperationsFlagRangeExample(t *testing.T) {
	bin := buildBinary(t)
	raw, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "## Flag ranges")
	end := strings.Index(doc[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal(`docs/OPERATIONS.md: no "Flag ranges" section`)
	}
	section := strings.Join(strings.Fields(doc[start:start+1+end]), " ")
	m := regexp.MustCompile("`(capledger serve: (--[a-z-]+) ([^ :`]+): want [^`]+)`").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("docs/OPERATIONS.md, Flag ranges: no quoted `capledger serve: --FLAG VALUE: want ...` refusal")
	}
	quoted, flagName, value := m[1], m[2], m[3]
	out, code := runBinary(t, bin, "serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"), flagName, value)
	first, _, _ := strings.Cut(out, "\n")
	if code != exitUsage || first != quoted {
		t.Errorf("capledger serve %s %s: exit %d, first line\n%s\nOPERATIONS.md quotes (exit 1)\n%s", flagName, value, code, first, quoted)
	}
}

// TestContractCLIExitCodes runs the real binary against a real `capledger
// serve` for every case README.md's "Exit codes" (and `capledger --help`)
// names, and checks the code each ends with: 0 ok; 1 bad flags, an invalid
// request, a refused token, an unknown command; 2 a capacity rejection; 3
// not found; 4 already settled, released, operation mismatch, the id reused
// for another request, a stale policy file, `rollback --wait` not drained
// after --max-wait or holding capacity no policy can take; 5 no server.
func TestContractCLIExitCodes(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"), "--tokens", writeFile(t, dir, "tokens",
		"ops-admin-token-7f3a9c2e51d4 admin ops\nwatch-token-9d2c4e6f8a1b viewer watcher\n"))
	admin := []string{"--addr", srv.url, "--token", "ops-admin-token-7f3a9c2e51d4"}
	policy := writeFile(t, dir, "tenant-7.yaml", "subject: tenant-7\nroute: chat.generate\nholdTtl: 60s\n"+
		"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 10\n    refillInterval: 1s\n")
	other := writeFile(t, dir, "z.yaml", "subject: z\nroute: q\nholdTtl: 60s\ndimensions:\n  - unit: tokens\n    burst: 100\n")
	star := writeFile(t, dir, "star.yaml", "subject: \"*\"\nroute: q\nholdTtl: 60s\ndimensions:\n  - unit: tokens\n    burst: 100\n")
	var stale string
	steps := []struct {
		name string
		args []string
		want int
	}{
		{"--help", []string{"--help"}, exitOK},
		{"an unknown command", []string{"nosuch"}, exitUsage},
		{"an unknown flag", []string{"reserve", "--bogus"}, exitUsage},
		{"publish", []string{"policy", "publish", policy}, exitOK},
		{"reserve", []string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600", "--id", "a"}, exitOK},
		{"reserve the same again (a replay)", []string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600", "--id", "a"}, exitOK},
		{"the id reused for another request", []string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=700", "--id", "a"}, exitConflict},
		{"rejected by capacity", []string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=600", "--id", "b"}, exitRejected},
		{"an invalid request (zero units)", []string{"reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=0", "--id", "c"}, exitUsage},
		{"no active policy", []string{"reserve", "--subject", "nobody", "--route", "chat.generate", "--units", "tokens=1", "--id", "d"}, exitNotFound},
		{"an unknown reservation", []string{"get", "nosuch"}, exitNotFound},
		{"an unknown generation", []string{"policy", "get", "99"}, exitNotFound},
		{"start", []string{"start", "a", "--operation", "op-a"}, exitOK},
		{"an operation mismatch", []string{"start", "a", "--operation", "op-b"}, exitConflict},
		{"release of started work", []string{"release", "a"}, exitConflict},
		{"settle", []string{"settle", "a", "--operation", "op-a", "--units", "tokens=100"}, exitOK},
		{"settled already, other usage", []string{"settle", "a", "--operation", "op-a", "--units", "tokens=101"}, exitConflict},
		{"a viewer publishing (a refused token)", []string{"policy", "publish", policy, "--token", "watch-token-9d2c4e6f8a1b"}, exitUsage},
		{"a stale policy file", nil, exitConflict},
		{"publish a key no '*' policy covers", []string{"policy", "publish", other}, exitOK},
		{"a hold on it", []string{"reserve", "--subject", "z", "--route", "q", "--units", "tokens=10", "--id", "z-1"}, exitOK},
		{"rollback --wait with capacity no policy can take", []string{"rollback", "3", "--wait", "--max-wait", "1m", "--interval", "100ms"}, exitConflict},
		{"a '*' policy for the route, which can take it", []string{"policy", "publish", star}, exitOK},
		{"rollback --status --wait not drained after --max-wait (the hold)", []string{"rollback", "--status", "3", "--wait", "--max-wait", "300ms", "--interval", "100ms"}, exitConflict},
		{"no server", []string{"account", "--subject", "tenant-7", "--route", "chat.generate", "--addr", "http://127.0.0.1:1"}, exitUnavailable},
	}
	for _, s := range steps {
		args := s.args
		if s.name == "a stale policy file" {
			// policy get 1 --format yaml, a newer generation published,
			// then the copy of 1 published: OPERATIONS.md's stale.yaml.
			out, code := runBinary(t, bin, append([]string{"policy", "get", "1", "--format", "yaml"}, admin...)...)
			if code != exitOK {
				t.Fatalf("policy get 1: exit %d: %s", code, out)
			}
			stale = writeFile(t, dir, "stale.yaml", strings.Replace(out, "burst: 1000", "burst: 1500", 1))
			newer := writeFile(t, dir, "newer.yaml", strings.Replace(out, "burst: 1000", "burst: 2000", 1))
			if out, code := runBinary(t, bin, append([]string{"policy", "publish", newer}, admin...)...); code != exitOK {
				t.Fatalf("policy publish of generation 2: exit %d: %s", code, out)
			}
			args = []string{"policy", "publish", stale}
		}
		if len(args) > 0 && args[0] != "--help" && args[0] != "nosuch" {
			// The server's address and the admin's token, after the
			// (sub)command's words, unless the step gives its own.
			args = slices.Clone(args)
			for i := 0; i < len(admin); i += 2 {
				if !slices.Contains(args, admin[i]) {
					args = append(args, admin[i], admin[i+1])
				}
			}
		}
		out, code := runBinary(t, bin, args...)
		if code != s.want {
			t.Errorf("%s (capledger %s): exit %d; README.md says %d\n%s", s.name, strings.Join(args, " "), code, s.want, out)
		}
	}
}

// TestContractRolloutHistoryHasNoTrailingSpaces: ROLLOUT.md shows `rollout
// get`'s step table as it prints, and its lines end where their text
// does; a step without a note (create, set) once ended in the padding of
// its AT column, so the page's lines and the command's never compared
// equal, and a script matching `...Z$` missed them.
func TestContractRolloutHistoryHasNoTrailingSpaces(t *testing.T) {
	out := rolloutHistory(t)
	steps := 0
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("rollout get: line %q ends in spaces", line)
		}
		if regexp.MustCompile(`^[1-4] +(create|set|undo) `).MatchString(line) {
			steps++
		}
	}
	if steps != 4 {
		t.Errorf("rollout get: %d step lines; want 4:\n%s", steps, out)
	}
}

// TestContractRolloutHistoryColumnsLineUp: ROLLOUT.md shows `rollout
// get`'s step table with its AT and NOTE headings over the times and the
// notes. A step without a note ends with its time (no trailing padding,
// above), which took the AT column's width from the header: it printed
// "AT  NOTE", the NOTE heading over the times and the notes 20 columns
// to its right.
func TestContractRolloutHistoryColumnsLineUp(t *testing.T) {
	out := rolloutHistory(t)
	header := -1
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "STEP ") {
			header = i
		}
	}
	if header < 0 || header+4 >= len(lines) {
		t.Fatalf("rollout get: no step table of 4 steps:\n%s", out)
	}
	at, note := strings.Index(lines[header], " AT ")+1, strings.Index(lines[header], " NOTE")+1
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`)
	notes := 0
	for _, line := range lines[header+1 : header+5] {
		if loc := stamp.FindStringIndex(line); loc == nil || loc[0] != at {
			t.Errorf("rollout get: the time of %q is not under AT (column %d):\n%s", line, at, out)
		}
		if j := regexp.MustCompile(`(undone by|undoes) step \d+$`).FindStringIndex(line); j != nil {
			notes++
			if j[0] != note {
				t.Errorf("rollout get: the note of %q starts at column %d, not under NOTE (column %d):\n%s", line, j[0], note, out)
			}
		}
	}
	if notes != 2 {
		t.Errorf("rollout get: %d step lines with a note; want 2:\n%s", notes, out)
	}
}

// TestContractSimBadFlagsAreUsageErrors: docs/SIMULATOR.md's exit codes
// say bad flags exit 1 and nothing runs. A negative --min-fires (the
// site gate's minimum; -5 ran with the default gate), an --only naming no
// fault site (",": every site on, the opposite of what was asked) and a
// negative --audit-every were not all refused that way: the first two
// ran and passed (exit 0), the last said "audit-every -1: negative"
// rather than the "--FLAG VALUE: want ..." of every other range.
func TestContractSimBadFlagsAreUsageErrors(t *testing.T) {
	bin := buildBinary(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--min-fires", "-5"}, "capledger sim: --min-fires -5: want 0 to 9223372036854775807"},
		{[]string{"--min-fires", "-1"}, "capledger sim: --min-fires -1: want 0 to 9223372036854775807"},
		{[]string{"--only", ","}, `capledger sim: --only ",": names no fault site`},
		{[]string{"--only", " "}, `capledger sim: --only " ": names no fault site`},
		{[]string{"--audit-every", "-1"}, "capledger sim: --audit-every -1: want 0 to 9223372036854775807"},
		{[]string{"--reports", "-1"}, "capledger sim: --reports -1: want 0 to 9223372036854775807"},
	} {
		args := append([]string{"sim", "--seed", "1", "--interleavings", "1", "--workers", "1"}, c.args...)
		out, code := runBinary(t, bin, args...)
		first, _, _ := strings.Cut(out, "\n")
		if code != exitUsage || first != c.want || strings.Contains(out, "RESULT") {
			t.Errorf("capledger %s: exit %d, output:\n%s\nwant exit 1, nothing run, first line\n%s", strings.Join(args, " "), code, out, c.want)
		}
	}
	// A run's own --min-fires 0 and an --only of one site still run.
	for _, extra := range [][]string{{"--min-fires", "0"}, {"--only", "net_drop,"}} {
		args := append([]string{"sim", "--seed", "1", "--interleavings", "1", "--workers", "1"}, extra...)
		if out, code := runBinary(t, bin, args...); code != exitOK || !strings.Contains(out, "RESULT: PASS") {
			t.Errorf("capledger %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
}

// serve on a port another process holds exits 1 before it opens the
// store, saying what to do: stop the other process or give --addr.
func TestServeOnATakenPortSaysWhatToDo(t *testing.T) {
	bin := buildBinary(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	data := filepath.Join(t.TempDir(), "data")
	out, code := runBinary(t, bin, "serve", "--addr", ln.Addr().String(), "--data-dir", data)
	if code != exitUsage || !strings.Contains(out, "address already in use") || !strings.Contains(out, "give another with --addr") {
		t.Fatalf("serve on a taken port: exit %d, %s", code, out)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve on a taken port touched its data directory: %v", err)
	}
}

// rolloutHistory runs a real serve, publishes a shadow policy, makes a
// rollout of four steps (create, set, set, undo) as ROLLOUT.md does, and
// returns what `rollout get` printed.
func rolloutHistory(t *testing.T) string {
	t.Helper()
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"))
	policy := writeFile(t, dir, "p.yaml", "subject: \"*\"\nroute: moderate.text\nrollout: shadow\nholdTtl: 60s\n"+
		"dimensions:\n  - unit: tokens\n    burst: 1000\n")
	var out string
	for _, args := range [][]string{
		{"policy", "publish", policy},
		{"rollout", "create", "llm", "--routes", "moderate.text", "--by", "route"},
		{"rollout", "set", "--percent", "1"},
		{"rollout", "set", "--percent", "50"},
		{"rollout", "undo"},
		{"rollout", "get", "llm"},
	} {
		var code int
		out, code = runBinary(t, bin, append(args, "--addr", srv.url)...)
		if code != exitOK {
			t.Fatalf("capledger %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
	return out
}
