package yamlfile

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// A second document was dropped without a word by sigs.k8s.io/yaml, which
// reads the first: a policy file with two policies published one, a
// mapping file with two halves served half. One document (with or without
// a leading or trailing "---") still reads.
func TestOneDocumentPerFile(t *testing.T) {
	type file struct {
		Name string `json:"name"`
	}
	for _, ok := range []string{"name: a\n", "---\nname: a\n", "name: a\n---\n", `{"name":"a"}`, "{\"name\":\"a\"}\n\n"} {
		var f file
		if err := UnmarshalStrict([]byte(ok), &f); err != nil || f.Name != "a" {
			t.Errorf("%q: %v %+v, want name a", ok, err, f)
		}
	}
	for _, several := range []string{"name: a\n---\nname: b\n", "{\"name\":\"a\"}\n{\"name\":\"b\"}\n", `{"name":"a"} {"name":"b"}`} {
		var f file
		if err := UnmarshalStrict([]byte(several), &f); !errors.Is(err, ErrSeveralDocuments) {
			t.Errorf("%q: %v, want ErrSeveralDocuments", several, err)
		}
	}
	// Content after an empty first document: sigs.k8s.io/yaml decodes
	// the empty one, so the file would read as nothing.
	for _, late := range []string{"---\n---\nname: a\n", "---\n# only a comment\n---\nname: a\n"} {
		var f file
		if err := UnmarshalStrict([]byte(late), &f); !errors.Is(err, ErrEmptyFirstDocument) {
			t.Errorf("%q: %v %+v, want ErrEmptyFirstDocument", late, err, f)
		}
	}
	for _, ok := range []string{"# a comment\n---\nname: a\n", "name: a\n...\n", "name: a\n---\n# end\n"} {
		var f file
		if err := UnmarshalStrict([]byte(ok), &f); err != nil || f.Name != "a" {
			t.Errorf("%q: %v %+v, want name a", ok, err, f)
		}
	}
	var f file
	if err := UnmarshalStrict([]byte("nmae: a\n"), &f); err == nil {
		t.Error("an unknown field read without an error")
	}
}

// An empty file decoded as a zero value without a word: a policy file
// left empty by a "policy get > FILE" that failed was sent to the server,
// which refused it as a policy with no subject. A file with nothing in it
// is refused as empty; an empty object is a document, for its reader to
// judge.
func TestEmptyFileIsRefused(t *testing.T) {
	type file struct {
		Name string `json:"name"`
	}
	for _, empty := range []string{"", "\n\n", "   \n", "# only a comment\n", "---\n", "---\n# a comment\n---\n", "null\n"} {
		var f file
		if err := UnmarshalStrict([]byte(empty), &f); !errors.Is(err, ErrNoDocument) {
			t.Errorf("%q: %v %+v, want ErrNoDocument", empty, err, f)
		}
	}
	for _, document := range []string{"{}", "{}\n\n", "# a comment\n{}\n"} {
		var f file
		if err := UnmarshalStrict([]byte(document), &f); err != nil {
			t.Errorf("%q: %v, want it read", document, err)
		}
	}
}

