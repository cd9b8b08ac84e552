package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/capledger/capledger/api/capledger/v1"
)

// Every key of the policy file is the API's JSON name of a Policy (or
// Dimension) field, so one field has one spelling: a policy copied from
// an API example is not refused for its keys.
func TestPolicyFileSpellsFieldsAsTheAPI(t *testing.T) {
	for _, c := range []struct {
		file reflect.Type
		api  protoreflect.MessageDescriptor
	}{
		{reflect.TypeOf(policyFile{}), (&v1.Policy{}).ProtoReflect().Descriptor()},
		{reflect.TypeOf(dimensionFile{}), (&v1.Dimension{}).ProtoReflect().Descriptor()},
	} {
		for i := 0; i < c.file.NumField(); i++ {
			name, _, _ := strings.Cut(c.file.Field(i).Tag.Get("json"), ",")
			if c.api.Fields().ByJSONName(name) == nil {
				t.Errorf("%s.%s: file key %q is no JSON name of %s", c.file.Name(), c.file.Field(i).Name, name, c.api.FullName())
			}
		}
	}
}

// holdTtl (the API's spelling) and holdTTL (older files' spelling) read as
// the same policy, in YAML and in JSON; a file giving both is refused as
// ambiguous, and any other case is refused naming holdTtl.
func TestPolicyFileReadsHoldTTLAsHoldTtl(t *testing.T) {
	const rest = "subject: tenant-7\nroute: chat\ndimensions:\n  - unit: tokens\n    burst: 10\n"
	want, _, err := parsePolicyFile("", []byte("holdTtl: 90s\n"+rest))
	if err != nil {
		t.Fatal(err)
	}
	if got := want.GetHoldTtl().AsDuration().String(); got != "1m30s" {
		t.Fatalf("holdTtl: 90s read as %s", got)
	}
	for _, file := range []string{
		"holdTTL: 90s\n" + rest,
		`{"subject":"tenant-7","route":"chat","holdTTL":"90s","dimensions":[{"unit":"tokens","burst":10}]}`,
		`{"subject":"tenant-7","route":"chat","holdTtl":"90s","dimensions":[{"unit":"tokens","burst":10}]}`,
	} {
		got, _, err := parsePolicyFile("", []byte(file))
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("%q: %v %v, want %v", file, err, got, want)
		}
	}
	for _, c := range []struct{ file, want string }{
		{"holdTtl: 90s\nholdTTL: 90s\n" + rest, `fields "holdTTL" and "holdTtl": one field given twice; it is spelt "holdTtl" ("holdTTL", its former spelling, is still read): keep one`},
		{`{"subject":"tenant-7","route":"chat","holdTTL":"1s","holdTtl":"90s","dimensions":[{"unit":"tokens","burst":10}]}`, `fields "holdTTL" and "holdTtl": one field given twice`},
		{"HoldTtl: 90s\n" + rest, `field "HoldTtl": no such field; the field is spelt "holdTtl"`},
		{"holdttl: 90s\n" + rest, `field "holdttl": no such field; the field is spelt "holdTtl"`},
	} {
		if got, _, err := parsePolicyFile("", []byte(c.file)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v %v, want an error with %q", c.file, err, got, c.want)
		}
	}
}

