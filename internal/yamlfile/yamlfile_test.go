package yamlfile

import (
	"errors"
	"testing"
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
