// Package yamlfile reads a file an operator wrote (a policy, an Envoy
// mapping, a resolver configuration) in YAML or JSON into a Go value:
// strictly, and one document per file, so that nothing in it is dropped
// without a word. A file that is JSON (IsJSON) is held to JSON's own
// rules, its syntax errors named by line and column.
package yamlfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// ErrSeveralDocuments: the file holds a second document (after "---", or a
// second JSON value), which UnmarshalStrict alone would ignore.
var ErrSeveralDocuments = errors.New("more than one document in the file (a second after ---, or a second JSON value): give one per file")

// ErrEmptyFirstDocument: the file's content follows an empty document
// ("---" twice, or only comments before a second "---"), which
// UnmarshalStrict alone would decode as nothing.
var ErrEmptyFirstDocument = errors.New("the first document in the file is empty (content after a second ---): remove the empty one")

// ErrNoDocument: the file holds nothing but blanks, comments or "---"
// (say, the output of a command that failed, redirected into it), which
// UnmarshalStrict alone would decode as a zero value without a word.
var ErrNoDocument = errors.New("the file is empty (nothing but blanks or comments)")

// UnmarshalStrict is UnmarshalFile for a file without a name (standard
// input): JSON when its content is (IsJSON), else YAML.
func UnmarshalStrict(data []byte, v any) error {
	return UnmarshalFile("", data, v)
}

// UnmarshalFile decodes data, the file named name ("" or "-" for
// standard input), into v: as strict JSON (UnmarshalStrictJSON) when IsJSON
// says it is JSON, else as YAML (unmarshalYAML). Both refuse what
// unmarshalYAML says, in the same words.
func UnmarshalFile(name string, data []byte, v any) error {
	if IsJSON(name, data) {
		return UnmarshalStrictJSON(data, v)
	}
	return unmarshalYAML(data, v)
}

// IsJSON reports whether the file named name holding data is read as
// JSON rather than YAML: its name ends in ".json" (in any case), or its
// first character other than white space (after a UTF-8 byte order mark)
// is "{" or "[". A YAML reader takes most JSON, but also what JSON
// refuses (a trailing comma, a comment, a single-quoted string or a key
// without quotes), so a file written as JSON, which another JSON tool may
// read too, is held to JSON. A YAML file may not begin with a flow
// mapping or list then: write it in block style, or as JSON.
func IsJSON(name string, data []byte) bool {
	if strings.HasSuffix(strings.ToLower(name), ".json") {
		return true
	}
	rest := bytes.TrimLeft(bytes.TrimPrefix(data, utf8BOM), " \t\r\n")
	return len(rest) > 0 && (rest[0] == '{' || rest[0] == '[')
}

// utf8BOM is the byte order mark some editors write first.
var utf8BOM = []byte("\xef\xbb\xbf")

// unmarshalYAML decodes data into v as sigs.k8s.io/yaml's UnmarshalStrict
// does (unknown or duplicate fields are errors) and returns
// ErrSeveralDocuments when data holds more than one non-empty document,
// ErrEmptyFirstDocument when its one non-empty document is not the first,
// ErrNoDocument when it holds none.
// A key that names no field, or spells one in another case than its
// field's ("Burst" for "burst", which encoding/json would read as the
// field) unless it is the field's former spelling, is refused by
// ExactKeys, saying where it is.
func unmarshalYAML(data []byte, v any) error {
	// A key given twice in one mapping, in capledger's words and where
	// (the decoder says "error converting YAML to JSON: yaml: unmarshal
	// errors: line N: key "K" already set in map"), as UnmarshalStrictJSON
	// says it of a JSON file.
	if err := duplicateKey(data); err != nil {
		return err
	}
	// The keys first, so that a field v lacks is refused saying where it
	// is, not in the decoder's words ("unknown field", nothing more). A
	// document YAMLToJSON cannot convert is the decoder's to refuse.
	if js, err := yaml.YAMLToJSON(data); err == nil {
		if err := exactKeysIn(js, v, data, true); err != nil {
			return err
		}
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		if m := decoderDuplicate.FindStringSubmatch(err.Error()); m != nil {
			// One duplicateKey does not see: a key a merge key (<<)
			// brings given again after it, or one YAML 1.1 spells two
			// ways (yes and true).
			return fmt.Errorf("line %s: key %s given twice in one mapping (also through a merge key, <<, or spelt another way): keep one", m[1], m[2])
		}
		return err
	}
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	documents := 0
	for read := 0; ; read++ {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			if documents == 0 {
				return ErrNoDocument
			}
			return nil
		}
		if err != nil {
			// The first document decoded above; what follows does not.
			return ErrSeveralDocuments
		}
		if doc == nil { // an empty document ("---" with nothing after it)
			continue
		}
		if read > 0 && documents == 0 {
			// UnmarshalStrict decoded only the empty first document.
			return ErrEmptyFirstDocument
		}
		if documents++; documents > 1 {
			return ErrSeveralDocuments
		}
	}
}

