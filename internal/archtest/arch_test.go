package archtest

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// layer says what one package of the module may import. Package paths are
// relative to the module ("store/sqlite"); "api/..." names api and every
// package below it, "*" every package of the module.
type layer struct {
	pkg string
	// imports: the packages of ours its non-test files may import.
	imports []string
	// testImports: if not nil, the packages of ours its test files may
	// import (besides the package itself); nil leaves tests free, because
	// an end-to-end test of a store or of the SDK legitimately runs a whole
	// server.
	testImports []string
	// stdOnly: every import outside the module must be the standard
	// library.
	stdOnly bool
	// pure: no clock reads (time.Now, time.Since, time.Until), no timers
	// or sleeps, and no randomness packages in its non-test files; time
	// arrives as a `now` argument and randomness as a seeded source, from
	// the engine or the simulator. If pureTests is set, the rule covers its
	// test files too.
	pure, pureTests bool
	// waits relaxes pure for a store driver: it may bound an I/O wait with
	// a timer (time.After, a sleep between busy retries), which cannot put
	// a time into a row; it still may not read the clock.
	waits bool
	why   string
}

// layers is DESIGN.md's "Layout" as rules. Arrows point down only:
// cmd -> server, sim -> engine -> ledger; engine -> store -> ledger;
// server -> api; client -> api (and ledger); envoyrls -> server. Nothing
// else imports server, and nothing imports cmd (a main package).
var layers = []layer{
	{pkg: "ledger", imports: nil, testImports: []string{}, stdOnly: true, pure: true, pureTests: true,
		why: "the pure state machine: standard library only, no I/O, no clock, no rand; it never knows which store it runs on"},

	{pkg: "store", imports: []string{"ledger"}, testImports: []string{"ledger"}, pure: true,
		why: "the Store interface and the driver-neutral errors; rows are ledger types"},
	{pkg: "store/codec", imports: []string{"ledger"}, testImports: []string{"ledger"}, pure: true,
		why: "encodes ledger rows for the SQL drivers; decides nothing"},
	{pkg: "store/migration", imports: nil, testImports: []string{}, stdOnly: true, pure: true,
		why: "reads and checks the SQL drivers' embedded, numbered migrations; applying them is each driver's"},
	{pkg: "store/memstore", imports: []string{"ledger", "store", "store/codec"}, pure: true, waits: true,
		why: "a driver: stores rows, never ledger semantics, never the engine or the server"},
	{pkg: "store/sqlite", imports: []string{"ledger", "store", "store/codec", "store/migration"}, pure: true, waits: true,
		why: "a driver: stores rows, never ledger semantics, never the engine or the server"},
	{pkg: "store/postgres", imports: []string{"ledger", "store", "store/codec", "store/migration"}, pure: true, waits: true,
		why: "a driver: stores rows, never ledger semantics, never the engine or the server"},
	{pkg: "store/postgres/failovergate", imports: nil,
		why: "test files only: the failover gate runs real serve processes on a pg_auto_failover formation"},
	{pkg: "store/storetest", imports: []string{"ledger", "store", "store/codec"},
		// Not pure: testTimePrecision stores a time.Now() on purpose, to
		// prove that a monotonic clock reading is dropped on the way in.
		why: "the conformance suite every driver passes; it knows drivers only through store.Store"},
	{pkg: "store/open", imports: []string{"store", "store/memstore", "store/sqlite", "store/postgres"},
		why: "turns an operator's --store spec into a driver; only cmd wires stores, so only cmd may import it"},

	// Its tests may also read its logs through internal/logcapture, a
	// leaf that knows nothing of the ledger.
	{pkg: "engine", imports: []string{"ledger", "store"}, testImports: []string{"internal/logcapture", "internal/replicatest", "internal/tmpfs", "ledger", "store/..."},
		why: "orders, batches and commits commands through the Store interface; it owns the clock and the workers, never a concrete driver, the network or the simulator"},

	{pkg: "api/digest", imports: nil, testImports: []string{}, stdOnly: true, pure: true,
		why: "the canonical request digest, shared by the SDK (which sends it) and the server (which derives it)"},
	{pkg: "api/opstatus", imports: nil, testImports: []string{}, stdOnly: true,
		why: "the operation-status endpoint's wire form and signatures, shared by the SDK (which serves it) and the resolver's HTTP client (which cmd wires)"},
	{pkg: "api/hotjson", imports: []string{"api/capledger/v1"}, testImports: []string{"api/capledger/v1"}, pure: true,
		why: "the hand-written JSON codec of the hot messages (protojson for the rest), shared by the server (which decodes requests) and the SDK (which decodes answers)"},
	{pkg: "api/capledger/v1", imports: nil,
		why: "generated protobuf code"},
	{pkg: "api/capledger/v1/capledgerv1connect", imports: []string{"api/capledger/v1"},
		why: "generated Connect code"},

	{pkg: "server", imports: []string{"api/...", "engine", "ledger", "store"},
		// store (the interface package) only for its driver-neutral errors
		// (store.ErrNotFound -> NOT_FOUND, ErrConflict -> ABORTED); the
		// server is handed an engine and never opens or names a driver.
		why: "the network face over the engine"},

	{pkg: "envoyrls", imports: []string{"api/...", "internal/yamlfile", "ledger", "server"},
		// The one package beside the server that imports it: a protocol
		// adapter reaches the ledger only through the server's exported
		// command path (ReserveCommand, SettleCommand, Run), never the
		// engine or a store, so there is no second accounting.
		// internal/yamlfile reads its mapping file as cmd reads a policy.
		why: "Envoy's rate limit service, translated into the LedgerService's commands"},

	{pkg: "sched", imports: nil, testImports: []string{}, stdOnly: true, pure: true,
		why: "weighted fair selection among already-RESERVED requests; a leaf that admits nothing"},

	{pkg: "client", imports: []string{"api/...", "ledger", "sched"},
		// ledger for the emergency-shard local ledger; sched for FairQueue,
		// which orders requests the ledger already reserved. Never engine,
		// a store or the server: a gateway links only the SDK.
		why: "the Go SDK for gateways"},

	{pkg: "sim", imports: []string{"engine", "ledger", "store", "store/memstore", "store/sqlite", "sched"},
		why: "the deterministic simulator drives the very engine and ledger that run in production, on the in-memory store (and, for a share of interleavings, the real SQLite store)"},

	{pkg: "console", imports: nil, stdOnly: true,
		why: "the operator console's embedded page: it runs in the browser as a client of the public JSON API with the caller's token, so it imports nothing of ours"},

	{pkg: "examples/gateway", imports: []string{"api/...", "client"},
		why: "an example gateway uses only what a real gateway can: the SDK and the API"},

	{pkg: "cmd/capledger", imports: []string{"*"},
		why: "the one binary wires everything: flags -> calls"},

	{pkg: "internal/yamlfile", imports: nil, testImports: []string{},
		why: "reads an operator's YAML or JSON file (a policy, the Envoy mapping) strictly and one document per file, for cmd and envoyrls alike; it knows nothing of the ledger"},
	{pkg: "internal/faultproxy", imports: nil, stdOnly: true,
		why: "a test helper: a TCP proxy that injects network faults (lost answers, lost requests, torn messages, partitions) between a client and a server; it knows nothing of the ledger"},
	{pkg: "internal/childproc", imports: nil, testImports: []string{}, stdOnly: true,
		why: "a test helper that ties a test's child processes to the test binary's life; it knows nothing of the ledger"},
	{pkg: "internal/logcapture", imports: nil, testImports: []string{}, stdOnly: true, pure: true, pureTests: true,
		why: "a test helper: a logger whose lines a test reads while the code under test still writes them; it knows nothing of the ledger"},
	{pkg: "internal/replicatest", imports: []string{"client", "internal/childproc", "internal/logcapture", "internal/testport"}, testImports: []string{},
		why: "a test helper for store/postgres, its failover gate and the SDK's replica tests: runs serve replicas on a fresh PostgreSQL schema as child processes and checks their clients' histories against a linearizability model of one account; it reaches the ledger only through the SDK's errors"},
	{pkg: "internal/racingstore", imports: []string{"store"}, testImports: []string{},
		why: "a test helper for server and envoyrls: a store that publishes a policy at each policy-cache catch-up, so a command is stale on every attempt; it wraps the store interface and names no driver"},
	{pkg: "internal/testbinary", imports: nil, testImports: []string{}, stdOnly: true,
		why: "a test helper that builds the commands a package's tests run as child processes, once per test binary; it knows nothing of the ledger"},
	{pkg: "internal/tmpfs", imports: nil, testImports: []string{}, stdOnly: true,
		why: "a test helper that mounts a size-limited tmpfs for the full-disk tests (a real ENOSPC); it knows nothing of the ledger"},
	{pkg: "internal/testport", imports: nil, testImports: []string{}, stdOnly: true,
		why: "a test helper that picks loopback ports below the ephemeral range for servers a test starts as child processes; it knows nothing of the ledger"},
	{pkg: "internal/pgformation", imports: []string{"internal/testport"}, testImports: []string{},
		why: "a test helper that runs a real pg_auto_failover formation; it knows nothing of the ledger"},
	{pkg: "scripts/auditsize", imports: []string{"engine", "ledger", "store/sqlite"},
		why: "a measurement tool: fills a SQLite store through the engine and audits it (docs/PERFORMANCE.md)"},
	{pkg: "scripts/rollover", imports: []string{"engine", "ledger", "store/sqlite"},
		why: "a measurement tool: reserves through the engine over SQLite across an epoch rollover (docs/PERFORMANCE.md)"},
	{pkg: "scripts/cutheap", imports: []string{"engine", "ledger", "store", "store/sqlite"},
		why: "a measurement tool: profiles the heap of a checkpoint cut over a SQLite store (docs/PERFORMANCE.md)"},
	{pkg: "scripts/drainheap", imports: []string{"engine", "store/sqlite"},
		why: "a measurement tool: runs the drain pass and a new epoch leader's first pass over a SQLite store of many policies (docs/PERFORMANCE.md)"},
	{pkg: "scripts/debtlist", imports: []string{"engine", "ledger", "store", "store/sqlite", "store/postgres"},
		why: "a measurement tool: times a ListDebts page over a SQLite or PostgreSQL store of many accounts (docs/PERFORMANCE.md)"},
	{pkg: "scripts/manypolicies", imports: nil, stdOnly: true,
		why: "a measurement tool: publishes many policies and times the calls over the public JSON API (docs/PERFORMANCE.md, Many policies); a client of the API, it imports nothing of ours"},
	{pkg: "scripts/failoverload", imports: nil, stdOnly: true,
		why: "a check tool: reserves over the public JSON API through failovers and verifies every acknowledged id (docs/OPERATIONS.md, pg_auto_failover); a client of the API, it imports nothing of ours"},

	{pkg: "internal/archtest", imports: nil, testImports: []string{},
		why: "this test"},
	{pkg: "internal/doclinks", imports: nil, testImports: []string{}, stdOnly: true,
		why: "a test of the Markdown files' relative links and anchors; it reads files, not code"},
}

