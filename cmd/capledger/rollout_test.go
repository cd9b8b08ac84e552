package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/capledger/capledger/api/capledger/v1"
	"github.com/capledger/capledger/internal/testport"
	"github.com/capledger/capledger/ledger"
	"github.com/capledger/capledger/store/sqlite"
)

// A rollback drains to zero across a restart, on a real SQLite data
// directory: generation 2 is rolled back with a hold, started work and
// debt on it; the drain shows them, the server stops and starts again on
// the same directory, the work settles, the hold expires, and `rollback
// --status --wait` sees everything reach zero; the audit then finds
// nothing.
func TestRollbackDrainsToZeroAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	srv := startServer(t, bin, dataDir)
	policy := func(name, mode string) string {
		path := filepath.Join(dir, name)
		body := "subject: \"*\"\nroute: chat.generate\nrollout: " + mode + "\nholdTTL: 3s\n" +
			"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 1\n    refillInterval: 1h\n    maxOverdraft: 1000\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	run := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, srv.url, args...)
		wantExit(t, want, code, out, errOut)
		return out + errOut
	}
	run(0, "policy", "publish", policy("shadow.yaml", "shadow")) // generation 1
	run(0, "policy", "publish", policy("enforce.yaml", "enforce"))
	units := func(n string) string { return "tokens=" + n }
	reserve := func(id, n string) {
		run(0, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", units(n), "--id", id)
	}
	reserve("hold", "100")
	reserve("run", "200")
	run(0, "start", "--id", "run", "--operation", "op-run")
	reserve("over", "100")
	run(0, "start", "--id", "over", "--operation", "op-over")
	// The legacy limiter's budget of 50, carved under generation 2.
	run(0, "legacy", "carve", "--identity", "legacy-limiter", "--subject", "tenant-7", "--route", "chat.generate",
		"--units", units("50"), "--ttl", "1h", "--id", "lb-1")
	// 900 against a hold of 100: 550 from available, 250 as debt.
	run(0, "settle", "--id", "over", "--operation", "op-over", "--units", units("900"))

	out := run(0, "rollback", "2")
	if !strings.Contains(out, "rolled back generation 2 of */chat.generate@global; active now: generation 1") {
		t.Fatalf("rollback said:\n%s", out)
	}
	// The hold and the started work are still reserved; the drain moved
	// the debt to generation 1, where refill repays it.
	if !regexpLine(out, `^2\s+\*/chat.generate@global\s+rolled back\s+1\s+tokens=300\s+0\s+0\s+-\s+1 \(tokens=50\), 1 legacy \(tokens=50\)\s+false$`) {
		t.Fatalf("drain progress right after the rollback:\n%s", out)
	}
	out = run(4, "rollback", "--status", "2", "--wait", "--max-wait", "1ms", "--interval", "1ms")
	if !strings.Contains(out, "not drained after 1ms") || !strings.Contains(out, "350 units left, 1 shard open") {
		t.Fatalf("--wait that gives up:\n%s", out)
	}

	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := srv.cmd.Wait(); err != nil {
		t.Fatalf("serve after SIGTERM: %v\n%s", err, srv.logs.String())
	}
	srv = startServer(t, bin, dataDir)
	out = run(0, "rollback", "--status", "2")
	if !regexpLine(out, `^2\s+\*/chat.generate@global\s+rolled back\s+1\s+tokens=300\s+`) {
		t.Fatalf("after the restart:\n%s", out)
	}
	run(0, "settle", "--id", "run", "--operation", "op-run", "--units", units("150"))
	receipts := filepath.Join(dir, "receipts.json")
	if err := os.WriteFile(receipts, []byte(`[{"reservation_id":"l-1","state":"SETTLED","reserved_units":{"tokens":20},"actual_units":{"tokens":10}}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	run(0, "shard", "reconcile", "lb-1", "--gateway", "legacy:legacy-limiter", "--receipts", receipts)
	started := time.Now()
	out = run(0, "rollback", "--status", "2", "--wait", "--interval", "100ms", "--max-wait", "2m")
	if !regexpLine(out, `^2\s+\*/chat.generate@global\s+rolled back\s+1\s+0\s+0\s+0\s+-\s+0\s+true$`) || !strings.Contains(out, "100%") {
		t.Fatalf("drained after %s:\n%s", time.Since(started), out)
	}
	run(0, "audit")
	out = run(0, "get", "hold")
	if !strings.Contains(out, "RESERVATION_STATE_EXPIRED") {
		t.Errorf("the hold did not expire:\n%s", out)
	}
}

// cliExpecting returns a function that runs the CLI against url and
// fails t unless it exits with want; it returns stdout and stderr.
func cliExpecting(t *testing.T, url string) func(want int, args ...string) (string, string) {
	return func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, want, code, out, errOut)
		return out, errOut
	}
}

// Rolling back the only generation of a key leaves its available capacity
// nowhere to go: `rollback --wait` used to poll until --max-wait (an hour
// by default) while BLOCKED showed "no policy". It stops at once with exit
// 4, names the generation and says what to do, even with a hold still
// reserved; once a policy decides again the drain can be followed.
func TestRollbackWaitStopsWhenNothingCanTakeTheCapacity(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	run := cliExpecting(t, url)
	run(exitOK, "policy", "publish", path) // generation 1
	run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100,requests=1", "--id", "hold")
	began := time.Now()
	out, errOut := run(exitConflict, "rollback", "1", "--wait", "--interval", "10ms", "--max-wait", "1m")
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("--wait took %s to give up on capacity nothing can take", took)
	}
	if !regexpLine(out, `^1\s+tenant-7/chat.generate@global\s+rolled back\s+1\s+requests=1,tokens=100\s+0\s+requests=9,tokens=900\s+0 by burst, 1 no policy\s+0\s+false$`) {
		t.Errorf("the table does not show the blocked account:\n%s", out)
	}
	for _, want := range []string{"cannot drain: generation 1 (tenant-7/chat.generate@global) has 1 account(s) blocked with no policy",
		"Publish one for the key", "capledger rollback --status 1 --wait"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the message does not say %q:\n%s", want, errOut)
		}
	}
	// The same with --status on a generation rolled back already.
	run(exitConflict, "rollback", "--status", "1", "--wait", "--interval", "10ms", "--max-wait", "1m")
	// Without --wait it only shows the table, as before.
	run(exitOK, "rollback", "--status", "1")
}

// A generation that drops a unit its predecessor limited leaves the old
// account's capacity in that unit where it is (the drain moves only units
// both limit), so `rollback --wait` on the old generation used to poll
// until --max-wait while BLOCKED showed "-". It stops at once with exit 4,
// BLOCKED says "1 unit dropped", and the message names the generation and
// the fix; once a generation that limits the unit again is published and
// has room for it, the drain takes it and the same follow ends drained.
func TestRollbackWaitStopsOnADroppedUnit(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	both := filepath.Join(dir, "both.yaml")
	tokensOnly := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(both, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	dropped := "subject: tenant-7\nroute: chat.generate\nholdTtl: 30s\n" +
		"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 100\n    refillInterval: 1s\n"
	if err := os.WriteFile(tokensOnly, []byte(dropped), 0o600); err != nil {
		t.Fatal(err)
	}
	run := cliExpecting(t, url)
	reserve := func(id, units string) {
		run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", units, "--id", id)
		run(exitOK, "release", "--id", id)
	}
	run(exitOK, "policy", "publish", both) // generation 1: tokens and requests
	reserve("a", "tokens=100,requests=1")
	run(exitOK, "policy", "publish", tokensOnly) // generation 2: tokens only
	reserve("b", "tokens=10")                    // switches the subject to generation 2
	began := time.Now()
	out, errOut := run(exitConflict, "rollback", "1", "--wait", "--interval", "10ms", "--max-wait", "1m")
	if took := time.Since(began); took > 20*time.Second {
		t.Errorf("--wait took %s to give up on a dropped unit", took)
	}
	if !regexpLine(out, `^1\s+tenant-7/chat.generate@global\s+rolled back\s+1\s+0\s+0\s+requests=10\s+0 by burst, 0 no policy, 1 unit dropped\s+0\s+false$`) {
		t.Errorf("the table does not show the account blocked by the dropped unit:\n%s", out)
	}
	for _, want := range []string{"cannot drain: generation 1 (tenant-7/chat.generate@global) has 1 account(s) holding capacity in a unit the deciding generation does not limit (available requests=10, debt 0)",
		"Publish a generation for the key that limits the unit again", "or accept it", "capledger rollback --status 1 --wait"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the message does not say %q:\n%s", want, errOut)
		}
	}
	// Without --wait it only shows the table.
	run(exitOK, "rollback", "--status", "1")

	// Generation 3 limits requests again. The subject's account under it
	// opens with no requests, since generation 1's account still holds
	// them (a fresh burst beside them would be capacity twice): the drain
	// moves generation 1's 10 over (room for them under the burst of 20),
	// and then they admit.
	again := filepath.Join(dir, "again.yaml")
	if err := os.WriteFile(again, []byte(dropped+"  - unit: requests\n    burst: 20\n    refillUnits: 1\n    refillInterval: 1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(exitOK, "policy", "publish", again)
	run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=10", "--id", "c0") // switches to generation 3
	out, _ = run(exitOK, "rollback", "--status", "1", "--wait", "--interval", "10ms", "--max-wait", "1m")
	if !regexpLine(out, `^1\s+tenant-7/chat.generate@global\s+rolled back\s+1\s+0\s+0\s+0\s+-\s+0\s+true$`) {
		t.Errorf("generation 1 not drained once generation 3 limits the unit again:\n%s", out)
	}
	run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "requests=10", "--id", "c")
}

// regexpLine reports whether some line of out matches pattern.
func regexpLine(out, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, line := range strings.Split(out, "\n") {
		if re.MatchString(strings.TrimRight(line, " ")) {
			return true
		}
	}
	return false
}

// The rollout commands against a real serve: create, a step chosen by the
// stable hash (moderate.text has the lowest bucket of the four routes),
// the step decides reserves, a repeated step records nothing, undo walks
// back, get shows the history, report shows the legacy comparison, and
// bad input is refused without a change.
func TestRolloutCommands(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	run := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, want, code, out, errOut)
		return out + errOut
	}
	for _, route := range []string{"chat.generate", "embed.create", "moderate.text", "rerank.query"} {
		path := filepath.Join(dir, route+".yaml")
		body := "subject: \"*\"\nroute: " + route + "\nrollout: shadow\ndimensions:\n  - unit: tokens\n    burst: 1000\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		run(0, "policy", "publish", path)
	}
	run(1, "rollout", "set", "--percent", "1") // no rollout yet: name it
	run(0, "rollout", "create", "llm", "--routes", "chat.generate,embed.create,moderate.text,rerank.query", "--by", "route")
	run(4, "rollout", "create", "other", "--routes", "chat.generate")
	run(1, "rollout", "set", "--percent", "101")
	run(1, "rollout", "set", "--percent", "abc")
	run(4, "rollout", "undo") // nothing to undo yet
	reserve := func(want int, id, route, legacy string) string {
		return run(want, "reserve", "--subject", "t-1", "--route", route, "--units", "tokens=600", "--id", id, "--legacy", legacy)
	}
	reserve(0, "m-1", "moderate.text", "allow")
	if out := reserve(0, "m-2", "moderate.text", "allow"); !strings.Contains(out, `"shadowRejected": true`) {
		t.Fatalf("shadow at 0%%:\n%s", out)
	}
	out := run(0, "rollout", "set", "--percent", "1")
	if !regexpLine(out, `^moderate\.text@global\s+enforce$`) || !regexpLine(out, `^chat\.generate@global\s+shadow$`) {
		t.Fatalf("at 1%%:\n%s", out)
	}
	reserve(2, "m-3", "moderate.text", "deny") // enforced now: 429
	if out := run(0, "rollout", "set", "llm", "--percent", "1"); !strings.Contains(out, "nothing recorded") {
		t.Errorf("a repeated step:\n%s", out)
	}
	run(0, "rollout", "set", "--percent", "50%") // a percent sign is allowed
	out = run(0, "rollout", "list")
	if !regexpLine(out, `^llm\s+route\s+50%\s+embed\.create@global,moderate\.text@global\s+chat\.generate@global,rerank\.query@global$`) {
		t.Fatalf("list at 50%%:\n%s", out)
	}
	if out := run(0, "rollout", "undo"); !strings.Contains(out, "undid step 3 (1% -> 50%") {
		t.Fatalf("undo:\n%s", out)
	}
	out = run(0, "rollout", "get", "llm")
	for _, pattern := range []string{`^2\s+set\s+0% -> 1%\s+\(no auth\)`, `^3\s+set\s+1% -> 50%.*undone by step 4$`, `^4\s+undo\s+50% -> 1%.*undoes step 3$`} {
		if !regexpLine(out, pattern) {
			t.Errorf("history lacks %s:\n%s", pattern, out)
		}
	}
	out = run(0, "rollout", "report", "--route", "moderate.text")
	if !regexpLine(out, `^moderate\.text@global\s+3\s+shadow\s+1\s+0\s+1\s+0\s+50\.0%$`) ||
		!regexpLine(out, `^moderate\.text@global\s+3\s+enforce\s+0\s+1\s+0\s+0\s+0\.0%$`) {
		t.Fatalf("report:\n%s", out)
	}
	run(1, "reserve", "--subject", "t-1", "--route", "moderate.text", "--units", "tokens=1", "--legacy", "maybe")

	// end hands the routes back to their policies (shadow here): the
	// enforced route admits again, another rollout may take the routes, and
	// set without a name means the one rollout still open.
	out = run(0, "rollout", "end")
	if !strings.Contains(out, "rollout llm: 1% by route, version 5, ended") || !regexpLine(out, `^moderate\.text@global\s+policy$`) {
		t.Fatalf("end:\n%s", out)
	}
	if out := run(0, "rollout", "end", "llm"); !strings.Contains(out, "had ended already: nothing recorded") {
		t.Errorf("a repeated end:\n%s", out)
	}
	if out := reserve(0, "m-4", "moderate.text", "deny"); !strings.Contains(out, `"shadowRejected": true`) {
		t.Fatalf("after the end the policy's shadow mode decides:\n%s", out)
	}
	run(4, "rollout", "set", "llm", "--percent", "5")
	run(1, "rollout", "set", "--percent", "5") // every rollout has ended
	run(0, "rollout", "create", "other", "--routes", "moderate.text")
	if out := run(0, "rollout", "set", "--percent", "100"); !strings.Contains(out, "rollout other: 100% by route") {
		t.Fatalf("set without a name after the end:\n%s", out)
	}
	if out := run(0, "rollout", "list"); !regexpLine(out, `^llm\s+route\s+ended\s+-\s+-$`) {
		t.Fatalf("list with an ended rollout:\n%s", out)
	}
}

// Without a name and without any rollout, set and undo cannot mean one:
// a usage error (exit 1) that says to create one, not a request to name
// "the one you mean"; a named rollout that does not exist is not found.
func TestRolloutStepWithoutAnyRollout(t *testing.T) {
	url := startInProcess(t)
	for _, args := range [][]string{
		{"rollout", "set", "--percent", "5"},
		{"rollout", "undo"},
	} {
		code, out, errOut := cli(t, url, args...)
		wantExit(t, exitUsage, code, out, errOut)
		if !strings.Contains(errOut, "no rollout exists: create one first") {
			t.Errorf("%v: %s", args, errOut)
		}
	}
	code, out, errOut := cli(t, url, "rollout", "set", "nope", "--percent", "5")
	wantExit(t, exitNotFound, code, out, errOut)
}

// A negative --max-wait (say "-5m" for "5m") was taken as given: rollback
// rolled the generation back, polled once and exited 4 "not drained after
// -5m0s". It is a bad flag (exit 1), refused before anything is rolled
// back, as a non-positive --interval is.
func TestRollbackNegativeMaxWaitRefusedBeforeRollingBack(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", path) // generation 1
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "rollback", "1", "--wait", "--max-wait", "-5m", "--interval", "10ms")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "--max-wait -5m0s") {
		t.Errorf("the message does not name the flag:\n%s", errOut)
	}
	code, out, errOut = cli(t, url, "policy", "get", "1")
	wantExit(t, exitOK, code, out, errOut)
	if !strings.Contains(out, `"active": true`) {
		t.Errorf("generation 1 was rolled back by a refused command:\n%s", out)
	}
}

// legacy carve --ttl -1h said "--identity, ... --ttl and --id are
// required" with every one of them given: a negative TTL is named as such.
func TestLegacyCarveNegativeTTLNamed(t *testing.T) {
	url := startInProcess(t)
	code, out, errOut := cli(t, url, "legacy", "carve", "--identity", "legacy-limiter", "--subject", "tenant-7",
		"--route", "chat.generate", "--units", "tokens=10", "--ttl", "-1h", "--id", "b-1")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "--ttl -1h0m0s: want 1s to 2562047h47m16s (9223372036s, the API's longest duration)") || strings.Contains(errOut, "required") {
		t.Errorf("the message does not name the negative TTL:\n%s", errOut)
	}
}

// storedRollouts writes rollouts into a new SQLite database at path
// straight through the store, past the create rule (as a rollout created
// before ledger.NewRolloutNameProblem held its name to ledger.NameProblem
// is stored), for a serve started on it with --store sqlite:path.
func storedRollouts(t *testing.T, path string, rollouts ...ledger.Rollout) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range rollouts {
		if err := st.RolloutPut(ctx, &rollouts[i]); err != nil {
			t.Fatalf("store rollout %q: %v", rollouts[i].Name, err)
		}
	}
}

// storedRollout is a rollout named name of routes (by route, at 0%) as a
// create at t0 stored it.
func storedRollout(name string, routes ...ledger.RouteKey) ledger.Rollout {
	return ledger.Rollout{Name: name, By: ledger.RolloutByRoute, Routes: routes, Version: 1,
		Steps: []ledger.RolloutStep{{Seq: 1, Action: ledger.RolloutCreated, At: time.Date(2026, 7, 19, 14, 0, 0, 0, time.UTC)}}}
}

// rollout create refuses a name that is not one word of ASCII letters,
// digits, '.', '_' and '-' (1 to 128 bytes) with INVALID_ROLLOUT naming
// the field, and creates nothing; a rollout stored under such a name
// before the rule (here "bad name!", written into the database serve
// opens) is still read, stepped, undone and ended by its name.
func TestRolloutCreateRefusesNamesThatAreNotWords(t *testing.T) {
	db := filepath.Join(t.TempDir(), "capledger.db")
	storedRollouts(t, db, storedRollout("bad name!", ledger.RouteKey{Route: "embed.create", Region: ledger.DefaultRegion}))
	url := startInProcess(t, "--store", "sqlite:"+db)
	run := cliExpecting(t, url)
	for _, c := range []struct{ name, says string }{
		{"bad name!", "name holds ' ' at byte 3: use only ASCII letters, digits, '.', '_' and '-'"},
		{"q3,enforce", "name holds ',' at byte 2: use only ASCII letters, digits, '.', '_' and '-'"},
		{"two\nlines", `name holds '\n' at byte 3: use only ASCII letters, digits, '.', '_' and '-'`},
		{"", "name is empty"},
		{strings.Repeat("r", 129), "name is 129 bytes long; at most 128"},
	} {
		_, errOut := run(exitUsage, "rollout", "create", c.name, "--routes", "chat.generate")
		if !strings.Contains(errOut, "invalid_argument: "+c.says+"; reason INVALID_ROLLOUT") {
			t.Errorf("rollout create %q said %q, want %q with reason INVALID_ROLLOUT", c.name, errOut, c.says)
		}
	}
	if out, _ := run(exitOK, "rollout", "list"); strings.Contains(out, "chat.generate") {
		t.Errorf("a refused name created a rollout:\n%s", out)
	}
	run(exitOK, "rollout", "create", "q3-enforce_2026.12", "--routes", "chat.generate")

	if out, _ := run(exitOK, "rollout", "get", "bad name!"); !strings.Contains(out, "rollout bad name!: 0% by route") {
		t.Errorf("rollout get of the stored name:\n%s", out)
	}
	run(exitOK, "rollout", "set", "bad name!", "--percent", "100")
	run(exitOK, "rollout", "undo", "bad name!")
	if out, _ := run(exitOK, "rollout", "end", "bad name!"); !strings.Contains(out, "ended") {
		t.Errorf("rollout end of the stored name:\n%s", out)
	}
	if out, _ := run(exitOK, "rollout", "list"); !regexpLine(out, `^bad name!\s+route\s+ended\s`) {
		t.Errorf("rollout list after the end:\n%s", out)
	}
}

// The API accepts any UTF-8 text without a NUL byte as a subject, route
// or region, line ends included, and reads a rollout stored under such a
// name (created before new rollout names were held to letters, digits,
// '.', '_' and '-'). The CLI's text tables show such a name quoted with
// Go's escapes, so that it cannot split a row: every row of `rollout
// list`, `rollout get` and the drain table of `rollback` is one line, and
// the name reads back escaped.
func TestCLITablesQuoteNamesWithLineEnds(t *testing.T) {
	db := filepath.Join(t.TempDir(), "capledger.db")
	storedRollouts(t, db, storedRollout("two\nlines", ledger.RouteKey{Route: "chat\ngenerate", Region: ledger.DefaultRegion}))
	url := startInProcess(t, "--store", "sqlite:"+db)
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, exitOK, code, out, errOut)
		return out
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	body := "subject: \"tenant\\n7\"\nroute: \"chat\\ngenerate\"\ndimensions:\n  - unit: tokens\n    burst: 1000\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	run("policy", "publish", path) // generation 1
	oneRow := func(out, row string) {
		t.Helper()
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if !regexpLine(out, row) {
			t.Errorf("no row matches %s:\n%s", row, out)
		}
		for _, line := range lines {
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "lines") || strings.HasPrefix(line, "generate") || strings.HasPrefix(line, "7/") {
				t.Errorf("a name split a row: line %q of\n%s", line, out)
			}
		}
	}
	oneRow(run("rollout", "list"), `^"two\\nlines"\s+route\s+0%\s+-\s+"chat\\ngenerate"@global$`)
	oneRow(run("rollout", "get", "two\nlines"), `^"chat\\ngenerate"@global\s+shadow$`)
	oneRow(run("rollback", "1"), `^1\s+"tenant\\n7"/"chat\\ngenerate"@global\s+rolled back\s`)
}

// Settlement goes on after a rollback, so what a rolled-back generation
// holds can grow while an operator follows it: a started reservation of
// the only generation of a key settles far above its hold, and its debt
// stays on the generation (nothing decides for the subject, and a
// rolled-back generation mints nothing to repay it). The binary's `rollback
// --wait` must neither crash on the growing figure (its progress bar once
// panicked on a negative repeat count) nor wait out --max-wait: the debt
// is blocked with no policy, so it stops at once with exit 4 and says so.
func TestRollbackWaitFollowsDebtNothingCanTake(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	srv := startServer(t, bin, filepath.Join(dir, "data"))
	run := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, srv.url, args...)
		wantExit(t, want, code, out, errOut)
		return out + errOut
	}
	path := filepath.Join(dir, "policy.yaml")
	body := "subject: tenant-10\nroute: solo.route\nholdTTL: 1h\n" +
		"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 10\n    refillInterval: 1s\n    maxOverdraft: 5000\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	run(exitOK, "policy", "publish", path) // generation 1, the key's only one
	run(exitOK, "reserve", "--subject", "tenant-10", "--route", "solo.route", "--units", "tokens=1000", "--id", "big")
	run(exitOK, "start", "--id", "big", "--operation", "op-big")
	run(exitOK, "rollback", "1")

	var stdout, stderr lockedBuffer
	follow := exec.Command(bin, "rollback", "--status", "1", "--wait", "--interval", "20ms", "--max-wait", "30s")
	follow.Env = append(os.Environ(), "CAPLEDGER_ADDR="+srv.url, "CAPLEDGER_TOKEN=")
	follow.Stdout, follow.Stderr = &stdout, &stderr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "1000 units left"); {
		if time.Now().After(deadline) {
			follow.Process.Kill()
			t.Fatalf("no progress line for the hold:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	began := time.Now()
	// 3000 against a hold of 1000: 2000 of debt on the rolled-back generation.
	run(exitOK, "settle", "--id", "big", "--operation", "op-big", "--units", "tokens=3000")
	err := follow.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitConflict {
		t.Fatalf("rollback --wait: %v, want exit %d\nstdout: %s\nstderr: %s", err, exitConflict, stdout.String(), stderr.String())
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Errorf("--wait took %s to give up on debt nothing can take", took)
	}
	if !strings.Contains(stderr.String(), "2000 units left") ||
		!strings.Contains(stderr.String(), "has 1 account(s) blocked with no policy (available 0, debt tokens=2000)") {
		t.Errorf("the progress and the message do not show the debt:\n%s", stderr.String())
	}
	if !regexpLine(stdout.String(), `^1\s+tenant-10/solo.route@global\s+rolled back\s+1\s+0\s+tokens=2000\s+0\s+0 by burst, 1 no policy\s+0\s+false$`) {
		t.Errorf("the table does not show the blocked debt:\n%s", stdout.String())
	}
}

// A generation that is its key's active one decides admission and never
// drains, so `rollback --status GEN --wait` on it (a mistyped generation at
// 3 a.m.) stops at once with exit 4 and says to roll it back, instead of
// polling until --max-wait.
func TestRollbackWaitRefusesAnActiveGeneration(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", path) // generation 1
	wantExit(t, exitOK, code, out, errOut)
	began := time.Now()
	code, out, errOut = cli(t, url, "rollback", "--status", "1", "--wait", "--interval", "10ms", "--max-wait", "20s")
	wantExit(t, exitConflict, code, out, errOut)
	if took := time.Since(began); took > 10*time.Second {
		t.Errorf("--wait took %s on an active generation", took)
	}
	if !strings.Contains(errOut, "cannot drain: generation 1 (tenant-7/chat.generate@global) is active") ||
		!strings.Contains(errOut, "roll it back first") {
		t.Errorf("the message does not name the active generation:\n%s", errOut)
	}
	if !regexpLine(out, `^1\s+tenant-7/chat.generate@global\s+active\s+`) {
		t.Errorf("the table does not show the generation active:\n%s", out)
	}
}

// A generation named twice in one rollback (a paste at 3 a.m.) is rolled
// back once and shown once, not answered a second time as "was rolled back
// already", which reads as if another operator had done it.
func TestRollbackOfAGenerationNamedTwice(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", path) // generation 1
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "rollback", "1", "1")
	wantExit(t, exitOK, code, out, errOut)
	if n := strings.Count(out, "rolled back generation 1 of tenant-7/chat.generate@global; active now: none"); n != 1 || strings.Contains(out, "was rolled back already") {
		t.Errorf("rollback 1 1 answered %d times, want once and fresh:\n%s", n, out)
	}
	if n := strings.Count(out, "tenant-7/chat.generate@global  rolled back"); n != 1 {
		t.Errorf("the drain table shows generation 1 %d times:\n%s", n, out)
	}
}

// A follow of a drain outlives the server going away for a while (a
// replica restarting, a failover): once a poll has answered, `rollback
// --wait` polls an unavailable server again, saying so, until --max-wait,
// and ends with exit 0 when the drain completes after the server is back.
// Here the connection is cut through a proxy while a hold is still
// reserved, the hold expires meanwhile, and the drain is seen through.
func TestRollbackWaitOutlivesAnUnavailableServer(t *testing.T) {
	url := startInProcess(t)
	proxy := newCuttableProxy(t, strings.TrimPrefix(url, "http://"))
	dir := t.TempDir()
	runCLI := func(want int, args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, url, args...)
		wantExit(t, want, code, out, errOut)
		return out + errOut
	}
	for _, overdraft := range []string{"0", "100"} { // generations 1 and 2
		path := filepath.Join(dir, "policy"+overdraft+".yaml")
		body := "subject: tenant-7\nroute: chat.generate\nholdTTL: 2s\n" +
			"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 1\n    refillInterval: 1h\n    maxOverdraft: " + overdraft + "\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		runCLI(exitOK, "policy", "publish", path)
	}
	runCLI(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens=100", "--id", "hold")
	runCLI(exitOK, "rollback", "2") // generation 1 decides again; the hold stays on 2

	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		e := &env{stdout: &stdout, stderr: &stderr, getenv: func(k string) string {
			if k == "CAPLEDGER_ADDR" {
				return "http://" + proxy.addr
			}
			return ""
		}}
		done <- run(context.Background(), e, []string{"rollback", "--status", "2", "--wait", "--interval", "50ms", "--max-wait", "1m", "--timeout", "2s"})
	}()
	waitFor := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), what); {
			select {
			case code := <-done:
				t.Fatalf("rollback --wait exited %d before %q:\nstdout: %s\nstderr: %s", code, what, stdout.String(), stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q:\n%s", what, stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("100 units left")
	proxy.cut()
	waitFor("poll failed, polling again in 50ms: unavailable")
	time.Sleep(3 * time.Second) // the 2 s hold expires while the follower cannot reach the server
	proxy.mend(t)
	select {
	case code := <-done:
		if code != exitOK || !regexpLine(stdout.String(), `^2\s+tenant-7/chat.generate@global\s+rolled back\s+1\s+0\s+0\s+0\s+-\s+0\s+true$`) {
			t.Fatalf("rollback --wait exited %d:\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatalf("rollback --wait did not finish after the server came back:\n%s", stderr.String())
	}
}

// rollback's arguments and flags at their edges: generation 0 is no
// generation (exit 1, nothing sent); --max-wait 0 is allowed (poll once);
// and a follow whose very first poll finds the server unavailable ends at
// once with exit 5, polling again only once some poll has answered.
func TestRollbackArgumentEdges(t *testing.T) {
	url := startInProcess(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, url, "policy", "publish", path) // generation 1
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "rollback", "0")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, `generation "0" is not a positive integer`) {
		t.Errorf("rollback 0:\n%s", errOut)
	}
	// Generation 1 holds nothing: rolled back, it is drained at the one poll.
	code, out, errOut = cli(t, url, "rollback", "1", "--wait", "--max-wait", "0", "--interval", "10ms")
	wantExit(t, exitOK, code, out, errOut)
	if !regexpLine(out, `^1\s+.*\s+true$`) {
		t.Errorf("rollback 1 --wait --max-wait 0:\n%s", out)
	}
	// Nothing listens on the address (a port found free).
	dead := "http://" + testport.Addr(t)
	code, out, errOut = cli(t, dead, "rollback", "--status", "1", "--wait", "--max-wait", "3s", "--interval", "10ms", "--timeout", "1s")
	wantExit(t, exitUnavailable, code, out, errOut)
	if strings.Contains(errOut, "poll failed") {
		t.Errorf("the first poll's failure was polled again:\n%s", errOut)
	}
}

// A refusal the server answered (exit 1: a percent off the grid, a role
// that may not step) says what is wrong itself; no "Run `capledger rollout
// --help` for usage." follows it, as docs/ROLLOUT.md's transcripts show.
// A flag the CLI itself cannot read keeps the pointer.
func TestServerRefusalHasNoUsagePointer(t *testing.T) {
	url := startInProcess(t)
	code, out, errOut := cli(t, url, "rollout", "create", "llm", "--routes", "chat.generate", "--by", "route")
	wantExit(t, exitOK, code, out, errOut)
	code, out, errOut = cli(t, url, "rollout", "set", "llm", "--percent", "0.005")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "INVALID_ROLLOUT") || strings.Contains(errOut, "--help` for usage") {
		t.Errorf("a server's refusal:\n%s", errOut)
	}
	code, out, errOut = cli(t, url, "rollout", "set", "llm", "--percent", "abc")
	wantExit(t, exitUsage, code, out, errOut)
	if !strings.Contains(errOut, "Run `capledger rollout set --help` for usage.") {
		t.Errorf("a flag the CLI cannot read:\n%s", errOut)
	}
}

// `rollback --wait`'s progress line while what a rolled-back generation
// holds grows (settlement goes on: a settle above its hold adds debt):
// the bar never runs backwards, the line says the units left rose, and
// the bar is full only once the poll says drained.
func TestDrainBarNeverRunsBackwards(t *testing.T) {
	poll := func(reserved, debt int64, drained bool) *v1.DrainProgressResponse {
		return &v1.DrainProgressResponse{Drained: drained, Generations: []*v1.GenerationDrain{{
			Generation: 5, Reserved: map[string]int64{"tokens": reserved}, Debt: map[string]int64{"tokens": debt}}}}
	}
	steps := []struct {
		msg     *v1.DrainProgressResponse
		percent int
		left    string
	}{
		{poll(100, 0, false), 0, "100 units left, "},
		{poll(50, 0, false), 50, "50 units left, "},
		{poll(50, 100, false), 50, "150 units left (up 100 since the last poll), "}, // a settle added debt
		{poll(0, 100, false), 50, "100 units left, "},
		{poll(0, 20, false), 90, "20 units left, "},
		{poll(0, 0, false), 96, "0 units left, "}, // not drained yet (a shard open)
		{poll(0, 0, true), 100, "0 units left, "},
	}
	var bar drainBar
	for i, s := range steps {
		line := bar.line(s.msg)
		if want := fmt.Sprintf("] %3d%%  %s", s.percent, s.left); !strings.Contains(line, want) {
			t.Errorf("poll %d: %q, want %q in it", i, line, want)
		}
	}
}

// `rollback GEN --wait`'s bar starts from a read taken before the first
// poll's drain pass: it measured from that poll's answer, after the pass
// had moved the debt, so what the first drain moved never showed (200
// units left before, 100 after, and the bar at 0%).
func TestRollbackWaitBarCountsTheFirstDrain(t *testing.T) {
	url := startInProcess(t)
	dir := t.TempDir()
	run := cliExpecting(t, url)
	for _, mode := range []string{"shadow", "enforce"} { // generations 1 and 2
		path := filepath.Join(dir, mode+".yaml")
		body := "subject: \"*\"\nroute: chat.generate\nrollout: " + mode + "\nholdTTL: 1h\n" +
			"dimensions:\n  - unit: tokens\n    burst: 1000\n    refillUnits: 1\n    refillInterval: 1h\n    maxOverdraft: 1000\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		run(exitOK, "policy", "publish", path)
	}
	reserve := func(id, n string) {
		run(exitOK, "reserve", "--subject", "tenant-7", "--route", "chat.generate", "--units", "tokens="+n, "--id", id)
	}
	reserve("hold", "100") // stays reserved: the drain cannot move it
	reserve("over", "100")
	run(exitOK, "start", "--id", "over", "--operation", "op-over")
	// 1000 against a hold of 100: 800 from available, 100 as debt, which
	// the first drain moves to generation 1.
	run(exitOK, "settle", "--id", "over", "--operation", "op-over", "--units", "tokens=1000")

	_, errOut := run(exitConflict, "rollback", "2", "--wait", "--max-wait", "0", "--interval", "1ms")
	first, _, _ := strings.Cut(errOut, "\n")
	if !strings.Contains(first, "]  50%  100 units left, ") {
		t.Errorf("the first progress line does not count what the first drain moved:\n%s", errOut)
	}
}

// The progress line's counts agree with their nouns: "1 shard open",
// "0 shards open", "1 drain command", "2 drain commands".
func TestDrainLineCountsAgreeWithTheirNouns(t *testing.T) {
	poll := func(shards ...int64) *v1.DrainProgressResponse {
		msg := &v1.DrainProgressResponse{DrainCommands: int64(len(shards))}
		for i, n := range shards {
			msg.Generations = append(msg.Generations, &v1.GenerationDrain{Generation: uint64(i + 1), UnreconciledShards: n})
		}
		return msg
	}
	for _, c := range []struct {
		msg  *v1.DrainProgressResponse
		want string
	}{
		{poll(), "0 shards open, 0 drain commands"},
		{poll(1), "1 shard open, 1 drain command"},
		{poll(0, 2), "2 shards open, 2 drain commands"},
	} {
		var bar drainBar
		if line := bar.line(c.msg); !strings.HasSuffix(line, c.want) {
			t.Errorf("%q, want it to end %q", line, c.want)
		}
	}
}