// decoderDuplicate is how the YAML decoder words a key given twice: its
// line and the key, quoted.
var decoderDuplicate = regexp.MustCompile(`line (\d+): key ("(?:[^"\\]|\\.)*") already set in map`)

// duplicateKey returns an error naming the first key given twice in one
// mapping of source's first document, as "line N: PATH: key "K" given
// twice (first on line M): keep one" (PATH the mapping's path, none at
// the top level), or nil when there is none, or when source does not
// parse (the decoder's to refuse). Merge keys (<<: *base) are not
// compared: what they bring may be overridden.
func duplicateKey(source []byte) error {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(source, &doc); err != nil || doc.Kind != yamlv3.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	return duplicateKeyIn(doc.Content[0], nil)
}

// duplicateKeyIn is duplicateKey on node, at path. An alias (*name) is
// not followed: its anchor's node is checked where it is written.
func duplicateKeyIn(node *yamlv3.Node, path []step) error {
	switch node.Kind {
	case yamlv3.MappingNode:
		first := map[string]int{}
		for i := 0; i+1 < len(node.Content); i += 2 {
			k := node.Content[i]
			if k.Kind != yamlv3.ScalarNode || k.Tag == "!!merge" {
				continue
			}
			if line, twice := first[k.Value]; twice {
				where := fmt.Sprintf("line %d: ", k.Line)
				if len(path) > 0 {
					where += pathText(path) + ": "
				}
				return fmt.Errorf("%skey %q given twice (first on line %d): keep one", where, k.Value, line)
			}
			first[k.Value] = k.Line
		}
		for i := 0; i+1 < len(node.Content); i += 2 {
			if k := node.Content[i]; k.Kind == yamlv3.ScalarNode && k.Tag != "!!merge" {
				if err := duplicateKeyIn(node.Content[i+1], with(path, step{key: k.Value})); err != nil {
					return err
				}
			}
		}
	case yamlv3.SequenceNode:
		for i, item := range node.Content {
			if err := duplicateKeyIn(item, with(path, step{index: i, isIndex: true})); err != nil {
				return err
			}
		}
	}
	return nil
}