// pkgInfo is what the checker reads of one package directory.
type pkgInfo struct {
	rel         string // path inside the module, "/"-separated
	dir         string
	imports     []string
	testImports []string // internal and external test files
	goFiles     []string // non-test files, full paths
	testFiles   []string // test files, full paths
}

// moduleRoot returns the directory holding go.mod, searching up from the
// working directory, and the module path it declares.
func moduleRoot() (dir, modulePath string, err error) {
	dir, err = os.Getwd()
	if err != nil {
		return "", "", err
	}
	for {
		if _, statErr := os.Stat(filepath.Join(dir, "go.mod")); statErr == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
	modulePath, err = readModulePath(filepath.Join(dir, "go.mod"))
	return dir, modulePath, err
}

// readModulePath returns the path on the module line of a go.mod file, or
// an error if the file has none.
func readModulePath(goMod string) (string, error) {
	f, err := os.Open(goMod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(lines.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := lines.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no module line", goMod)
}

// loadPackages returns every package directory below root (skipping
// testdata, vendor and hidden or underscore directories, as the go command
// does), with the imports of the files that build on this platform.
func loadPackages(root string) ([]pkgInfo, error) {
	var pkgs []pkgInfo
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module is not ours to check
			}
		}
		bp, err := build.Default.ImportDir(path, 0)
		if err != nil {
			var noGo *build.NoGoError
			if errors.As(err, &noGo) {
				return nil
			}
			return fmt.Errorf("read package %s: %w", path, err)
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		info := pkgInfo{rel: filepath.ToSlash(rel), dir: path, imports: bp.Imports}
		info.testImports = append(slices.Clone(bp.TestImports), bp.XTestImports...)
		for _, f := range bp.GoFiles {
			info.goFiles = append(info.goFiles, filepath.Join(path, f))
		}
		for _, f := range append(slices.Clone(bp.TestGoFiles), bp.XTestGoFiles...) {
			info.testFiles = append(info.testFiles, filepath.Join(path, f))
		}
		pkgs = append(pkgs, info)
		return nil
	})
	return pkgs, err
}