// Every policy the docs show as a file loads as one and spells holdTtl as
// the API does: the example of policy --help, the YAML policies of
// docs/ROLLOUT.md, and the policy of the README's PublishPolicy call (the
// API's JSON, copied into a file).
func TestDocPolicyFilesLoad(t *testing.T) {
	files := map[string]string{}
	// The example file is the indented block that starts with its subject
	// line and ends before "Example:".
	start := strings.Index(policyHelp, "\n\n  subject: ")
	example, _, ok := strings.Cut(policyHelp[max(start, 0):], "\nExample:")
	if start < 0 || !ok {
		t.Fatal("policy --help: no example policy file (an indented block from \"  subject: \" to \"Example:\")")
	}
	example = strings.TrimPrefix(example, "\n\n")
	files["policy --help"] = regexp.MustCompile(`(?m)^  `).ReplaceAllString(example, "")

	rollout, err := os.ReadFile("../../docs/ROLLOUT.md")
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(rollout), -1) {
		if strings.Contains(m[1], "dimensions:") {
			files[fmt.Sprintf("docs/ROLLOUT.md yaml block %d", i+1)] = m[1]
		}
	}
	if len(files) < 3 {
		t.Fatalf("found %d policy files in policy --help and docs/ROLLOUT.md, want the help's and at least two of ROLLOUT.md", len(files))
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	call := regexp.MustCompile(`(?s)/PublishPolicy [^\n]*-d '(\{.*?\})'\n`).FindStringSubmatch(string(readme))
	if call == nil {
		t.Fatal("README.md: no PublishPolicy call with a -d body")
	}
	var body struct {
		Policy json.RawMessage `json:"policy"`
	}
	if err := json.Unmarshal([]byte(call[1]), &body); err != nil || body.Policy == nil {
		t.Fatalf("README.md's PublishPolicy body %s: %v", call[1], err)
	}
	files["README.md PublishPolicy"] = string(body.Policy)

	for where, file := range files {
		p, _, err := parsePolicyFile("", []byte(file))
		if err != nil {
			t.Errorf("%s:\n%s\ndoes not load: %v", where, file, err)
			continue
		}
		if p.GetHoldTtl() == nil {
			t.Errorf("%s: holdTtl not read:\n%s", where, file)
		}
		if strings.Contains(file, "holdTTL") {
			t.Errorf("%s shows holdTTL, the former spelling: show holdTtl", where)
		}
	}
}

// The API's JSON of a policy reads as a file: the fields the server sets
// (publishedAt, rolledBack, active, rolloutNow) are ignored, whatever they
// say, and generation is returned as the generation the file was edited
// from; the policy is the one the same file without them gives.
func TestPolicyFileIgnoresServerSetFields(t *testing.T) {
	const terms = `"subject":"tenant-7","route":"chat","rollout":"ROLLOUT_MODE_SHADOW","dimensions":[{"unit":"tokens","burst":"10"}]`
	want, from, err := parsePolicyFile("", []byte(`{`+terms+`}`))
	if err != nil || from != 0 {
		t.Fatalf("the terms alone: %v, edited from %d", err, from)
	}
	got, from, err := parsePolicyFile("", []byte(`{`+terms+`,"generation":"7","publishedAt":"2026-12-05T04:30:36Z","rolledBack":true,"active":false,"rolloutNow":"ROLLOUT_MODE_ENFORCE"}`))
	if err != nil || from != 7 || !proto.Equal(got, want) {
		t.Fatalf("with the server's fields: %v %v, edited from %d; want %v from 7", err, got, from, want)
	}
}

// A key given twice in a YAML file the CLI reads (a policy, an Envoy
// mapping) is refused naming the file, the line, the mapping and the key
// in capledger's words, as an unknown field is, not in the YAML
// decoder's ("error converting YAML to JSON: yaml: unmarshal errors").
func TestYAMLDuplicateKeySaysFileLineAndKey(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "dup.yaml")
	mapping := filepath.Join(dir, "envoy.yaml")
	for path, content := range map[string]string{
		policy:  "subject: tenant-7\nroute: chat\nholdTtl: 60s\ndimensions:\n  - unit: tokens\n    burst: 10\n    burst: 20\n",
		mapping: "domains:\n  - name: api\n    name: api2\n    rules: [{subject: {key: tenant}, unit: requests}]\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"policy", "publish", policy}, "policy " + policy + `: line 7: dimensions[0]: key "burst" given twice (first on line 6): keep one`},
		{[]string{"serve", "--addr", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "data"), "--envoy-config", mapping},
			"envoy config " + mapping + `: line 3: domains[0]: key "name" given twice (first on line 2): keep one`},
	} {
		code, out, errOut := cli(t, "http://127.0.0.1:1", c.args...)
		if code == 0 || !strings.Contains(errOut, c.says) || strings.Contains(errOut, "converting YAML") {
			t.Errorf("%s: exit %d, want an error saying %q:\n%s%s", c.args[0], code, c.says, out, errOut)
		}
	}
}