// ExactKeys is the check, for every strict decode of a file an operator
// wrote (UnmarshalStrict; the JSON files of cmd/capledger), that each key
// of an object in doc, one JSON value, names a field of v's type exactly
// as its json tag spells it, and that each value decodes as its field's
// type. It returns an error saying where the first key or value that
// does not is, as "line N: PATH: field "KEY": ...", PATH the object's
// JSON path (domains[0].rules[3]; none for the top level), so that an
// operator finds it in a long file (the decoders name neither line nor
// list item):
//   - a key naming no field: "no such field", with the fields there;
//   - a key naming a field in another case ("maxinflight" for
//     maxInFlight): encoding/json matches keys regardless of case, so it
//     would set the field and, beside the real key, one of the two would
//     be dropped. The error names the field's spelling;
//   - a value its field's type does not take ("burst: 10x"): the error
//     says what the value is not ("an integer"), or, for a type that
//     decodes itself (json.Unmarshaler, e.g. Int64), what its
//     UnmarshalJSON says.
//
// The keys of a map are data, not field names, and so is what a type
// that decodes itself (json.RawMessage) is given: they are not compared.
// A doc that is not JSON is the decoder's to refuse: it returns nil for
// it.
//
// A field may keep one former spelling, so that files written for an
// older binary still load: a struct tag formerly:"holdTTL" beside
// json:"holdTtl". The former spelling is accepted as the field (the
// decoder reads it already, for it differs in case alone); a key in any
// other case is refused naming the json tag's spelling, and an object
// giving both spellings of one field is refused as ambiguous.
func ExactKeys(doc []byte, v any) error {
	return exactKeysIn(doc, v, doc, false)
}

// exactKeysIn is ExactKeys on doc, the JSON form of source, the file as
// written (YAML or JSON), in which the line of the key is looked up.
// fromYAML says doc is what sigs.k8s.io/yaml made of a YAML source, whose
// decoder gives a string field a number or boolean as its text (port: 80
// reads "80"): the check takes those as the decoder will.
func exactKeysIn(doc []byte, v any, source []byte, fromYAML bool) error {
	// Numbers as written (json.Number), so that a value is checked as the
	// file gives it: an int64 near 2^63 would not survive a float64.
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var parsed any
	if err := dec.Decode(&parsed); err != nil {
		return nil
	}
	kerr := exactKeys(parsed, reflect.TypeOf(v), nil, fromYAML)
	if kerr == nil {
		return nil
	}
	where := ""
	if line := keyLine(source, kerr.at); line > 0 {
		where = fmt.Sprintf("line %d: ", line)
	}
	if len(kerr.at) > 1 {
		where += pathText(kerr.at[:len(kerr.at)-1]) + ": "
	}
	return errors.New(where + kerr.text)
}

// keyError is a key ExactKeys refuses: at is the path to it (its last
// step the key itself), text what is wrong with it.
type keyError struct {
	at   []step
	text string
}

// step is one step of a path into a JSON value: an object's key, or a
// list's index when key is "" and isIndex is set.
type step struct {
	key     string
	index   int
	isIndex bool
}

// pathText writes path as JSON paths are written: rules[3].subject.
func pathText(path []step) string {
	var b strings.Builder
	for _, s := range path {
		switch {
		case s.isIndex:
			fmt.Fprintf(&b, "[%d]", s.index)
		case b.Len() == 0:
			b.WriteString(s.key)
		default:
			b.WriteString("." + s.key)
		}
	}
	return b.String()
}

// with returns path and then s, in a new slice (path is shared by the
// siblings of s).
func with(path []step, s step) []step {
	return append(path[:len(path):len(path)], s)
}