// encoding/json, under sigs.k8s.io/yaml, matches a key to a field
// regardless of case: "Burst: 99" published burst 99, and beside
// "burst: 10" one of the two was dropped without a word. A key spelt in
// another case than its field's is an error naming it and the spelling,
// at any depth; a map's keys are data, which may differ in case alone.
func TestKeysInAnotherCase(t *testing.T) {
	type dimension struct {
		Unit  string `json:"unit"`
		Burst int64  `json:"burst"`
	}
	type file struct {
		Name       string            `json:"name"`
		Dimensions []dimension       `json:"dimensions"`
		Match      map[string]string `json:"match,omitempty"`
	}
	for _, c := range []struct{ doc, want string }{
		{"Name: a\n", `field "Name": no such field; the field is spelt "name"`},
		{"name: a\nName: b\n", `field "Name"`},
		{"name: a\ndimensions:\n  - unit: tokens\n    burst: 10\n    Burst: 99\n", `dimensions[0]: field "Burst": no such field; the field is spelt "burst"`},
		{`{"name":"a","dimensions":[{"unit":"tokens","BURST":99}]}`, `dimensions[0]: field "BURST"`},
	} {
		var f file
		err := UnmarshalStrict([]byte(c.doc), &f)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v %+v, want an error with %q", c.doc, err, f, c.want)
		}
	}
	if err := ExactKeys([]byte(`{"name":"a","dimensions":[{"unit":"t","Burst":1}]}`), &file{}); err == nil || !strings.Contains(err.Error(), `"Burst"`) {
		t.Errorf("ExactKeys on JSON: %v, want an error naming \"Burst\"", err)
	}
	// A map's keys differing in case alone are two entries.
	var f file
	if err := UnmarshalStrict([]byte("name: a\nmatch:\n  tenant: x\n  Tenant: y\n"), &f); err != nil || len(f.Match) != 2 {
		t.Errorf("map keys differing in case: %v %+v, want two entries", err, f)
	}
}

// A field's former spelling (formerly tag) still reads, in YAML and JSON
// and inside a list, as the same value as its spelling now; any other
// case is refused naming the spelling now, and both spellings in one
// object are refused as ambiguous (encoding/json would keep the last).
func TestFormerSpelling(t *testing.T) {
	type dimension struct {
		Unit  string `json:"unit"`
		Burst int64  `json:"burst" formerly:"BURST"`
	}
	type file struct {
		HoldTTL    string      `json:"holdTtl,omitempty" formerly:"holdTTL"`
		Dimensions []dimension `json:"dimensions"`
		Default    *dimension  `json:"defaultDim,omitempty" formerly:"defaultdim"`
	}
	want := file{HoldTTL: "60s", Dimensions: []dimension{{Unit: "t", Burst: 5}}}
	for _, doc := range []string{
		"holdTtl: 60s\ndimensions: [{unit: t, burst: 5}]\n",
		"holdTTL: 60s\ndimensions: [{unit: t, BURST: 5}]\n",
		`{"holdTTL":"60s","dimensions":[{"unit":"t","burst":5}]}`,
	} {
		var f file
		if err := UnmarshalStrict([]byte(doc), &f); err != nil || f.HoldTTL != want.HoldTTL || len(f.Dimensions) != 1 || f.Dimensions[0] != want.Dimensions[0] {
			t.Errorf("%q: %v %+v, want %+v", doc, err, f, want)
		}
	}
	for _, c := range []struct{ doc, want string }{
		{"HoldTtl: 60s\ndimensions: []\n", `field "HoldTtl": no such field; the field is spelt "holdTtl"`},
		{"HOLDTTL: 60s\ndimensions: []\n", `field "HOLDTTL": no such field; the field is spelt "holdTtl"`},
		{"holdTtl: 60s\nholdTTL: 90s\ndimensions: []\n", `fields "holdTTL" and "holdTtl": one field given twice; it is spelt "holdTtl" ("holdTTL", its former spelling, is still read): keep one`},
		{`{"dimensions":[{"unit":"t","BURST":5,"burst":6}]}`, `dimensions[0]: fields "BURST" and "burst": one field given twice`},
		{`{"dimensions":[{"unit":"t","Burst":5}]}`, `dimensions[0]: field "Burst": no such field; the field is spelt "burst"`},
		// Under its former spelling a field's value is checked as the
		// field's type, as under its spelling now.
		{"dimensions: []\ndefaultdim:\n  unit: t\n  brust: 5\n", `line 4: defaultdim: field "brust": no such field; the fields here: burst, unit`},
	} {
		var f file
		if err := UnmarshalStrict([]byte(c.doc), &f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v %+v, want an error with %q", c.doc, err, f, c.want)
		}
	}
}

