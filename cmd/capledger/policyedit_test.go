package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/capledger/capledger/internal/childproc"
)

// policyWithEveryField sets every field policy --help shows, none at its
// default, over three dimensions.
const policyWithEveryField = `subject: tenant-7
route: chat.generate
region: eu-west
rollout: shadow
holdTtl: 90s
executionLimit: 5m
epochLength: 2h
estimatorDigest: sha256:71a0
priority: 3
fairnessWeight: 4
fairnessBudget: 0.1
emergencyMode: true
dimensions:
  - unit: tokens
    burst: 1000
    refillUnits: 100
    refillInterval: 1s
    maxReservation: 800
    maxOverdraft: 200
  - unit: requests
    burst: 10
    refillUnits: 1
    refillInterval: 1s
  - unit: images
    burst: 5
    refillUnits: 1
    refillInterval: 1m
`

// policyCLI runs the built capledger binary against the server at url
// and returns its exit code, stdout and stderr.
func policyCLI(t *testing.T, bin, url string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(withoutAddr(), "CAPLEDGER_ADDR="+url)
	childproc.DieWithParent(cmd)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stdout.String(), stderr.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, stdout.String(), stderr.String()
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publishedPolicy is the JSON a publish or get printed, as a map.
func publishedPolicy(t *testing.T, out string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("not a policy's JSON: %v\n%s", err, out)
	}
	return m
}

// What `policy get` prints, in either form (the API's JSON, the default,
// and --format yaml), publishes again unchanged through the real binary
// against a real serve: as the same policy (a replay of its generation),
// and, edited, as a new generation that differs in the edit alone. A
// copy taken from a generation that is no longer active is refused
// (exit 4, POLICY_GENERATION_CHANGED) and publishes nothing, until the
// line naming its generation is deleted.
func TestPolicyGetPublishesAgain(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	dir := t.TempDir()
	run := func(want int, args ...string) (string, string) {
		t.Helper()
		code, out, errOut := policyCLI(t, bin, srv.url, args...)
		wantExit(t, want, code, out, errOut)
		return out, errOut
	}

	out, _ := run(exitOK, "policy", "publish", writeFile(t, dir, "tenant-7.yaml", policyWithEveryField))
	first := publishedPolicy(t, out)
	if first["generation"] != "1" || first["rollout"] != "ROLLOUT_MODE_SHADOW" || first["emergencyMode"] != true {
		t.Fatalf("publish printed %s", out)
	}

	gotJSON, _ := run(exitOK, "policy", "get", "1")
	gotYAML, _ := run(exitOK, "policy", "get", "1", "--format", "yaml")
	for name, got := range map[string]string{"get.json": gotJSON, "get.yaml": gotYAML} {
		out, errOut := run(exitOK, "policy", "publish", writeFile(t, dir, name, got))
		if again := publishedPolicy(t, out); again["generation"] != "1" || !strings.Contains(errOut, "nothing new published") {
			t.Errorf("%s, published unchanged, is not generation 1 again:\n%s%s\nthe file:\n%s", name, out, errOut, got)
		}
	}

	// Edited, each form publishes a new generation that differs from the
	// one it was taken from in the edit alone.
	editedJSON := strings.Replace(gotJSON, `"burst": "1000"`, `"burst": "2000"`, 1)
	if editedJSON == gotJSON {
		t.Fatalf("no tokens burst in the JSON form:\n%s", gotJSON)
	}
	run(exitOK, "policy", "publish", writeFile(t, dir, "edited.json", editedJSON))
	gen2YAML, _ := run(exitOK, "policy", "get", "2", "--format", "yaml")
	editedYAML := strings.Replace(gen2YAML, "burst: 2000", "burst: 3000", 1)
	if editedYAML == gen2YAML {
		t.Fatalf("no tokens burst in the YAML form:\n%s", gen2YAML)
	}
	run(exitOK, "policy", "publish", writeFile(t, dir, "edited.yaml", editedYAML))
	gen3JSON, _ := run(exitOK, "policy", "get", "3")
	want := publishedPolicy(t, gotJSON)
	got := publishedPolicy(t, gen3JSON)
	for _, serverSet := range []string{"generation", "publishedAt"} {
		delete(want, serverSet)
		delete(got, serverSet)
	}
	want["dimensions"].([]any)[0].(map[string]any)["burst"] = "3000"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("generation 3, generation 1 edited twice through its file forms:\n%s\nwant generation 1 with burst 3000:\n%s", gen3JSON, gotJSON)
	}

	// Copies of generation 1 edited now are stale: generation 3 is active.
	for name, stale := range map[string]string{
		"stale.json": strings.Replace(gotJSON, `"burst": "1000"`, `"burst": "4000"`, 1),
		"stale.yaml": strings.Replace(gotYAML, "burst: 1000", "burst: 4000", 1),
	} {
		code, out, errOut := policyCLI(t, bin, srv.url, "policy", "publish", writeFile(t, dir, name, stale))
		if code != exitConflict || !strings.Contains(errOut, "POLICY_GENERATION_CHANGED") || !strings.Contains(errOut, "generation 3 is active now") {
			t.Errorf("%s, edited from generation 1 while 3 is active: exit %d, want %d (POLICY_GENERATION_CHANGED naming generation 3)\nstdout %s\nstderr %s", name, code, exitConflict, out, errOut)
		}
	}
	list, _ := run(exitOK, "policy", "list")
	if n := strings.Count(list, `"generation"`); n != 3 {
		t.Fatalf("stale publishes changed the policies: %d generations, want 3\n%s", n, list)
	}
	if got := publishedPolicy(t, mustRun(run, "policy", "get", "3")); got["active"] != true {
		t.Fatalf("generation 3 is no longer active after the stale publishes: %v", got)
	}

	// Without its generation line the stale file publishes over 3, as the
	// refusal says.
	var kept []string
	for _, line := range strings.Split(strings.Replace(gotYAML, "burst: 1000", "burst: 4000", 1), "\n") {
		if !strings.HasPrefix(line, "generation:") {
			kept = append(kept, line)
		}
	}
	out, _ = run(exitOK, "policy", "publish", writeFile(t, dir, "forced.yaml", strings.Join(kept, "\n")))
	if p := publishedPolicy(t, out); p["generation"] != "4" {
		t.Fatalf("the stale file without its generation line: %s", out)
	}
}

