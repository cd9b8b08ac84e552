package migration

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestReadOrdersAndSplitsNames(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_second.sql": {Data: []byte("B")},
		"m/0001_first.sql":  {Data: []byte("A")},
	}
	ms, err := Read(fsys, "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 1 || ms[0].File != "0001_first.sql" || ms[0].Name != "first" || ms[0].SQL != "A" ||
		ms[1].Version != 2 || ms[1].Name != "second" || ms[1].SQL != "B" {
		t.Fatalf("got %+v", ms)
	}
}

func TestReadRefusesBuildMistakes(t *testing.T) {
	for name, files := range map[string][]string{
		"gap":         {"0001_a.sql", "0003_c.sql"},
		"duplicate":   {"0001_a.sql", "0001_b.sql"},
		"no version":  {"first.sql"},
		"zero":        {"0000_a.sql"},
		"no name":     {"0001_.sql"},
		"not sql":     {"0001_a.txt"},
		"not numeric": {"00x1_a.sql"},
	} {
		fsys := fstest.MapFS{}
		for _, f := range files {
			fsys["m/"+f] = &fstest.MapFile{Data: []byte("x")}
		}
		if _, err := Read(fsys, "m"); err == nil || !strings.Contains(err.Error(), "migration") {
			t.Errorf("%s %v: err = %v, want a refusal", name, files, err)
		}
	}
}