// A former spelling that differs in more than case could never be read
// (the decoder refuses it as unknown): such a tag panics at the first use.
// One the same as the field's would refuse every file giving the field
// (both spellings at once): it panics too.
func TestFormerSpellingOnlyInCase(t *testing.T) {
	type otherWord struct {
		HoldTTL string `json:"holdTtl" formerly:"hold_ttl"`
	}
	type sameSpelling struct {
		HoldTTL string `json:"holdTtl" formerly:"holdTtl"`
	}
	for _, v := range []any{&otherWord{}, &sameSpelling{}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%T: its formerly tag was taken", v)
				}
			}()
			ExactKeys([]byte(`{"holdTtl":"1s"}`), v)
		}()
	}
}

// selfDecoded decodes itself from any object (counting its keys): its
// keys are its own, not the fields of its struct.
type selfDecoded struct{ Keys int }

func (s *selfDecoded) UnmarshalJSON(b []byte) error {
	var m map[string]any
	err := json.Unmarshal(b, &m)
	s.Keys = len(m)
	return err
}

// A key naming no field was refused in the decoder's words alone
// (`unknown field "kye"`): in a mapping file of 200 rules the operator
// could not find it. It is refused saying where: its line in the file as
// written (YAML or JSON; a key a merge key brings in, where it is
// written), the JSON path of its object, and the fields there. What a
// type decodes itself (json.RawMessage, time.Time) and a map's keys are
// not field names.
func TestUnknownFieldSaysWhere(t *testing.T) {
	type field struct {
		Key   string `json:"key,omitempty"`
		Value string `json:"value,omitempty"`
	}
	type rule struct {
		Subject field  `json:"subject"`
		Unit    string `json:"unit"`
	}
	type Common struct {
		Owner string `json:"owner,omitempty"`
	}
	type file struct {
		Common
		Rules     []rule           `json:"rules"`
		Named     map[string]field `json:"named,omitempty"`
		Templates map[string]any   `json:"templates,omitempty"`
		Raw       json.RawMessage  `json:"raw,omitempty"`
		At        time.Time        `json:"at,omitzero"`
		Self      selfDecoded      `json:"self"`
	}
	for _, c := range []struct{ doc, want string }{
		{"rules:\n  - unit: u\n    subject: {key: t}\n  - unit: u\n    subject:\n      kye: t\n",
			`line 6: rules[1].subject: field "kye": no such field; the fields here: key, value`},
		{"{\"rules\": [\n  {\"unit\": \"u\", \"subject\": {\"key\": \"t\"}},\n  {\"unit\": \"u\", \"units\": 3}\n]}",
			`line 3: rules[1]: field "units": no such field; the fields here: subject, unit`},
		{"# a comment\n\nrules: []\nrulez: []\n",
			`line 4: field "rulez": no such field; the fields here: at, named, owner, raw, rules, self, templates`},
		// A map's values are checked as its element type.
		{"rules: []\nnamed:\n  a: {key: k}\n  b:\n    kye: k\n", `line 5: named.b: field "kye": no such field; the fields here: key, value`},
		// Merge keys given as a list: each map in it is looked into.
		{"templates:\n  t: &t\n    kye: t\n  u: &u\n    value: v\nrules:\n  - unit: u\n    subject: {<<: [*t, *u]}\n",
			`line 3: rules[0].subject: field "kye": no such field`},
		{"templates:\n  t: &t\n    kye: t\nrules:\n  - unit: u\n    subject: {<<: *t}\n",
			`line 3: rules[0].subject: field "kye": no such field`},
		// A plain key YAML 1.1 reads as another type: the field named as
		// the decoder reads it, where it is written.
		{"rules: []\nyes: 1\n", `line 2: field "true": no such field`},
		{"rules: []\n\n0x10: 1\n", `line 3: field "16": no such field`},
		// In another case: where it is too.
		{"rules:\n  - unit: u\n    Subject: {key: t}\n",
			`line 3: rules[0]: field "Subject": no such field; the field is spelt "subject"`},
	} {
		var f file
		err := UnmarshalStrict([]byte(c.doc), &f)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error starting %q", c.doc, err, c.want)
		}
	}
	// JSON through ExactKeys alone, as cmd/capledger's JSON files are read.
	if err := ExactKeys([]byte("{\"rules\": [],\n \"extra\": 1}"), &file{}); err == nil || !strings.HasPrefix(err.Error(), `line 2: field "extra": no such field`) {
		t.Errorf("ExactKeys: %v, want line 2, field \"extra\"", err)
	}
	ok := "owner: o\nrules: [{unit: u, subject: {value: v}}]\ntemplates: {anything: {goes: here}}\nraw: {any: key}\nat: 2026-07-19T14:00:00Z\nself: {a: 1, b: 2}\n"
	var f file
	if err := UnmarshalStrict([]byte(ok), &f); err != nil || len(f.Rules) != 1 || string(f.Raw) != `{"any":"key"}` || f.At.IsZero() || f.Self.Keys != 2 || f.Owner != "o" {
		t.Errorf("%q: %v %+v, want read", ok, err, f)
	}
}