func mustRun(run func(int, ...string) (string, string), args ...string) string {
	out, _ := run(exitOK, args...)
	return out
}

// A policy file takes the API's spelling of a rollout mode
// (ROLLOUT_MODE_SHADOW) as well as the short one (shadow), and int64s as
// quoted strings as the API's JSON writes them: each spelling publishes
// the same policy (the second and later replay the first). A value that
// is neither is refused naming its line and field, and publishes nothing.
func TestPolicyFileTakesTheAPISpellings(t *testing.T) {
	bin := buildBinary(t)
	srv := startServer(t, bin, t.TempDir())
	dir := t.TempDir()
	const rest = "subject: tenant-9\nroute: chat\ndimensions:\n  - unit: tokens\n    burst: %s\n    refillUnits: 5\n    refillInterval: 1s\n"
	file := func(rollout, burst string) string {
		return "rollout: " + rollout + "\n" + strings.Replace(rest, "%s", burst, 1)
	}
	for i, c := range []struct {
		name, file, generation, rollout string
		replay                          bool
	}{
		{"shadow.yaml", file("shadow", "1000"), "1", "ROLLOUT_MODE_SHADOW", false},
		{"api-shadow.yaml", file("ROLLOUT_MODE_SHADOW", `"1000"`), "1", "ROLLOUT_MODE_SHADOW", true},
		{"api-shadow.json", `{"subject":"tenant-9","route":"chat","rollout":"ROLLOUT_MODE_SHADOW","dimensions":[{"unit":"tokens","burst":"1000","refillUnits":"5","refillInterval":"1s"}]}`, "1", "ROLLOUT_MODE_SHADOW", true},
		{"api-enforce.yaml", file("ROLLOUT_MODE_ENFORCE", "1000"), "2", "ROLLOUT_MODE_ENFORCE", false},
		{"enforce.yaml", file("enforce", `"1000"`), "2", "ROLLOUT_MODE_ENFORCE", true},
	} {
		code, out, errOut := policyCLI(t, bin, srv.url, "policy", "publish", writeFile(t, dir, c.name, c.file))
		wantExit(t, exitOK, code, out, errOut)
		p := publishedPolicy(t, out)
		if p["generation"] != c.generation || p["rollout"] != c.rollout || strings.Contains(errOut, "nothing new published") != c.replay {
			t.Errorf("file %d (%s):\n%s\npublished %s%s, want generation %s, %s, replayed %v", i, c.name, c.file, out, errOut, c.generation, c.rollout, c.replay)
		}
	}

	for _, c := range []struct{ file, want string }{
		{file("SHADOW", "1000"), `line 1: field "rollout": "SHADOW" is no rollout mode: want enforce or shadow (or ROLLOUT_MODE_ENFORCE, ROLLOUT_MODE_SHADOW)`},
		{file("ROLLOUT_MODE_UNSPECIFIED", "1000"), `line 1: field "rollout": "ROLLOUT_MODE_UNSPECIFIED" is no rollout mode`},
		{file("shadow", `"10x"`), `line 6: dimensions[0]: field "burst": "10x" is not an integer`},
		{file("shadow", "1.5"), `line 6: dimensions[0]: field "burst": 1.5 is not an integer`},
		{file("shadow", "1000") + "holdTtl: 30\n", `line 9: field "holdTtl": "30" is not a duration: write durations like 30s, 5m, 1h`},
	} {
		code, out, errOut := policyCLI(t, bin, srv.url, "policy", "publish", writeFile(t, dir, "bad.yaml", c.file))
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%s\nexit %d, want %d with %q\nstdout %s\nstderr %s", c.file, code, exitUsage, c.want, out, errOut)
		}
	}
	_, list, _ := policyCLI(t, bin, srv.url, "policy", "list")
	if n := strings.Count(list, `"generation"`); n != 2 {
		t.Fatalf("the refused files published: %d generations, want 2\n%s", n, list)
	}
}