// matches reports whether the module-relative package rel is named by one
// of patterns ("x", "x/..." for x and below, "*" for any).
func matches(patterns []string, rel string) bool {
	for _, p := range patterns {
		if p == "*" || p == rel {
			return true
		}
		if base, ok := strings.CutSuffix(p, "/..."); ok && (rel == base || strings.HasPrefix(rel, base+"/")) {
			return true
		}
	}
	return false
}

// isStandard reports whether an import path belongs to the standard
// library: its first element has no dot (and it is not "C").
func isStandard(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".") && path != "C"
}

// clockReads are the functions of package time that read the wall clock;
// waitFuncs those that wait on it.
var (
	clockReads = map[string]bool{"Now": true, "Since": true, "Until": true}
	waitFuncs  = map[string]bool{"Sleep": true, "After": true, "AfterFunc": true, "Tick": true, "NewTimer": true, "NewTicker": true}
)

// randPackages are the sources of randomness a pure package must not
// import; a seeded source arrives as an argument instead.
var randPackages = map[string]bool{"math/rand": true, "math/rand/v2": true, "crypto/rand": true}

// impurities returns one line per clock read, timer or sleep (unless
// waits) or randomness import in the given files ("file:line: time.Now"),
// or an error if a file does not parse.
func impurities(root string, files []string, waits bool) ([]string, error) {
	var found []string
	fset := token.NewFileSet()
	for _, path := range files {
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		timeNames := map[string]bool{}
		for _, spec := range file.Imports {
			importPath, _ := strconv.Unquote(spec.Path.Value)
			line := fset.Position(spec.Pos()).Line
			if randPackages[importPath] {
				found = append(found, fmt.Sprintf("%s:%d: imports %s", rel, line, importPath))
			}
			if importPath != "time" {
				continue
			}
			switch {
			case spec.Name == nil:
				timeNames["time"] = true
			case spec.Name.Name == ".":
				found = append(found, fmt.Sprintf("%s:%d: dot-imports time (clock reads could not be seen)", rel, line))
			case spec.Name.Name != "_":
				timeNames[spec.Name.Name] = true
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if ok && timeNames[pkg.Name] && (clockReads[sel.Sel.Name] || !waits && waitFuncs[sel.Sel.Name]) {
				found = append(found, fmt.Sprintf("%s:%d: time.%s", rel, fset.Position(sel.Pos()).Line, sel.Sel.Name))
			}
			return true
		})
	}
	return found, nil
}