// A value its field's type does not take is refused saying where it is
// (line and path, as for a key) and what it is not, at any depth and in
// a list of scalars, in YAML and in JSON (ExactKeys); the decoders named
// neither line nor list item. What the decoder takes still reads: an
// int64 at its bound, a YAML number or boolean for a string field (the
// decoder reads its text), null.
func TestValueErrorsSayWhere(t *testing.T) {
	type dimension struct {
		Unit  string `json:"unit"`
		Burst int64  `json:"burst"`
	}
	type file struct {
		Name       string      `json:"name"`
		Enabled    bool        `json:"enabled,omitempty"`
		Share      float64     `json:"share,omitempty"`
		Tags       []int32     `json:"tags,omitempty"`
		Dimensions []dimension `json:"dimensions"`
		Weight     Int64       `json:"weight,omitempty"`
	}
	for _, c := range []struct{ doc, want string }{
		{"name: a\ndimensions:\n  - unit: t\n    burst: 10\n  - unit: u\n    burst: 10x\n", `line 6: dimensions[1]: field "burst": "10x" is not an integer`},
		{"name: a\ndimensions:\n  - unit: t\n    burst: 1.5\n", `line 4: dimensions[0]: field "burst": 1.5 is not an integer`},
		{"name: a\ndimensions:\n  - unit: t\n    burst: 9223372036854775808\n", `line 4: dimensions[0]: field "burst": 9223372036854775808 is not within the range of int64`},
		{"name: a\nenabled: maybe\n", `line 2: field "enabled": "maybe" is not true or false`},
		{"name: a\nshare: lots\n", `line 2: field "share": "lots" is not a number`},
		{"name: a\ntags: [1, 2, x]\n", `line 2: tags: item 2: "x" is not an integer`},
		{"name: a\ndimensions: 5\n", `line 2: field "dimensions": 5 is not a list`},
		{"name: a\ndimensions:\n  - 5\n", `line 3: dimensions: item 0: 5 is not a mapping (key: value)`},
		{"name: [a]\n", `line 1: field "name": a list is not a string`},
		{"name: a\nweight: heavy\n", `line 2: field "weight": "heavy" is not an integer`},
		{`{"name":"a","dimensions":[{"unit":"t","burst":"10"}]}`, `line 1: dimensions[0]: field "burst": "10" is not an integer`},
	} {
		var f file
		if err := UnmarshalStrict([]byte(c.doc), &f); err == nil || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error ending %q", c.doc, err, c.want)
		}
	}
	if err := ExactKeys([]byte(`{"name":"a","dimensions":[{"unit":"t","burst":true}]}`), &file{}); err == nil ||
		!strings.Contains(err.Error(), `dimensions[0]: field "burst": true is not an integer`) {
		t.Errorf("ExactKeys on JSON: %v, want the burst's error", err)
	}
	// In JSON decoded as JSON (ExactKeys), a number is no string.
	if err := ExactKeys([]byte(`{"name":5,"dimensions":[]}`), &file{}); err == nil || !strings.Contains(err.Error(), `field "name": 5 is not a string`) {
		t.Errorf("ExactKeys of a number for a string: %v", err)
	}
	var f file
	if err := UnmarshalStrict([]byte("name: 80\nenabled: yes\ntags: [1]\nweight: null\ndimensions:\n  - unit: true\n    burst: 9223372036854775807\n"), &f); err != nil ||
		f.Name != "80" || f.Dimensions[0].Unit != "true" || f.Dimensions[0].Burst != 9223372036854775807 || !f.Enabled {
		t.Errorf("values the decoder takes: %v %+v", err, f)
	}
}

