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
// Two keys of one object that differ in case alone ("burst" and "Burst")
// are an error too: encoding/json gives both to one field and keeps one.
func UnmarshalStrict(data []byte, v any) error {
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		return err
	}
	if err := sameFieldTwice(data, reflect.TypeOf(v)); err != nil {
		return err
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

// sameFieldTwice reports two keys of one object in data (YAML or JSON, its
// first document) that name one field of t: encoding/json matches keys to
// fields regardless of case, so the later overwrites the earlier. The keys
// of a map are data, not field names: they are not compared.
func sameFieldTwice(data []byte, t reflect.Type) error {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil // UnmarshalStrict read it; nothing more to say here
	}
	var doc any
	if err := json.Unmarshal(js, &doc); err != nil {
		return nil
	}
	return foldedKeys(doc, t, "")
}

func foldedKeys(doc any, t reflect.Type, path string) error {
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
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		seen := map[string]string{} // field name -> the key that named it
		for _, k := range keys {
			for name, ft := range fields {
				if !strings.EqualFold(name, k) {
					continue
				}
				if other, dup := seen[name]; dup {
					return fmt.Errorf("%s%q and %q name one field regardless of case, and one would be dropped: keep one (%q)", prefix(path), other, k, name)
				}
				seen[name] = k
				if err := foldedKeys(obj[k], ft, join(path, name)); err != nil {
					return err
				}
			}
		}
	case reflect.Slice, reflect.Array:
		list, ok := doc.([]any)
		if !ok {
			return nil
		}
		for i, item := range list {
			if err := foldedKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := foldedKeys(obj[k], t.Elem(), join(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
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

// jsonFields maps the JSON names of t's fields (as encoding/json reads
// them, embedded structs' fields included) to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
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
				for n, typ := range jsonFields(ft) {
					fields[n] = typ
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
		fields[name] = f.Type
	}
	return fields
}