// check returns every breach of the rules in the module at root (whose
// module path is modulePath), one line each, sorted; nil if there is none.
func check(root, modulePath string, rules []layer) ([]string, error) {
	pkgs, err := loadPackages(root)
	if err != nil {
		return nil, err
	}
	byPkg := map[string]layer{}
	for _, l := range rules {
		byPkg[l.pkg] = l
	}
	var breaches []string
	for _, p := range pkgs {
		l, ok := byPkg[p.rel]
		if !ok {
			breaches = append(breaches, fmt.Sprintf("%s: package not in the layer table of internal/archtest; add it with what it may import and why", p.rel))
			continue
		}
		ours := func(imp string) (string, bool) {
			if imp == modulePath {
				return ".", true
			}
			rel, ok := strings.CutPrefix(imp, modulePath+"/")
			return rel, ok
		}
		for _, imp := range p.imports {
			if rel, isOurs := ours(imp); isOurs {
				if !matches(l.imports, rel) {
					breaches = append(breaches, fmt.Sprintf("%s imports %s; %s (%s)", p.rel, rel, allowed("it", l.imports), l.why))
				}
			} else if l.stdOnly && !isStandard(imp) {
				breaches = append(breaches, fmt.Sprintf("%s imports %s; it may import only the standard library (%s)", p.rel, imp, l.why))
			}
		}
		if l.testImports != nil {
			for _, imp := range p.testImports {
				if rel, isOurs := ours(imp); isOurs && rel != p.rel && !matches(l.testImports, rel) {
					breaches = append(breaches, fmt.Sprintf("%s tests import %s; %s", p.rel, rel, allowed("they", l.testImports)))
				}
			}
		}
		if l.pure {
			files := p.goFiles
			if l.pureTests {
				files = append(slices.Clone(files), p.testFiles...)
			}
			found, err := impurities(root, files, l.waits)
			if err != nil {
				return nil, err
			}
			for _, f := range found {
				breaches = append(breaches, fmt.Sprintf("%s (%s must not read the clock or draw randomness: time arrives as `now`, randomness as a seeded source)", f, p.rel))
			}
		}
	}
	slices.Sort(breaches)
	return breaches, nil
}