// A document that is itself of the wrong shape (a list or a number where
// the file should hold a mapping, a mapping where a list) is refused
// saying so; it once panicked (there is no field to name).
func TestDocumentOfTheWrongShape(t *testing.T) {
	type file struct {
		Name string `json:"name"`
	}
	for _, c := range []struct {
		doc  string
		into any
		want string
	}{
		{"- a\n- b\n", &file{}, "the file holds a list; want a mapping (key: value)"},
		{`[{"name":"a"}]`, &file{}, "the file holds a list; want a mapping (key: value)"},
		{"42", &file{}, "the file holds 42; want a mapping (key: value)"},
		{`{"name":"a"}`, &[]file{}, "the file holds a mapping; want a list"},
	} {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New("panic: " + strings.TrimSpace(strings.SplitN(fmtAny(r), "\n", 2)[0]))
				}
			}()
			err = UnmarshalFile("f", []byte(c.doc), c.into)
		}()
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: %v; want %q", c.doc, err, c.want)
		}
	}
}

func fmtAny(v any) string {
	if e, ok := v.(error); ok {
		return e.Error()
	}
	s, _ := v.(string)
	return s
}

// Int64 and Uint64 read an integer given as a number or as a quoted
// decimal string (the API's JSON writes int64s so), and write a number;
// anything else is refused saying what it is and what was wanted.
func TestIntegersAsNumbersOrStrings(t *testing.T) {
	type file struct {
		Burst      Int64  `json:"burst"`
		Generation Uint64 `json:"generation,omitempty"`
	}
	for _, doc := range []string{"burst: 1000\ngeneration: 3\n", "burst: \"1000\"\ngeneration: \"3\"\n", `{"burst":"1000","generation":"3"}`, `{"burst":1000,"generation":3}`} {
		var f file
		if err := UnmarshalStrict([]byte(doc), &f); err != nil || f.Burst != 1000 || f.Generation != 3 {
			t.Errorf("%q: %v %+v, want burst 1000, generation 3", doc, err, f)
		}
	}
	var f file
	if err := UnmarshalStrict([]byte(`{"burst":"-9223372036854775808"}`), &f); err != nil || f.Burst != -9223372036854775808 {
		t.Errorf("the least int64 as a string: %v %+v", err, f)
	}
	for _, c := range []struct{ doc, want string }{
		{`burst: ""`, `line 1: field "burst": "" is not an integer`},
		{`burst: "1e3"`, `line 1: field "burst": "1e3" is not an integer`},
		{`burst: "9223372036854775808"`, `line 1: field "burst": "9223372036854775808" is out of range: want -9223372036854775808 to 9223372036854775807`},
		{"burst: 1\ngeneration: -1\n", `line 2: field "generation": -1 is not an integer (want 0 to 18446744073709551615)`},
		{"burst: true\n", `line 1: field "burst": true is not an integer`},
		{"burst: [1]\n", `line 1: field "burst": [1] is not an integer`},
	} {
		var f file
		if err := UnmarshalStrict([]byte(c.doc), &f); err == nil || !strings.HasSuffix(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error ending %q", c.doc, err, c.want)
		}
	}
	out, err := json.Marshal(file{Burst: 1000, Generation: 3})
	if err != nil || string(out) != `{"burst":1000,"generation":3}` {
		t.Errorf("written as %s %v, want numbers", out, err)
	}
}