// unmarshalerType is json.Unmarshaler: a type that reads its own keys.
var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func exactKeys(doc any, t reflect.Type, path []step, fromYAML bool) *keyError {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || doc == nil {
		return nil
	}
	_, isObject := doc.(map[string]any)
	_, isList := doc.([]any)
	kind := t.Kind()
	switch {
	case reflect.PointerTo(t).Implements(unmarshalerType),
		kind == reflect.Struct && !isObject, kind == reflect.Map && !isObject,
		(kind == reflect.Slice || kind == reflect.Array) && !isList,
		kind != reflect.Struct && kind != reflect.Map && kind != reflect.Slice && kind != reflect.Array:
		return valueError(doc, t, path, fromYAML)
	}
	switch kind {
	case reflect.Struct:
		obj := doc.(map[string]any)
		fields := jsonFields(t)
		formerly := map[string]string{} // former spelling -> the field's
		for name, f := range fields {
			if f.formerly != "" {
				formerly[f.formerly] = name
			}
		}
		for _, k := range sortedKeys(obj) {
			at := with(path, step{key: k})
			name, ok := k, true
			if _, current := fields[k]; !current {
				name, ok = formerly[k]
			}
			if ok {
				if former := fields[name].formerly; former != "" {
					_, hasCurrent := obj[name]
					_, hasFormer := obj[former]
					if hasCurrent && hasFormer {
						return &keyError{at, fmt.Sprintf("fields %q and %q: one field given twice; it is spelt %q (%q, its former spelling, is still read): keep one", former, name, name, former)}
					}
				}
				if err := exactKeys(obj[k], fields[name].typ, at, fromYAML); err != nil {
					return err
				}
				continue
			}
			for name := range fields {
				if strings.EqualFold(name, k) {
					return &keyError{at, fmt.Sprintf("field %q: no such field; the field is spelt %q (field names are case-sensitive)", k, name)}
				}
			}
			return &keyError{at, fmt.Sprintf("field %q: no such field; the fields here: %s", k, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))}
		}
	case reflect.Slice, reflect.Array:
		for i, item := range doc.([]any) {
			if err := exactKeys(item, t.Elem(), with(path, step{index: i, isIndex: true}), fromYAML); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj := doc.(map[string]any)
		for _, k := range sortedKeys(obj) {
			if err := exactKeys(obj[k], t.Elem(), with(path, step{key: k}), fromYAML); err != nil {
				return err
			}
		}
	}
	return nil
}

// valueError returns nil when doc, a value as the file gives it, decodes
// as t (as the decoder will decode it), else the keyError at path saying
// why not.
func valueError(doc any, t reflect.Type, path []step, fromYAML bool) *keyError {
	if t.Kind() == reflect.String && fromYAML {
		switch scalar := doc.(type) {
		case json.Number:
			doc = scalar.String()
		case bool:
			doc = strconv.FormatBool(scalar)
		}
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return nil // not from a JSON document; the decoder's to refuse
	}
	err = json.Unmarshal(raw, reflect.New(t).Interface())
	if err == nil {
		return nil
	}
	text := err.Error()
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		text = fmt.Sprintf("%s is not %s", valueText(doc, raw), wanted(t, doc))
	}
	if len(path) == 0 {
		// The document itself (a list, or a number, where the file
		// should hold a mapping): there is no field to name.
		if errors.As(err, &typeErr) {
			text = fmt.Sprintf("the file holds %s; want %s", valueText(doc, raw), wanted(t, doc))
		}
		return &keyError{nil, text}
	}
	last := path[len(path)-1]
	if last.isIndex {
		return &keyError{path, fmt.Sprintf("item %d: %s", last.index, text)}
	}
	return &keyError{path, fmt.Sprintf("field %q: %s", last.key, text)}
}

// valueText is a value as an error shows it: a scalar as JSON writes it
// ("10x", 1.5, true), a list or mapping by its kind.
func valueText(doc any, raw []byte) string {
	switch doc.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return string(raw)
}

// wanted says what a value of t is, for "VALUE is not WANTED"; for an
// integer type given a whole number, that it is out of t's range.
func wanted(t reflect.Type, doc any) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if n, ok := doc.(json.Number); ok && !strings.ContainsAny(n.String(), ".eE") {
			return fmt.Sprintf("within the range of %s", t.Kind())
		}
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Struct, reflect.Map:
		return "a mapping (key: value)"
	}
	return "a " + t.String()
}

func sortedKeys(obj map[string]any) []string {
	return slices.Sorted(maps.Keys(obj))
}

// keyLine returns the line of the key at path (its last step) in source,
// a YAML or JSON file, or 0 when it cannot be found there.
func keyLine(source []byte, path []step) int {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(source, &doc); err != nil || doc.Kind != yamlv3.DocumentNode || len(doc.Content) == 0 {
		return 0
	}
	node := doc.Content[0]
	for i, s := range path {
		node = resolved(node)
		if s.isIndex {
			if node.Kind != yamlv3.SequenceNode || s.index >= len(node.Content) {
				return 0
			}
			node = node.Content[s.index]
			if i == len(path)-1 {
				return node.Line
			}
			continue
		}
		key, value := mappingEntry(node, s.key)
		if key == nil {
			return 0
		}
		if i == len(path)-1 {
			return key.Line
		}
		node = value
	}
	return 0
}

