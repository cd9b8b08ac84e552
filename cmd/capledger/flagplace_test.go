package main

import (
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// leaves returns every (sub)command's words ("policy", "get") and its run.
func leaves() map[string]runFunc {
	out := map[string]runFunc{}
	for name, c := range commands {
		if c.subs == nil {
			out[name] = c.run
		}
		for _, sub := range c.subs {
			out[name+" "+sub.name] = sub.run
		}
	}
	return out
}

// TestCLIFlagNamesMeanOneKindEverywhere: before a command's words are
// found (capledger --addr X policy list) its flag set is not known, so
// takeWord decides whether --name takes the next argument by every
// command's flags (valueFlags). That is exact only while no name is a
// boolean flag in one command and takes a value in another.
func TestCLIFlagNamesMeanOneKindEverywhere(t *testing.T) {
	value, boolean := flagKinds()
	if len(value) < 20 || !value["addr"] || !boolean["wait"] {
		t.Fatalf("the probe found %d value flags (addr: %v) and wait boolean: %v; it misses commands", len(value), value["addr"], boolean["wait"])
	}
	for name := range value {
		if boolean[name] {
			t.Errorf("--%s is boolean in one command and takes a value in another", name)
		}
	}
	for words, run := range leaves() {
		var p flagProbe
		if err := run(t.Context(), &env{getenv: func(string) string { return "" }}, []string{flagProbeArg}); !asProbe(err, &p) {
			t.Errorf("capledger %s does not parse its flags with parseFlags (the probe got %v)", words, err)
		}
	}
}

func asProbe(err error, p *flagProbe) bool {
	probe, ok := err.(flagProbe)
	*p = probe
	return ok
}

// TestContractCLIFlagsGoAnywhere: README ("Every command ...") and the
// pages show flags after a command's words (capledger policy list --addr
// X, capledger settle ID --operation OP); flags before the words or among
// them (capledger --addr X policy list, capledger policy --addr X list,
// capledger settle --operation OP ID) are the same command, for every
// command, with the same rule; "--" ends the flags; an unknown flag is a
// usage error (exit 1) naming it as typed (-x or --x) wherever it stands, also when a word
// follows it that names no command (it may be the flag's value).
func TestContractCLIFlagsGoAnywhere(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"))
	addr := []string{"--addr", srv.url}
	policy := writeFile(t, dir, "p.yaml", "subject: tenant-7\nroute: chat.generate\nholdTtl: 60s\nemergencyMode: true\n"+
		"dimensions:\n  - unit: tokens\n    burst: 1000\n")
	run := func(want int, args ...string) string {
		t.Helper()
		out, code := runBinary(t, bin, args...)
		if code != want {
			t.Fatalf("capledger %s: exit %d, want %d\n%s", strings.Join(args, " "), code, want, out)
		}
		return out
	}
	// The same command in every placement prints the same.
	same := func(forms ...[]string) {
		t.Helper()
		first := run(0, forms[0]...)
		for _, form := range forms[1:] {
			if out := run(0, form...); out != first {
				t.Errorf("capledger %s printed\n%s\nwhile capledger %s printed\n%s", strings.Join(form, " "), out, strings.Join(forms[0], " "), first)
			}
		}
	}
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	w := func(words ...string) []string { return words }

	run(0, cat(w("--addr", srv.url, "policy", "publish"), w(policy))...)
	// A flag whose value is a command word ("list", "get") is still that
	// flag's value; --id's value "-dash" begins with "-".
	run(0, cat(w("--subject", "tenant-7", "reserve", "--route", "chat.generate", "--units", "tokens=10", "--id", "list"), addr)...)
	run(0, cat(w("reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "-dash"), addr)...)
	run(0, cat(addr, w("start", "--operation", "get", "list"))...)
	same(cat(w("policy", "list", "--subject", "tenant-7"), addr), cat(addr, w("policy", "list", "--subject", "tenant-7")),
		cat(w("policy"), addr, w("list", "--subject", "tenant-7")), cat(w("policy", "--subject", "tenant-7", "list", "--addr", srv.url)))
	same(cat(w("policy", "get", "1"), addr), cat(addr, w("policy", "get", "1")), cat(w("policy"), addr, w("get", "1")),
		cat(w("policy", "--format", "json", "get"), addr, w("1")))
	// The first settle answers as the first; the rest replay it.
	run(0, cat(w("settle", "list", "--operation", "get", "--units", "tokens=4"), addr)...)
	same(cat(w("settle", "list", "--operation", "get", "--units", "tokens=4"), addr),
		cat(w("settle", "--operation", "get", "list", "--units", "tokens=4"), addr),
		cat(addr, w("--units", "tokens=4", "settle", "--operation", "get", "list")),
		cat(w("settle", "--operation", "get", "--units", "tokens=4"), addr, w("--", "list")))
	same(cat(w("get", "--id", "-dash"), addr), cat(w("get"), addr, w("--", "-dash")), cat(addr, w("get", "--", "-dash")))
	same(cat(w("shard", "list"), addr), cat(addr, w("shard", "list")), cat(w("shard"), addr, w("list")))
	same(cat(w("rollout", "list"), addr), cat(addr, w("rollout", "list")), cat(w("rollout"), addr, w("list")))
	same(cat(w("account", "--subject", "tenant-7", "--route", "chat.generate"), addr),
		cat(addr, w("--subject", "tenant-7", "account", "--route", "chat.generate")))
	// After "--" a flag is an argument: two ids, not an id and a flag.
	if out := run(exitUsage, cat(w("get"), addr, w("--", "-dash", "--addr"))...); !strings.Contains(out, "want one reservation id, got 2") {
		t.Errorf("get -- -dash --addr: %s; want two ids refused", out)
	}

	// Without any command word. The flag is named as typed: -bogus
	// with one dash, --bogus with two (the flag package accepts both).
	for _, typed := range []string{"--bogus", "-bogus"} {
		for _, args := range [][]string{w(typed), w(typed, "x"), w(typed+"=1", "x")} {
			if out := run(exitUsage, args...); !strings.Contains(out, "unknown flag "+typed+"\n") {
				t.Errorf("capledger %s: %s; want the unknown flag %s named as typed", strings.Join(args, " "), out, typed)
			}
		}
	}

	// Every (sub)command: an unknown flag before, among or after its
	// words is a usage error naming it; a value flag before the words
	// whose value is a command word takes it.
	for words, leaf := range leaves() {
		var p flagProbe
		asProbe(leaf(t.Context(), &env{getenv: func(string) string { return "" }}, []string{flagProbeArg}), &p)
		valueFlag := ""
		p.fs.VisitAll(func(f *flag.Flag) {
			if g, ok := f.Value.(flag.Getter); ok && valueFlag == "" {
				if _, isString := g.Get().(string); isString && f.Name != "addr" {
					valueFlag = f.Name
				}
			}
		})
		parts := strings.Fields(words)
		// An unknown flag may have taken the word after it as its value
		// ("--bogus x"): the flag, not that word, is what is wrong. It is
		// named as typed, with one dash or two.
		for _, typed := range []string{"--bogus", "-bogus"} {
			placements := [][]string{cat(w(typed), parts), cat(parts, w(typed)), cat(w(typed, "x"), parts)}
			if len(parts) == 2 {
				placements = append(placements, w(parts[0], typed, parts[1]), w(parts[0], typed, "x", parts[1]))
			}
			if valueFlag != "" {
				placements = append(placements, cat(w("--"+valueFlag, "policy"), parts, w(typed)))
			}
			for _, args := range placements {
				out, code := runBinary(t, bin, args...)
				if code != exitUsage || !strings.Contains(out, "unknown flag "+typed+"\n") {
					t.Errorf("capledger %s: exit %d; want %d naming the unknown flag %s as typed\n%s", strings.Join(args, " "), code, exitUsage, typed, out)
				}
			}
		}
	}
}

// TestScanArgs: the one rule of where flags go, argument by argument: a
// flag is "-" and more ("-" alone is standard input, "" an empty
// positional argument); --name value takes the next argument, whatever
// it looks like, only when name takes a value and no "=" gave it one; a
// boolean or unknown flag takes none; "--" ends the flags.
func TestScanArgs(t *testing.T) {
	takes := func(name string) bool { return name == "addr" || name == "id" || name == "timeout" }
	const (
		p = argPositional
		f = argFlag
		v = argFlagValue
		e = argEndOfFlags
	)
	for _, c := range []struct {
		args []string
		want []argKind
	}{
		{[]string{"policy", "get", "7", "--addr", "x"}, []argKind{p, p, p, f, v}},
		{[]string{"--addr=x", "policy", "list"}, []argKind{f, p, p}},
		{[]string{"-addr=x", "get", "r1"}, []argKind{f, p, p}},
		{[]string{"-", "--addr", "x"}, []argKind{p, f, v}},
		{[]string{"get", "", "--addr", "x"}, []argKind{p, p, f, v}},
		{[]string{"--wait", "7"}, []argKind{f, p}},
		{[]string{"--bogus", "7"}, []argKind{f, p}},
		{[]string{"--timeout", "-1s", "--id", "--"}, []argKind{f, v, f, v}},
		{[]string{"settle", "--", "--addr", "-r1"}, []argKind{p, e, p, p}},
		{[]string{"get", "--addr"}, []argKind{p, f}},
	} {
		if got := scanArgs(c.args, takes); !slices.Equal(got, c.want) {
			t.Errorf("scanArgs(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}

// TestParseFlagsBooleanTakesNoWord: a boolean flag before a positional
// argument leaves it positional ("capledger get --wait r1" gets r1); a
// value flag takes the next word.
func TestParseFlagsBooleanTakesNoWord(t *testing.T) {
	fs := newFlags("get")
	wait := fs.Bool("wait", false, "")
	addr := fs.String("addr", "", "")
	positional, err := parseFlags(fs, []string{"--wait", "r1", "--addr", "x", "r2"})
	if err != nil || !slices.Equal(positional, []string{"r1", "r2"}) || !*wait || *addr != "x" {
		t.Fatalf("parseFlags: positional %q, wait %v, addr %q, %v; want [r1 r2], true, x", positional, *wait, *addr, err)
	}
}