// allowed says what who may import: "it may import nothing of ours" or
// "it may import only ledger, store".
func allowed(who string, patterns []string) string {
	if len(patterns) == 0 {
		return who + " may import nothing of ours"
	}
	return who + " may import only " + strings.Join(patterns, ", ")
}

// TestArrows checks the module against DESIGN.md's import arrows and the
// purity of everything below the engine.
func TestArrows(t *testing.T) {
	root, modulePath, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	breaches, err := check(root, modulePath, layers)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range breaches {
		t.Error(b)
	}
}

// TestLayerTableIsCurrent fails on a table row naming a package that no
// longer exists, so the table stays the true map of the module.
func TestLayerTableIsCurrent(t *testing.T) {
	root, _, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	pkgs, err := loadPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, p := range pkgs {
		present[p.rel] = true
	}
	seen := map[string]bool{}
	for _, l := range layers {
		if seen[l.pkg] {
			t.Errorf("layer %s is listed twice", l.pkg)
		}
		seen[l.pkg] = true
		if !present[l.pkg] {
			t.Errorf("layer %s names no package in the module; remove or rename it", l.pkg)
		}
	}
}

// TestCheckerCatchesBreaches is the negative control: a small module that
// breaks every kind of rule must produce exactly those breaches, so a
// checker that silently stopped looking would fail here.
func TestCheckerCatchesBreaches(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		path := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	// ledger: an import of ours, a third-party import, a clock read through
	// an aliased import, and math/rand.
	write("ledger/ledger.go", `package ledger

import (
	clock "time"
	"math/rand/v2"

	"example.com/m/store"
	"github.com/some/thirdparty"
)

var _ = store.X
var _ = thirdparty.Y
var _ = rand.Int

func Now() clock.Time { return clock.Now() }
`)
	// A test of ledger that sleeps: the clock rule covers ledger's tests.
	write("ledger/ledger_test.go", `package ledger

import (
	"testing"
	"time"
)

func TestX(t *testing.T) { time.Sleep(time.Nanosecond) }
`)
	write("store/store.go", "package store\n\nvar X int\n")
	// engine importing the server: an upward arrow.
	write("engine/engine.go", "package engine\n\nimport _ \"example.com/m/server\"\n")
	write("server/server.go", "package server\n")
	// client importing a driver through the test-free path.
	write("client/client.go", "package client\n\nimport _ \"example.com/m/store/sqlite\"\n")
	// A driver may bound a wait with a timer (line 6), never read the clock.
	write("store/sqlite/sqlite.go", "package sqlite\n\nimport \"time\"\n\nvar T = time.Since\nvar W = time.After\n")
	// A package nobody put in the table.
	write("extra/extra.go", "package extra\n")
	// Ignored: testdata and hidden directories are not packages.
	write("ledger/testdata/bad.go", "package bad\n\nimport _ \"example.com/m/server\"\n")
	write(".hidden/bad.go", "package bad\n\nimport _ \"example.com/m/server\"\n")

	rules := []layer{
		{pkg: "ledger", stdOnly: true, pure: true, pureTests: true, testImports: []string{}, why: "pure"},
		{pkg: "store", imports: []string{"ledger"}, pure: true, why: "interface"},
		{pkg: "store/sqlite", imports: []string{"ledger", "store"}, pure: true, waits: true, why: "driver"},
		{pkg: "engine", imports: []string{"ledger", "store"}, why: "engine"},
		{pkg: "server", imports: []string{"engine"}, why: "server"},
		{pkg: "client", imports: []string{"ledger"}, why: "sdk"},
	}
	got, err := check(root, "example.com/m", rules)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"client imports store/sqlite;",
		"engine imports server;",
		"extra: package not in the layer table",
		"ledger imports github.com/some/thirdparty; it may import only the standard library",
		"ledger imports store; it may import nothing of ours",
		"ledger/ledger.go:5: imports math/rand/v2",
		"ledger/ledger.go:15: time.Now",
		"ledger/ledger_test.go:8: time.Sleep",
		"store/sqlite/sqlite.go:5: time.Since",
	}
	if len(got) != len(want) {
		t.Errorf("got %d breaches, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, w) }) {
			t.Errorf("missing breach %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
}