// plainKeyJSON returns the JSON key YAMLToJSON makes of a plain (unquoted)
// YAML key, which YAML 1.1 may read as another type: yes is "true", 0x10
// "16"; "" when it makes none.
func plainKeyJSON(key string) string {
	js, err := yaml.YAMLToJSON([]byte(key + ": 0"))
	if err != nil {
		return ""
	}
	var obj map[string]any
	if json.Unmarshal(js, &obj) != nil || len(obj) != 1 {
		return ""
	}
	for k := range obj {
		return k
	}
	return ""
}

// resolved returns the node an alias (*name) stands for, or node.
func resolved(node *yamlv3.Node) *yamlv3.Node {
	for node.Kind == yamlv3.AliasNode && node.Alias != nil {
		node = node.Alias
	}
	return node
}

// mappingEntry returns the key and value nodes of key in the mapping
// node, looking into what its merge keys (<<: *base) bring when it is not
// written there itself; nil when there is none.
func mappingEntry(node *yamlv3.Node, key string) (*yamlv3.Node, *yamlv3.Node) {
	if node.Kind != yamlv3.MappingNode {
		return nil, nil
	}
	var merged []*yamlv3.Node
	for i := 0; i+1 < len(node.Content); i += 2 {
		k, v := node.Content[i], node.Content[i+1]
		switch {
		case k.Value == key, k.Kind == yamlv3.ScalarNode && k.Style == 0 && plainKeyJSON(k.Value) == key:
			return k, v
		case k.Tag == "!!merge":
			if v = resolved(v); v.Kind == yamlv3.SequenceNode {
				merged = append(merged, v.Content...)
			} else {
				merged = append(merged, v)
			}
		}
	}
	for _, m := range merged {
		if k, v := mappingEntry(resolved(m), key); k != nil {
			return k, v
		}
	}
	return nil, nil
}

// jsonField is one field of a struct as a file spells it: its type, and
// the former spelling its formerly tag names ("" for none).
type jsonField struct {
	typ      reflect.Type
	formerly string
}

// jsonFields maps the JSON names of t's fields (as encoding/json reads
// them, embedded structs' fields included) to their types and former
// spellings. It panics on a former spelling that differs from the field's
// in more than case: the decoders would refuse it as an unknown field, so
// the tag could never work.
func jsonFields(t reflect.Type) map[string]jsonField {
	fields := map[string]jsonField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for n, field := range jsonFields(ft) {
					fields[n] = field
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		former := f.Tag.Get("formerly")
		if former != "" && (former == name || !strings.EqualFold(former, name)) {
			panic(fmt.Sprintf("yamlfile: %s.%s: formerly:%q must differ from json:%q in case alone", t, f.Name, former, name))
		}
		fields[name] = jsonField{typ: f.Type, formerly: former}
	}
	return fields
}

// LineOf returns the line in source, a YAML or JSON file, of the key a
// JSON path names ("dimensions[1].maxReservation", as the API's field
// paths are written), or 0 when the path is malformed or names nothing in
// source (a key spelt otherwise there, say).
func LineOf(source []byte, path string) int {
	var steps []step
	for _, part := range strings.Split(path, ".") {
		key, rest, _ := strings.Cut(part, "[")
		if key == "" {
			return 0
		}
		steps = append(steps, step{key: key})
		for rest != "" {
			index, after, ok := strings.Cut(rest, "]")
			n, err := strconv.Atoi(index)
			if !ok || err != nil || n < 0 || (after != "" && after[0] != '[') {
				return 0
			}
			steps = append(steps, step{index: n, isIndex: true})
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return keyLine(source, steps)
}