// A file written as JSON was read by the YAML decoder, which took what
// JSON refuses: a policy with a trailing comma, a comment or a key
// without quotes published, while every JSON tool the operator checks it
// with refuses it. A file that is JSON (its first character "{" or "[",
// or a .json name) is read as strict JSON, its mistakes named by line and
// column; YAML stays YAML.
func TestJSONFileIsStrictJSON(t *testing.T) {
	type dimension struct {
		Unit  string `json:"unit"`
		Burst Int64  `json:"burst"`
	}
	type file struct {
		Name       string      `json:"name"`
		Dimensions []dimension `json:"dimensions"`
	}
	for _, c := range []struct {
		name, data string
		says       []string
	}{
		{"", `{"name": "a",}`, []string{"line 1, column 14", "trailing comma"}},
		{"", "{\n  \"name\": \"a\",\n  \"dimensions\": [{\"unit\": \"t\", \"burst\": 5},]\n}\n", []string{"line 3, column 44", "a comma before ]: JSON allows no trailing comma"}},
		{"", "{\n  \"name\": \"a\",\n}\n", []string{"line 3, column 1", "trailing comma"}},
		{"", "{\"name\": \"a\" // the tenant\n}", []string{"line 1, column 14"}},
		{"", "  {'name': 'a'}", []string{"line 1, column 4"}},
		{"", "{name: \"a\"}", []string{"line 1, column 2"}},
		{"", "{\"name\": \"a\",\n \"name\": \"b\"}", []string{"line 2, column 2", `key "name" given twice`}},
		{"", "{\"dimensions\": [{\"unit\": \"t\", \"burst\": 1, \"burst\": 2}]}", []string{"line 1, column 43", `key "burst" given twice`}},
		{"", "{\"name\": \"a\"}\n{\"name\": \"b\"}", []string{"line 2, column 1", "more than one document"}},
		{"", "{\"name\": \"a\"", []string{"ends inside"}},
		{"", "{\"name\": \"a\", \"nmae\": \"b\"}", []string{"line 1", `field "nmae": no such field`}},
		{"", "{\"dimensions\": [{\"unit\": \"t\", \"burst\": \"10x\"}]}", []string{"line 1", "dimensions[0]", "burst"}},
		// A .json name is JSON whatever it holds.
		{"policy.json", "name: a\n", []string{"line 1, column 2"}},
		// JSON has no comments, after its value neither.
		{"", "{\"name\": \"a\"}\n# the tenant\n", []string{"line 2, column 1", "after the JSON value"}},
		{"POLICY.JSON", "", []string{"empty"}},
		// Content that opens as JSON is JSON whatever the name.
		{"policy.yaml", "{name: a}\n", []string{"line 1, column 2"}},
	} {
		var f file
		err := UnmarshalFile(c.name, []byte(c.data), &f)
		if err == nil {
			t.Errorf("%s %q: read as %+v, want an error saying %q", c.name, c.data, f, c.says)
			continue
		}
		for _, say := range c.says {
			if !strings.Contains(err.Error(), say) {
				t.Errorf("%s %q: %v, want it to say %q", c.name, c.data, err, say)
			}
		}
	}
	for _, c := range []struct{ name, data string }{
		{"", `{"name": "a", "dimensions": [{"unit": "t", "burst": "5"}]}`},
		{"", "\xef\xbb\xbf\n  {\"name\": \"a\", \"dimensions\": [{\"unit\": \"t\", \"burst\": 5}]}\n\n"},
		{"p.json", `{"name": "a", "dimensions": [{"unit": "t", "burst": 5}]}`},
		// YAML stays YAML: comments, block style, a flow list inside.
		{"p.yaml", "# tenant a\nname: a\ndimensions: [{unit: t, burst: 5}]\n"},
		{"", "name: a # tenant a\ndimensions:\n  - unit: t\n    burst: 5\n"},
	} {
		var f file
		if err := UnmarshalFile(c.name, []byte(c.data), &f); err != nil || f.Name != "a" || len(f.Dimensions) != 1 || f.Dimensions[0].Burst != 5 {
			t.Errorf("%s %q: %v %+v, want name a, one dimension of burst 5", c.name, c.data, err, f)
		}
	}
	// UnmarshalStrict, for a file without a name, goes by its content.
	var f file
	if err := UnmarshalStrict([]byte(`{"name": "a",}`), &f); err == nil {
		t.Errorf("UnmarshalStrict read a trailing comma as %+v", f)
	}
}

