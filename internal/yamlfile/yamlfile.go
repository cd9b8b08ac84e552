// Package yamlfile reads a file an operator wrote (a policy, an Envoy
// mapping) in YAML or JSON into a Go value: strictly, and one document per
// file, so that nothing in it is dropped without a word.
package yamlfile

import (
	"bytes"
	"errors"
	"io"

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
func UnmarshalStrict(data []byte, v any) error {
	if err := yaml.UnmarshalStrict(data, v); err != nil {
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
