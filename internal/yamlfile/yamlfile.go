// Package yamlfile reads a file an operator wrote (a policy, an Envoy
// mapping) in YAML or JSON into a Go value: strictly, and one document per
// file, so that nothing in it is dropped without a word.
package yamlfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"

	yamlv2 "go.yaml.in/yaml/v2"
	"sigs.k8s.io/yaml"
)

// ErrSeveralDocuments: the file holds a second document (after "---", or a
// second JSON value), which UnmarshalStrict alone would ignore.
var ErrSeveralDocuments = errors.New("more than one document in the file (a second after ---, or a second JSON value): give one per file")

// ErrEmptyFirstDocument: the file's content follows an empty document
// ("---" twice, or only comments before a second "---"), which
// UnmarshalStrict alone would decode as nothing.
var ErrEmptyFirstDocument = errors.New("the first document in the file is empty (content after a second ---): remove the empty one")

// UnmarshalStrict decodes data into v as sigs.k8s.io/yaml's UnmarshalStrict
// does (unknown or duplicate fields are errors) and returns
// ErrSeveralDocuments when data holds more than one non-empty document,
// ErrEmptyFirstDocument when its one non-empty document is not the first.
// A key spelt in another case than its field's ("Burst" for "burst") is an
// error too, unless it is the field's former spelling (ExactKeys):
// encoding/json would read it as the field.
func UnmarshalStrict(data []byte, v any) error {
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		return err
	}
	// A document YAMLToJSON cannot convert was read above all the same:
	// there are then no keys to compare.
	if js, err := yaml.YAMLToJSON(data); err == nil {
		if err := ExactKeys(js, v); err != nil {
			return err
		}
	}
	dec := yamlv2.NewDecoder(bytes.NewReader(data))
	documents := 0
	for read := 0; ; read++ {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
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

// ExactKeys is the check, for every strict decode of a file an operator
// wrote (UnmarshalStrict; the JSON files of cmd/capledger), that each key
// of an object in doc, one JSON value, names a field of v's type exactly
// as its json tag spells it: encoding/json matches keys regardless of
// case, so "maxinflight" would set maxInFlight and, beside the real key,
// one of the two would be dropped. It returns an error naming the key as
// written, where it is, and the field's spelling. The keys of a map are
// data, not field names: they are not compared. Keys that name no field
// at all, and a doc that is not JSON, are the decoder's to refuse: it
// returns nil for them.
//
// A field may keep one former spelling, so that files written for an
// older binary still load: a struct tag formerly:"holdTTL" beside
// json:"holdTtl". The former spelling is accepted as the field (the
// decoder reads it already, for it differs in case alone); a key in any
// other case is refused naming the json tag's spelling, and an object
// giving both spellings of one field is refused as ambiguous.
func ExactKeys(doc []byte, v any) error {
	var parsed any
	if err := json.Unmarshal(doc, &parsed); err != nil {
		return nil
	}
	return exactKeys(parsed, reflect.TypeOf(v), "")
}

func exactKeys(doc any, t reflect.Type, path string) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFields(t)
		formerly := map[string]string{} // former spelling -> the field's
		for name, f := range fields {
			if f.formerly != "" {
				formerly[f.formerly] = name
			}
		}
		for _, k := range sortedKeys(obj) {
			name, ok := k, true
			if _, current := fields[k]; !current {
				name, ok = formerly[k]
			}
			if ok {
				if former := fields[name].formerly; former != "" {
					_, hasCurrent := obj[name]
					_, hasFormer := obj[former]
					if hasCurrent && hasFormer {
						return fmt.Errorf("%sfields %q and %q: one field given twice; it is spelt %q (%q, its former spelling, is still read): keep one", prefix(path), former, name, name, former)
					}
				}
				if err := exactKeys(obj[k], fields[name].typ, join(path, k)); err != nil {
					return err
				}
				continue
			}
			for name := range fields {
				if strings.EqualFold(name, k) {
					return fmt.Errorf("%sfield %q: no such field; the field is spelt %q (field names are case-sensitive)", prefix(path), k, name)
				}
			}
		}
	case reflect.Slice, reflect.Array:
		list, ok := doc.([]any)
		if !ok {
			return nil
		}
		for i, item := range list {
			if err := exactKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		for _, k := range sortedKeys(obj) {
			if err := exactKeys(obj[k], t.Elem(), join(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

func sortedKeys(obj map[string]any) []string {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func prefix(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
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