// A key given twice in one YAML mapping is refused in the words a JSON
// file's is (UnmarshalStrictJSON), saying the key, its line, the line of
// its first spelling and the mapping's path, at any depth (in a list, in
// a map whose keys are data), not in the decoder's ("error converting
// YAML to JSON: yaml: unmarshal errors: ... already set in map").
func TestDuplicateKeySaysWhere(t *testing.T) {
	type dimension struct {
		Unit  string `json:"unit"`
		Burst int64  `json:"burst"`
	}
	type file struct {
		Subject    string            `json:"subject"`
		Dimensions []dimension       `json:"dimensions"`
		Labels     map[string]string `json:"labels,omitempty"`
	}
	for _, c := range []struct{ doc, want string }{
		{"subject: a\nsubject: b\n", `line 2: key "subject" given twice (first on line 1): keep one`},
		{"subject: a\ndimensions:\n  - unit: t\n    burst: 1\n\n    burst: 2\n", `line 6: dimensions[0]: key "burst" given twice (first on line 4): keep one`},
		{"subject: a\nlabels:\n  x: 1\n  x: 2\n", `line 4: labels: key "x" given twice (first on line 3): keep one`},
		{"subject: a\ndimensions: [{unit: t, unit: u}]\n", `line 2: dimensions[0]: key "unit" given twice (first on line 2): keep one`},
	} {
		var f file
		if err := UnmarshalFile("policy.yaml", []byte(c.doc), &f); err == nil || err.Error() != c.want {
			t.Errorf("%q: %v, want %q", c.doc, err, c.want)
		}
	}
	// A key a merge key brings, given again after it, the decoder
	// refuses: in the same words, where it is.
	var f file
	merged := "subject: a\ndimensions:\n  - &d {unit: t, burst: 1}\n  - <<: *d\n    burst: 2\n"
	want := `line 5: key "burst" given twice in one mapping (also through a merge key, <<, or spelt another way): keep one`
	if err := UnmarshalFile("policy.yaml", []byte(merged), &f); err == nil || err.Error() != want {
		t.Errorf("a merge key's key given again: %v, want %q", err, want)
	}
}

// LineOf finds the line of the key an API field path names, in YAML and
// in JSON, and 0 for a path that names nothing there or is malformed.
func TestLineOf(t *testing.T) {
	yamlSource := []byte("subject: a\nroute: b\ndimensions:\n  - unit: tokens\n    burst: 10\n  - unit: requests\n    burst: 5\n    maxReservation: 6\n")
	jsonSource := []byte("{\n  \"subject\": \"a\",\n  \"dimensions\": [\n    {\"unit\": \"tokens\"},\n    {\n      \"unit\": \"requests\",\n      \"maxReservation\": \"6\"\n    }\n  ]\n}\n")
	for _, c := range []struct {
		source []byte
		path   string
		want   int
	}{
		{yamlSource, "dimensions[1].maxReservation", 8},
		{yamlSource, "dimensions[0].burst", 5},
		{yamlSource, "route", 2},
		{yamlSource, "dimensions[1]", 6},
		{yamlSource, "dimensions[2].burst", 0},
		{yamlSource, "holdTtl", 0},
		{yamlSource, "dimensions[x].burst", 0},
		{yamlSource, "dimensions[1.burst", 0},
		{yamlSource, ".route", 0},
		{jsonSource, "dimensions[1].maxReservation", 7},
		{jsonSource, "subject", 2},
	} {
		if got := LineOf(c.source, c.path); got != c.want {
			t.Errorf("LineOf(%q) = %d, want %d", c.path, got, c.want)
		}
	}
}
