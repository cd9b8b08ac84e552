package capledgerv1_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// requireGenerators, when set to 1, turns the missing-generator skip of
// TestGeneratedCodeIsCurrent into a failure, for a CI that installs them.
const requireGenerators = "CAPLEDGER_REQUIRE_GENERATORS"

// TestGeneratedCodeIsCurrent regenerates the Go code of every .proto file
// under api/ into a temporary directory and compares it byte for byte with
// the committed code, both ways: a .proto edit without `buf generate`
// fails, and so does a committed generated file that no .proto produces any
// more. It needs buf, protoc-gen-go and protoc-gen-connect-go on PATH (or
// in $HOME/go/bin) and skips when they are missing, so a fresh clone still
// builds and tests from the committed code, unless
// CAPLEDGER_REQUIRE_GENERATORS=1.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	path := os.Getenv("PATH")
	if home, err := os.UserHomeDir(); err == nil {
		path = path + string(os.PathListSeparator) + filepath.Join(home, "go", "bin")
	}
	t.Setenv("PATH", path)
	for _, tool := range []string{"buf", "protoc-gen-go", "protoc-gen-connect-go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv(requireGenerators) == "1" {
				t.Fatalf("%s is not installed and %s=1: %v", tool, requireGenerators, err)
			}
			t.Skipf("%s is not installed, so regeneration cannot be checked: %v", tool, err)
		}
	}

	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..", "..")
	out := t.TempDir()
	// The repository's buf.gen.yaml with the output moved to out.
	template := "version: v2\nplugins:\n" +
		"  - local: protoc-gen-go\n    out: " + out + "\n    opt: paths=source_relative\n" +
		"  - local: protoc-gen-connect-go\n    out: " + out + "\n    opt: paths=source_relative\n"
	cmd := exec.Command("buf", "generate", "--template", template)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "BUF_CACHE_DIR="+t.TempDir())
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, output)
	}

	regenerated := generatedFiles(t, out)
	committed := generatedFiles(t, filepath.Join(root, "api"))
	if len(regenerated) == 0 {
		t.Fatal("buf generate produced no Go files")
	}
	for _, rel := range regenerated {
		want, err := os.ReadFile(filepath.Join(out, rel))
		if err != nil {
			t.Fatalf("regenerated %s: %v", rel, err)
		}
		got, err := os.ReadFile(filepath.Join(root, "api", rel))
		if err != nil {
			t.Errorf("api/%s is not committed: run `buf generate` and commit the result", rel)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("api/%s differs from what buf generate produces: run `buf generate` and commit the result", rel)
		}
	}
	for _, rel := range committed {
		if !slices.Contains(regenerated, rel) {
			t.Errorf("api/%s is generated code that no .proto produces any more: delete it", rel)
		}
	}
}

// generatedFiles returns the generated Go files (*.pb.go, *.connect.go)
// below dir, as sorted slash-separated paths relative to dir.
func generatedFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() || !(strings.HasSuffix(name, ".pb.go") || strings.HasSuffix(name, ".connect.go")) {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatalf("list generated files in %s: %v", dir, err)
	}
	slices.Sort(files)
	return files
}