// The documented edit (get the active generation, change one term,
// publish) works for a burst lowered as for one raised, in either form
// policy get prints (the API's JSON and --format yaml), through the real
// binary against a real serve: a maxReservation equal to the burst (the
// default of a file that leaves it out) is not written, so it follows the
// burst as edited instead of pinning the old one (a lowered burst below
// it was refused). One below the burst is written and kept.
func TestPolicyGetLetsTheBurstAloneBeEdited(t *testing.T) {
	bin := buildBinary(t)
	for _, form := range []struct {
		name, file string
		args       []string
		// term is how the form writes a dimension's integer field.
		term func(field string, value int) string
	}{
		{"yaml", "edited.yaml", []string{"--format", "yaml"}, func(field string, value int) string { return fmt.Sprintf("%s: %d\n", field, value) }},
		{"json", "edited.json", nil, func(field string, value int) string { return fmt.Sprintf("%q: \"%d\"", field, value) }},
	} {
		t.Run(form.name, func(t *testing.T) {
			srv := startServer(t, bin, t.TempDir())
			dir := t.TempDir()
			run := func(want int, args ...string) string {
				t.Helper()
				code, out, errOut := policyCLI(t, bin, srv.url, args...)
				wantExit(t, want, code, out, errOut)
				return out
			}
			get := func(generation string) string {
				t.Helper()
				return run(exitOK, append([]string{"policy", "get", generation}, form.args...)...)
			}
			activeGeneration := func() ([]any, string) {
				t.Helper()
				gen := publishedPolicy(t, run(exitOK, "policy", "list", "--route", "chat.generate", "--region", "eu-west"))["policies"].([]any)
				return gen, gen[len(gen)-1].(map[string]any)["generation"].(string)
			}
			run(exitOK, "policy", "publish", writeFile(t, dir, "tenant-7.yaml", policyWithEveryField))
			got := get("1")
			if !strings.Contains(got, form.term("maxReservation", 800)) || strings.Count(got, "maxReservation") != 1 {
				t.Errorf("policy get wrote maxReservation other than once, for the tokens' 800 below their burst:\n%s", got)
			}
			for _, edit := range []struct{ from, to int }{
				{10, 4},     // requests, lowered
				{4, 20},     // raised again
				{5, 3},      // images, lowered
				{1000, 900}, // tokens, lowered, still above their maxReservation
			} {
				_, active := activeGeneration()
				before := get(active)
				edited := strings.Replace(before, form.term("burst", edit.from), form.term("burst", edit.to), 1)
				if edited == before {
					t.Fatalf("no burst %d in generation %s's file:\n%s", edit.from, active, before)
				}
				published := publishedPolicy(t, run(exitOK, "policy", "publish", writeFile(t, dir, form.file, edited)))
				for _, d := range published["dimensions"].([]any) {
					dim := d.(map[string]any)
					if dim["unit"] == "tokens" && dim["maxReservation"] != "800" {
						t.Errorf("after burst %d: the tokens' maxReservation is %v, want 800 kept", edit.to, dim["maxReservation"])
					}
					if dim["unit"] != "tokens" && dim["maxReservation"] != dim["burst"] {
						t.Errorf("after burst %d: %v's maxReservation %v, want its burst %v", edit.to, dim["unit"], dim["maxReservation"], dim["burst"])
					}
				}
			}
			// Lowered below it, the tokens' own maxReservation is refused
			// naming it (ErrorDetail.field) and its line in the file, and
			// nothing is published.
			gen, active := activeGeneration()
			before := get(active)
			below := writeFile(t, dir, "below."+form.name, strings.Replace(before, form.term("burst", 900), form.term("burst", 500), 1))
			line := 1 + strings.Count(before[:strings.Index(before, form.term("maxReservation", 800))], "\n")
			code, out, errOut := policyCLI(t, bin, srv.url, "policy", "publish", below)
			if code != exitUsage || !strings.Contains(errOut, "policy.dimensions[0].maxReservation 800 is outside (0, burst 500]") ||
				!strings.Contains(errOut, fmt.Sprintf("%s line %d: dimensions[0].maxReservation", below, line)) {
				t.Errorf("burst lowered below an explicit maxReservation: exit %d, want %d naming the field and line %d of the file\n%s%s", code, exitUsage, line, out, errOut)
			}
			if again := run(exitOK, "policy", "list", "--route", "chat.generate", "--region", "eu-west"); !strings.Contains(again, `"generation": "`+active+`"`) || strings.Count(again, `"generation"`) != len(gen) {
				t.Errorf("the refused file published something:\n%s", again)
			}
		})
	}
}
